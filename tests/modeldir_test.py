"""The model directory's own files: flags.txt on any filesystem, the batch plan's key."""

import pytest
import tensorflow as tf

from t2t_keras.trained import checkpoints, modeldir
from t2t_keras.configs import DataConfig, TrainConfig


def test_flags_are_appended_through_gfile():
  """absl's append_flags_into_file uses open(), which fails on gs:// (and ram://)."""
  model_dir = "ram://flags_test/m"
  tf.io.gfile.makedirs(model_dir)
  modeldir.append_flags(model_dir, "--a=1\n")
  modeldir.append_flags(model_dir, "--a=2\n")
  with tf.io.gfile.GFile(modeldir.flags_path(model_dir)) as f:
    text = f.read()
  assert text.count("# run started") == 2 and text.index("--a=1") < text.index("--a=2")
  assert not [n for n in tf.io.gfile.listdir(model_dir) if ".tmp" in n]


def test_a_changed_batch_plan_is_said_at_restart(tmp_path):
  model_dir = str(tmp_path)
  data = DataConfig(source="synthetic")
  key = modeldir.plan_key(data, TrainConfig(), replicas=8)
  assert modeldir.check_plan(model_dir, key) is None  # first run: nothing
  tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), model_dir, 3).save(100)
  modeldir.record_plan(model_dir, key)  # with the first checkpoint
  assert modeldir.check_plan(model_dir, key) is None  # same plan
  bigger = modeldir.plan_key(data, TrainConfig(accum_steps=2), replicas=16)
  line = modeldir.check_plan(model_dir, bigger)
  assert "the batch plan changed since ckpt-100" in line
  assert "replicas 8 -> 16" in line and "accum_steps 1 -> 2" in line
  assert "not replayed" in line
  # A run with the bigger plan that failed before saving recorded nothing: the old
  # command resumes without a warning.
  assert modeldir.check_plan(model_dir, key) is None


@pytest.mark.slow
def test_checkpoint_state_outside_the_directory_is_refused(tmp_path):
  """A downloaded model directory whose `checkpoint` file names ../ or absolute paths:
  decoding would read them and a resumed training would delete them when rotating."""
  import pytest  # pylint: disable=import-outside-toplevel

  from t2t_keras import errors  # pylint: disable=import-outside-toplevel
  from t2t_keras.configs import ModelConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel
  victim = tmp_path / "other"
  victim.mkdir()
  tf.train.Checkpoint(v=tf.Variable(1.0)).write(str(victim / "ckpt-5"))
  model_dir = tmp_path / "m"
  model_dir.mkdir()
  for named in ("../other/ckpt-5", str(victim / "ckpt-5")):
    (model_dir / "checkpoint").write_text(
        f'model_checkpoint_path: "{named}"\nall_model_checkpoint_paths: "{named}"\n')
    with pytest.raises(errors.CheckpointError, match=r"names .*ckpt-5, which is outside"):
      checkpoints.choose_checkpoints(str(model_dir))
    config = TrainConfig(model_dir=str(model_dir), train_steps=2, keep_checkpoint_max=1)
    trainer = Trainer(ModelConfig(vocab_size=16, hidden_size=8, filter_size=16,
                                  num_heads=2, num_hidden_layers=1), config)
    with pytest.raises(errors.CheckpointError, match="which is outside"):
      trainer.train(lambda ctx: None, progress=lambda line: None)
    assert (victim / "ckpt-5.index").exists()
  # The ordinary case, relative names inside the directory, is accepted.
  tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(model_dir), 2).save(3)
  assert checkpoints.choose_checkpoints(str(model_dir))[0].endswith("ckpt-3")
