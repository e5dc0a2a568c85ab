"""tools/run_recipe.py end to end on the tiny synthetic recipe, and the learning-curve tool."""

import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def run(*args):
  return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                        cwd=REPO_ROOT, env=ENV, timeout=600, check=False)


def test_recipe_trains_decodes_scores_and_plots(tmp_path):
  src, ref = tmp_path / "test.src", tmp_path / "test.ref"
  src.write_text("5 6 7\n4 4 9 8\n")
  ref.write_text("5 6 7\n4 4 9 8\n")
  model_dir = tmp_path / "run"
  result = run("tools/run_recipe.py", "--recipe=flags/tiny.cfg", f"--model_dir={model_dir}",
               f"--test_src={src}", f"--test_ref={ref}", "--train_minutes=5",
               "--average_last_n=2", "--", "--train_steps=40", "--eval_every=20",
               "--save_checkpoint_steps=20", "--show_examples=0")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  results = json.loads((model_dir / "results.json").read_text())
  assert results["steps"] == 40
  assert 0 < results["train_minutes"] < 5
  assert results["bleu_signature"].startswith("nrefs:1|case:mixed")
  assert 0.0 <= results["bleu"] <= 100.0
  hyps = (model_dir / "test.hyp").read_text().splitlines()
  assert len(hyps) == 2
  assert "sacreBLEU" in result.stdout and "results.json" in result.stdout
  assert "--average_last_n=2" in results["commands"][1]

  picture = tmp_path / "curve.png"
  plotted = run("tools/plot_learning_curve.py", f"--model_dir={model_dir}",
                f"--output={picture}")
  assert plotted.returncode == 0, plotted.stderr[-3000:]
  assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "loss" in plotted.stdout


def test_recipe_and_curve_errors_are_clear(tmp_path):
  result = run("tools/run_recipe.py", "--recipe=flags/nope.cfg", f"--model_dir={tmp_path}",
               "--test_src=a", "--test_ref=b")
  assert result.returncode != 0
  assert "--recipe=flags/nope.cfg does not exist" in result.stderr
  empty = run("tools/plot_learning_curve.py", f"--model_dir={tmp_path}",
              f"--output={tmp_path}/x.png")
  assert empty.returncode == 1
  assert "no TensorBoard scalars" in empty.stderr
