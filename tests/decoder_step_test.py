"""The lean decoding step (layers/decoder_step.py) against the teacher-forced pass.

The step runs on 2-D rows with weights fused once per batch (`step_weights`): one
matrix for self-attention's Q, K and V, the query's scale folded in, the sinusoid as a
table. For every position encoding and cache layout its logits must be the full
forward pass's at each position; and a wrongly fused kernel must show.
"""

import numpy as np
import pytest
import keras
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.configs import ModelConfig
from t2t_keras.model import create_model
from t2t_keras.model.layers import decoder_step

V = 40


def make_model(position, pre_norm=False, dtype="float32", key_size=6):
  keras.utils.set_random_seed(7)
  # Unequal key and value sizes (Table 3 row A), 1 / sqrt(Dk) not a power of two: a
  # wrong split of the fused kernel or a wrongly applied scale shows.
  model = create_model(ModelConfig(
      vocab_size=V, hidden_size=16, filter_size=32, num_heads=2, num_hidden_layers=2,
      key_size=key_size, value_size=10, layer_prepostprocess_dropout=0.0, pre_norm=pre_norm,
      position_embedding=position, max_relative_position=3, dtype=dtype))
  # Noise on every weight: norms start at gamma 1, beta 0, so a step that mixed up
  # their parts would pass.
  rng = np.random.default_rng(8)
  for weight in model.weights:
    weight.assign(weight.numpy() + rng.normal(0, 0.1, weight.shape).astype("float32"))
  return model


def sources_and_targets(rng, length=7):
  inputs = rng.integers(4, V, size=(3, 6)).astype("int32")
  for row, n in enumerate([6, 4, 2]):
    inputs[row, n - 1], inputs[row, n:] = EOS_ID, PAD_ID
  return inputs, rng.integers(4, V, size=(3, length)).astype("int32")


