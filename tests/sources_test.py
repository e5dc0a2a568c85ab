"""Tests of t2t_keras.data.sources: file validation, bad input, TFDS, synthetic tasks."""

import os

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import NUM_RESERVED_IDS
from t2t_keras.configs import DataConfig
from t2t_keras.data import pipeline, sources, textfiles
from t2t_keras.data.sources import DataError


def _write(path, data: bytes):
  with open(path, "wb") as f:
    f.write(data)
  return str(path)


def _files_config(tmp_path, src: bytes, tgt: bytes, **kwargs):
  return DataConfig(source="files", train_src=_write(tmp_path / "train.en", src),
                    train_tgt=_write(tmp_path / "train.de", tgt),
                    data_dir=str(tmp_path / "data"), **kwargs)


@pytest.mark.parametrize("data,lines", [
    (b"", 0), (b"a\n", 1), (b"a\nb", 2), (b"a\r\nb\n\nc\n", 4), (b"\n\n", 2)])
def test_scan_counts_lines_like_text_line_dataset(tmp_path, data, lines):
  path = _write(tmp_path / "f.txt", data)
  assert textfiles.scan_text_file(path).num_lines == lines
  assert len(list(tf.data.TextLineDataset(path))) == lines


def test_scan_counts_lines_across_chunks(tmp_path, monkeypatch):
  monkeypatch.setattr(textfiles, "_CHUNK_BYTES", 7)
  path = _write(tmp_path / "f.txt", "".join(f"line {i} ü\n" for i in range(50)).encode()
                + b"last")
  assert textfiles.scan_text_file(path).num_lines == 51


def test_misaligned_files_name_both_files_and_counts(tmp_path):
  config = _files_config(tmp_path, b"a\nb\nc\n", b"x\ny\n")
  with pytest.raises(DataError) as error:
    pipeline.make_datasets(config)
  message = str(error.value)
  for part in (config.train_src, config.train_tgt, "3 lines", "has 2"):
    assert part in message


def test_invalid_utf8_names_file_and_line(tmp_path, monkeypatch):
  monkeypatch.setattr(textfiles, "_CHUNK_BYTES", 5)  # The bad line is in a later chunk.
  config = _files_config(tmp_path, b"good one\nfine\nbad \xff\xfe here\nok\n",
                         b"gut\ngut\ngut\ngut\n")
  with pytest.raises(DataError, match=rf"{config.train_src}:3: invalid UTF-8.*"
                     "skip_invalid_utf8"):
    pipeline.make_datasets(config)


def test_invalid_utf8_skipped_and_counted_when_asked(tmp_path):
  config = _files_config(tmp_path, b"a b\nc \xff d\ne f\n", b"A B\nC D\nE \xc3(\n",
                         skip_invalid_utf8=True, source_lang="en")
  scan = textfiles.scan_text_file(config.train_src, skip_invalid_utf8=True)
  assert scan.invalid_lines == (2,)
  pairs = list(sources.text_pairs(config, "train").as_numpy_iterator())
  assert pairs == [(b"a b", b"A B")]
  report = pipeline.cache.validated_files(config, "train")
  assert report == {"num_lines": 3, "invalid_pairs": 2}


def test_missing_file_is_a_clear_error(tmp_path):
  config = DataConfig(source="files", train_src=str(tmp_path / "nope.en"),
                      train_tgt=str(tmp_path / "nope.de"), data_dir=str(tmp_path))
  with pytest.raises(DataError, match="nope.en.*does not exist"):
    pipeline.make_datasets(config)


def test_empty_files_are_a_clear_error(tmp_path):
  with pytest.raises(DataError, match="empty"):
    pipeline.make_datasets(_files_config(tmp_path, b"", b""))


def test_only_empty_lines_is_a_clear_error_before_training(tmp_path):
  config = _files_config(tmp_path, b"\n \n\n" * 20, b"a\n\nb\n" * 20, vocab_size=20)
  # The vocabulary sees the few non-empty target lines; no pair has two sides.
  with pytest.raises(DataError, match="No training pairs left.*60 with an empty side"):
    pipeline.make_datasets(config)


def test_missing_dev_file_is_a_clear_error(tmp_path):
  config = DataConfig(source="files", train_src="a", dev_src=None, dev_tgt="b")
  with pytest.raises(DataError, match="both source and target"):
    sources.split_files(config, "dev")
  assert sources.split_files(DataConfig(source="files", train_src="a",
                                        train_tgt="b"), "dev") is None


