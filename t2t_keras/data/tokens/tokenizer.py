"""Subword vocabularies and the in-graph tokenizers that use them.

Tokenization runs inside TensorFlow (tensorflow-text's SentencePiece op), never in
Python: the training pipeline tokenizes in parallel in tf.data, and the very same
`tf.Module` is tracked by the exported SavedModel, so a TF Serving client sends text
and gets text back (tensor2tensor's clients had to encode ids themselves).

The vocabulary is shared by source and target (paper section 5.1): SentencePiece BPE
(the paper's EN-DE choice) or unigram (the word-piece-like EN-FR choice), trained on
a bounded reservoir sample of both sides of the training pairs, with the reserved ids
of `t2t_keras` (PAD 0, EOS 1, UNK 2, BOS 3) so ids agree everywhere. It is written
once to data_dir (or --vocab_file) and reused by every later run and tool.

With --separate_vocabularies (pairs in different scripts: EN-ZH, EN-RU) each side gets
its own model, trained on that side alone (`build_vocab(config, side)`), and a
`PairTokenizer` joins them: it tokenizes sources with the source model and
detokenizes outputs with the target model. Every tokenizer has `.source` and
`.target` (a single vocabulary's are itself), so code that tokenizes a target (the
tokenized cache, scoring, target prefixes) says which side it means.

For parsing, SentencePiece may merge across Unicode scripts (split_by_unicode_script
off): the linearized trees' tokens `(NP`, `-LRB-`, `PRP$` then become one piece each
(by default "(" and "NP" are separate pieces, making targets 31% longer).

Shape notation: B batch, T tokens.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import time
import uuid
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import sentencepiece as spm
import tensorflow as tf
from absl import logging

from t2t_keras import BOS_ID, EOS_ID, NUM_RESERVED_IDS, PAD_ID, UNK_ID, language_tags
from t2t_keras.configs import DataConfig
from t2t_keras.data.tokens import cache
from t2t_keras.data.sources import sources
from t2t_keras.data.fetch import leftovers



def _minor(version: str) -> str:
  return ".".join(version.split(".")[:2])


def _import_tensorflow_text():
  """tensorflow_text, or an ImportError that says which release to install.

  Its kernels link against one TensorFlow release line: another line fails with an
  undefined symbol deep inside TensorFlow's op loader, which names neither package.
  """
  line = _minor(tf.__version__)
  fix = (f"install the tensorflow-text of TensorFlow's release line: pip install "
         f"'tensorflow-text=={line}.*' (add --no-deps beside tensorflow-tpu or "
         f"tensorflow-cpu, which pip does not count as `tensorflow`; BUILD.md)")
  try:
    import tensorflow_text  # pylint: disable=import-outside-toplevel
  except ModuleNotFoundError:
    raise ImportError(f"tensorflow-text is not installed: {fix}") from None
  except Exception as e:  # pylint: disable=broad-except
    raise ImportError(f"tensorflow-text does not load with TensorFlow {tf.__version__} "
                      f"({type(e).__name__}: {str(e).strip()[:200]}): {fix}") from None
  if _minor(tensorflow_text.__version__) != line:
    raise ImportError(f"tensorflow-text {tensorflow_text.__version__} was built for "
                      f"another TensorFlow than {tf.__version__}: {fix}")
  return tensorflow_text


tf_text = _import_tensorflow_text()

VOCAB_TYPES = ("bpe", "unigram")
_PROGRESS_SECONDS = 10.0


def strip_special_ids(ids) -> tf.Tensor:
  """Keeps the ids before the first EOS, minus PAD and BOS.

  Args:
    ids: int ids, dense (..., T) (e.g. padded model output) or ragged.

  Returns:
    A ragged (or for rank 1 input, dense) int32 tensor of the remaining ids.
  """
  if isinstance(ids, tf.RaggedTensor):
    ids = ids.to_tensor(default_value=PAD_ID)
  ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
  before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=-1), 0)
  keep = before_eos & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)
  return tf.ragged.boolean_mask(ids, keep)


def _uniform(strings) -> tf.Tensor:
  """Detokenized strings of dense (..., T) ids have uniform outer dims: make dense."""
  return strings.to_tensor() if isinstance(strings, tf.RaggedTensor) else strings


class SentencePieceTokenizer(tf.Module):
  """Text <-> subword ids with a SentencePiece model, entirely in-graph.

  Attributes:
    vocab_size: number of ids (reserved ids included).
    vocab_file: the model file it was loaded from (None if built from bytes).
    model_proto: the serialized SentencePiece model.
  """

  def __init__(self, model_proto: bytes, vocab_file: Optional[str] = None,
               name: str = "sentencepiece_tokenizer"):
    super().__init__(name=name)
    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    reserved = (processor.pad_id(), processor.eos_id(), processor.unk_id(),
                processor.bos_id())
    if reserved != (PAD_ID, EOS_ID, UNK_ID, BOS_ID):
      raise sources.DataError(
          f"Vocabulary {vocab_file or '<bytes>'} has (pad, eos, unk, bos) ids "
          f"{reserved}, but t2t_keras needs {(PAD_ID, EOS_ID, UNK_ID, BOS_ID)}. "
          "Delete it and rebuild it with tools/build_vocab.py.")
    self.vocab_size = processor.get_piece_size()
    self.vocab_file = vocab_file
    self.model_proto = model_proto
    self._processor = processor
    self._sp = tf_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32)

  def tokenize(self, strings) -> tf.RaggedTensor:
    """Strings (any shape) -> int32 ids, ragged in a new last axis; no EOS added."""
    return self._sp.tokenize(strings)

  def detokenize(self, ids) -> tf.Tensor:
    """Ids (..., T), dense or ragged -> strings (...); stops at EOS, skips PAD/BOS."""
    return _uniform(self._sp.detokenize(strip_special_ids(ids)))

  @property
  def source(self):
    return self

  @property
  def target(self):
    return self

  def tag_id(self, language: str) -> int:
    """The id of a target-language tag piece (language_tags.py).

    Raises:
      DataError: the vocabulary has no such piece (built without that tag).
    """
    piece = language_tags.tag(language)
    index = self._processor.piece_to_id(piece)
    if index == UNK_ID or self._processor.id_to_piece(index) != piece:
      raise sources.DataError(
          f"Vocabulary {self.vocab_file or '<bytes>'} has no piece {piece}: it was built "
          "without that target-language tag (--target_language_tags when the vocabulary "
          "was built); rebuild it with the tags, or drop the target language.")
    return index


class IntegerTokenizer(tf.Module):
  """Tokenizer of the synthetic tasks: text is space-separated ids, e.g. "5 9 4".

  Same interface as SentencePieceTokenizer, so decoding and export work unchanged.
  Tokens that are not integers in [NUM_RESERVED_IDS, vocab_size) become UNK.
  """

  def __init__(self, vocab_size: int, name: str = "integer_tokenizer"):
    super().__init__(name=name)
    self.vocab_size = int(vocab_size)
    self.vocab_file = None
    self.model_proto = None

  def _to_ids(self, words: tf.Tensor) -> tf.Tensor:
    numeric = tf.strings.regex_full_match(words, "[0-9]{1,9}")
    ids = tf.strings.to_number(tf.where(numeric, words, str(UNK_ID)), tf.int32)
    valid = (ids >= NUM_RESERVED_IDS) & (ids < self.vocab_size)
    return tf.where(valid, ids, UNK_ID)

  def tokenize(self, strings) -> tf.RaggedTensor:
    words = tf.strings.split(strings)
    if isinstance(words, tf.RaggedTensor):
      return tf.ragged.map_flat_values(self._to_ids, words)
    return self._to_ids(words)

  def detokenize(self, ids) -> tf.Tensor:
    ids = strip_special_ids(ids)
    if isinstance(ids, tf.RaggedTensor):
      words = tf.ragged.map_flat_values(tf.strings.as_string, ids)
    else:
      words = tf.strings.as_string(ids)
    return _uniform(tf.strings.reduce_join(words, axis=-1, separator=" "))

  @property
  def source(self):
    return self

  @property
  def target(self):
    return self


class PairTokenizer(tf.Module):
  """Two SentencePiece vocabularies (--separate_vocabularies): sources are tokenized
  with `source`, outputs detokenized with `target`; target-language tags are source
  pieces (they are put before the source). `vocab_size` is the source's (the encoder's
  input), `target_vocab_size` the target's (the softmax's width)."""

  def __init__(self, source: SentencePieceTokenizer, target: SentencePieceTokenizer,
               name: str = "pair_tokenizer"):
    super().__init__(name=name)
    self.source_tokenizer = source
    self.target_tokenizer = target
    self.vocab_size = source.vocab_size
    self.target_vocab_size = target.vocab_size
    self.vocab_file = None
    self.model_proto = None  # two models: use .source / .target

  @property
  def source(self) -> SentencePieceTokenizer:
    return self.source_tokenizer

  @property
  def target(self) -> SentencePieceTokenizer:
    return self.target_tokenizer

  def tokenize(self, strings) -> tf.RaggedTensor:
    """Source strings -> ids of the source vocabulary."""
    return self.source_tokenizer.tokenize(strings)

  def detokenize(self, ids) -> tf.Tensor:
    """Output ids of the target vocabulary -> strings."""
    return self.target_tokenizer.detokenize(ids)

  def tag_id(self, language: str) -> int:
    return self.source_tokenizer.tag_id(language)


def sample_sentences(pairs: Iterable[Tuple[str, str]], max_sentences: int,
                     seed: int = 1, side: Optional[str] = None) -> List[str]:
  """Reservoir-samples pairs and returns both sides: a bounded, unbiased sample.

  Logs progress (sentences read, rate) every few seconds.

  Args:
    pairs: (source, target) strings, e.g. `sources.data_source(config).python_pairs()`.
    max_sentences: at most this many sentences are returned (half per side).
    seed: sampling seed.
    side: None (both sides), "source" or "target" (that side of the same sample).

  Returns:
    Non-empty sentences, sources and targets of the sampled pairs.
  """
  keep = max(1, max_sentences // 2)
  rng = random.Random(seed)
  reservoir: List[Tuple[str, str]] = []
  start = last = time.time()
  seen = 0
  for pair in pairs:
    if seen < keep:
      reservoir.append(pair)
    else:
      j = rng.randrange(seen + 1)
      if j < keep:
        reservoir[j] = pair
    seen += 1
    now = time.time()
    if now - last > _PROGRESS_SECONDS:
      last = now
      logging.info("Vocabulary: read %d sentences (%.0f sentences/s)", 2 * seen,
                   2 * seen / (now - start))
  elapsed = max(time.time() - start, 1e-9)
  logging.info("Vocabulary: read %d sentences in %.1fs (%.0f/s); sampled %d", 2 * seen,
               elapsed, 2 * seen / elapsed, 2 * len(reservoir))
  keep_sides = {None: (0, 1), "source": (0,), "target": (1,)}[side]
  return [pair[i] for pair in reservoir for i in keep_sides if pair[i].strip()]


def train_sentencepiece(sentences: List[str], vocab_file: str, vocab_size: int,
                        vocab_type: str = "bpe", verbose: bool = False,
                        split_by_unicode_script: bool = True,
                        user_defined_symbols: Sequence[str] = ()) -> str:
  """Trains a SentencePiece model with t2t_keras's reserved ids; writes it atomically.

  Args:
    sentences: training sentences (already sampled).
    vocab_file: where the .model goes (a human-readable .vocab is written beside it).
    vocab_size: target size; smaller corpora may give fewer pieces.
    vocab_type: "bpe" or "unigram".
    verbose: let SentencePiece log its training progress.
    split_by_unicode_script: SentencePiece's option of that name: no piece mixes
      scripts (letters and punctuation). Parsing turns it off (see module docstring).
    user_defined_symbols: pieces kept whole (target-language tags, language_tags.py).

  Returns:
    vocab_file.
  """
  if vocab_type not in VOCAB_TYPES:
    raise ValueError(f"vocab_type={vocab_type!r} must be one of {VOCAB_TYPES} "
                     "(unigram is the word-piece-like choice)")
  if not sentences:
    raise sources.DataError(f"No non-empty sentences to build {vocab_file} from; "
                            "check the training data.")
  if os.path.dirname(vocab_file):
    tf.io.gfile.makedirs(os.path.dirname(vocab_file))
  leftovers.sweep(abandoned_candidates(vocab_file), "vocabulary temporary")
  logging.info("Training a %s vocabulary of %d pieces on %d sentences -> %s",
               vocab_type, vocab_size, len(sentences), vocab_file)
  model = _ProtoWriter()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type=vocab_type,
        vocab_size=vocab_size, pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        bos_id=BOS_ID, hard_vocab_limit=False, character_coverage=1.0,
        split_by_unicode_script=split_by_unicode_script,
        user_defined_symbols=list(user_defined_symbols),
        num_threads=min(os.cpu_count() or 1, 16), minloglevel=0 if verbose else 2)
  except RuntimeError as error:
    # "... Vocabulary size is smaller than required_chars. 20 vs 31. ..."
    needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(error))
    if needed:
      minimum = int(needed.group(1))
      raise sources.DataError(
          f"--vocab_size={vocab_size} is too small for {vocab_file}: the training data "
          f"has {minimum - NUM_RESERVED_IDS} distinct characters, which with the "
          f"{NUM_RESERVED_IDS} reserved ids need at least {minimum} pieces. Raise "
          f"--vocab_size to {minimum} or more (subwords need several times that; the "
          "paper's EN-DE vocabulary has ~37000).") from None
    raise sources.DataError(f"SentencePiece could not build {vocab_file} from "
                            f"{len(sentences)} sentences: {str(error)[:300]}") from None
  tmp = f"{vocab_file}.tmp-{uuid.uuid4().hex[:12]}"  # pids repeat across containers
  with tf.io.gfile.GFile(tmp, "wb") as f:
    f.write(model.proto)
  processor = spm.SentencePieceProcessor(model_proto=model.proto)
  with tf.io.gfile.GFile(tmp + ".vocab", "w") as f:
    for i in range(processor.get_piece_size()):
      f.write(f"{processor.id_to_piece(i)}\t{processor.get_score(i)}\n")
  tf.io.gfile.rename(tmp + ".vocab", os.path.splitext(vocab_file)[0] + ".vocab",
                     overwrite=True)
  tf.io.gfile.rename(tmp, vocab_file, overwrite=True)
  logging.info("Wrote vocabulary %s (%d pieces)", vocab_file, processor.get_piece_size())
  return vocab_file


def abandoned_candidates(vocab_file: str) -> List[str]:
  """Temporaries a killed `train_sentencepiece` may have left beside `vocab_file`:
  `<name>.tmp-<id>` and `<name>.tmp-<id>.vocab`, where <name> is this vocabulary's file
  name or any other `.model` (the vocabularies of other data or sizes in data_dir).
  `leftovers.sweep` removes those untouched long enough that no live build owns them."""
  directory = os.path.dirname(vocab_file) or "."
  own = os.path.basename(vocab_file)
  pattern = re.compile(r"(.+)\.tmp-[0-9a-f]{12}(\.vocab)?")
  found = []
  for path in tf.io.gfile.glob(os.path.join(directory, "*.tmp-*")):
    match = pattern.fullmatch(os.path.basename(path))
    if match and (match.group(1) == own or match.group(1).endswith(".model")):
      found.append(path)
  return found


class _ProtoWriter:
  """Collects the model bytes SentencePiece writes (model_writer protocol)."""

  proto = b""

  def write(self, data: bytes):
    self.proto += data


def load_tokenizer(vocab_file: str) -> SentencePieceTokenizer:
  """Loads a SentencePiece vocabulary written by `build_vocab` (e.g. for decoding)."""
  if not tf.io.gfile.exists(vocab_file):
    raise sources.DataError(f"Vocabulary {vocab_file} does not exist; build it with "
                            "tools/build_vocab.py or by training once.")
  with tf.io.gfile.GFile(vocab_file, "rb") as f:
    return SentencePieceTokenizer(f.read(), vocab_file=vocab_file)


SIDES = ("source", "target")  # the vocabularies of --separate_vocabularies


def side_vocab_size(config: DataConfig, side: Optional[str]) -> int:
  """The requested size of one side's vocabulary (--target_vocab_size, 0 = --vocab_size)."""
  return (config.target_vocab_size or config.vocab_size) if side == "target" else \
      config.vocab_size


