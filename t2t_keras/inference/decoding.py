"""Graph-side decoding with a trained Transformer: ids -> ids with the key/value cache.

`decode_ids` is the one decoding path: the encoder runs once, the cross-attention
keys/values are projected once per sentence (its beams share them), and the decoder runs one
position per step over a self-attention cache (`Transformer.decode_step`) that grows
by one position per step in graph mode and has a fixed size under XLA.
Beam search reorders the cache by parent beam each step; under XLA
(`DecodeConfig.jit_compile`) and with beams up to `MAX_SLOTTED_BEAM`, the cache instead
keeps a slot per beam in place and beam search reorders a small table of which slot
holds each position of each hypothesis.
Beam size 1 is greedy (arg-max) decoding; larger beams use `beam_search.beam_search`.
The same function is traced into the exported SavedModel. Decoding options that
change which tokens may come (the minimum length, the length limit, the tree constraint
of parsing models, `--constrain_trees`) are processors (`t2t_keras.inference.processors`)
composed around the model's step; their states are reordered with the beams in both
cache layouts. Strings in and out, batching and progress are t2t_keras.inference.translate's.

Output length: each sentence may produce at most its own source length (EOS
included) + extra_decode_length tokens, as in the paper (input length + 50); at that
position EOS is forced (with log probability 0, so the score is that of the tokens
before it). Limiting per sentence rather than per padded batch makes a translation
independent of the batch it was decoded in.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Callable, Optional

import tensorflow as tf

from t2t_keras import BOS_ID, PAD_ID
from t2t_keras.inference import search as beam_search_lib
from t2t_keras.inference.search import sampling
from t2t_keras.inference import processors
from t2t_keras.configs import DecodeConfig
from t2t_keras.model import advance_pointer

if TYPE_CHECKING:
  from t2t_keras.parsing.constraint import TreeConstraint


# Under XLA (`DecodeConfig.jit_compile`), beams up to this size keep the self-attention cache
# in place (one slot per beam, attention over all K slots with a mask) instead of
# reordering it every step, and XLA writes each step's keys/values into the buffer.
# Without XLA, TensorFlow copies the cache on the write anyway and the wider attention
# makes it slower, so graph mode reorders (figures: docs/benchmarks.md, "Measurements
# behind the decoding code"). The attention work and its mask grow with K^2, so wide
# beams (parsing uses 21) reorder the cache in both modes.
MAX_SLOTTED_BEAM = 8


# Under XLA, batches are padded to few source widths (each compiles once): the decode
# CLI (`t2t_keras.inference.translate`) and the XLA export (`t2t_keras.export.saved_model`) alike.
MIN_XLA_WIDTH = 16


def xla_halvings(config: DecodeConfig, max_rows: Optional[int]) -> int:
  """How many times an XLA beam search batch of at most `max_rows` rows halves as its
  sentences finish: `config.xla_halvings` (--decode_xla_halvings), less the ones that
  could not shrink it (ceil(B / 2) of one row is one row; each is a loop to compile).
  Graph mode drops each finished sentence at once instead (`ShrinkingBatch`)."""
  if max_rows is None:
    return config.xla_halvings
  return min(config.xla_halvings, max(max_rows - 1, 0).bit_length())


def padded_width(width: int, minimum: int = MIN_XLA_WIDTH) -> int:
  """The source width an XLA batch is padded to: the next power of two, at least
  `minimum` (16). (With --decode_batch_tokens the rows are padded alike, minimum 1.)

  Few widths means few compilations (7 up to 1,024 subwords); padding changes no
  translation (the output limit is per sentence, see the module docstring), only the
  encoder's work and the cache size.
  """
  padded = minimum
  while padded < width:
    padded *= 2
  return padded


def decode_ids(model, inputs: tf.Tensor, config: DecodeConfig,
               tree_constraint: Optional[TreeConstraint] = None, *,
               keys: Optional[tf.Tensor] = None,
               target_prefix: Optional[tf.Tensor] = None) -> tuple:
  """Decodes a padded batch of source ids.

  Args:
    model: a built `Transformer`, or an `ensemble.Ensemble` of them.
    inputs: int32 (B, S) source ids ending with EOS, PAD after; a row of PAD alone
      fills a static-shape batch: it ends at once, its output EOS alone.
    config: the settings: the search (beam size, alpha, sampling), the output length
      (extra decode length; `decode_length`, a fixed width, default S + the extra
      length), the options (minimum length) and the cache layout: with `jit_compile`
      the fixed-size caches XLA needs (the caller compiles), kept in place for beams up
      to `MAX_SLOTTED_BEAM`, the batch halving as its sentences finish
      (`xla_halvings` of the rows of `inputs`' static shape, else of
      `config.batch_size`); otherwise (graph mode) the caches grow by a position per
      step. Same results either way.
    tree_constraint: parsing only: allow only outputs that are a tree over exactly the
      source's words (`TreeConstraint`, made for `config.constrain_trees`); None
      decodes freely.
    keys: sampling only: (B,) int32, each input's key (its line number), which with
      `config.seed` decides its samples; default 0..B-1.
    target_prefix: optional (B, P) int32 target ids each output must start with (no
      EOS; PAD after, an all-PAD row is free), `processors.TargetPrefix`; a row's
      output limit is at least its prefix length + `config.extra_decode_length`.

  Returns:
    ids (B, K, decode_length) int32 (K = beam size, best first; PAD after EOS) and
    scores (B, K) float32: length-penalised log probabilities (greedy: plain). Unless
    `config.return_beams`, only the first beam is final: the search stops when it is
    (see `beam_search.Beam`'s `num_results`). When
    sampling, K = num_samples and the scores are the samples' plain log probabilities.
  """
  inputs = tf.cast(inputs, tf.int32)
  max_rows = inputs.shape[0] if inputs.shape[0] is not None else config.batch_size
  if target_prefix is not None:
    target_prefix = tf.cast(target_prefix, tf.int32)
  samples = config.num_samples if config.sampling else 1
  if config.sampling:
    inputs, keys, target_prefix = _per_sample(inputs, keys, target_prefix, samples)
  k = config.beams_per_row
  # Beam search may stop as soon as the results the caller reads are final.
  results = k if config.return_beams else 1
  batch = tf.shape(inputs)[0]
  decode_length, limits = _output_lengths(config, inputs, tree_constraint, target_prefix)
  # The encoder output, its cross-attention keys/values and the source mask stay one
  # row per sentence: the K hypotheses of a sentence share them (never tiled).
  encoded, memory_mask = model.encode(inputs, training=False)
  cross_key_values = model.cross_key_values(encoded)
  start = tf.fill([batch], BOS_ID)
  options = processors.for_config(config, tree_constraint, target_prefix is not None)
  rows = processors.Rows(inputs=per_row(inputs, k), limits=per_row(limits, k),
                         prefix=None if target_prefix is None else per_row(target_prefix, k),
                         vocab_size=model.model_config.output_vocab_size)

  layout = cache_layout(model, k, decode_length, config.jit_compile,
                        xla_halvings(config, max_rows), config.attention_by_size)
  # What every step reads and never changes, one row per sentence: passed to the step as the
  # search's context, so that it leaves the batch with its sentence.
  context = (cross_key_values, memory_mask, (encoded, inputs) if layout.pointing else ())
  step, state = processors.compose(layout.step, layout.init(batch), options, rows)
  if config.sampling:
    ids, scores = sampling.sample_search(
        lambda ids, index, state: step(ids, index, state, context), start, state,
        decode_length, keys, sampling.Sampling(
            config.seed, topk=config.sampling_topk, topp=config.sampling_topp,
            temperature=config.sampling_temperature))
    return (tf.reshape(ids, [-1, samples, tf.shape(ids)[-1]]),
            tf.reshape(scores, [-1, samples]))
  if k == 1:
    return beam_search_lib.greedy_search(step, start, state, decode_length, context=context,
                                         shrink=layout.grow)
  beam = beam_search_lib.Beam(k, alpha=config.alpha, num_results=results, layout=layout,
                              batch=layout.batch)
  return beam_search_lib.beam_search(step, start, state, decode_length, beam, context)


def _per_sample(inputs, keys, target_prefix, samples: int):
  """Sampling: each input (and its prefix) repeated `samples` times, sample s of input b
  a row of its own keyed b * samples + s (its key decides its draws)."""
  if keys is None:
    keys = tf.range(tf.shape(inputs)[0])
  keys = tf.reshape(tf.cast(keys, tf.int32)[:, None] * samples + tf.range(samples)[None],
                    [-1])
  if target_prefix is not None:
    target_prefix = beam_search_lib.tile_beams(target_prefix, samples)
  return beam_search_lib.tile_beams(inputs, samples), keys, target_prefix


def _output_lengths(config: DecodeConfig, inputs,
                    tree_constraint: Optional[TreeConstraint], target_prefix):
  """The buffers' length (scalar) and each sentence's output limit (B,) (see the
  module docstring), both grown by a copying tree's words and by a target prefix."""
  # A tree that copies its words (parsing, "words") writes a tag per word besides the
  # input's pieces: the extra length counts beyond both, so "input + 300" leaves the
  # same room for brackets as with tags alone.
  # (The buffers get one more position per source piece, a bound known from the
  # shape alone, as XLA needs.)
  copied = tf.zeros([tf.shape(inputs)[0]], tf.int32)
  decode_length = config.decode_length
  if decode_length is None:
    decode_length = tf.shape(inputs)[1] + config.extra_decode_length
  if tree_constraint is not None and tree_constraint.linearization == "words":
    copied = tree_constraint.count_words(inputs)
    decode_length += tf.shape(inputs)[1]
  source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(inputs, PAD_ID), tf.int32), axis=1)
  limits = source_lengths + config.extra_decode_length + copied
  if target_prefix is not None:
    # A prefix longer than the source still leaves the extra length after it.
    prefix_lengths = tf.reduce_sum(tf.cast(tf.not_equal(target_prefix, PAD_ID), tf.int32),
                                   axis=1)
    limits = tf.maximum(limits, prefix_lengths + config.extra_decode_length)
    decode_length += tf.shape(target_prefix)[1]
  # A row without a token, not even EOS, fills a static-shape batch (XLA's padded
  # batches, static-shape dev sets): EOS at position 0 makes it final at once, where
  # it would otherwise, in a weak model, run to its length limit and hold the batch.
  limits = tf.where(tf.equal(source_lengths, 0), 1, limits)
  return decode_length, limits


