"""Where sentence pairs come from: parallel text files, tensorflow-datasets, synthetic
tasks, and treebanks for parsing.

Each kind is one object behind a small protocol (`Source`, made by `data_source`):
whether a split is configured, a fingerprint of its content (the cache key and the
vocabulary's name), and the pairs, as
  * a `tf.data.Dataset` of (source, target) scalar strings for one split, and
  * a Python iterator over the same pairs (for sampling the vocabulary).
The vocabulary builder, the tokenized cache, the pipeline and the model directory ask
these objects and never which kind they hold. Synthetic tasks (copy, reverse: tensor2tensor's algorithmic problems) skip text and
yield id sequences directly, so demos and tests run with no data and no vocabulary.
The parsing source reads bracketed trees (.mrg: --train_src, --dev_src) and pairs each
sentence with its linearized tree (t2t_keras.parsing), so parsing uses the vocabulary,
caches, bucketing and training loop of translation unchanged.

Bad input must fail loudly before training starts, never corrupt silently: files are
checked once (line counts match, valid UTF-8) by a fast chunked scan whose result the
cache module stores, and every problem raises `DataError` naming file, line and fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from t2t_keras import NUM_RESERVED_IDS, parsing
from t2t_keras.configs import DataConfig
from t2t_keras.errors import DataError

SYNTHETIC_TASKS = ("copy", "reverse")
_CHUNK_BYTES = 16 << 20
_HEAD_TAIL_BYTES = 1 << 20
# TFDS split names of the WMT builders for our two splits.
_TFDS_SPLITS = {"train": "train", "dev": "validation"}


@dataclasses.dataclass(frozen=True)
class FileScan:
  """Result of scanning one text file.

  Attributes:
    path: the file.
    num_lines: lines as tf.data.TextLineDataset counts them.
    invalid_lines: 1-based numbers of lines that are not valid UTF-8.
  """

  path: str
  num_lines: int
  invalid_lines: Tuple[int, ...] = ()


def _invalid_utf8_error(path: str, line: int, error: UnicodeDecodeError) -> DataError:
  bad = error.object[error.start:error.start + 4]
  return DataError(
      f"{path}:{line}: invalid UTF-8 (bytes {bad!r}). Convert the file to UTF-8 "
      "(e.g. `iconv -f latin1 -t utf-8`), or set skip_invalid_utf8 "
      "(--skip_invalid_utf8) to skip and count such pairs.")


def open_binary(path: str):
  """Python's fast local reader, or tf.io.gfile for remote paths (gs://...)."""
  return tf.io.gfile.GFile(path, "rb") if "://" in path else open(path, "rb")


def check_file_exists(path: str):
  """Raises DataError naming the file and the flags to check if it is missing."""
  if not path or not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
    raise DataError(f"Data file {path!r} does not exist; check the --train_src/"
                    "--train_tgt/--dev_src/--dev_tgt flags (relative paths resolve "
                    f"from the current directory, {os.getcwd()}).")


def scan_text_file(path: str, skip_invalid_utf8: bool = False) -> FileScan:
  """Counts lines and checks UTF-8 in large chunks (hundreds of MB/s).

  Args:
    path: a text file, one sentence per line.
    skip_invalid_utf8: record invalid lines instead of raising.

  Returns:
    A FileScan.

  Raises:
    DataError: the file is missing, or has invalid UTF-8 and skipping is off.
  """
  check_file_exists(path)
  num_lines = 0
  invalid: List[int] = []
  carry = b""
  with open_binary(path) as f:
    while True:
      block = f.read(_CHUNK_BYTES)
      data = carry + block
      if not block:  # End of file: a last line without "\n" still counts.
        complete, carry = data, b""
      else:
        cut = data.rfind(b"\n") + 1
        complete, carry = data[:cut], data[cut:]
      if complete:
        try:
          complete.decode("utf-8")
        except UnicodeDecodeError as e:
          if not skip_invalid_utf8:
            line = num_lines + complete.count(b"\n", 0, e.start) + 1
            raise _invalid_utf8_error(path, line, e) from None
          for i, line_bytes in enumerate(complete.split(b"\n")):
            try:
              line_bytes.decode("utf-8")
            except UnicodeDecodeError:
              invalid.append(num_lines + i + 1)
        num_lines += complete.count(b"\n")
        if not block and not complete.endswith(b"\n"):
          num_lines += 1
      if not block:
        break
  return FileScan(path=path, num_lines=num_lines, invalid_lines=tuple(invalid))


