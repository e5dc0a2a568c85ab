"""Model properties: padding invariance, causality, cached == teacher-forced, dtypes."""

import numpy as np
import pytest
import tensorflow as tf
import keras

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.configs import ModelConfig
from t2t_keras.model import Transformer, advance_pointer, create_model

V = 40


def tiny_config(**overrides):
  base = dict(vocab_size=V, hidden_size=16, filter_size=32, num_heads=2,
              num_hidden_layers=2, layer_prepostprocess_dropout=0.0)
  base.update(overrides)
  return ModelConfig(**base)


def random_ids(rng, batch, length, lengths=None):
  ids = rng.integers(4, V, size=(batch, length)).astype("int32")
  if lengths is not None:
    for b, n in enumerate(lengths):
      ids[b, n - 1] = EOS_ID
      ids[b, n:] = PAD_ID
  return ids


@pytest.fixture(params=["post_norm", "pre_norm", "source_pointer"])
def model(request):
  keras.utils.set_random_seed(0)
  if request.param == "source_pointer":
    return create_model(tiny_config(pre_norm=True, source_pointer=True))
  return create_model(tiny_config(pre_norm=request.param == "pre_norm"))


def test_padded_batch_equals_each_sentence_alone(model):
  rng = np.random.default_rng(1)
  src_lengths, tgt_lengths = [7, 3], [5, 8]
  inputs = random_ids(rng, 2, 9, src_lengths)
  targets = random_ids(rng, 2, 10, tgt_lengths)
  batched = model({"inputs": inputs, "targets": targets}).numpy()
  for b in range(2):
    alone = model({"inputs": inputs[b:b + 1, :src_lengths[b]],
                   "targets": targets[b:b + 1, :tgt_lengths[b]]}).numpy()
    np.testing.assert_allclose(batched[b, :tgt_lengths[b]], alone[0], atol=1e-5)


def test_future_targets_do_not_change_earlier_logits(model):
  rng = np.random.default_rng(2)
  inputs = random_ids(rng, 2, 6)
  targets = random_ids(rng, 2, 8)
  changed = targets.copy()
  changed[:, 5:] = rng.integers(4, V, size=(2, 3))
  a = model({"inputs": inputs, "targets": targets}).numpy()
  b = model({"inputs": inputs, "targets": changed}).numpy()
  np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-5)  # position 5 sees targets[:4]
  assert np.abs(a[:, 6:] - b[:, 6:]).max() > 1e-4  # later positions do depend on them


def test_cached_decoding_equals_teacher_forcing(model):
  rng = np.random.default_rng(3)
  inputs = random_ids(rng, 3, 7, [7, 4, 2])
  targets = random_ids(rng, 3, 6)
  encoded, memory_mask = model.encode(inputs)
  cross = model.cross_key_values(encoded)
  cache = model.init_cache(3, 9)  # longer than the targets: unused slots stay masked
  previous = np.full((3,), 3, "int32")  # BOS
  if model.uses_source_pointer:  # targets that copy some source tokens
    targets[0, 1:4] = inputs[0, :3]
    targets[1, 2:5] = inputs[1, :3]  # source 1 has 3 tokens + EOS: the pointer stops
    targets[2, 0] = inputs[2, 0]
  full = model({"inputs": inputs, "targets": targets}).numpy()
  pointer, extra = np.zeros((3,), "int32"), {}
  for t in range(targets.shape[1]):
    if model.uses_source_pointer:
      pointer = advance_pointer(pointer, previous, inputs)
      extra = {"source_pointer": (encoded, pointer)}
    logits, cache = model.decode_step(previous, t, cache, cross, memory_mask, **extra)
    np.testing.assert_allclose(logits.numpy(), full[:, t], atol=1e-4, err_msg=f"step {t}")
    previous = targets[:, t]


def test_decode_step_compiles_with_tensor_index(model):
  rng = np.random.default_rng(4)
  inputs = random_ids(rng, 2, 5)
  encoded, memory_mask = model.encode(inputs)
  cross = model.cross_key_values(encoded)
  step = tf.function(model.decode_step, jit_compile=True, autograph=False)
  cache = model.init_cache(2, 4)
  ids = tf.constant([3, 3])
  extra = ({"source_pointer": (encoded, tf.constant([0, 0]))}
           if model.uses_source_pointer else {})
  eager_logits, _ = model.decode_step(ids, 0, cache, cross, memory_mask, **extra)
  logits, new_cache = step(ids, tf.constant(0), cache, cross, memory_mask, **extra)
  np.testing.assert_allclose(logits.numpy(), eager_logits.numpy(), atol=1e-4)
  assert new_cache[0]["key"].shape == cache[0]["key"].shape
  # position 0 was written (B, H, L, K)
  assert np.abs(new_cache[0]["key"].numpy()[:, :, 0]).max() > 0
  np.testing.assert_array_equal(new_cache[0]["key"].numpy()[:, :, 1:], 0.0)


