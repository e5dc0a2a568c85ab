"""README's two commands, verbatim, as a new user runs them (issue: the user's path).

Command 1 installs into a fresh virtual environment in a fresh copy of the repository
and runs the offline demo: it must train to >= 95% exact match (98-100% on the seeds
and machines tried), print examples, export a SavedModel that TF Serving's loader runs,
and show a terminal a person can read. Command 2 is what `.ci/run` runs.
"""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from tests.conftest import REPO_ROOT

DEMO_MODEL_DIR = "/tmp/t2t_demo"
# Lines a person should not see by default: TensorFlow's C++ log lines (I/W/E + date),
# absl's pre-initialisation notice, library INFO chatter, TensorFlow's Python
# deprecation warnings.
NOISE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|cuInit|oneDNN|Sharding callback|"
                   r"signature_serialization|fontManager|cpu_feature_guard|"
                   r"^WARNING:tensorflow|is deprecated", re.M)


def readme_command(after: str) -> str:
  """The first indented (code) line after the paragraph starting with `after`."""
  with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  start = text.index("\n" + after)
  return re.search(r"^    (\S.*)$", text[start:], re.M).group(1)


def test_ci_runs_readme_test_command():
  command = readme_command("Run the tests")
  printed = subprocess.run(["bash", os.path.join(REPO_ROOT, ".ci", "run"), "--print"],
                           capture_output=True, text=True, check=True, timeout=60)
  assert printed.stdout.strip() == command
  # It works on a fresh machine after command 1 or alone: it makes the environment if
  # needed and installs the test extras before running pytest.
  assert command.startswith("python3 -m venv .venv && ")
  assert '.venv/bin/pip install -e ".[tensorflow,test]"' in command
  assert re.search(r"\.venv/bin/python -m pytest -q( -n \d+ --dist loadfile)?"
                   r"( --durations=\d+)?( -rs)? tests$", command)


def _fresh_copy(destination):
  """The repository's files as a fresh clone has them (tracked files only)."""
  listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True,
                          check=False)
  if listed.returncode != 0:  # not a git checkout: copy all but the environment
    shutil.copytree(REPO_ROOT, destination,
                    ignore=shutil.ignore_patterns(".venv", ".venv-tf*", "__pycache__", ".git"))
    return
  for name in listed.stdout.decode().split("\0"):
    if name and os.path.exists(os.path.join(REPO_ROOT, name)):
      os.makedirs(os.path.dirname(os.path.join(destination, name)), exist_ok=True)
      shutil.copy2(os.path.join(REPO_ROOT, name), os.path.join(destination, name))


# The demo (a venv, an install, training: minutes on 2 cores) may take up to
# DEMO_TIMEOUT; the test's own limit (pytest.ini's 900 s is for the others) leaves room
# for the copy and the serving check after it, so that the demo's timeout, which shows
# its output, fires first.
DEMO_TIMEOUT = 1800


@pytest.mark.slow
@pytest.mark.timeout(DEMO_TIMEOUT + 600)
def test_readme_demo_command_in_a_fresh_copy_and_environment(tmp_path):
  command = readme_command("Install and run the offline demo")
  assert command.startswith(
      'python3 -m venv .venv && .venv/bin/pip install -e ".[tensorflow]" && ')
  assert f"--model_dir={DEMO_MODEL_DIR}" in command
  # Verbatim but for the model directory, so that a demo run a person left in /tmp
  # is neither resumed nor touched.
  model_dir = tmp_path / "demo"
  command = command.replace(f"--model_dir={DEMO_MODEL_DIR}", f"--model_dir={model_dir}")
  clone = tmp_path / "t2t_keras"
  _fresh_copy(clone)
  env = {k: v for k, v in os.environ.items()
         if k not in ("VIRTUAL_ENV", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")}
  env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
  # pip byte-compiles every installed module (TensorFlow's thousands) unless told not
  # to; Python compiles what the demo imports anyway.
  env["PIP_NO_COMPILE"] = "1"
  start = time.time()
  process = subprocess.Popen(["bash", "-c", command], cwd=clone, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
  try:
    stdout, stderr = process.communicate(timeout=DEMO_TIMEOUT)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)  # bash, pip and the training alike
    stdout, stderr = process.communicate()
    pytest.fail(f"README command 1 did not finish within {DEMO_TIMEOUT} s; its output "
                f"so far:\n{stdout[-3000:]}\n{stderr[-3000:]}")
  finally:  # also when something else stops the test (Ctrl-C, pytest-timeout)
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
  seconds = time.time() - start
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  out = result.stdout
  match = re.search(r"dev exact match: ([\d.]+)% of (\d+) sequences", out)
  assert match, out[-3000:]
  trained = re.search(r"done: (\d+) steps in (\S+)", out)
  print(f"README command 1: {match.group(0)}; training {trained.group(2)}; "
        f"{seconds:.0f}s with the install")
  assert float(match.group(1)) >= 95.0 and int(match.group(2)) == 500
  assert out.count("input:") == 5 and "FLOPs" in out
  # The demo's own output: no TensorFlow or library chatter, on either stream.
  training = out[out.index("training "):] + result.stderr[result.stderr.find("Data train"):]
  noise = NOISE.findall(training)
  assert not noise, f"noise in the demo's terminal: {noise[:5]}"
  exported = re.search(r"exported (\S+)", out).group(1)
  assert exported.startswith(str(model_dir)) and os.path.exists(
      os.path.join(exported, "saved_model.pb"))
  # The export reverses a sequence in a fresh TensorFlow-only process, loaded as TF
  # Serving loads it (a session; signature tensors by name).
  script = (
      "import sys, numpy as np, tensorflow as tf, tensorflow_text\n"
      "g = tf.Graph(); s = tf.compat.v1.Session(graph=g)\n"
      "with g.as_default():\n"
      "  m = tf.compat.v1.saved_model.loader.load(s, ['serve'], sys.argv[1])\n"
      "sig = m.signature_def['serving_default']\n"
      "out = s.run(sig.outputs['outputs'].name,\n"
      "            {sig.inputs['inputs'].name: np.array([b'5 6 7 8'], object)})\n"
      "print(out[0].decode())\n")
  served = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c", script, exported],
                          capture_output=True, text=True, timeout=300, check=False,
                          cwd="/", env=env)
  assert served.returncode == 0, served.stderr[-2000:]
  assert served.stdout.strip().splitlines()[-1] == "8 7 6 5"
