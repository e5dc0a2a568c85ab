"""--optimizer (Adam, Adafactor) and --clip_grad_norm: clipping by the global norm of
the summed gradient (1 replica accumulating 2 micro-batches = 2 replicas), Adafactor's
factored state, its checkpoints (resume, averaging, --init_from), and a restart that
changes the optimizer."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.trained import averaging, modeldir
from t2t_keras import errors
from t2t_keras.configs import TrainConfig
from t2t_keras.training import init_from
from t2t_keras.training.trainer import Trainer
from tests.trainer_test import (MODEL, _pieces_dataset, batch_data, make_dataset_fn,
                                 train, weights_of)


def summed_gradient_norm(pieces, seed=0, **overrides):
  """The global norm of the first update's gradient (all `pieces` are one global
  batch), from the initial weights `train(..., seed=seed)` starts from."""
  keras.utils.set_random_seed(seed)
  trainer = Trainer(MODEL, TrainConfig(label_smoothing=0.1, **overrides))
  tokens = tf.constant(float(sum((p["targets"] != 0).sum() for p in pieces)))
  grads = None
  for piece in pieces:
    more = trainer._gradients(piece, tokens)[0]
    grads = more if grads is None else [g + h for g, h in zip(grads, more)]
  return float(tf.linalg.global_norm(grads))


@pytest.mark.slow
def test_a_clipped_step_is_the_gradient_scaled_to_the_clip_norm(tmp_path):
  """With an epsilon far above |g| Adam's first step is lr * g / epsilon: linear in the
  gradient, so a step clipped to norm c moves the weights c / |g| as far as the
  unclipped step, in the same direction."""
  dataset_fn = make_dataset_fn()
  first = next(iter(dataset_fn(tf.distribute.InputContext())))
  norm = summed_gradient_norm([{k: v.numpy() for k, v in first.items()}])
  clip = norm / 4
  settings = dict(learning_rate=1e4, adam_epsilon=1e3, save_checkpoint_steps=1,
                  log_every=1)
  keras.utils.set_random_seed(0)
  start = weights_of(Trainer(MODEL, TrainConfig(label_smoothing=0.1)))
  plain, _ = train(tmp_path, "plain", 1, **settings)
  clipped, _ = train(tmp_path, "clipped", 1, clip_grad_norm=clip, **settings)
  moved = [b - a for a, b in zip(start, weights_of(plain))]
  moved_clipped = [b - a for a, b in zip(start, weights_of(clipped))]
  flat = lambda arrays: np.concatenate([a.ravel() for a in arrays])
  print(f"pre-clip norm {norm:.4f}, clip {clip:.4f}, moved "
        f"{np.linalg.norm(flat(moved)):.3e} -> {np.linalg.norm(flat(moved_clipped)):.3e}")
  assert np.linalg.norm(flat(moved)) > 0
  np.testing.assert_allclose(flat(moved_clipped), flat(moved) * clip / norm,
                             rtol=1e-3, atol=1e-7)


@pytest.mark.slow
def test_clipping_one_replica_accumulating_equals_two_replicas(tmp_path):
  """The clip applies to the global norm of the summed gradient (after the
  cross-replica sum and the accumulation), so 2 replicas still make the updates of 1
  replica with --accum_steps=2; clipping each replica's share alone would not."""
  assert len(tf.config.list_logical_devices("CPU")) >= 2, "conftest splits the CPU"
  rng = np.random.default_rng(3)
  pieces = [batch_data(rng, 2, 3 + i % 4, 2 + i % 5) for i in range(8)]

  def dataset_fn(ctx):
    del ctx
    return _pieces_dataset(pieces).repeat()

  clip = 0.2
  norm = summed_gradient_norm(pieces[:2])
  print(f"first update's pre-clip norm {norm:.4f}, clip {clip}")
  assert norm > 2 * clip  # the clip binds (each replica's half is above it too)
  settings = dict(learning_rate=0.05, adam_epsilon=1e-4, clip_grad_norm=clip)
  one, r1 = train(tmp_path, "one", 4, dataset_fn=dataset_fn, accum_steps=2, **settings)
  two, r2 = train(tmp_path, "two", 4, strategy="mirrored", dataset_fn=dataset_fn,
                  **settings)
  unclipped, _ = train(tmp_path, "unclipped", 4, dataset_fn=dataset_fn, accum_steps=2,
                       learning_rate=0.05, adam_epsilon=1e-4)
  assert two.strategy.num_replicas_in_sync == 2
  assert r1.final_loss == pytest.approx(r2.final_loss, abs=1e-5)
  for a, b in zip(weights_of(one), weights_of(two)):
    np.testing.assert_allclose(a, b, atol=1e-5)
  apart = max(np.abs(a - b).max() for a, b in zip(weights_of(one), weights_of(unclipped)))
  print(f"largest weight difference clipped vs unclipped: {apart:.3e}")
  assert apart > 1e-3
  # --clip_grad_norm changes no variable: a run resumes with it set or dropped.
  resumed, _ = train(tmp_path, "unclipped", 6, dataset_fn=dataset_fn, accum_steps=2,
                     **settings)
  assert resumed.current_step() == 6


