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
0 at the start may grow, see `loop_shape`; not under XLA); it is reordered
by parent beam once per step, or by the caller's `reorder_state` (t2t_keras' decoder
under XLA keeps its cache in place and reorders only a table of slots). Per-sentence
tensors that never change (cross-attention keys/values, source mask) are the search's
`context` (one row per sentence, shared by its beams) or the caller's closure, and are
never reordered. With `shrink` (graph mode) a sentence whose results are final leaves
the batch: its state and context rows are dropped in the same gather as the beam
reorder, so the remaining steps compute only the sentences still searching. Under XLA
(static shapes) `halvings` does the same by halves: the batch moves to a loop of half
its size once no more than half its sentences are still searching.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID

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
  k * chunk candidates replace a top-k over V (about 6x faster for V = 32,000, k = 8
  on CPU, with and without XLA). Ties may pick another index of an equal value than
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
  logsumexp's maximum from the top k instead of its own reduction halved XLA's
  decoding speed, test2016 49 -> 28 sentences/s: keep the plain reduction.)"""
  values, ids = top_k_rows(logits, k)
  return values - tf.reduce_logsumexp(logits, axis=-1, keepdims=True), ids


def loop_shape(tensor: tf.Tensor) -> tf.TensorShape:
  """The shape invariant of a decoder state tensor in the search loop: a dimension of
  size 0 at the start grows (a growing key/value cache, `Transformer.decode_step(...,
  grow=True)`), every other one keeps its static size."""
  if tensor.shape.rank is None:
    return tf.TensorShape(None)
  return tf.TensorShape([None if d == 0 else d for d in tensor.shape.as_list()])


def _batch_free(shape: tf.TensorShape) -> tf.TensorShape:
  """A loop-variable shape whose leading (batch) dimension may shrink (`shrink`)."""
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


def beam_search(symbols_to_logits: SymbolsToLogits, initial_ids: tf.Tensor, state: Any,
                beam_size: int, decode_length, alpha: float = 0.6,
                eos_id: int = EOS_ID,
                reorder_state: Optional[Callable[[Any, tf.Tensor], Any]] = None,
                num_results: Optional[int] = None, context: Any = None,
                shrink: bool = False, halvings: int = 0,
                select_state: Optional[Callable[[Any, tf.Tensor], Any]] = None,
                ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Finds the K best sequences of each sentence.

  Args:
    symbols_to_logits: the incremental decoder (see `SymbolsToLogits`); it receives
      the previous token of each hypothesis (`initial_ids` at index 0), the 0-based
      position being decoded, and the state (and `context`, when given), and returns
      float32 logits and the updated state.
    initial_ids: (B,) int32 start tokens.
    state: nest of tensors with leading dimension B * K (already tiled).
    beam_size: K.
    decode_length: maximum number of generated tokens (EOS included); int or scalar.
    alpha: length-penalty exponent (0 = plain log probability).
    eos_id: end-of-sequence id.
    reorder_state: (state, parents (B, K) int32) -> state for the surviving
      hypotheses, hypothesis j of sentence b continuing parents[b, j]; by default
      every tensor of `state` is gathered along its leading B * K rows.
    num_results: how many of the K best the caller uses (default K). The search
      stops once, in every sentence, that many finished hypotheses beat the best any
      alive one could still reach: those are then final. With 1 a sentence is done
      when its best finished hypothesis beats every alive one (CTranslate2's rule for
      one hypothesis), often many steps before K have finished; the top result is the
      one the full search returns, the other K - 1 may be worse than its.
    context: optional nest of per-sentence tensors (leading dimension B) that the
      step reads and never changes (cross-attention keys/values, the source mask,
      which the K hypotheses of a sentence share); passed as the step's fourth
      argument.
    shrink: a sentence whose results are final leaves the batch at once: its rows of
      `state` and `context` are dropped (in the gather that reorders the beams), so
      later steps compute only the sentences still searching, as CTranslate2 does.
      Same results; graph mode only (the batch dimension changes, which XLA cannot
      compile), and not with `reorder_state`.
    halvings: XLA's static-shape form of `shrink`: up to this many times the batch
      halves (B, ceil(B / 2), ...; each size a loop of its own, sizes known from the
      shapes alone) once no more than the next size of its sentences are still
      searching; the rest leave with their results. Same results (as with `shrink`,
      another batch size may round a near tie differently).
    select_state: (state, sentences (B',) int32) -> the state of those sentences of
      the batch, for `halvings`; by default every tensor of `state` is gathered along
      its leading B * K rows.

  Returns:
    ids (B, K, decode_length) int32, best first, each ending with EOS (unless it hit
    the length limit) and PAD after it; scores (B, K) float32 (log probability
    divided by the length penalty).
  """
  k = beam_size
  results = k if num_results is None else num_results
  if not 1 <= results <= k:
    raise ValueError(f"num_results={num_results} must be in 1..beam_size={k}")
  if shrink and reorder_state is not None:
    raise ValueError("beam_search: shrink gathers the state itself (no reorder_state)")
  if shrink and halvings:
    raise ValueError("beam_search: shrink or halvings, not both")
  if halvings and reorder_state is not None and select_state is None:
    raise ValueError("beam_search: halvings with a reorder_state needs its select_state")
  batch = tf.shape(initial_ids)[0]
  decode_length = tf.convert_to_tensor(decode_length, tf.int32)
  static_length = tf.get_static_value(decode_length)
  given_context = context is not None
  context = () if context is None else context

  def call(ids, i, state, context):
    if given_context:
      return symbols_to_logits(ids, i, state, context)
    return symbols_to_logits(ids, i, state)

  def gather_state(nest, parents):
    return tf.nest.map_structure(lambda t: _merge(_gather(_split(t, k), parents)), nest)

  gather_state = reorder_state or gather_state

  def search_step(loop: BeamState, context):
    """One position for every sentence still in the batch: the new beams, and each
    alive hypothesis' parent (B, K) for the state's reorder."""
    i, alive_log_probs = loop.i, loop.alive_log_probs
    rows = tf.shape(alive_log_probs)[0]
    logits, state = call(_merge(loop.last_ids), i, loop.state, context)
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
    position = tf.one_hot(i, decode_length, on_value=True, off_value=False)  # (L,)
    top_seqs = tf.where(position, top_ids[:, :, None], _gather(loop.alive_seqs, top_beams))
    # A candidate of a dead beam (only possible when V < 2K) never counts as finished.
    ends = tf.equal(top_ids, eos_id) & (top_scores > NEG_INF / 2)

    # Alive: the K best candidates that did not end.
    alive_scores, alive_pick = tf.math.top_k(tf.where(ends, NEG_INF, top_scores), k)
    alive_seqs = _gather(top_seqs, alive_pick)
    last_ids = _gather(top_ids, alive_pick)

    # Finished: merge the candidates that ended with the K finished so far.
    ended_scores = tf.where(ends, top_scores / length_penalty(i + 1, alpha), NEG_INF)
    all_scores = tf.concat([loop.finished_scores, ended_scores], axis=1)  # (B, 3K)
    all_seqs = tf.concat([loop.finished_seqs, top_seqs], axis=1)
    finished_scores, finished_pick = tf.math.top_k(all_scores, k)
    finished_seqs = _gather(all_seqs, finished_pick)
    new = BeamState(i + 1, alive_seqs, alive_scores, last_ids, finished_seqs,
                    finished_scores, state)
    return new, _gather(top_beams, alive_pick)

  def sentence_done(loop: BeamState):
    # Best score any alive hypothesis could still reach vs the worst of the finished
    # ones the caller reads (NEG_INF while fewer than `results` have finished).
    best_alive = loop.alive_log_probs[:, 0] / length_penalty(decode_length, alpha)
    return loop.finished_scores[:, results - 1] > best_alive  # (B,)

  def final_results(loop: BeamState):
    # Fill the slots of sentences with fewer than K finished hypotheses with their best
    # alive ones, scored as if they had ended at the length limit. Finished come first:
    # they are sorted by score and their slots are a prefix.
    alive_final = loop.alive_log_probs / length_penalty(decode_length, alpha)
    finished_scores = loop.finished_scores
    num_finished = tf.reduce_sum(tf.cast(finished_scores > NEG_INF / 2, tf.int32), axis=1)
    slot = tf.range(k)[None, :]
    pick = tf.where(slot < num_finished[:, None], slot, k + slot - num_finished[:, None])
    ids = _gather(tf.concat([loop.finished_seqs, loop.alive_seqs], axis=1), pick)
    scores = _gather(tf.concat([finished_scores, alive_final], axis=1), pick)
    return ids, scores

  seq_shape = tf.TensorShape([None, k, static_length])
  initial = BeamState(
      i=tf.constant(0),
      alive_seqs=tf.fill([batch, k, decode_length], tf.constant(PAD_ID, tf.int32)),
      alive_log_probs=tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch, 1]),
      last_ids=tf.tile(tf.cast(initial_ids, tf.int32)[:, None], [1, k]),
      finished_seqs=tf.fill([batch, k, decode_length], tf.constant(PAD_ID, tf.int32)),
      finished_scores=tf.fill([batch, k], tf.constant(NEG_INF)),
      state=state,
  )
  shapes = BeamState(
      i=tf.TensorShape([]), alive_seqs=seq_shape, alive_log_probs=tf.TensorShape([None, k]),
      last_ids=tf.TensorShape([None, k]), finished_seqs=seq_shape,
      finished_scores=tf.TensorShape([None, k]),
      state=tf.nest.map_structure(loop_shape, state))

  if halvings:
    return _halving_search(search_step, sentence_done, final_results, gather_state,
                           select_state or _rows_of_sentences(k), initial, shapes, context,
                           decode_length, halvings)
  if not shrink:
    def step(loop: BeamState):
      new, parents = search_step(loop, context)
      return (new._replace(state=gather_state(new.state, parents)),)

    def not_done(loop: BeamState):
      return tf.logical_and(loop.i < decode_length,
                            tf.logical_not(tf.reduce_all(sentence_done(loop))))

    final, = tf.while_loop(not_done, step, (initial,), shape_invariants=(shapes,),
                           maximum_iterations=decode_length)
    return final_results(final)

  # Shrinking: the loop also carries each remaining sentence's index in the batch, the
  # context, and the results of the sentences that have left.
  def shrink_step(loop: BeamState, sentences, context, out_ids, out_scores):
    new, parents = search_step(loop, context)
    done = sentence_done(new)
    leaving = tf.where(done)[:, 0]
    ids, scores = final_results(new)
    where = tf.gather(sentences, leaving)[:, None]
    out_ids = tf.tensor_scatter_nd_update(out_ids, where, tf.gather(ids, leaving))
    out_scores = tf.tensor_scatter_nd_update(out_scores, where, tf.gather(scores, leaving))
    staying = tf.cast(tf.where(tf.logical_not(done))[:, 0], tf.int32)
    # The state follows the parent beams of the sentences that stay: one gather.
    picked = tf.reshape(staying[:, None] * k + tf.gather(parents, staying), [-1])
    state = tf.nest.map_structure(lambda t: tf.gather(t, picked), new.state)
    new = BeamState(new.i, *(tf.gather(t, staying) for t in new[1:6]), state)
    context = _keep_context(context, leaving, staying)
    return new, tf.gather(sentences, staying), context, out_ids, out_scores

  def shrink_not_done(loop, sentences, context, out_ids, out_scores):
    del loop, context, out_ids, out_scores
    return tf.size(sentences) > 0

  shrink_shapes = (shapes._replace(state=tf.nest.map_structure(_batch_free, shapes.state)),
                   tf.TensorShape([None]),
                   tf.nest.map_structure(lambda t: _batch_free(t.shape), context),
                   tf.TensorShape([None, k, static_length]), tf.TensorShape([None, k]))
  out_ids = tf.fill([batch, k, decode_length], tf.constant(PAD_ID, tf.int32))
  out_scores = tf.fill([batch, k], tf.constant(NEG_INF))
  final, sentences, _, out_ids, out_scores = tf.while_loop(
      shrink_not_done, shrink_step,
      (initial, tf.range(batch), context, out_ids, out_scores),
      shape_invariants=shrink_shapes, maximum_iterations=decode_length)
  # Sentences still searching at the length limit end with their best so far.
  ids, scores = final_results(final)
  where = sentences[:, None]
  return (tf.tensor_scatter_nd_update(out_ids, where, ids),
          tf.tensor_scatter_nd_update(out_scores, where, scores))


