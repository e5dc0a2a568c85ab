"""Tree-constrained decoding: beam search that writes only valid trees (parsing).

A parsing model translates a sentence into a linearized tree (t2t_keras.parsing.trees).
Unconstrained, its outputs are repaired afterwards (`trees.rebuild`); with
`TreeConstraint` (decode --constrain_trees) the search itself can only write a tree
with one leaf per input word, so nothing needs repairing. It wraps the decoder step
that `t2t_keras.decoding.decode_ids` passes to beam search.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.beam_search import NEG_INF
from t2t_keras.parsing.trees import token_kind


class TreeConstraint:
  """Decoding that can only write a linearized tree over the source's words (parsing).

  Each hypothesis counts the brackets it has open and the leaves (POS tags) it has
  written; at every step only these tokens keep their score:
    * an opening bracket `(X`, while fewer leaves than source words are written;
    * a leaf, inside an open bracket, while fewer leaves than words are written;
    * `)`, when a bracket is open, not right after an opening one (no empty
      constituents), and not closing the root before every word has its leaf;
    * end of sentence, once the root is closed after exactly one leaf per word (at
      once for an empty source).
  Every other token (subwords of words, tree tokens split into pieces) is excluded,
  and a bracket is opened only if the leaves and `)` it then owes still fit before the
  length limit (input + extra_decode_length; the source has at least one piece per
  word plus EOS, so any extra length >= 2 leaves room for a root and its leaves).
  Every state then has an allowed continuation and every output is a valid tree for
  its words. Scores are renormalized over the allowed tokens.

  Words are counted as the source pieces that start a word (SentencePiece's "▁"), so
  the constraint needs the tokenizer's vocabulary and whole-token tree pieces (the
  parsing vocabulary: t2t_keras.data.tokenizer). Leaves are the Penn Treebank's 45 POS
  tags (`trees.PTB_TAGS`); a treebank with another tagset needs that set extended.
  """

  OTHER, OPEN, CLOSE, LEAF, END = range(5)

  def __init__(self, pieces: Sequence[str]):
    """`pieces`: the vocabulary's piece of every id."""
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

  @classmethod
  def from_tokenizer(cls, tokenizer) -> "TreeConstraint":
    """From a `SentencePieceTokenizer` (the model directory's vocabulary)."""
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    model_proto = getattr(tokenizer, "model_proto", None)
    if model_proto is None:
      raise ValueError("Tree-constrained decoding needs a SentencePiece vocabulary "
                       "(a parsing model); this model has none.")
    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    return cls([processor.id_to_piece(i) for i in range(processor.get_piece_size())])

  def count_words(self, inputs: tf.Tensor) -> tf.Tensor:
    """(B, S) source ids -> (B,) number of words."""
    return tf.reduce_sum(tf.gather(self.starts_word, tf.cast(inputs, tf.int32)), axis=1)

  def wrap(self, symbols_to_logits, words: tf.Tensor, limits: tf.Tensor):
    """The decoder step with the constraint; its state is (state, counts (R, 2)).

    `words` and `limits` (R,): each row's number of source words and output length
    limit (EOS is forced at position limits - 1).
    """
    kinds = self.kinds

    def fn(ids, index, state):
      inner, counts = state
      kind = tf.gather(kinds, ids)  # of the token just written (BOS at index 0)
      is_open = tf.cast(tf.equal(kind, self.OPEN), tf.int32)
      opened = tf.maximum(
          counts[:, 0] + is_open - tf.cast(tf.equal(kind, self.CLOSE), tf.int32), 0)
      leaves = counts[:, 1] + tf.cast(tf.equal(kind, self.LEAF), tf.int32)
      logits, inner = symbols_to_logits(ids, index, inner)
      room = leaves < words
      inside = opened > 0
      # Tokens that must still follow the one written now, before EOS: a leaf per
      # remaining word and a `)` per open bracket. They must fit before the forced EOS.
      free = limits - 2 - index
      owed = words - leaves + opened
      allowed = tf.stack([
          tf.zeros_like(room),  # OTHER
          room & (owed + 1 <= free),  # OPEN
          inside & tf.equal(is_open, 0) & ((opened > 1) | tf.logical_not(room)),  # CLOSE
          room & inside & (owed - 1 <= free),  # LEAF
          tf.logical_not(inside) & tf.logical_not(room) & ((index > 0) | (words == 0)),
      ], axis=1)  # (R, 5)
      mask = tf.gather(allowed, kinds, axis=1)  # (R, V)
      logits = tf.where(mask, tf.cast(logits, tf.float32), NEG_INF)
      return logits, (inner, tf.stack([opened, leaves], axis=1))
    return fn
