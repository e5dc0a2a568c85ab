"""Training throughput of Transformer base on this machine: target tokens/s and MFU.

Transformer base (6+6 layers, d_model 512, d_ff 2048, 8 heads), shared 32,000
vocabulary, 64 sentence pairs x 32 tokens on each side per step, random ids; float32
and bfloat16 (mixed: float32 variables), with and without XLA. Prints target tokens/s
and the ratio of achieved matmul FLOP/s to the machine's measured matmul peak of the
matching precision. Each configuration is timed `--repeats` times (`--steps` steps
each) and the median is reported: on a shared machine single timings vary by +-30%.

    python bench/train_throughput.py [--steps=5] [--repeats=3] [--configs=float32,...]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import machine, matmul_peak, print_table  # noqa: E402

flags.DEFINE_integer("steps", 5, "Steps per timed run (after 2 warm-up steps).")
flags.DEFINE_integer("repeats", 3, "Timed runs per configuration; the median is reported.")
flags.DEFINE_list("configs", ["float32", "float32+xla", "bfloat16", "bfloat16+xla"],
                  "Configurations: dtype[+xla].")
flags.DEFINE_integer("batch", 64, "Sentence pairs per step.")
flags.DEFINE_integer("length", 32, "Tokens per sentence on each side.")
flags.DEFINE_integer("vocab_size", 32000, "Shared vocabulary size.")
FLAGS = flags.FLAGS


def measure(dtype: str, xla: bool):
  import keras  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  from t2t_keras.configs import ModelConfig, TrainConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.training import flops  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel

  keras.utils.set_random_seed(0)
  model_config = ModelConfig(vocab_size=FLAGS.vocab_size, dtype=dtype)
  trainer = Trainer(model_config, TrainConfig(jit_compile=xla))
  rng = np.random.default_rng(0)
  batch = {k: tf.constant(rng.integers(4, FLAGS.vocab_size, (FLAGS.batch, FLAGS.length)),
                          tf.int32) for k in ("inputs", "targets")}
  iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
  loop = tf.function(trainer._train_loop)  # pylint: disable=protected-access
  float(loop(iterator, tf.constant(2))[0])  # compile + warm up
  runs = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    float(loop(iterator, tf.constant(FLAGS.steps))[0])
    runs.append((time.perf_counter() - start) / FLAGS.steps)
  print(f"  {dtype}{'+xla' if xla else ''} s/step per run: "
        + " ".join(f"{r:.2f}" for r in runs), flush=True)
  seconds = statistics.median(runs)
  step_flops = flops.train_flops(model_config, FLAGS.batch, FLAGS.length, FLAGS.length)
  return FLAGS.batch * FLAGS.length / seconds, step_flops / seconds, seconds


def main(argv):
  del argv
  print(f"machine: {machine()}")
  peaks = {"float32": matmul_peak("float32"), "bfloat16": matmul_peak("bfloat16")}
  for name, peak in peaks.items():
    print(f"measured {name} matmul peak: {peak / 1e9:.1f} GFLOP/s")
  rows = []
  for config in FLAGS.configs:
    dtype, _, xla = config.partition("+")
    tokens, flop_rate, seconds = measure(dtype, xla == "xla")
    rows.append((config, f"{seconds:.2f}", f"{tokens:,.0f}", f"{flop_rate / 1e9:.1f}",
                 f"{flop_rate / peaks[dtype]:.2f}"))
    print(f"{config}: {tokens:,.0f} target tokens/s", flush=True)
  print()
  print_table(rows, ["config", "s/step", "target tok/s", "GFLOP/s", "ratio to peak"])


if __name__ == "__main__":
  app.run(main)
