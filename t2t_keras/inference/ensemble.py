"""Ensembles of Transformers that share a vocabulary (decode `--model_dir=A,B[,C]`).

`Ensemble` has the decoding interface of `Transformer` (`encode`, `cross_key_values`,
`init_cache`, `decode_step`), so `decoding.decode_ids` runs beam search, greedy search
or sampling over it unchanged, with and without XLA: each member encodes the source
and keeps its own key/value cache, and each step's scores are the average of the
members' log probabilities (as OpenNMT-py and Marian combine them; beam search then
renormalises them, a normalised geometric mean of the members' distributions). Teacher
forcing (`forced`: score, --output_alignments) renormalises the same average, so it
scores an output as the search did. A model ensembled with itself translates exactly
as the model alone.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf


class Ensemble:
  """Members decode in lock step; log probabilities are averaged at each step."""

  def __init__(self, models: Sequence):
    if not models:
      raise ValueError("an ensemble needs at least one model")
    vocab_sizes = {(m.model_config.vocab_size, m.model_config.output_vocab_size)
                   for m in models}
    if len(vocab_sizes) > 1:
      raise ValueError(f"ensemble members have vocabularies of different sizes "
                       f"{sorted(vocab_sizes)}: they must share one vocabulary")
    self.models = list(models)
    self.model_config = self.models[0].model_config
    self.uses_source_pointer = any(getattr(m, "uses_source_pointer", False)
                                   for m in self.models)

  def encode(self, inputs, training=False):
    """(one encoder output per member, the source mask they share)."""
    outputs = [m.encode(inputs, training=training) for m in self.models]
    return tuple(encoded for encoded, _ in outputs), outputs[0][1]

  def cross_key_values(self, encoded):
    return tuple(m.cross_key_values(e) for m, e in zip(self.models, encoded))

  def init_cache(self, batch_size, max_length, beam_size=1):
    return tuple(m.init_cache(batch_size, max_length, beam_size=beam_size)
                 for m in self.models)

  def step_weights(self, max_length=None, beams=None):
    """The members' step weights, for `decode_step(..., weights=)`."""
    return tuple(m.step_weights(max_length, beams) for m in self.models)

  def decode_step(self, ids, index, cache, cross_key_values, memory_mask, **options):
    """The members' average log probabilities (B * K, V) and their updated caches.

    `options` are `Transformer.decode_step`'s (slots, grow, ...), passed to every
    member; two are the members' own, one entry each: `weights` (as
    `step_weights()` returns them) and `source_pointer` (the members' encoder
    outputs, as `encode` returns them, one row per sentence; the pointer per
    hypothesis), when `uses_source_pointer`."""
    weights = options.pop("weights", None)
    source_pointer = options.pop("source_pointer", None)
    log_probs, caches = [], []
    for i, (model, model_cache, key_values) in enumerate(
        zip(self.models, cache, cross_key_values)):
      extra = dict(options)
      if getattr(model, "uses_source_pointer", False):
        encoded, pointer = source_pointer
        extra["source_pointer"] = (encoded[i], pointer)
      logits, model_cache = model.decode_step(
          ids, index, model_cache, key_values, memory_mask,
          weights=None if weights is None else weights[i], **extra)
      log_probs.append(tf.nn.log_softmax(tf.cast(logits, tf.float32)))
      caches.append(model_cache)
    if len(log_probs) == 1:
      return log_probs[0], tuple(caches)
    return tf.add_n(log_probs) / float(len(log_probs)), tuple(caches)

  def forced(self, inputs, targets, layer: int = -1):
    """Teacher forcing: the members' average log probabilities, renormalised (B, T, V),
    and average cross-attention of decoder layer `layer` (B, H, T, S)."""
    log_probs, attention = [], []
    for model in self.models:
      lp, att = forced_pass(model, inputs, targets, layer)
      log_probs.append(lp)
      attention.append(att)
    # Renormalised as the searches renormalise `decode_step`'s average (their log
    # softmax of each step's scores): without it, score --model_dir=A,B would give a
    # beam's output another number than decode gave it.
    mean = tf.add_n(log_probs) / len(log_probs)
    return tf.nn.log_softmax(mean), tf.add_n(attention) / len(attention)


def forced_pass(model, inputs, targets, layer: int = -1):
  """Teacher forcing of one model (or an Ensemble): log probabilities (B, T, V) of
  every target position and decoder layer `layer`'s cross-attention (B, H, T, S)."""
  if isinstance(model, Ensemble):
    return model.forced(inputs, targets, layer)
  encoded, mask = model.encode(inputs, training=False)
  logits, maps = model.decode(targets, encoded, mask, training=False,
                              return_attention=True, inputs=inputs)
  _, cross = maps[layer]
  return tf.nn.log_softmax(tf.cast(logits, tf.float32)), tf.cast(cross, tf.float32)
