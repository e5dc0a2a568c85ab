"""Training on 2 replicas (the CPU split in two): the same updates as 1 replica, mixed
precision, float16 loss scaling, non-finite gradients on one replica, sparse gradients."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import TrainConfig
from t2t_keras.training import distribute
from t2t_keras.training.trainer import Trainer
from tests.trainer_test import (MODEL, _pieces_dataset, batch_data, make_dataset_fn,
                                 train, weights_of)


@pytest.mark.slow
def test_one_and_two_replicas_make_the_same_updates(tmp_path):
  assert len(tf.config.list_logical_devices("CPU")) >= 2, "conftest splits the CPU"
  # Adam turns float rounding in near-zero gradients (summation order differs across
  # replicas) into whole lr-sized steps (g / (|g| + 1e-9) ~ +-1); a larger epsilon keeps
  # the comparison about the distribution plumbing.
  settings = dict(learning_rate=0.05, adam_epsilon=1e-4)
  one, r1 = train(tmp_path, "one", 4, **settings)
  two, r2 = train(tmp_path, "two", 4, strategy="mirrored", **settings)
  assert two.strategy.num_replicas_in_sync == 2
  assert r1.target_tokens == r2.target_tokens
  assert r1.final_loss == pytest.approx(r2.final_loss, abs=1e-5)
  for a, b in zip(weights_of(one), weights_of(two)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def train_8_steps(model_dir, dtype):
  """(trainer, trainable weights before, after, final loss) of 8 steps in `dtype`."""
  keras.utils.set_random_seed(0)
  config = TrainConfig(model_dir=model_dir, train_steps=8, log_every=8, eval_every=100,
                       save_checkpoint_steps=8, learning_rate_warmup_steps=4)
  trainer = Trainer(dataclasses.replace(MODEL, dtype=dtype), config)
  before = [w.numpy().copy() for w in trainer.model.trainable_weights]
  result = trainer.train(make_dataset_fn(), progress=lambda line: None)
  after = [w.numpy().copy() for w in trainer.model.trainable_weights]
  return trainer, before, after, result.final_loss


@pytest.fixture(scope="module")
def float32_8_steps(tmp_path_factory):
  """The float32 run both mixed-precision runs are compared with (trained once)."""
  return train_8_steps(str(tmp_path_factory.mktemp("float32")), "float32")[1:]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_float16"])
def test_mixed_precision_trains_with_float32_variables(tmp_path, dtype, float32_8_steps):
  """bfloat16 and float16 (with loss scaling) runs learn like float32 and keep float32
  variables: from the same start, their 8 steps move the weights as float32's do, up
  to rounding."""
  start, end, loss = float32_8_steps
  trainer, before, after, mixed_loss = train_8_steps(str(tmp_path / dtype), dtype)
  assert all(w.dtype == "float32" for w in trainer.model.trainable_weights)
  if dtype == "mixed_float16":
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
  assert np.isfinite(mixed_loss)
  assert mixed_loss == pytest.approx(loss, rel=0.05)
  for a, b in zip(start, before):  # the same initial weights
    np.testing.assert_array_equal(a, b)
  flat = lambda weights: np.concatenate([w.ravel() for w in weights])
  moved = np.linalg.norm(flat(end) - flat(start))  # float32's 8 updates
  moved_mixed = np.linalg.norm(flat(after) - flat(before))
  apart = np.linalg.norm(flat(after) - flat(end))  # where the two runs ended
  # A run that skipped its updates, or made them at half the learning rate, moves
  # 0-0.5 as far (and ends 0.5-1.0 of float32's move apart); one that moved elsewhere
  # ends far apart. Rounding alone: as far, in nearly the same direction (measured:
  # apart 0.15-0.36 of the move, depending on the initial weights).
  assert moved > 1.0 and moved_mixed == pytest.approx(moved, rel=0.2), (moved, moved_mixed)
  assert apart < 0.6 * moved, (moved, moved_mixed, apart)
  assert moved_mixed == pytest.approx(moved, rel=0.1), (moved, moved_mixed, apart)


FP16 = dataclasses.replace(MODEL, dtype="mixed_float16")


def overflow_step(trainer):
  """A step applying gradients of 1e-3, except inf on `overflowing_replica` (-1: none);
  returns the replicas whose gradients were not finite (`Trainer._apply`'s count)."""
  @tf.function
  def step(overflowing_replica):
    def replica():
      replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
      grads = [tf.ones_like(v) * 1e-3 for v in trainer.model.trainable_variables]
      inf = tf.fill(tf.shape(grads[0]), float("inf"))
      grads[0] = tf.where(tf.equal(replica_id, overflowing_replica), inf, grads[0])
      return trainer._apply(grads)
    flags = trainer.strategy.run(replica)
    return trainer.strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None)
  return step


