"""Teacher-forced passes over given (source, target) pairs: scores and alignments.

`force` runs the model (or an `ensemble.Ensemble`) on pairs of id sequences in
length-sorted batches and returns, per pair in input order, the log probability of
every target token (EOS included) and, when asked, one decoder layer's
encoder-decoder attention. `python -m t2t_keras.score` writes the former;
`decode --output_alignments` turns the latter into word alignments (`align`).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
# word_starts as well: decode and the tests read it here, beside `align` (its `starts`).
from t2t_keras.data.tokens.words import word_index, word_starts  # noqa: F401
from t2t_keras.inference import ensemble


# model -> {attention layer: its traced forced pass}: the decode command aligns each
# window with `force`, and a trace per call would cost a trace per window.
_FORCED_PASSES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclasses.dataclass
class Forced:
  """One pair: per-token log probabilities (T,) and attention (H, T, S) or None."""

  log_probs: np.ndarray
  attention: Optional[np.ndarray] = None

  @property
  def total(self) -> float:
    return float(np.sum(self.log_probs, dtype=np.float64))


def force(model, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
          batch_size: int = 64, attention_layer: Optional[int] = None,
          progress=None) -> List[Forced]:
  """Teacher-forced log probabilities of each target given its source.

  Args:
    model: a Transformer or an `ensemble.Ensemble`.
    sources, targets: id sequences, each ending with EOS (EOS is scored).
    batch_size: pairs per batch (sorted by length, so little is padding).
    attention_layer: also return this decoder layer's cross-attention (-1 = last).
    progress: an object with `update(n)` (e.g. `console.Progress`), or None.
  """
  if len(sources) != len(targets):
    raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
  layer = -1 if attention_layer is None else attention_layer
  run = _FORCED_PASSES.setdefault(model, {}).get(layer)
  if run is None:  # traced once per model and layer, however many calls (decode's windows)
    model_ref = weakref.ref(model)  # the cache must not keep the model alive

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)] * 2,
                 autograph=False, reduce_retracing=True)
    def run(inputs, outputs):
      log_probs, attention = ensemble.forced_pass(model_ref(), inputs, outputs, layer)
      token = tf.gather(log_probs, outputs, batch_dims=2)  # (B, T)
      return token, attention

    _FORCED_PASSES[model][layer] = run
  order = np.argsort([max(len(s), len(t)) for s, t in zip(sources, targets)], kind="stable")
  results: List[Optional[Forced]] = [None] * len(sources)
  for begin in range(0, len(order), batch_size):
    chunk = order[begin:begin + batch_size]
    src = _pad([sources[i] for i in chunk])
    tgt = _pad([targets[i] for i in chunk])
    token, attention = run(tf.constant(src), tf.constant(tgt))
    token = token.numpy()
    attention = attention.numpy() if attention_layer is not None else None
    for row, i in enumerate(chunk):
      n, m = len(targets[i]), len(sources[i])
      results[i] = Forced(token[row, :n].copy(),
                          None if attention is None else attention[row, :, :n, :m].copy())
    if progress is not None:
      progress.update(len(chunk))
  return results


def _pad(seqs) -> np.ndarray:
  width = max(1, max(len(s) for s in seqs))
  out = np.full((len(seqs), width), PAD_ID, np.int32)
  for row, seq in enumerate(seqs):
    out[row, :len(seq)] = seq
  return out


def align(attention: np.ndarray, source_ids: Sequence[int], target_ids: Sequence[int],
          starts: Optional[np.ndarray], head: int = -1) -> List[tuple]:
  """Word alignment from cross-attention, as (source word, target word) pairs.

  Each target subword is aligned to the source subword it attends to most (the
  heads averaged, or `head`), EOS excluded on both sides; subword pairs become word
  pairs, duplicates merged, sorted.

  Args:
    attention: (H, T, S) cross-attention of the pair (T, S with EOS).
    source_ids, target_ids: the pair's ids, each ending with EOS.
    starts: `word_starts` of the vocabulary, or (the source's, the target's) with
      separate vocabularies (`word_starts` of a `PairTokenizer`).
    head: -1 averages the heads; otherwise that head only.
  """
  matrix = attention.mean(axis=0) if head < 0 else attention[head]
  src = [i for i in source_ids if i not in (EOS_ID, PAD_ID)]
  tgt = [i for i in target_ids if i not in (EOS_ID, PAD_ID)]
  if not src or not tgt:
    return []
  source_starts, target_starts = starts if isinstance(starts, tuple) else (starts, starts)
  src_words, tgt_words = word_index(src, source_starts), word_index(tgt, target_starts)
  best = np.argmax(matrix[:len(tgt), :len(src)], axis=1)
  return sorted({(src_words[s], tgt_words[t]) for t, s in enumerate(best)})


def pharaoh(pairs) -> str:
  """Pharaoh format: `i-j` pairs separated by spaces."""
  return " ".join(f"{i}-{j}" for i, j in pairs)


def with_eos(ids: Sequence[int]) -> List[int]:
  return list(ids) + [EOS_ID]
