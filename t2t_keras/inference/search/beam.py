"""Beam search: what it is asked for (`Beam`) and the call (`beam_search`).

At every step the K alive hypotheses of each sentence are extended by every token,
the 2K best candidates are kept, those ending in EOS join the finished set scored
with the GNMT length penalty, and the best K not ending in EOS stay alive
(`hypotheses`); how finished sentences leave the batch is `Beam.batch` (`batching`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple, Union

import tensorflow as tf

from t2t_keras.inference.search.batching import FullBatch, HalvingBatch, ShrinkingBatch
from t2t_keras.inference.search.common import SymbolsToLogits
from t2t_keras.inference.search.hypotheses import StateRows, _Search


@dataclasses.dataclass(frozen=True)
class Beam:
  """What a beam search is asked for.

  Attributes:
    size: K, the hypotheses kept per sentence.
    alpha: length-penalty exponent (0 = plain log probability).
    num_results: how many of the K best the caller uses (default K). The search
      stops once, in every sentence, that many finished hypotheses beat the best any
      alive one could still reach: those are then final. With 1 a sentence is done
      when its best finished hypothesis beats every alive one (CTranslate2's rule for
      one hypothesis), often many steps before K have finished; the top result is the
      one the full search returns, the other K - 1 may be worse than its.
    layout: how the decoder state follows the beams; default `StateRows(size)`.
    batch: how sentences whose results are final leave the batch: `FullBatch()`,
      `ShrinkingBatch()` (graph mode) or `HalvingBatch(times)` (XLA). Same results.
  """

  size: int
  alpha: float = 0.6
  num_results: Optional[int] = None
  layout: Optional[StateRows] = None
  batch: Union[FullBatch, ShrinkingBatch, HalvingBatch] = FullBatch()


def beam_search(symbols_to_logits: SymbolsToLogits, initial_ids: tf.Tensor, state: Any,
                decode_length, beam: Beam, context: Any = None
                ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Finds the K best sequences of each sentence.

  Args:
    symbols_to_logits: the incremental decoder (see `SymbolsToLogits`); it receives
      the previous token of each hypothesis (`initial_ids` at index 0), the 0-based
      position being decoded, and the state (and `context`, when given), and returns
      float32 logits and the updated state.
    initial_ids: (B,) int32 start tokens.
    state: nest of tensors with leading dimension B * K (already tiled), or as
      `beam.layout` lays it out.
    decode_length: maximum number of generated tokens (EOS included); int or scalar.
    beam: K, alpha, the results read, the state's layout and the batching (`Beam`).
    context: optional nest of per-sentence tensors (leading dimension B) that the
      step reads and never changes (cross-attention keys/values, the source mask,
      which the K hypotheses of a sentence share); passed as the step's fourth
      argument.

  Returns:
    ids (B, K, decode_length) int32, best first, each ending with EOS (unless it hit
    the length limit) and PAD after it; scores (B, K) float32 (log probability
    divided by the length penalty).
  """
  search = _Search(symbols_to_logits, beam, decode_length, context is not None)
  initial, shapes = search.start(initial_ids, state)
  return beam.batch.run(search, initial, shapes, () if context is None else context)