class RowCache(beam_search_lib.StateRows):
  """A fixed-size cache with one row per hypothesis, gathered by parent beam at every
  step (the model's state and every processor's alike); the batch stays whole.

  A layout owns the cache's shape from start to end: `init` makes it, `step` runs the
  model's step over it (writing the step's keys/values), and, as a `StateRows`,
  `reorder` and `select` move it with the beams and sentences; `batch` is how a beam
  search over it lets finished sentences go.
  """

  grow = False
  batch = beam_search_lib.FullBatch()

  def __init__(self, model, k: int, decode_length, attention_by_size: bool = False):
    super().__init__(k)
    self.model = model
    self.decode_length = decode_length
    # Models with a source pointer (Transformer.decode_step) also read the encoder
    # output and carry each hypothesis' pointer in the search state.
    self.pointing = getattr(model, "uses_source_pointer", False)
    # The decoder's weights in the step's form (fused, reshaped, cast), taken once here,
    # outside the search loop, rather than in every step.
    self.weights = model.step_weights(decode_length, beams=k)
    if attention_by_size:  # `DecodeConfig.attention_by_size`
      self.weights = _with(self.weights, attention_by_size=True)

  def init(self, sentences):
    """The model's state for the K hypotheses of each of `sentences`."""
    rows = sentences * self.k if self.k > 1 else sentences
    cache = self.model.init_cache(rows, 0 if self.grow else self.decode_length)
    return (cache, tf.zeros([rows], tf.int32)) if self.pointing else cache

  def step(self, ids, index, state, context):
    """The model's step: logits (rows, V) and the state with this position written."""
    cross, mask, source = context
    if not self.pointing:
      return self.model.decode_step(ids, index, state, cross, mask, grow=self.grow,
                                    weights=self.weights)
    cache, pointer = state
    encoded_rows, source_ids = source
    pointer = advance_pointer(pointer, ids, per_row(source_ids, self.k))
    logits, cache = self.model.decode_step(ids, index, cache, cross, mask,
                                           source_pointer=(encoded_rows, pointer),
                                           grow=self.grow, weights=self.weights)
    return logits, (cache, pointer)


