"""Do static shapes train as well as dynamic ones? Dev loss at equal steps on Multi30k.

With --static_shapes every batch is padded to its bucket with a fixed number of rows,
and with --static_run_steps=R the batch plan keeps one bucket (one shape) for runs of R
consecutive steps (so that one compiled TPU call of --steps_per_loop steps runs on one
shape): the model then sees R updates of one sentence length in a row, which neither
the paper nor tensor2tensor did. This runs `python -m t2t_keras.train` on Multi30k with 2
logical CPU devices (MirroredStrategy, 2 replicas) in several input configurations,
the same model, seed and number of steps, and prints the dev loss at every evaluation
and the number of programs (bucket shapes) each run compiled.

    python bench/static_shapes_quality.py [--steps=1500] [--eval_every=250] \
        [--configs=dynamic,static:1,static:10,static:100] [--work_dir=/tmp/static_q]

A config is `dynamic` or `static:R` (runs of up to R steps of one bucket). Results:
docs/training.md, Cloud TPU.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import machine, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "multi30k")

flags.DEFINE_integer("steps", 1500, "Training steps per configuration.")
flags.DEFINE_integer("eval_every", 250, "Dev evaluation interval (steps).")
flags.DEFINE_list("configs", ["dynamic", "static:1", "static:10", "static:100"],
                  "dynamic, or static:R (runs of up to R steps on one bucket).")
flags.DEFINE_integer("parallel", 3, "Configurations trained at once.")
flags.DEFINE_string("work_dir", "/tmp/static_shapes_quality", "Model directories go here.")
flags.DEFINE_list("model", ["--hidden_size=128", "--filter_size=512", "--num_heads=4",
                            "--num_hidden_layers=2", "--batch_size=1024"],
                  "Model and batch flags (smaller than the recipe, to fit a CPU).")
FLAGS = flags.FLAGS

EVAL = re.compile(r"eval at step (\d+): loss ([0-9.]+)")


def train(name: str, extra) -> dict:
  model_dir = os.path.join(FLAGS.work_dir, name.replace(":", "_"))
  shutil.rmtree(model_dir, ignore_errors=True)
  command = [sys.executable, "-m", "t2t_keras.train",
             "--flagfile=flags/multi30k_en_de.cfg", f"--model_dir={model_dir}",
             f"--train_src={DATA}/train.en", f"--train_tgt={DATA}/train.de",
             f"--dev_src={DATA}/valid.en", f"--dev_tgt={DATA}/valid.de",
             "--strategy=mirrored", "--num_logical_devices=2",
             f"--train_steps={FLAGS.steps}", "--train_minutes=0",
             f"--eval_every={FLAGS.eval_every}", "--eval_bleu_sentences=0",
             "--learning_rate_warmup_steps=500", "--save_checkpoint_minutes=1000",
             "--average_last_n=1", "--max_length=64", *FLAGS.model, *extra]
  start = time.time()
  log_path = model_dir + ".log"  # followed while it runs
  with open(log_path, "w", encoding="utf-8") as log:
    code = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                          check=False).returncode
  seconds = time.time() - start
  with open(log_path, encoding="utf-8") as log:
    text = log.read()
  if code:
    print(text[-3000:])
    raise SystemExit(f"{name} failed ({code}); see {log_path}")
  losses = {int(s): float(v) for s, v in EVAL.findall(text)}
  programs = len(re.findall(r"static shapes: bucket \[", text))
  return {"losses": losses, "seconds": seconds, "programs": programs}


def main(_):
  print(f"# {machine()}")
  def extra(name):
    if name == "dynamic":
      return []
    run = int(name.split(":")[1])
    return ["--static_shapes", f"--steps_per_loop={run}", f"--static_run_steps={run}"]

  # The configurations run side by side (each mostly traces one program per bucket,
  # single-threaded Python), --parallel at a time.
  with concurrent.futures.ThreadPoolExecutor(FLAGS.parallel) as pool:
    futures = {name: pool.submit(train, name, extra(name)) for name in FLAGS.configs}
    results = {name: future.result() for name, future in futures.items()}
  for name in FLAGS.configs:
    print(f"{name}: {results[name]}", flush=True)
  steps = sorted({s for r in results.values() for s in r["losses"]})
  rows = [[f"{s}"] + [f"{results[n]['losses'].get(s, float('nan')):.3f}"
                      for n in FLAGS.configs] for s in steps]
  rows.append(["minutes"] + [f"{results[n]['seconds'] / 60:.1f}" for n in FLAGS.configs])
  print_table(rows, ["dev loss at step"] + FLAGS.configs)


if __name__ == "__main__":
  app.run(main)
