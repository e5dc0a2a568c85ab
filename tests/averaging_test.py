"""Checkpoint averaging: the average equals the mean of the weights; clear refusals."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.trained import checkpoints, modeldir
from t2t_keras.inference import loading
from t2t_keras.configs import DataConfig, ModelConfig
from t2t_keras.model import create_model
from t2t_keras.trained import averaging
from t2t_keras.errors import CheckpointError, ModelDirError
from tests.conftest import REPO_ROOT

MODEL = ModelConfig(vocab_size=24, hidden_size=16, filter_size=32, num_heads=2,
                    num_hidden_layers=1)
STEPS = (10, 20, 30)


def write_run(model_dir, config=MODEL, steps=STEPS, seed=0):
  """A model directory as training leaves it: config.json, vocabulary files and
  checkpoints of model AND optimizer (whose slots must not be averaged in), each with
  different random weights. As in the trainer, the optimizer tracks the model's
  variables, so TensorFlow stores most of them under optimizer/... names."""
  keras.utils.set_random_seed(seed)
  rng = np.random.default_rng(seed)
  modeldir.write_or_check_config(model_dir, config,
                                    data=DataConfig(source="synthetic",
                                                    synthetic_vocab_size=20))
  for name in ("vocab.model", "vocab.vocab"):
    with open(os.path.join(model_dir, name), "wb") as f:
      f.write(b"made-up vocabulary " + name.encode())
  model = create_model(config)
  optimizer = keras.optimizers.Adam()
  optimizer.build(model.trainable_variables)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=model, optimizer=optimizer), model_dir, max_to_keep=10)
  for step in steps:
    for variable in model.weights + optimizer.variables:
      if "float" in str(variable.dtype):
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    manager.save(checkpoint_number=step)
  return model_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  return write_run(str(tmp_path_factory.mktemp("run")))


def weights_of(path, config=MODEL):
  """The model weights of a checkpoint, read through TensorFlow's restore (independent
  of the averaging module's object-graph walk)."""
  model = create_model(config)
  tf.train.Checkpoint(model=model).restore(path).expect_partial()
  return [np.asarray(w) for w in model.weights]


def mean_weights(paths):
  per_checkpoint = [weights_of(p) for p in paths]
  return [np.mean(np.stack(ws).astype(np.float64), axis=0) for ws in zip(*per_checkpoint)]


def assert_weights(model, expected):
  assert len(model.weights) == len(expected)
  for got, want in zip(model.weights, expected):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


def test_written_average_is_the_mean_of_the_weights(run_dir, tmp_path):
  paths = checkpoints.checkpoint_paths(run_dir)
  assert [os.path.basename(p) for p in paths] == ["ckpt-10", "ckpt-20", "ckpt-30"]
  expected = mean_weights(paths[-2:])
  # The property would hold trivially if the checkpoints were equal.
  assert not np.allclose(expected[0], weights_of(paths[-1])[0])

  out = str(tmp_path / "avg")
  written = averaging.write_averaged(run_dir, out, last_n=2)
  assert written == os.path.join(out, "ckpt-30")  # numbered by the newest step
  assert tf.train.latest_checkpoint(out) == written
  fresh = create_model(MODEL)
  tf.train.Checkpoint(model=fresh).restore(written).assert_consumed()
  assert_weights(fresh, expected)

  # Only model weights: no optimizer slots, iterations or learning-rate state.
  names = [name for name, _ in tf.train.list_variables(written)]
  assert not [n for n in names if n.startswith("optimizer")]
  values = [n for n in names if n.endswith("VARIABLE_VALUE") and n.startswith("model/")]
  assert len(values) == len(fresh.weights)

  # The directory serves as a --model_dir: config and vocabulary came along.
  for name in ("config.json", "vocab.model", "vocab.vocab"):
    with open(os.path.join(run_dir, name), "rb") as a, \
        open(os.path.join(out, name), "rb") as b:
      assert a.read() == b.read()
  loaded = loading.load(out)
  assert loaded.checkpoints == [written]
  assert_weights(loaded.model, expected)


def test_average_checkpoints_names_match_the_written_checkpoint(run_dir, tmp_path):
  means = averaging.average_checkpoints(run_dir, 3)
  assert len(means) == len(create_model(MODEL).weights)
  assert all(v.dtype == np.float32 for v in means.values())
  reader = tf.train.load_checkpoint(
      averaging.write_averaged(run_dir, str(tmp_path / "avg"), last_n=3))
  for name, value in means.items():
    np.testing.assert_array_equal(reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE"),
                                  value)


