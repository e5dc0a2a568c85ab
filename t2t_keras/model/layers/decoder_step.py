"""The decoder's incremental step: one position for every hypothesis, on 2-D rows.

Why a step apart from the layers' `call`: a decoding step is a few hundred small
kernels that TensorFlow runs one after another, so what it costs is mostly how many
there are, not their arithmetic (docs/benchmarks.md, "A lean decoder step"). The
layers' general form pays, per call, for shape bookkeeping (Keras `Dense` and
`HeadDense` on rank-3 inputs: Shape, StridedSlice, Pack, Reshape), separate Q, K and V
projections, Keras' LayerNorm (its StopGradient and casts) and the sinusoid
recomputed. Here:
- the hypotheses are rows (R, D) (R = B * K) from the embedding to the logits, and
  reshapes use static sizes (no shape read at run time);
- self-attention's queries, keys and values are one matmul with the three kernels
  concatenated into one (D, H * (2 Dk + Dv)) matrix, made once per decoded batch,
  outside the search loop (`Transformer.step_weights`), as are the sinusoid of the
  positions a batch can reach and the transposed output embedding. Other weights are
  read inside the step: a variable read is one kernel per step, while every tensor made
  outside the loop is a loop input that the while loop passes on in three (Switch,
  Merge, NextIteration). Checkpoints and training weights do not change: the fused
  kernel exists only inside a decoding graph;
- cross-attention keys and values are one matmul per sentence (`cross_key_value`);
- where the caller asks (the SavedModel's searches, `DecodeConfig.attention_by_size`),
  attention on few rows (one sentence, a batch's last ones) runs as elementwise
  products and sums rather than batched products and a softmax, whose per-call cost
  (oneDNN's in graph mode) dominates there; the choice is made by size (`few_rows`);
- LayerNorm is Keras' arithmetic (`keras.ops.layer_normalization`) in ten ops;
- the query scale, 1/8 for 64-dimensional heads, is folded into self-attention's fused
  kernel and into the cross-attention keys where that is exact (a power of two);
- weights in another dtype than the compute dtype (float32 weights of a bfloat16 or
  float16 decoding) are cast once per batch, not in every step.
The arithmetic is the layers' (tests/decoder_step_test.py compares the step with the
teacher-forced pass for every position encoding and cache layout): the same matmuls
and reductions on the same rows; eagerly the logits are bit for bit those of the
layers' form. In a graph, TensorFlow's optimizer fuses other ops
in one form than in the other (a MatMul with its BiasAdd and Relu here), which moves
logits by a few units in the last place (docs/benchmarks.md).

Shapes: R rows (hypotheses), B sentences, G = R / B hypotheses per sentence, H heads,
Dk/Dv per head, D model dimension, L cached positions, S source length.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import tensorflow as tf
from keras import ops

from t2t_keras.model.layers.attention import _MASK_VALUE
from t2t_keras.model.layers.position import sinusoid


class StepInputs(NamedTuple):
  """What every layer of one step reads besides its own weights and cache."""

  index: tf.Tensor  # () int32: the position being decoded
  self_mask: Optional[tf.Tensor]  # bool, broadcastable to the self-attention logits
  memory_mask: tf.Tensor  # (B, 1, 1, S) bool, a row per sentence
  grow: bool  # the cache grows by a position (graph mode) or is written at `index`
  # The self-attention cache's slots per sentence: K for a slotted cache (beam search
  # under XLA), else 1 (a slot per row).
  slots: int = 1
  # G, the hypotheses per sentence (cross-attention's queries per key row), when known
  # while tracing: the reshapes then read no shape at run time, and 1 needs no
  # transposes; None: R / B, read at run time.
  beams: Optional[int] = None
  # Two () bool, whether self- and cross-attention are small enough for elementwise
  # kernels (`few_rows`); None: always the batched matrix products.
  few_rows: Optional[tuple] = None


# ------------------------------------------------------------------ weights, once a batch
def norm_weights(layer):
  """A LayerNormalization's (gamma, beta, epsilon): its variables, read in the step."""
  return layer.gamma, layer.beta, float(layer.epsilon)


def _weight(variable, dtype):
  """A weight as the step reads it: the variable itself when it is in the compute dtype
  (the step reads it: one kernel per step, while a tensor made outside the loop is a
  loop input the while loop passes on in three, Switch, Merge and NextIteration), else
  its value cast once here, per decoded batch, not in every step (a cast in the step
  would rewrite every weight at every position)."""
  return variable if variable.dtype == dtype else tf.cast(variable, dtype)


