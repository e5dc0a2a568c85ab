"""One beam search's hypotheses and step (`_Search`): the K alive and K finished
hypotheses of each sentence (`BeamState`), the decoder state following them
(`StateRows`), the GNMT length penalty and the fast top-k the step takes its
candidates with. The loops that drive a step are `batching`'s; `beam.beam_search`
puts them together.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Tuple

import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.inference.search.common import NEG_INF, SymbolsToLogits, loop_shape


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
  batching's (`FullBatch`, `ShrinkingBatch`, `HalvingBatch`); `beam` is the search's
  `beam.Beam`."""

  def __init__(self, symbols_to_logits: SymbolsToLogits, beam, decode_length,
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
