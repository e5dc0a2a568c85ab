"""The device side of training: what each replica runs inside `strategy.run`.

One update from a replica's (micro-)batches: the globally normalised loss and its
gradients (`_gradients`, `_forward`), micro-batches accumulated in one loop
(`_accumulate`), the replicas' agreement that the gradients are finite and the clip of
the batch's gradient (`_apply`); `steps_per_loop` updates in one `tf.while_loop`
(`_train_loop`) whose sums and step counter reach the host in one tensor
(`_train_call`); and the dev loss sums (`_eval_step`, `_eval_loop`). These are traced
(on TPU or with --jit_compile, compiled) and never touch the host: the host loop that
calls them, logs, evaluates and checkpoints is `trainer.Trainer`'s, which inherits them
(`DeviceSteps`, as Keras' `Model` inherits its `Trainer`).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from t2t_keras import PAD_ID
from t2t_keras.training import flops, losses, optimizers

SUM = tf.distribute.ReduceOp.SUM


def _steps(num_steps, step):
  """`num_steps` calls of `step(i, totals)` in one `tf.while_loop`; returns the four
  summed totals. Written out rather than autograph's `for _ in tf.range`: the trainer's
  functions trace without autograph, whose conversion of them cost about 2 s at every
  start of a training process."""
  zeros = (tf.constant(0.0),) * 4
  _, totals = tf.while_loop(lambda i, _: i < num_steps, step, (tf.constant(0), zeros))
  return totals


# The step counter crosses to the host in float32 as (step // this, step % this): each
# part is exact (see Trainer._train_call).
STEP_SPLIT = 1 << 24


class DeviceSteps:
  """The trainer's device functions, a mixin of `trainer.Trainer`, which provides what
  they read: `model`, `model_config`, `config` (the TrainConfig), `optimizer`,
  `strategy`, and the tf.functions `_compute_gradients` (of `_gradients`) and
  `_eval_replica_fn` (of `_eval_replica`)."""

  def _gradients(self, batch, global_tokens):
    """Gradients of this replica's share of the globally normalised loss."""
    variables = self.model.trainable_variables
    with tf.GradientTape() as tape:
      logits, attention = self._forward(batch)
      loss_sum = tf.reduce_sum(losses.smoothed_cross_entropy(
          logits, batch["targets"], self.config.label_smoothing))
      if attention is not None:  # --train_alignments: the guided head's loss joins it
        loss_sum += self.config.guided_alignment_weight * losses.guided_alignment_sum(
            attention, batch["alignment"])
      tokens = tf.reduce_sum(tf.cast(tf.not_equal(batch["targets"], PAD_ID), tf.float32))
      loss = loss_sum / tf.maximum(global_tokens, 1.0)
      if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
        loss = self.optimizer.scale_loss(loss)
    # Embedding lookups give sparse gradients (IndexedSlices) whose row count differs
    # between replicas and workers: densify them, so that cross-worker all-reduce and
    # micro-batch accumulation see one fixed shape (a 37k x 1024 float32 table: 151 MB
    # per replica, as the shared softmax projection's dense gradient already costs).
    grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
             for g in tape.gradient(loss, variables)]
    step_flops = flops.train_flops(self.model_config,
                                   *[tf.cast(n, tf.float32) for n in (
                                       tf.shape(batch["inputs"])[0],
                                       tf.shape(batch["inputs"])[1],
                                       tf.shape(batch["targets"])[1])])
    return grads, loss_sum, tokens, step_flops

  def _forward(self, batch):
    """Logits (B, T, V), and with reference alignments in the batch the guided head's
    encoder-decoder attention (B, T, S) (--guided_alignment_layer/_head), else None."""
    if "alignment" not in batch:
      return self.model(batch, training=True), None
    encoded, mask = self.model.encode(batch["inputs"], training=True)
    logits, maps = self.model.decode(batch["targets"], encoded, mask, training=True,
                                     return_attention=True, inputs=batch["inputs"])
    _, cross = maps[self.config.guided_alignment_layer]  # (B, H, T, S)
    return logits, cross[:, self.config.guided_alignment_head]

  def _replica_step(self, *batches):
    """One update from `accum_steps` micro-batches (usually one).

    The loss is normalised by the target tokens of ALL micro-batches on all replicas,
    so k accumulated micro-batches make exactly the update of one k-times-bigger batch.
    The k micro-batches are all read first (data, not compute) for that token count;
    their gradients are then summed in one loop (`_accumulate`), not k copies.
    """
    tokens = tf.add_n([tf.reduce_sum(tf.cast(tf.not_equal(b["targets"], PAD_ID), tf.float32))
                       for b in batches])
    global_tokens = tf.distribute.get_replica_context().all_reduce(SUM, tokens)
    if len(batches) == 1:
      grads, loss_sum, tokens, step_flops = self._compute_gradients(batches[0], global_tokens)
    else:
      grads, loss_sum, tokens, step_flops = self._accumulate(batches, global_tokens)
    overflows = self._apply(grads)
    return loss_sum, tokens, step_flops, overflows

  def _accumulate(self, batches, global_tokens):
    """`_compute_gradients` of every micro-batch, summed in one `tf.while_loop`.

    One forward and backward pass in the program whatever k is: unrolled, k passes
    made the program (a TPU's, or any that XLA compiles whole) and its compile time
    k times bigger. Iteration i takes micro-batch i through a `tf.switch_case` whose
    branches only pass a batch on, so micro-batches of different shapes (dynamic
    shapes: each its own length) go through unchanged; where XLA compiles the step
    whole (a TPU), the branches must agree in shape, as --static_shapes (one bucket for
    all micro-batches of a step) and --packed_length make them. Stacking the batches
    instead would need padding to a common shape, which changes the dropout masks
    (drawn for the padded shape) and adds work; as it is, each micro-batch's gradients
    are those of k unrolled passes and are summed in the same order (from zero), so the
    update is bitwise theirs. `parallel_iterations=1`: one micro-batch's activations
    live at a time, which is what accumulating is for, and the dropout seeds advance
    in micro-batch order.

    Returns:
      (summed gradients, loss_sum, tokens, flops), as `_gradients`.
    """
    def body(i, grads, sums):
      batch = tf.switch_case(i, [lambda b=b: b for b in batches])
      more = self._compute_gradients(batch, global_tokens)
      return (i + 1, [g + h for g, h in zip(grads, more[0])],
              tuple(s + m for s, m in zip(sums, more[1:])))

    zeros = [tf.zeros(v.shape, v.dtype) for v in self.model.trainable_variables]
    _, grads, sums = tf.while_loop(lambda i, *_: i < len(batches), body,
                                   (tf.constant(0), zeros, (tf.constant(0.0),) * 3),
                                   parallel_iterations=1)
    return (grads,) + tuple(sums)

  def _apply(self, grads):
    """Applies one replica's gradients once all replicas agree they are finite.

    Returns this replica's share of the count of replicas whose gradients were not
    finite (the host loop sums it over replicas).

    Keras' LossScaleOptimizer, under MirroredStrategy without XLA and under
    MultiWorkerMirroredStrategy, decides in a merge call from replica 0's gradients
    alone whether they are finite. An overflow on another replica would then be
    applied (inf weights) and the loss scale never lowered. One all-reduce of "some
    gradient is not finite here" makes every replica's gradients non-finite when any
    replica's are, so all replicas skip the step together and the scale drops.
    In float32 and bfloat16 (no loss scaling) a non-finite gradient is an error: every
    replica applies a zero update instead (the weights stay finite and identical) and
    the host loop stops the run without saving (`Trainer.train`).

    --clip_grad_norm bounds the norm of the batch's gradient, which is the SUM of the
    replicas' gradients (each replica's loss is already divided by the global token
    count): the replicas sum them here, every replica clips the same sum, and the
    optimizer (built not to sum again, `optimizers.create`) applies it. Clipping each
    replica's share, as Keras' `global_clipnorm` would, makes the update depend on how
    the batch is split over replicas.
    """
    context = tf.distribute.get_replica_context()
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    local = 1.0 - tf.cast(finite, tf.float32)
    overflows = context.all_reduce(SUM, local)
    scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
    if scaled:
      poison = tf.where(overflows > 0, float("nan"), 1.0)
      grads = [g * tf.cast(poison, g.dtype) for g in grads]
    else:
      grads = [tf.where(overflows > 0, tf.zeros_like(g), g) for g in grads]
    if self.config.clip_grad_norm > 0:
      grads, _ = optimizers.clip_by_global_norm(
          context.all_reduce(SUM, grads), self.config.clip_grad_norm,
          self.optimizer.dynamic_scale if scaled else 1.0)
    self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
    return local

  def _train_loop(self, iterator, num_steps):
    """Runs `num_steps` updates; returns global (loss_sum, target_tokens, flops,
    replicas with non-finite gradients, summed over the steps)."""
    def step(i, totals):
      batches = tuple(next(iterator) for _ in range(self.config.accum_steps))
      per_replica = self.strategy.run(self._replica_step, args=batches)
      return i + 1, tuple(t + self.strategy.reduce(SUM, v, axis=None)
                          for t, v in zip(totals, per_replica))
    return _steps(num_steps, step)

  def _train_call(self, iterator, num_steps):
    """One host call: `_train_loop`'s four sums and the step counter it reached, in one
    float32 vector [loss_sum, target_tokens, flops, overflows, step // 2**24,
    step % 2**24], so that the host reads a call's results in one transfer (`_run`), as
    orbit reads its metrics once a loop; on a remote TPU each read is a round trip.

    The counter is `optimizer.iterations`, read after the loop (automatic control
    dependencies order the read after the loop's updates of it), so skipped float16
    steps count (`_LossScaleOptimizer`). It travels as two float32 parts, each exact
    below 2**24, as TPUs have no float64.
    """
    totals = self._train_loop(iterator, num_steps)
    step = tf.cast(self.optimizer.iterations, tf.int64)
    parts = (step // STEP_SPLIT, step % STEP_SPLIT)
    return tf.stack(list(totals) + [tf.cast(p, tf.float32) for p in parts])

  def _eval_replica(self, batch):
    logits = self.model(batch, training=False)
    return losses.loss_sums(logits, batch["targets"], self.config.label_smoothing)

  def _eval_step(self, batch):
    per_replica = self.strategy.run(self._eval_replica, args=(batch,))
    return [self.strategy.reduce(SUM, v, axis=None) for v in per_replica]

  def _eval_loop(self, iterator, num_steps):
    """`num_steps` steps of one static dev bucket; returns the global sums (as
    `losses.loss_sums`). Traced once per bucket: the iterator's shape is static."""
    def step(i, totals):
      # Through a Python function, as in training: a jit-compiled tf.function handed
      # to strategy.run directly ran with one replica's variables on the other
      # replica's device (an error).
      per_replica = self.strategy.run(lambda batch: self._eval_replica_fn(batch),
                                      args=(next(iterator),))
      return i + 1, tuple(t + self.strategy.reduce(SUM, v, axis=None)
                          for t, v in zip(totals, per_replica))
    return _steps(num_steps, step)
