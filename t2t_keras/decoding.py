"""Decoding with a trained Transformer: ids -> ids with the key/value cache, and
strings -> strings in input order with length-sorted batches and progress.

`decode_ids` is the one decoding path: the encoder runs once, the cross-attention
keys/values are projected once and tiled over beams, and the decoder runs one
position per step over a fixed-size self-attention cache (`Transformer.decode_step`).
Beam search reorders the cache by parent beam each step; with `in_place_cache` (for
XLA) and beams up to `MAX_SLOTTED_BEAM`, the cache instead keeps a slot per beam in
place and beam search reorders a small table of which slot holds each position of
each hypothesis.
Beam size 1 is greedy (arg-max) decoding; larger beams use `beam_search.beam_search`.
The same function is traced into the exported SavedModel. For parsing models,
`TreeConstraint` restricts the search to valid trees over the source's words (decode
CLI `--constrain_trees`; exports decode freely).

Output length: each sentence may produce at most its own source length (EOS
included) + extra_decode_length tokens, as in the paper (input length + 50); at that
position EOS is forced (with log probability 0, so the score is that of the tokens
before it). Limiting per sentence rather than per padded batch makes a translation
independent of the batch it was decoded in.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras import beam_search as beam_search_lib
from t2t_keras.configs import DecodeConfig


# With `in_place_cache` (for XLA), beams up to this size keep the self-attention cache
# in place (one slot per beam, attention over all K slots with a mask) instead of
# reordering it every step, and XLA writes each step's keys/values into the buffer
# (with the faster top-k, bench/decode_speed.py went from 0.39 to 0.61 of the matmul
# peak, 154 -> 194 tok/s on a slower host). Without XLA,
# TensorFlow copies the cache on the write anyway and the wider attention makes it
# 1.2x slower, so graph mode reorders. The attention work and its mask grow with K^2,
# so wide beams (parsing uses 21) reorder the cache in both modes.
MAX_SLOTTED_BEAM = 8


def decode_ids(model, inputs: tf.Tensor, config: DecodeConfig,
               decode_length=None, in_place_cache: bool = False,
               tree_constraint: Optional["TreeConstraint"] = None,
               keys: Optional[tf.Tensor] = None) -> tuple:
  """Decodes a padded batch of source ids.

  Args:
    model: a built `Transformer`, or an `ensemble.Ensemble` of them.
    inputs: int32 (B, S) source ids ending with EOS, PAD after.
    config: beam size, alpha, extra decode length.
    decode_length: maximum generated tokens; default S + config.extra_decode_length.
    in_place_cache: keep beam-search caches in place (`MAX_SLOTTED_BEAM`): faster when
      the function is compiled with XLA, slower otherwise. Same results either way.
    tree_constraint: parsing only: allow only outputs that are a tree over exactly the
      source's words (`TreeConstraint`); None decodes freely.
    keys: sampling only: (B,) int32, each input's key (its line number), which with
      `config.seed` decides its samples; default 0..B-1.

  Returns:
    ids (B, K, decode_length) int32 (K = beam size, best first; PAD after EOS) and
    scores (B, K) float32: length-penalised log probabilities (greedy: plain). When
    sampling, K = num_samples and the scores are the samples' plain log probabilities.
  """
  inputs = tf.cast(inputs, tf.int32)
  samples = config.num_samples if config.sampling else 1
  if config.sampling:
    if keys is None:
      keys = tf.range(tf.shape(inputs)[0])
    # Sample s of input b is a row of its own, keyed b * samples + s.
    keys = tf.reshape(tf.cast(keys, tf.int32)[:, None] * samples + tf.range(samples)[None],
                      [-1])
    inputs = beam_search_lib.tile_beams(inputs, samples)
  k = 1 if config.sampling else config.beam_size
  batch = tf.shape(inputs)[0]
  if decode_length is None:
    decode_length = tf.shape(inputs)[1] + config.extra_decode_length
  encoded, memory_mask = model.encode(inputs, training=False)
  cross_key_values = model.cross_key_values(encoded)
  if k > 1:
    cross_key_values = tf.nest.map_structure(
        lambda t: beam_search_lib.tile_beams(t, k), cross_key_values)
    memory_mask = beam_search_lib.tile_beams(memory_mask, k)
  source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(inputs, PAD_ID), tf.int32), axis=1)
  limits = source_lengths + config.extra_decode_length
  start = tf.fill([batch], BOS_ID)

  def plain_step(ids, index, cache):
    return model.decode_step(ids, index, cache, cross_key_values, memory_mask)

  def per_row(t):  # (B,) -> one value per hypothesis row (B * K,)
    return t if k == 1 else beam_search_lib.tile_beams(t, k)

  def finish(step, state):
    """The step with its constraints (tree, then the length limit) and its state."""
    if tree_constraint is not None:
      words = per_row(tree_constraint.count_words(inputs))
      step = tree_constraint.wrap(step, words, per_row(limits))
      state = (state, tf.zeros([batch * k, 2], tf.int32))
    if config.min_decode_length > 0:
      step = no_eos_before(step, config.min_decode_length)
    return force_eos_at(step, per_row(limits)), state

  if k == 1:
    step, state = finish(plain_step, model.init_cache(batch, decode_length))
    if not config.sampling:
      return beam_search_lib.greedy_search(step, start, state, decode_length)
    ids, scores = beam_search_lib.sample_search(
        step, start, state, decode_length, keys, config.seed, topk=config.sampling_topk,
        topp=config.sampling_topp, temperature=config.sampling_temperature)
    return (tf.reshape(ids, [-1, samples, tf.shape(ids)[-1]]),
            tf.reshape(scores, [-1, samples]))
  if not in_place_cache or k > MAX_SLOTTED_BEAM:
    # One cache row per hypothesis, gathered by parent beam at every step.
    step, state = finish(plain_step, model.init_cache(batch * k, decode_length))
    return beam_search_lib.beam_search(step, start, state, k, decode_length,
                                       alpha=config.alpha)

  # Beam search: the cache is never reordered, only the table of which slot holds each
  # position of each hypothesis (see Transformer.decode_step).
  cache = model.init_cache(batch, decode_length, beam_size=k)
  positions = tf.range(decode_length)
  own_slot = tf.range(k)[None, :, None]

  def symbols_to_logits(ids, index, state):
    cache, slots = state
    slots = tf.where(tf.equal(positions, index)[None, None, :], own_slot, slots)
    logits, cache = model.decode_step(ids, index, cache, cross_key_values, memory_mask,
                                      slots=slots)
    return logits, (cache, slots)

  def reorder(state, parents):
    cache, slots = state
    return cache, tf.gather(slots, parents, batch_dims=1)

  slots = tf.zeros([batch, k, decode_length], tf.int32)
  step, state = finish(symbols_to_logits, (cache, slots))
  if tree_constraint is not None:
    inner_reorder = reorder

    def reorder(state, parents):  # pylint: disable=function-redefined
      inner, counts = state
      counts = tf.reshape(tf.gather(tf.reshape(counts, [batch, k, 2]), parents,
                                    batch_dims=1), [batch * k, 2])
      return inner_reorder(inner, parents), counts
  return beam_search_lib.beam_search(step, start, state, k, decode_length,
                                     alpha=config.alpha, reorder_state=reorder)


def no_eos_before(symbols_to_logits, min_length: int):
  """Wraps a decoder so that EOS cannot come before position `min_length`."""
  def fn(ids, index, state):
    logits, state = symbols_to_logits(ids, index, state)
    is_eos = tf.equal(tf.range(tf.shape(logits)[-1]), EOS_ID)[None, :]
    return tf.where(is_eos & (index < min_length), beam_search_lib.NEG_INF,
                    tf.cast(logits, tf.float32)), state
  return fn


def force_eos_at(symbols_to_logits, limits):
  """Wraps a decoder so that hypothesis b must end (EOS) at position limits[b] - 1."""
  def fn(ids, index, state):
    logits, state = symbols_to_logits(ids, index, state)
    eos_only = tf.where(tf.equal(tf.range(tf.shape(logits)[-1]), EOS_ID), 0.0,
                        beam_search_lib.NEG_INF)
    return tf.where((index >= limits - 1)[:, None], eos_only[None, :], logits), state
  return fn


class TreeConstraint:
  """Decoding that can only write a linearized tree over the source's words (parsing).

  Each hypothesis counts the brackets it has open and the leaves (POS tags) it has
  written; at every step only these tokens keep their score:
    * an opening bracket `(X`, while fewer leaves than source words are written;
    * a leaf, inside an open bracket, while fewer leaves than words are written;
    * `)`, when a bracket is open, not right after an opening one (no empty
      constituents), and not closing the root before every word has its leaf;
    * end of sentence, once the root is closed after exactly one leaf per word (at
      once for an empty source).
  Every other token (subwords of words, tree tokens split into pieces) is excluded,
  and a bracket is opened only if the leaves and `)` it then owes still fit before the
  length limit (input + extra_decode_length; the source has at least one piece per
  word plus EOS, so any extra length >= 2 leaves room for a root and its leaves).
  Every state then has an allowed continuation and every output is a valid tree for
  its words. Scores are renormalized over the allowed tokens.

  Words are counted as the source pieces that start a word (SentencePiece's "▁"), so
  the constraint needs the tokenizer's vocabulary and whole-token tree pieces (the
  parsing vocabulary: t2t_keras.data.tokenizer). Leaves are the Penn Treebank's 45 POS
  tags (`parsing.PTB_TAGS`); a treebank with another tagset needs that set extended.
  """

  OTHER, OPEN, CLOSE, LEAF, END = range(5)

  def __init__(self, pieces: Sequence[str]):
    """`pieces`: the vocabulary's piece of every id."""
    from t2t_keras import parsing  # pylint: disable=import-outside-toplevel
    kinds = np.full(len(pieces), self.OTHER, np.int32)
    starts_word = np.zeros(len(pieces), np.int32)
    codes = {"open": self.OPEN, "close": self.CLOSE, "leaf": self.LEAF}
    for i, piece in enumerate(pieces):
      if i in (PAD_ID, EOS_ID, BOS_ID) or not piece.startswith("\u2581"):
        continue
      starts_word[i] = 1
      kinds[i] = codes.get(parsing.token_kind(piece[1:]), self.OTHER)
    kinds[EOS_ID] = self.END
    missing = [kind for kind in (self.OPEN, self.CLOSE, self.LEAF)
               if not np.any(kinds == kind)]
    if missing:
      raise ValueError(
          "This vocabulary has no single-piece tree tokens of kind "
          f"{', '.join(('open', 'close', 'leaf')[kind - 1] for kind in missing)}: "
          "tree-constrained decoding needs a parsing model (--data_source=parsing).")
    self.kinds = tf.constant(kinds)
    self.starts_word = tf.constant(starts_word)

  @classmethod
  def from_tokenizer(cls, tokenizer) -> "TreeConstraint":
    """From a `SentencePieceTokenizer` (the model directory's vocabulary)."""
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    model_proto = getattr(tokenizer, "model_proto", None)
    if model_proto is None:
      raise ValueError("Tree-constrained decoding needs a SentencePiece vocabulary "
                       "(a parsing model); this model has none.")
    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    return cls([processor.id_to_piece(i) for i in range(processor.get_piece_size())])

  def count_words(self, inputs: tf.Tensor) -> tf.Tensor:
    """(B, S) source ids -> (B,) number of words."""
    return tf.reduce_sum(tf.gather(self.starts_word, tf.cast(inputs, tf.int32)), axis=1)

  def wrap(self, symbols_to_logits, words: tf.Tensor, limits: tf.Tensor):
    """The decoder step with the constraint; its state is (state, counts (R, 2)).

    `words` and `limits` (R,): each row's number of source words and output length
    limit (EOS is forced at position limits - 1).
    """
    kinds = self.kinds

    def fn(ids, index, state):
      inner, counts = state
      kind = tf.gather(kinds, ids)  # of the token just written (BOS at index 0)
      is_open = tf.cast(tf.equal(kind, self.OPEN), tf.int32)
      opened = tf.maximum(
          counts[:, 0] + is_open - tf.cast(tf.equal(kind, self.CLOSE), tf.int32), 0)
      leaves = counts[:, 1] + tf.cast(tf.equal(kind, self.LEAF), tf.int32)
      logits, inner = symbols_to_logits(ids, index, inner)
      room = leaves < words
      inside = opened > 0
      # Tokens that must still follow the one written now, before EOS: a leaf per
      # remaining word and a `)` per open bracket. They must fit before the forced EOS.
      free = limits - 2 - index
      owed = words - leaves + opened
      allowed = tf.stack([
          tf.zeros_like(room),  # OTHER
          room & (owed + 1 <= free),  # OPEN
          inside & tf.equal(is_open, 0) & ((opened > 1) | tf.logical_not(room)),  # CLOSE
          room & inside & (owed - 1 <= free),  # LEAF
          tf.logical_not(inside) & tf.logical_not(room) & ((index > 0) | (words == 0)),
      ], axis=1)  # (R, 5)
      mask = tf.gather(allowed, kinds, axis=1)  # (R, V)
      logits = tf.where(mask, tf.cast(logits, tf.float32), beam_search_lib.NEG_INF)
      return logits, (inner, tf.stack([opened, leaves], axis=1))
    return fn


