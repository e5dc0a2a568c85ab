"""Adam's update: Keras' ops against the fused kernel `--optimizer=adam` uses.

    python bench/adam_update.py [--sizes=tiny,demo,base] [--repeats=3] [--steps=20]

For each model size the train loop of `Trainer` (one replica, float32, random ids of a
fixed shape) is built and run in a fresh process, once with
`t2t_keras.training.optimizers.Adam` (each weight's update in one ResourceApplyAdam op)
and once with Keras' own update (`keras.optimizers.Adam`'s ops, swapped into the same
class), the two taking turns --repeats times. Prints the time to the end of the first
call (building the model and optimizer, tracing the loop, the first steps: what every
training start and every test that trains pays) and the time per step after it,
medians over the runs. Sizes: tiny (2+2 layers, d_model 32, 24 ids, 512 tokens a
step: the tests' models), demo (flags/demo.cfg's model, 1,536 tokens), base (the
paper's base model, 8,000 ids, 2,048 tokens).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import machine, print_table  # noqa: E402

flags.DEFINE_list("sizes", ["tiny", "demo", "base"], "Model sizes: tiny, demo, base.")
flags.DEFINE_integer("repeats", 3, "Runs of each (size, update); the median counts.")
flags.DEFINE_integer("steps", 20, "Timed steps after the first call (of 2 steps).")
flags.DEFINE_string("child", None, "Internal: size,update to measure in this process.")
FLAGS = flags.FLAGS

# (layers, d_model, d_ff, heads, vocabulary, sentences, tokens a sentence)
SIZES = {"tiny": (2, 32, 64, 4, 24, 64, 8), "demo": (2, 64, 256, 4, 24, 128, 12),
         "base": (6, 512, 2048, 8, 8000, 64, 32)}


def measure(size: str, update: str) -> dict:
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  from t2t_keras.configs import ModelConfig, TrainConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.training import optimizers  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel
  if update == "keras":
    optimizers.Adam._distributed_tf_update_step = (  # pylint: disable=protected-access
        keras.optimizers.Adam._distributed_tf_update_step)  # pylint: disable=protected-access
  imported = time.perf_counter()
  layers, d_model, d_ff, heads, vocab, rows, length = SIZES[size]
  keras.utils.set_random_seed(0)
  trainer = Trainer(ModelConfig(vocab_size=vocab, hidden_size=d_model, filter_size=d_ff,
                                num_heads=heads, num_hidden_layers=layers), TrainConfig())
  rng = np.random.default_rng(0)
  batch = {k: tf.constant(rng.integers(4, vocab, (rows, length)), tf.int32)
           for k in ("inputs", "targets")}
  iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
  loop = tf.function(trainer._train_loop)  # pylint: disable=protected-access
  float(loop(iterator, tf.constant(2))[0])
  first = time.perf_counter()
  float(loop(iterator, tf.constant(FLAGS.steps))[0])
  end = time.perf_counter()
  return {"first_call_s": first - imported, "step_ms": (end - first) / FLAGS.steps * 1e3}


def main(argv):
  del argv
  if FLAGS.child:
    print(json.dumps(measure(*FLAGS.child.split(","))))
    return
  print(machine())
  rows = []
  for size in FLAGS.sizes:
    runs = {"keras": [], "fused": []}
    for _ in range(FLAGS.repeats):
      for update in runs:
        out = subprocess.run([sys.executable, __file__, f"--child={size},{update}",
                              f"--steps={FLAGS.steps}"], capture_output=True, text=True,
                             check=True)
        runs[update].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  {size} {update}: {runs[update][-1]}", flush=True)
    med = {u: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
           for u, rs in runs.items()}
    rows.append([size, f"{med['keras']['first_call_s']:.2f}", f"{med['fused']['first_call_s']:.2f}",
                 f"{med['keras']['step_ms']:.1f}", f"{med['fused']['step_ms']:.1f}",
                 f"{med['keras']['step_ms'] / med['fused']['step_ms']:.2f}x"])
  print_table(rows, ["size", "first call, Keras (s)", "first call, fused (s)",
                     "step, Keras (ms)", "step, fused (ms)", "step speed-up"])


if __name__ == "__main__":
  app.run(main)
