"""Multi-head scaled dot-product attention (paper section 3.2) with a key/value cache.

Shape notation used in this package: B batch, S source length, T target (query)
length, L cache length, H heads, Dk key size per head, Dv value size per head,
D model dimension (d_model), V vocabulary.

Why not `keras.ops.dot_product_attention`: the paper's attention dropout and the
attention maps users plot (Figures 3-5) both need the probabilities themselves, and
the primitive returns neither. The computation here is the same three einsum/softmax
steps, with the softmax in float32 under mixed precision.

Key and value sizes per head are independent (Table 3 rows A and B). Projections have
no bias, as in tensor2tensor.

Incremental decoding keeps a fixed-size cache {"key": (B, L, H, Dk), "value":
(B, L, H, Dv)} that `call` updates at `cache_index` and RETURNS: nothing is mutated,
so one decoding path works eagerly, in tf.function, under XLA and on TPU.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from t2t_keras.layers.dropout import Dropout

# Large negative logit for masked positions (the paper's -inf, without NaNs for rows
# that are entirely masked).
_MASK_VALUE = -1e9


def update_cache(cache, update, index):
  """Writes `update` (B, H, 1, K) at position `index` of `cache` (B, H, L, K).

  A `where` over a one-hot position mask instead of a scatter: a single select op that
  every runtime (eager, XLA, TPU, TF Serving) has, with static shapes.
  """
  length = ops.shape(cache)[2]
  at_index = ops.equal(ops.arange(length), index)  # (L,)
  at_index = ops.reshape(at_index, (1, 1, length, 1))
  return ops.where(at_index, ops.cast(update, cache.dtype), cache)


@keras.saving.register_keras_serializable(package="t2t_keras")
class HeadDense(keras.layers.EinsumDense):
  """An EinsumDense "<lead><in>,<in><out>-><lead><out>" computed as one 2-D matmul.

  The projections to and from heads, (B, T, D) x (D, H, K) and (B, T, H, K) x (H, K, D),
  contract the trailing input axes with the leading kernel axes. Keras' TensorFlow
  backend runs them as a batch matmul that broadcasts the kernel over B, whose kernel
  gradient is B per-example products summed over B; flattening to (B*T, in) x
  (in, out) makes the forward pass and both gradients plain MatMuls (about 1.5x faster
  for a base-size projection forward and backward on CPU, see bench/). Variables, names,
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

  Call arguments:
    query: (B, T, D) queries.
    memory: (B, S, D) keys/values source; None for self-attention.
    attention_mask: boolean, broadcastable to (B, H, T, S); True where attention is allowed.
    cache: optional {"key": (B, L, H, Dk), "value": (B, L, H, Dv)} for incremental
      self-attention; the new keys/values are written at `cache_index` (T must be 1).
    cache_index: scalar int position to write into the cache.
    key_value: optional precomputed (key, value) from `compute_key_value`, used for
      cross-attention so encoder keys/values are projected once per source.
    training: whether dropout is active.
    return_attention: also return the probabilities (B, H, T, S).

  Returns:
    (B, T, D) output; plus the updated cache when `cache` is given; plus the
    attention probabilities when `return_attention`.
  """

  def __init__(self, num_heads, key_size, value_size, output_size, attention_dropout=0.0,
               **kwargs):
    super().__init__(**kwargs)
    self.num_heads = num_heads
    self.key_size = key_size
    self.value_size = value_size
    self.output_size = output_size
    self.attention_dropout = attention_dropout

  def build(self, input_shape):
    dim = input_shape[-1]
    common = dict(dtype=self.dtype_policy,
                  kernel_initializer=keras.initializers.GlorotUniform())
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
    self.built = True

  def compute_key_value(self, memory):
    """Projects memory (B, S, D) to keys (B, H, S, Dk) and values (B, H, S, Dv).

    Heads-major, the layout the attention matmuls read: cross-attention keys/values and
    the decoding cache are stored this way, so a decoding step reads them without
    transposing the whole cache (as an einsum over (B, S, H, K) would, every step).
    """
    return (ops.transpose(self.key_dense(memory), (0, 2, 1, 3)),
            ops.transpose(self.value_dense(memory), (0, 2, 1, 3)))

  def call(self, query, memory=None, attention_mask=None, cache=None, cache_index=None,
           key_value=None, training=None, return_attention=False):
    q = ops.transpose(self.query_dense(query), (0, 2, 1, 3))  # (B, H, T, Dk)
    if key_value is not None:
      k, v = key_value
    else:
      k, v = self.compute_key_value(query if memory is None else memory)
    if cache is not None:
      k = update_cache(cache["key"], k, cache_index)  # (B, H, L, Dk)
      v = update_cache(cache["value"], v, cache_index)  # (B, H, L, Dv)
      cache = {"key": k, "value": v}
    q = q * ops.cast(1.0 / (self.key_size ** 0.5), q.dtype)
    logits = ops.einsum("bhtk,bhsk->bhts", q, k)  # (B, H, T, S)
    logits = ops.cast(logits, "float32")
    if attention_mask is not None:
      logits = ops.where(attention_mask, logits, _MASK_VALUE)
    probs = ops.softmax(logits, axis=-1)
    weights = self.dropout(ops.cast(probs, self.compute_dtype), training=training)
    context = ops.transpose(ops.einsum("bhts,bhsk->bhtk", weights, v), (0, 2, 1, 3))  # (B, T, H, Dv)
    output = self.output_dense(context)  # (B, T, D)
    results = (output,)
    if cache is not None:
      results += (cache,)
    if return_attention:
      results += (probs,)
    return results[0] if len(results) == 1 else results

  def get_config(self):
    config = super().get_config()
    config.update(num_heads=self.num_heads, key_size=self.key_size,
                  value_size=self.value_size, output_size=self.output_size,
                  attention_dropout=self.attention_dropout)
    return config