def make_decode_fn(model, config: DecodeConfig,
                   jit_compile: Optional[bool] = None,
                   tree_constraint: Optional[TreeConstraint] = None) -> Callable:
  """A tf.function (B, S) int32 -> (ids, scores), traced once per rank of shapes.

  With XLA (`jit_compile`, default `config.jit_compile`) it compiles once per distinct
  (B, S) shape: `translate` pads batches to few shapes (`padded_width`).
  """
  if jit_compile is None:
    jit_compile = config.jit_compile
  # No autograph: decoding has no Python control flow on tensors (the loops are
  # explicit tf.while_loops), and tracing plain Python is faster and more predictable.
  if config.sampling:  # (inputs, keys): the keys decide each input's samples
    return tf.function(
        lambda inputs, keys: decode_ids(model, inputs, config, in_place_cache=jit_compile,
                                        tree_constraint=tree_constraint, keys=keys),
        input_signature=[tf.TensorSpec([None, None], tf.int32),
                         tf.TensorSpec([None], tf.int32)],
        jit_compile=jit_compile or None, autograph=False)
  return tf.function(lambda inputs: decode_ids(model, inputs, config,
                                               in_place_cache=jit_compile,
                                               tree_constraint=tree_constraint),
                     input_signature=[tf.TensorSpec([None, None], tf.int32)],
                     jit_compile=jit_compile or None, autograph=False)