def _rows_of_sentences(k: int):
  """The default `select_state`: every tensor's B * K rows, K per sentence."""
  def select(state, sentences):
    picked = tf.reshape(sentences[:, None] * k + tf.range(k)[None, :], [-1])
    return tf.nest.map_structure(lambda t: tf.gather(t, picked), state)
  return select


def _halving_search(search_step, sentence_done, final_results, gather_state, select_state,
                    initial: BeamState, shapes: BeamState, context, decode_length,
                    halvings: int):
  """`beam_search` with `halvings`: a loop per batch size, B, ceil(B / 2), ...; between
  two, the sentences still searching (and, to fill the smaller batch, some finished
  ones) move on, and the results of the finished ones are written out. Under XLA each
  size is a constant of the compiled program (it comes from the input's shape)."""
  batch = tf.shape(initial.alive_log_probs)[0]
  k = initial.alive_log_probs.shape[1]
  # One row more than the batch: the rows of finished sentences kept only to fill a
  # batch write there, so that they never overwrite a result.
  out_ids = tf.fill(tf.concat([[batch + 1], tf.shape(initial.alive_seqs)[1:]], 0),
                    tf.constant(PAD_ID, tf.int32))
  out_scores = tf.fill([batch + 1, k], tf.constant(NEG_INF))
  loop, sentences, size = initial, tf.range(batch), batch
  loop_shapes = (tf.nest.map_structure(_batch_free, shapes),
                 tf.nest.map_structure(lambda t: _batch_free(t.shape), context))

  def write(out, rows, values, done):
    return tf.tensor_scatter_nd_update(out, tf.where(done, rows, batch)[:, None], values)

  for stage in range(halvings + 1):
    last = stage == halvings
    next_size = 0 if last else (size + 1) // 2

    def step(loop: BeamState, context):
      new, parents = search_step(loop, context)
      return new._replace(state=gather_state(new.state, parents)), context

    def not_done(loop: BeamState, context, next_size=next_size):
      del context
      searching = tf.reduce_sum(tf.cast(tf.logical_not(sentence_done(loop)), tf.int32))
      return tf.logical_and(loop.i < decode_length, searching > next_size)

    loop, context = tf.while_loop(not_done, step, (loop, context),
                                  shape_invariants=loop_shapes,
                                  maximum_iterations=decode_length)
    # At the length limit (or in the last loop) every sentence left is done: its
    # results are its best so far, as in the full search.
    done = tf.logical_or(sentence_done(loop), loop.i >= decode_length)
    if last:
      done = tf.ones_like(done)
    ids, scores = final_results(loop)
    out_ids = write(out_ids, sentences, ids, done)
    out_scores = write(out_scores, sentences, scores, done)
    if last:
      break
    # The sentences still searching first (in batch order), then finished ones.
    keep = tf.argsort(tf.cast(done, tf.int32), stable=True)[:next_size]
    finished = tf.gather(done, keep)
    sentences = tf.where(finished, batch, tf.gather(sentences, keep))
    loop = BeamState(loop.i, *(tf.gather(t, keep) for t in loop[1:6]),
                     select_state(loop.state, keep))
    context = tf.nest.map_structure(lambda t: tf.gather(t, keep), context)
    size = next_size
  return out_ids[:-1], out_scores[:-1]


