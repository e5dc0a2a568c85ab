"""README's "Train on your own data", its commands as written, on a slice of a real
corpus (Multi30k captions standing in for a user's files).

The commands run in-process from a folder that holds `my/` and the repository's
`flags/`, as a user's checkout does. Only the budget differs: the training command gets
`--train_steps`, `--vocab_size` and evaluation settings a test can pay for (the
preset's 60 minutes and 8k pieces are for real corpora); every other flag is the
README's.
"""

import os
import re
import shlex

import pytest

from tests import inprocess
from tests.conftest import REPO_ROOT

# What the test changes in the training command, appended after the README's flags.
BUDGET = ["--train_steps=20", "--train_minutes=0", "--vocab_size=600",
          "--eval_every=20", "--eval_bleu_sentences=8", "--save_checkpoint_steps=5",
          "--save_checkpoint_minutes=0", "--log_every=10", "--batch_size=256"]


def section_commands():
  """The indented command lines of README's "Train on your own data"."""
  with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  section = re.search(r"^## Train on your own data\n(.*?)^## ", text, re.S | re.M).group(1)
  return [line.strip() for line in section.splitlines() if line.startswith("    python ")]


def write_slice(source, destination, lines):
  with open(source, encoding="utf-8") as f:
    head = [next(f) for _ in range(lines)]
  with open(destination, "w", encoding="utf-8") as f:
    f.writelines(head)


@pytest.mark.slow
def test_own_data_section_trains_translates_scores_and_exports(tmp_path, shared_data):
  commands = section_commands()
  assert [shlex.split(c)[2] for c in commands] == [
      "t2t_keras.train", "t2t_keras.decode", "t2t_keras.evaluate", "t2t_keras.export"]
  os.symlink(os.path.join(REPO_ROOT, "flags"), tmp_path / "flags")
  (tmp_path / "my").mkdir()
  multi30k = os.path.join(shared_data, "multi30k")
  for name, upstream, lines in (("train", "train", 3000), ("dev", "valid", 40),
                                ("test", "test2016", 24)):
    for side in ("en", "de"):
      write_slice(os.path.join(multi30k, f"{upstream}.{side}"),
                  tmp_path / "my" / f"{name}.{side}", lines)

  outputs = []
  for command in commands:
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-m"]
    args = argv[3:] + (BUDGET if argv[2] == "t2t_keras.train" else [])
    result = inprocess.run(argv[2].split(".")[1], *args, cwd=str(tmp_path))
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    outputs.append(result.stdout + result.stderr)

  train_out, _, evaluate_out, export_out = outputs
  assert re.search(r"step 20/20 \| loss \d", train_out), train_out[-2000:]
  assert re.search(r"eval at step 20: loss .* \| bleu \d", train_out), train_out[-2000:]
  model_dir = tmp_path / "runs" / "mine"
  # The vocabulary was built from my/train.* at the start.
  assert re.search(r"Wrote vocabulary runs/mine/vocab\S*\.model", train_out), train_out
  hypotheses = (model_dir / "test.hyp").read_text(encoding="utf-8").splitlines()
  assert len(hypotheses) == 24
  # evaluate prints sacreBLEU's score and signature for the 24 references.
  assert re.search(r"BLEU\S* = \d+\.\d+", evaluate_out), evaluate_out
  assert "nrefs:1" in evaluate_out, evaluate_out
  exported = re.search(r"exported (\S+)", export_out).group(1)
  assert exported.startswith("runs/mine/export/"), export_out
  assert (tmp_path / exported / "saved_model.pb").exists()
