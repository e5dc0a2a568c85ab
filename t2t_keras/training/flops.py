"""Matmul FLOPs of a training step, for the end-of-training cost estimate (paper Table 2
reports training cost in FLOPs) and the benchmarks' ratio to the machine's peak.

Counts 2 FLOPs per multiply-add of every matmul on the padded shapes actually computed,
times 3 for forward + backward; element-wise ops, softmax and norms are ignored.
"""

from __future__ import annotations

from t2t_keras.configs import ModelConfig


def forward_flops(config: ModelConfig, batch, source_length, target_length):
  """Forward-pass matmul FLOPs of one (B, S) -> (B, T) batch.

  Works on Python numbers and on float tensors alike (the train step counts in-graph).
  """
  d, f, h = config.hidden_size, config.filter_size, config.num_heads
  dk, dv = config.head_key_size, config.head_value_size
  s, t = source_length, target_length

  def projections(tokens, memory_tokens):
    # Q from queries; K, V from memory; output projection from the heads.
    return 2 * (tokens * d * h * dk + memory_tokens * d * h * (dk + dv) + tokens * h * dv * d)

  def scores(queries, keys):  # Q K^T and probs V
    return 2 * queries * keys * h * (dk + dv)

  ffn = 2 * 2 * d * f
  encoder = config.encoder_layers * (projections(s, s) + scores(s, s) + s * ffn)
  decoder = config.decoder_layers * (projections(t, t) + scores(t, t) + projections(t, s)
                                     + scores(t, s) + t * ffn)
  softmax = 2 * t * d * config.output_vocab_size
  return batch * (encoder + decoder + softmax)


def train_flops(config: ModelConfig, batch, source_length, target_length):
  """Forward + backward (3x forward) matmul FLOPs of one training step."""
  return 3 * forward_flops(config, batch, source_length, target_length)