def data_vocab_path(config: DataConfig, side: Optional[str] = None) -> str:
  """config.vocab_file, or a data_dir file named after the data, type and size.

  The name carries a content fingerprint of the training data (not its mtime), so a
  shared data_dir never hands a vocabulary of other data to a run. Where the training
  files are gone (decoding or exporting on another machine), the one vocabulary of
  this type and size in data_dir is used; pass vocab_file when there are several.
  `side` ("source" or "target", --separate_vocabularies) names one side's vocabulary,
  `vocab.<side>.<type><size>.<fingerprint>.model`.
  """
  if config.vocab_file and side is None:
    return config.vocab_file
  if side and config.side_vocab_files:
    return config.side_vocab_files[SIDES.index(side)]
  if not config.data_dir:
    raise sources.DataError(f"source={config.source!r} needs --data_dir (or "
                            "--vocab_file) to store the vocabulary.")
  prefix = (f"vocab.{side + '.' if side else ''}{config.vocab_type}"
            f"{side_vocab_size(config, side)}.")
  try:
    fingerprint = sources.data_source(config).fingerprint("train", shared_vocab=True)
  except sources.DataError:
    found = sorted(tf.io.gfile.glob(os.path.join(config.data_dir, prefix + "*.model")))
    if len(found) == 1:
      logging.info("Training data not found; using the vocabulary %s", found[0])
      return found[0]
    raise
  return os.path.join(config.data_dir, f"{prefix}{cache.digest(fingerprint)[:8]}.model")


