"""Where sentence pairs come from: parallel text files, tensorflow-datasets, synthetic
tasks, and treebanks for parsing.

Each kind is one object behind a small protocol (`Source`, made by `data_source`):
  * its settings: the DataConfig fields (flags) it reads (`reads`) and their checks
    (`problems`, raised by `validate()`; `check_model` for model flags that depend
    on the data), so the flags module refuses flags of other sources and validates
    a command line by asking the source;
  * its files: `check_files` scans raw files once before they are read (the cache
    stores the result, cache.validated_files);
  * its splits: whether a split is configured, a fingerprint of its content (the
    cache key and the vocabulary's name), and the pairs, as a `tf.data.Dataset` of
    (source, target) scalar strings, a Python iterator (vocabulary sampling), and
    `dev_pairs`, the dev sentences and references as text (dev BLEU in training).
The flags, the vocabulary builder, the tokenized cache, the pipeline, the model
directory and train.py ask these objects and never which kind they hold.

The protocol (`Source` and its defaults) is t2t_keras.data.sources.source's; adding a
source is a subclass of it here and its line in `SOURCE_CLASSES` (the flag
--data_source accepts it from then on); settings of its own are DataConfig fields
(configs.py), named in its `reads`. Synthetic tasks (copy, reverse:
tensor2tensor's algorithmic problems) skip text and yield id sequences directly, so
demos and tests run with no data and no vocabulary.
The parsing source reads bracketed trees (.mrg: --train_src, --dev_src) and pairs each
sentence with its linearized tree (t2t_keras.parsing), so parsing uses the vocabulary,
caches, bucketing and training loop of translation unchanged.

Reading and checking text files is t2t_keras.data.sources.textfiles'; loading TFDS datasets
offline-first is t2t_keras.data.fetch.tfds_reader's.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Dict, List, Optional, Tuple, Type

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras import NUM_RESERVED_IDS, language_tags, parsing
from t2t_keras.configs import DataConfig
from t2t_keras.data.sources import corpora, textfiles
from t2t_keras.data.fetch import tfds_reader
from t2t_keras.data.sources.source import Source, check_split
from t2t_keras.errors import DataError

SYNTHETIC_TASKS = ("copy", "reverse")


def split_files(config: DataConfig, split: str) -> Optional[Tuple[str, str]]:
  """(source, target) paths of a split of the "files" source, None if unset.

  Raises:
    DataError: the files are not both given (`FileSource.problems`).
  """
  return FileSource(config).paths(split)


def treebank_file(config: DataConfig, split: str) -> Optional[str]:
  """The .mrg file of a split of the "parsing" source, None if the split is unset."""
  return TreebankSource(config).path(split)


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


def synthetic_vocab_size(config: DataConfig) -> int:
  """Reserved ids plus the task's symbols."""
  return NUM_RESERVED_IDS + config.synthetic_vocab_size


