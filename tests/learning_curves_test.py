"""Learning curves read back from TensorBoard event files, also while a run writes them."""

import os

import tensorflow as tf

from t2t_keras import learning_curves


def write_losses(log_dir, count):
  writer = tf.summary.create_file_writer(str(log_dir))
  with writer.as_default():
    for step in range(count):
      tf.summary.scalar("loss", 1.0 / (step + 1), step=step)
  writer.close()


def test_scalars_come_back_by_tag_and_step(tmp_path):
  write_losses(tmp_path, 4)
  scalars = learning_curves.read_scalars(str(tmp_path))
  assert [step for step, _ in scalars["loss"]] == [0, 1, 2, 3]
  assert abs(scalars["loss"][2][1] - 1 / 3) < 1e-6
  assert learning_curves.read_scalars(str(tmp_path / "absent")) == {}


def test_a_half_written_last_record_keeps_the_curve_before_it(tmp_path):
  write_losses(tmp_path, 4)
  (name,) = [n for n in os.listdir(tmp_path) if "tfevents" in n]
  path = tmp_path / name
  path.write_bytes(path.read_bytes()[:-7])  # a live run, caught mid-write
  scalars = learning_curves.read_scalars(str(tmp_path))
  assert [step for step, _ in scalars["loss"]] == [0, 1, 2]
