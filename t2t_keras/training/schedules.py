"""Learning-rate schedules of the paper (section 5.3) and of tensor2tensor.

Step numbers start at 1 for the first update (the optimizer's iteration counter + 1),
so the paper's formula never divides by zero and step w is the peak.
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="t2t_keras")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """Linear warm-up then inverse-square-root decay.

  kind="paper": multiplier * d^-0.5 * min(s^-0.5, s * w^-1.5)
  kind="t2t":   multiplier * d^-0.5 * min(1, s / w) * rsqrt(max(s, w))
  (identical in shape; t2t used multiplier 2.0 and w = 8000).

  Args:
    hidden_size: d_model.
    warmup_steps: w.
    multiplier: constant factor.
    kind: "paper" or "t2t".
  """

  def __init__(self, hidden_size, warmup_steps, multiplier=1.0, kind="paper"):
    if kind not in ("paper", "t2t"):
      raise ValueError(f"learning_rate_schedule={kind!r} must be 'paper' or 't2t'")
    self.hidden_size = hidden_size
    self.warmup_steps = warmup_steps
    self.multiplier = multiplier
    self.kind = kind

  def __call__(self, iteration):
    step = ops.cast(iteration, "float32") + 1.0
    warmup = float(self.warmup_steps)
    scale = self.multiplier * self.hidden_size ** -0.5
    if self.kind == "paper":
      return scale * ops.minimum(ops.rsqrt(step), step * warmup ** -1.5)
    return scale * ops.minimum(1.0, step / warmup) * ops.rsqrt(ops.maximum(step, warmup))

  def get_config(self):
    return dict(hidden_size=self.hidden_size, warmup_steps=self.warmup_steps,
                multiplier=self.multiplier, kind=self.kind)
