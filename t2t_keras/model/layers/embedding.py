"""Token embeddings that double as the pre-softmax projection (paper section 3.4).

One (V, D) matrix embeds source tokens, target tokens and, transposed, maps decoder
outputs to logits. Embeddings are multiplied by sqrt(D). Weights start from
N(0, D^-0.5), as in tensor2tensor, so that scaled embeddings have unit variance.
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="t2t_keras")
class SharedEmbedding(keras.layers.Layer):
  """Embedding lookup scaled by sqrt(D), with a tied output projection.

  Args:
    vocab_size: V.
    hidden_size: D.

  Call arguments:
    ids: int (B, T) token ids.

  Returns:
    (B, T, D) embeddings times sqrt(D) in the compute dtype.
  """

  def __init__(self, vocab_size, hidden_size, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size

  def build(self, input_shape=None):
    self.embeddings = self.add_weight(
        name="embeddings", shape=(self.vocab_size, self.hidden_size),
        initializer=keras.initializers.RandomNormal(stddev=self.hidden_size ** -0.5))
    self.built = True

  def call(self, ids):
    embedded = ops.take(self.embeddings, ids, axis=0)  # (B, T, D)
    return ops.cast(embedded, self.compute_dtype) * ops.cast(
        self.hidden_size ** 0.5, self.compute_dtype)

  def output_kernel(self):
    """The pre-softmax projection (D, V): the matrix transposed, in the compute dtype.

    Decoding takes it once per batch and passes it to every step (`logits(...,
    output_kernel=)`): inside a graph, a transpose that feeds the matmul directly is
    folded into a MatMul with transpose_b, which TensorFlow's CPU kernel runs several
    times slower than the plain one on a step's few rows (docs/benchmarks.md, "What
    changed, and where the time goes")."""
    return ops.transpose(ops.cast(self.embeddings, self.compute_dtype))

  def logits(self, hidden, output_kernel=None):
    """Maps (..., D) decoder outputs to float32 logits (..., V) with the same matrix
    (or `output_kernel`, this layer's `output_kernel()` computed once by the caller)."""
    kernel = self.output_kernel() if output_kernel is None else output_kernel
    return ops.cast(ops.matmul(hidden, kernel), "float32")

  def get_config(self):
    config = super().get_config()
    config.update(vocab_size=self.vocab_size, hidden_size=self.hidden_size)
    return config
