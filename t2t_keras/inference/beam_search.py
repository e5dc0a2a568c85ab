"""Batched beam search and greedy search over an incremental decoder.

One pure function in the style of tensor2tensor / Flax / Model Garden: at every step
the K alive hypotheses of each sentence are extended by every token, the 2K best
candidates are kept (so that even if K of them end in EOS, K can stay alive), those
ending in EOS join the finished set scored with the GNMT length penalty
`((5 + length) / 6) ** alpha` (Wu et al. 2016; length counts EOS), and the best K not
ending in EOS stay alive. The loop stops when no alive hypothesis can still beat the
worst of K finished ones (the penalised log probability of an alive hypothesis can
only improve by growing longer up to `decode_length`, so dividing its log probability
by the largest penalty bounds it), or after `decode_length` steps; a caller that uses
only the best result stops when the best finished one beats every alive one
(`num_results`). Sentences without
K finished hypotheses fall back to their best alive ones.

Shapes are static given (batch, beam, decode_length), and the loop is a
`tf.while_loop` with `maximum_iterations`, so the search compiles with XLA and runs
inside an exported SavedModel. The decoder state (e.g. the self-attention key/value
cache) is any nest of tensors with leading dimension batch * beam (a dimension of size
0 at the start may grow, see `loop_shape`; not under XLA); its layout (`StateRows`, or
a caller's subclass: t2t_keras' decoder under XLA keeps its cache in place and
reorders only a table of slots) reorders it by parent beam once per step. Per-sentence
tensors that never change (cross-attention keys/values, source mask) are the search's
`context` (one row per sentence, shared by its beams) or the caller's closure, and are
never reordered.

What a search is asked for is one value (`Beam`, `Sampling`); how finished sentences
leave the batch is an object that runs the loop: `FullBatch` keeps them,
`ShrinkingBatch` (graph mode) drops each at once, its state and context rows in the
same gather as the beam reorder, and `HalvingBatch` (XLA, static shapes) does the same
by halves: the batch moves to a loop of half its size once no more than half its
sentences are still searching.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID

# A large negative score instead of -inf: -inf - -inf is NaN, and XLA dislikes infs.
NEG_INF = -1.0e9

# symbols_to_logits(ids (B*K,) int32, index scalar int32, state) ->
#   (float32 logits (B*K, V), new state)
SymbolsToLogits = Callable[[tf.Tensor, tf.Tensor, Any], Tuple[tf.Tensor, Any]]


def length_penalty(length, alpha: float) -> tf.Tensor:
  """GNMT length penalty ((5 + length) / 6) ** alpha; 1 when alpha == 0."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def tile_beams(tensor: tf.Tensor, beam_size: int) -> tf.Tensor:
  """(B, ...) -> (B * K, ...), each batch row repeated K times consecutively."""
  return tf.repeat(tensor, beam_size, axis=0)