def test_source_pointer_reads_the_source_at_the_pointer():
  """With a source pointer, position t's decoder input adds the encoder output at the
  source token the target has copied up to; a target token equal to the source's
  token at the pointer moves it on (a "," tag after the word "," does not)."""
  keras.utils.set_random_seed(5)
  model = create_model(tiny_config(pre_norm=True, source_pointer=True))
  source = tf.constant([[12, 13, 14, EOS_ID]])
  # Decoder inputs BOS, 5, 12, 12, 13, 14: copies at 2 and 4, 5; the second 12 is not
  # the token at the pointer (13) any more.
  targets = tf.constant([[5, 12, 12, 13, 14, EOS_ID]])
  pointer = model.source_pointers(source, tf.constant([[3, 5, 12, 12, 13, 14]]))
  np.testing.assert_array_equal(pointer.numpy(), [[0, 0, 1, 1, 2, 3]])
  encoded = tf.random.normal([1, 4, 16])
  mask = tf.ones([1, 1, 1, 4], tf.bool)
  picked = model.pointed_source(encoded, mask, pointer).numpy()
  want = model.source_pointer_projection(tf.gather(encoded[0], [0, 0, 1, 1, 2, 3])).numpy()
  np.testing.assert_allclose(picked[0], want, atol=1e-5)
  # Beyond the source's EOS (position 3 here: 3 real tokens + EOS) it stays at EOS.
  short = tf.constant([[[[True, True, False, False]]]])
  capped = model.pointed_source(encoded, short, pointer).numpy()
  want = model.source_pointer_projection(tf.gather(encoded[0], [0, 0, 1, 1, 1, 1])).numpy()
  np.testing.assert_allclose(capped[0], want, atol=1e-5)
  # The decoder's input is the embedding + position + this: with the projection zeroed,
  # the logits are another model's, with it they differ.
  logits = model.decode(targets, encoded, mask, inputs=source).numpy()
  kernel = model.source_pointer_projection.kernel
  saved = kernel.numpy()
  kernel.assign(np.zeros_like(saved))
  without = model.decode(targets, encoded, mask, inputs=source).numpy()
  kernel.assign(saved)
  assert np.abs(logits - without).max() > 1e-3


@pytest.mark.parametrize("position_embedding", ["sinusoid", "learned", "relative"])
def test_position_embeddings_work_and_matter(position_embedding):
  keras.utils.set_random_seed(0)
  model = create_model(tiny_config(position_embedding=position_embedding, max_position=32))
  inputs = np.array([[5, 6, 7, 8, EOS_ID]], "int32")
  targets = np.array([[9, 9, 9, EOS_ID]], "int32")
  logits = model({"inputs": inputs, "targets": targets}).numpy()
  assert np.isfinite(logits).all()
  # Identical decoder inputs at different positions get different logits.
  assert np.abs(logits[0, 1] - logits[0, 2]).max() > 1e-4
  learned = [w for w in model.weights if "position_embeddings" in w.path]
  assert len(learned) == (2 if position_embedding == "learned" else 0)
  relative = [w for w in model.weights if "relative_position" in w.path]
  layers = len(model.encoder_layers) + len(model.decoder_layers)
  assert len(relative) == (2 * layers if position_embedding == "relative" else 0)
  if position_embedding == "relative":  # instead of an absolute encoding
    assert model.encoder_position is None and model.decoder_position is None


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_float16"])
def test_mixed_precision_keeps_logits_float32(dtype):
  keras.utils.set_random_seed(0)
  model = create_model(tiny_config(dtype=dtype))
  inputs = np.array([[5, 6, 7, EOS_ID]], "int32")
  logits = model({"inputs": inputs, "targets": inputs})
  assert logits.dtype == tf.float32
  assert all(w.dtype == "float32" for w in model.weights)
  assert model.encoder_layers[0].compute_dtype == {"bfloat16": "bfloat16",
                                                   "mixed_float16": "float16"}[dtype]
  reference = create_model(tiny_config())
  reference.set_weights(model.get_weights())
  expected = reference({"inputs": inputs, "targets": inputs}).numpy()
  np.testing.assert_allclose(logits.numpy(), expected, atol=0.1, rtol=0.05)


def test_shared_embeddings_tie_all_three():
  shared = create_model(tiny_config())
  separate = create_model(tiny_config(shared_embeddings=False))
  assert shared.source_embedding is shared.softmax_embedding
  assert separate.count_params() - shared.count_params() == 2 * V * 16


def test_independent_key_and_value_sizes():
  model = create_model(tiny_config(num_heads=2, key_size=3, value_size=5))
  attention = model.encoder_layers[0].self_attention
  assert tuple(attention.query_dense.kernel.shape) == (16, 2, 3)
  assert tuple(attention.value_dense.kernel.shape) == (16, 2, 5)
  assert tuple(attention.output_dense.kernel.shape) == (2, 5, 16)
  logits = model({"inputs": np.array([[5, 1]]), "targets": np.array([[6, 1]])})
  assert logits.shape == (1, 2, V)


def test_model_config_round_trip():
  model = create_model(tiny_config(pre_norm=True, key_size=4, value_size=4))
  clone = Transformer.from_config(model.get_config())
  clone.build()
  assert clone.model_config == model.model_config
  assert clone.count_params() == model.count_params()


def test_validation_names_the_values():
  with pytest.raises(ValueError, match="--hidden_size=10 is not divisible by --num_heads=3"):
    ModelConfig(hidden_size=10, num_heads=3).validate()
  ModelConfig(hidden_size=10, num_heads=3, key_size=4, value_size=4).validate()


@pytest.mark.parametrize("pre_norm", [False, True])
def test_model_checkpoint_holds_every_weight(tmp_path, pre_norm):
  # tf.train.Checkpoint does not see into Keras' tracked lists of layers: a model
  # checkpoint alone (as decoding, averaging and export read it) must hold them all.
  keras.utils.set_random_seed(0)
  saved = create_model(tiny_config(pre_norm=pre_norm))
  path = tf.train.Checkpoint(model=saved).save(str(tmp_path / "ckpt"))
  names = [n for n in tf.train.load_checkpoint(path).get_variable_to_shape_map()
           if n.startswith("model/")]
  assert len(names) == len(saved.weights)
  keras.utils.set_random_seed(1)
  fresh = create_model(tiny_config(pre_norm=pre_norm))
  tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
  for a, b in zip(saved.weights, fresh.weights):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
