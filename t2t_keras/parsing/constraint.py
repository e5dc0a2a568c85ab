"""Tree-constrained decoding: beam search that writes only valid trees (parsing).

A parsing model translates a sentence into a linearized tree (t2t_keras.parsing.trees).
Unconstrained, its outputs are repaired afterwards (`trees.rebuild`); with
`TreeConstraint` (decode --constrain_trees) the search itself can only write a tree
with one leaf per input word, so nothing needs repairing. It is a decoding processor
(`t2t_keras.inference.processors`) that `t2t_keras.inference.decoding.decode_ids`
composes with the others.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.inference.search import NEG_INF
from t2t_keras.parsing.trees import LINEARIZATIONS, token_kind
from t2t_keras.inference.processors import Processor, Rows


class TreeConstraint(Processor):
  """Decoding that can only write a linearized tree over the source's words (parsing).

  Each hypothesis counts the brackets it has open and the leaves (POS tags) it has
  written; at every step only these tokens keep their score:
    * an opening bracket `(X`, while fewer leaves than source words are written;
    * a leaf, inside an open bracket, while fewer leaves than words are written;
    * `)`, when a bracket is open, not right after an opening one (no empty
      constituents), and not closing the root before every word has its leaf;
    * end of sentence, once the root is closed after exactly one leaf per word (at
      once for an empty source).
  Brackets are also bounded as the treebank bounds them, so that a model caught in a
  loop cannot fill the length limit with `(PP (PP (PP ...`: at most `max_open_run`
  brackets open in a row (the sample's training trees open at most 6 before a word)
  and a new one only while fewer than 1.25 per word + 1 are open in all (about 0.1% of
  its training trees have more, up to 1.5 per word; a looser bound of 2 let 11% more
  brackets through on dev and cost 3.4 F1).
  Every other token (subwords of words, tree tokens split into pieces) is excluded,
  and a bracket is opened only if the leaves and `)` it then owes still fit before the
  length limit (input + extra_decode_length; the source has at least one piece per
  word plus EOS, so any extra length >= 2 leaves room for a root and its leaves).
  Every state then has an allowed continuation and every output is a valid tree for
  its words. Scores are renormalized over the allowed tokens.

  With the "words" linearization (`trees.linearize`), each leaf is a word followed by
  its tag: where a leaf may come (as above), the search may write the first piece of
  the source's next word (not a tag); the word's other pieces are then forced, in
  order, and then a tag must follow. The pieces still to copy count among the tokens
  owed before the length limit. No word can be skipped, repeated or left untagged.

  Words are counted as the source pieces that start a word (SentencePiece's "▁"), so
  the constraint needs the tokenizer's vocabulary and whole-token tree pieces (the
  parsing vocabulary: t2t_keras.data.tokens.tokenizer). Leaves are the Penn Treebank's 45 POS
  tags (`trees.PTB_TAGS`); a treebank with another tagset needs that set extended.
  """

  OTHER, OPEN, CLOSE, LEAF, END = range(5)

  MAX_OPEN_RUN = 8
  BRACKETS_PER_WORD = 1.25  # fewer than 0.1% of the sample's training trees have more

  def __init__(self, pieces: Sequence[str], linearization: str = "tags",
               max_open_run: int = MAX_OPEN_RUN):
    """`pieces`: the vocabulary's piece of every id; `linearization`: the model's
    (DataConfig.parsing_linearization); `max_open_run`: brackets that may open in a
    row."""
    if linearization not in LINEARIZATIONS:
      raise ValueError(f"linearization {linearization!r}: use one of {LINEARIZATIONS}")
    self.linearization = linearization
    self.max_open_run = max_open_run
    kinds = np.full(len(pieces), self.OTHER, np.int32)
    starts_word = np.zeros(len(pieces), np.int32)
    codes = {"open": self.OPEN, "close": self.CLOSE, "leaf": self.LEAF}
    for i, piece in enumerate(pieces):
      if i in (PAD_ID, EOS_ID, BOS_ID) or not piece.startswith("\u2581"):
        continue
      starts_word[i] = 1
      kinds[i] = codes.get(token_kind(piece[1:]), self.OTHER)
    kinds[EOS_ID] = self.END
    missing = [kind for kind in (self.OPEN, self.CLOSE, self.LEAF)
               if not np.any(kinds == kind)]
    if missing:
      raise ValueError(
          "This vocabulary has no single-piece tree tokens of kind "
          f"{', '.join(('open', 'close', 'leaf')[kind - 1] for kind in missing)}: "
          "tree-constrained decoding needs a parsing model (--data_source=parsing).")
    self.kinds = tf.constant(kinds)
    self.starts_word = tf.constant(starts_word)

  @property
  def state_size(self) -> int:
    """Columns of the constraint's per-hypothesis state (int32 counters)."""
    return 6 if self.linearization == "words" else 4

  @classmethod
  def from_tokenizer(cls, tokenizer, linearization: str = "tags") -> "TreeConstraint":
    """From a `SentencePieceTokenizer` (the model directory's vocabulary)."""
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    model_proto = getattr(tokenizer, "model_proto", None)
    if model_proto is None:
      raise ValueError("Tree-constrained decoding needs a SentencePiece vocabulary "
                       "(a parsing model); this model has none.")
    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    return cls([processor.id_to_piece(i) for i in range(processor.get_piece_size())],
               linearization)

  def count_words(self, inputs: tf.Tensor) -> tf.Tensor:
    """(B, S) source ids -> (B,) number of words."""
    return tf.reduce_sum(tf.gather(self.starts_word, tf.cast(inputs, tf.int32)), axis=1)

  def start(self, rows: Rows):
    """The `processors.Processor` protocol: the step for these rows and its state,
    (counts (R, N) int32, N = `state_size`, zeros at the start; the rows' fixed
    per-row tensors, kept in the state so that they follow rows leaving the batch).

    Each row's number of source words comes from `rows.inputs` (the "words"
    linearization also copies its pieces) and its output length limit from
    `rows.limits` (EOS is forced at position limits - 1).
    """
    inputs = tf.cast(rows.inputs, tf.int32)
    words, limits = self.count_words(inputs), rows.limits
    initial = tf.zeros([tf.shape(inputs)[0], self.state_size], tf.int32)
    if self.linearization == "words":
      return self._words_step(), (initial, (words, limits, inputs))
    kinds = self.kinds

    def step(logits, ids, index, state):
      counts, (words, limits) = state
      kind = tf.gather(kinds, ids)  # of the token just written (BOS at index 0)
      is_open = tf.cast(tf.equal(kind, self.OPEN), tf.int32)
      opened = tf.maximum(
          counts[:, 0] + is_open - tf.cast(tf.equal(kind, self.CLOSE), tf.int32), 0)
      leaves = counts[:, 1] + tf.cast(tf.equal(kind, self.LEAF), tf.int32)
      run, total = self._bracket_counts(counts[:, 2], counts[:, 3], is_open)
      room = leaves < words
      inside = opened > 0
      # Tokens that must still follow the one written now, before EOS: a leaf per
      # remaining word and a `)` per open bracket. They must fit before the forced EOS.
      free = limits - 2 - index
      owed = words - leaves + opened
      allowed = tf.stack([
          tf.zeros_like(room),  # OTHER
          room & (owed + 1 <= free) & self._may_open(run, total, words),  # OPEN
          inside & tf.equal(is_open, 0) & ((opened > 1) | tf.logical_not(room)),  # CLOSE
          room & inside & (owed - 1 <= free),  # LEAF
          tf.logical_not(inside) & tf.logical_not(room) & ((index > 0) | (words == 0)),
      ], axis=1)  # (R, 5)
      mask = tf.gather(allowed, kinds, axis=1)  # (R, V)
      logits = tf.where(mask, tf.cast(logits, tf.float32), NEG_INF)
      return logits, (tf.stack([opened, leaves, run, total], axis=1), (words, limits))
    return step, (initial, (words, limits))

  def _bracket_counts(self, run, total, is_open):
    """Brackets opened in a row and in all, after the token just written."""
    is_open = tf.cast(is_open, tf.int32)
    return (run + 1) * is_open, total + is_open

  def _may_open(self, run, total, words):
    """Whether one more bracket keeps within the treebank's bounds."""
    return (run < self.max_open_run) & (
        tf.cast(total, tf.float32) < self.BRACKETS_PER_WORD * tf.cast(words, tf.float32) + 1)

  # The phases of a "words" hypothesis: free to open, close or start the next word;
  # copying a word's remaining pieces; owing the tag of the word just copied.
  FREE, COPYING, NEED_TAG = range(3)

  def _words_step(self):
    """`start`'s step for the "words" linearization; counts (R, 6): open brackets,
    tagged words, pieces copied (from the first word start), phase, brackets opened in
    a row and in all; beside them in the state, each row's words, limit and source."""
    kinds, starts_word = self.kinds, self.starts_word

    def step(logits, ids, index, state):
      counts, rows = state
      words, limits, inputs = rows
      pieces = tf.reduce_sum(tf.cast((inputs != PAD_ID) & (inputs != EOS_ID), tf.int32),
                             axis=1)
      last = tf.shape(inputs)[1] - 1
      # Pieces before the first word start (none from a SentencePiece vocabulary) are
      # no word's and are never copied: positions count from the first word start.
      offset = tf.argmax(tf.gather(starts_word, inputs), axis=1, output_type=tf.int32)

      def piece_at(position):
        return tf.gather(inputs, tf.minimum(position, last), batch_dims=1)

      opened, leaves, phase = counts[:, 0], counts[:, 1], counts[:, 3]
      position = offset + counts[:, 2]  # the next piece to copy, before this token
      free_before = tf.equal(phase, self.FREE)
      # What the token just written was, given the phase it was written in (a word
      # may only start inside a bracket; a piece that is both the next word's and a
      # tree token's is the word there).
      started = (free_before & tf.equal(ids, piece_at(position)) & (leaves < words)
                 & (opened > 0))
      copied = started | tf.equal(phase, self.COPYING)
      tagged = tf.equal(phase, self.NEED_TAG)
      kind = tf.where(free_before & tf.logical_not(started), tf.gather(kinds, ids),
                      self.OTHER)
      is_open = tf.equal(kind, self.OPEN)
      opened = tf.maximum(opened + tf.cast(is_open, tf.int32)
                          - tf.cast(tf.equal(kind, self.CLOSE), tf.int32), 0)
      run, total = self._bracket_counts(counts[:, 4], counts[:, 5], is_open)
      leaves += tf.cast(tagged, tf.int32)
      position += tf.cast(copied, tf.int32)
      next_piece = piece_at(position)
      continues = (position < pieces) & tf.equal(tf.gather(starts_word, next_piece), 0)
      phase = tf.where(copied, tf.where(continues, self.COPYING, self.NEED_TAG), self.FREE)
      room = leaves < words
      inside = opened > 0
      free = limits - 2 - index
      # Owed before EOS: the pieces not yet copied, a tag per untagged word, a `)`
      # per open bracket.
      owed = pieces - position + words - leaves + opened
      free_now = tf.equal(phase, self.FREE)
      allowed = tf.stack([
          tf.zeros_like(room),  # OTHER
          free_now & room & (owed + 1 <= free) & self._may_open(run, total, words),  # OPEN
          free_now & inside & tf.logical_not(is_open)
          & ((opened > 1) | tf.logical_not(room)),  # CLOSE
          tf.equal(phase, self.NEED_TAG),  # LEAF: a tag, only right after a word
          free_now & tf.logical_not(inside) & tf.logical_not(room)
          & ((index > 0) | (words == 0)),  # END
      ], axis=1)  # (R, 5)
      mask = tf.gather(allowed, kinds, axis=1)  # (R, V)
      word_piece = tf.one_hot(next_piece, tf.shape(logits)[-1], on_value=True,
                              off_value=False)
      start_word = free_now & room & inside & (owed - 1 <= free)
      mask = tf.where(tf.equal(phase, self.COPYING)[:, None], word_piece,
                      mask | (word_piece & start_word[:, None]))
      logits = tf.where(mask, tf.cast(logits, tf.float32), NEG_INF)
      counts = tf.stack([opened, leaves, position - offset, phase, run, total], axis=1)
      return logits, (counts, rows)
    return step