def test_average_into_model_in_memory(run_dir):
  paths = checkpoints.checkpoint_paths(run_dir)
  keras.utils.set_random_seed(9)
  model = create_model(MODEL)
  averaging.average_into_model(model, paths)
  assert_weights(model, mean_weights(paths))
  # The path decode and export take with --average_last_n.
  loaded = loading.load(run_dir, average_last_n=3)
  for a, b in zip(loaded.model.weights, model.weights):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_other_shapes_are_refused_naming_checkpoint_variable_and_shapes(tmp_path):
  wide = ModelConfig(**{**MODEL.__dict__, "vocab_size": 30})
  a = checkpoints.checkpoint_paths(write_run(str(tmp_path / "a"), steps=(1,)))[0]
  b = checkpoints.checkpoint_paths(write_run(str(tmp_path / "b"), wide, steps=(2,)))[0]
  with pytest.raises(CheckpointError) as error:
    averaging.average_checkpoints([a, b])
  message = str(error.value)
  assert b in message and "model/source_embedding/embeddings" in message
  assert "(30, 16)" in message and "(24, 16)" in message and a in message
  with pytest.raises(CheckpointError, match=r"ckpt-2 .*embeddings has shape \(30, 16\) "
                     r"there but \(24, 16\) in the model"):
    averaging.average_into_model(create_model(MODEL), [b])


def test_other_variable_sets_are_refused_naming_the_variables(tmp_path):
  deeper = ModelConfig(**{**MODEL.__dict__, "num_hidden_layers": 2})
  a = checkpoints.checkpoint_paths(write_run(str(tmp_path / "a"), steps=(1,)))[0]
  b = checkpoints.checkpoint_paths(write_run(str(tmp_path / "b"), deeper, steps=(2,)))[0]
  with pytest.raises(CheckpointError, match=r"ckpt-2 belongs to another model: it has \d+ "
                     r"variable\(s\) that .*ckpt-1 lacks: model/decoder_layer_1"):
    averaging.average_checkpoints([a, b])
  with pytest.raises(CheckpointError, match=r"ckpt-1 belongs to another model: it lacks "
                     r"\d+ variable\(s\) that the model .* has: model/decoder_layer_1"):
    averaging.average_into_model(create_model(deeper), [a])


def test_refusals_say_what_exists(run_dir, tmp_path):
  with pytest.raises(CheckpointError, match=r"last 4 checkpoints: .* holds 3 checkpoint\(s\) "
                     r"\(ckpt-10, ckpt-20, ckpt-30\)"):
    averaging.average_checkpoints(run_dir, 4)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ModelDirError, match="holds no checkpoint"):
    averaging.write_averaged(str(empty), str(tmp_path / "out"), 1)
  with pytest.raises(ModelDirError, match="does not exist"):
    averaging.average_checkpoints(str(tmp_path / "missing"), 1)
  with pytest.raises(ModelDirError, match="--output_dir is --model_dir"):
    averaging.write_averaged(run_dir, run_dir, 2)
  other = write_run(str(tmp_path / "other"))
  with pytest.raises(ModelDirError, match=r"already holds checkpoints \(ckpt-10, ckpt-20, "
                     r"ckpt-30\).*--overwrite"):
    averaging.write_averaged(run_dir, other, 2)
  written = averaging.write_averaged(run_dir, other, 2, overwrite=True)
  assert checkpoints.checkpoint_paths(other) == [written]


def run_tool(*args):
  return subprocess.run(
      [sys.executable, os.path.join("tools", "average_checkpoints.py"), *args],
      capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


@pytest.mark.slow
def test_cli_writes_a_restorable_directory_and_reports_errors(run_dir, tmp_path):
  out = str(tmp_path / "cli_avg")
  result = run_tool(f"--model_dir={run_dir}", f"--output_dir={out}", "--last_n=3")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"wrote {os.path.join(out, 'ckpt-30')}" in result.stdout
  fresh = create_model(MODEL)
  tf.train.Checkpoint(model=fresh).restore(tf.train.latest_checkpoint(out)).assert_consumed()
  assert_weights(fresh, mean_weights(checkpoints.checkpoint_paths(run_dir)))

  result = run_tool(f"--model_dir={run_dir}", f"--output_dir={tmp_path / 'x'}",
                    "--last_n=7")
  assert result.returncode == 1
  assert "error: cannot average the last 7 checkpoints" in result.stderr
  assert "holds 3 checkpoint(s)" in result.stderr and "Traceback" not in result.stderr