def strip_ids(ids: Sequence[int]) -> List[int]:
  """Ids before the first EOS, without PAD or BOS."""
  out = []
  for i in ids:
    i = int(i)
    if i == EOS_ID:
      break
    if i not in (PAD_ID, BOS_ID):
      out.append(i)
  return out


class Progress:
  """A progress line on stderr every `every` seconds: done/total, rate, ETA."""

  def __init__(self, total: int, unit: str = "sentences", every: float = 5.0,
               stream=None, verb: str = "decoded"):
    self.total, self.unit, self.every, self.verb = total, unit, every, verb
    self.stream = stream or sys.stderr
    self.start = self.last = time.time()
    self.done = 0

  def update(self, n: int, force: bool = False):
    self.done += n
    now = time.time()
    if force or now - self.last >= self.every or self.done >= self.total:
      self.last = now
      elapsed = max(now - self.start, 1e-9)
      rate = self.done / elapsed
      eta = (self.total - self.done) / rate if rate > 0 else float("inf")
      print(f"{self.verb} {self.done}/{self.total} {self.unit} ({rate:.1f} {self.unit}/s, "
            f"elapsed {elapsed:.0f}s, eta {eta:.0f}s)", file=self.stream, flush=True)


@dataclasses.dataclass
class Translation:
  """Beams (or samples) of one input, best first (samples in drawing order).

  `source_ids` are the input's ids as decoded (EOS included, after truncation to
  `max_input_length`); `ids` each beam's output ids without EOS or PAD.
  """

  texts: List[str]
  scores: List[float]
  ids: List[List[int]] = dataclasses.field(default_factory=list)
  source_ids: List[int] = dataclasses.field(default_factory=list)


