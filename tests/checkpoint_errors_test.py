"""A checkpoint whose data file was cut short is refused by every command that reads
one (decode, score, export, averaging) with one `error:` line naming the file, exit
code 1 and no traceback, as training refuses it (tests/trainer_test.py)."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

from tests import inprocess
from tests.conftest import REPO_ROOT

# PYTHONPATH: tools/ scripts import this checkout's t2t_keras, not an installed one.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)


@pytest.fixture(scope="module")
def truncated_dir(tiny_model_dir, tmp_path_factory):
  """A copy of conftest's model directory whose ckpt-7 data file lost its second half."""
  path = str(tmp_path_factory.mktemp("truncated") / "model")
  shutil.copytree(tiny_model_dir, path)
  (data_file,) = glob.glob(os.path.join(path, "ckpt-7.data-*"))
  with open(data_file, "r+b") as f:
    f.truncate(os.path.getsize(data_file) // 2)
  sources = os.path.join(os.path.dirname(path), "src.txt")
  with open(sources, "w", encoding="utf-8") as f:
    f.write("a dog\n")
  return path, data_file, sources


# The entry points run in this process (tests/inprocess.py); the averaging tool, whose
# flags clash with theirs, runs as a process, as a user starts it.
COMMANDS = {
    "decode": lambda m, s, out: ["decode", f"--model_dir={m}", f"--input_file={s}"],
    "decode_average": lambda m, s, out: ["decode", f"--model_dir={m}", f"--input_file={s}",
                                         "--average_last_n=1"],
    "score": lambda m, s, out: ["score", f"--model_dir={m}", f"--source_file={s}",
                                f"--target_file={s}"],
    "export": lambda m, s, out: ["export", f"--model_dir={m}", f"--export_dir={out}"],
    "average_checkpoints": lambda m, s, out: [
        os.path.join(REPO_ROOT, "tools", "average_checkpoints.py"), f"--model_dir={m}",
        f"--output_dir={out}", "--last_n=1"],
}


@pytest.mark.parametrize("command", [
    pytest.param(name, marks=pytest.mark.slow) if name == "average_checkpoints" else name
    for name in sorted(COMMANDS)])
def test_truncated_checkpoint_is_a_clear_error(truncated_dir, tmp_path, command):
  model_dir, data_file, sources = truncated_dir
  args = COMMANDS[command](model_dir, sources, str(tmp_path / "out"))
  if command == "average_checkpoints":
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                            cwd=REPO_ROOT, env=ENV, timeout=300, check=False)
  else:
    result = inprocess.run(*args)
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "checkpoint" in last, result.stderr[-3000:]
  assert data_file in last, last
  assert not os.path.exists(tmp_path / "out") or not os.listdir(tmp_path / "out")
