"""The README's first command: the offline demo trains to >= 95% exact match, prints
examples and exports a SavedModel that translates (issue: training, demo)."""

import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
def test_demo_trains_translates_and_exports(tmp_path):
  model_dir = tmp_path / "demo"
  start = time.time()
  result = subprocess.run(
      [sys.executable, "-m", "t2t_keras.train", "--flagfile=flags/demo.cfg",
       f"--model_dir={model_dir}"], cwd=REPO_ROOT, capture_output=True, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), timeout=900, check=False)
  seconds = time.time() - start
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  match = re.search(r"dev exact match: ([\d.]+)% of (\d+) sequences", out)
  assert match, out[-3000:]
  print(f"demo: {match.group(0)} in {seconds:.0f}s")
  assert float(match.group(1)) >= 95.0 and int(match.group(2)) == 500
  assert out.count("input:") == 5 and "step 2000/2000" in out and "FLOPs" in out
  exported = re.search(r"exported (\S+)", out).group(1)
  assert os.path.exists(os.path.join(exported, "saved_model.pb"))
  # The export reverses a sequence in a fresh TensorFlow-only process.
  script = ("import sys, tensorflow as tf; m = tf.saved_model.load(sys.argv[1]); "
            "print(m.signatures['serving_default'](inputs=tf.constant(['5 6 7 8']))"
            "['outputs'].numpy()[0].decode())")
  served = subprocess.run([sys.executable, "-c", script, exported], capture_output=True,
                          text=True, timeout=300, check=False, cwd="/")
  assert served.returncode == 0, served.stderr[-2000:]
  assert served.stdout.strip() == "8 7 6 5"