def read_text_lines(path: Optional[str], what: str) -> List[str]:
  """Lines of a UTF-8 file (stdin when `path` is None) without their line ends.

  Raises:
    DataError: the file is missing, or a line is not UTF-8 (naming flag, file, line).
  """
  import sys  # pylint: disable=import-outside-toplevel
  if path is None:
    data = sys.stdin.buffer.read()
    path = "<stdin>"
  else:
    if not tf.io.gfile.exists(path):
      raise DataError(f"{what} {path} does not exist.")
    with tf.io.gfile.GFile(path, "rb") as f:
      data = f.read()
  from t2t_keras.textio import split_lines  # pylint: disable=import-outside-toplevel
  return split_lines(data, what, path, DataError)


def validate_parallel_files(src_path: str, tgt_path: str,
                            skip_invalid_utf8: bool = False) -> Tuple[FileScan, FileScan]:
  """Checks that two line-aligned files exist, are UTF-8 and have equal line counts.

  Raises:
    DataError: with both file names and counts when the files are not aligned.
  """
  src, tgt = (scan_text_file(p, skip_invalid_utf8) for p in (src_path, tgt_path))
  if src.num_lines != tgt.num_lines:
    raise DataError(
        f"Parallel files are not line-aligned: {src_path} has {src.num_lines} lines "
        f"but {tgt_path} has {tgt.num_lines}. Each line of the source file must be "
        "the translation of the same line of the target file; fix or re-export them.")
  if src.num_lines == 0:
    raise DataError(f"Parallel files {src_path} and {tgt_path} are empty; point the "
                    "flags at files with one sentence per line.")
  return src, tgt


def split_files(config: DataConfig, split: str) -> Optional[Tuple[str, str]]:
  """(source, target) paths of a split of the "files" source, None if unset."""
  src, tgt = ((config.train_src, config.train_tgt) if split == "train"
              else (config.dev_src, config.dev_tgt))
  if not src and not tgt:
    if split == "train":
      raise DataError("source='files' needs --train_src and --train_tgt "
                      "(line-aligned source and target files).")
    return None
  if not src or not tgt:
    raise DataError(f"Set both source and target files for the {split} split "
                    f"(got source={src!r}, target={tgt!r}).")
  return src, tgt


def treebank_file(config: DataConfig, split: str) -> Optional[str]:
  """The .mrg file of a split of the "parsing" source, None if the split is unset."""
  path = config.train_src if split == "train" else config.dev_src
  if not path and split == "train":
    raise DataError("source='parsing' needs --train_src: a file of bracketed trees "
                    "(.mrg, e.g. ../shared/data/ptb_wsj_sample/train.mrg).")
  return path or None


def parsing_pairs(path: str) -> List[Tuple[str, str]]:
  """(sentence, linearized tree) of every tree of a treebank file, in file order.

  Raises:
    DataError: the file is missing, not UTF-8, or holds a malformed tree (naming the
      file and line).
  """
  check_file_exists(path)
  with open_binary(path) as f:
    data = f.read()
  try:
    pairs = parsing.read_examples(parsing.decode_utf8(data, path), path)
  except parsing.TreeError as error:
    raise DataError(f"{error} Fix the tree or remove it from the file.") from None
  if not pairs:
    raise DataError(f"Treebank {path} holds no trees; point --train_src/--dev_src at "
                    ".mrg files with one bracketed tree per line.")
  return pairs


