"""The model directory's own files: flags.txt on any filesystem, the batch plan's key."""

import tensorflow as tf

from t2t_keras import modeldir
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
  assert modeldir.check_plan(model_dir, key, write=True) is None  # first run: nothing
  tf.train.Checkpoint(v=tf.Variable(1.0)).write(f"{model_dir}/ckpt-100")
  tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), model_dir, 3).save(100)
  assert modeldir.check_plan(model_dir, key, write=True) is None  # same plan
  bigger = modeldir.plan_key(data, TrainConfig(accum_steps=2), replicas=16)
  line = modeldir.check_plan(model_dir, bigger, write=True)
  assert "the batch plan changed since ckpt-100" in line
  assert "replicas 8 -> 16" in line and "accum_steps 1 -> 2" in line
  assert "not replayed" in line
  assert modeldir.check_plan(model_dir, bigger, write=False) is None  # recorded
