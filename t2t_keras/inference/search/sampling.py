"""Random sampling over an incremental decoder: one sequence per row, drawn token by
token (decode --sampling_topk / --sampling_topp / --sampling_temperature).

Draws are Gumbel-max over a counter-based hash (`row_uniform`), so a row's sample
depends only on the seed, its key and the position: the same in any batch, eagerly,
in a graph, under XLA and in an export. The loop is greedy search's
(`greedy._one_per_row`) with another choice of token.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Tuple

import tensorflow as tf

from t2t_keras import BOS_ID, PAD_ID
from t2t_keras.inference.search.common import NEG_INF, SymbolsToLogits
from t2t_keras.inference.search.greedy import _one_per_row


def _mix32(x: tf.Tensor) -> tf.Tensor:
  """MurmurHash3's 32-bit finalizer: a bijection of uint32 that mixes every bit."""
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))
  x = x * tf.constant(0x85EBCA6B, tf.uint32)
  x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(13, tf.uint32)))
  x = x * tf.constant(0xC2B2AE35, tf.uint32)
  return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, tf.uint32)))


def _to_uint32(x) -> tf.Tensor:
  return tf.bitcast(tf.cast(x, tf.int32), tf.uint32)


def row_uniform(seed, keys: tf.Tensor, index, vocab_size: int) -> tf.Tensor:
  """Uniform noise in (0, 1), (R, V): a counter-based hash of (seed, key, index, token).

  Row r's values depend only on the seed, keys[r], the position and the token, so a
  sample does not change with the batch it is decoded in (tf.random's stateless ops
  draw one stream for a whole tensor). Works in graph mode, under XLA and in exports.
  """
  row = _mix32(_mix32(_to_uint32(seed) ^ tf.constant(0x9E3779B9, tf.uint32))
               ^ _to_uint32(keys))
  row = _mix32(row ^ _mix32(_to_uint32(index) + tf.constant(0x7F4A7C15, tf.uint32)))
  tokens = _mix32(_to_uint32(tf.range(vocab_size)) * tf.constant(0x27D4EB2F, tf.uint32)
                  + tf.constant(0x165667B1, tf.uint32))
  bits = _mix32(row[:, None] ^ tokens[None, :])
  # The top 24 bits, centred in their interval: never exactly 0 or 1.
  top = tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, tf.uint32)), tf.float32)
  return (top + 0.5) / float(1 << 24)


def filter_logits(logits: tf.Tensor, topk: int = 0, topp: float = 1.0) -> tf.Tensor:
  """Keeps the `topk` largest logits of each row (0 = all) and, of those, the smallest
  set whose probability reaches `topp` (nucleus); the rest become NEG_INF."""
  vocab = logits.shape[-1]
  if topk and vocab is not None and topk < vocab:
    kth = tf.math.top_k(logits, topk).values[:, -1:]
    logits = tf.where(logits < kth, NEG_INF, logits)
  if topp < 1.0:
    ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
    probs = tf.nn.softmax(ordered, axis=-1)
    before = tf.cumsum(probs, axis=-1, exclusive=True)  # probability of the better ones
    # The last kept logit: the first token whose inclusion reaches topp.
    kept = tf.reduce_sum(tf.cast(before < topp, tf.int32), axis=-1, keepdims=True)
    threshold = tf.gather(ordered, tf.maximum(kept - 1, 0), batch_dims=1)
    logits = tf.where(logits < threshold, NEG_INF, logits)
  return logits


NEVER_SAMPLED = (PAD_ID, BOS_ID)  # no tensor at import: TensorFlow's runtime starts later


@dataclasses.dataclass(frozen=True)
class Sampling:
  """What random sampling is asked for: the seed (an int or a scalar int32 tensor),
  top-k (0 = all tokens), top-p (nucleus, 1 = all) and the temperature."""

  seed: Any
  topk: int = 0
  topp: float = 1.0
  temperature: float = 1.0


def sample_search(symbols_to_logits: SymbolsToLogits, initial_ids: tf.Tensor, state: Any,
                  decode_length, keys: tf.Tensor, sampling: Sampling
                  ) -> Tuple[tf.Tensor, tf.Tensor]:
  """Random sampling: one sequence per row, drawn token by token from the model.

  Each step samples from softmax(logits / temperature) restricted by `filter_logits`
  and without PAD and BOS
  (Gumbel-max: the arg-max of filtered logits plus Gumbel noise from `row_uniform`, so
  row r's draws depend only on seed, keys[r] and the position).

  Args:
    keys: (R,) int32, each row's key (e.g. input line number * samples + sample).
    sampling: the seed, top-k, top-p and temperature (`Sampling`).

  Returns:
    ids (R, 1, decode_length) with PAD after EOS, and the samples' log probabilities
    under the model (R, 1) (plain softmax: no temperature, no filtering; EOS included),
    matching `greedy_search`'s layout.
  """
  keys = tf.cast(keys, tf.int32)

  def choose(logits, log_probs, i):
    del log_probs
    vocab = logits.shape[-1]
    # PAD and BOS are never outputs (a sentence cannot contain them).
    never = tf.reduce_any(tf.range(vocab)[:, None] == tf.constant(NEVER_SAMPLED), axis=1)
    logits = tf.where(never, NEG_INF, logits)
    filtered = filter_logits(logits / sampling.temperature, sampling.topk, sampling.topp)
    noise = -tf.math.log(-tf.math.log(row_uniform(sampling.seed, keys, i, vocab)))
    # Tokens excluded by the caller (NEG_INF logits: a forced EOS, a constraint) or by
    # the filter are never drawn, whatever the temperature did to their logits.
    allowed = (logits > NEG_INF / 2) & (filtered > NEG_INF / 2)
    return tf.argmax(tf.where(allowed, filtered + noise, 2 * NEG_INF), axis=-1,
                     output_type=tf.int32)

  return _one_per_row(symbols_to_logits, initial_ids, state, decode_length, choose)
