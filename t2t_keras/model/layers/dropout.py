"""Dropout (paper section 5.4): a float32 uniform draw, a {0, 1/(1-rate)} mask, a multiply.

Why not `keras.layers.Dropout` (figures: docs/benchmarks.md, "Measurements behind
other code comments"):
- it draws its noise in x's dtype: under mixed_bfloat16 that RNG is slower than a
  float32 one (and quantises `rate` to bfloat16); here noise is float32, so a bfloat16
  dropout, forward and backward, is faster. In float32 the two cost the same (the time
  is the random numbers, not the backward pass, which is one multiply here and one
  select in Keras);
- under a tf.distribute strategy its mirrored seed state gives every replica the same
  mask; here the replica id is added to the seed.
The noise uses `alg="philox"` explicitly: with the default ("auto_select"), XLA on CPU
compiles `stateless_uniform` to a far slower RNG. (`tf.random` rather than
`keras.random` for this reason and because the seed is a tensor.)

Randomness: a `keras.random.SeedGenerator` created in `__init__` (seeded from Python's
`random`, so `keras.utils.set_random_seed` makes runs reproducible) gives a new seed on
every call and feeds `stateless_uniform`, which runs in `tf.function`, under XLA
(`jit_compile=True`) and in every replica of a strategy. The generator's state is a
variable but not a weight of the layer (a SeedGenerator is not trackable), so the
trainer checkpoints it explicitly (`Trainer.checkpoint`, `dropout_seeds`): a resumed
run draws the masks an uninterrupted run would. A rate of 0 creates no generator.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops


@keras.saving.register_keras_serializable(package="t2t_keras")
class Dropout(keras.layers.Layer):
  """Zeroes each element with probability `rate` and scales the rest by 1/(1-rate).

  Args:
    rate: drop probability in [0, 1).
    seed: optional int seed of the layer's SeedGenerator; by default one is drawn
      from Python's `random` (set by `keras.utils.set_random_seed`).

  Call arguments:
    inputs: a float tensor of any shape (the mask has the same shape).
    training: whether to drop; otherwise (and when rate is 0) inputs are returned as is.

  Returns:
    A tensor of the shape and dtype of `inputs`.
  """

  def __init__(self, rate, seed=None, **kwargs):
    super().__init__(**kwargs)
    if not 0.0 <= rate < 1.0:
      raise ValueError(f"Dropout rate must be in [0, 1), got rate={rate}; use a smaller "
                       "--layer_prepostprocess_dropout/--attention_dropout/--relu_dropout.")
    self.rate = rate
    self.seed = seed
    # Only a layer that drops needs a generator (keras.layers.Dropout does the same).
    self.seed_generator = keras.random.SeedGenerator(seed) if rate > 0 else None
    self.supports_masking = True
    self.built = True

  def call(self, inputs, training=None):
    if not training or self.rate == 0:
      return inputs
    noise = tf.random.stateless_uniform(ops.shape(inputs), seed=self._next_seed(),
                                        dtype="float32", alg="philox")
    mask = ops.cast(noise >= self.rate, inputs.dtype) * ops.cast(
        1.0 / (1.0 - self.rate), inputs.dtype)  # needs no gradient
    return inputs * mask

  def _next_seed(self):
    """The generator's next (2,) seed as int32 (what XLA takes), offset by the replica.

    Under a tf.distribute strategy the generator's state is mirrored, so every replica
    would draw the same mask; adding the replica id gives each its own stream.
    """
    seed = self.seed_generator.next()  # int64 (2,); advances the state
    context = tf.distribute.get_replica_context()
    if context is not None:
      replica = ops.cast(context.replica_id_in_sync_group, seed.dtype)
      seed = seed + ops.stack([replica, ops.zeros_like(replica)])
    return ops.cast(seed % (2 ** 31 - 1), "int32")

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    config = super().get_config()
    config.update(rate=self.rate, seed=self.seed)
    return config