def test_adafactor_matches_keras_and_keeps_only_factors():
  """The same updates as keras.optimizers.Adafactor (t2t's settings are its defaults),
  without Keras' full-size second-moment copy of each matrix: a 16 x 32 matrix keeps
  16 + 32 numbers, Adam 2 x 16 x 32."""
  from t2t_keras.training.optimizers import Adafactor  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  values = [rng.normal(size=(16, 32)).astype("float32"),
            rng.normal(size=(32,)).astype("float32")]
  grads = [[rng.normal(size=v.shape).astype("float32") for v in values] for _ in range(3)]
  results, sizes = [], {}
  for optimizer in (Adafactor(learning_rate=0.01), keras.optimizers.Adafactor(0.01),
                    keras.optimizers.Adam(0.01)):
    variables = [keras.Variable(v) for v in values[:1]]
    optimizer.build(variables)
    sizes[type(optimizer).__module__ + type(optimizer).__name__] = sum(
        int(np.prod(v.shape)) for v in optimizer.variables if v.dtype == "float32"
        and len(v.shape) > 0)
    variables = [keras.Variable(v) for v in values]
    optimizer = type(optimizer)(learning_rate=0.01)
    for step in grads:
      optimizer.apply_gradients(zip(step, variables))
    results.append([v.numpy() for v in variables])
  print(sizes)
  for ours, theirs in zip(results[0], results[1]):
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
  assert sizes["t2t_keras.training.optimizersAdafactor"] == 16 + 32
  assert sizes["keras.src.optimizers.adamAdam"] == 2 * 16 * 32


def _adam_run(optimizer, strategy=None, steps=12):
  """`steps` updates of a matrix (dense gradients) and an embedding table (a lookup's
  IndexedSlices gradient) by `optimizer`, built in `strategy`'s scope, after checking
  that every replica's copy of each variable is the same; returns the weights and the
  optimizer's slots (numpy), and the op types of the step's graph."""
  strategy = strategy or tf.distribute.get_strategy()
  rng = np.random.default_rng(3)
  with strategy.scope():
    matrix = keras.Variable(rng.normal(size=(16, 32)).astype("float32"), name="matrix")
    table = keras.Variable(rng.normal(size=(10, 8)).astype("float32"), name="table")
    optimizer.build([matrix, table])  # as the trainer does, before the first step
  ids = tf.constant([1, 3, 3, 7])

  def replica_step(target):
    with tf.GradientTape() as tape:
      rows = tf.gather(table.value, ids)
      loss = (tf.reduce_sum((matrix.value - target) ** 2) + tf.reduce_sum(rows ** 3))
    grads = tape.gradient(loss, [matrix.value, table.value])
    assert isinstance(grads[1], tf.IndexedSlices)
    optimizer.apply_gradients(zip(grads, [matrix, table]))

  @tf.function
  def step(target):
    strategy.run(replica_step, args=(target,))
  for k in range(steps):
    step(tf.constant(np.full((16, 32), 0.1 * k, "float32")))
  graph = step.get_concrete_function(tf.TensorSpec((16, 32), tf.float32)).graph
  ops = [op.type for op in graph.get_operations()]
  for function in graph._functions.values():  # pylint: disable=protected-access
    ops += [node.op for node in function.definition.node_def]
  variables = [matrix, table] + [v for v in optimizer.variables if len(v.shape) > 0]
  for variable in variables:  # every replica's copy was updated alike
    copies = [c.numpy() for c in strategy.experimental_local_results(variable.value)]
    for copy in copies[1:]:
      np.testing.assert_array_equal(copy, copies[0], err_msg=variable.path)
  return [v.numpy() for v in variables], ops


