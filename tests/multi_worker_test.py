"""Two workers on 127.0.0.1 through the entry point, as users run them: two processes of
`python -m t2t_keras.train --strategy=multi_worker_mirrored` with a TF_CONFIG each, one
shared model directory, real text files (a slice of Multi30k), the batch plan, dev
evaluation with BLEU, --train_minutes, --keep_best_checkpoint, --early_stopping_patience
and --export.

What must hold: both exit 0; only the chief writes the shared files (one export, one
flags.txt entry, no temporary leftovers); every decision that ends the loop is the
chief's, so a worker whose clock runs 1000x fast still stops with the others; and with
--deterministic the final weights equal one process with 2 replicas (learned positions
and shared embeddings: sparse and dense gradients reduced across workers).

A lost worker (the tiny copy task, no corpora): a SIGTERM to one worker stops both at
the same step; a worker killed or stuck stops the other within a bounded time with one
line naming it, the last checkpoint and the command; relaunched after each of these,
the run is bitwise equal to an uninterrupted one at the same step.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import inprocess
from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

# A clock 1000x faster than the wall clock, for one worker only (a host whose clock
# drifts, or that spent its budget elsewhere): loaded through PYTHONPATH's
# sitecustomize, so the command stays `python -m t2t_keras.train`. With
# --train_minutes=5 its own budget ends 0.3 s into the run, long before its first
# step, while the chief's 5 minutes cover a loaded host's tracing and 12 steps.
FAST_CLOCK = """
import time
_real = time.time
_start = _real()
time.time = lambda: _start + (_real() - _start) * 1000.0
"""


def free_ports(n):
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def corpus(shared_data, tmp_path, train_lines=600, dev_lines=40):
  """The first lines of Multi30k's train and valid splits, in tmp_path."""
  paths = {}
  for split, lines in (("train", train_lines), ("valid", dev_lines)):
    for lang in ("en", "de"):
      with open(os.path.join(shared_data, "multi30k", f"{split}.{lang}"),
                encoding="utf-8") as f:
        text = [next(f) for _ in range(lines)]
      path = tmp_path / f"{split}.{lang}"
      path.write_text("".join(text), encoding="utf-8")
      paths[f"{split}.{lang}"] = str(path)
  return paths


def flags_for(paths, data_dir, position, shared):
  return [
      "--data_source=files", f"--train_src={paths['train.en']}",
      f"--train_tgt={paths['train.de']}", f"--dev_src={paths['valid.en']}",
      f"--dev_tgt={paths['valid.de']}", f"--data_dir={data_dir}", "--vocab_size=200",
      "--hidden_size=32", "--filter_size=64", "--num_heads=2", "--num_hidden_layers=1",
      f"--position_embedding={position}", "--max_position=64",
      f"--shared_embeddings={str(shared).lower()}", "--layer_prepostprocess_dropout=0",
      "--attention_dropout=0", "--relu_dropout=0", "--max_length=48", "--batch_size=256",
      "--train_steps=12", "--log_every=4", "--eval_every=6", "--save_checkpoint_steps=6",
      "--learning_rate=0.5", "--learning_rate_warmup_steps=8", "--adam_epsilon=1e-4",
      "--train_minutes=30", "--eval_bleu_sentences=8", "--keep_best_checkpoint",
      "--early_stopping_patience=4", "--beam_size=2", "--extra_decode_length=4",
      "--show_examples=0", "--deterministic", "--seed=3"]


