"""Runs a translation recipe end to end under a training-time budget.

  python tools/run_recipe.py --recipe=flags/multi30k_en_de.cfg --model_dir=/tmp/m30k \
      --test_src=../shared/data/multi30k/test2016.en \
      --test_ref=../shared/data/multi30k/test2016.de [--train_minutes=60]

1. trains: `python -m t2t_keras.train --flagfile=<recipe> --model_dir=...` with
   `--train_minutes` (training stops with a checkpoint when the budget is spent; dev
   evaluation is not counted); a model_dir that already trained resumes;
2. decodes the test set with the recipe's decoding flags (beam, alpha) from the
   average of the last `--average_last_n` checkpoints;
3. prints sacreBLEU (cased, default tokenization) with its signature and chrF, and
   writes `<model_dir>/results.json` (recipe, steps, training minutes, wall times,
   machine, scores, the commands run).

Extra flags after `--` go to both training and decoding, e.g. `-- --seed=2`.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_string("recipe", None, "The recipe's flagfile, e.g. flags/multi30k_en_de.cfg.")
flags.DEFINE_string("model_dir", None, "Where the run's checkpoints, logs and results go.")
flags.DEFINE_string("test_src", None, "Test source sentences, one per line.")
flags.DEFINE_string("test_ref", None, "Test reference translations, line-aligned.")
flags.DEFINE_float("train_minutes", None,
                   "Training-time budget in minutes (default: the recipe's).")
flags.DEFINE_integer("average_last_n", 5, "Checkpoints averaged for decoding (1 = last).",
                     lower_bound=1)
flags.DEFINE_boolean("skip_training", False, "Only decode and score an existing run.")
flags.mark_flags_as_required(["recipe", "model_dir", "test_src", "test_ref"])
FLAGS = flags.FLAGS


def run(command, log_path: str) -> float:
  """Runs `command`, teeing its output to `log_path`; returns the wall seconds."""
  print("+ " + " ".join(shlex.quote(c) for c in command), flush=True)
  start = time.time()
  with open(log_path, "a", encoding="utf-8") as log, subprocess.Popen(
      command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      cwd=os.getcwd()) as process:
    for line in process.stdout:
      log.write(line)
      # TF's C++ start-up chatter stays in the log only.
      if not re.match(r"^[IWE]\d{4} |^WARNING: All log messages|^To enable the", line):
        sys.stdout.write(line)
        sys.stdout.flush()
  if process.returncode:
    print(f"error: {command[2]} failed with exit code {process.returncode}; its output is "
          f"in {log_path}", file=sys.stderr)
    sys.exit(process.returncode)
  return time.time() - start


def main(argv):
  extra = argv[1:]
  for path, flag in ((FLAGS.recipe, "--recipe"), (FLAGS.test_src, "--test_src"),
                     (FLAGS.test_ref, "--test_ref")):
    if not os.path.isfile(path):
      raise app.UsageError(f"{flag}={path} does not exist (paths are relative to the "
                           f"current directory, {os.getcwd()}).")
  os.makedirs(FLAGS.model_dir, exist_ok=True)
  python = sys.executable
  common = [f"--flagfile={FLAGS.recipe}", f"--model_dir={FLAGS.model_dir}"] + extra
  train_cmd = [python, "-m", "t2t_keras.train"] + common
  if FLAGS.train_minutes is not None:
    train_cmd.append(f"--train_minutes={FLAGS.train_minutes:g}")
  hypotheses = os.path.join(FLAGS.model_dir, "test.hyp")
  decode_cmd = [python, "-m", "t2t_keras.decode"] + common + [
      f"--average_last_n={FLAGS.average_last_n}", f"--input_file={FLAGS.test_src}",
      f"--output_file={hypotheses}", f"--reference_file={FLAGS.test_ref}"]
  train_wall = 0.0
  if not FLAGS.skip_training:
    train_wall = run(train_cmd, os.path.join(FLAGS.model_dir, "train.log"))
  decode_wall = run(decode_cmd, os.path.join(FLAGS.model_dir, "decode.log"))

  # pylint: disable=import-outside-toplevel
  from t2t_keras import metrics, modeldir
  from t2t_keras.learning_curves import read_scalars
  with open(hypotheses, encoding="utf-8") as f:
    hyps = [line.rstrip("\n") for line in f]
  with open(FLAGS.test_ref, encoding="utf-8") as f:
    refs = [line.rstrip("\n") for line in f]
  report = metrics.bleu_report(hyps, [refs])
  ev = read_scalars(modeldir.logs_dir(FLAGS.model_dir, "eval"))
  steps = ev["train_minutes"][-1][0] if ev.get("train_minutes") else None
  train_minutes = ev["train_minutes"][-1][1] if ev.get("train_minutes") else None
  results = {
      "recipe": FLAGS.recipe,
      "model_dir": FLAGS.model_dir,
      "steps": steps,
      "train_minutes": train_minutes,
      "train_wall_minutes": train_wall / 60,
      "decode_wall_minutes": decode_wall / 60,
      "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
      "test_src": FLAGS.test_src,
      "test_ref": FLAGS.test_ref,
      "average_last_n": FLAGS.average_last_n,
      "bleu": report["bleu"],
      "bleu_signature": report["bleu_signature"],
      "bleu_uncased": report["bleu_uncased"],
      "chrf": report["chrf"],
      "chrf_signature": report["chrf_signature"],
      "commands": [" ".join(shlex.quote(c) for c in cmd)
                   for cmd in ([] if FLAGS.skip_training else [train_cmd]) + [decode_cmd]],
  }
  with open(os.path.join(FLAGS.model_dir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2)
  trained = (f"{steps} steps, {train_minutes:.1f} training minutes"
             if steps is not None else "steps unknown")
  print(f"\n{FLAGS.recipe}: {trained}; test {os.path.basename(FLAGS.test_src)}: "
        f"sacreBLEU {report['bleu']:.2f} ({report['bleu_signature']}), uncased "
        f"{report['bleu_uncased']:.2f}, chrF {report['chrf']:.2f}; "
        f"results in {FLAGS.model_dir}/results.json")


if __name__ == "__main__":
  app.run(main)