def greedy_search(symbols_to_logits: SymbolsToLogits, initial_ids: tf.Tensor, state: Any,
                  decode_length, eos_id: int = EOS_ID, context: Any = None,
                  shrink: bool = False) -> Tuple[tf.Tensor, tf.Tensor]:
  """Arg-max decoding: the fast path for beam size 1.

  `context` and `shrink` as in `beam_search` (one row per sentence): with `shrink`
  (graph mode only) a row leaves the batch when it writes EOS.

  Returns:
    ids (B, 1, decode_length) with PAD after EOS, and the sequences' log
    probabilities (B, 1) (EOS included), matching `beam_search`'s layout.
  """
  if shrink:
    return _greedy_shrinking(symbols_to_logits, initial_ids, state, decode_length, eos_id,
                             () if context is None else context, context is not None)
  if context is not None:
    inner = symbols_to_logits
    symbols_to_logits = lambda ids, i, state: inner(ids, i, state, context)  # noqa: E731
  return _one_per_row(symbols_to_logits, initial_ids, state, decode_length,
                      lambda logits, log_probs, i: tf.argmax(log_probs, axis=-1,
                                                             output_type=tf.int32),
                      eos_id)


def _greedy_shrinking(symbols_to_logits, initial_ids, state, decode_length, eos_id,
                      context, given_context):
  """`greedy_search` whose rows leave the batch as they end: each step gathers the
  state (and, when a row left, the context) of the rows still decoding and scatters
  the finished ones' results to their batch positions."""
  batch = tf.shape(initial_ids)[0]
  decode_length = tf.convert_to_tensor(decode_length, tf.int32)
  static_length = tf.get_static_value(decode_length)

  def step(i, rows, seqs, log_probs, last_ids, state, context, out_seqs, out_log_probs):
    if given_context:
      logits, state = symbols_to_logits(last_ids, i, state, context)
    else:
      logits, state = symbols_to_logits(last_ids, i, state)
    step_log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    ids = tf.argmax(step_log_probs, axis=-1, output_type=tf.int32)
    log_probs += tf.gather(step_log_probs, ids, batch_dims=1)
    position = tf.one_hot(i, decode_length, on_value=True, off_value=False)
    seqs = tf.where(position[None, :], ids[:, None], seqs)
    ended = tf.equal(ids, eos_id)
    leaving = tf.where(ended)[:, 0]
    where = tf.gather(rows, leaving)[:, None]
    out_seqs = tf.tensor_scatter_nd_update(out_seqs, where, tf.gather(seqs, leaving))
    out_log_probs = tf.tensor_scatter_nd_update(out_log_probs, where,
                                                tf.gather(log_probs, leaving))
    staying = tf.cast(tf.where(tf.logical_not(ended))[:, 0], tf.int32)
    state = tf.nest.map_structure(lambda t: tf.gather(t, staying), state)
    context = _keep_context(context, leaving, staying)
    return (i + 1, tf.gather(rows, staying), tf.gather(seqs, staying),
            tf.gather(log_probs, staying), tf.gather(ids, staying), state, context,
            out_seqs, out_log_probs)

  def not_done(i, rows, *rest):
    del i, rest
    return tf.size(rows) > 0

  initial = (tf.constant(0), tf.range(batch),
             tf.fill([batch, decode_length], tf.constant(PAD_ID, tf.int32)),
             tf.zeros([batch]), tf.cast(initial_ids, tf.int32), state, context,
             tf.fill([batch, decode_length], tf.constant(PAD_ID, tf.int32)),
             tf.zeros([batch]))
  shapes = (tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None, static_length]),
            tf.TensorShape([None]), tf.TensorShape([None]),
            tf.nest.map_structure(lambda t: _batch_free(loop_shape(t)), state),
            tf.nest.map_structure(lambda t: _batch_free(t.shape), context),
            tf.TensorShape([None, static_length]), tf.TensorShape([None]))
  _, rows, seqs, log_probs, _, _, _, out_seqs, out_log_probs = tf.while_loop(
      not_done, step, initial, shape_invariants=shapes, maximum_iterations=decode_length)
  # Rows still decoding at the length limit end there.
  out_seqs = tf.tensor_scatter_nd_update(out_seqs, rows[:, None], seqs)
  out_log_probs = tf.tensor_scatter_nd_update(out_log_probs, rows[:, None], log_probs)
  return out_seqs[:, None, :], out_log_probs[:, None]