def model_weights(model_dir):
  """Every trainable weight of the latest checkpoint. A training checkpoint names each
  variable once, by its first path: most weights are under the optimizer's list of
  trainable variables, not under `model/` (which holds only what the optimizer does
  not reach first)."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if name.startswith(("model/", "optimizer/_trainable_variables/"))}


def assert_chief_wrote_once(model_dir, outputs):
  assert sum("exported " in out for _, out, _ in outputs) == 1
  versions = tf.io.gfile.listdir(str(model_dir / "export"))
  assert len(versions) == 1 and versions[0].strip("/").isdigit(), versions
  assert (model_dir / "export" / versions[0].strip("/") / "saved_model.pb").exists()
  assert (model_dir / "flags.txt").read_text().count("# run started") == 1
  leftovers = [name for name in os.listdir(model_dir) if ".tmp" in name]
  assert not leftovers, leftovers
  assert (model_dir / "best").is_dir() and tf.train.latest_checkpoint(str(model_dir / "best"))
  assert json.loads((model_dir / "best_eval.json").read_text())["metric"] == "bleu"


@pytest.mark.slow
def test_two_workers_with_a_fast_clock_equal_two_replicas(tmp_path, shared_data):
  """Learned positions (sparse gradients) and the paper's shared embeddings (the
  lookup's sparse and the output layer's dense gradient on one table); worker 1's clock
  runs 1000x fast, so its own --train_minutes budget would end 0.3 s into the run:
  the chief's decides, both train all 12 steps, and the weights equal 2 replicas in
  one process. (Separate embeddings take the positions' sparse path; sinusoids have no
  weights: trainer_test compares both model families on 1 and 2 replicas.)"""
  paths = corpus(shared_data, tmp_path)
  flags = flags_for(paths, tmp_path / "data", "learned", shared=True)
  clock_dir = tmp_path / "fast_clock"
  clock_dir.mkdir()
  (clock_dir / "sitecustomize.py").write_text(FAST_CLOCK)
  model_dir = tmp_path / "mw"
  start = time.time()
  results = run_workers(model_dir, ["--export", "--train_minutes=5"] + flags, tmp_path,
                        "fast", import_dirs={1: clock_dir}, timeout=400)
  print(f"2 workers: {time.time() - start:.0f} s")
  for code, out, _ in results:
    assert code == 0, out[-3000:]
    assert "eval at step 12" in out, out[-3000:]
    assert "budget is spent" not in out
  assert "(worker 1)" in results[1][1]
  # The chief's last dev BLEU: the one it recorded for step 12 (the model card's).
  record = json.loads((model_dir / "dev_bleu.json").read_text())
  assert record["step"] == 12 and record["sentences"] == 8, record
  chief_bleu = re.search(r"eval at step 12: .* \| bleu (\d+\.\d\d)", results[0][1])
  assert chief_bleu and chief_bleu.group(1) == f"{record['bleu']:.2f}", results[0][1][-3000:]
  assert_chief_wrote_once(model_dir, results)
  # Worker 1 saved with the chief, as TensorFlow's multi-worker guide has it, in a
  # scratch directory on its local disk: nothing of its own under the model directory.
  scratch = [str(path) for path in model_dir.rglob("*")
             if path.name.startswith((".worker", "t2t_keras-worker"))]
  assert not scratch, scratch

  single_dir = tmp_path / "single"
  # The reference in this process (the 2 logical devices conftest made): a process of
  # its own would prove nothing more and cost TensorFlow's start.
  single = inprocess.run("train", "--strategy=mirrored", "--num_logical_devices=2",
                         f"--model_dir={single_dir}", "--train_minutes=5", *flags)
  assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-2000:]
  assert "on 2 replica(s)" in single.stdout
  # The same weights (below), the same dev BLEU.
  assert re.search(rf"eval at step 12: .* \| bleu {chief_bleu.group(1)}(\s|$)",
                   single.stdout), single.stdout[-3000:]
  expected, got = model_weights(single_dir), model_weights(model_dir)
  assert expected.keys() == got.keys() and any("position" in k for k in got), sorted(got)
  for name in expected:
    np.testing.assert_allclose(got[name], expected[name], atol=1e-5, err_msg=name)


# A lost worker: the synthetic copy task of flags/tiny.cfg (no corpora), few steps.
LOST_STEPS = 20
LOST_FLAGS = ["--flagfile=flags/tiny.cfg", "--layer_prepostprocess_dropout=0.1",
              "--deterministic", f"--train_steps={LOST_STEPS}", "--save_checkpoint_steps=5",
              "--log_every=5", "--eval_every=100000", "--eval_steps=1", "--show_examples=0",
              "--synthetic_train_size=2000", "--seed=3"]

# A worker that is alive but stuck (a hung write, a deadlock): SIGUSR1 (sent by
# preemption_test's SIGNAL_AT at a chosen step) makes its main thread sleep, while
# TensorFlow's threads go on answering heartbeats and connections. It prints when it
# got stuck on its own clock: a busy host delays the test's polling, not this.
STUCK = """
import signal, sys, time
def _stuck(*_):
  print(f"stuck at {time.time():.3f}", file=sys.stderr, flush=True)
  time.sleep(3600)