MIN_XLA_WIDTH = 16


def padded_width(width: int) -> int:
  """The source width an XLA batch is padded to: the next power of two, at least 16.

  Few widths means few compilations (7 up to 1,024 subwords); padding changes no
  translation (the output limit is per sentence, see the module docstring), only the
  encoder's work and the cache size.
  """
  padded = MIN_XLA_WIDTH
  while padded < width:
    padded *= 2
  return padded


def translate(model, tokenizer, sentences: Sequence[str], config: DecodeConfig,
              max_input_length: int = 0, decode_fn: Optional[Callable] = None,
              progress: bool = True,
              tree_constraint: Optional[TreeConstraint] = None) -> List[Translation]:
  """Translates strings; the result is in input order.

  Sentences are tokenized in the graph, sorted by length and decoded in batches of
  `config.batch_size` sentences (so that little of each batch is padding), then
  put back in input order. With `config.jit_compile` (XLA) every batch is padded to
  `config.batch_size` rows (filler rows hold a lone EOS and are discarded) and to
  `padded_width` columns, so XLA compiles once per width bucket, not per batch.

  Args:
    model: a built Transformer.
    tokenizer: the data tokenizer (tokenize/detokenize).
    sentences: source strings.
    config: decoding settings.
    max_input_length: keep at most this many source tokens (EOS included); 0 = all.
    decode_fn: a function from `make_decode_fn` (made here if None).
    progress: print a progress line to stderr.
    tree_constraint: parsing: only trees over the source's words (`TreeConstraint`;
      ignored when `decode_fn` is given).
  """
  if not sentences:
    return []
  decode_fn = decode_fn or make_decode_fn(model, config, tree_constraint=tree_constraint)
  ids = tokenizer.tokenize(tf.constant(list(sentences))).to_list()
  sources = []
  for seq in ids:
    seq = list(seq) + [EOS_ID]
    if max_input_length and len(seq) > max_input_length:
      seq = seq[:max_input_length - 1] + [EOS_ID]
    sources.append(seq)
  order = np.argsort([len(s) for s in sources], kind="stable")
  results: List[Optional[Translation]] = [None] * len(sources)
  meter = Progress(len(sources)) if progress else None
  for begin in range(0, len(order), config.batch_size):
    chunk = order[begin:begin + config.batch_size]
    width = max(len(sources[i]) for i in chunk)
    rows = len(chunk)
    if config.jit_compile:
      width, rows = padded_width(width), config.batch_size
    batch = np.full((rows, width), PAD_ID, np.int32)
    batch[len(chunk):, 0] = EOS_ID  # XLA filler rows: a one-token source
    for row, i in enumerate(chunk):
      batch[row, :len(sources[i])] = sources[i]
    if config.sampling:  # filler rows (XLA) get key -1
      keys = np.full([rows], -1, np.int32)
      keys[:len(chunk)] = chunk
      out_ids, scores = decode_fn(tf.constant(batch), tf.constant(keys))
    else:
      out_ids, scores = decode_fn(tf.constant(batch))
    texts = tokenizer.detokenize(out_ids).numpy()  # (B, K)
    scores, out_ids = scores.numpy(), out_ids.numpy()
    for row, i in enumerate(chunk):
      results[i] = Translation([t.decode("utf-8") for t in texts[row]],
                               [float(s) for s in scores[row]],
                               [strip_ids(beam) for beam in out_ids[row]], sources[i])
    if meter:
      meter.update(len(chunk))
  return results


