"""Encoder and decoder layers (paper section 3.1) with post-norm or pre-norm residuals.

Post-norm (the paper, default): x = LayerNorm(x + Dropout(Sublayer(x))).
Pre-norm (tensor2tensor's later default, `pre_norm=True`):
  x = x + Dropout(Sublayer(LayerNorm(x))), with one more LayerNorm after the stack
  (the model adds it).
Dropout here is the paper's residual dropout P_drop (t2t's layer_prepostprocess_dropout).
"""

from __future__ import annotations

import keras

from t2t_keras.model.layers.attention import MultiHeadAttention
from t2t_keras.model.layers.dropout import Dropout
from t2t_keras.model.layers.feed_forward import FeedForward


@keras.saving.register_keras_serializable(package="t2t_keras")
class Residual(keras.layers.Layer):
  """Norm + dropout + residual add around one sublayer, in either order."""

  def __init__(self, pre_norm, dropout, norm_epsilon, **kwargs):
    super().__init__(**kwargs)
    self.pre_norm = pre_norm
    self.dropout_rate = dropout
    self.norm_epsilon = norm_epsilon

  def build(self, input_shape):
    self.norm = keras.layers.LayerNormalization(
        epsilon=self.norm_epsilon, dtype=self.dtype_policy, name="norm")
    self.dropout = Dropout(self.dropout_rate, dtype=self.dtype_policy, name="dropout")
    self.norm.build(input_shape)
    self.built = True

  def before(self, x):
    """The sublayer's input."""
    return self.norm(x) if self.pre_norm else x

  def after(self, x, sublayer_output, training):
    """Combines the residual stream with the sublayer's output."""
    y = x + self.dropout(sublayer_output, training=training)
    return y if self.pre_norm else self.norm(y)

  def get_config(self):
    config = super().get_config()
    config.update(pre_norm=self.pre_norm, dropout=self.dropout_rate,
                  norm_epsilon=self.norm_epsilon)
    return config


def _common_config(layer):
  return dict(hidden_size=layer.hidden_size, filter_size=layer.filter_size,
              num_heads=layer.num_heads, key_size=layer.key_size,
              value_size=layer.value_size, dropout=layer.dropout,
              attention_dropout=layer.attention_dropout,
              relu_dropout=layer.relu_dropout, pre_norm=layer.pre_norm,
              norm_epsilon=layer.norm_epsilon,
              max_relative_position=layer.max_relative_position)


class _TransformerLayer(keras.layers.Layer):
  """Holds the hyperparameters shared by encoder and decoder layers
  (`max_relative_position`: relative positions in self-attention, see attention.py)."""

  def __init__(self, hidden_size, filter_size, num_heads, key_size, value_size,
               dropout=0.1, attention_dropout=0.0, relu_dropout=0.0, pre_norm=False,
               norm_epsilon=1e-6, max_relative_position=0, **kwargs):
    super().__init__(**kwargs)
    self.hidden_size = hidden_size
    self.filter_size = filter_size
    self.num_heads = num_heads
    self.key_size = key_size
    self.value_size = value_size
    self.dropout = dropout
    self.attention_dropout = attention_dropout
    self.relu_dropout = relu_dropout
    self.pre_norm = pre_norm
    self.norm_epsilon = norm_epsilon
    self.max_relative_position = max_relative_position

  def _attention(self, name, relative=False):
    return MultiHeadAttention(self.num_heads, self.key_size, self.value_size,
                              self.hidden_size, self.attention_dropout,
                              self.max_relative_position if relative else 0,
                              dtype=self.dtype_policy, name=name)

  def _residual(self, name):
    return Residual(self.pre_norm, self.dropout, self.norm_epsilon,
                     dtype=self.dtype_policy, name=name)

  def _feed_forward(self):
    return FeedForward(self.filter_size, self.hidden_size, self.relu_dropout,
                       dtype=self.dtype_policy, name="ffn")

  def get_config(self):
    config = super().get_config()
    config.update(_common_config(self))
    return config


@keras.saving.register_keras_serializable(package="t2t_keras")
class EncoderLayer(_TransformerLayer):
  """Self-attention then feed-forward, each wrapped in a residual block.

  Call arguments:
    x: (B, S, D).
    attention_mask: boolean (B, 1, 1, S), True at real (non-padding) source positions.
    training: whether dropout is active.
    return_attention: also return self-attention probabilities (B, H, S, S).
  """

  def build(self, input_shape):
    shape = (None, None, self.hidden_size)
    self.self_attention = self._attention("self_attention", relative=True)
    self.self_attention_residual = self._residual("self_attention_residual")
    self.ffn = self._feed_forward()
    self.ffn_residual = self._residual("ffn_residual")
    for layer in (self.self_attention, self.self_attention_residual, self.ffn,
                  self.ffn_residual):
      layer.build(shape)
    self.built = True

  def call(self, x, attention_mask=None, training=None, return_attention=False):
    y = self.self_attention_residual.before(x)
    y, probs = self.self_attention(y, attention_mask=attention_mask, training=training,
                                   return_attention=True)
    x = self.self_attention_residual.after(x, y, training)
    y = self.ffn(self.ffn_residual.before(x), training=training)
    x = self.ffn_residual.after(x, y, training)
    return (x, probs) if return_attention else x


@keras.saving.register_keras_serializable(package="t2t_keras")
class DecoderLayer(_TransformerLayer):
  """Masked self-attention, encoder-decoder attention, feed-forward.

  Call arguments:
    x: (B, T, D) decoder stream.
    self_mask: boolean broadcastable to (B, 1, T, T).
    memory_mask: boolean (B, 1, 1, S), True at real source positions.
    memory: (B, S, D) encoder output.
    training: whether dropout is active.
    return_attention: also return (self_probs, cross_probs).

  Returns:
    (B, T, D); then the probabilities if `return_attention`. (Decoding one position at
  a time over a cache is `decoder_step.py`, which reads this layer's weights.)
  """

  def build(self, input_shape):
    shape = (None, None, self.hidden_size)
    self.self_attention = self._attention("self_attention", relative=True)
    self.self_attention_residual = self._residual("self_attention_residual")
    self.cross_attention = self._attention("cross_attention")
    self.cross_attention_residual = self._residual("cross_attention_residual")
    self.ffn = self._feed_forward()
    self.ffn_residual = self._residual("ffn_residual")
    for layer in (self.self_attention, self.self_attention_residual, self.cross_attention,
                  self.cross_attention_residual, self.ffn, self.ffn_residual):
      layer.build(shape)
    self.built = True

  def call(self, x, self_mask=None, memory_mask=None, memory=None, training=None,
           return_attention=False):
    y = self.self_attention_residual.before(x)
    y, self_probs = self.self_attention(y, attention_mask=self_mask, training=training,
                                        return_attention=True)
    x = self.self_attention_residual.after(x, y, training)
    y = self.cross_attention_residual.before(x)
    y, cross_probs = self.cross_attention(y, memory=memory, attention_mask=memory_mask,
                                          training=training, return_attention=True)
    x = self.cross_attention_residual.after(x, y, training)
    y = self.ffn(self.ffn_residual.before(x), training=training)
    x = self.ffn_residual.after(x, y, training)
    return (x, (self_probs, cross_probs)) if return_attention else x