signal.signal(signal.SIGUSR1, _stuck)
"""


def launch_workers(model_dir, flags, tmp_path, name, hooks=None, import_dirs=None):
  """Starts both workers, their output in files; `hooks`: {worker index: SIGNAL_AT
  value} for a worker that signals itself at a step (preemption_test's sitecustomize,
  with STUCK); `import_dirs`: {worker index: a folder put first on its PYTHONPATH} (a
  sitecustomize of the test's own, such as FAST_CLOCK)."""
  from tests.preemption_test import SIGNAL_AT  # pylint: disable=import-outside-toplevel
  ports = free_ports(2)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  processes = []
  for index in range(2):
    env = dict(ENV, TF_CONFIG=json.dumps({"cluster": cluster,
                                          "task": {"type": "worker", "index": index}}))
    if import_dirs and index in import_dirs:
      env["PYTHONPATH"] = os.pathsep.join(
          [str(import_dirs[index])] + [p for p in [env.get("PYTHONPATH")] if p])
    if hooks and index in hooks:
      hook_dir = tmp_path / f"hook-{name}-{index}"
      hook_dir.mkdir(exist_ok=True)  # a launch again (run_workers)
      (hook_dir / "sitecustomize.py").write_text(STUCK + SIGNAL_AT)
      env["SIGNAL_AT"] = hooks[index]
      env["PYTHONPATH"] = os.pathsep.join(
          [str(hook_dir)] + [p for p in [env.get("PYTHONPATH")] if p])
    out = open(tmp_path / f"{name}-{index}.log", "w+", encoding="utf-8")  # noqa: SIM115
    processes.append((subprocess.Popen(
        [sys.executable, "-m", "t2t_keras.train", "--strategy=multi_worker_mirrored",
         f"--model_dir={model_dir}"] + flags,
        cwd=REPO_ROOT, env=env, text=True, stdout=out, stderr=subprocess.STDOUT), out))
  return processes


# What a worker prints when its TF_CONFIG port was taken between free_ports closing it
# and TensorFlow's server binding it (another process of a busy host got it first).
PORT_TAKEN = "Could not start gRPC server"


class PortTaken(Exception):
  """A worker could not bind its port: the launch is retried on new ports."""


def wait_workers(processes, timeout=300, stuck=None):
  """[(exit code, output, exit time)] of both workers; a hang past `timeout` fails.

  `stuck`: the index of a worker that never exits by itself: once the others have
  exited it is killed, and its "exit time" is when it got stuck, as STUCK printed it
  (exit times of the others are when this loop saw them exit: later, never earlier).

  Raises:
    PortTaken: a worker exited because its port was taken (the others are killed).
  """
  deadline, ended = time.time() + timeout, {}
  waited = [i for i in range(len(processes)) if i != stuck]
  taken = False
  while time.time() < deadline and not all(i in ended for i in waited) and not taken:
    for i, (p, out) in enumerate(processes):
      if i in ended:
        continue
      if p.poll() is not None:
        out.seek(0)
        taken = taken or (p.returncode != 0 and PORT_TAKEN in out.read())
      if i == stuck:
        out.seek(0)
        got_stuck = re.search(r"^stuck at (\d+\.\d+)$", out.read(), re.MULTILINE)
        if got_stuck:
          ended[i] = float(got_stuck.group(1))
      elif p.poll() is not None:
        ended[i] = time.time()
    time.sleep(0.2)
  for p, _ in processes:
    if p.poll() is None:
      p.kill()
      p.wait()
  outputs = []
  for p, out in processes:
    out.seek(0)
    outputs.append(out.read())
    out.close()
  if taken:
    raise PortTaken("\n---\n".join(o[-2000:] for o in outputs))
  if len(ended) < len(processes):
    pytest.fail(f"a worker did not exit within {timeout} s:\n"
                + "\n---\n".join(o[-3000:] for o in outputs))
  return [(p.returncode, out, ended[i]) for i, ((p, _), out) in
          enumerate(zip(processes, outputs))]


def run_workers(model_dir, flags, tmp_path, name, timeout=300, stuck=None, attempts=3,
                **launch):
  """`wait_workers(launch_workers(...))`, launched again on new ports when a worker's
  port was taken before it could bind it (free_ports can only pick ports that are
  free now). A worker fails that early before it writes anything."""
  for attempt in range(attempts):
    try:
      return wait_workers(launch_workers(model_dir, flags, tmp_path, name, **launch),
                          timeout=timeout, stuck=stuck)
    except PortTaken as taken:
      print(f"attempt {attempt + 1}: a port was taken; launching on new ports")
      last = str(taken)
  pytest.fail(f"{attempts} launches found a port taken:\n{last}")


def checkpoint_state(model_dir, step):
  """Every model, optimizer and dropout-seed tensor of ckpt-`step`, by name."""
  path = os.path.join(str(model_dir), f"ckpt-{step}")
  assert tf.io.gfile.exists(path + ".index"), tf.io.gfile.listdir(str(model_dir))
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)
          if name.startswith(("model/", "optimizer/", "dropout_seeds/"))}