def build_vocab(config: DataConfig,
                pairs: Optional[Callable[[], Iterator[Tuple[str, str]]]] = None,
                overwrite: bool = False, verbose: bool = False,
                side: Optional[str] = None) -> str:
  """Builds the shared vocabulary of config's training data, unless it exists.

  Args:
    config: data configuration (source, vocab_type, vocab_size, sample size, seed).
    side: None (the shared vocabulary of both sides), or "source" / "target": that
      side's own vocabulary (--separate_vocabularies); target-language tags, which
      are source pieces, go into the source's.
    pairs: returns an iterator of training (source, target) strings; default: the
      configured training split.
    overwrite: rebuild even when the file exists.
    verbose: show SentencePiece's own training log.

  Returns:
    The vocabulary path.
  """
  path = data_vocab_path(config, side)
  if tf.io.gfile.exists(path) and not overwrite:
    logging.info("Reusing vocabulary %s", path)
    return path
  if config.vocab_type not in VOCAB_TYPES:
    raise ValueError(f"vocab_type={config.vocab_type!r} must be one of {VOCAB_TYPES} "
                     "(unigram is the word-piece-like choice)")
  source = sources.data_source(config)
  if pairs is None:
    cache.validated_files(config, "train")  # Clear errors before reading.
    pairs = lambda: source.python_pairs("train")  # noqa: E731
  sample = sample_sentences(pairs(), config.vocab_sample_sentences, config.seed, side)
  tags = [] if side == "target" else [language_tags.tag(language) for language
                                      in language_tags.languages(config)]
  return train_sentencepiece(sample, path, side_vocab_size(config, side),
                             config.vocab_type, verbose=verbose,
                             split_by_unicode_script=source.split_by_unicode_script,
                             user_defined_symbols=tags)


