"""Tests of t2t_keras.data.sources.sources: file validation, bad input, TFDS, synthetic tasks."""

import dataclasses
import os

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import NUM_RESERVED_IDS
from t2t_keras.configs import DataConfig
from t2t_keras.data.sources import sources, textfiles
from t2t_keras.data.batching import pipeline
from t2t_keras.data.sources.sources import DataError


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
  pairs = list(sources.data_source(config).text_pairs("train").as_numpy_iterator())
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
    forward = list(sources.data_source(en_de).text_pairs("train").as_numpy_iterator())
    backward = list(sources.data_source(de_en).text_pairs("train").as_numpy_iterator())
    dev = list(sources.data_source(en_de).text_pairs("dev").as_numpy_iterator())
    with pytest.raises(DataError, match="languages"):
      sources.data_source(DataConfig(source="tfds", source_lang="fr")).text_pairs("train")
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

  from t2t_keras.data.sources import textfiles  # pylint: disable=import-outside-toplevel
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


# ------------------------------------------------- a source owns its flags and dev pairs
def test_every_source_declares_fields_that_exist_and_a_help_line():
  fields = {f.name for f in dataclasses.fields(DataConfig)}
  for kind, cls in sources.SOURCE_CLASSES.items():
    assert cls.kind == kind and cls.summary and kind in sources.flag_help()
    assert set(cls.reads) <= fields, kind
  assert set(sources.TEXT_FIELDS) <= fields


class _TsvSource(sources.Source):
  """A source a contributor might add: one tab-separated file (--train_src)."""

  kind = "tsv"
  summary = "one tab-separated file of pairs (--train_src)"
  reads = ("train_src", "dev_src")
  dev_help = "set --dev_src"

  def problems(self):
    return super().problems() + ([] if self.config.train_src else
                                 ["--data_source=tsv needs --train_src"])


def test_a_new_source_is_one_class_and_one_registration(monkeypatch):
  """The flags offer it, validate it through it, and refuse flags it does not read."""
  from absl import flags  # pylint: disable=import-outside-toplevel

  from t2t_keras import flags as t2t_flags  # pylint: disable=import-outside-toplevel
  monkeypatch.setitem(sources.SOURCE_CLASSES, "tsv", _TsvSource)
  monkeypatch.setattr(sources, "SOURCES", tuple(sources.SOURCE_CLASSES))
  fv = flags.FlagValues()
  t2t_flags.define_all(fv)
  assert "tsv" in fv["data_source"].help
  with pytest.raises(flags.IllegalFlagValueError, match="--data_source=tsv needs "
                     "--train_src"):
    fv(["train", "--data_source=tsv"])
  argv = ["train", "--data_source=tsv", "--train_src=a.tsv", "--dev_src=b.tsv",
          "--train_tgt=x"]
  fv = flags.FlagValues()
  t2t_flags.define_all(fv)
  fv(argv)  # --dev_src alone is fine: the source reads it without --dev_tgt
  with pytest.raises(flags.ValidationError, match="--train_tgt=x is set but "
                     "--data_source=tsv does not read it.*add --data_source=files"):
    t2t_flags.check_train_flags(argv, fv)
  assert isinstance(t2t_flags.data_config(fv), DataConfig)


def test_synthetic_dev_pairs_are_the_held_out_examples_as_text():
  from t2t_keras.data.tokens import tokenizer  # pylint: disable=import-outside-toplevel
  config = DataConfig(synthetic_task="reverse", synthetic_eval_size=7)
  source = sources.data_source(config)
  srcs, refs = source.dev_pairs(5)
  assert len(srcs) == len(refs) == 5
  ids = tokenizer.IntegerTokenizer(source.vocab_size).tokenize(
      tf.constant(srcs)).to_list()
  src, _, lengths = source.examples("dev")
  assert ids[0] == src[:lengths[0]].tolist()
  assert all(s.split()[::-1] == r.split() for s, r in zip(srcs, refs))
  assert len(source.dev_pairs(100)[0]) == 7


def test_file_dev_pairs_are_the_first_lines_and_need_the_dev_files(tmp_path):
  config = _files_config(tmp_path, b"a\n", b"b\n")
  assert sources.data_source(config).dev_pairs(3) is None
  config = dataclasses.replace(
      config, dev_src=_write(tmp_path / "dev.en", b"x 1\nx 2\nx \xff\n"),
      dev_tgt=_write(tmp_path / "dev.de", b"y 1\ny 2\ny 3\n"))
  assert sources.data_source(config).dev_pairs(2) == (["x 1", "x 2"], ["y 1", "y 2"])
  assert sources.data_source(config).dev_pairs(9)[0][2] == "x \ufffd"
  short = dataclasses.replace(config, dev_tgt=_write(tmp_path / "d2.de", b"y\n"))
  with pytest.raises(DataError, match="has 3 lines but --dev_tgt .* has 1"):
    sources.data_source(short).dev_pairs(5)


def test_file_checks_are_the_sources_and_stored_once(tmp_path, monkeypatch):
  config = _files_config(tmp_path, b"a\nb\n", b"c\nd\n")
  assert pipeline.cache.validated_files(config, "train") == {"num_lines": 2,
                                                              "invalid_pairs": 0}
  monkeypatch.setattr(sources.FileSource, "check_files",
                      lambda self, split: pytest.fail("checked twice"))
  assert pipeline.cache.validated_files(config, "train")["num_lines"] == 2
  assert pipeline.cache.validated_files(config, "dev") is None
  assert pipeline.cache.validated_files(DataConfig(), "train") is None  # synthetic


@pytest.mark.parametrize("config,message", [
    (DataConfig(source="files", train_src="a"), "--data_source=files needs --train_tgt"),
    (DataConfig(source="parsing"), "--data_source=parsing needs --train_src"),
    (DataConfig(source="tfds", source_lang="de", target_lang="de"),
     "--source_lang and --target_lang are both 'de'"),
    (DataConfig(synthetic_min_length=5, synthetic_max_length=3),
     "--synthetic_min_length=5 and --synthetic_max_length=3"),
    (DataConfig(synthetic_eval_size=0), "--synthetic_eval_size=0 must be >= 1"),
    (DataConfig(source="tfds", dev_tgt="d.de"), "--dev_src and --dev_tgt go together"),
])
def test_a_source_names_the_flag_of_each_problem(config, message):
  with pytest.raises(DataError, match=message):
    sources.data_source(config).validate()
  with pytest.raises(DataError, match=message):
    pipeline.make_datasets(config)