class GrowingCache(RowCache):
  """Graph mode: the cache grows by a position per step, and a search drops each
  sentence from the batch once its results are final."""

  grow = True
  batch = beam_search_lib.ShrinkingBatch()

  def step(self, ids, index, state, context):
    if self.k > 1 and not self.pointing and tf.get_static_value(index) == 0:
      return self._first_step(ids, index, state, context)
    return super().step(ids, index, state, context)

  def _first_step(self, ids, index, state, context):
    """Position 0, where the K hypotheses of a sentence are one (the start token and an
    empty cache): the decoder runs on a row per sentence, and its logits and cache are
    repeated K times, as CTranslate2 does: the first step has K times fewer rows. The
    search runs position 0 before its loop (`ShrinkingBatch`), where the index is a
    constant; inside the loop every step runs on all rows."""
    k = self.k
    cross, mask, _ = context
    one_row = lambda t: t[::k]  # noqa: E731
    logits, cache = self.model.decode_step(
        ids[::k], index, tf.nest.map_structure(one_row, state), cross, mask, grow=True,
        weights=_one_beam(self.weights))
    return per_row(logits, k), tf.nest.map_structure(lambda t: per_row(t, k), cache)


def _with(weights, **entries):
  """`step_weights` (a model's dict, or an ensemble's tuple of them) with `entries`
  changed."""
  if isinstance(weights, dict):
    return dict(weights, **entries)
  return tuple(_with(w, **entries) for w in weights)