def _read(weight, dtype, rows=None):
  """A weight in the step, in the compute dtype (as a 2-D matrix of `rows` rows when
  given): a variable is read here; a tensor from `_weight` is already cast (the cast is
  then no op)."""
  value = tf.cast(weight, dtype)
  return value if rows is None else tf.reshape(value, [rows, -1])


def query_scale(attention) -> float:
  """The factor `_attend` scales queries by, 1 / sqrt(Dk)."""
  return 1.0 / (attention.key_size ** 0.5)


def exact_scale(attention) -> bool:
  """Whether the query scale is a power of two (Dk a power of 4: 64 in every recipe),
  so that it can move into a matrix product without changing a bit of its result:
  multiplying by a power of two rounds nothing."""
  mantissa, _ = math.frexp(query_scale(attention))
  return mantissa == 0.5


def attention_weights(attention, fuse_self: bool, dtype) -> dict:
  """A MultiHeadAttention's weights for the step: for self-attention (`fuse_self`) its
  Q, K and V kernels concatenated into one (D, H * (2 Dk + Dv)) matrix, made here,
  once, with the query scale folded into Q's columns when that is exact
  (`exact_scale`: the step then skips a multiplication); for cross-attention the
  query's kernel alone (its keys and values are the sentence's, `cross_key_value`,
  which carry the scale when it is exact). The output kernel is read in the step."""
  dim = attention.query_dense.kernel.shape[0]
  weights = {"layer": attention,
             "output": _weight(attention.output_dense.kernel, dtype),
             "scaled": exact_scale(attention)}
  if fuse_self:
    query = _read(attention.query_dense.kernel, dtype, dim)
    if weights["scaled"]:
      query = query * tf.cast(query_scale(attention), dtype)
    weights["qkv"] = tf.concat([query] + [_read(dense.kernel, dtype, dim) for dense in (
        attention.key_dense, attention.value_dense)], axis=1)
  else:
    weights["query"] = _weight(attention.query_dense.kernel, dtype)
  return weights


def layer_weights(layer, dtype) -> dict:
  """A DecoderLayer's weights in the step's form."""
  ffn = layer.ffn
  return {
      "self": attention_weights(layer.self_attention, True, dtype),
      "cross": attention_weights(layer.cross_attention, False, dtype),
      "norms": [norm_weights(r.norm) for r in (layer.self_attention_residual,
                                               layer.cross_attention_residual,
                                               layer.ffn_residual)],
      "ffn": [_weight(v, dtype) for v in (ffn.filter_dense.kernel, ffn.filter_dense.bias,
                                          ffn.output_dense.kernel, ffn.output_dense.bias)],
  }


def position_table(position, length, dim: int, dtype):
  """The rows a step adds for its position: the sinusoid of positions 0 .. length - 1
  computed once (None: a learned table, read as it is; no position layer: None)."""
  if position is None or hasattr(position, "position_embeddings"):
    return None
  return tf.cast(sinusoid(tf.range(length), dim), dtype)  # (L, D)


def cross_key_value(attention, encoded):
  """Cross-attention keys (B, H, S, Dk) and values (B, H, S, Dv) of the encoder output
  (B, S, D), once per sentence, with one matmul for both (the kernels concatenated).
  When the query scale is exact (`exact_scale`) the keys carry it: q . (s k) is
  (s q) . k to the bit, and the step's queries go unscaled."""
  dtype = encoded.dtype
  dim, heads = encoded.shape[-1], attention.num_heads
  kernel = tf.concat([_read(attention.key_dense.kernel, dtype, dim),
                      _read(attention.value_dense.kernel, dtype, dim)], axis=1)
  shape = tf.shape(encoded)
  projected = tf.matmul(tf.reshape(encoded, [-1, dim]), kernel)  # (B * S, H * (Dk + Dv))
  key, value = tf.split(projected, [heads * attention.key_size,
                                    heads * attention.value_size], axis=1)
  if exact_scale(attention):
    key = key * tf.cast(query_scale(attention), dtype)
  key = tf.reshape(key, [shape[0], shape[1], heads, attention.key_size])
  value = tf.reshape(value, [shape[0], shape[1], heads, attention.value_size])
  return tf.transpose(key, [0, 2, 1, 3]), tf.transpose(value, [0, 2, 1, 3])