def load_or_build_tokenizer(config: DataConfig, **build_kwargs):
  """The tokenizer of config: IntegerTokenizer for synthetic tasks, else SentencePiece
  loaded from (or first built into) `data_vocab_path(config)`.

  Args:
    config: data configuration.
    **build_kwargs: forwarded to `build_vocab` (pairs, overwrite, verbose).

  Returns:
    A tf.Module with tokenize(strings), detokenize(ids) and vocab_size.
  """
  source = sources.data_source(config)
  if not source.is_text:
    return IntegerTokenizer(source.vocab_size)
  if config.separate_vocabularies:
    return PairTokenizer(*(load_tokenizer(build_vocab(config, side=side, **build_kwargs))
                           for side in SIDES))
  return load_tokenizer(build_vocab(config, **build_kwargs))


def tokenizer_digest(tokenizer) -> str:
  """Identifies a tokenizer's vocabulary (part of the tokenized-cache key): a pair's
  covers both models, so each side's ids are cached under its own vocabulary."""
  if isinstance(tokenizer, PairTokenizer):
    return hashlib.sha256(tokenizer.source.model_proto + b"\0" +
                          tokenizer.target.model_proto).hexdigest()[:16]
  if tokenizer.model_proto is not None:
    return hashlib.sha256(tokenizer.model_proto).hexdigest()[:16]
  return f"{type(tokenizer).__name__}-{tokenizer.vocab_size}"