def _one_beam(weights):
  """`step_weights` for a step of one hypothesis per sentence."""
  return _with(weights, beams=1)


class SlottedCache(RowCache):
  """XLA, beams up to `MAX_SLOTTED_BEAM`: the cache keeps a slot per beam in place and
  is never reordered, only the table of which slot holds each position of each
  hypothesis (see Transformer.decode_step); the batch halves `halvings` times."""

  def __init__(self, model, k: int, decode_length, halvings: int,
               attention_by_size: bool = False):
    super().__init__(model, k, decode_length, attention_by_size)
    self.batch = beam_search_lib.HalvingBatch(halvings)
    self.positions = tf.range(decode_length)
    self.own_slot = tf.range(k)[None, :, None]

  def init(self, sentences):
    cache = self.model.init_cache(sentences, self.decode_length, beam_size=self.k)
    slots = tf.zeros([sentences, self.k, self.decode_length], tf.int32)
    return cache, slots, tf.zeros([sentences * self.k], tf.int32)

  def step(self, ids, index, state, context):
    cache, slots, pointer = state
    cross, mask, source = context
    slots = tf.where(tf.equal(self.positions, index)[None, None, :], self.own_slot, slots)
    extra = {}
    if self.pointing:
      encoded_rows, source_ids = source
      pointer = advance_pointer(pointer, ids, per_row(source_ids, self.k))  # per hypothesis
      extra["source_pointer"] = (encoded_rows, pointer)
    logits, cache = self.model.decode_step(ids, index, cache, cross, mask, slots=slots,
                                           weights=self.weights, **extra)
    return logits, (cache, slots, pointer)

  def _by_hypothesis(self, rows, pick):
    """(B * K, ...) per-hypothesis rows, K per sentence, picked per sentence by `pick`
    (B', K'): parent beams (K' = K) or, with `batch_dims=0`, sentences."""
    shape = tf.shape(rows)
    split = tf.reshape(rows, tf.concat([[-1, self.k], shape[1:]], 0))
    return tf.reshape(tf.gather(split, pick, batch_dims=1 if pick.shape.rank == 2 else 0),
                      tf.concat([[-1], shape[1:]], 0))

  def reorder(self, state, parents):
    (cache, slots, pointer), processor_states = state
    return ((cache, tf.gather(slots, parents, batch_dims=1),
             self._by_hypothesis(pointer, parents)),
            tf.nest.map_structure(lambda t: self._by_hypothesis(t, parents),
                                  processor_states))

  def select(self, state, sentences):  # the state of some sentences, when the batch halves
    (cache, slots, pointer), processor_states = state
    per_sentence = tf.nest.map_structure(lambda t: tf.gather(t, sentences), (cache, slots))
    return ((*per_sentence, self._by_hypothesis(pointer, sentences)),
            tf.nest.map_structure(lambda t: self._by_hypothesis(t, sentences),
                                  processor_states))


