"""Words of a tokenized sentence: which pieces start a word, and each piece's word.

Guided alignment (`alignments`, training) and word alignments of decoded or scored
pairs (`inference.scoring`) map word links to pieces with these two functions.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np


def word_starts(tokenizer) -> Optional[np.ndarray]:
  """Per id, whether its piece starts a whitespace-separated word (SentencePiece's
  "▁"); None when every token is a word (the synthetic tasks' integer tokens); a
  tuple of the source's and the target's for two vocabularies (`PairTokenizer`)."""
  if tokenizer.source is not tokenizer:
    return word_starts(tokenizer.source), word_starts(tokenizer.target)
  proto = getattr(tokenizer, "model_proto", None)
  if proto is None:
    return None
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  processor = spm.SentencePieceProcessor(model_proto=proto)
  return np.array([processor.id_to_piece(i).startswith("\u2581")
                   for i in range(processor.get_piece_size())], bool)


def word_index(ids: Sequence[int], starts: Optional[np.ndarray]) -> List[int]:
  """The 0-based word of every token (subwords of one word share it)."""
  out, word = [], -1
  for position, i in enumerate(ids):
    if starts is None or position == 0 or (0 <= i < len(starts) and starts[i]):
      word += 1
    out.append(word)
  return out

