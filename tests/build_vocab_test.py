"""Tests of tools/build_vocab.py: the CLI builds what training then reuses."""

import pytest
import os
import subprocess
import sys

from t2t_keras.configs import DataConfig
from t2t_keras.data import tokenizer as tokenizer_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*flags):
  return subprocess.run([sys.executable, os.path.join(REPO, "tools", "build_vocab.py"),
                         *flags], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, check=False)


@pytest.mark.slow
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
  path = tokenizer_lib.vocab_path(config)
  assert f"Vocabulary: {path}" in result.stdout
  assert "train: 90 pairs" in result.stdout
  assert any(name.startswith("train-") for name in os.listdir(data_dir / "cache"))

  missing = _run("--data_source=files", f"--train_src={tmp_path}/nope.en",
                 f"--train_tgt={tgt}", f"--data_dir={data_dir}")
  assert missing.returncode == 1
  assert "error: Data file" in missing.stderr and "nope.en" in missing.stderr
  assert "Traceback" not in missing.stderr