def cache_layout(model, k: int, decode_length, in_place_cache: bool,
                 halvings: int = 0, attention_by_size: bool = False) -> RowCache:
  """The self-attention cache's layout for a search of `k` hypotheses per sentence.

  Without XLA the cache grows by a position per step (one row per hypothesis): each
  step copies and attends over what was decoded, not over the longest output possible;
  and a search drops a sentence from the batch once its result is final. XLA needs
  fixed shapes: a fixed-size cache, kept in place for beams up to `MAX_SLOTTED_BEAM`,
  whose beam search halves the batch instead (`xla_halvings`). `attention_by_size`:
  each step's attention chosen by size, in either mode (`DecodeConfig.attention_by_size`)."""
  if not in_place_cache:
    return GrowingCache(model, k, decode_length, attention_by_size)
  if k == 1 or k > MAX_SLOTTED_BEAM:
    return RowCache(model, k, decode_length, attention_by_size)
  return SlottedCache(model, k, decode_length, halvings, attention_by_size)


def per_row(t: tf.Tensor, k: int) -> tf.Tensor:
  """(B, ...) -> one row per hypothesis (B * K, ...)."""
  return t if k == 1 else beam_search_lib.tile_beams(t, k)


def make_decode_fn(model, config: DecodeConfig,
                   tree_constraint: Optional[TreeConstraint] = None,
                   device: Optional[str] = None) -> Callable:
  """A function (B, S) int32 -> (ids, scores) decoding with `decode_ids`, for
  `t2t_keras.inference.translate`.

  Its arguments: the inputs; when sampling, each input's key (see `decode_ids`); and,
  when given, the (B, P) prefix ids. Each of the two kinds of call (with a prefix and
  without) is a tf.function traced once per rank of shapes; under XLA
  (`config.jit_compile`) it compiles once per distinct shape:
  `t2t_keras.inference.translate` pads batches to few shapes (`padded_width`).
  With `device` (e.g. "GPU:1") every call runs there (the model's variables should
  be there too: `loading.on_device`); each such function traces, and under XLA
  compiles, its own program for its device.
  """
  functions = {}
  place = (lambda: tf.device(device)) if device else contextlib.nullcontext
  # Threads decoding batches side by side (--decode_parallel_batches) make the
  # function once between them, so that it traces (and under XLA compiles) once.
  lock = threading.Lock()

  def decode(inputs, *args):
    prefixed = len(args) > int(config.sampling)
    with lock:
      if prefixed not in functions:
        functions[prefixed] = _traced(model, config, tree_constraint, prefixed)
    with place():  # the scope is the calling thread's: a worker per device sets its own
      return functions[prefixed](inputs, *args)
  decode.device = device
  return decode


def _traced(model, config: DecodeConfig, tree_constraint, target_prefix: bool):
  """`decode_ids` as a tf.function of the inputs, [the keys], [the prefix ids]."""
  signature = [tf.TensorSpec([None, None], tf.int32)]
  if config.sampling:  # the keys decide each input's samples
    signature.append(tf.TensorSpec([None], tf.int32))
  if target_prefix:
    signature.append(tf.TensorSpec([None, None], tf.int32))

  def decode(inputs, *args):
    args = list(args)
    keys = args.pop(0) if config.sampling else None
    prefix = args.pop(0) if target_prefix else None
    # `t2t_keras.inference.translate` pads XLA batches to at most config.batch_size rows
    # (a larger batch, from `translate.exact_match`, halves fewer times than it could).
    return decode_ids(model, inputs, config, tree_constraint, keys=keys,
                      target_prefix=prefix)
  # No autograph: decoding has no Python control flow on tensors (the loops are
  # explicit tf.while_loops), and tracing plain Python is faster and more predictable.
  function = tf.function(decode, input_signature=signature,
                         jit_compile=config.jit_compile or None, autograph=False)
  # Each function traces once (its signature); TensorFlow's warning about frequent
  # retracing counts the traces of every function of this code together, so one per
  # device (--decode_devices on 8 GPUs) would set it off for nothing.
  function._omit_frequent_tracing_warning = True  # pylint: disable=protected-access
  return function
