"""Label-smoothed cross-entropy as SUMS over real target tokens (paper section 5.4).

Each replica returns (loss_sum, token_count); the trainer divides by the GLOBAL token
count, so 1 and N replicas make the same update for the same global batch, and
metrics are sum / denominator rather than a mean of per-batch means.

Smoothing spreads eps over the true vocabulary: the target gets 1 - eps and every
other token except PAD gets eps / (V - 2); PAD gets nothing, and PAD positions are
excluded from both the loss and the counts. As in tensor2tensor, the entropy of the
smoothed target distribution is subtracted, so a perfect model scores 0 and the
reported loss is comparable across eps (the constant does not change gradients).
"""

from __future__ import annotations

import math

from keras import ops

from t2t_keras import PAD_ID


def smoothing_constant(vocab_size: int, label_smoothing: float) -> float:
  """Entropy of the smoothed one-hot target (0 without smoothing)."""
  if label_smoothing <= 0:
    return 0.0
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab_size - 2)
  return -(confidence * math.log(confidence) + (vocab_size - 2) * low * math.log(low))


def _smoothed(log_probs, target_lp, label_smoothing):
  """Smoothed cross-entropy minus its minimum, from log-probs (B, T, V) and the
  targets' log-probs (B, T)."""
  if label_smoothing <= 0:
    return -target_lp
  vocab_size = log_probs.shape[-1]
  confidence = 1.0 - label_smoothing
  low = label_smoothing / (vocab_size - 2)
  others = ops.sum(log_probs, axis=-1) - target_lp - log_probs[..., PAD_ID]  # (B, T)
  loss = -(confidence * target_lp + low * others)
  return loss - smoothing_constant(vocab_size, label_smoothing)


def _log_probs(logits, targets):
  log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)  # (B, T, V)
  target_lp = ops.take_along_axis(log_probs, ops.cast(targets, "int32")[..., None],
                                  axis=-1)[..., 0]  # (B, T)
  return log_probs, target_lp


def smoothed_cross_entropy(logits, targets, label_smoothing=0.1):
  """Per-position smoothed cross-entropy minus its minimum.

  Args:
    logits: float (B, T, V).
    targets: int (B, T), PAD_ID at padding.
    label_smoothing: eps_ls.

  Returns:
    float32 (B, T) losses, zero at padding positions.
  """
  log_probs, target_lp = _log_probs(logits, targets)
  weights = ops.cast(ops.not_equal(targets, PAD_ID), "float32")
  return _smoothed(log_probs, target_lp, label_smoothing) * weights


def loss_sums(logits, targets, label_smoothing=0.1):
  """(smoothed loss sum, NLL sum, correct-token count, token count) over real tokens.

  For evaluation; training needs only `smoothed_cross_entropy`.
  """
  log_probs, target_lp = _log_probs(logits, targets)
  weights = ops.cast(ops.not_equal(targets, PAD_ID), "float32")
  loss = ops.sum(_smoothed(log_probs, target_lp, label_smoothing) * weights)
  nll = ops.sum(-target_lp * weights)
  predictions = ops.cast(ops.argmax(logits, axis=-1), targets.dtype)
  correct = ops.sum(ops.cast(ops.equal(predictions, targets), "float32") * weights)
  return loss, nll, correct, ops.sum(weights)


# Added to the attention probabilities before the log, as Marian does: a reference link
# to a position the head gives (almost) zero costs a large, finite amount.
ALIGNMENT_EPSILON = 1e-6


def guided_alignment_sum(attention, alignment):
  """Guided alignment's cross-entropy, summed over target positions (Garg et al. 2019;
  Marian's and OpenNMT-tf's "ce" cost).

  Each target position's reference row is normalised to a distribution over the source
  positions it is linked to; the loss is -sum_s ref(t, s) log(p(t, s) + eps) of the
  guided head's attention p. Positions without links (unaligned words, EOS, padding)
  contribute nothing. The trainer divides the sum by the global target tokens, as the
  translation loss's, so the weight means the same whatever the batch (Marian
  normalises by target words too).

  Args:
    attention: float (B, T, S) the guided head's encoder-decoder attention.
    alignment: float (B, T, S) 1 at each (target, source) reference link, else 0.

  Returns:
    float32 scalar.
  """
  alignment = ops.cast(alignment, "float32")
  reference = alignment / ops.maximum(ops.sum(alignment, axis=-1, keepdims=True), 1.0)
  log_p = ops.log(ops.cast(attention, "float32") + ALIGNMENT_EPSILON)
  return -ops.sum(reference * log_p)