def assert_adam_state_equal(ours, theirs):
  """[the 16 x 32 matrix, the 10 x 8 table, their slots]: dense updates equal to
  float32 rounding; the table's (a sparse gradient with a repeated row: Keras' own
  update, whose second moment differs from a dense update's there) bitwise."""
  assert len(ours) == len(theirs) == 6
  for a, b in zip(ours, theirs):
    if a.shape == (10, 8):  # the table and its two slots
      np.testing.assert_array_equal(a, b)
    else:
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_adam_is_keras_adam_in_one_op_per_weight(tmp_path):
  """--optimizer=adam: Keras' Adam (its update to float32 rounding, with the paper's
  beta2 0.98; its variables and checkpoints: a Keras Adam checkpoint restores into
  it), each weight with a dense gradient updated by one ResourceApplyAdam op, on one
  device and on two replicas (whose copies stay equal). A sparse gradient keeps Keras'
  update. Epsilon 0.1, near sqrt(v), checks that it is applied where Keras does."""
  from t2t_keras.training.optimizers import Adam  # pylint: disable=import-outside-toplevel
  for epsilon in (0.1, 1e-9):
    settings = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.98, epsilon=epsilon)
    keras_state, keras_ops = _adam_run(keras.optimizers.Adam(**settings))
    ours_state, ours_ops = _adam_run(Adam(**settings))
    assert_adam_state_equal(ours_state, keras_state)
    assert ours_ops.count("ResourceApplyAdam") == 1, sorted(set(ours_ops))  # the matrix
    assert "ResourceApplyAdam" not in keras_ops
    assert len(ours_ops) < len(keras_ops), (len(ours_ops), len(keras_ops))

  # Two replicas (each replica's gradient is summed over both, so twice one's), with
  # the reduction the trainer uses on CPUs (collectives would leave their instance keys
  # behind in this process, for distribute_test's strategy to collide with).
  strategy = tf.distribute.MirroredStrategy(
      ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
  with strategy.scope():
    optimizer, keras_optimizer = Adam(**settings), keras.optimizers.Adam(**settings)
  two_state, two_ops = _adam_run(optimizer, strategy)
  assert two_ops.count("ResourceApplyAdam") == 2  # the matrix on each replica
  assert_adam_state_equal(two_state, _adam_run(keras_optimizer, strategy)[0])

  # A model directory trained before keeps its optimizer state: same checkpoint keys.
  weights = [keras.Variable(np.ones((3, 4), "float32"))]
  theirs = keras.optimizers.Adam(**settings)
  theirs.apply_gradients([(tf.fill((3, 4), 0.5), weights[0])])
  path = tf.train.Checkpoint(optimizer=theirs, weights=weights).save(str(tmp_path / "ck"))
  restored = [keras.Variable(np.zeros((3, 4), "float32"))]
  ours = Adam(**settings)
  ours.build(restored)
  tf.train.Checkpoint(optimizer=ours, weights=restored).restore(path).assert_consumed()
  for a, b in zip(ours.variables, theirs.variables, strict=True):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow
def test_adafactor_trains_resumes_averages_and_initializes(tmp_path):
  """Adafactor lowers the loss of the copy task; stopping at a checkpoint and resuming
  ends where an uninterrupted run does; its checkpoints average and serve --init_from
  (weights alone, or with its optimizer state into another Adafactor run)."""
  rng = np.random.default_rng(5)
  pieces = []
  for i in range(8):
    piece = batch_data(rng, 4, 3 + i % 4, 2)
    piece["targets"] = piece["inputs"].copy()
    pieces.append(piece)

  def dataset_fn(ctx):
    del ctx
    return _pieces_dataset(pieces).repeat()

  settings = dict(optimizer="adafactor", learning_rate=2.0, learning_rate_warmup_steps=2,
                  dataset_fn=dataset_fn)
  keras.utils.set_random_seed(0)
  fresh = Trainer(MODEL, TrainConfig(optimizer="adafactor", label_smoothing=0.1))
  before = fresh.evaluate(dataset_fn, max_batches=8)["loss"]
  straight, _ = train(tmp_path, "straight", 8, **settings)
  after = straight.evaluate(dataset_fn, max_batches=8)["loss"]
  print(f"copy-task loss {before:.3f} -> {after:.3f} after 8 Adafactor steps")
  assert after < 0.8 * before

  train(tmp_path, "resumed", 4, **settings)  # stops after a checkpoint at step 4 ...
  resumed, result = train(tmp_path, "resumed", 8, seed=123, **settings)  # ... resumes
  assert result.steps == 8 and resumed.current_step() == 8
  for a, b in zip(weights_of(straight), weights_of(resumed)):
    np.testing.assert_allclose(a, b, atol=1e-6)

  means = averaging.average_checkpoints(str(tmp_path / "straight"), last_n=2)
  assert len(means) == len(straight.model.weights)
  keras.utils.set_random_seed(1)
  adam = Trainer(MODEL, TrainConfig())
  averaging.average_into_model(adam.model, checkpoints_of(tmp_path / "straight")[-1:])
  for a, b in zip(weights_of(straight), weights_of(adam)):  # the mean of the last one
    np.testing.assert_allclose(a, b, atol=1e-6)
  averaging.average_into_model(adam.model, checkpoints_of(tmp_path / "straight")[-2:])
  assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(weights_of(straight),
                                                         weights_of(adam)))
  record = init_from.initialize(adam.model, str(tmp_path / "straight"))
  assert record["optimizer"] == "fresh"
  for a, b in zip(weights_of(straight), weights_of(adam)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  with pytest.raises(errors.CheckpointError, match="another --optimizer"):
    init_from.initialize(adam.model, str(tmp_path / "straight"), optimizer=adam.optimizer)
  other = Trainer(MODEL, TrainConfig(optimizer="adafactor"))
  record = init_from.initialize(other.model, str(tmp_path / "straight"),
                                optimizer=other.optimizer)
  assert record["optimizer"] == "kept" and record["step"] == 8


def constant_update(trainer, unscaled):
  """The weight change of one `Trainer._apply` of the gradient `unscaled` for every
  weight (times the loss scale under mixed float16, as the trainer's gradients are)."""
  scale = (trainer.optimizer.dynamic_scale
           if isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer) else 1.0)

  @tf.function
  def step():
    def replica():
      return trainer._apply([tf.ones_like(v) * unscaled * tf.cast(scale, v.dtype)
                             for v in trainer.model.trainable_variables])
    trainer.strategy.run(replica)
  before = [np.asarray(v) for v in trainer.model.trainable_variables]
  step()
  return np.concatenate([(np.asarray(v) - b).ravel()
                         for v, b in zip(trainer.model.trainable_variables, before)])


