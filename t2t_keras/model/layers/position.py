"""Positional encodings added to the embeddings at the bottom of both stacks.

`SinusoidalPosition` is the paper's formula exactly (section 3.5), with sines on even
and cosines on odd dimensions:
  PE(pos, 2i) = sin(pos / 10000^(2i/D)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).
(tensor2tensor concatenates sin and cos halves instead; the paper interleaves.)
It is computed on the fly for any start position, so incremental decoding and inputs
longer than anything seen in training need no table.

`LearnedPosition` is Table 3 row E: a trainable (max_position, D) table.

Both take `positions` (B, T) instead of a start for packed rows (data/batching/packing.py),
where positions restart at every pair of a row.
"""

from __future__ import annotations

import keras
from keras import ops


def sinusoid(positions, hidden_size):
  """The paper's encoding of float positions (T,) as a float32 (T, D) array."""
  dims = ops.arange(hidden_size)
  pair = ops.cast(dims // 2 * 2, "float32")  # 2i for both dims of a sin/cos pair
  inv_timescale = ops.power(10000.0, -pair / float(hidden_size))  # (D,)
  angles = ops.cast(positions, "float32")[:, None] * inv_timescale[None, :]  # (T, D)
  return ops.where(dims % 2 == 0, ops.sin(angles), ops.cos(angles))


@keras.saving.register_keras_serializable(package="t2t_keras")
class SinusoidalPosition(keras.layers.Layer):
  """Adds the paper's sinusoidal encoding of positions start, start+1, ... to inputs.

  Call arguments:
    inputs: (B, T, D) embeddings.
    start: scalar int position of the first element (incremental decoding).
    positions: optional int (B, T), each element's own position (packed rows);
      replaces `start`.

  Returns:
    (B, T, D) inputs + PE.
  """

  def call(self, inputs, start=0, positions=None):
    dim = inputs.shape[-1]
    if positions is not None:
      encoding = sinusoid(ops.reshape(positions, (-1,)), dim)  # (B * T, D)
      return inputs + ops.cast(ops.reshape(encoding, ops.shape(inputs)), inputs.dtype)
    encoding = sinusoid(ops.arange(ops.shape(inputs)[1]) + start, dim)
    return inputs + ops.cast(encoding, inputs.dtype)[None]


@keras.saving.register_keras_serializable(package="t2t_keras")
class LearnedPosition(keras.layers.Layer):
  """Adds a learned embedding of positions start, start+1, ... (Table 3 row E).

  Args:
    max_position: number of positions with an embedding; positions past the table
      reuse its last row (clamped), so size it to the longest sequence trained on.
    hidden_size: D.

  Call arguments:
    inputs: (B, T, D) embeddings.
    start: scalar int position of the first element (incremental decoding).
    positions: optional int (B, T), each element's own position (packed rows);
      replaces `start`.
  """

  def __init__(self, max_position, hidden_size, **kwargs):
    super().__init__(**kwargs)
    self.max_position = max_position
    self.hidden_size = hidden_size

  def build(self, input_shape=None):
    self.position_embeddings = self.add_weight(
        name="position_embeddings", shape=(self.max_position, self.hidden_size),
        initializer=keras.initializers.RandomNormal(stddev=self.hidden_size ** -0.5))
    self.built = True

  def call(self, inputs, start=0, positions=None):
    if positions is None:
      positions = (ops.arange(ops.shape(inputs)[1]) + start)[None]  # (1, T)
    positions = ops.minimum(positions, self.max_position - 1)
    encoding = ops.take(self.position_embeddings, positions, axis=0)  # (B or 1, T, D)
    return inputs + ops.cast(encoding, inputs.dtype)

  def get_config(self):
    config = super().get_config()
    config.update(max_position=self.max_position, hidden_size=self.hidden_size)
    return config
