"""Seconds from restart to the first new training step, at step 1k, 10k and 100k.

A preempted run restarts from its latest checkpoint and must restore its data position
before it trains again. For each step N this builds the demo's model and data
(flags/demo.cfg), saves a checkpoint numbered N (the step counter set to N, without
training N steps), and times `Trainer.train` from that checkpoint to step N + 1:
restore, data position, the first step's trace and the step itself.

  .venv/bin/python bench/resume_time.py [--steps=1000,10000,100000] [--replay]

--replay wraps the data function so the trainer cannot seek and skips the batches of
the first N steps instead, as every run did before the batch plan (t2t_keras.data.batching.plan).
Run from another checkout (PYTHONPATH=that/checkout) to measure older code.
"""

import os
import shutil
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
if os.environ.get("PYTHONPATH"):  # another checkout's t2t_keras first
  sys.path.insert(0, os.environ["PYTHONPATH"].split(os.pathsep)[0])

from bench import common  # noqa: E402  (sets TF_CPP_MIN_LOG_LEVEL)
from t2t_keras import flags as t2t_flags  # noqa: E402

flags.DEFINE_list("steps", ["1000", "10000", "100000"], "Steps to resume at.")
flags.DEFINE_boolean("replay", False, "Skip batches instead of seeking.")
FLAGS = flags.FLAGS
t2t_flags.define_all()


def resume_seconds(step: int) -> float:
  # pylint: disable=import-outside-toplevel
  import dataclasses

  import keras
  import tensorflow as tf

  from t2t_keras import data
  from t2t_keras.training import distribute
  from t2t_keras.training.trainer import Trainer

  data_config = t2t_flags.data_config()
  datasets = data.make_datasets(data_config)
  model_config = t2t_flags.model_config(vocab_size=datasets.vocab_size)
  model_dir = tempfile.mkdtemp(prefix=f"resume{step}-")
  config = dataclasses.replace(t2t_flags.train_config(), model_dir=model_dir,
                               train_steps=step + 1, log_every=1, eval_every=10**9,
                               save_checkpoint_steps=10**9, steps_per_loop=1)
  keras.utils.set_random_seed(1)
  trainer = Trainer(model_config, config, distribute.create_strategy(config))
  trainer.optimizer.iterations.assign(step)
  tf.train.CheckpointManager(trainer.checkpoint(), model_dir, 1).save(step)

  fn = datasets.train_fn
  if FLAGS.replay:
    fn = lambda ctx: datasets.train_fn(ctx)  # noqa: E731  (no start_step: replayed)
  restarted = Trainer(model_config, config, distribute.create_strategy(config))
  start = time.perf_counter()
  try:
    result = restarted.train(fn, progress=lambda line: None)
    seconds = time.perf_counter() - start
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  assert result.steps == step + 1, result.steps
  return seconds


def main(argv):
  del argv
  os.chdir(REPO)
  FLAGS(["resume_time", "--flagfile=flags/demo.cfg"], known_only=True)
  print(f"{common.machine()}; {'replay' if FLAGS.replay else 'seek'}")
  rows = []
  for step in (int(s) for s in FLAGS.steps):
    rows.append((step, f"{resume_seconds(step):.1f}"))
    print(f"step {rows[-1][0]}: {rows[-1][1]} s to the first new step", flush=True)
  common.print_table(rows, ["resume at step", "seconds"])


if __name__ == "__main__":
  app.run(main)