def _one_per_row(symbols_to_logits, initial_ids, state, decode_length, choose, eos_id):
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
    return i + 1, seqs, log_probs, ids, done | tf.equal(ids, eos_id), state

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


def _mix32(x: tf.Tensor) -> tf.Tensor:
  """MurmurHash3's 32-bit finalizer: a bijection of uint32 that mixes every bit."""
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))
  x = x * tf.constant(0x85EBCA6B, tf.uint32)
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(13, tf.uint32)))
  x = x * tf.constant(0xC2B2AE35, tf.uint32)
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))


def _to_uint32(x) -> tf.Tensor:
  return tf.bitcast(tf.cast(x, tf.int32), tf.uint32)


def row_uniform(seed, keys: tf.Tensor, index, vocab_size: int) -> tf.Tensor:
  """Uniform noise in (0, 1), (R, V): a counter-based hash of (seed, key, index, token).

  Row r's values depend only on the seed, keys[r], the position and the token, so a
  sample does not change with the batch it is decoded in (tf.random's stateless ops
  draw one stream for a whole tensor). Works in graph mode, under XLA and in exports.
  """
  row = _mix32(_mix32(_to_uint32(seed) ^ tf.constant(0x9E3779B9, tf.uint32))
               ^ _to_uint32(keys))
  row = _mix32(row ^ _mix32(_to_uint32(index) + tf.constant(0x7F4A7C15, tf.uint32)))
  tokens = _mix32(_to_uint32(tf.range(vocab_size)) * tf.constant(0x27D4EB2F, tf.uint32)
                  + tf.constant(0x165667B1, tf.uint32))
  bits = _mix32(row[:, None] ^ tokens[None, :])
  # The top 24 bits, centred in their interval: never exactly 0 or 1.
  top = tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32)
  return (top + 0.5) / float(1 << 24)