def step_logits(model, inputs, targets, layout, weights=None):
  """The step's logits (B, T, V) for every target position, teacher forced: each
  hypothesis' previous token is the target's."""
  batch, length = targets.shape
  encoded, memory_mask = model.encode(inputs)
  cross = model.cross_key_values(encoded)
  beam = 2 if layout == "slotted" else 1
  cache = model.init_cache(batch // beam if beam > 1 else batch,
                           0 if layout == "growing" else length + 2, beam_size=beam)
  if beam > 1:  # sentence b's two hypotheses are rows 2b, 2b + 1 with one source
    slots = np.broadcast_to(np.arange(beam)[None, :, None],
                            (batch // beam, beam, length + 2)).astype("int32")
    memory_mask = memory_mask[::beam]
    cross = [(k[::beam], v[::beam]) for k, v in cross]
  previous, logits = np.full((batch,), BOS_ID, "int32"), []
  for t in range(length):
    extra = {"slots": tf.constant(slots)} if beam > 1 else {"grow": layout == "growing"}
    out, cache = model.decode_step(previous, t, cache, cross, memory_mask,
                                   weights=weights, **extra)
    logits.append(out.numpy())
    previous = targets[:, t]
  return np.stack(logits, axis=1)


@pytest.mark.parametrize("position", ["sinusoid", "learned", "relative"])
@pytest.mark.parametrize("layout", ["growing", "fixed", "slotted"])
def test_step_logits_equal_teacher_forcing(position, layout):
  model = make_model(position, pre_norm=layout == "fixed")
  inputs, targets = sources_and_targets(np.random.default_rng(0))
  if layout == "slotted":  # two hypotheses per sentence: the sentence's rows repeated
    inputs = np.repeat(inputs[:2], 2, axis=0)
    targets = np.concatenate([targets, targets[::-1]])[:4]
  full = model({"inputs": inputs, "targets": targets}).numpy()
  weights = model.step_weights(targets.shape[1] + 2)  # as decoding takes them
  np.testing.assert_allclose(step_logits(model, inputs, targets, layout, weights), full,
                             atol=1e-5)


@pytest.mark.parametrize("layout", ["growing", "slotted"])
def test_an_exact_query_scale_moves_into_the_weights(layout):
  """Dk = 16: the scale 1/4 is a power of two, so the step folds it into the fused
  kernel's query columns and the cross-attention keys (and multiplies no query); the
  logits are still the teacher-forced pass's. (Mutation: the scale folded and applied
  again, or folded into the kernel but not the keys: the logits move.)"""
  model = make_model("sinusoid", key_size=16)
  inputs, targets = sources_and_targets(np.random.default_rng(3))
  if layout == "slotted":
    inputs = np.repeat(inputs[:2], 2, axis=0)
    targets = np.concatenate([targets, targets[::-1]])[:4]
  weights = model.step_weights(targets.shape[1] + 2)
  attention = model.decoder_layers[0].self_attention
  assert weights["layers"][0]["self"]["scaled"] and weights["layers"][0]["cross"]["scaled"]
  np.testing.assert_array_equal(weights["layers"][0]["self"]["qkv"][:, :32].numpy(),
                                attention.query_dense.kernel.numpy().reshape(16, 32) / 4)
  full = model({"inputs": inputs, "targets": targets}).numpy()
  np.testing.assert_allclose(step_logits(model, inputs, targets, layout, weights), full,
                             atol=1e-5)
  assert not make_model("sinusoid").step_weights(4)["layers"][0]["self"]["scaled"]


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_float16"])
@pytest.mark.parametrize("layout", ["growing", "fixed"])
def test_step_under_mixed_precision(dtype, layout):
  """Half-precision compute, float32 variables and LayerNorm statistics: the step's
  logits are still the teacher-forced pass's."""
  model = make_model("sinusoid", dtype=dtype)
  inputs, targets = sources_and_targets(np.random.default_rng(2))
  full = model({"inputs": inputs, "targets": targets}).numpy()
  weights = model.step_weights(targets.shape[1] + 2)
  # The float32 weights are cast once, here, for the whole search: the step gets
  # tensors in the compute dtype, never a variable it would cast at every position.
  layer = weights["layers"][0]
  for weight in (*layer["ffn"], layer["self"]["output"], layer["cross"]["query"]):
    assert isinstance(weight, tf.Tensor) and weight.dtype == model.compute_dtype, weight
  # The step's matmuls have other shapes than the full pass's, so half-precision sums
  # may round differently: two units in the last place of the largest logit (a mixed-up
  # weight moves logits by far more; the float32 test above holds to 1e-5).
  compute = {"bfloat16": tf.bfloat16, "mixed_float16": tf.float16}[dtype].as_numpy_dtype
  ulp = float(np.spacing(np.abs(full).max().astype(compute)))
  np.testing.assert_allclose(step_logits(model, inputs, targets, layout, weights), full,
                             atol=2 * ulp)


@pytest.mark.parametrize("position", ["sinusoid", "relative"])
def test_a_wrong_fusion_shows(position):
  """The equality above can fail: the fused kernel with its query, key and value parts
  in another order gives other logits."""
  model = make_model(position)
  inputs, targets = sources_and_targets(np.random.default_rng(1))
  full = model({"inputs": inputs, "targets": targets}).numpy()
  weights = model.step_weights(targets.shape[1])
  np.testing.assert_allclose(step_logits(model, inputs, targets, "growing", weights), full,
                             atol=1e-5)
  qkv = weights["layers"][0]["self"]["qkv"]
  q, k, v = tf.split(qkv, [12, 12, 20], axis=1)
  for wrong in (tf.concat([q, v[:, :12], k, v[:, 12:]], axis=1),  # keys and values mixed
                tf.concat([k, q, v], axis=1)):  # queries and keys swapped
    weights["layers"][0]["self"]["qkv"] = wrong
    bad = step_logits(model, inputs, targets, "growing", weights)
    assert np.abs(bad - full).max() > 1e-3


@pytest.mark.parametrize("limit,by_size", [(0, True), (2 ** 17, True), (2 ** 17, False)])
def test_few_rows_attention_takes_elementwise_kernels(limit, by_size, monkeypatch):
  """A graph-mode step (growing cache) whose weights ask for it (`attention_by_size`,
  the SavedModel's search) attends on few rows by elementwise kernels
  (`decoder_step.few_rows`: up to FEW_ROWS_PRODUCTS products), on many by batched
  matrix products; without it (the decode command) always by products. Either way the
  logits are the teacher-forced pass's. (Mutation: `few_rows` always false, or taken
  without the entry, or the elementwise form's sum wrong.)"""
  monkeypatch.setattr(decoder_step, "FEW_ROWS_PRODUCTS", limit)
  calls, elementwise = [], decoder_step._few_rows_attention

  def counting(*args):
    calls.append(1)
    return elementwise(*args)
  monkeypatch.setattr(decoder_step, "_few_rows_attention", counting)
  model = make_model("sinusoid")
  inputs, targets = sources_and_targets(np.random.default_rng(4))
  full = model({"inputs": inputs, "targets": targets}).numpy()
  weights = dict(model.step_weights(targets.shape[1] + 2), attention_by_size=by_size)
  np.testing.assert_allclose(step_logits(model, inputs, targets, "growing", weights), full,
                             atol=1e-5)
  # Eagerly the condition picks one branch: self- and cross-attention of both layers
  # at each of the 7 positions, or none.
  assert len(calls) == (2 * 2 * 7 if limit and by_size else 0)


def test_few_rows_is_a_size_limit():
  """The choice counts rows x heads x key positions x Dk: 4 heads of 64 (this
  project's small recipes) take the elementwise form up to 512 row-positions."""
  model = make_model("sinusoid", key_size=64)  # 2 heads of 64: 1,024 row-positions
  layer = model.decoder_layers[0]
  mask = tf.ones([1, 1, 1, 16], bool)

  def few(rows, index):
    return [bool(p) for p in decoder_step.few_rows(tf.zeros([rows, 16]), index + 1, mask,
                                                   layer)]
  assert few(4, 0) == [True, True]
  assert few(64, 15) == [True, True]  # 64 x 16 = 1,024 both
  assert few(64, 16) == [False, True]  # 17 cached positions
  assert few(65, 0) == [True, False]  # 65 x 16 source positions


@pytest.mark.parametrize("slots", [1, 2])
def test_a_fixed_cache_counts_all_its_keys(slots, monkeypatch):
  """Under XLA (a fixed cache) every query attends over the whole cache, all its
  slots: the size choice counts those keys, not the positions decoded so far.
  (Mutation: the index counted instead.)"""
  model = make_model("sinusoid")  # 2 heads of 6: 12 products per row and key
  rows, length = 4, 10
  # Up to 40 row-keys: a step at position 0 is few, the cache's 4 x 10 x slots is not
  # (with 2 slots).
  monkeypatch.setattr(decoder_step, "FEW_ROWS_PRODUCTS", 12 * 40)
  cache = model.init_cache(rows // slots, length, beam_size=slots)
  x, mask = tf.zeros([rows, 16]), tf.ones([rows // slots, 1, 1, 3], bool)
  few_self, few_cross = model._few_rows(  # pylint: disable=protected-access
      x, 0, cache, mask, False, {"attention_by_size": True})
  assert bool(few_self) == (slots == 1) and bool(few_cross)
  grow = model._few_rows(x, 0, cache, mask, True, {"attention_by_size": True})  # pylint: disable=protected-access
  assert bool(grow[0])  # a growing cache at position 0: one key per row
  assert model._few_rows(x, 0, cache, mask, False, {}) is None  # pylint: disable=protected-access


def test_fused_weights_leave_the_checkpoint_alone():
  """The fused kernels exist only in the decoding graph: taking them adds no variable
  and changes none."""
  model = make_model("sinusoid")
  before = [(w.path, w.numpy().copy()) for w in model.weights]
  model.step_weights(8)
  after = [(w.path, w.numpy()) for w in model.weights]
  assert [p for p, _ in before] == [p for p, _ in after]
  for (_, a), (_, b) in zip(before, after):
    np.testing.assert_array_equal(a, b)