@pytest.mark.parametrize("optimizer", ["adam", "adafactor"])
def test_clipping_measures_the_unscaled_gradient_under_mixed_float16(optimizer):
  """The loss-scaled gradient of mixed float16 is clipped by the norm of the unscaled
  one: the same update as float32's for the same gradient (clipping the scaled one to
  the norm would shrink Adam's update, linear in the gradient at this epsilon, by the
  loss scale). Adafactor's update hardly depends on the gradient's scale: for it this
  shows the loss-scaled path runs and matches."""
  moved = []
  for dtype in ("float32", "mixed_float16"):
    keras.utils.set_random_seed(0)
    config = TrainConfig(optimizer=optimizer, clip_grad_norm=1e-2, learning_rate=1e4,
                         learning_rate_warmup_steps=1, adam_epsilon=1e3)
    trainer = Trainer(dataclasses.replace(MODEL, dtype=dtype), config)
    moved.append(constant_update(trainer, 1.0))
  norms = [np.linalg.norm(m) for m in moved]
  print(f"{optimizer}: update norms float32 {norms[0]:.4e}, mixed_float16 {norms[1]:.4e}")
  assert norms[0] > 0
  np.testing.assert_allclose(moved[1], moved[0], rtol=1e-3, atol=1e-9)


def checkpoints_of(model_dir):
  return tf.train.get_checkpoint_state(str(model_dir)).all_model_checkpoint_paths


