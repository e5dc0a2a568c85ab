"""The optimizers --optimizer names, and clipping by the global norm of the batch gradient.

adam: the paper's Adam: `keras.optimizers.Adam`'s update (its variables, checkpoints and
settings), applied to each weight by TensorFlow's fused kernel (`Adam` below).

adafactor: Shazeer and Stern (2018), written for tensor2tensor. Keras' Adafactor
defaults are tensor2tensor's: no first moment (t2t's beta1 = 0), second-moment decay
1 - s^-0.8 (t2t's `adafactor_decay_rate_pow(0.8)`), epsilon1 1e-30, epsilon2 1e-3,
update clipping at RMS 1.0, and each step scaled by max(epsilon2, RMS(weight)) (t2t's
`multiply_by_parameter_scale`), which makes the learning rate a relative step size,
capped at 1/sqrt(s). Two differences from t2t: every matrix is factored (t2t left
dimensions under 128 unfactored), and the learning rate is this project's
--learning_rate_schedule (t2t's Adafactor recipes used rsqrt_decay: 1/sqrt(max(s, w))).

With --clip_grad_norm the trainer sums the replicas' gradients itself (the clip needs
the norm of the summed gradient), so the optimizer must not sum them again:
`_Summed` optimizers take the gradients as they come.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops


@keras.saving.register_keras_serializable(package="t2t_keras")
class Adafactor(keras.optimizers.Adafactor):
  """Keras' Adafactor that keeps only the factors of a matrix's second moment.

  Keras' Adafactor also stores each matrix's full second-moment estimate (the outer
  product of its row and column factors) in a variable of the weight's shape, which
  gives back half of the memory Adafactor exists to save. This one rebuilds it from
  the factors inside each update, as tensor2tensor's did: an n x m matrix keeps n + m
  numbers (Adam: 2nm); vectors keep a full second moment (n numbers, Adam 2n). The
  updates are Keras' own (tests/optimizers_test.py compares them).
  """

  def build(self, var_list):
    if self.built:
      return
    keras.optimizers.Optimizer.build(self, var_list)  # not Keras' Adafactor's slots
    self._r, self._c, self._v = [], [], []
    for var in var_list:
      factored = len(var.shape) >= 2
      self._r.append(self.add_variable(shape=var.shape[:-1], dtype=var.dtype,
                                       name=f"{var.name}_row") if factored else None)
      self._c.append(self.add_variable(shape=var.shape[:-2] + (var.shape[-1],),
                                       dtype=var.dtype, name=f"{var.name}_column")
                     if factored else None)
      self._v.append(None if factored else self.add_variable_from_reference(
          reference_variable=var, name="velocity"))

  def update_step(self, gradient, variable, learning_rate):
    index = self._get_variable_index(variable)
    lr = ops.cast(learning_rate, variable.dtype)
    gradient = ops.cast(gradient, variable.dtype)
    step = ops.cast(self.iterations + 1, variable.dtype)
    rho = ops.minimum(lr, 1 / ops.sqrt(step))
    alpha = ops.maximum(ops.cast(self.epsilon_2, variable.dtype), self._rms(variable)) * rho
    squared = ops.add(ops.square(gradient), self.epsilon_1)
    decay = ops.subtract(1, ops.power(step, self.beta_2_decay))

    def average(slot, value):
      new = ops.add(ops.multiply(decay, slot), ops.multiply(ops.subtract(1, decay), value))
      self.assign(slot, new)
      return new

    if self._v[index] is None:
      rows = average(self._r[index], ops.mean(squared, axis=-1))
      columns = average(self._c[index], ops.mean(squared, axis=-2))
      second = ops.multiply(
          ops.expand_dims(ops.divide(rows, ops.mean(rows, axis=-1, keepdims=True)), -1),
          ops.expand_dims(columns, -2))
    else:
      second = average(self._v[index], squared)
    update = ops.divide(gradient, ops.sqrt(second))
    update = ops.divide(update, ops.maximum(1.0, ops.divide(self._rms(update),
                                                            self.clip_threshold)))
    self.assign_sub(variable, ops.multiply(alpha, update))


@keras.saving.register_keras_serializable(package="t2t_keras")
class Adam(keras.optimizers.Adam):
  """Keras' Adam, each weight's update in one op: TensorFlow's ResourceApplyAdam.

  Keras writes the update as about fifteen ops per weight (the moments, the step size,
  three reads and writes of variables); each is a kernel to launch and a pass over the
  tensor. The fused kernel computes the same formula (moments, then the bias-corrected
  step alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t), then
  var -= alpha * m / (sqrt(v) + epsilon)) in one pass, on every device TensorFlow has
  (XLA and TPUs included). It computes 1 - beta in float32 where Keras rounds it from
  Python's float64, so updates may differ from Keras' in the last bit: the same
  optimizer, not a bitwise copy. Tracing a train step takes a third less time with it
  (every training start pays that, every test that trains); on a CPU the step itself
  runs about as fast (docs/benchmarks.md, "Adam's update"). Sparse gradients
  (IndexedSlices, which the trainer makes dense first) and AMSGrad (which this project
  does not use) take Keras' own update; weight decay, which Keras applies before the
  update, works with either.
  """

  def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
    if self.amsgrad:
      return super()._distributed_tf_update_step(distribution, grads_and_vars,
                                                 learning_rate)
    # The step's scalars once, not once per weight as Keras does. The learning rate
    # comes per replica (merge_call's PerReplica), so it goes through `update`'s args.
    scalars = self._scalars(tf.float32)

    def apply(variable, gradient, learning_rate):
      if isinstance(gradient, tf.IndexedSlices):
        # An embedding lookup's gradient (the trainer makes them dense before this):
        # Keras squares each looked-up row's gradient before a row looked up twice is
        # summed, so its second moment is not the dense update's there. Kept as is.
        return self.update_step(gradient, variable, learning_rate)
      dtype = variable.dtype
      index = self._get_variable_index(variable)
      m, v = self._momentums[index].value, self._velocities[index].value
      return tf.raw_ops.ResourceApplyAdam(
          var=variable.handle, m=m.handle, v=v.handle, grad=tf.cast(gradient, dtype),
          lr=tf.cast(learning_rate, dtype),
          **(scalars if dtype == tf.float32 else self._scalars(dtype)))

    for gradient, variable in grads_and_vars:
      distribution.extended.update(variable, apply, args=(gradient, learning_rate),
                                   group=False)

  def _scalars(self, dtype):
    step = tf.cast(self.iterations + 1, dtype)
    beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
    return dict(beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
                beta1=beta_1, beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype))


class _Summed:
  """Takes gradients already summed over the replicas (the trainer's clipping did)."""

  def _all_reduce_sum_gradients(self, grads_and_vars):
    return list(grads_and_vars)


class _SummedAdam(_Summed, Adam):
  pass


class _SummedAdafactor(_Summed, Adafactor):
  pass


def create(config, learning_rate) -> keras.optimizers.Optimizer:
  """The optimizer of a TrainConfig (--optimizer, --clip_grad_norm), unbuilt.

  Args:
    config: the TrainConfig.
    learning_rate: a float or a LearningRateSchedule.
  """
  summed = config.clip_grad_norm > 0
  if config.optimizer == "adafactor":
    return (_SummedAdafactor if summed else Adafactor)(learning_rate=learning_rate,
                                                        name="adafactor")
  return (_SummedAdam if summed else Adam)(
      learning_rate=learning_rate, beta_1=config.adam_beta1, beta_2=config.adam_beta2,
      epsilon=config.adam_epsilon, name="adam")


def clip_by_global_norm(grads, clip_norm: float, scale=1.0):
  """`grads` scaled so that their global norm is at most `clip_norm`.

  Args:
    grads: the batch's gradient (summed over replicas and micro-batches), times
      `scale`.
    clip_norm: the largest global L2 norm of the unscaled gradient.
    scale: the loss scale the gradients carry (mixed float16), else 1.

  Returns:
    (clipped gradients, the unscaled gradient's global norm before clipping).
  """
  norm = tf.linalg.global_norm(grads) / tf.cast(scale, tf.float32)
  factor = clip_norm / tf.maximum(norm, clip_norm)  # 1 unless the norm is above
  return [g * tf.cast(factor, g.dtype) for g in grads], norm
