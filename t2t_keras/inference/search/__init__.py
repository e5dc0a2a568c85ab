"""The searches over an incremental decoder: beam, greedy, sampling, and the batching
of beam search.

One pure function in the style of tensor2tensor / Flax / Model Garden: at every step
the K alive hypotheses of each sentence are extended by every token, the 2K best
candidates are kept (so that even if K of them end in EOS, K can stay alive), those
ending in EOS join the finished set scored with the GNMT length penalty
`((5 + length) / 6) ** alpha` (Wu et al. 2016; length counts EOS), and the best K not
ending in EOS stay alive. The loop stops when no alive hypothesis can still beat the
worst of K finished ones (the penalised log probability of an alive hypothesis can
only improve by growing longer up to `decode_length`, so dividing its log probability
by the largest penalty bounds it), or after `decode_length` steps; a caller that uses
only the best result stops when the best finished one beats every alive one
(`num_results`). Sentences without
K finished hypotheses fall back to their best alive ones.

Shapes are static given (batch, beam, decode_length), and the loop is a
`tf.while_loop` with `maximum_iterations`, so the search compiles with XLA and runs
inside an exported SavedModel. The decoder state (e.g. the self-attention key/value
cache) is any nest of tensors with leading dimension batch * beam (a dimension of size
0 at the start may grow, see `loop_shape`; not under XLA); its layout (`StateRows`, or
a caller's subclass: t2t_keras' decoder under XLA keeps its cache in place and
reorders only a table of slots) reorders it by parent beam once per step. Per-sentence
tensors that never change (cross-attention keys/values, source mask) are the search's
`context` (one row per sentence, shared by its beams) or the caller's closure, and are
never reordered.

What a search is asked for is one value (`Beam`, `Sampling`); how finished sentences
leave the batch is an object that runs the loop: `FullBatch` keeps them,
`ShrinkingBatch` (graph mode) drops each at once, its state and context rows in the
same gather as the beam reorder, and `HalvingBatch` (XLA, static shapes) does the same
by halves: the batch moves to a loop of half its size once no more than half its
sentences are still searching.

Modules: `common` (what every search shares), `hypotheses` (beam search's step),
`batching` (how finished sentences leave the batch), `beam` (`Beam`, `beam_search`),
`greedy` (`greedy_search`), `sampling` (`Sampling`, `sample_search`). Their public
names are read from here.
"""

from t2t_keras.inference.search.batching import FullBatch, HalvingBatch, ShrinkingBatch
from t2t_keras.inference.search.beam import Beam, beam_search
from t2t_keras.inference.search.common import NEG_INF, SymbolsToLogits, loop_shape
from t2t_keras.inference.search.greedy import greedy_search
# _chunk_size as well: tests pin the chunk top_k_rows picks.
from t2t_keras.inference.search.hypotheses import (BeamState, StateRows,  # noqa: F401
                                                   _chunk_size, length_penalty, tile_beams,
                                                   top_k_log_probs, top_k_rows)
from t2t_keras.inference.search.sampling import Sampling, sample_search

__all__ = ["Beam", "BeamState", "FullBatch", "HalvingBatch", "NEG_INF", "Sampling",
           "ShrinkingBatch", "StateRows", "SymbolsToLogits", "beam_search", "greedy_search",
           "length_penalty", "loop_shape", "sample_search", "tile_beams", "top_k_log_probs",
           "top_k_rows"]