def exact_match(model, dataset: tf.data.Dataset, config: DecodeConfig,
                max_batches: int = 0):
  """Sequence exact-match accuracy of the best beam on a one-pass dataset.

  Returns:
    (accuracy, number of sequences, list of (input ids, target ids, output ids)).
  """
  decode_fn = make_decode_fn(model, config)
  correct = total = 0
  examples = []
  for n, batch in enumerate(dataset):
    if max_batches and n >= max_batches:
      break
    out_ids, _ = decode_fn(tf.cast(batch["inputs"], tf.int32))
    for src, tgt, out in zip(batch["inputs"].numpy(), batch["targets"].numpy(),
                             out_ids[:, 0].numpy()):
      if not np.any(tgt != PAD_ID):
        continue  # an all-PAD filler row of a static-shape batch
      expected, got = strip_ids(tgt), strip_ids(out)
      correct += expected == got
      total += 1
      examples.append((strip_ids(src), expected, got))
  return correct / max(total, 1), total, examples


def report_examples(model, datasets, data_config, decode_config: DecodeConfig, n: int,
                    stream=None) -> float:
  """Decodes the dev set, prints `n` examples and the exact-match accuracy.

  Returns:
    The sequence exact-match accuracy.
  """
  del data_config
  stream = stream or sys.stdout
  start = time.time()
  accuracy, total, examples = exact_match(model, datasets.eval_fn(None), decode_config)
  tokenizer = datasets.tokenizer

  def text(ids):
    return tokenizer.detokenize(tf.constant([ids or [EOS_ID]], tf.int32)).numpy()[0].decode(
        "utf-8", "replace")

  # Dev batches come sorted by length: show examples spread over all lengths.
  shown = [examples[i] for i in np.linspace(0, len(examples) - 1, min(n, len(examples)),
                                            dtype=int)] if examples else []
  for src, tgt, out in shown:
    mark = "ok " if tgt == out else "BAD"
    print(f"{mark} input:     {text(src)}\n    reference: {text(tgt)}\n"
          f"    output:    {text(out)}", file=stream)
  print(f"dev exact match: {accuracy:.2%} of {total} sequences (beam "
        f"{decode_config.beam_size}, alpha {decode_config.alpha}; "
        f"{time.time() - start:.1f}s)", file=stream, flush=True)
  return accuracy
