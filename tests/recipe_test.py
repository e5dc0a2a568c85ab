"""tools/run_recipe.py end to end on the tiny synthetic recipe, and the learning-curve tool."""

import pytest
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import sacrebleu

from tests import inprocess
from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def run(*args):
  return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                        cwd=REPO_ROOT, env=ENV, timeout=600, check=False)


@pytest.mark.slow
def test_recipe_trains_decodes_scores_and_plots(tmp_path):
  src, ref = tmp_path / "test.src", tmp_path / "test.ref"
  src.write_text("5 6 7\n4 4 9 8\n")
  ref.write_text("5 6 7 7\n4 4 9 8\n")  # not the source: BLEU must read the references
  model_dir = tmp_path / "run"
  # --min_decode_length=4: the 40-step model's outputs have 4-grams, so its BLEU is
  # above 0 (sacreBLEU's smoothing) whatever it learned, and a score that is not
  # computed from test.hyp and test.ref shows.
  result = run("tools/run_recipe.py", "--recipe=flags/tiny.cfg", f"--model_dir={model_dir}",
               f"--test_src={src}", f"--test_ref={ref}", "--train_minutes=5",
               "--average_last_n=2", "--", "--train_steps=40", "--eval_every=20",
               "--save_checkpoint_steps=20", "--show_examples=0", "--min_decode_length=4")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  results = json.loads((model_dir / "results.json").read_text())
  assert results["steps"] == 40
  assert 0 < results["train_minutes"] < 5
  assert results["bleu_signature"].startswith("nrefs:1|case:mixed")
  hyps = (model_dir / "test.hyp").read_text().splitlines()
  assert len(hyps) == 2 and all(len(h.split()) >= 4 for h in hyps), hyps
  # The reported scores are sacreBLEU's of the files, recomputed here independently.
  refs = ref.read_text().splitlines()
  bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
  assert bleu > 0.0
  assert results["bleu"] == pytest.approx(bleu, abs=1e-9), (results["bleu"], bleu, hyps)
  assert results["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score,
                                          abs=1e-9)
  assert f"sacreBLEU {bleu:.2f} (nrefs:1|case:mixed" in result.stdout
  assert "results.json" in result.stdout
  assert "--average_last_n=2" in results["commands"][1]

  picture = tmp_path / "curve.png"
  plotted = run("tools/plot_learning_curve.py", f"--model_dir={model_dir}",
                f"--output={picture}")
  assert plotted.returncode == 0, plotted.stderr[-3000:]
  assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "loss" in plotted.stdout


def test_recipe_and_curve_errors_are_clear(tmp_path):
  """A missing recipe says where recipes come from: a checkout's flags/, which an
  installed t2t-run-recipe lacks."""
  result = inprocess.run("run_recipe", "--recipe=flags/nope.cfg",
                         f"--model_dir={tmp_path}", "--test_src=a", "--test_ref=b",
                         cwd=str(tmp_path))
  assert result.returncode == 1
  assert "--recipe=flags/nope.cfg does not exist" in result.stderr
  assert "flags/ of a checkout of the t2t_keras repository" in result.stderr
  assert not os.listdir(tmp_path)  # stopped before making anything
  empty = inprocess.run("plot_learning_curve", f"--model_dir={tmp_path}",
                        f"--output={tmp_path}/x.png")
  assert empty.returncode == 1
  assert "no TensorBoard scalars" in empty.stderr


# --- Signals: run_recipe passes SIGTERM/SIGINT on to the command it runs. ---