def assert_lost_line(out, lost, step, checkpoint, why):
  """The last line of a worker that lost `lost`: which, when, the checkpoint, the
  command that resumes, and no stack trace or TensorFlow op error."""
  last = out.strip().splitlines()[-1]
  assert last.startswith(f"error: lost worker {lost} (127.0.0.1:"), out[-3000:]
  assert f" after step {step}: {why}" in last, last
  assert f"The last checkpoint is {checkpoint} (step {checkpoint.rsplit('-', 1)[1]})." in (
      last), last
  assert "Relaunch every worker, each with its TF_CONFIG, to resume: python -m " \
         "t2t_keras.train --strategy=multi_worker_mirrored --model_dir=" in last, last
  assert "Traceback" not in out and "[[{{node" not in out, out[-3000:]


@pytest.mark.slow
def test_a_lost_worker_stops_the_run_which_resumes_exactly(tmp_path):
  """Two workers, three launches of both, the tiny copy task:
  1. the reference: 2 replicas in this process, uninterrupted, to the end;
  2. SIGTERM to worker 1 (not the chief) at step 7: both save at step 7, exit 42;
  3. relaunched, they resume at step 7; the chief is SIGKILLed at step 13 (after the
     step-10 checkpoint): the survivor exits 1 within seconds with one `error:` line
     naming worker 0, the last checkpoint and the command to relaunch (before:
     TensorFlow's raw op error, a stack trace);
  4. relaunched, they resume at step 10; worker 1 gets stuck (alive) at step 17: the
     chief stops once it has waited --peer_timeout_minutes (before: it waited
     forever), with the same line;
  5. the step-15 checkpoint, written after two resumes (from SIGTERM's checkpoint and
     from a regular one), is bitwise equal to the reference's. A fourth launch to the
     end would resume as the second and third did: test_two_workers_... ends a run."""
  start = time.time()
  straight_dir, model_dir = tmp_path / "straight", tmp_path / "lost"
  # The reference: the same 2 replicas in this process (2 workers of one device each
  # train bitwise alike; with sparse gradients, test_two_workers_... compares them).
  single = inprocess.run("train", "--strategy=mirrored", "--num_logical_devices=2",
                         f"--model_dir={straight_dir}", *LOST_FLAGS)
  assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-2000:]
  assert tf.train.latest_checkpoint(str(straight_dir)).endswith(f"ckpt-{LOST_STEPS}")
  straight = checkpoint_state(straight_dir, 15)

  results = run_workers(model_dir, LOST_FLAGS, tmp_path, "term",
                        hooks={1: f"7:{int(signal.SIGTERM)}"})
  for code, out, _ in results:
    assert code == 42, out[-3000:]
    assert "received: saving a checkpoint at step 7 " in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-7")

  results = run_workers(model_dir, LOST_FLAGS, tmp_path, "kill",
                        hooks={0: f"13:{int(signal.SIGKILL)}"})
  (chief_code, chief_out, chief_end), (code, out, end) = results
  assert re.search(r"resumed from \S+ckpt-7 at step 7\b", chief_out), chief_out[-3000:]
  print(f"the survivor exited {end - chief_end:.1f} s after the chief was killed")
  assert chief_code == -signal.SIGKILL
  # Noticed through TensorFlow (the reset connection, within seconds), not by a clock:
  # the reason is the dead process, not --peer_timeout_minutes (30 by default here),
  # and it ends the survivor's wait (a survivor waiting forever fails run_workers).
  assert code == 1, out[-3000:]
  assert_lost_line(out, 0, 13, f"{model_dir}{os.sep}ckpt-10", "its process ended ")

  timeout = 9  # --peer_timeout_minutes=0.15
  results = run_workers(model_dir, LOST_FLAGS + ["--peer_timeout_minutes=0.15"], tmp_path,
                        "stuck", hooks={1: f"17:{int(signal.SIGUSR1)}"}, stuck=1)
  (code, out, end), (_, _, stuck_at) = results
  print(f"the chief exited {end - stuck_at:.1f} s after worker 1 got stuck")
  assert re.search(r"resumed from \S+ckpt-10 at step 10\b", out), out[-3000:]
  # The chief waited out its watch: not before (a lower bound a busy host cannot
  # break: worker 1 stamps when it got stuck, and the chief's exit is seen late if
  # anything), and the watch ended the wait (its reason, below; without it the chief
  # would wait forever). An upper bound on the wall clock would measure the host.
  assert code == 1 and end - stuck_at > timeout - 1, out[-3000:]
  assert_lost_line(out, 1, 17, f"{model_dir}{os.sep}ckpt-15",
                   f"no answer in {timeout} s (--peer_timeout_minutes)")

  got = checkpoint_state(model_dir, 15)
  assert sorted(got) == sorted(straight) and any(n.startswith("dropout_seeds/") for n in got)
  different = [name for name in got if not np.array_equal(got[name], straight[name])]
  assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
  print(f"6 processes and the reference: {time.time() - start:.0f} s")
