"""Tests of tools/build_vocab.py: the CLI builds what training then reuses."""

import os

from t2t_keras.configs import DataConfig
from t2t_keras.data.tokens import tokenizer as tokenizer_lib
from tests import inprocess



def _run(*flags):
  """`t2t-build-vocab FLAGS`, its main in this process (tests/inprocess.py; the console
  script's --help runs as a process in tests/packaging_test.py)."""
  return inprocess.run("build_vocab", *flags)


def test_builds_vocabulary_and_cache_that_training_reuses(tmp_path):
  src, tgt = tmp_path / "train.en", tmp_path / "train.de"
  src.write_text("the cat sleeps\na dog runs\nthe big house\n" * 30, encoding="utf-8")
  tgt.write_text("die Katze schläft\nein Hund läuft\ndas große Haus\n" * 30,
                 encoding="utf-8")
  data_dir = tmp_path / "data"
  result = _run("--data_source=files", f"--train_src={src}", f"--train_tgt={tgt}",
                f"--data_dir={data_dir}", "--vocab_size=40", "--vocab_type=unigram")
  assert result.returncode == 0, result.stderr[-2000:]
  config = DataConfig(source="files", train_src=str(src), train_tgt=str(tgt),
                      data_dir=str(data_dir), vocab_size=40, vocab_type="unigram")
  path = tokenizer_lib.data_vocab_path(config)
  assert f"Vocabulary: {path}" in result.stdout
  assert "train: 90 pairs" in result.stdout
  assert any(name.startswith("train-") for name in os.listdir(data_dir / "cache"))

  missing = _run("--data_source=files", f"--train_src={tmp_path}/nope.en",
                 f"--train_tgt={tgt}", f"--data_dir={data_dir}")
  assert missing.returncode == 1
  assert "error: Data file" in missing.stderr and "nope.en" in missing.stderr
  assert "Traceback" not in missing.stderr
