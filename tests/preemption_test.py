"""Preemption and exact resume, with real processes and real signals.

- SIGKILL after a checkpoint, then the same command: with --deterministic the final
  weights (and optimizer slots) are bitwise those of an uninterrupted run, dropout on.
- SIGTERM: the run saves a checkpoint at the current step, says so, exits with code 42
  (TensorFlow's preemption convention), and the same command resumes to the same end;
  SIGINT (Ctrl-C) does the same.
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO_ROOT

STEPS = 400
FLAGS = ["--flagfile=flags/tiny.cfg", "--layer_prepostprocess_dropout=0.2",
         "--attention_dropout=0.1", "--deterministic", f"--train_steps={STEPS}",
         "--save_checkpoint_steps=50", "--log_every=50", "--eval_every=100000",
         "--show_examples=0", "--seed=3"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def command(model_dir):
  return [sys.executable, "-m", "t2t_keras.train", *FLAGS, f"--model_dir={model_dir}"]


def run_to_end(model_dir):
  result = subprocess.run(command(model_dir), cwd=REPO_ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  return result.stdout


def latest_step(model_dir):
  """The step of the checkpoint the `checkpoint` state file names (0 if none yet)."""
  path = tf.train.latest_checkpoint(str(model_dir))
  return int(path.rsplit("-", 1)[1]) if path else 0


def start_and_signal(model_dir, signum, after_step=100):
  """Starts training, sends `signum` once the latest checkpoint (as the `checkpoint`
  state file names it, which is written after the checkpoint's own files) is at
  `after_step` or later; returns (exit code, stdout, stderr)."""
  process = subprocess.Popen(command(model_dir), cwd=REPO_ROOT, env=ENV, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  deadline = time.time() + 300
  while latest_step(model_dir) < after_step:
    assert process.poll() is None, "training ended before it could be interrupted: " + (
        process.stderr.read()[-2000:])
    assert time.time() < deadline, "no checkpoint within 300 s"
    time.sleep(0.02)
  process.send_signal(signum)
  stdout, stderr = process.communicate(timeout=300)
  return process.returncode, stdout, stderr


def state_of(model_dir):
  """Every model and optimizer tensor of the latest checkpoint, by name."""
  path = tf.train.latest_checkpoint(str(model_dir))
  assert path and path.endswith(f"ckpt-{STEPS}"), path
  reader = tf.train.load_checkpoint(path)
  names = [name for name, _ in tf.train.list_variables(path)
           if name.startswith(("model/", "optimizer/", "dropout_seeds/"))]
  assert any(n.startswith("model/") for n in names)
  assert any(n.startswith("dropout_seeds/") for n in names)
  return {name: reader.get_tensor(name) for name in names}


def assert_bitwise_equal(a, b):
  assert sorted(a) == sorted(b)
  different = [name for name in a if not np.array_equal(a[name], b[name])]
  assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  """The uninterrupted run both tests compare against (trained once)."""
  model_dir = tmp_path_factory.mktemp("straight")
  run_to_end(model_dir)
  return state_of(model_dir)


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(tmp_path, straight):
  code, _, _ = start_and_signal(str(tmp_path / "killed"), signal.SIGKILL)
  assert code == -signal.SIGKILL
  interrupted_at = latest_step(tmp_path / "killed")
  assert 100 <= interrupted_at < STEPS
  out = run_to_end(tmp_path / "killed")
  assert "resumed from" in out and f"at step {interrupted_at}" in out
  assert_bitwise_equal(straight, state_of(tmp_path / "killed"))


@pytest.mark.slow
def test_sigterm_and_ctrl_c_save_exit_42_and_resume(tmp_path, straight):
  """SIGTERM (a preemption) saves at the current step and exits 42; the resumed run
  is then stopped by SIGINT (Ctrl-C), which saves alike (before: a KeyboardInterrupt
  traceback and up to --save_checkpoint_steps steps lost); the run resumed twice ends
  bitwise equal to the uninterrupted one."""
  model_dir = tmp_path / "term"
  step = 0
  for signum, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
    code, stdout, stderr = start_and_signal(str(model_dir), signum,
                                            after_step=max(100, step + 1))
    assert code == 42, stdout[-2000:] + stderr[-2000:]
    if step:  # resumed where the signal left it
      assert re.search(rf"resumed from \S+ at step {step}\b", stdout), stdout[-2000:]
    said = f"{name} received: saving a checkpoint at step "
    assert said in stdout, stdout[-2000:]
    step, before = int(stdout.split(said)[1].split()[0]), step
    assert max(100, before + 1) <= step < STEPS - 100
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{step}")
    assert "Traceback" not in stderr
  out = run_to_end(model_dir)
  assert f"at step {step}" in out
  assert_bitwise_equal(straight, state_of(model_dir))