def _check_split(split: str):
  if split not in _TFDS_SPLITS:
    raise ValueError(f"split={split!r} must be 'train' or 'dev'")


class _UrlsRecorded(Exception):
  """Stops a builder's `_split_generators` once it has asked for its first download."""


class _RecordingDownloadManager:
  """Stands in for tfds' DownloadManager to learn which URLs a builder would fetch."""

  def __init__(self, manual_dir):
    self.manual_dir = manual_dir
    self.urls: List[str] = []

  def _record(self, url_or_urls, *args, **kwargs):
    del args, kwargs
    queue = [url_or_urls]  # breadth-first, in the builder's order
    while queue:
      item = queue.pop(0)
      if isinstance(item, dict):
        queue.extend(item.values())
      elif isinstance(item, (list, tuple)):
        queue.extend(item)
      elif item is not None:
        self.urls.append(str(getattr(item, "url", item)))
    if self.urls:
      raise _UrlsRecorded()
    return url_or_urls

  download = download_and_extract = download_kaggle_data = _record

  def extract(self, paths):
    return paths


def _download_urls(builder) -> List[str]:
  """The URLs a TFDS builder downloads first (empty when they cannot be learned)."""
  recorder = _RecordingDownloadManager(manual_dir=os.path.join(
      builder.data_dir, "manual"))
  try:  # stops at the first download (_UrlsRecorded)
    builder._split_generators(recorder)  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except  (also: a builder we cannot introspect)
    pass
  return recorder.urls


def _tfds_help(config: DataConfig, data_dir: str) -> str:
  return (f"Prepare it on a machine with internet, `tfds build {config.tfds_name} "
          f"--data_dir=DIR` (pip install tensorflow-datasets), copy DIR here and pass "
          f"--tfds_data_dir=DIR (now {data_dir}); or train from text files with "
          "--data_source=files --train_src=... --train_tgt=... (BUILD.md, Data).")


def _check_download_reachable(builder, config: DataConfig) -> None:
  """Fails fast, with what to do, when an unprepared dataset's download is unreachable.

  Offline, tfds' downloader retries with back-off for minutes before failing; one probe
  of the first URL without retries tells the user at once.
  """
  import requests  # pylint: disable=import-outside-toplevel  (a tensorflow-datasets dependency)

  urls = [u for u in _download_urls(builder) if u.startswith(("http://", "https://"))]
  if not urls:
    return  # ftp, Kaggle, manual downloads: left to tfds
  try:
    requests.head(urls[0], timeout=20, allow_redirects=True)
  except requests.exceptions.Timeout:
    return  # slow, not absent: tfds retries
  except requests.ConnectionError as error:  # no route, no DNS, refused
    reason = str(error).split("(Caused by")[-1].strip(" )")[:200]
    raise DataError(
        f"tensorflow-datasets {config.tfds_name!r} is not prepared in "
        f"{builder.data_dir} and its download ({urls[0]}) cannot be reached from this "
        f"machine ({type(error).__name__}: {reason}). " + _tfds_help(
            config, config.tfds_data_dir or "the default ~/tensorflow_datasets")) from None


def _load_tfds(config: DataConfig, split: str) -> tf.data.Dataset:
  """The TFDS split as a dataset of feature dicts keyed by language.

  The dataset is prepared on first use (downloaded and converted by its real TFDS
  builder into --tfds_data_dir); an unreachable download fails fast with what to do.
  """
  import tensorflow_datasets as tfds  # Heavy import, only for this source.

  try:
    builder = tfds.builder(config.tfds_name, data_dir=config.tfds_data_dir)
  except Exception as e:  # pylint: disable=broad-except  (unknown name, bad config, ...)
    raise DataError(f"--tfds_name={config.tfds_name!r}: tensorflow-datasets cannot build "
                    f"it ({type(e).__name__}: {str(e).splitlines()[0][:300]}). Use a "
                    "name of `tfds.list_builders()`, e.g. wmt14_translate/de-en.") from None
  languages = sorted(builder.info.features.keys())
  for lang in (config.source_lang, config.target_lang):
    if lang not in languages:
      raise DataError(f"{config.tfds_name} has languages {languages}; "
                      f"--source_lang/--target_lang={lang!r} is not one of them.")
  if not builder.is_prepared():
    _check_download_reachable(builder, config)
  try:
    builder.download_and_prepare()
    return builder.as_dataset(split=_TFDS_SPLITS[split], shuffle_files=False)
  except Exception as e:  # Download/preparation failures of any kind.
    raise DataError(
        f"Could not prepare tensorflow-datasets {config.tfds_name!r} split "
        f"{_TFDS_SPLITS[split]!r} in {builder.data_dir} ({type(e).__name__}: "
        f"{str(e)[:500]}). " + _tfds_help(
            config, config.tfds_data_dir or "the default ~/tensorflow_datasets")) from e