def test_a_restart_with_another_optimizer_is_refused(tmp_path):
  """The optimizer's state is in every checkpoint: resuming Adam's moments as
  Adafactor's factors (or the reverse) cannot work, so the restart is refused naming
  --optimizer, as a model-shape flag is; a model directory written before --optimizer
  existed was trained with Adam."""
  model_dir = str(tmp_path / "m")
  modeldir.write_or_check_config(model_dir, MODEL, train=TrainConfig())
  modeldir.write_or_check_config(model_dir, MODEL, train=TrainConfig(clip_grad_norm=1.0))
  with pytest.raises(errors.ModelDirError,
                     match=r"--optimizer: saved 'adam', requested 'adafactor'") as error:
    modeldir.write_or_check_config(model_dir, MODEL, train=TrainConfig(optimizer="adafactor"))
  print(error.value)
  old = str(tmp_path / "old")  # no optimizer recorded: Adam
  modeldir.write_or_check_config(old, MODEL, train={"learning_rate": 1.0})
  with pytest.raises(errors.ModelDirError, match=r"--optimizer: saved 'adam'"):
    modeldir.write_or_check_config(old, MODEL, train=TrainConfig(optimizer="adafactor"))


def test_the_model_card_names_the_optimizer():
  """An export's card says how the weights were optimised: Adafactor with its clip;
  Adam with its betas; a run recorded before --optimizer existed: Adam."""
  from t2t_keras.trained import model_card  # pylint: disable=import-outside-toplevel
  adafactor = model_card.training(dataclasses.asdict(
      TrainConfig(optimizer="adafactor", clip_grad_norm=1.0)))
  print(adafactor)
  assert adafactor["optimizer"] == "adafactor" and adafactor["clip_grad_norm"] == 1.0
  assert "adam_beta2" not in adafactor
  adam = model_card.training(dataclasses.asdict(TrainConfig()))
  assert adam["optimizer"] == "adam" and adam["adam_beta2"] == 0.98
  assert model_card.training({"learning_rate": 2.0}) == {"optimizer": "adam",
                                                         "learning_rate": 2.0}
  assert model_card.training(None) is None
  line = model_card.describe({"model": {}, "parameters": 1, "training": adafactor})
  assert "training: optimizer=adafactor, accum_steps=1, clip_grad_norm=1.0" in line, line


@pytest.mark.slow
def test_the_train_command_takes_the_flags_and_refuses_another_optimizer(tmp_path):
  """From the command line: flags/tiny.cfg's copy task with Adafactor and a clip,
  recorded in config.json; the same model directory rerun with --optimizer=adam stops
  before training with a message naming the flag."""
  from tests import inprocess  # pylint: disable=import-outside-toplevel
  model_dir = tmp_path / "run"

  def run(*flags):
    return inprocess.run("train", "--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}",
                         "--train_steps=3", "--save_checkpoint_steps=3", "--eval_every=1000",
                         "--log_every=1", "--show_examples=0", "--synthetic_train_size=200",
                         "--synthetic_eval_size=20", *flags)
  result = run("--optimizer=adafactor", "--clip_grad_norm=0.5")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  train = modeldir.load_run_config(str(model_dir))["train"]
  assert train["optimizer"] == "adafactor" and train["clip_grad_norm"] == 0.5
  result = run("--optimizer=adam", "--train_steps=6")
  print(result.stderr[-600:])
  assert result.returncode != 0
  assert "--optimizer: saved 'adafactor', requested 'adam'" in result.stderr + result.stdout
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-3")