# ------------------------------------------------------------------ the step's pieces
def update_cache(cache, update, index):
  """Writes the new keys or values of every hypothesis into its slot of the cache.

  Args:
    cache: (B, H, K * L, Dh): per sentence and head, K beam slots of L positions each
      (K = 1 outside beam search); slot j holds positions j * L ... j * L + L - 1.
    update: (B * K, H, 1, Dh), hypotheses in sentence-major order (row b * K + j).
    index: scalar position being decoded.

  Returns:
    The cache with update[b * K + j] written at position j * L + index of sentence b.

  A scatter of B * H * K rows rather than a `where` over a one-hot position mask, so
  the runtime can write into the cache's buffer (XLA does inside the decoding loop;
  TensorFlow's kernel does when the buffer is not shared) instead of rewriting the
  whole cache every step. tensor_scatter_nd_update is a core op: it runs eagerly, in
  tf.function, under XLA and in TF Serving.
  """
  shape = ops.shape(cache)
  batch, heads, slots_length = shape[0], shape[1], shape[2]
  beam = ops.shape(update)[0] // batch
  length = slots_length // beam
  update = ops.transpose(ops.reshape(ops.cast(update, cache.dtype),
                                     (batch, beam, heads, -1)), (0, 2, 1, 3))  # (B, H, K, Dh)
  grid = ops.meshgrid(ops.arange(batch, dtype="int32"), ops.arange(heads, dtype="int32"),
                      ops.arange(beam, dtype="int32"), indexing="ij")  # 3 x (B, H, K)
  position = grid[2] * ops.cast(length, "int32") + ops.cast(index, "int32")
  indices = ops.stack([grid[0], grid[1], position], axis=-1)  # (B, H, K, 3)
  return ops.scatter_update(cache, indices, update)


def layer_norm(x, norm):
  """Keras' LayerNormalization of rows (R, D), same arithmetic, fewer ops.

  (The form TensorFlow's oneDNN rewrite runs as one `_MklLayerNorm` kernel, a
  training-mode FusedBatchNormV3 over a (1, R, D, 1) view scaled by gamma after it,
  was measured slower in graph-mode decoding: the kernel builds its oneDNN primitive
  at every call, docs/benchmarks.md, "Decoding's fourth pass".)"""
  gamma, beta, epsilon = norm
  dtype = x.dtype
  x = tf.cast(x, tf.float32)
  mean = tf.reduce_mean(x, axis=-1, keepdims=True)
  variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
  inv = tf.math.rsqrt(variance + epsilon) * tf.cast(gamma, tf.float32)
  return tf.cast(x * inv + (tf.cast(beta, tf.float32) - mean * inv), dtype)


def _relative(q, attention, keys, index):
  """Relative positions (attention.py's module docstring) for the step's queries
  q (R', H, Q, Dk) over key positions 0 .. keys - 1: the logits' term q . a_K
  (R', H, Q, keys) and the value embeddings a_V (keys, Dv)."""
  limit = attention.max_relative_position
  distance = tf.clip_by_value(tf.range(keys) - index, -limit, limit) + limit
  rel_keys = tf.gather(_read(attention.relative_position_keys, q.dtype), distance)
  rel_values = tf.gather(_read(attention.relative_position_values, q.dtype), distance)
  return tf.matmul(q, rel_keys, transpose_b=True), rel_values  # q . a_K: (R', H, Q, keys)


def _scaled(q, attention, scaled: bool):
  """Rows of queries (R, H * Dk) scaled as `_attend` scales them, unless `scaled`
  (their kernel or the keys carry the scale)."""
  return q if scaled else q * tf.cast(query_scale(attention), q.dtype)


def _queries(q, heads: int, beams: Optional[int], sentences=None):
  """Rows of queries (R, H * Dk) as the G queries of each sentence: (B, H, G, Dk) (a
  reshape alone when G = `beams` = 1; `beams` None: G from B = `sentences`, read at
  run time)."""
  dk = q.shape[-1] // heads
  if beams == 1:
    return tf.reshape(q, [-1, heads, 1, dk])
  shape = [-1, beams, heads, dk] if beams else [sentences, -1, heads, dk]
  return tf.transpose(tf.reshape(q, shape), [0, 2, 1, 3])


def _rows(context, beams: Optional[int]):
  """(B, H, G, Dv) attention outputs -> rows (R, H * Dv)."""
  if beams != 1:
    context = tf.transpose(context, [0, 2, 1, 3])  # (B, G, H, Dv)
  return tf.reshape(context, [-1, context.shape[1 if beams == 1 else 2] * context.shape[3]])


def _output(rows, w):
  """Attention output rows (R, H * Dv) through the output kernel (`w`:
  `attention_weights`)."""
  return tf.matmul(rows, _read(w["output"], rows.dtype, rows.shape[-1]))


