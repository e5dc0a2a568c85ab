"""The protocol every data source implements (`Source`): what the flags, the pipeline,
the cache, the vocabulary, the model directory and training's dev BLEU ask of one.

The kinds of source and the registry that makes them (`data_source`) are
`t2t_keras.data.sources.sources`'; this module holds the interface they share and
its defaults, which a new kind (a test's too) subclasses.
"""

from __future__ import annotations

import itertools
from typing import Iterator, List, Optional, Tuple

import tensorflow as tf

from t2t_keras.configs import DataConfig, ModelConfig
from t2t_keras.errors import DataError

SPLITS = ("train", "dev")


def check_split(split: str):
  """Raises ValueError unless `split` is one of SPLITS."""
  if split not in SPLITS:
    raise ValueError(f"split={split!r} must be 'train' or 'dev'")


def _valid_utf8(text: tf.Tensor) -> tf.Tensor:
  fixed = tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace",
                                       replacement_char=0xFFFD,
                                       replace_control_characters=False)
  return tf.equal(fixed, text)


class Source:
  """What the flags, the pipeline, the cache, the vocabulary, the model directory and
  training's dev BLEU ask of a data source. `data_source(config)` makes the object of
  `config.source`; no other module asks which kind it holds.

  Text sources give (source, target) string pairs, which a SentencePiece vocabulary
  and the tokenized cache turn into ids; the synthetic source gives ids directly.

  `validate()` checks its settings (the flags layer and `make_datasets` call it; a
  model directory's source is made without its training files, to know its kind).
  """

  kind = ""
  summary = ""  # what it reads, one line of --data_source's help
  # The DataConfig fields (each its flag) this source reads; train refuses a flag of
  # another source typed on its command line (flags.check_train_flags).
  reads: Tuple[str, ...] = ()
  dev_help = ""  # how to configure a dev split, for messages ("": it always has one)
  is_text = True  # string pairs under a SentencePiece vocabulary (else ids: `examples`)
  # Raw files that are scanned once (line counts, UTF-8: `check_files`) before they
  # are read; the cache stores the scan's result (cache.validated_files).
  scanned_before_reading = False
  split_by_unicode_script = True  # the SentencePiece option of its vocabulary

  def __init__(self, config: DataConfig):
    self.config = config

  def validate(self) -> "Source":
    """Raises DataError naming each of `problems`; returns self."""
    problems = self.problems()
    if problems:
      raise DataError("; ".join(problems) + ".")
    return self

  def problems(self) -> List[str]:
    """What is wrong with this source's settings, each naming the flag and what to do
    (no file is read: `check_files` does that).

    Subclasses extend the base's check: a dev file pair given by halves is a mistake
    whichever source the flags serve (a recipe may hold another source's files, not
    half of them), except for a source that reads --dev_src alone.
    """
    config = self.config
    if "dev_src" in self.reads and "dev_tgt" not in self.reads:
      return []
    if bool(config.dev_src) != bool(config.dev_tgt):
      return [f"--dev_src and --dev_tgt go together: set both source and target files "
              f"of the dev split, or neither (got --dev_src={config.dev_src}, "
              f"--dev_tgt={config.dev_tgt})"]
    return []

  def check_model(self, model_config: ModelConfig) -> List[str]:
    """Model settings that cannot work with this source's data, as `problems`."""
    del model_config
    return []

  def corpora(self, split: str) -> List[Tuple[str, DataConfig]]:
    """The split's corpora as (name, a config of this source reading that corpus
    alone): several only for a training split of several corpora (--train_weights,
    t2t_keras/data/sources/corpora.py), each tokenized and cached on its own; else the one
    corpus, named by the split, with this source's own config."""
    check_split(split)
    return [(split, self.config)]

  def check_files(self, split: str) -> dict:
    """Scans the split's raw files before they are read (only sources with
    `scanned_before_reading`; call `cache.validated_files`, which stores the result).

    Returns:
      {"num_lines": int, "invalid_pairs": int (skipped with skip_invalid_utf8)}.

    Raises:
      DataError: missing files, different line counts, invalid UTF-8.
    """
    raise NotImplementedError

  def dev_pairs(self, n: int) -> Optional[Tuple[List[str], List[str]]]:
    """(sources, references): the first `n` dev pairs as text this source's tokenizer
    reads (dev BLEU while training); None when no dev split is configured."""
    if not self.has_split("dev"):
      return None
    pairs = list(itertools.islice(self.python_pairs("dev"), n))
    return [src for src, _ in pairs], [tgt for _, tgt in pairs]

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
    check_split(split)
    ds = self._raw_pairs(split)
    if ds is not None and self.config.skip_invalid_utf8:
      ds = ds.filter(lambda s, t: tf.logical_and(_valid_utf8(s), _valid_utf8(t)))
    return ds

  def python_pairs(self, split: str = "train") -> Iterator[Tuple[str, str]]:
    """The same pairs as `text_pairs`, as Python strings (for vocabulary sampling)."""
    check_split(split)
    text = self.text_pairs(split)
    if text is None:
      return
    # Batched: tf.data costs per element, and TFDS splits have millions.
    for src_batch, tgt_batch in text.batch(4096).as_numpy_iterator():
      for src, tgt in zip(src_batch, tgt_batch):
        yield src.decode("utf-8"), tgt.decode("utf-8")