def tfds_fingerprint(config: DataConfig, split: str) -> dict:
  """What identifies a TFDS split's content (name, version, split, direction)."""
  import tensorflow_datasets as tfds

  builder = tfds.builder(config.tfds_name, data_dir=config.tfds_data_dir)
  return {"tfds": config.tfds_name, "version": str(builder.info.version),
          "split": _TFDS_SPLITS[split], "src": config.source_lang,
          "tgt": config.target_lang}


def _valid_utf8(text: tf.Tensor) -> tf.Tensor:
  fixed = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                       replacement_char=0xFFFD,
                                       replace_control_characters=False)
  return tf.equal(fixed, text)


def synthetic_vocab_size(config: DataConfig) -> int:
  """Reserved ids plus the task's symbols."""
  return NUM_RESERVED_IDS + config.synthetic_vocab_size


def synthetic_examples(config: DataConfig, split: str
                       ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Generates the copy/reverse task deterministically (seeded per split).

  Returns:
    (sources, targets, lengths): flat int32 symbol arrays of all examples
    concatenated (no EOS; symbols in [NUM_RESERVED_IDS, NUM_RESERVED_IDS +
    synthetic_vocab_size)) and the length of each example (same for both sides).
  """
  _check_split(split)
  if config.synthetic_task not in SYNTHETIC_TASKS:
    raise ValueError(f"synthetic_task={config.synthetic_task!r} must be one of "
                     f"{SYNTHETIC_TASKS}")
  lo, hi = config.synthetic_min_length, config.synthetic_max_length
  if not 1 <= lo <= hi or config.synthetic_vocab_size < 1:
    raise ValueError(f"synthetic lengths must satisfy 1 <= min ({lo}) <= max ({hi}) "
                     f"and synthetic_vocab_size ({config.synthetic_vocab_size}) >= 1")
  size = config.synthetic_train_size if split == "train" else config.synthetic_eval_size
  if size < 1:
    raise DataError(f"synthetic_{split.replace('dev', 'eval')}_size={size} must be "
                    ">= 1")
  rng = np.random.default_rng([config.seed, 0 if split == "train" else 1])
  lengths = rng.integers(lo, hi + 1, size=size).astype(np.int64)
  sources = rng.integers(NUM_RESERVED_IDS, synthetic_vocab_size(config),
                         size=int(lengths.sum()), dtype=np.int32)
  if config.synthetic_task == "copy":
    return sources, sources.copy(), lengths
  starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
  ends = np.repeat(np.cumsum(lengths) - 1, lengths)
  positions = np.arange(len(sources))
  return sources, sources[starts + ends - positions], lengths


# ---------------------------------------------------------------- one object per kind
def file_fingerprint(path: str, with_mtime: bool = True) -> dict:
  """Cheap content identity of a file: size, head and tail bytes (and mtime)."""
  check_file_exists(path)
  stat = tf.io.gfile.stat(path)
  size = stat.length
  sha = hashlib.sha256()
  with open_binary(path) as f:
    sha.update(f.read(_HEAD_TAIL_BYTES))
    if size > _HEAD_TAIL_BYTES:
      f.seek(max(_HEAD_TAIL_BYTES, size - _HEAD_TAIL_BYTES))
      sha.update(f.read())
  fingerprint = {"size": size, "sha256_head_tail": sha.hexdigest()}
  if with_mtime:
    fingerprint["mtime_ns"] = stat.mtime_nsec
  return fingerprint


class Source:
  """What the pipeline, the cache, the vocabulary and the model directory ask of a data
  source. `data_source(config)` makes the object of `config.source`; no other module
  asks which kind it holds.

  Text sources give (source, target) string pairs, which a SentencePiece vocabulary
  and the tokenized cache turn into ids; the synthetic source gives ids directly.
  """

  kind = ""
  is_text = True  # string pairs under a SentencePiece vocabulary (else ids: `examples`)
  # Raw files that are scanned once (line counts, UTF-8) before they are read; the
  # cache stores the scan's result (cache.validated_files).
  scanned_before_reading = False
  split_by_unicode_script = True  # the SentencePiece option of its vocabulary

  def __init__(self, config: DataConfig):
    self.config = config

  def has_split(self, split: str) -> bool:
    """Whether the split is configured (dev is optional); raises DataError when it is
    configured wrongly."""
    raise NotImplementedError

  def fingerprint(self, split: str, with_mtime: bool = True,
                  shared_vocab: bool = False) -> Optional[dict]:
    """What determines the split's text (a cache key); None when the split is unset.

    Args:
      split: "train" or "dev".
      with_mtime: include file modification times (caches: yes; vocabulary name: no).
      shared_vocab: identify the language pair regardless of direction (a shared
        vocabulary is the same for EN->DE and DE->EN).
    """
    raise NotImplementedError

  def _raw_pairs(self, split: str) -> Optional[tf.data.Dataset]:
    raise NotImplementedError

  def text_pairs(self, split: str) -> Optional[tf.data.Dataset]:
    """(source, target) scalar-string pairs of a split, in corpus order; None when the
    split is not configured. Lines that are not valid UTF-8 are dropped here when
    skip_invalid_utf8 is set (the scan counted them), so the tokenizer never sees them.
    """
    _check_split(split)
    ds = self._raw_pairs(split)
    if ds is not None and self.config.skip_invalid_utf8:
      ds = ds.filter(lambda s, t: tf.logical_and(_valid_utf8(s), _valid_utf8(t)))
    return ds

  def python_pairs(self, split: str = "train") -> Iterator[Tuple[str, str]]:
    """The same pairs as `text_pairs`, as Python strings (for vocabulary sampling)."""
    _check_split(split)
    text = self.text_pairs(split)
    if text is None:
      return
    # Batched: tf.data costs per element, and TFDS splits have millions.
    for src_batch, tgt_batch in text.batch(4096).as_numpy_iterator():
      for src, tgt in zip(src_batch, tgt_batch):
        yield src.decode("utf-8"), tgt.decode("utf-8")


class FileSource(Source):
  """Line-aligned parallel text files (--train_src/--train_tgt, --dev_src/--dev_tgt)."""

  kind = "files"
  scanned_before_reading = True

  def has_split(self, split):
    return split_files(self.config, split) is not None

  def fingerprint(self, split, with_mtime=True, shared_vocab=False):
    paths = split_files(self.config, split)
    if paths is None:
      return None
    fps = [file_fingerprint(p, with_mtime) for p in paths]
    return {"files": sorted(fps, key=json.dumps) if shared_vocab else fps}

  def _raw_pairs(self, split):
    paths = split_files(self.config, split)
    if paths is None:
      return None
    return tf.data.Dataset.zip(tuple(tf.data.TextLineDataset(p) for p in paths))

  def python_pairs(self, split="train"):
    _check_split(split)
    paths = split_files(self.config, split)
    if paths is None:
      return
    with open_binary(paths[0]) as fs, open_binary(paths[1]) as ft:
      for src, tgt in zip(fs, ft):
        try:
          yield src.decode("utf-8").rstrip("\r\n"), tgt.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
          if not self.config.skip_invalid_utf8:
            raise DataError(f"{paths[0]} / {paths[1]}: invalid UTF-8; validate the "
                            "files first or set --skip_invalid_utf8") from None


class TreebankSource(Source):
  """Bracketed trees (.mrg) for parsing: each sentence paired with its linearized tree."""

  kind = "parsing"
  # Tree tokens such as "(NP" must be able to become single pieces (tokenizer.py).
  split_by_unicode_script = False

  def has_split(self, split):
    return treebank_file(self.config, split) is not None

  def fingerprint(self, split, with_mtime=True, shared_vocab=False):
    path = treebank_file(self.config, split)
    if path is None:
      return None
    # The linearization version: a new target format must not reuse old caches.
    return {"treebank": file_fingerprint(path, with_mtime),
            "linearization": parsing.LINEARIZATION_VERSION}

  def _raw_pairs(self, split):
    path = treebank_file(self.config, split)
    if path is None:
      return None
    sentences, trees = zip(*parsing_pairs(path))
    return tf.data.Dataset.from_tensor_slices((list(sentences), list(trees)))

  def text_pairs(self, split):
    _check_split(split)
    return self._raw_pairs(split)  # read as Python text: already valid UTF-8

  def python_pairs(self, split="train"):
    _check_split(split)
    path = treebank_file(self.config, split)
    if path is not None:
      yield from parsing_pairs(path)


class TfdsSource(Source):
  """A tensorflow-datasets translation dataset (--tfds_name), in one direction."""

  kind = "tfds"

  def has_split(self, split):
    return True

  def fingerprint(self, split, with_mtime=True, shared_vocab=False):
    fp = tfds_fingerprint(self.config, split)
    if shared_vocab:
      fp["src"], fp["tgt"] = sorted((fp["src"], fp["tgt"]))
    return fp

  def _raw_pairs(self, split):
    src, tgt = self.config.source_lang, self.config.target_lang
    # Pick sides by language name: TFDS supervised keys are ('de', 'en'), so the
    # paper's EN->DE direction is the supervised pair swapped.
    return _load_tfds(self.config, split).map(lambda ex: (ex[src], ex[tgt]))


class SyntheticSource(Source):
  """tensor2tensor's algorithmic tasks (copy, reverse): ids, no text, no vocabulary."""

  kind = "synthetic"
  is_text = False

  @property
  def vocab_size(self) -> int:
    """Reserved ids plus the task's symbols."""
    return synthetic_vocab_size(self.config)

  def has_split(self, split):
    return True

  def examples(self, split: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    return synthetic_examples(self.config, split)

  def fingerprint(self, split, with_mtime=True, shared_vocab=False):
    raise ValueError("source='synthetic' has no text to fingerprint")

  def _raw_pairs(self, split):
    raise ValueError("source='synthetic' has no text; use one of 'files', 'tfds', "
                     "'parsing'")


_KINDS = {cls.kind: cls for cls in (FileSource, TreebankSource, TfdsSource,
                                    SyntheticSource)}
SOURCES = tuple(_KINDS)


def data_source(config: DataConfig) -> Source:
  """The Source object of `config.source`.

  Raises:
    DataError: an unknown kind, naming the ones there are.
  """
  if config.source not in _KINDS:
    raise DataError(
        f"source={config.source!r} is not supported by t2t_keras.data (one of "
        f"{SOURCES}); convert the data to line-aligned files and use 'files'.")
  return _KINDS[config.source](config)


def text_pairs(config: DataConfig, split: str) -> Optional[tf.data.Dataset]:
  """`data_source(config).text_pairs(split)`."""
  return data_source(config).text_pairs(split)


def python_text_pairs(config: DataConfig, split: str = "train"
                      ) -> Iterator[Tuple[str, str]]:
  """`data_source(config).python_pairs(split)`."""
  return data_source(config).python_pairs(split)