def self_attention(y, w, cache, step: StepInputs):
  """Self-attention of rows y (R, D) over their cache; (output (R, D), new cache).

  Growing cache: (R, H, L, Dh), the new position appended. Fixed cache: (B, H, G * L,
  Dh) with G beam slots of L positions per sentence (G = 1 outside beam search, see
  `Transformer.decode_step`), written at `step.index`; the G hypotheses of a sentence
  are its G queries and `step.self_mask` shows each its own slot."""
  attention = w["layer"]
  heads, dk, dv = attention.num_heads, attention.key_size, attention.value_size
  q, k, v = tf.split(tf.matmul(y, w["qkv"]), [heads * dk, heads * dk, heads * dv], axis=1)
  k, v = tf.reshape(k, [-1, heads, 1, dk]), tf.reshape(v, [-1, heads, 1, dv])
  if step.grow:
    keys = tf.concat([cache["key"], k], axis=2)  # (R, H, L, Dk)
    values = tf.concat([cache["value"], v], axis=2)
  else:
    keys = update_cache(cache["key"], k, step.index)  # (B, H, G * L, Dk)
    values = update_cache(cache["value"], v, step.index)
  q = _scaled(q, attention, w["scaled"])
  if not attention.max_relative_position:
    rows = attend(q, keys, values, step.self_mask, step.slots, few_rows_of(step, 0))
    return _output(rows, w), {"key": keys, "value": values}
  q = _queries(q, heads, step.slots)  # (R, H, 1, Dk) or (B, H, G, Dk)
  # Relative positions: their terms join the logits and the context.
  logits = tf.matmul(q, keys, transpose_b=True)  # (R, H, 1, L) or (B, H, G, G * L)
  length = tf.shape(keys)[2]
  if step.grow:
    extra, rel_values = _relative(q, attention, length, step.index)
  else:  # G slots of L positions, every query at index
    slots = step.slots
    extra, rel_values = _relative(q, attention, length // slots, step.index)
    extra, rel_values = tf.tile(extra, [1, 1, 1, slots]), tf.tile(rel_values, [slots, 1])
  probs = _softmax(logits + extra, step.self_mask, y.dtype)
  # (R, H, 1, Dv) or (B, H, G, Dv)
  context = tf.matmul(probs, values) + tf.matmul(probs, rel_values)
  return _output(_rows(context, step.slots), w), {"key": keys, "value": values}


def _softmax(logits, mask, dtype):
  """The attention weights of `logits` where `mask` (None: everywhere), in float32,
  returned in `dtype`."""
  logits = tf.cast(logits, tf.float32)
  if mask is not None:
    logits = tf.where(mask, logits, _MASK_VALUE)
  return tf.cast(tf.nn.softmax(logits), dtype)


# Attention of at most this many products (rows x heads x key positions x Dk) takes
# elementwise kernels (`few_rows`): on this side of it the products' per-call cost
# (oneDNN's, in graph mode) outweighs the elementwise form's arithmetic
# (docs/benchmarks.md, "Decoding's fourth pass": 4-8x faster at 4 rows; at 64 rows of 4
# heads, or 16 of 8, the products win).
FEW_ROWS_PRODUCTS = 2 ** 17


def few_rows(x, positions, memory_mask, layer):
  """For a step on rows x (R, D): whether its self-attention (over `positions` cached
  keys per query) and its cross-attention (over the S source positions of
  `memory_mask` (B, 1, 1, S)) are small enough for the elementwise form
  (`FEW_ROWS_PRODUCTS`), as two () bool tensors."""
  attention = layer.self_attention
  limit = FEW_ROWS_PRODUCTS // (attention.num_heads * attention.key_size)
  rows = tf.shape(x)[0]
  return (rows * positions <= limit, rows * tf.shape(memory_mask)[3] <= limit)


def few_rows_of(step: StepInputs, which: int):
  """`step.few_rows`' predicate for self- (0) or cross-attention (1), else None."""
  return None if step.few_rows is None else step.few_rows[which]


def attend(q, keys, values, mask, beams: Optional[int], few_rows=None):
  """softmax(q k^T) v for rows of queries q (R, H * Dk), the G of each sentence its
  `beams` (None: R / B, read at run time), over keys (B, H, L, Dk) where `mask` (None:
  all of them): the attention output rows (R, H * Dv). By batched matrix products, or
  with `few_rows` (a () bool tensor, `few_rows()`) chosen when the step runs, by
  elementwise kernels when it holds (`_few_rows_attention`)."""
  heads = keys.shape[1]

  def products():
    queries = _queries(q, heads, beams, tf.shape(keys)[0])  # (B, H, G, Dk)
    probs = _softmax(tf.matmul(queries, keys, transpose_b=True), mask, q.dtype)
    return _rows(tf.matmul(probs, values), beams)
  if few_rows is None:
    return products()
  return tf.cond(few_rows, lambda: _few_rows_attention(q, keys, values, mask, beams),
                 products)


def _few_rows_attention(q, keys, values, mask, beams: Optional[int]):
  """`attend`'s few-rows form: each query times its sentence's keys, summed over Dk;
  the softmax as exp(log_softmax); the weights times the values, summed over the
  positions; in the rows' own order (B, G, H, ...), so no transposes. Why: on a few
  rows TensorFlow's oneDNN batched product and softmax cost 40-60 us a call (a
  primitive for shapes that change every step), these kernels a few us each; on many
  rows the products win (docs/benchmarks.md). Float32 only (`Transformer.decode_step`)."""
  heads, dk, dv = keys.shape[1], keys.shape[3], values.shape[3]
  if beams == 1:  # a query per sentence: (B, H, 1, Dk) against (B, H, L, Dk)
    logits = tf.reduce_sum(tf.reshape(q, [-1, heads, 1, dk]) * keys, -1)  # (B, H, L)
    if mask is not None:
      logits = tf.where(tf.squeeze(mask, 1), logits, _MASK_VALUE)
    probs = tf.exp(tf.nn.log_softmax(logits))
    context = tf.reduce_sum(tf.expand_dims(probs, -1) * values, 2)  # (B, H, Dv)
  else:  # G queries per sentence: (B, G, H, 1, Dk) against (B, 1, H, L, Dk)
    shape = [-1, beams, heads, 1, dk] if beams else [tf.shape(keys)[0], -1, heads, 1, dk]
    queries = tf.reshape(q, shape)
    logits = tf.reduce_sum(queries * tf.expand_dims(keys, 1), -1)  # (B, G, H, L)
    if mask is not None:  # (B, 1, G, L) or (B, 1, 1, L) -> (B, G, 1, L)
      logits = tf.where(mask if mask.shape[2] == 1 else tf.transpose(mask, [0, 2, 1, 3]),
                        logits, _MASK_VALUE)
    probs = tf.exp(tf.nn.log_softmax(logits))
    context = tf.reduce_sum(tf.expand_dims(probs, -1) * tf.expand_dims(values, 1), 3)
  return tf.reshape(context, [-1, heads * dv])  # (R, H * Dv)


def cross_attention(y, w, key_value, step: StepInputs):
  """Rows y (R, D) attend over their sentence's keys/values (B, H, S, D*): the G = R / B
  hypotheses of a sentence are G queries of one matmul against its keys (which carry
  the query scale when it is exact, `cross_key_value`)."""
  attention = w["layer"]
  key, value = key_value
  dim = attention.query_dense.kernel.shape[0]
  q = _scaled(tf.matmul(y, _read(w["query"], y.dtype, dim)), attention, w["scaled"])
  return _output(attend(q, key, value, step.memory_mask, step.beams, few_rows_of(step, 1)), w)


def feed_forward(y, ffn):
  """max(0, y W1 + b1) W2 + b2 on rows (`layer_weights`' W1, b1, W2, b2)."""
  dtype = y.dtype
  w1, b1, w2, b2 = (_read(w, dtype) for w in ffn)
  hidden = tf.nn.relu(tf.nn.bias_add(tf.matmul(y, w1), b1))
  return tf.nn.bias_add(tf.matmul(hidden, w2), b2)


def decoder_layer(x, w, cache, key_value, step: StepInputs, pre_norm: bool):
  """One DecoderLayer on rows x (R, D): (new rows, new cache). Residual blocks as
  `Residual` (pre-norm: x + f(norm(x)); post-norm: norm(x + f(x))), no dropout."""
  norms = w["norms"]

  def block(x, norm, sublayer):
    if pre_norm:
      return x + sublayer(layer_norm(x, norm))
    return layer_norm(x + sublayer(x), norm)

  new_cache = {}

  def attend_self(y):
    output, new_cache["cache"] = self_attention(y, w["self"], cache, step)
    return output

  x = block(x, norms[0], attend_self)
  x = block(x, norms[1], lambda y: cross_attention(y, w["cross"], key_value, step))
  x = block(x, norms[2], lambda y: feed_forward(y, w["ffn"]))
  return x, new_cache["cache"]
