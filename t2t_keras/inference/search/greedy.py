"""Greedy (arg-max) search, the fast path for beam size 1, and the loop it shares with
sampling (`_one_per_row`: one hypothesis per row, a choice of token per step)."""

from __future__ import annotations

from typing import Any, Tuple

import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.inference.search.common import (SymbolsToLogits, _batch_free, _keep_context,
                                               loop_shape)


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
