"""Multi-head scaled dot-product attention (paper section 3.2).

Shape notation used in this package: B batch, S source length, T target (query)
length, H heads, Dk key size per head, Dv value size per head,
D model dimension (d_model), V vocabulary.

Why not `keras.ops.dot_product_attention`: the paper's attention dropout and the
attention maps users plot (Figures 3-5) both need the probabilities themselves, and
the primitive returns neither. The computation here is the same three einsum/softmax
steps, with the softmax in float32 under mixed precision.

Key and value sizes per head are independent (Table 3 rows A and B). Projections have
no bias, as in tensor2tensor.

Incremental decoding (one position per step over a key/value cache) is not this
layer's `call`: it is `decoder_step.py`, on 2-D rows with the weights fused once per
batch, which reads this layer's variables.

Relative positions (Shaw et al. 2018, tensor2tensor's `transformer_relative`,
`max_relative_position` K > 0, self-attention only): each layer learns a key and a
value embedding, shared by its heads, for each distance (key position - query
position) clipped to [-K, K]. A query's logit for a key adds q . a_K[distance], and its
output adds the probability-weighted a_V[distance]:
  e_ts = q_t (k_s + a_K[d_ts])^T / sqrt(Dk),  z_t = sum_s p_ts (v_s + a_V[d_ts]).
The query is scaled before both dot products, as in t2t, OpenNMT and CTranslate2.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from t2t_keras.model.layers.dropout import Dropout

# Large negative logit for masked positions (the paper's -inf, without NaNs for rows
# that are entirely masked).
_MASK_VALUE = -1e9


@keras.saving.register_keras_serializable(package="t2t_keras")
class HeadDense(keras.layers.EinsumDense):
  """An EinsumDense "<lead><in>,<in><out>-><lead><out>" computed as one 2-D matmul.

  The projections to and from heads, (B, T, D) x (D, H, K) and (B, T, H, K) x (H, K, D),
  contract the trailing input axes with the leading kernel axes. Keras' TensorFlow
  backend runs them as a batch matmul that broadcasts the kernel over B, whose kernel
  gradient is B per-example products summed over B; flattening to (B*T, in) x
  (in, out) makes the forward pass and both gradients plain MatMuls (faster for a
  base-size projection forward and backward on CPU: docs/benchmarks.md, "Measurements
  behind other code comments"). Variables, names,
  shapes and checkpoint layout are EinsumDense's. No bias or activation (none is used).
  """

  def __init__(self, equation, output_shape, **kwargs):
    super().__init__(equation, output_shape, **kwargs)
    inputs, kernel = equation.split("->")[0].split(",")
    contracted = len(set(inputs) & set(kernel))
    lead, free = inputs[:-contracted], kernel[contracted:]
    if (self.bias_axes or self.activation is not keras.activations.linear
        or inputs[-contracted:] != kernel[:contracted]
        or equation != f"{inputs},{kernel}->{lead}{free}"):
      raise ValueError(f"HeadDense needs an equation '<lead><in>,<in><out>-><lead><out>' "
                       f"without bias or activation, got {equation!r} (bias_axes="
                       f"{self.bias_axes!r}, activation={self.activation.__name__}); use "
                       "keras.layers.EinsumDense for other contractions.")
    self.contracted_axes = contracted

  def call(self, inputs, training=None):
    kernel = self.kernel  # (*in, *out)
    in_shape = tuple(kernel.shape[:self.contracted_axes])
    out_shape = tuple(kernel.shape[self.contracted_axes:])
    in_size, out_size = math.prod(in_shape), math.prod(out_shape)
    lead = ops.shape(inputs)[:-self.contracted_axes]
    flat = ops.matmul(ops.reshape(inputs, (-1, in_size)),
                      ops.reshape(kernel, (in_size, out_size)))  # (prod(lead), out)
    return ops.reshape(flat, (*lead, *out_shape))


@keras.saving.register_keras_serializable(package="t2t_keras")
class MultiHeadAttention(keras.layers.Layer):
  """Multi-head attention: softmax(Q K^T / sqrt(Dk)) V, per head, then W_O.

  Args:
    num_heads: H.
    key_size: Dk, size of each head's queries and keys.
    value_size: Dv, size of each head's values.
    output_size: D, size of the output projection (d_model).
    attention_dropout: dropout rate on the attention probabilities.
    max_relative_position: K > 0 adds relative position embeddings of distances
      clipped to [-K, K] (self-attention only; see the module docstring); 0: none.

  Call arguments:
    query: (B, T, D) queries.
    memory: (B, S, D) keys/values source; None for self-attention.
    attention_mask: boolean, broadcastable to (B, H, T, S); True where attention is allowed.
    training: whether dropout is active.
    return_attention: also return the probabilities (B, H, T, S).

  Returns:
    (B, T, D) output; plus the attention probabilities when `return_attention`.
  """

  def __init__(self, num_heads, key_size, value_size, output_size, attention_dropout=0.0,
               max_relative_position=0, **kwargs):
    super().__init__(**kwargs)
    self.num_heads = num_heads
    self.key_size = key_size
    self.value_size = value_size
    self.output_size = output_size
    self.attention_dropout = attention_dropout
    self.max_relative_position = max_relative_position

  def build(self, input_shape):
    dim = input_shape[-1]
    # The name, not one initializer instance: Keras 3 draws an unseeded instance's seed
    # once, so a shared instance gave the query, key and value kernels the same values.
    common = dict(dtype=self.dtype_policy, kernel_initializer="glorot_uniform")
    self.query_dense = HeadDense(
        "btd,dhk->bthk", output_shape=(None, self.num_heads, self.key_size),
        name="query", **common)
    self.key_dense = HeadDense(
        "btd,dhk->bthk", output_shape=(None, self.num_heads, self.key_size),
        name="key", **common)
    self.value_dense = HeadDense(
        "btd,dhk->bthk", output_shape=(None, self.num_heads, self.value_size),
        name="value", **common)
    self.output_dense = HeadDense(
        "bthk,hkd->btd", output_shape=(None, self.output_size), name="output", **common)
    self.dropout = Dropout(self.attention_dropout, dtype=self.dtype_policy,
                           name="attention_dropout")
    for dense in (self.query_dense, self.key_dense, self.value_dense):
      dense.build((None, None, dim))
    self.output_dense.build((None, None, self.num_heads, self.value_size))
    if self.max_relative_position:
      window = 2 * self.max_relative_position + 1
      # OpenNMT-tf's and CTranslate2's names; t2t's are relative_positions_keys/values.
      self.relative_position_keys = self.add_weight(
          name="relative_position_keys", shape=(window, self.key_size),
          initializer=keras.initializers.GlorotUniform())
      self.relative_position_values = self.add_weight(
          name="relative_position_values", shape=(window, self.value_size),
          initializer=keras.initializers.GlorotUniform())
    self.built = True

  def _relative(self, query_positions, key_positions, dtype):
    """The key and value embeddings of the clipped distances key - query:
    (T, S, Dk) and (T, S, Dv) for query positions (T,) and key positions (S,); None
    without relative positions."""
    if not self.max_relative_position:
      return None
    limit = self.max_relative_position
    distance = key_positions[None, :] - query_positions[:, None]
    index = ops.clip(distance, -limit, limit) + limit
    return (ops.take(ops.cast(self.relative_position_keys, dtype), index, axis=0),
            ops.take(ops.cast(self.relative_position_values, dtype), index, axis=0))

  def compute_key_value(self, memory):
    """Projects memory (B, S, D) to keys (B, H, S, Dk) and values (B, H, S, Dv).

    Heads-major, the layout the attention matmuls read (the decoding step's caches
    and cross-attention keys/values are stored the same way).
    """
    return (ops.transpose(self.key_dense(memory), (0, 2, 1, 3)),
            ops.transpose(self.value_dense(memory), (0, 2, 1, 3)))

  def call(self, query, memory=None, attention_mask=None, training=None,
           return_attention=False):
    q = ops.transpose(self.query_dense(query), (0, 2, 1, 3))  # (B, H, T, Dk)
    k, v = self.compute_key_value(query if memory is None else memory)
    relative = None
    if memory is None and self.max_relative_position:
      positions = ops.arange(ops.shape(query)[1], dtype="int32")
      relative = self._relative(positions, positions, q.dtype)
    probs, context = self._attend(q, k, v, attention_mask, training, relative)
    output = self.output_dense(ops.transpose(context, (0, 2, 1, 3)))  # (B, T, D)
    return (output, probs) if return_attention else output

  def _attend(self, q, k, v, attention_mask, training, relative=None):
    """softmax(q k^T / sqrt(Dk)) v per head: q (B, H, T, Dk), k/v (B, H, S, Dk/Dv);
    `relative`: the distance embeddings from `_relative`, (T, S, D*)."""
    q = q * ops.cast(1.0 / (self.key_size ** 0.5), q.dtype)
    logits = ops.einsum("bhtk,bhsk->bhts", q, k)  # (B, H, T, S)
    if relative is not None:  # a matmul per query position: (T, B * H, Dk) x (T, Dk, S)
      logits = logits + ops.einsum("bhtk,tsk->bhts", q, relative[0])
    logits = ops.cast(logits, "float32")
    if attention_mask is not None:
      logits = ops.where(attention_mask, logits, _MASK_VALUE)
    probs = ops.softmax(logits, axis=-1)
    weights = self.dropout(ops.cast(probs, self.compute_dtype), training=training)
    context = ops.einsum("bhts,bhsk->bhtk", weights, v)  # (B, H, T, Dv)
    if relative is not None:
      context = context + ops.einsum("bhts,tsk->bhtk", weights, relative[1])
    return probs, context

  def get_config(self):
    config = super().get_config()
    config.update(num_heads=self.num_heads, key_size=self.key_size,
                  value_size=self.value_size, output_size=self.output_size,
                  attention_dropout=self.attention_dropout,
                  max_relative_position=self.max_relative_position)
    return config