def _synthetic_examples(config: DataConfig, split: str
                        ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The copy/reverse task of a validated config, deterministic (seeded per split)."""
  check_split(split)
  lo, hi = config.synthetic_min_length, config.synthetic_max_length
  size = config.synthetic_train_size if split == "train" else config.synthetic_eval_size
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
class FileSource(Source):
  """Line-aligned parallel text files (--train_src/--train_tgt, --dev_src/--dev_tgt)."""

  kind = "files"
  summary = ("line-aligned text files (--train_src/--train_tgt, several comma-separated "
             "with --train_weights; --dev_src/--dev_tgt)")
  reads = ("train_src", "train_tgt", "dev_src", "dev_tgt", "train_weights",
           "train_weights_by", "target_language_tags", "dev_target_language",
           "train_alignments")
  dev_help = "set --dev_src and --dev_tgt"
  scanned_before_reading = True

  def problems(self):
    config, problems = self.config, super().problems()
    if not config.train_src:
      problems.insert(0, "--data_source=files needs --train_src and --train_tgt (line-"
                      "aligned source and target files): name the training files, or "
                      "use --data_source=synthetic")
      return problems
    if not config.train_tgt:
      problems.insert(0, f"--data_source=files needs --train_tgt (the target file, "
                      f"line-aligned with --train_src={config.train_src})")
      return problems
    src, tgt = corpora.split_list(config.train_src), corpora.split_list(config.train_tgt)
    if len(src) != len(tgt):
      problems.insert(0, f"--train_src names {len(src)} files and --train_tgt {len(tgt)} "
                      f"(--train_src={config.train_src}, --train_tgt={config.train_tgt}): "
                      "give one target file per source file, comma-separated, in the "
                      "same order")
    elif not all(src + tgt):
      problems.insert(0, f"--train_src={config.train_src} / --train_tgt="
                      f"{config.train_tgt} has an empty file name between commas")
    else:
      problems += corpora.weight_problems(config.train_weights, len(src),
                                          "--train_src/--train_tgt")
      problems += language_tags.problems(config, len(src))
      problems += self._alignment_problems(len(src))
    return problems

  def _alignment_problems(self, corpora_count: int) -> List[str]:
    """--train_alignments needs what its lines can be matched to: one corpus, words
    counted from the text alone."""
    config, problems = self.config, []
    if not config.train_alignments:
      return problems
    if corpora_count > 1:
      problems.append(f"--train_alignments={config.train_alignments} with several "
                      f"corpora (--train_src={config.train_src}) is not supported yet: "
                      "train on one corpus (concatenate the files and their alignments)")
    if config.target_language_tags:
      problems.append(f"--train_alignments={config.train_alignments} cannot be used with "
                      f"--target_language_tags={config.target_language_tags} yet: the "
                      "tag added to each source is not one of its words; drop one")
    return problems

  def corpus_paths(self, split: str) -> List[Tuple[str, str]]:
    """(source, target) paths of each corpus of a split ([] if it is unset).

    Raises:
      DataError: the files are not given in pairs (`problems`).
    """
    check_split(split)
    config = self.validate().config
    if split == "dev":
      return [(config.dev_src, config.dev_tgt)] if config.dev_src else []
    return list(zip(corpora.split_list(config.train_src),
                    corpora.split_list(config.train_tgt)))

  def corpora(self, split):
    paths = self.corpus_paths(split)
    if len(paths) < 2:
      return super().corpora(split)
    languages = language_tags.split(self.config.target_language_tags) or [None] * len(
        paths)
    return [(src, dataclasses.replace(self.config, train_src=src, train_tgt=tgt,
                                      train_weights=None, target_language_tags=language))
            for (src, tgt), language in zip(paths, languages)]

  def paths(self, split: str) -> Optional[Tuple[str, str]]:
    """(source, target) paths of a split, None if it is unset (several training
    corpora: comma-separated, see `corpus_paths`).

    Raises:
      DataError: the files are not both given (`problems`).
    """
    check_split(split)
    config = self.validate().config
    src, tgt = ((config.train_src, config.train_tgt) if split == "train"
                else (config.dev_src, config.dev_tgt))
    return (src, tgt) if src else None

  def has_split(self, split):
    return self.paths(split) is not None

  def check_files(self, split):
    result = {"num_lines": 0, "invalid_pairs": 0}
    for paths in self.corpus_paths(split):
      start = time.time()
      src, tgt = textfiles.validate_parallel_files(*paths, self.config.skip_invalid_utf8)
      invalid = sorted(set(src.invalid_lines) | set(tgt.invalid_lines))
      for scan in (src, tgt):
        if scan.invalid_lines:
          logging.warning("%s: %d lines of invalid UTF-8 will be skipped (first: line "
                          "%d)", scan.path, len(scan.invalid_lines), scan.invalid_lines[0])
      logging.info("Validated %s and %s: %d lines each in %.1fs", *paths, src.num_lines,
                   time.time() - start)
      result["num_lines"] += src.num_lines
      result["invalid_pairs"] += len(invalid)
    return result

  def dev_pairs(self, n):
    """The first `n` lines of --dev_src and --dev_tgt (undecodable bytes replaced)."""
    paths = self.paths("dev")
    if paths is None:
      return None
    sources, references = [], []
    for path, lines in zip(paths, (sources, references)):
      with tf.io.gfile.GFile(path, "rb") as f:  # gs:// too
        for line in f:
          if len(lines) == n:
            break
          lines.append(line.decode("utf-8", errors="replace").rstrip("\r\n"))
    if len(sources) != len(references):
      raise DataError(f"--dev_src {paths[0]} has {len(sources)} lines but --dev_tgt "
                      f"{paths[1]} has {len(references)} within the first {n}.")
    return sources, references

  def fingerprint(self, split, shared_vocab=False):
    paths = self.corpus_paths(split)
    if not paths:
      return None
    fps = [textfiles.file_fingerprint(p) for pair in paths for p in pair]
    fp = {"files": sorted(fps, key=json.dumps) if shared_vocab else fps}
    if self.config.target_language_tags:  # the vocabulary's tags, the split's sources'
      fp["tags"] = (language_tags.languages(self.config) if shared_vocab else
                    language_tags.split(self.config.target_language_tags) if split == "train"
                    else language_tags.split_language(self.config, split))
    return fp

  def _raw_pairs(self, split):
    ds = None
    for paths in self.corpus_paths(split):  # corpus after corpus
      pairs = tf.data.Dataset.zip(tuple(tf.data.TextLineDataset(p) for p in paths))
      ds = pairs if ds is None else ds.concatenate(pairs)
    return ds

  def python_pairs(self, split="train"):
    """Every corpus's pairs, corpus after corpus (the vocabulary samples them all)."""
    for paths in self.corpus_paths(split):
      with textfiles.open_binary(paths[0]) as fs, textfiles.open_binary(paths[1]) as ft:
        for src, tgt in zip(fs, ft):
          try:
            yield (src.decode("utf-8").rstrip("\r\n"),
                   tgt.decode("utf-8").rstrip("\r\n"))
          except UnicodeDecodeError:
            if not self.config.skip_invalid_utf8:
              raise DataError(f"{paths[0]} / {paths[1]}: invalid UTF-8; validate the "
                              "files first or set --skip_invalid_utf8") from None


class TreebankSource(Source):
  """Bracketed trees (.mrg) for parsing: each sentence paired with its linearized tree
  (dev BLEU scores linearized trees; `evaluate --task=parsing` gives F1)."""

  kind = "parsing"
  summary = "bracketed trees for parsing (.mrg files: --train_src, --dev_src)"
  reads = ("train_src", "dev_src", "parsing_linearization")
  dev_help = "set --dev_src (a .mrg file of bracketed trees)"
  # Tree tokens such as "(NP" must be able to become single pieces (tokenizer.py).
  split_by_unicode_script = False

  def problems(self):
    problems = super().problems()
    if not self.config.train_src:
      problems.append("--data_source=parsing needs --train_src: a file of bracketed "
                      "trees (.mrg, e.g. data/ptb_wsj_sample/train.mrg)")
    return problems

  def check_model(self, model_config):
    linearization = self.config.parsing_linearization
    if model_config.source_pointer and linearization != "words":
      return ["--source_pointer points at the next source word the target copies, and "
              f"--parsing_linearization={linearization} copies none: use "
              "--parsing_linearization=words, or drop --source_pointer"]
    return []

  def path(self, split: str) -> Optional[str]:
    """The .mrg file of a split, None if it is unset.

    Raises:
      DataError: no training file (`problems`).
    """
    check_split(split)
    self.validate()
    return (self.config.train_src if split == "train" else self.config.dev_src) or None

  def has_split(self, split):
    return self.path(split) is not None

  def fingerprint(self, split, shared_vocab=False):
    path = self.path(split)
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
    path = self.path(split)
    if path is None:
      return None
    sentences, trees = zip(*parsing_pairs(path, self.config.parsing_linearization))
    return tf.data.Dataset.from_tensor_slices((list(sentences), list(trees)))

  def text_pairs(self, split):
    check_split(split)
    return self._raw_pairs(split)  # read as Python text: already valid UTF-8

  def python_pairs(self, split="train"):
    check_split(split)
    path = self.path(split)
    if path is not None:
      yield from parsing_pairs(path, self.config.parsing_linearization)


class TfdsSource(Source):
  """A tensorflow-datasets translation dataset (--tfds_name), in one direction; its
  validation split is the dev set."""

  kind = "tfds"
  summary = ("a tensorflow-datasets translation dataset (--tfds_name, --source_lang, "
             "--target_lang; its validation split is the dev set)")
  reads = ("tfds_name", "tfds_data_dir", "source_lang", "target_lang",
           "tfds_train_subsets", "train_weights", "train_weights_by")

  def problems(self):
    problems = super().problems()
    if self.config.source_lang == self.config.target_lang:
      problems.append(f"--source_lang and --target_lang are both "
                      f"{self.config.source_lang!r}: name the two languages of the pair, "
                      "one each")
    subsets = corpora.split_list(self.config.tfds_train_subsets)
    if not all(subsets):
      problems.append(f"--tfds_train_subsets={self.config.tfds_train_subsets} has an "
                      "empty name between commas")
    elif len(set(subsets)) < len(subsets):
      problems.append(f"--tfds_train_subsets={self.config.tfds_train_subsets} names a "
                      "sub-dataset twice: name each once and weight it with "
                      "--train_weights")
    elif self.config.train_weights and not subsets:
      problems.append(f"--train_weights={self.config.train_weights} weights the training "
                      "sub-datasets of --tfds_train_subsets (e.g. europarl_v7,commoncrawl,"
                      "newscommentary_v9): name them, or drop --train_weights")
    else:
      problems += corpora.weight_problems(self.config.train_weights, len(subsets),
                                          "--tfds_train_subsets")
    return problems

  def corpora(self, split):
    subsets = corpora.split_list(self.config.tfds_train_subsets) if (
        split == "train") else []
    if len(subsets) < 2:
      return super().corpora(split)
    return [(name, dataclasses.replace(self.config, tfds_train_subsets=name,
                                       train_weights=None)) for name in subsets]

  def has_split(self, split):
    return True

  def fingerprint(self, split, shared_vocab=False):
    fp = tfds_reader.fingerprint(self.config, split)
    if shared_vocab:
      fp["src"], fp["tgt"] = sorted((fp["src"], fp["tgt"]))
    return fp

  def _raw_pairs(self, split):
    src, tgt = self.config.source_lang, self.config.target_lang
    parts = self.corpora(split)
    if len(parts) > 1:  # several sub-datasets (the vocabulary): one after the other
      ds = None
      for _, config in parts:
        pairs = TfdsSource(config)._raw_pairs(split)  # pylint: disable=protected-access
        ds = pairs if ds is None else ds.concatenate(pairs)
      return ds
    # Pick sides by language name: TFDS supervised keys are ('de', 'en'), so the
    # paper's EN->DE direction is the supervised pair swapped.
    return tfds_reader.load(self.config, split).map(lambda ex: (ex[src], ex[tgt]))


class SyntheticSource(Source):
  """tensor2tensor's algorithmic tasks (copy, reverse): ids, no text, no vocabulary;
  the dev set is held-out examples of another seed."""

  kind = "synthetic"
  summary = "an offline algorithmic task (--synthetic_task: copy or reverse), ids only"
  reads = ("synthetic_task", "synthetic_min_length", "synthetic_max_length",
           "synthetic_vocab_size", "synthetic_train_size", "synthetic_eval_size")
  is_text = False

  def problems(self):
    config, problems = self.config, super().problems()
    if config.synthetic_task not in SYNTHETIC_TASKS:
      problems.append(f"--synthetic_task={config.synthetic_task!r} must be one of "
                      f"{', '.join(SYNTHETIC_TASKS)}")
    lo, hi = config.synthetic_min_length, config.synthetic_max_length
    if not 1 <= lo <= hi:
      problems.append(f"--synthetic_min_length={lo} and --synthetic_max_length={hi} "
                      "must satisfy 1 <= min <= max")
    for name in ("synthetic_vocab_size", "synthetic_train_size", "synthetic_eval_size"):
      if getattr(config, name) < 1:
        problems.append(f"--{name}={getattr(config, name)} must be >= 1")
    return problems

  @property
  def vocab_size(self) -> int:
    """Reserved ids plus the task's symbols."""
    return synthetic_vocab_size(self.config)

  def has_split(self, split):
    return True

  def examples(self, split: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Generates the split deterministically (seeded per split).

    Returns:
      (sources, targets, lengths): flat int32 symbol arrays of all examples
      concatenated (no EOS; symbols in [NUM_RESERVED_IDS, NUM_RESERVED_IDS +
      synthetic_vocab_size)) and the length of each example (same for both sides).
    """
    return _synthetic_examples(self.validate().config, split)

  def dev_pairs(self, n):
    """The first `n` held-out examples as space-separated ids (IntegerTokenizer text)."""
    src, tgt, lengths = self.examples("dev")
    cuts = np.cumsum(lengths)[:-1]
    texts = [[" ".join(map(str, ids)) for ids in np.split(side, cuts)[:n]]
             for side in (src, tgt)]
    return texts[0], texts[1]

  def fingerprint(self, split, shared_vocab=False):
    raise ValueError("source='synthetic' has no text to fingerprint")

  def _raw_pairs(self, split):
    raise ValueError("source='synthetic' has no text; use one of 'files', 'tfds', "
                     "'parsing'")


# The registry: --data_source's choices, in this order (the first source that reads a
# flag is the one train's message proposes for it).
SOURCE_CLASSES: Dict[str, Type[Source]] = {
    cls.kind: cls for cls in (FileSource, TfdsSource, TreebankSource, SyntheticSource)}
SOURCES = tuple(SOURCE_CLASSES)
# Fields read by the sources of text (the vocabulary and the caches); a source of ids
# ignores them.
TEXT_FIELDS = ("vocab_size", "vocab_type", "vocab_file", "vocab_sample_sentences",
               "data_dir", "skip_invalid_utf8")


def flag_help() -> str:
  """--data_source's help: each source and what it reads."""
  return "Where the sentence pairs come from. " + "; ".join(
      f"{kind}: {cls.summary}" for kind, cls in SOURCE_CLASSES.items()) + "."


def data_source(config: DataConfig) -> Source:
  """The Source object of `config.source`.

  Raises:
    DataError: an unknown kind, naming the ones there are.
  """
  if config.source not in SOURCE_CLASSES:
    raise DataError(
        f"source={config.source!r} is not supported by t2t_keras.data (one of "
        f"{SOURCES}); convert the data to line-aligned files and use 'files'.")
  return SOURCE_CLASSES[config.source](config)
