"""The train loop's first call (trace, graph optimisation or XLA compile, one step) by
--accum_steps: does the program grow with the micro-batches per update?

    python bench/accum_compile.py [--accum=1,4] [--modes=graph,xla] [--repeats=3]
        [--code=DIR]

For each mode and accumulation, a fresh process builds flags/demo.cfg's model (2+2
layers, d_model 64, learned positions, pre-norm) and `Trainer`'s train loop on one
replica, with micro-batches of 128 x 12 random ids, and times the loop's first call
(n=1 step) and the fastest of 3 later calls. Modes: graph (the loop as `Trainer.train`
runs it: `tf.function` without XLA, the trace timed apart from the first call, which
lowers, inlines and optimises the graph), xla (the loop compiled whole with
`jit_compile=True`, as a TPU compiles `strategy.run`'s step; the iterator replaced by
the batch's tensors, which XLA cannot take). `--code=DIR`: the children import
t2t_keras from DIR (an older checkout, e.g. `git archive REV t2t_keras | tar -x -C DIR`),
to measure before and after a change. Prints medians over --repeats runs.
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

flags.DEFINE_list("accum", ["1", "4"], "--accum_steps values to compare.")
flags.DEFINE_list("modes", ["graph", "xla"], "graph (Trainer.train's loop) and/or xla "
                  "(the loop compiled whole, as on a TPU).")
flags.DEFINE_integer("repeats", 3, "Fresh processes per (mode, accum); the median counts.")
flags.DEFINE_string("code", None, "Directory holding the t2t_keras package to measure "
                    "(default: this checkout's).")
flags.DEFINE_string("child", None, "Internal: mode,accum to measure in this process.")
FLAGS = flags.FLAGS


class _Repeating:
  """The iterator the xla mode hands the loop: the same batch at every `next`."""

  def __init__(self, batch):
    self.batch = batch

  def __next__(self):
    return self.batch


def measure(mode: str, accum: int) -> dict:
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  from t2t_keras.configs import ModelConfig, TrainConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel
  keras.utils.set_random_seed(0)
  model = ModelConfig(vocab_size=24, hidden_size=64, filter_size=256, num_heads=4,
                      num_hidden_layers=2, layer_prepostprocess_dropout=0.0, pre_norm=True,
                      position_embedding="learned", max_position=16)
  trainer = Trainer(model, TrainConfig(accum_steps=accum, learning_rate_warmup_steps=4))
  rng = np.random.default_rng(0)
  batch = {k: tf.constant(rng.integers(4, 24, (128, 12)), tf.int32)
           for k in ("inputs", "targets")}
  # pylint: disable=protected-access
  trace = 0.0
  if mode == "graph":
    iterator = iter(trainer.strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.from_tensors(batch).repeat()))
    loop = tf.function(trainer._train_loop, autograph=False)
    start = time.perf_counter()
    loop.get_concrete_function(iterator, tf.constant(1))
    trace = time.perf_counter() - start
    def call():
      return [float(v) for v in loop(iterator, tf.constant(1))]
  else:
    loop = tf.function(lambda b, n: trainer._train_loop(_Repeating(b), n), autograph=False,
                       jit_compile=True)
    def call():
      return [float(v) for v in loop(batch, tf.constant(1))]
  start = time.perf_counter()
  call()
  first = time.perf_counter() - start
  later = []
  for _ in range(3):
    start = time.perf_counter()
    call()
    later.append(time.perf_counter() - start)
  import t2t_keras  # pylint: disable=import-outside-toplevel
  return {"trace_s": trace, "first_call_s": first, "step_s": min(later),
          "code": os.path.dirname(os.path.dirname(t2t_keras.__file__))}


def main(argv):
  del argv
  if FLAGS.child:
    mode, accum = FLAGS.child.split(",")
    if FLAGS.code:  # ahead of this checkout, which the top of this file put first
      sys.path.insert(0, os.path.abspath(FLAGS.code))
    print(json.dumps(measure(mode, int(accum))))
    return
  print(machine())
  rows = []
  for mode in FLAGS.modes:
    runs = {accum: [] for accum in FLAGS.accum}
    for _ in range(FLAGS.repeats):
      for accum in runs:
        code = [f"--code={FLAGS.code}"] if FLAGS.code else []
        out = subprocess.run([sys.executable, __file__, f"--child={mode},{accum}"] + code,
                             capture_output=True, text=True, check=True)
        runs[accum].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  {mode} accum {accum}: {runs[accum][-1]}", flush=True)
    for accum, results in runs.items():
      med = {k: statistics.median(r[k] for r in results)
             for k in ("trace_s", "first_call_s", "step_s")}
      rows.append([mode, accum, f"{med['trace_s']:.2f}", f"{med['first_call_s']:.2f}",
                   f"{med['step_s']:.3f}"])
  print_table(rows, ["mode", "accum", "trace (s)", "first call (s)", "later call (s)"])


if __name__ == "__main__":
  app.run(main)
