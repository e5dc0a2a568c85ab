"""Preemption and exact resume, with real processes and real signals.

- SIGKILL after a checkpoint, then the same command resumes from it.
- SIGTERM: the run saves a checkpoint at the current step, says so, exits with code 42
  (TensorFlow's preemption convention), and the same command resumes; SIGINT (Ctrl-C)
  does the same.
- With --deterministic, the run stopped all three ways ends bitwise equal to an
  uninterrupted one (weights, optimizer slots), dropout on.
"""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import inprocess
from tests.conftest import REPO_ROOT

STEPS = 60  # the signals land at steps 36, 42 and 51 (SIGNAL_AT)
FLAGS = ["--flagfile=flags/tiny.cfg", "--layer_prepostprocess_dropout=0.2",
         "--attention_dropout=0.1", "--deterministic", f"--train_steps={STEPS}",
         "--save_checkpoint_steps=15", "--log_every=15", "--eval_every=100000",
         "--show_examples=0", "--seed=3"]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def command(model_dir):
  return [sys.executable, "-m", "t2t_keras.train", *FLAGS, f"--model_dir={model_dir}"]


def run_to_end(model_dir):
  """The command to the end in this process: the uninterrupted reference and the last
  resume, where a process proves nothing more."""
  result = inprocess.run("train", *FLAGS, f"--model_dir={model_dir}")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  return result.stdout


def latest_step(model_dir):
  """The step of the checkpoint the `checkpoint` state file names (0 if none yet)."""
  path = tf.train.latest_checkpoint(str(model_dir))
  return int(path.rsplit("-", 1)[1]) if path else 0


# The training process signals itself right after the host call that reaches step
# $SIGNAL_AT ("step:signal number"), so the signal lands at that step however loaded
# the host (a parent polling for a checkpoint could send it hundreds of steps late):
# loaded through PYTHONPATH's sitecustomize, which wraps Trainer._run once the trainer
# module is imported, so the command stays `python -m t2t_keras.train`.
SIGNAL_AT = """
import importlib.abc, importlib.util, os, signal, sys

_AT, _SIGNUM = map(int, os.environ["SIGNAL_AT"].split(":"))


class _SignalAtStep(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name != "t2t_keras.training.trainer":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    load = spec.loader.exec_module

    def exec_module(module):
      load(module)
      run, sent = module.Trainer._run, []

      def _run(self, batches, step):
        sums, step = run(self, batches, step)
        if step >= _AT and not sent:
          sent.append(step)
          print(f"sitecustomize: {signal.Signals(_SIGNUM).name} at step {step}",
                file=sys.stderr, flush=True)
          os.kill(os.getpid(), _SIGNUM)
        return sums, step

      module.Trainer._run = _run
    spec.loader.exec_module = exec_module
    return spec


sys.meta_path.insert(0, _SignalAtStep())
"""


def start_and_signal(model_dir, signum, at_step, hook_dir):
  """Trains until the process sends itself `signum` right after step `at_step`
  (SIGNAL_AT, from `hook_dir`); returns (exit code, stdout, stderr)."""
  (hook_dir / "sitecustomize.py").write_text(SIGNAL_AT)
  env = dict(ENV, SIGNAL_AT=f"{at_step}:{int(signum)}", PYTHONPATH=os.pathsep.join(
      [str(hook_dir)] + [p for p in [ENV.get("PYTHONPATH")] if p]))
  result = subprocess.run(command(model_dir), cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
  sent = f"sitecustomize: {signal.Signals(signum).name} at step {at_step}\n"
  assert sent in result.stderr, result.stdout[-2000:] + result.stderr[-3000:]
  return result.returncode, result.stdout, result.stderr


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


@pytest.mark.slow
def test_sigkill_sigterm_and_ctrl_c_then_resume_bitwise_equal_to_one_run(tmp_path):
  """One run stopped three ways, each followed by the same command:
  1. SIGKILL at step 36: nothing saved, the checkpoint of step 30 is the latest;
  2. resumed there, SIGTERM (a preemption) at step 42: it saves at the current step,
     says so and exits 42 (before: up to --save_checkpoint_steps steps lost);
  3. resumed at 42, SIGINT (Ctrl-C) at step 51 does the same (before: a
     KeyboardInterrupt traceback);
  4. resumed at 51, it ends bitwise equal to an uninterrupted run (weights,
     optimizer slots and dropout seeds; dropout on)."""
  straight = tmp_path / "straight"
  run_to_end(straight)
  model_dir = tmp_path / "stopped"
  code, _, _ = start_and_signal(model_dir, signal.SIGKILL, 36, tmp_path)
  assert code == -signal.SIGKILL
  assert latest_step(model_dir) == 30  # killed 6 steps after it
  before = 30
  # Between the every-15-steps checkpoints, so that only the signal saves there.
  for signum, name, step in ((signal.SIGTERM, "SIGTERM", 42),
                             (signal.SIGINT, "SIGINT", 51)):
    code, stdout, stderr = start_and_signal(model_dir, signum, step, tmp_path)
    assert code == 42, stdout[-2000:] + stderr[-2000:]
    assert re.search(rf"resumed from \S+ at step {before}\b", stdout), stdout[-2000:]
    said = f"{name} received: saving a checkpoint at step {step} "
    assert said in stdout, stdout[-2000:]
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{step}")
    assert "Traceback" not in stderr
    before = step
  # In this process: the two launches above already resumed as the command does.
  out = run_to_end(model_dir)
  assert re.search(rf"resumed from \S+ at step {before}\b", out), out[-2000:]
  assert_bitwise_equal(state_of(straight), state_of(model_dir))
