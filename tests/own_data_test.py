"""README's "Train on your own data", its commands as written, on a slice of a real
corpus (Multi30k captions standing in for a user's files).

The commands run in-process from a folder that holds `my/` and the repository's
`flags/`, as a user's checkout does. Only the budget differs: the training command gets
`--train_steps`, `--vocab_size` and evaluation settings a test can pay for (the
preset's 60 minutes and 8k pieces are for real corpora); every other flag is the
README's.
"""

import json
import os
import re
import shlex

import numpy as np
import pytest

from tests import inprocess
from tests.conftest import REPO_ROOT, SessionModel

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

def stage_own_data(tmp_path, shared_data, train: int, dev: int, test: int) -> None:
  """README's layout in `tmp_path`: `flags/` and `my/{train,dev,test}.{en,de}`, slices
  of Multi30k's train, valid and test2016 files of the given line counts."""
  os.symlink(os.path.join(REPO_ROOT, "flags"), tmp_path / "flags")
  (tmp_path / "my").mkdir()
  multi30k = os.path.join(shared_data, "multi30k")
  for name, upstream, lines in (("train", "train", train), ("dev", "valid", dev),
                                ("test", "test2016", test)):
    for side in ("en", "de"):
      write_slice(os.path.join(multi30k, f"{upstream}.{side}"),
                  tmp_path / "my" / f"{name}.{side}", lines)



@pytest.mark.slow
def test_own_data_section_trains_translates_scores_and_exports(tmp_path, shared_data):
  commands = section_commands()
  assert [shlex.split(c)[2] for c in commands] == [
      "t2t_keras.train", "t2t_keras.decode", "t2t_keras.evaluate", "t2t_keras.export"]
  stage_own_data(tmp_path, shared_data, train=3000, dev=40, test=24)

  outputs = []
  for command in commands:
    argv = shlex.split(command)
    assert argv[:2] == ["python", "-m"]
    args = argv[3:] + (BUDGET if argv[2] == "t2t_keras.train" else [])
    result = inprocess.run(argv[2].split(".")[1], *args, cwd=str(tmp_path))
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    outputs.append(result.stdout + result.stderr)

  train_out, decode_out, evaluate_out, export_out = outputs
  assert re.search(r"step 20/20 \| loss \d", train_out), train_out[-2000:]
  assert re.search(r"eval at step 20: loss .* \| bleu \d", train_out), train_out[-2000:]
  model_dir = tmp_path / "runs" / "mine"
  # The vocabulary was built from my/train.* at the start.
  assert re.search(r"Wrote vocabulary runs/mine/vocab\S*\.model", train_out), train_out
  # The recipe decodes with beam 4 over the average of the last 5 checkpoints (of the
  # 10 kept: --save_checkpoint_minutes=0 saves every step), though README's decode
  # command names neither: the model directory recorded them at training.
  last_5 = ", ".join(f"runs/mine/ckpt-{step}" for step in range(16, 21))
  assert f"with the average of {last_5} (beam 4, alpha 0.6, extra length 50;" in \
      decode_out, decode_out[-2000:]
  hypotheses = (model_dir / "test.hyp").read_text(encoding="utf-8").splitlines()
  assert len(hypotheses) == 24
  # evaluate prints sacreBLEU's score of these files, as sacreBLEU computes it.
  import sacrebleu  # pylint: disable=import-outside-toplevel
  with open(tmp_path / "my" / "test.de", encoding="utf-8") as f:
    references = f.read().splitlines()
  # (chrF as well: after 20 steps BLEU may well be 0, chrF is not.)
  for name, score in (("BLEU", sacrebleu.corpus_bleu(hypotheses, [references]).score),
                      ("chrF", sacrebleu.corpus_chrf(hypotheses, [references]).score)):
    printed = re.search(rf"^{name} (\d+\.\d+) \(", evaluate_out, re.M)
    assert printed, evaluate_out
    assert float(printed.group(1)) == pytest.approx(score, abs=0.0051), (name, score,
                                                                        evaluate_out)
  assert re.search(r"^chrF [1-9]", evaluate_out, re.M), evaluate_out
  assert "nrefs:1" in evaluate_out, evaluate_out
  exported = re.search(r"exported (\S+)", export_out).group(1)
  assert exported.startswith("runs/mine/export/"), export_out
  # The export, loaded as TensorFlow Serving loads it, translates the test file as
  # decode did, with the same averaged weights.
  served = SessionModel(str(tmp_path / exported))
  with open(tmp_path / "my" / "test.en", encoding="utf-8") as f:
    sources = f.read().splitlines()
  outputs = served.run(inputs=np.array(sources, object))["outputs"]
  assert [t.decode("utf-8") for t in outputs] == hypotheses
  with open(tmp_path / exported / "assets.extra" / "model_card.json", encoding="utf-8") as f:
    card = json.load(f)
  assert card["checkpoints"] == [f"ckpt-{step}" for step in range(16, 21)], card


