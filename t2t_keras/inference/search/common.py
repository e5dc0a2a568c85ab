"""What every search shares: the score of an impossible token, the step's signature,
and the loop's shapes (a state that grows, a batch that shrinks) and context rows."""

from __future__ import annotations

from typing import Any, Callable, Tuple

import tensorflow as tf

# A large negative score instead of -inf: -inf - -inf is NaN, and XLA dislikes infs.
NEG_INF = -1.0e9

# symbols_to_logits(ids (B*K,) int32, index scalar int32, state) ->
#   (float32 logits (B*K, V), new state)
SymbolsToLogits = Callable[[tf.Tensor, tf.Tensor, Any], Tuple[tf.Tensor, Any]]


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
