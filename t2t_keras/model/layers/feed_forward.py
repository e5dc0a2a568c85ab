"""Position-wise feed-forward network (paper section 3.3): max(0, x W1 + b1) W2 + b2."""

from __future__ import annotations

import keras

from t2t_keras.model.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="t2t_keras")
class FeedForward(keras.layers.Layer):
  """Two dense layers with a ReLU between, applied to each position alike.

  Args:
    filter_size: d_ff, the inner size (2048 in base).
    output_size: D, d_model.
    relu_dropout: dropout on the ReLU activations (tensor2tensor's relu_dropout).

  Call arguments:
    inputs: (B, T, D).
    training: whether dropout is active.

  Returns:
    (B, T, D).
  """

  def __init__(self, filter_size, output_size, relu_dropout=0.0, **kwargs):
    super().__init__(**kwargs)
    self.filter_size = filter_size
    self.output_size = output_size
    self.relu_dropout = relu_dropout

  def build(self, input_shape):
    self.filter_dense = keras.layers.Dense(
        self.filter_size, activation="relu", dtype=self.dtype_policy, name="filter",
        kernel_initializer="glorot_uniform")
    self.output_dense = keras.layers.Dense(
        self.output_size, dtype=self.dtype_policy, name="output",
        kernel_initializer="glorot_uniform")
    self.dropout = Dropout(self.relu_dropout, dtype=self.dtype_policy, name="relu_dropout")
    self.filter_dense.build((None, None, input_shape[-1]))
    self.output_dense.build((None, None, self.filter_size))
    self.built = True

  def call(self, inputs, training=None):
    hidden = self.filter_dense(inputs)  # (B, T, d_ff)
    hidden = self.dropout(hidden, training=training)
    return self.output_dense(hidden)

  def get_config(self):
    config = super().get_config()
    config.update(filter_size=self.filter_size, output_size=self.output_size,
                  relu_dropout=self.relu_dropout)
    return config
