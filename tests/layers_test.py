"""Layer-level checks: config round trips, the paper's formulas against NumPy, dropout."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.model import layers
from t2t_keras.model.layers.attention import HeadDense
from t2t_keras.model.layers.position import sinusoid

LAYER_CASES = [
    (layers.MultiHeadAttention, dict(num_heads=2, key_size=3, value_size=5, output_size=8,
                                     attention_dropout=0.1)),
    (layers.MultiHeadAttention, dict(num_heads=2, key_size=3, value_size=5, output_size=8,
                                     max_relative_position=4)),
    (HeadDense, dict(equation="btd,dhk->bthk", output_shape=(None, 2, 3))),
    (layers.Dropout, dict(rate=0.25, seed=3)),
    (layers.FeedForward, dict(filter_size=12, output_size=8, relu_dropout=0.2)),
    (layers.SharedEmbedding, dict(vocab_size=11, hidden_size=8)),
    (layers.LearnedPosition, dict(max_position=7, hidden_size=8)),
    (layers.SinusoidalPosition, dict()),
    (layers.Residual, dict(pre_norm=True, dropout=0.3, norm_epsilon=1e-3)),
    (layers.EncoderLayer, dict(hidden_size=8, filter_size=12, num_heads=2, key_size=4,
                               value_size=2, dropout=0.2, attention_dropout=0.1,
                               relu_dropout=0.1, pre_norm=True, norm_epsilon=1e-5,
                               max_relative_position=2)),
    (layers.DecoderLayer, dict(hidden_size=8, filter_size=12, num_heads=2, key_size=4,
                               value_size=4, dropout=0.2, pre_norm=False)),
]


@pytest.mark.parametrize("cls,kwargs", LAYER_CASES, ids=[c.__name__ for c, _ in LAYER_CASES])
def test_config_round_trip(cls, kwargs):
  layer = cls(name="probe", **kwargs)
  config = layer.get_config()
  for key, value in kwargs.items():
    assert config[key] == value, key
  clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
  assert type(clone) is cls
  assert clone.get_config() == config


def test_sinusoid_matches_paper_formula():
  d = 6
  table = np.asarray(sinusoid(np.arange(5), d))
  for pos in range(5):
    for i in range(d // 2):
      angle = pos / 10000 ** (2 * i / d)
      assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoid_start_offset_matches_slice():
  layer = layers.SinusoidalPosition()
  x = np.zeros((1, 4, 8), "float32")
  full = np.asarray(layer(np.zeros((1, 10, 8), "float32")))
  np.testing.assert_allclose(np.asarray(layer(x, start=6)), full[:, 6:10], atol=1e-6)


def test_attention_matches_numpy_reference():
  rng = np.random.default_rng(0)
  attention = layers.MultiHeadAttention(num_heads=2, key_size=3, value_size=4,
                                        output_size=5)
  attention.build((None, None, 5))
  query = rng.normal(size=(1, 2, 5)).astype("float32")
  memory = rng.normal(size=(1, 3, 5)).astype("float32")
  mask = np.array([True, True, False])[None, None, None, :]
  out, probs = attention(query, memory=memory, attention_mask=mask, return_attention=True)
  wq, wk, wv, wo = (np.asarray(d.kernel) for d in (
      attention.query_dense, attention.key_dense, attention.value_dense,
      attention.output_dense))
  q = np.einsum("btd,dhk->bhtk", query, wq)
  k = np.einsum("bsd,dhk->bhsk", memory, wk)
  v = np.einsum("bsd,dhk->bhsk", memory, wv)
  logits = np.einsum("bhtk,bhsk->bhts", q, k) / math.sqrt(3)
  logits[..., 2] = -np.inf  # masked position
  expected_probs = np.exp(logits - logits.max(-1, keepdims=True))
  expected_probs /= expected_probs.sum(-1, keepdims=True)
  context = np.einsum("bhts,bhsk->bthk", expected_probs, v)
  expected = np.einsum("bthk,hkd->btd", context, wo)
  np.testing.assert_allclose(np.asarray(probs), expected_probs, atol=1e-6)
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)


def test_relative_attention_matches_shaw_et_al_loop():
  """Relative positions (Shaw et al. 2018, eqs. 3-5) computed one query and key at a
  time: e_ij = q_i (k_j + a_K[clip(j - i)]) / sqrt(d), z_i = sum_j p_ij (v_j + a_V[..])."""
  rng = np.random.default_rng(1)
  limit, length = 2, 6  # distances up to 5: clipped
  attention = layers.MultiHeadAttention(num_heads=2, key_size=3, value_size=4,
                                        output_size=5, max_relative_position=limit)
  attention.build((None, None, 5))
  for weight in (attention.relative_position_keys, attention.relative_position_values):
    weight.assign(rng.normal(size=weight.shape).astype("float32"))
  x = rng.normal(size=(1, length, 5)).astype("float32")
  mask = np.tril(np.ones((length, length), bool))[None, None]  # causal
  out, probs = attention(x, attention_mask=mask, return_attention=True)
  wq, wk, wv, wo = (np.asarray(d.kernel) for d in (
      attention.query_dense, attention.key_dense, attention.value_dense,
      attention.output_dense))
  a_k = np.asarray(attention.relative_position_keys)
  a_v = np.asarray(attention.relative_position_values)
  q, k, v = (np.einsum("btd,dhk->bhtk", x, w)[0] for w in (wq, wk, wv))
  expected_probs = np.zeros((2, length, length))
  context = np.zeros((length, 2, 4))
  for h in range(2):
    for i in range(length):
      logits = np.full(length, -np.inf)
      for j in range(i + 1):
        index = min(max(j - i, -limit), limit) + limit
        logits[j] = q[h, i] @ (k[h, j] + a_k[index]) / math.sqrt(3)
      p = np.exp(logits - logits.max())
      p /= p.sum()
      expected_probs[h, i] = p
      for j in range(i + 1):
        index = min(max(j - i, -limit), limit) + limit
        context[i, h] += p[j] * (v[h, j] + a_v[index])
  expected = np.einsum("thk,hkd->td", context, wo)
  np.testing.assert_allclose(np.asarray(probs)[0], expected_probs, atol=1e-5)
  np.testing.assert_allclose(np.asarray(out)[0], expected, atol=1e-5)


def test_relative_positions_only_in_self_attention():
  layer = layers.DecoderLayer(hidden_size=8, filter_size=12, num_heads=2, key_size=4,
                              value_size=4, max_relative_position=3)
  layer.build((None, None, 8))
  names = sorted(w.path for w in layer.weights if "relative" in w.path)
  assert names == ["decoder_layer/self_attention/relative_position_keys",
                   "decoder_layer/self_attention/relative_position_values"], names
  assert layer.self_attention.relative_position_keys.shape == (7, 4)


def test_feed_forward_is_relu_mlp():
  rng = np.random.default_rng(1)
  ffn = layers.FeedForward(filter_size=6, output_size=4)
  ffn.build((None, None, 4))
  x = rng.normal(size=(2, 3, 4)).astype("float32")
  w1, b1 = np.asarray(ffn.filter_dense.kernel), np.asarray(ffn.filter_dense.bias)
  w2, b2 = np.asarray(ffn.output_dense.kernel), np.asarray(ffn.output_dense.bias)
  expected = np.maximum(0, x @ w1 + b1) @ w2 + b2
  np.testing.assert_allclose(np.asarray(ffn(x)), expected, atol=1e-5)


def test_embedding_scaled_and_tied():
  emb = layers.SharedEmbedding(vocab_size=7, hidden_size=4)
  emb.build()
  table = np.asarray(emb.embeddings)
  np.testing.assert_allclose(np.asarray(emb(np.array([[3]])))[0, 0], table[3] * 2.0,
                             atol=1e-6)
  hidden = np.ones((1, 4), "float32")
  np.testing.assert_allclose(np.asarray(emb.logits(hidden)), hidden @ table.T, atol=1e-5)


@pytest.mark.parametrize("equation,input_shape,output_shape", [
    ("btd,dhk->bthk", (2, 3, 6), (None, 4, 5)), ("bthk,hkd->btd", (2, 3, 4, 5), (None, 6))])
def test_head_dense_equals_einsum_dense_with_gradients(equation, input_shape, output_shape):
  rng = np.random.default_rng(2)
  reference = keras.layers.EinsumDense(equation, output_shape)
  head = HeadDense(equation, output_shape)
  reference.build(input_shape)
  head.build(input_shape)
  head.kernel.assign(reference.kernel)
  x = tf.constant(rng.normal(size=input_shape), tf.float32)
  cotangent = tf.constant(rng.normal(size=reference(x).shape), tf.float32)
  results = []
  for layer in (reference, head):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x)
      loss = tf.reduce_sum(y * cotangent)
    results.append([y] + tape.gradient(loss, [x, layer.kernel]))
  for a, b in zip(*results):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="bthk,bshk->bhts"):
    HeadDense("bthk,bshk->bhts", (None, None, None))


def test_dropout_zeroes_rate_and_scales_the_rest_keeping_the_mean():
  rate = 0.25
  y = np.asarray(layers.Dropout(rate)(np.ones((100, 1000), "float32"), training=True))
  kept = y[y != 0]
  np.testing.assert_allclose(kept, 1 / (1 - rate), rtol=1e-6)
  assert abs((y == 0).mean() - rate) < 0.01  # 7 standard deviations of 1e5 draws
  assert abs(y.mean() - 1.0) < 0.01


def test_dropout_is_identity_at_inference_and_at_rate_zero():
  x = np.random.default_rng(3).normal(size=(4, 5)).astype("float32")
  layer = layers.Dropout(0.5)
  for training in (False, None):
    np.testing.assert_array_equal(np.asarray(layer(x, training=training)), x)
  np.testing.assert_array_equal(np.asarray(layers.Dropout(0.0)(x, training=True)), x)
  with pytest.raises(ValueError, match="rate=1.0"):
    layers.Dropout(1.0)


def test_dropout_gradient_is_the_same_mask():
  x = tf.ones((8, 64))
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layers.Dropout(0.5)(x, training=True)
  np.testing.assert_array_equal(np.asarray(tape.gradient(y, x)), np.asarray(y))


def test_dropout_masks_differ_between_calls_and_replay_with_the_seed():
  def two_outputs():
    layer = layers.Dropout(0.5)
    return [np.asarray(layer(np.ones(256, "float32"), training=True)) for _ in range(2)]
  keras.utils.set_random_seed(7)
  first = two_outputs()
  keras.utils.set_random_seed(7)
  replayed = two_outputs()
  keras.utils.set_random_seed(8)
  other = two_outputs()
  assert not np.array_equal(first[0], first[1])
  for a, b in zip(first, replayed):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(first[0], other[0])


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_dropout_compiles_with_xla(dtype):
  layer = layers.Dropout(0.5, dtype=dtype)
  step = tf.function(lambda x: layer(x, training=True), jit_compile=True,
                     autograph=False)
  x = np.full((16, 256), 3.0, "float32")
  first, second = np.asarray(step(x), "float32"), np.asarray(step(x), "float32")
  assert step(x).dtype == layer.compute_dtype
  assert set(np.unique(first)) == {0.0, 6.0}
  assert 0.45 < (first == 0).mean() < 0.55
  assert not np.array_equal(first, second)  # the seed advanced inside the compiled step


def test_dropout_replicas_draw_different_masks():
  assert len(tf.config.list_logical_devices("CPU")) >= 2, "conftest splits the CPU"
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    layer = layers.Dropout(0.5)
  step = tf.function(lambda: strategy.run(lambda: layer(tf.ones(256), training=True)))
  first, second = (np.asarray(t) for t in strategy.experimental_local_results(step()))
  assert set(np.unique(first)) == {0.0, 2.0}
  assert not np.array_equal(first, second)


def test_query_key_and_value_kernels_start_different():
  """Each projection draws its own initial kernel (Keras 3 gives every call of one
  unseeded initializer instance the same values: shared, the query, key and value
  kernels of every attention layer started equal), reproducibly under one seed."""
  kernels = []
  for _ in range(2):
    keras.utils.set_random_seed(3)
    layer = layers.attention.MultiHeadAttention(4, 8, 8, 32)
    layer.build((None, None, 32))
    kernels.append([np.asarray(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                                  layer.value_dense)])
  query, key, value = kernels[0]
  assert not np.allclose(query, key) and not np.allclose(query, value)
  assert not np.allclose(key, value)
  for first, second in zip(*kernels):
    np.testing.assert_array_equal(first, second)