@pytest.mark.slow
def test_float16_overflow_on_one_replica_is_skipped_by_all(tmp_path):
  """Only replica 1 overflows: every replica skips the step, the scale halves, and the
  skipped step still counts (one counter for logs, checkpoints and resume)."""
  config = TrainConfig(model_dir=str(tmp_path / "fp16"), strategy="mirrored",
                       learning_rate_warmup_steps=4)
  keras.utils.set_random_seed(0)
  trainer = Trainer(FP16, config, distribute.create_strategy(config))
  assert trainer.strategy.num_replicas_in_sync == 2
  scale = float(trainer.optimizer.dynamic_scale.numpy())

  step = overflow_step(trainer)

  before = weights_of(trainer)
  step(tf.constant(1))
  for a, b in zip(before, weights_of(trainer)):
    np.testing.assert_array_equal(a, b)  # nothing applied, on any replica
  assert float(trainer.optimizer.dynamic_scale.numpy()) == scale / 2
  assert trainer.current_step() == 1
  step(tf.constant(-1))  # no overflow: applied
  after = weights_of(trainer)
  assert all(np.isfinite(w).all() for w in after)
  assert any((a != b).any() for a, b in zip(before, after))
  assert trainer.current_step() == 2
  assert float(trainer.optimizer.dynamic_scale.numpy()) == scale / 2


@pytest.mark.slow
def test_float16_two_replicas_equal_one_with_accumulation(tmp_path):
  """--batch_size is per replica: 2 replicas make the updates of 1 replica with
  --accum_steps=2, in float16 with loss scaling too (within float16 tolerance)."""
  rng = np.random.default_rng(3)
  pieces = [batch_data(rng, 2, 3 + i % 4, 2 + i % 5) for i in range(8)]

  def dataset_fn(ctx):  # per-replica batches in a fixed order, whatever the replicas
    del ctx
    return _pieces_dataset(pieces).repeat()

  settings = dict(learning_rate=0.05, adam_epsilon=1e-4)
  one, r1 = train(tmp_path, "one", 4, model=FP16, dataset_fn=dataset_fn, accum_steps=2,
                  **settings)
  two, r2 = train(tmp_path, "two", 4, strategy="mirrored", model=FP16,
                  dataset_fn=dataset_fn, **settings)
  assert two.strategy.num_replicas_in_sync == 2
  assert one.current_step() == two.current_step() == 4
  assert r1.target_tokens == r2.target_tokens
  assert r1.final_loss == pytest.approx(r2.final_loss, rel=1e-3)
  for a, b in zip(weights_of(one), weights_of(two)):
    np.testing.assert_allclose(a, b, atol=2e-3)


def test_float32_nonfinite_gradient_on_one_replica_is_skipped_by_all(tmp_path):
  """Without loss scaling, replica 1's inf gradient must not reach any replica's
  weights (before, replica 0 applied its finite gradients and replica 1 inf ones: the
  replicas diverged), and the step reports it so that the host loop stops."""
  config = TrainConfig(model_dir=str(tmp_path / "fp32"), strategy="mirrored",
                       learning_rate_warmup_steps=4)
  keras.utils.set_random_seed(0)
  trainer = Trainer(MODEL, config, distribute.create_strategy(config))
  assert trainer.strategy.num_replicas_in_sync == 2

  step = overflow_step(trainer)

  before = weights_of(trainer)
  assert float(step(tf.constant(1))) == 1.0  # one replica's gradients were not finite
  after = weights_of(trainer)
  assert all(np.isfinite(w).all() for w in after)
  for a, b in zip(before, after):  # a zero gradient everywhere: only Adam's state moved
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert float(step(tf.constant(-1))) == 0.0


SPARSE_MODELS = {
    "learned_positions": dataclasses.replace(MODEL, position_embedding="learned",
                                             max_position=16),
    "separate_embeddings": dataclasses.replace(MODEL, shared_embeddings=False),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(SPARSE_MODELS))
def test_sparse_gradients_accumulate_and_equal_two_replicas(tmp_path, variant):
  """Embedding lookups give IndexedSlices gradients (learned positions, a separate
  source or target table): --accum_steps=2 adds them (it raised TypeError) and equals
  2 replicas, whose all-reduce gets one dense shape."""
  rng = np.random.default_rng(3)
  pieces = [batch_data(rng, 2, 3 + i % 4, 2 + i % 5) for i in range(8)]

  def dataset_fn(ctx):
    del ctx
    return _pieces_dataset(pieces).repeat()

  model = SPARSE_MODELS[variant]
  settings = dict(learning_rate=0.05, adam_epsilon=1e-4)
  one, r1 = train(tmp_path, "one", 4, model=model, dataset_fn=dataset_fn, accum_steps=2,
                  **settings)
  two, r2 = train(tmp_path, "two", 4, strategy="mirrored", model=model,
                  dataset_fn=dataset_fn, **settings)
  assert r1.target_tokens == r2.target_tokens
  assert r1.final_loss == pytest.approx(r2.final_loss, abs=1e-5)
  for a, b in zip(weights_of(one), weights_of(two)):
    np.testing.assert_allclose(a, b, atol=1e-5)
