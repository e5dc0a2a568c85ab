"""Where sentence pairs come from: parallel text files, tensorflow-datasets, synthetic
tasks, and treebanks for parsing.

Each kind is one object behind a small protocol (`Source`, made by `data_source`):
whether a split is configured, a fingerprint of its content (the cache key and the
vocabulary's name), and the pairs, as
  * a `tf.data.Dataset` of (source, target) scalar strings for one split, and
  * a Python iterator over the same pairs (for sampling the vocabulary).
The vocabulary builder, the tokenized cache, the pipeline and the model directory ask
these objects and never which kind they hold. Synthetic tasks (copy, reverse:
tensor2tensor's algorithmic problems) skip text and yield id sequences directly, so
demos and tests run with no data and no vocabulary.
The parsing source reads bracketed trees (.mrg: --train_src, --dev_src) and pairs each
sentence with its linearized tree (t2t_keras.parsing), so parsing uses the vocabulary,
caches, bucketing and training loop of translation unchanged.

Reading and checking text files is t2t_keras.data.textfiles'; loading TFDS datasets
offline-first is t2t_keras.data.tfds_reader's.
"""

from __future__ import annotations

import json
from typing import Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from t2t_keras import NUM_RESERVED_IDS, parsing
from t2t_keras.configs import DataConfig
from t2t_keras.data import textfiles, tfds_reader
from t2t_keras.errors import DataError

SYNTHETIC_TASKS = ("copy", "reverse")
SPLITS = ("train", "dev")


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


def parsing_pairs(path: str, linearization: str = "tags") -> List[Tuple[str, str]]:
  """(sentence, linearized tree) of every tree of a treebank file, in file order.

  Raises:
    DataError: the file is missing, not UTF-8, or holds a malformed tree (naming the
      file and line).
  """
  textfiles.check_file_exists(path)
  with textfiles.open_binary(path) as f:
    data = f.read()
  try:
    pairs = parsing.read_examples(parsing.decode_utf8(data, path), path, linearization)
  except parsing.TreeError as error:
    raise DataError(f"{error} Fix the tree or remove it from the file.") from None
  if not pairs:
    raise DataError(f"Treebank {path} holds no trees; point --train_src/--dev_src at "
                    ".mrg files with one bracketed tree per line.")
  return pairs


def _check_split(split: str):
  if split not in SPLITS:
    raise ValueError(f"split={split!r} must be 'train' or 'dev'")


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

  def fingerprint(self, split: str, shared_vocab: bool = False) -> Optional[dict]:
    """What determines the split's text (a cache key); None when the split is unset.

    Args:
      split: "train" or "dev".
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

  def fingerprint(self, split, shared_vocab=False):
    paths = split_files(self.config, split)
    if paths is None:
      return None
    fps = [textfiles.file_fingerprint(p) for p in paths]
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
    with textfiles.open_binary(paths[0]) as fs, textfiles.open_binary(paths[1]) as ft:
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

  def fingerprint(self, split, shared_vocab=False):
    path = treebank_file(self.config, split)
    if path is None:
      return None
    # The linearization: a new target format must not reuse old caches ("tags" keeps
    # the key it had before "words" existed).
    fp = {"treebank": textfiles.file_fingerprint(path),
          "linearization": parsing.LINEARIZATION_VERSION}
    if self.config.parsing_linearization != "tags":
      fp["linearization"] = f"{fp['linearization']}-{self.config.parsing_linearization}"
    return fp

  def _raw_pairs(self, split):
    path = treebank_file(self.config, split)
    if path is None:
      return None
    sentences, trees = zip(*parsing_pairs(path, self.config.parsing_linearization))
    return tf.data.Dataset.from_tensor_slices((list(sentences), list(trees)))

  def text_pairs(self, split):
    _check_split(split)
    return self._raw_pairs(split)  # read as Python text: already valid UTF-8

  def python_pairs(self, split="train"):
    _check_split(split)
    path = treebank_file(self.config, split)
    if path is not None:
      yield from parsing_pairs(path, self.config.parsing_linearization)


class TfdsSource(Source):
  """A tensorflow-datasets translation dataset (--tfds_name), in one direction."""

  kind = "tfds"

  def has_split(self, split):
    return True

  def fingerprint(self, split, shared_vocab=False):
    fp = tfds_reader.fingerprint(self.config, split)
    if shared_vocab:
      fp["src"], fp["tgt"] = sorted((fp["src"], fp["tgt"]))
    return fp

  def _raw_pairs(self, split):
    src, tgt = self.config.source_lang, self.config.target_lang
    # Pick sides by language name: TFDS supervised keys are ('de', 'en'), so the
    # paper's EN->DE direction is the supervised pair swapped.
    return tfds_reader.load(self.config, split).map(lambda ex: (ex[src], ex[tgt]))


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

  def fingerprint(self, split, shared_vocab=False):
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
