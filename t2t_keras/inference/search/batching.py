"""How sentences whose results are final leave the batch of a beam search: the loops
that drive its step. `FullBatch` keeps them, `ShrinkingBatch` (graph mode) drops each
at once, its state and context rows in the same gather as the beam reorder, and
`HalvingBatch` (XLA, static shapes) does the same by halves: the batch moves to a loop
of half its size once no more than half its sentences are still searching.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from t2t_keras import PAD_ID
from t2t_keras.inference.search.common import NEG_INF, _batch_free, _keep_context
from t2t_keras.inference.search.hypotheses import BeamState, _Search


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
    # Position 0 runs before the loop: there the step sees a constant index, and may run
    # the K identical hypotheses of a sentence as one (`decoding.GrowingCache`).
    first = step(initial, tf.range(batch), context, out_ids, out_scores)
    final, sentences, _, out_ids, out_scores = tf.while_loop(
        not_done, step, first, shape_invariants=loop_shapes,
        maximum_iterations=tf.maximum(search.decode_length - 1, 0))
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
