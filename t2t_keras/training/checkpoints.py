"""Restoring a checkpoint with an error a person can act on.

What the model directory holds (config.json, the vocabulary, which checkpoints there
are) is t2t_keras.modeldir's; this module turns TensorFlow's restore failures (truncated
files, another model's variables) into one CheckpointError that names the checkpoint
and what to do.
"""

from __future__ import annotations

import tensorflow as tf

from t2t_keras.errors import CheckpointError


def restore(checkpoint: tf.train.Checkpoint, path: str, expect_partial: bool = False):
  """Restores `path` into `checkpoint`, turning TensorFlow's errors into a clear one.

  Raises:
    CheckpointError: naming the checkpoint, what went wrong and what to do.
  """
  try:
    status = checkpoint.restore(path)
    if expect_partial:
      status.expect_partial()
    else:
      status.assert_existing_objects_matched()
    return status
  except (tf.errors.OpError, ValueError, AssertionError, IndexError, KeyError) as error:
    detail = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    raise CheckpointError(
        f"cannot restore checkpoint {path}: {type(error).__name__}: {detail}. The files are "
        "corrupt or truncated, or were written by a model of another shape. Delete this "
        "checkpoint (the previous one is kept alongside it) or point --model_dir / "
        "--checkpoint_path elsewhere.") from None
