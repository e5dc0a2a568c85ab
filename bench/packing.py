"""Packed rows against bucketed static shapes and dynamic shapes, on Multi30k.

Trains the same small model, seed and number of steps on Multi30k (1 replica) with
  dynamic   one batch per bucket, padded to its longest pair (the CPU/GPU default)
  static    --static_shapes --jit_compile: one XLA program per bucket (the TPU setting)
  packed:L  --static_shapes --packed_length=L --jit_compile: one program (`packed`:
            L = --max_length)
and prints, for each: the programs the training step was traced for (each an XLA
compile under --jit_compile), the fraction of padding in the batches it trained on
(both sides, of the first --steps batches), target tokens/s over the whole run (traces
and compiles included) and over its second half (the log windows after --steps / 2),
the host calls, and the dev loss at the last step. Results: docs/benchmarks.md.

    python bench/packing.py [--steps=600] [--configs=dynamic,static,packed,packed:128] \\
        [--data=../shared/data/multi30k] [--work_dir=/tmp/packing_bench] \\
        [--hidden_size=128] [--steps_per_loop=1]

--steps_per_loop=100 is flags/tpu.cfg's: packed runs then make a host call per 100
steps, bucketed static shapes still one a step (their calls end where the bucket
changes, every step at the default --static_run_steps=1).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import machine, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_integer("steps", 600, "Training steps per configuration.")
flags.DEFINE_list("configs", ["dynamic", "static", "packed", "packed:128"],
                  "dynamic, static, packed or packed:L.")
flags.DEFINE_string("data", os.path.join(os.path.dirname(ROOT), "shared", "data",
                                         "multi30k"),
                    "Folder with Multi30k's train.{en,de} and valid.{en,de}.")
flags.DEFINE_string("work_dir", "/tmp/packing_bench", "Vocabulary, caches and models.")
flags.DEFINE_integer("max_length", 64, "--max_length (and --packed_length when packed).")
flags.DEFINE_integer("batch_size", 1024, "Tokens per batch.")
flags.DEFINE_integer("hidden_size", 128, "d_model (d_ff is 4 times it; 2+2 layers).")
flags.DEFINE_integer("steps_per_loop", 1, "--steps_per_loop (flags/tpu.cfg: 100).")
flags.DEFINE_integer("warmup_steps", 500, "--learning_rate_warmup_steps.")
FLAGS = flags.FLAGS

RATE = re.compile(r"step (\d+)/\d+ \|.*\| ([0-9,]+) tok/s \|")


def data_config(name: str):
  from t2t_keras.configs import DataConfig  # pylint: disable=import-outside-toplevel
  return DataConfig(
      source="files", train_src=f"{FLAGS.data}/train.en", train_tgt=f"{FLAGS.data}/train.de",
      dev_src=f"{FLAGS.data}/valid.en", dev_tgt=f"{FLAGS.data}/valid.de",
      data_dir=os.path.join(FLAGS.work_dir, "data"), vocab_size=8000,
      max_length=FLAGS.max_length, batch_size=FLAGS.batch_size,
      static_shapes=name != "dynamic", packed_length=packed_length(name))


def packed_length(name: str) -> int:
  if not name.startswith("packed"):
    return 0
  return int(name.split(":")[1]) if ":" in name else FLAGS.max_length


def padding(train_fn, steps: int) -> float:
  """Fraction of PAD in the first `steps` batches, both sides."""
  if train_fn.static_shapes and not train_fn.packed_length:  # one dataset per bucket
    plan = train_fn.plan(1)
    pad = total = 0
    for step in range(steps):
      bucket, pairs = plan.unit(step)
      rows, length = train_fn.bucket_shape(bucket)
      lengths = train_fn.split.lengths[pairs[0]] + 1  # with EOS
      pad += 2 * rows * length - lengths.sum()
      total += 2 * rows * length
    return pad / total
  pad = total = 0
  for batch in train_fn().take(steps):
    for key in ("inputs", "targets"):
      ids = batch[key].numpy()
      pad += int((ids == 0).sum())
      total += ids.size
  return pad / total if total else float("nan")


def run(name: str) -> dict:
  import keras  # pylint: disable=import-outside-toplevel
  from t2t_keras.configs import ModelConfig, TrainConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel

  data = pipeline.make_datasets(data_config(name))
  model_dir = os.path.join(FLAGS.work_dir, name.replace(":", "_"))
  shutil.rmtree(model_dir, ignore_errors=True)
  model = ModelConfig(vocab_size=data.vocab_size, hidden_size=FLAGS.hidden_size,
                      filter_size=4 * FLAGS.hidden_size,
                      num_heads=4, num_hidden_layers=2, pre_norm=True)
  config = TrainConfig(model_dir=model_dir, train_steps=FLAGS.steps, train_minutes=0,
                       jit_compile=name != "dynamic",
                       learning_rate_warmup_steps=FLAGS.warmup_steps,
                       # A log line ends a host call: none between a loop's steps.
                       log_every=max(25, FLAGS.steps_per_loop), eval_every=FLAGS.steps,
                       save_checkpoint_steps=FLAGS.steps, seed=1,
                       steps_per_loop=FLAGS.steps_per_loop)
  keras.utils.set_random_seed(1)
  trainer = Trainer(model, config)
  lines = []
  start = time.time()
  result = trainer.train(data.train_fn, data.eval_fn, progress=lines.append)
  seconds = time.time() - start
  late = [float(rate.replace(",", "")) for step, rate in RATE.findall("\n".join(lines))
          if int(step) > FLAGS.steps // 2]
  programs = len(trainer._compute_gradients._list_all_concrete_functions())  # pylint: disable=protected-access
  return {"programs": programs, "padding": padding(data.train_fn, FLAGS.steps),
          "tok/s": result.target_tokens / result.wall_seconds,
          "tok/s late": statistics.median(late), "seconds": seconds,
          "train seconds": result.wall_seconds, "host calls": result.host_calls,
          "dev loss": result.eval_metrics.get("loss", float("nan"))}


def main(_):
  print(f"# {machine()}", flush=True)
  results = {}
  for name in FLAGS.configs:
    results[name] = run(name)
    print(f"{name}: {results[name]}", flush=True)
  rows = [[name, str(r["programs"]), f"{100 * r['padding']:.2f}%", f"{r['tok/s']:,.0f}",
           f"{r['tok/s late']:,.0f}", f"{r['train seconds']:.0f}", str(r["host calls"]),
           f"{r['dev loss']:.3f}"]
          for name, r in results.items()]
  print_table(rows, ["input", "programs traced", "padding", "target tok/s (run)",
                     "tok/s (2nd half)", "train s", "host calls", f"dev loss @ {FLAGS.steps}"])


if __name__ == "__main__":
  app.run(main)