class Lines:
  """Reads a process's stdout on a thread, so a test can wait for a line with a
  deadline."""

  def __init__(self, process):
    self.lines = queue.Queue()
    self.seen = []
    threading.Thread(target=self._read, args=(process.stdout,), daemon=True).start()

  def _read(self, stream):
    for line in stream:
      self.lines.put(line)

  def wait_for(self, text, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
      try:
        line = self.lines.get(timeout=max(deadline - time.time(), 0.01))
      except queue.Empty:
        break
      self.seen.append(line)
      if text in line:
        return line
    raise AssertionError(f"no line with {text!r} within {seconds} s:\n"
                         + "".join(self.seen[-40:]))

  def rest(self, process):
    process.wait(timeout=120)
    time.sleep(0.2)  # the reader thread drains the closed pipe
    while not self.lines.empty():
      self.seen.append(self.lines.get())
    return "".join(self.seen)


def processes_mentioning(text):
  """Pids of live processes whose command line contains `text` (Linux /proc)."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if text.encode() in f.read():
          found.append(int(pid))
    except OSError:
      pass
  return found


@pytest.mark.slow
def test_sigterm_reaches_training_which_saves_and_run_recipe_exits_with_its_code(tmp_path):
  """The real trainer under run_recipe: SIGTERM to run_recipe (not to the trainer) makes
  training save at the current step and exit 42; run_recipe relays that, starts no
  decode, exits 42, and leaves nothing running (before: run_recipe died at once and
  training went on unattended)."""
  src = tmp_path / "test.src"
  src.write_text("5 6 7\n")
  model_dir = tmp_path / "run"
  process = subprocess.Popen(
      [sys.executable, "tools/run_recipe.py", "--recipe=flags/tiny.cfg",
       f"--model_dir={model_dir}", f"--test_src={src}", f"--test_ref={src}", "--",
       "--train_steps=100000", "--log_every=5", "--save_checkpoint_steps=100000",
       "--eval_every=100000", "--show_examples=0"],
      cwd=REPO_ROOT, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      start_new_session=True)
  try:
    lines = Lines(process)
    lines.wait_for("step 5/100000", 300)  # training runs (relayed by run_recipe)
    process.send_signal(signal.SIGTERM)
    out = lines.rest(process)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  assert process.returncode == 42, out[-3000:]
  assert "SIGTERM received: saving a checkpoint at step" in out
  step = int(out.split("SIGTERM received: saving a checkpoint at step ")[1].split()[0])
  assert step >= 5
  assert (model_dir / "checkpoint").read_text().count(f"ckpt-{step}") >= 1
  assert "t2t_keras.train stopped on SIGTERM with exit code 42" in out
  assert "t2t_keras.decode" not in out  # nothing starts after a stop
  assert "Traceback" not in out
  assert not processes_mentioning(f"--model_dir={model_dir}")


CHILD = """
import os, signal, sys, time
def note(signum, frame):
  print("child got", signal.Signals(signum).name, flush=True)
  if signum == signal.SIGTERM:
    sys.exit(42)
signal.signal(signal.SIGINT, note)   # ignores Ctrl-C: only SIGKILL ends it
signal.signal(signal.SIGTERM, note)
print("child ready", os.getpid(), flush=True)
while True:
  time.sleep(0.05)
"""

DRIVER = """
import sys
from t2t_keras.tools import run_recipe
with run_recipe.ForwardSignals() as signals:
  run_recipe.run([sys.executable, sys.argv[1]], sys.argv[2], signals)
  print("driver went on", flush=True)
"""


def start_driver(tmp_path):
  (tmp_path / "child.py").write_text(CHILD)
  process = subprocess.Popen(
      [sys.executable, "-c", DRIVER, str(tmp_path / "child.py"), str(tmp_path / "log")],
      cwd=REPO_ROOT, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      start_new_session=True)
  lines = Lines(process)
  child = int(lines.wait_for("child ready", 60).split()[-1])
  return process, lines, child


@pytest.mark.slow
def test_ctrl_c_is_passed_on_once_and_a_second_one_kills(tmp_path):
  """A terminal's Ctrl-C goes to the whole foreground process group: the command, in
  its own session, gets it once (from run_recipe), not twice; a second Ctrl-C kills it
  (137, as a shell reports SIGKILL), and run_recipe waits for that."""
  process, lines, child = start_driver(tmp_path)
  try:
    os.killpg(process.pid, signal.SIGINT)  # as the terminal does
    lines.wait_for("child got SIGINT", 30)
    time.sleep(0.5)
    assert process.poll() is None  # still relaying the command, which still runs
    os.killpg(process.pid, signal.SIGINT)
    out = lines.rest(process)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  assert process.returncode == 128 + signal.SIGKILL, out
  assert out.count("child got SIGINT") == 1, out
  assert "SIGINT again: killing the running command (SIGKILL)" in out
  assert "driver went on" not in out
  assert not os.path.exists(f"/proc/{child}")


@pytest.mark.slow
def test_sigterm_is_passed_on_and_the_commands_code_returned(tmp_path):
  process, lines, child = start_driver(tmp_path)
  try:
    process.send_signal(signal.SIGTERM)
    out = lines.rest(process)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  assert process.returncode == 42, out
  assert "child got SIGTERM" in out and "stopped on SIGTERM with exit code 42" in out
  assert "driver went on" not in out
  assert not os.path.exists(f"/proc/{child}")
