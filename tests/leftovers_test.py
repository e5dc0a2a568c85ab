"""Tests of t2t_keras.data.fetch.leftovers: builds sweep the temporaries killed builds left.

Before: a `build-<id>` directory or `.tmp-<id>` file of a killed cache or vocabulary
build stayed forever. Now a build, as it starts, removes those untouched for more than
24 hours and keeps younger ones (a live build on another host may own them), finished
cache builds, and whatever it cannot date.
"""

import logging
import os
import re
import time

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import DataConfig
from t2t_keras.data.batching import pipeline
from t2t_keras.data.fetch import leftovers
from t2t_keras.data.tokens import tokenizer as tokenizer_lib

DAY = 24 * 3600
OLD = time.time() - DAY - 3600  # a day and an hour ago


def _corpus(folder, lines=60):
  rng = np.random.default_rng(0)
  words = ["the", "a", "house", "cat", "dog", "runs", "sleeps", "under", "over", "small",
           "big", "green"]
  src = [" ".join(rng.choice(words, rng.integers(1, 8))) for _ in range(lines)]
  paths = [str(folder / "train.src"), str(folder / "train.tgt")]
  for path, text in zip(paths, (src, [s.upper() for s in src])):
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(text) + "\n")
  return paths


def _make(path, size=0, when=None):
  """A file of `size` bytes (and its directories); all dated `when` if given."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(b"\0" * size)
  if when is not None:
    for p in (path, os.path.dirname(path)):
      os.utime(p, (when, when))


def test_a_cache_build_removes_old_abandoned_builds_and_keeps_the_rest(tmp_path, caplog):
  src, tgt = _corpus(tmp_path)
  data_dir = tmp_path / "data"
  cache_dir = data_dir / "cache"
  old_build = cache_dir / "train-0123456789abcdef" / "build-aaaaaaaaaaaa"
  _make(str(old_build / "source.bin"), size=1_000_000, when=OLD)
  old_tmp = cache_dir / "train-0123456789abcdef" / "stats.json.tmp-bbbbbbbbbbbb"
  _make(str(old_tmp), size=40, when=OLD)
  os.utime(cache_dir / "train-0123456789abcdef", (OLD, OLD))
  # Younger than a day: a build on another host may still be writing it.
  fresh_build = cache_dir / "train-0123456789abcdef" / "build-cccccccccccc"
  _make(str(fresh_build / "source.bin"), size=10, when=time.time() - DAY + 3600)
  # An old directory with one file written just now is alive.
  busy_build = cache_dir / "dev-fedcba9876543210" / "build-dddddddddddd"
  _make(str(busy_build / "len-0008.source.bin"), size=10, when=OLD)
  _make(str(busy_build / "len-0009.source.bin"), size=10)
  # A finished build (lengths.npy), even uncommitted and old: maybe another worker's data.
  finished = cache_dir / "dev-fedcba9876543210" / "build-eeeeeeeeeeee"
  _make(str(finished / "len-0008.source.bin"), size=10, when=OLD)
  _make(str(finished / "lengths.npy"), size=10, when=OLD)
  os.utime(finished, (OLD, OLD))

  config = DataConfig(source="files", train_src=src, train_tgt=tgt, data_dir=str(data_dir),
                      vocab_size=60, max_length=32, batch_size=64)
  with caplog.at_level(logging.INFO, logger="absl"):
    data = pipeline.make_datasets(config)
  assert data.train_stats.pairs == 60  # the build itself went on

  assert not old_build.exists() and not old_tmp.exists()
  assert fresh_build.exists() and busy_build.exists() and finished.exists()
  # OLD is 25 hours before the module was imported: a slow suite reaches this test later.
  assert re.search(re.escape(f"Removed the abandoned tokenized-cache build {old_build} "
                             "(1.0 MB, untouched for ") + r"2\d hours\)", caplog.text)
  assert f"{old_tmp} (40 bytes" in caplog.text
  assert caplog.text.count("Removed the abandoned") == 2
  # Our own new build is committed and kept.
  builds = tf.io.gfile.glob(str(cache_dir / "train-*" / "stats.json"))
  assert len(builds) == 1


def test_a_vocabulary_build_removes_old_temporaries_beside_it(tmp_path, caplog):
  src, tgt = _corpus(tmp_path)
  data_dir = tmp_path / "data"
  old = [data_dir / "vocab.bpe60.0badc0de.model.tmp-0123456789ab",
         data_dir / "vocab.bpe60.0badc0de.model.tmp-0123456789ab.vocab"]
  fresh = data_dir / "vocab.bpe60.0badc0de.model.tmp-ba9876543210"
  unrelated = data_dir / "notes.txt.tmp-0123456789ab"  # not a vocabulary's
  for path in old + [unrelated]:
    _make(str(path), size=100, when=OLD)
  _make(str(fresh), size=100)
  config = DataConfig(source="files", train_src=src, train_tgt=tgt, data_dir=str(data_dir),
                      vocab_size=60)
  with caplog.at_level(logging.INFO, logger="absl"):
    vocab = tokenizer_lib.build_vocab(config)
  assert os.path.isfile(vocab)
  assert not any(path.exists() for path in old)
  assert fresh.exists() and unrelated.exists()
  assert caplog.text.count("Removed the abandoned vocabulary temporary") == 2


def test_sweep_goes_through_gfile_and_keeps_what_it_cannot_date(tmp_path):
  build = tmp_path / "cache" / "k" / "build-aaaaaaaaaaaa"
  _make(str(build / "len-0008.source.bin"), size=10)
  url = "file://" + str(build)
  assert leftovers.sweep([url], "test build", now=time.time() + DAY - 60) == []
  assert build.exists()
  assert leftovers.sweep([url], "test build", now=time.time() + DAY + 60) == [url]
  assert not build.exists()
  # ram:// reports no modification times: never old enough.
  tf.io.gfile.makedirs("ram://leftovers/build-bbbbbbbbbbbb")
  with tf.io.gfile.GFile("ram://leftovers/build-bbbbbbbbbbbb/x", "w") as f:
    f.write("x")
  assert leftovers.sweep(["ram://leftovers/build-bbbbbbbbbbbb"], "test build",
                         now=time.time() + 100 * DAY) == []
  assert tf.io.gfile.exists("ram://leftovers/build-bbbbbbbbbbbb/x")
  # Gone meanwhile (another sweeper was first): skipped, no error.
  assert leftovers.sweep([str(tmp_path / "gone")], "test build") == []


@pytest.mark.parametrize("hours", [23, 25])
def test_the_age_rule_is_a_day(tmp_path, hours):
  path = tmp_path / "x.model.tmp-0123456789ab"
  _make(str(path), size=1, when=time.time() - hours * 3600)
  removed = leftovers.sweep([str(path)], "test")
  assert (removed == [str(path)]) == (hours > 24)
  assert path.exists() == (hours < 24)
