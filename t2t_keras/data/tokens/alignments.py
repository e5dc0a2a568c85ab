"""Guided alignment's data: external word alignments of the training pairs, checked
and mapped from words to subword pieces.

Why: attention learned without supervision aligns only roughly (docs/decoding.md).
Marian, OpenNMT-tf and fairseq train one encoder-decoder attention head against word
alignments from an external aligner (fast_align, eflomal), which makes the alignments
that head gives at decoding time usable for terminology, markup and placeholders. The
aligner sees whitespace-separated words, the model SentencePiece pieces, so each word
link (i, j) becomes every link between a piece of source word i and a piece of target
word j: a piece belongs to the word it is in, the word `words.word_index`
gives it (the same mapping --output_alignments uses to turn piece links back into word
links).

--train_alignments names one Pharaoh line per training pair ("i-j i-j ...", 0-based
source word i, target word j; a blank line: no links), checked against the pair's
word counts; `attach` puts the piece links beside the tokenized split, grouped by
padded length as its ids are, so the batch plan gathers a pair's links with its ids
(pipeline.py makes each batch's [B, T, S] reference matrix). The links are held in
memory and enter the input graph as constants: a few bytes a link, fine for corpora of
millions of pairs; pairs too long for --max_length are dropped with their links.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras.data.sources import sources as sources_lib
from t2t_keras.data.tokens import cache
from t2t_keras.data.tokens.words import word_index, word_starts
from t2t_keras.errors import DataError

_FIX = ("run the aligner on the same --train_src/--train_tgt files, whitespace-"
        "separated words, and give its output (one 'i-j ...' line per pair, source word "
        "first)")


def parse_pharaoh(line: str, where: str) -> np.ndarray:
  """One Pharaoh line -> int32 [links, 2] (source word, target word), sorted, unique.

  Args:
    line: "i-j i-j ..." (blank: no links).
    where: "file:line" for messages.

  Raises:
    DataError: a token that is not two non-negative integers joined by "-".
  """
  links = []
  for token in line.split():
    source, dash, target = token.partition("-")
    if not dash or not source.isdigit() or not target.isdigit():
      raise DataError(f"{where}: {token!r} is not a Pharaoh link 'i-j' (0-based source "
                      f"word i, target word j; sure links only, no 'i?j'): {_FIX}.")
    links.append((int(source), int(target)))
  return np.array(sorted(set(links)), np.int32).reshape([-1, 2])


def read_alignments(path: str, word_counts: np.ndarray, flag: str = "--train_alignments"
                    ) -> List[np.ndarray]:
  """The links of every pair, checked against its (source, target) word counts.

  Args:
    path: the Pharaoh file (gs:// too).
    word_counts: int [pairs, 2] whitespace-separated words of each pair.
    flag: the flag that named the file, for messages.

  Raises:
    DataError: a missing file, a line count other than the pairs', a malformed link,
      or a word index beyond its sentence, naming file:line and what to do.
  """
  if not tf.io.gfile.exists(path):
    raise DataError(f"{flag}={path} does not exist: give the word alignments of the "
                    "training pairs (relative paths resolve from the current directory).")
  with tf.io.gfile.GFile(path, "rb") as f:
    lines = f.read().decode("utf-8", errors="replace").splitlines()
  if len(lines) != len(word_counts):
    raise DataError(f"{flag}={path} has {len(lines)} lines but the training files have "
                    f"{len(word_counts)} pairs: one Pharaoh line per training pair, in "
                    f"order (a blank line for a pair without links); {_FIX}.")
  result = []
  for number, (line, (sources, targets)) in enumerate(zip(lines, word_counts), 1):
    links = parse_pharaoh(line, f"{path}:{number}")
    if len(links):
      for side, count, what in ((0, sources, "source"), (1, targets, "target")):
        worst = int(links[:, side].max())
        if worst >= count:
          link = "-".join(map(str, links[np.argmax(links[:, side])]))
          raise DataError(
              f"{path}:{number}: link {link} names {what} word {worst} but the pair's "
              f"{what} has {count} whitespace-separated words (0-based: 0..{count - 1}); "
              f"is the file aligned with --train_src/--train_tgt, source side first? "
              f"{_FIX[0].upper() + _FIX[1:]}.")
    result.append(links)
  return result


def word_counts(pairs) -> np.ndarray:
  """int32 [pairs, 2] whitespace-separated words of each (source, target) text pair."""
  return np.array([(len(s.split()), len(t.split())) for s, t in pairs],
                  np.int32).reshape([-1, 2])


def piece_links(links: np.ndarray, source_words: Sequence[int],
                target_words: Sequence[int]) -> Tuple[np.ndarray, int]:
  """Word links -> piece links: each piece of source word i with each of target word j.

  Args:
    links: int [k, 2] word links.
    source_words, target_words: the word of each piece (`words.word_index`).

  Returns:
    (int32 [m, 2] (source piece, target piece) links in row-major order, word links
    dropped because a side has fewer words in pieces than the link names).
  """
  source_words, target_words = np.asarray(source_words), np.asarray(target_words)
  words = (source_words.max() + 1 if source_words.size else 0,
           target_words.max() + 1 if target_words.size else 0)
  inside = (links[:, 0] < words[0]) & (links[:, 1] < words[1])
  matrix = np.zeros(words, bool)  # word-level links
  matrix[links[inside, 0], links[inside, 1]] = True
  pieces = np.argwhere(matrix[source_words][:, target_words])
  return pieces.astype(np.int32).reshape([-1, 2]), int((~inside).sum())


def attach(split, links: List[np.ndarray], starts):
  """The split with its piece links (`cache.TokenizedSplit.alignments`).

  Args:
    split: a `cache.TokenizedSplit` of one corpus, pairs in the links' order.
    links: each pair's word links (`read_alignments`).
    starts: `words.word_starts` of the tokenizer (a tuple for two vocabularies).
  """
  if len(links) != len(split.lengths):
    raise DataError(f"{len(links)} alignment lines for {len(split.lengths)} tokenized "
                    "pairs: the training files changed; rerun to tokenize them again.")
  source_starts, target_starts = starts if isinstance(starts, tuple) else (starts, starts)
  padded = cache.padded_lengths(split.lengths) if len(split.lengths) else []
  groups, dropped, total = {}, 0, 0
  for length in split.present:
    src, tgt, counts = split.group_arrays(length)
    ends = np.cumsum(counts, axis=0, dtype=np.int64)
    flat, per_pair = [], []
    for k, pair in enumerate(np.flatnonzero(padded == length)):
      (s0, t0), (s1, t1) = ends[k] - counts[k], ends[k]
      pieces, lost = piece_links(links[pair], word_index(src[s0:s1], source_starts),
                                 word_index(tgt[t0:t1], target_starts))
      flat.append(pieces.reshape([-1]))
      per_pair.append(len(pieces))
      dropped, total = dropped + lost, total + len(links[pair])
    groups[length] = (np.concatenate(flat).astype(np.int32),
                      np.array(per_pair, np.int32))
  if dropped:
    logging.warning("--train_alignments: %d of %d word links name a word beyond what the "
                    "pair's pieces make (text the vocabulary normalises differently); "
                    "dropped", dropped, total)
  logging.info("--train_alignments: %d word links of %d pairs mapped to pieces", total,
               len(links))
  return dataclasses.replace(split, alignments=groups)


def reader(groups: dict, lengths: Sequence[int]
           ) -> Callable[[tf.Tensor], Tuple[tf.Tensor, tf.Tensor]]:
  """As `cache.TokenizedSplit.reader`, the piece links: read_at(i) gives the flat
  int32 links and int32 links per pair of padded length `lengths[i]`."""
  parts = [groups[n] for n in lengths]
  flat = [tf.constant(np.concatenate([p[k] for p in parts]).astype(np.int32))
          for k in range(2)]
  bounds = [tf.constant(np.cumsum([0] + [p[k].size for p in parts]), tf.int64)
            for k in range(2)]

  def read_at(i):
    return tuple(flat[k][bounds[k][i]:bounds[k][i + 1]] for k in range(2))
  return read_at


def reference_matrix(links: tf.RaggedTensor, shape) -> tf.Tensor:
  """float32 [B, T, S] with 1 at each (target piece, source piece) link of each row.

  Args:
    links: int32 ragged [B, None]: each row's flat (source, target) piece links.
    shape: [B, T, S], the padded batch's rows and widths.
  """
  pairs = tf.reshape(links.flat_values, [-1, 2])
  rows = tf.repeat(tf.range(links.nrows(), dtype=tf.int32),
                   tf.cast(links.row_lengths() // 2, tf.int32))
  indices = tf.stack([rows, pairs[:, 1], pairs[:, 0]], axis=1)
  return tf.scatter_nd(indices, tf.ones([tf.shape(indices)[0]], tf.float32),
                       tf.cast(shape, tf.int32))


def batch_matrix(links: tf.RaggedTensor, batch: dict, shape) -> tf.Tensor:
  """`reference_matrix` of a padded batch {"inputs": [B, S], "targets": [B, T]};
  `shape` [B, L] (static shapes) or [None, None] sets its static shape."""
  matrix = reference_matrix(links, [tf.shape(batch["inputs"])[0],
                                    tf.shape(batch["targets"])[1],
                                    tf.shape(batch["inputs"])[1]])
  return tf.ensure_shape(matrix, list(shape[:1]) + list(shape[1:]) * 2)


def load_links(config, split, tokenizer) -> Optional[object]:
  """`split` with --train_alignments attached (`attach`), or as it is without."""
  if not config.train_alignments or split is None:
    return split
  counts = word_counts(sources_lib.data_source(config).python_pairs("train"))
  links = read_alignments(config.train_alignments, counts)
  return attach(split, links, word_starts(tokenizer))
