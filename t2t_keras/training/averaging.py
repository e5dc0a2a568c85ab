"""Checkpoint averaging (the paper averages the last 5 base / 20 big checkpoints).

`average_into_model` restores each checkpoint into the model in turn and assigns the
mean of the weights (accumulated in float64); only model variables take part, so
optimizer slots and the step counter are ignored. A checkpoint that does not hold
every model variable with the same shape is refused with a clear error.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras.training import checkpoints


def average_into_model(model, paths: Sequence[str]) -> None:
  """Sets model's weights to the mean of its weights in `paths`.

  Raises:
    CheckpointError: a checkpoint is unreadable or belongs to another model.
  """
  if not paths:
    raise checkpoints.CheckpointError("no checkpoints to average")
  checkpoint = tf.train.Checkpoint(model=model)
  sums = None
  for i, path in enumerate(paths):
    status = checkpoints.restore(checkpoint, path, expect_partial=True)
    try:
      status.assert_existing_objects_matched()
    except AssertionError as error:
      raise checkpoints.CheckpointError(
          f"{path} does not hold every variable of this model ({str(error)[:200]}); "
          "average only checkpoints of one training run.") from None
    values = [np.asarray(w, np.float64) for w in model.weights]
    sums = values if sums is None else [s + v for s, v in zip(sums, values)]
    logging.info("averaging %d/%d: %s", i + 1, len(paths), path)
  for weight, total in zip(model.weights, sums):
    weight.assign((total / len(paths)).astype(weight.dtype))