def _merge(tensor):
  """(B, K, ...) -> (B * K, ...)."""
  shape = tf.shape(tensor)
  return tf.reshape(tensor, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def _split(tensor, beam_size):
  """(B * K, ...) -> (B, K, ...)."""
  shape = tf.shape(tensor)
  return tf.reshape(tensor, tf.concat([[shape[0] // beam_size, beam_size], shape[1:]], 0))


def _gather(tensor, indices):
  """Per sentence, picks beams: tensor (B, K, ...), indices (B, N) -> (B, N, ...)."""
  return tf.gather(tensor, indices, batch_dims=1)


def _chunk_size(vocab: int, chunk: int) -> int:
  """A divisor of `vocab` near `chunk` (within a factor of 2), so the row is cut into
  chunks without padding (a pad copies the whole (N, V) tensor every step); `chunk`
  itself when V has none (V is then padded)."""
  divisors = [d for d in range(chunk // 2, 2 * chunk + 1) if vocab % d == 0]
  return min(divisors, key=lambda d: abs(d - chunk)) if divisors else chunk


def top_k_rows(values: tf.Tensor, k: int, chunk: int = 128) -> Tuple[tf.Tensor, tf.Tensor]:
  """`tf.math.top_k` of each row of a (N, V) float tensor, faster for large V.

  The row is cut into chunks of about `chunk` values (a divisor of V when one is near,
  see `_chunk_size`); the k largest values lie in the k chunks with the largest maxima,
  so one vectorised max per chunk, a top-k over the chunk maxima and a top-k over
  k * chunk candidates replace a top-k over V (several times faster for V = 32,000
  on CPU, with and without XLA: docs/benchmarks.md). Ties may pick another index of an
  equal value than
  `tf.math.top_k`. Small V falls back to `tf.math.top_k`.
  """
  vocab = values.shape[-1]
  if vocab is None or vocab < 4 * k * chunk:
    return tf.math.top_k(values, k)
  chunk = _chunk_size(vocab, chunk)
  rows = tf.shape(values)[0]
  pad = -vocab % chunk
  if pad:
    values = tf.pad(values, [[0, 0], [0, pad]], constant_values=values.dtype.min)
  chunks = tf.reshape(values, [rows, (vocab + pad) // chunk, chunk])
  _, best_chunks = tf.math.top_k(tf.reduce_max(chunks, axis=-1), k)  # (N, k)
  candidates = tf.reshape(tf.gather(chunks, best_chunks, batch_dims=1), [rows, k * chunk])
  top_values, index = tf.math.top_k(candidates, k)
  ids = tf.gather(best_chunks, index // chunk, batch_dims=1) * chunk + index % chunk
  return top_values, ids


def top_k_log_probs(logits: tf.Tensor, k: int) -> Tuple[tf.Tensor, tf.Tensor]:
  """The k best log probabilities of each row of float32 logits (N, V) and their ids:
  log softmax = logit - logsumexp, computed for the k values only. (Taking the
  logsumexp's maximum from the top k instead of its own reduction slowed XLA's
  decoding a lot, docs/benchmarks.md: keep the plain reduction.)"""
  values, ids = top_k_rows(logits, k)
  # tf.reduce_logsumexp's arithmetic without its guard for infinite maxima (the logits
  # are finite; a masked one is NEG_INF) and its gradient plumbing: 6 kernels, not 11.
  largest = tf.reduce_max(logits, axis=-1, keepdims=True)
  log_sum = tf.math.log(tf.reduce_sum(tf.exp(logits - largest), axis=-1, keepdims=True))
  return values - (log_sum + largest), ids


def loop_shape(tensor: tf.Tensor) -> tf.TensorShape:
  """The shape invariant of a decoder state tensor in the search loop: a dimension of
  size 0 at the start grows (a growing key/value cache, `Transformer.decode_step(...,
  grow=True)`), every other one keeps its static size."""
  if tensor.shape.rank is None:
    return tf.TensorShape(None)
  return tf.TensorShape([None if d == 0 else d for d in tensor.shape.as_list()])


def _batch_free(shape: tf.TensorShape) -> tf.TensorShape:
  """A loop-variable shape whose leading (batch) dimension may shrink (`ShrinkingBatch`)."""
  if shape.rank in (None, 0):
    return shape
  return tf.TensorShape([None]).concatenate(shape[1:])


def _keep_context(context, leaving: tf.Tensor, staying: tf.Tensor):
  """The context rows of the sentences `staying`, gathered only on a step where some
  sentence is `leaving` (the context never changes otherwise)."""
  if not tf.nest.flatten(context):
    return context
  return tf.cond(tf.size(leaving) > 0,
                 lambda: tf.nest.map_structure(lambda t: tf.gather(t, staying), context),
                 lambda: context)


class BeamState(NamedTuple):
  """The loop variables of `beam_search` (B batch, K beam, L decode length).

  Alive hypotheses have not ended; finished ones ended with EOS and are scored with
  the length penalty. Both sets are kept sorted, best first.
  """

  i: tf.Tensor  # () int32: the position being decoded
  alive_seqs: tf.Tensor  # (B, K, L) int32, PAD after position i
  alive_log_probs: tf.Tensor  # (B, K) float32
  last_ids: tf.Tensor  # (B, K) int32: each alive hypothesis's last token
  finished_seqs: tf.Tensor  # (B, K, L) int32
  finished_scores: tf.Tensor  # (B, K) float32, NEG_INF for empty slots
  state: Any  # the decoder state nest (rows B * K), reordered with the alive beams


class StateRows:
  """How a decoder state follows the beams, by default: every tensor of the nest has
  B * K rows, K per sentence, and is gathered along them.

  A caller whose state is laid out otherwise (t2t_keras' decoder under XLA keeps its
  cache in place and reorders only a table of slots) subclasses this and overrides
  `reorder` and `select`; the searches call nothing else of the state.
  """

  def __init__(self, beam_size: int):
    self.k = beam_size

  def reorder(self, state, parents: tf.Tensor):
    """The state of the surviving hypotheses: hypothesis j of sentence b continues
    parents[b, j] ((B, K) int32)."""
    k = self.k
    return tf.nest.map_structure(lambda t: _merge(_gather(_split(t, k), parents)), state)

  def select(self, state, sentences: tf.Tensor):
    """The state of some sentences of the batch ((B',) int32), all K beams of each."""
    picked = tf.reshape(sentences[:, None] * self.k + tf.range(self.k)[None, :], [-1])
    return tf.nest.map_structure(lambda t: tf.gather(t, picked), state)

  def follow(self, state, parents: tf.Tensor, staying: tf.Tensor):
    """`reorder` by `parents`, then `select` the sentences `staying`; for rows, in one
    gather (a shrinking batch does both every step)."""
    if type(self).reorder is not StateRows.reorder:  # a layout of its own: both steps
      return self.select(self.reorder(state, parents), staying)
    picked = tf.reshape(staying[:, None] * self.k + tf.gather(parents, staying), [-1])
    return tf.nest.map_structure(lambda t: tf.gather(t, picked), state)


class _Search:
  """One beam search's step, stopping rule and results; the loops that drive it are the
  batching's (`FullBatch`, `ShrinkingBatch`, `HalvingBatch`)."""

  def __init__(self, symbols_to_logits: SymbolsToLogits, beam: "Beam", decode_length,
               given_context: bool):
    self.k = beam.size
    self.results = self.k if beam.num_results is None else beam.num_results
    if not 1 <= self.results <= self.k:
      raise ValueError(f"num_results={beam.num_results} must be in 1..beam_size={self.k}")
    self.alpha = beam.alpha
    self.layout = beam.layout or StateRows(self.k)
    self.decode_length = tf.convert_to_tensor(decode_length, tf.int32)
    self.static_length = tf.get_static_value(self.decode_length)
    self._symbols_to_logits = symbols_to_logits
    self._given_context = given_context

  def start(self, initial_ids: tf.Tensor, state) -> Tuple[BeamState, BeamState]:
    """The first loop value and the loop's shape invariants."""
    k, batch, length = self.k, tf.shape(initial_ids)[0], self.decode_length
    seq_shape = tf.TensorShape([None, k, self.static_length])
    initial = BeamState(
        i=tf.constant(0),
        alive_seqs=tf.fill([batch, k, length], tf.constant(PAD_ID, tf.int32)),
        alive_log_probs=tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1]),
        last_ids=tf.tile(tf.cast(initial_ids, tf.int32)[:, None], [1, k]),
        finished_seqs=tf.fill([batch, k, length], tf.constant(PAD_ID, tf.int32)),
        finished_scores=tf.fill([batch, k], tf.constant(NEG_INF)),
        state=state,
    )
    shapes = BeamState(
        i=tf.TensorShape([]), alive_seqs=seq_shape,
        alive_log_probs=tf.TensorShape([None, k]), last_ids=tf.TensorShape([None, k]),
        finished_seqs=seq_shape, finished_scores=tf.TensorShape([None, k]),
        state=tf.nest.map_structure(loop_shape, state))
    return initial, shapes

  def advance(self, loop: BeamState, context) -> Tuple[BeamState, tf.Tensor]:
    """One position for every sentence still in the batch: the new beams (their state
    not yet reordered), and each alive hypothesis' parent (B, K)."""
    k, i, alive_log_probs = self.k, loop.i, loop.alive_log_probs
    rows = tf.shape(alive_log_probs)[0]
    ids = _merge(loop.last_ids)
    if self._given_context:
      logits, state = self._symbols_to_logits(ids, i, loop.state, context)
    else:
      logits, state = self._symbols_to_logits(ids, i, loop.state)
    logits = tf.cast(logits, tf.float32)  # (B*K, V)
    # The 2K best continuations of a sentence are among the 2K best of each of its
    # beams: take those per beam from the logits, then normalise only them (log
    # softmax = logit - logsumexp) and pick the 2K best of the K * 2K. Same result as
    # a top-k over all K * V log probabilities, without writing (B, K, V) twice.
    per_beam = min(2 * k, logits.shape[-1] or 2 * k)  # a toy vocabulary may be < 2K
    beam_log_probs, beam_ids = top_k_log_probs(logits, per_beam)  # (B*K, 2K)
    scores = alive_log_probs[:, :, None] + tf.reshape(beam_log_probs, [rows, k, per_beam])
    top_scores, top_index = tf.math.top_k(tf.reshape(scores, [rows, k * per_beam]), 2 * k)
    top_beams = top_index // per_beam  # (B, 2K)
    top_ids = tf.gather(tf.reshape(beam_ids, [rows, k * per_beam]), top_index, batch_dims=1)
    position = tf.one_hot(i, self.decode_length, on_value=True, off_value=False)  # (L,)
    top_seqs = tf.where(position, top_ids[:, :, None], _gather(loop.alive_seqs, top_beams))
    # A candidate of a dead beam (only possible when V < 2K) never counts as finished.
    ends = tf.equal(top_ids, EOS_ID) & (top_scores > NEG_INF / 2)

    # Alive: the K best candidates that did not end.
    alive_scores, alive_pick = tf.math.top_k(tf.where(ends, NEG_INF, top_scores), k)
    alive_seqs = _gather(top_seqs, alive_pick)
    last_ids = _gather(top_ids, alive_pick)

    # Finished: merge the candidates that ended with the K finished so far.
    ended_scores = tf.where(ends, top_scores / length_penalty(i + 1, self.alpha), NEG_INF)
    all_scores = tf.concat([loop.finished_scores, ended_scores], axis=1)  # (B, 3K)
    all_seqs = tf.concat([loop.finished_seqs, top_seqs], axis=1)
    finished_scores, finished_pick = tf.math.top_k(all_scores, k)
    finished_seqs = _gather(all_seqs, finished_pick)
    new = BeamState(i + 1, alive_seqs, alive_scores, last_ids, finished_seqs,
                    finished_scores, state)
    return new, _gather(top_beams, alive_pick)

  def step(self, loop: BeamState, context) -> BeamState:
    """`advance`, with the state reordered by parent beam."""
    new, parents = self.advance(loop, context)
    return new._replace(state=self.layout.reorder(new.state, parents))

  def done(self, loop: BeamState) -> tf.Tensor:
    """(B,) bool: the sentences whose results the caller reads are final."""
    # Best score any alive hypothesis could still reach vs the worst of the finished
    # ones the caller reads (NEG_INF while fewer than `results` have finished).
    best_alive = loop.alive_log_probs[:, 0] / length_penalty(self.decode_length, self.alpha)
    return loop.finished_scores[:, self.results - 1] > best_alive  # (B,)

  def outputs(self, loop: BeamState) -> Tuple[tf.Tensor, tf.Tensor]:
    """ids (B, K, L) and scores (B, K): the finished hypotheses, best first."""
    # Fill the slots of sentences with fewer than K finished hypotheses with their best
    # alive ones, scored as if they had ended at the length limit. Finished come first:
    # they are sorted by score and their slots are a prefix.
    k = self.k
    alive_final = loop.alive_log_probs / length_penalty(self.decode_length, self.alpha)
    finished_scores = loop.finished_scores
    num_finished = tf.reduce_sum(tf.cast(finished_scores > NEG_INF / 2, tf.int32), axis=1)
    slot = tf.range(k)[None, :]
    pick = tf.where(slot < num_finished[:, None], slot, k + slot - num_finished[:, None])
    ids = _gather(tf.concat([loop.finished_seqs, loop.alive_seqs], axis=1), pick)
    scores = _gather(tf.concat([finished_scores, alive_final], axis=1), pick)
    return ids, scores


class FullBatch:
  """Every sentence stays in the batch until all of them are final."""

  def run(self, search: _Search, initial: BeamState, shapes: BeamState, context):
    def step(loop: BeamState):
      return (search.step(loop, context),)

    def not_done(loop: BeamState):
      return tf.logical_and(loop.i < search.decode_length,
                            tf.logical_not(tf.reduce_all(search.done(loop))))

    final, = tf.while_loop(not_done, step, (initial,), shape_invariants=(shapes,),
                           maximum_iterations=search.decode_length)
    return search.outputs(final)


class ShrinkingBatch:
  """A sentence whose results are final leaves the batch at once: its rows of the state
  and the context are dropped (in the gather that reorders the beams), so later steps
  compute only the sentences still searching, as CTranslate2 does. Same results; graph
  mode only (the batch dimension changes, which XLA cannot compile)."""

  def run(self, search: _Search, initial: BeamState, shapes: BeamState, context):
    k, batch = search.k, tf.shape(initial.alive_log_probs)[0]

    # The loop also carries each remaining sentence's index in the batch, the context,
    # and the results of the sentences that have left.
    def step(loop: BeamState, sentences, context, out_ids, out_scores):
      new, parents = search.advance(loop, context)
      done = search.done(new)
      leaving = tf.where(done)[:, 0]
      ids, scores = search.outputs(new)
      where = tf.gather(sentences, leaving)[:, None]
      out_ids = tf.tensor_scatter_nd_update(out_ids, where, tf.gather(ids, leaving))
      out_scores = tf.tensor_scatter_nd_update(out_scores, where,
                                               tf.gather(scores, leaving))
      staying = tf.cast(tf.where(tf.logical_not(done))[:, 0], tf.int32)
      state = search.layout.follow(new.state, parents, staying)
      new = BeamState(new.i, *(tf.gather(t, staying) for t in new[1:6]), state)
      context = _keep_context(context, leaving, staying)
      return new, tf.gather(sentences, staying), context, out_ids, out_scores

    def not_done(loop, sentences, context, out_ids, out_scores):
      del loop, context, out_ids, out_scores
      return tf.size(sentences) > 0

    loop_shapes = (
        shapes._replace(state=tf.nest.map_structure(_batch_free, shapes.state)),
        tf.TensorShape([None]), tf.nest.map_structure(lambda t: _batch_free(t.shape), context),
        tf.TensorShape([None, k, search.static_length]), tf.TensorShape([None, k]))
    out_ids = tf.fill([batch, k, search.decode_length], tf.constant(PAD_ID, tf.int32))
    out_scores = tf.fill([batch, k], tf.constant(NEG_INF))
    final, sentences, _, out_ids, out_scores = tf.while_loop(
        not_done, step, (initial, tf.range(batch), context, out_ids, out_scores),
        shape_invariants=loop_shapes, maximum_iterations=search.decode_length)
    # Sentences still searching at the length limit end with their best so far.
    ids, scores = search.outputs(final)
    where = sentences[:, None]
    return (tf.tensor_scatter_nd_update(out_ids, where, ids),
            tf.tensor_scatter_nd_update(out_scores, where, scores))


@dataclasses.dataclass(frozen=True)
class HalvingBatch:
  """XLA's static-shape form of `ShrinkingBatch`: up to `times` times the batch halves
  (B, ceil(B / 2), ...; each size a loop of its own, a constant of the compiled program
  known from the input's shape) once no more than the next size of its sentences are
  still searching; the rest leave with their results. Same results (as with shrinking,
  another batch size may round a near tie differently)."""

  times: int

  def run(self, search: _Search, initial: BeamState, shapes: BeamState, context):
    if not self.times:
      return FullBatch().run(search, initial, shapes, context)
    batch, k = tf.shape(initial.alive_log_probs)[0], search.k
    # One row more than the batch: the rows of finished sentences kept only to fill a
    # batch write there, so that they never overwrite a result.
    outputs = (tf.fill(tf.concat([[batch + 1], tf.shape(initial.alive_seqs)[1:]], 0),
                       tf.constant(PAD_ID, tf.int32)),
               tf.fill([batch + 1, k], tf.constant(NEG_INF)))
    loop, sentences, size = initial, tf.range(batch), batch
    loop_shapes = (tf.nest.map_structure(_batch_free, shapes),
                   tf.nest.map_structure(lambda t: _batch_free(t.shape), context))
    for stage in range(self.times + 1):
      last = stage == self.times
      next_size = 0 if last else (size + 1) // 2
      loop, context = self._loop(search, loop, context, loop_shapes, next_size)
      # At the length limit (or in the last loop) every sentence left is done: its
      # results are its best so far, as in the full search.
      done = tf.logical_or(search.done(loop), loop.i >= search.decode_length)
      if last:
        done = tf.ones_like(done)
      outputs = tuple(
          tf.tensor_scatter_nd_update(out, tf.where(done, sentences, batch)[:, None], values)
          for out, values in zip(outputs, search.outputs(loop)))
      if last:
        break
      # The sentences still searching first (in batch order), then finished ones.
      keep = tf.argsort(tf.cast(done, tf.int32), stable=True)[:next_size]
      sentences = tf.where(tf.gather(done, keep), batch, tf.gather(sentences, keep))
      loop = BeamState(loop.i, *(tf.gather(t, keep) for t in loop[1:6]),
                       search.layout.select(loop.state, keep))
      context = tf.nest.map_structure(lambda t: tf.gather(t, keep), context)
      size = next_size
    return outputs[0][:-1], outputs[1][:-1]

  @staticmethod
  def _loop(search: _Search, loop: BeamState, context, loop_shapes, next_size: int):
    """Searches until no more than `next_size` sentences are still searching."""
    def step(loop: BeamState, context):
      return search.step(loop, context), context

    def not_done(loop: BeamState, context):
      del context
      searching = tf.reduce_sum(tf.cast(tf.logical_not(search.done(loop)), tf.int32))
      return tf.logical_and(loop.i < search.decode_length, searching > next_size)

    return tf.while_loop(not_done, step, (loop, context), shape_invariants=loop_shapes,
                         maximum_iterations=search.decode_length)


@dataclasses.dataclass(frozen=True)
class Beam:
  """What a beam search is asked for.

  Attributes:
    size: K, the hypotheses kept per sentence.
    alpha: length-penalty exponent (0 = plain log probability).
    num_results: how many of the K best the caller uses (default K). The search
      stops once, in every sentence, that many finished hypotheses beat the best any
      alive one could still reach: those are then final. With 1 a sentence is done
      when its best finished hypothesis beats every alive one (CTranslate2's rule for
      one hypothesis), often many steps before K have finished; the top result is the
      one the full search returns, the other K - 1 may be worse than its.
    layout: how the decoder state follows the beams; default `StateRows(size)`.
    batch: how sentences whose results are final leave the batch: `FullBatch()`,
      `ShrinkingBatch()` (graph mode) or `HalvingBatch(times)` (XLA). Same results.
  """

  size: int
  alpha: float = 0.6
  num_results: Optional[int] = None
  layout: Optional[StateRows] = None
  batch: Union[FullBatch, ShrinkingBatch, HalvingBatch] = FullBatch()


def beam_search(symbols_to_logits: SymbolsToLogits, initial_ids: tf.Tensor, state: Any,
                decode_length, beam: Beam, context: Any = None
                ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Finds the K best sequences of each sentence.

  Args:
    symbols_to_logits: the incremental decoder (see `SymbolsToLogits`); it receives
      the previous token of each hypothesis (`initial_ids` at index 0), the 0-based
      position being decoded, and the state (and `context`, when given), and returns
      float32 logits and the updated state.
    initial_ids: (B,) int32 start tokens.
    state: nest of tensors with leading dimension B * K (already tiled), or as
      `beam.layout` lays it out.
    decode_length: maximum number of generated tokens (EOS included); int or scalar.
    beam: K, alpha, the results read, the state's layout and the batching (`Beam`).
    context: optional nest of per-sentence tensors (leading dimension B) that the
      step reads and never changes (cross-attention keys/values, the source mask,
      which the K hypotheses of a sentence share); passed as the step's fourth
      argument.

  Returns:
    ids (B, K, decode_length) int32, best first, each ending with EOS (unless it hit
    the length limit) and PAD after it; scores (B, K) float32 (log probability
    divided by the length penalty).
  """
  search = _Search(symbols_to_logits, beam, decode_length, context is not None)
  initial, shapes = search.start(initial_ids, state)
  return beam.batch.run(search, initial, shapes, () if context is None else context)


def greedy_search(symbols_to_logits: SymbolsToLogits, initial_ids: tf.Tensor, state: Any,
                  decode_length, context: Any = None,
                  shrink: bool = False) -> Tuple[tf.Tensor, tf.Tensor]:
  """Arg-max decoding: the fast path for beam size 1.

  `context` as in `beam_search` (one row per sentence); with `shrink` (graph mode
  only, as `ShrinkingBatch`) a row leaves the batch when it writes EOS.

  Returns:
    ids (B, 1, decode_length) with PAD after EOS, and the sequences' log
    probabilities (B, 1) (EOS included), matching `beam_search`'s layout.
  """
  if shrink:
    return _greedy_shrinking(symbols_to_logits, initial_ids, state, decode_length,
                             () if context is None else context, context is not None)
  if context is not None:
    inner = symbols_to_logits
    symbols_to_logits = lambda ids, i, state: inner(ids, i, state, context)  # noqa: E731
  return _one_per_row(symbols_to_logits, initial_ids, state, decode_length,
                      lambda logits, log_probs, i: tf.argmax(log_probs, axis=-1,
                                                             output_type=tf.int32))


def _greedy_shrinking(symbols_to_logits, initial_ids, state, decode_length, context,
                      given_context):
  """`greedy_search` whose rows leave the batch as they end: each step gathers the
  state (and, when a row left, the context) of the rows still decoding and scatters
  the finished ones' results to their batch positions."""
  batch = tf.shape(initial_ids)[0]
  decode_length = tf.convert_to_tensor(decode_length, tf.int32)
  static_length = tf.get_static_value(decode_length)

  # The loop's variables: the rows still decoding (position, batch row, ids so far, log
  # probability, last id), their state and context, and the results of the rows left.
  def step(decoding, state, context, outputs):
    i, rows, seqs, log_probs, last_ids = decoding
    out_seqs, out_log_probs = outputs
    if given_context:
      logits, state = symbols_to_logits(last_ids, i, state, context)
    else:
      logits, state = symbols_to_logits(last_ids, i, state)
    step_log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    ids = tf.argmax(step_log_probs, axis=-1, output_type=tf.int32)
    log_probs += tf.gather(step_log_probs, ids, batch_dims=1)
    position = tf.one_hot(i, decode_length, on_value=True, off_value=False)
    seqs = tf.where(position[None, :], ids[:, None], seqs)
    ended = tf.equal(ids, EOS_ID)
    leaving = tf.where(ended)[:, 0]
    where = tf.gather(rows, leaving)[:, None]
    out_seqs = tf.tensor_scatter_nd_update(out_seqs, where, tf.gather(seqs, leaving))
    out_log_probs = tf.tensor_scatter_nd_update(out_log_probs, where,
                                                tf.gather(log_probs, leaving))
    staying = tf.cast(tf.where(tf.logical_not(ended))[:, 0], tf.int32)
    state = tf.nest.map_structure(lambda t: tf.gather(t, staying), state)
    context = _keep_context(context, leaving, staying)
    decoding = (i + 1, tf.gather(rows, staying), tf.gather(seqs, staying),
                tf.gather(log_probs, staying), tf.gather(ids, staying))
    return decoding, state, context, (out_seqs, out_log_probs)

  def not_done(decoding, *rest):
    del rest
    return tf.size(decoding[1]) > 0

  initial = ((tf.constant(0), tf.range(batch),
              tf.fill([batch, decode_length], tf.constant(PAD_ID, tf.int32)),
              tf.zeros([batch]), tf.cast(initial_ids, tf.int32)), state, context,
             (tf.fill([batch, decode_length], tf.constant(PAD_ID, tf.int32)),
              tf.zeros([batch])))
  shapes = ((tf.TensorShape([]), tf.TensorShape([None]),
             tf.TensorShape([None, static_length]), tf.TensorShape([None]),
             tf.TensorShape([None])),
            tf.nest.map_structure(lambda t: _batch_free(loop_shape(t)), state),
            tf.nest.map_structure(lambda t: _batch_free(t.shape), context),
            (tf.TensorShape([None, static_length]), tf.TensorShape([None])))
  (_, rows, seqs, log_probs, _), _, _, (out_seqs, out_log_probs) = tf.while_loop(
      not_done, step, initial, shape_invariants=shapes, maximum_iterations=decode_length)
  # Rows still decoding at the length limit end there.
  out_seqs = tf.tensor_scatter_nd_update(out_seqs, rows[:, None], seqs)
  out_log_probs = tf.tensor_scatter_nd_update(out_log_probs, rows[:, None], log_probs)
  return out_seqs[:, None, :], out_log_probs[:, None]


def _one_per_row(symbols_to_logits, initial_ids, state, decode_length, choose):
  """The loop of greedy search and sampling: one hypothesis per row, each step's token
  chosen by `choose(float32 logits, their log_softmax, index)` -> (R,) ids."""
  batch = tf.shape(initial_ids)[0]
  decode_length = tf.convert_to_tensor(decode_length, tf.int32)

  def step(i, seqs, log_probs, last_ids, done, state):
    logits, state = symbols_to_logits(last_ids, i, state)
    logits = tf.cast(logits, tf.float32)
    step_log_probs = tf.nn.log_softmax(logits)
    ids = tf.where(done, PAD_ID, choose(logits, step_log_probs, i))
    gained = tf.gather(step_log_probs, ids, batch_dims=1)
    log_probs += tf.where(done, 0.0, gained)
    position = tf.one_hot(i, decode_length, on_value=True, off_value=False)
    seqs = tf.where(position[None, :], ids[:, None], seqs)
    return i + 1, seqs, log_probs, ids, done | tf.equal(ids, EOS_ID), state

  def not_done(i, seqs, log_probs, last_ids, done, state):
    del seqs, log_probs, last_ids, state
    return tf.logical_and(i < decode_length, tf.logical_not(tf.reduce_all(done)))

  initial = (tf.constant(0), tf.fill([batch, decode_length], tf.constant(PAD_ID, tf.int32)),
             tf.zeros([batch]), tf.cast(initial_ids, tf.int32),
             tf.zeros([batch], tf.bool), state)
  _, seqs, log_probs, _, _, _ = tf.while_loop(
      not_done, step, initial, maximum_iterations=decode_length,
      shape_invariants=tf.nest.map_structure(loop_shape, initial))
  return seqs[:, None, :], log_probs[:, None]