def _pairs(config, split):
  """(source ids, target ids) of every pair of a synthetic split, as the input reads
  them (by length, then in corpus order)."""
  data = pipeline.load_split(config, split, None)
  src, tgt, lengths = data.read(data.present)
  cuts = [np.cumsum(lengths.numpy()[:, i])[:-1] for i in range(2)]
  return list(zip(np.split(src.numpy(), cuts[0]), np.split(tgt.numpy(), cuts[1])))


@pytest.mark.parametrize("task", ["copy", "reverse"])
def test_synthetic_tasks(task):
  config = DataConfig(source="synthetic", synthetic_task=task, synthetic_min_length=2,
                      synthetic_max_length=6, synthetic_vocab_size=5,
                      synthetic_train_size=200)
  pairs = _pairs(config, "train")
  assert len(pairs) == 200
  lengths = {len(s) for s, _ in pairs}
  assert lengths == set(range(2, 7))
  for src, tgt in pairs:
    assert src.min() >= NUM_RESERVED_IDS and src.max() < NUM_RESERVED_IDS + 5
    np.testing.assert_array_equal(tgt, src if task == "copy" else src[::-1])
  again, dev = _pairs(config, "train"), _pairs(config, "dev")
  assert all(np.array_equal(a[0], b[0]) for a, b in zip(pairs, again))
  assert not all(np.array_equal(a[0], b[0]) for a, b in zip(pairs, dev))


@pytest.fixture
def network_up(monkeypatch):
  """mock_data replaces preparation, not t2t_keras's reachability probe: let it pass
  (tests/tfds_builder_test.py runs the real builder and the probe)."""
  import requests  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(requests, "head", lambda url, **kwargs: None)


def test_tfds_direction_follows_languages(tmp_path, network_up):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    raw = list(tfds.load("wmt14_translate/de-en", split="train").as_numpy_iterator())
    en_de = DataConfig(source="tfds", source_lang="en", target_lang="de")
    de_en = DataConfig(source="tfds", source_lang="de", target_lang="en")
    forward = list(sources.text_pairs(en_de, "train").as_numpy_iterator())
    backward = list(sources.text_pairs(de_en, "train").as_numpy_iterator())
    dev = list(sources.text_pairs(en_de, "dev").as_numpy_iterator())
    with pytest.raises(DataError, match="languages"):
      sources.text_pairs(DataConfig(source="tfds", source_lang="fr"), "train")
  assert raw and raw[0]["en"] != raw[0]["de"]
  assert forward == [(ex["en"], ex["de"]) for ex in raw]  # Supervised keys swapped.
  assert backward == [(t, s) for s, t in forward]
  assert len(dev) == 6


def test_tfds_pipeline_end_to_end(tmp_path, network_up):
  tfds = pytest.importorskip("tensorflow_datasets")
  config = DataConfig(source="tfds", tfds_name="wmt14_translate/fr-en",
                      source_lang="en", target_lang="fr", data_dir=str(tmp_path),
                      vocab_size=40, batch_size=256, max_length=64)
  with tfds.testing.mock_data(num_examples=8, policy=tfds.testing.MockPolicy.USE_CODE):
    data = pipeline.make_datasets(config)
    batch = next(iter(data.train_fn()))
  assert data.train_stats.pairs == 8 and data.eval_stats.pairs == 8
  assert batch["inputs"].dtype == tf.int32 and batch["targets"].shape[0] >= 1
  assert os.path.basename(data.tokenizer.vocab_file).startswith("vocab.bpe40.")


def test_fingerprint_follows_content_not_size_or_time(tmp_path):
  """The caches' and the vocabulary's key: an edit in the middle that keeps the size
  and the modification time changes it (the first and last megabyte did not see it);
  a `touch` does not."""
  import os  # pylint: disable=import-outside-toplevel

  from t2t_keras.data import textfiles  # pylint: disable=import-outside-toplevel
  path = tmp_path / "big.txt"
  lines = [f"line {i:07d} of a corpus\n" for i in range(200_000)]  # ~5 MB
  path.write_text("".join(lines))
  before = textfiles.file_fingerprint(str(path))
  stat = os.stat(path)
  lines[100_000] = lines[100_000].replace("corpus", "CORPUS")  # same size, mid-file
  path.write_text("".join(lines))
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # e.g. rsync -t, cp -p
  textfiles._HASHED.clear()  # pylint: disable=protected-access  (the next run's process)
  after = textfiles.file_fingerprint(str(path))
  assert after["size"] == before["size"] and after != before
  os.utime(path)  # touch: same content, same key
  assert textfiles.file_fingerprint(str(path)) == after
