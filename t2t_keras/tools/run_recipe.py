"""Runs a translation recipe end to end under a training-time budget.

  python tools/run_recipe.py --recipe=flags/multi30k_en_de.cfg --model_dir=/tmp/m30k \\
      --test_src=data/multi30k/test2016.en \\
      --test_ref=data/multi30k/test2016.de [--train_minutes=60]

The recipes are the files of `flags/` in a checkout of the repository (a `pip
install` does not carry them; a recipe may include another by its path, e.g.
big_en_de.cfg includes flags/base_en_de.cfg): run from the checkout's root. After
`pip install`, `t2t-run-recipe` is this tool (same flags), and `--recipe` may be
any recipe of yours.

1. trains: `python -m t2t_keras.train --flagfile=<recipe> --model_dir=...` with
   `--train_minutes` (training stops with a checkpoint when the budget is spent; dev
   evaluation is not counted); a model_dir that already trained resumes;
2. decodes the test set with the recipe's decoding flags (beam, alpha) from the
   average of the last `--average_last_n` checkpoints;
3. prints sacreBLEU (cased, default tokenization) with its signature and chrF, and
   writes `<model_dir>/results.json` (recipe, steps, training minutes, wall times,
   machine, scores, the commands run).

Extra flags after `--` go to both training and decoding, e.g. `-- --seed=2`.

Signals: each command runs in its own session, so a terminal's Ctrl-C reaches this
script only, and this script passes it on once (with the terminal's SIGINT also reaching
the trainer, the trainer would count two Ctrl-Cs and stop without saving). The first
SIGTERM or SIGINT is forwarded to the running command: training saves a checkpoint at
the current step and exits with code 42; its output is still relayed, no further
command starts, and this script exits with the command's code (rerun the same command
to resume). A second Ctrl-C kills the command's process group (SIGKILL; training
resumes from its last saved checkpoint, as after any kill). Further SIGTERMs are
ignored: a supervisor that wants the job gone sends SIGKILL after its grace period.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time

from absl import app, flags

from t2t_keras import console, metrics
from t2t_keras.learning_curves import read_scalars

flags.DEFINE_string("recipe", None,
                    "The recipe, e.g. flags/multi30k_en_de.cfg: the recipes "
                    "are in flags/ of a checkout of the repository (not installed by "
                    "pip); relative paths resolve from the current directory.")
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


class ForwardSignals:
  """Passes SIGTERM and SIGINT on to the child process group it is given.

  The first signal is forwarded once; a later SIGINT (Ctrl-C again) sends SIGKILL;
  later SIGTERMs are ignored. A signal that arrives while a child is being started is
  forwarded as soon as it exists (see `start`), so none is lost.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.first = None  # the first signal received (signal.Signals), or None
    self.child = None
    self._forwarded = False  # the first signal reached a child
    self._previous = {}

  def __enter__(self):
    for signum in self.SIGNALS:
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)

  def start(self, command, **kwargs) -> subprocess.Popen:
    """Starts `command` in its own session and forwards signals to it from then on; a
    signal that came earlier is forwarded at once, so none is lost.

    (Not by blocking the signals around Popen: the child would inherit the mask.
    Python runs the handler between bytecodes of this thread, so either it sees the
    child and forwards, or the check below does; never both.)
    """
    child = subprocess.Popen(command, start_new_session=True, **kwargs)
    self.child = child
    if self.first is not None and not self._forwarded:
      self._forward_first()
    return child

  def release(self):
    self.child = None

  def send(self, signum) -> bool:
    """Sends `signum` to the child's process group; False when there is none."""
    if self.child is None or self.child.poll() is not None:
      return False
    try:
      os.killpg(self.child.pid, signum)  # its own session: process group id == pid
    except ProcessLookupError:  # exited since poll()
      return False
    return True

  def _forward_first(self):
    self._forwarded = self.send(self.first) or self._forwarded

  def _handle(self, signum, frame):
    del frame
    signum = signal.Signals(signum)
    if self.first is None:
      self.first = signum
      print(f"\n{signum.name} received: passing it on to the running command once (it "
            "saves a checkpoint and stops); Ctrl-C again kills it", file=sys.stderr,
            flush=True)
      self._forward_first()
    elif signum == signal.SIGINT:
      print("\nSIGINT again: killing the running command (SIGKILL); the same command "
            "resumes from its last checkpoint", file=sys.stderr, flush=True)
      self.send(signal.SIGKILL)


def exit_code(returncode: int) -> int:
  """A child's return code as a shell reports it (killed by signal N: 128 + N)."""
  return 128 - returncode if returncode < 0 else returncode


def run(command, log_path: str, signals: ForwardSignals) -> float:
  """Runs `command`, teeing its output to `log_path`; returns the wall seconds.

  Exits (with the command's code) when the command fails or a stop signal came.
  """
  if signals.first is not None:  # stopped before this command started
    sys.exit(128 + signals.first)
  print("+ " + " ".join(shlex.quote(c) for c in command), flush=True)
  start = time.time()
  with open(log_path, "a", encoding="utf-8") as log, signals.start(
      command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, cwd=os.getcwd()) as process:
    try:
      for line in process.stdout:
        log.write(line)
        # TF's C++ start-up chatter stays in the log only.
        if not re.match(r"^[IWE]\d{4} |^WARNING: All log messages|^To enable the", line):
          sys.stdout.write(line)
          sys.stdout.flush()
    except BaseException:  # never leave the command running unattended
      signals.send(signal.SIGKILL)
      raise
    finally:
      process.wait()
      signals.release()
  name = command[2] if command[1:2] == ["-m"] else os.path.basename(command[-1])
  if process.returncode and signals.first is not None:
    print(f"{name} stopped on {signals.first.name} with exit code {process.returncode}; "
          f"its output is in {log_path}", file=sys.stderr)
    sys.exit(exit_code(process.returncode))
  if process.returncode:
    print(f"error: {name} failed with exit code {process.returncode}; its output is "
          f"in {log_path}", file=sys.stderr)
    sys.exit(exit_code(process.returncode))
  if signals.first is not None:  # it finished anyway; start nothing more
    print(f"{signals.first.name} received: {name} finished; stopping here",
          file=sys.stderr, flush=True)
    sys.exit(128 + signals.first)
  return time.time() - start


def main(argv):
  extra = argv[1:]
  for path, flag in ((FLAGS.recipe, "--recipe"), (FLAGS.test_src, "--test_src"),
                     (FLAGS.test_ref, "--test_ref")):
    if not os.path.isfile(path):
      where = ""
      if flag == "--recipe":
        where = (" The recipes are in flags/ of a checkout of the t2t_keras "
                 "repository (pip does not install them): run from the checkout's root, "
                 "or give --recipe the path of a recipe of yours.")
      raise app.UsageError(f"{flag}={path} does not exist (paths are relative to the "
                           f"current directory, {os.getcwd()}).{where}")
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
  with ForwardSignals() as signals:
    if not FLAGS.skip_training:
      train_wall = run(train_cmd, os.path.join(FLAGS.model_dir, "train.log"), signals)
    decode_wall = run(decode_cmd, os.path.join(FLAGS.model_dir, "decode.log"), signals)

  # The one deferred import: t2t_keras.trained imports TensorFlow, which the rest of
  # this tool (and its --help) does without.
  from t2t_keras.trained import modeldir  # pylint: disable=import-outside-toplevel
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


def console_main():
  """The `t2t-run-recipe` command (setup.py) and `python tools/run_recipe.py`."""
  console.own_help(__name__)
  app.run(main)


if __name__ == "__main__":
  console_main()