# A recipe of README's kind whose decoding differs from the commands' defaults (beam 4,
# alpha 0.6, input + 50, the latest checkpoint), on a model a quick test can train.
RECIPE = """--flagfile=flags/small_cpu.cfg
--hidden_size=16
--filter_size=32
--num_heads=2
--num_hidden_layers=1
--vocab_size=300
--batch_size=512
--eval_bleu_sentences=0
--beam_size=3
--alpha=0.3
--extra_decode_length=7
--average_last_n=2
"""


# Slow by cost (about 15-25 s of decode, score and loading runs), not by the rule: the
# quick lane keeps the commands' own tests (commands_test).
@pytest.mark.slow
def test_a_model_directory_decodes_as_its_recipe_says(tmp_path, shared_data):
  """Trained with a flagfile's decoding settings, a model directory decodes with them
  when decode is given none (README's decode command passes no flagfile): its beam,
  alpha, extra length and the average of its last 2 checkpoints, which the first line
  names; a flag given to decode wins; the Python API loads the same; a directory
  without the record decodes as before (the latest checkpoint, the defaults)."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.configs import DecodeConfig
  from t2t_keras.inference import decoding, loading, translate
  stage_own_data(tmp_path, shared_data, train=600, dev=8, test=6)
  (tmp_path / "my" / "recipe.cfg").write_text(RECIPE, encoding="utf-8")
  result = inprocess.run(
      "train", "--flagfile=my/recipe.cfg", "--model_dir=runs/r", "--train_src=my/train.en",
      "--train_tgt=my/train.de", "--dev_src=my/dev.en", "--dev_tgt=my/dev.de",
      "--train_steps=10", "--train_minutes=0", "--save_checkpoint_steps=5",
      "--eval_every=10", "--log_every=10", cwd=str(tmp_path))
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

  def decode(*flags):
    out = tmp_path / "hyp.txt"
    result = inprocess.run("decode", "--model_dir=runs/r", "--input_file=my/test.en",
                           f"--output_file={out}", *flags, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    line = [l for l in result.stderr.splitlines() if l.startswith("decoding ")]
    assert len(line) == 1, result.stderr[-3000:]
    return line[0], out.read_text(encoding="utf-8").splitlines()

  line, hypotheses = decode()
  assert "with the average of runs/r/ckpt-5, runs/r/ckpt-10 (" in line, line
  assert "(beam 3, alpha 0.3, extra length 7;" in line, line
  assert re.search(r"from the model directory's recipe: .*--average_last_n=2 "
                   r".*--beam_size=3 ", line), line
  # The Python API loads the same weights and settings, and translates as decode did.
  model_dir = str(tmp_path / "runs" / "r")
  loaded = loading.load(model_dir)
  assert [os.path.basename(c) for c in loaded.checkpoints] == ["ckpt-5", "ckpt-10"]
  config = loaded.decode_config
  assert (config.beam_size, config.alpha, config.extra_decode_length) == (3, 0.3, 7)
  with open(tmp_path / "my" / "test.en", encoding="utf-8") as f:
    sources = f.read().splitlines()
  results = translate.translate(decoding.make_decode_fn(loaded.model, config),
                                loaded.tokenizer, sources, config, progress=False)
  assert [r.texts[0] for r in results] == hypotheses

  # score weighs with the recipe's average too.
  result = inprocess.run("score", "--model_dir=runs/r", "--source_file=my/test.en",
                         f"--target_file={tmp_path / 'hyp.txt'}", cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("scoring 6 pairs with the average of runs/r/ckpt-5, runs/r/ckpt-10; from the "
          "model directory's recipe: --average_last_n=2 --decode_batch_size=64"
          ) in result.stderr, result.stderr

  # Flags given to decode win over the recipe's, and the line says so.
  line, _ = decode("--beam_size=2", "--average_last_n=1")
  assert "with runs/r/ckpt-10 (beam 2, alpha 0.3, extra length 7;" in line, line
  assert ("given here instead of the recipe's --average_last_n=2 --beam_size=3: "
          "--average_last_n=1 --beam_size=2") in line, line
  # A checkpoint named in code (as --checkpoint_path on a command line) is not averaged.
  assert loading.load(model_dir, os.path.join(model_dir, "ckpt-5")).checkpoints == [
      os.path.join(model_dir, "ckpt-5")]

  # A model directory written before the recipe was recorded: as before.
  path = tmp_path / "runs" / "r" / "config.json"
  record = json.loads(path.read_text(encoding="utf-8"))
  del record["recipe_decoding"]
  path.write_text(json.dumps(record), encoding="utf-8")
  line, _ = decode()
  assert "with runs/r/ckpt-10 (beam 4, alpha 0.6, extra length 50;" in line, line
  assert "recipe" not in line, line
  loaded = loading.load(model_dir)
  assert [os.path.basename(c) for c in loaded.checkpoints] == ["ckpt-10"]
  assert loaded.decode_config == DecodeConfig()