def filter_logits(logits: tf.Tensor, topk: int = 0, topp: float = 1.0) -> tf.Tensor:
  """Keeps the `topk` largest logits of each row (0 = all) and, of those, the smallest
  set whose probability reaches `topp` (nucleus); the rest become NEG_INF."""
  vocab = logits.shape[-1]
  if topk and vocab is not None and topk < vocab:
    kth = tf.math.top_k(logits, topk).values[:, -1:]
    logits = tf.where(logits < kth, NEG_INF, logits)
  if topp < 1.0:
    ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
    probs = tf.nn.softmax(ordered, axis=-1)
    before = tf.cumsum(probs, axis=-1, exclusive=True)  # probability of the better ones
    # The last kept logit: the first token whose inclusion reaches topp.
    kept = tf.reduce_sum(tf.cast(before < topp, tf.int32), axis=-1, keepdims=True)
    threshold = tf.gather(ordered, tf.maximum(kept - 1, 0), batch_dims=1)
    logits = tf.where(logits < threshold, NEG_INF, logits)
  return logits


NEVER_SAMPLED = (PAD_ID, BOS_ID)  # no tensor at import: TensorFlow's runtime starts later


def sample_search(symbols_to_logits: SymbolsToLogits, initial_ids: tf.Tensor, state: Any,
                  decode_length, keys: tf.Tensor, seed, topk: int = 0, topp: float = 1.0,
                  temperature: float = 1.0, eos_id: int = EOS_ID
                  ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Random sampling: one sequence per row, drawn token by token from the model.

  Each step samples from softmax(logits / temperature) restricted by `filter_logits`
  and without PAD and BOS
  (Gumbel-max: the arg-max of filtered logits plus Gumbel noise from `row_uniform`, so
  row r's draws depend only on seed, keys[r] and the position).

  Args:
    keys: (R,) int32, each row's key (e.g. input line number * samples + sample).
    seed: int or scalar int32 tensor.

  Returns:
    ids (R, 1, decode_length) with PAD after EOS, and the samples' log probabilities
    under the model (R, 1) (plain softmax: no temperature, no filtering; EOS included),
    matching `greedy_search`'s layout.
  """
  keys = tf.cast(keys, tf.int32)

  def choose(logits, log_probs, i):
    del log_probs
    vocab = logits.shape[-1]
    # PAD and BOS are never outputs (a sentence cannot contain them).
    never = tf.reduce_any(tf.range(vocab)[:, None] == tf.constant(NEVER_SAMPLED), axis=1)
    logits = tf.where(never, NEG_INF, logits)
    filtered = filter_logits(logits / temperature, topk, topp)
    noise = -tf.math.log(-tf.math.log(row_uniform(seed, keys, i, vocab)))
    # Tokens excluded by the caller (NEG_INF logits: a forced EOS, a constraint) or by
    # the filter are never drawn, whatever the temperature did to their logits.
    allowed = (logits > NEG_INF / 2) & (filtered > NEG_INF / 2)
    return tf.argmax(tf.where(allowed, filtered + noise, 2 * NEG_INF), axis=-1,
                     output_type=tf.int32)

  return _one_per_row(symbols_to_logits, initial_ids, state, decode_length, choose, eos_id)
