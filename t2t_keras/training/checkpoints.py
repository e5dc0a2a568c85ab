"""Restoring and reading a checkpoint with an error a person can act on.

What the model directory holds (config.json, the vocabulary, which checkpoints there
are) is t2t_keras.modeldir's; this module turns TensorFlow's failures on a checkpoint
(truncated or missing files, another model's variables) into one CheckpointError that
names the checkpoint, its files and what to do. Training restores through `restore`;
decode, score, export and averaging read through `read_tensor` /
`training.averaging`, which raise the same error (`unreadable`).
"""

from __future__ import annotations

import tensorflow as tf

from t2t_keras.errors import CheckpointError

# What TensorFlow raises on a truncated or corrupt checkpoint: the reader's C++ errors
# arrive as OpError, ValueError or IndexError ("Read less bytes than requested").
READ_ERRORS = (tf.errors.OpError, ValueError, IndexError, KeyError)


def _detail(error: BaseException) -> str:
  text = str(error).strip()
  return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else \
      type(error).__name__


def checkpoint_files(path: str) -> str:
  """The files of checkpoint prefix `path` (its index and data shards), for messages."""
  try:
    files = sorted(tf.io.gfile.glob(path + ".data-*")) + sorted(
        tf.io.gfile.glob(path + ".index"))
  except tf.errors.OpError:
    files = []
  return ", ".join(files) if files else f"{path}.index / {path}.data-* (none found)"


def unreadable(path: str, error: BaseException, what: str = "read") -> CheckpointError:
  """The CheckpointError for a checkpoint TensorFlow failed to read or restore."""
  return CheckpointError(
      f"cannot {what} checkpoint {path}: {_detail(error)}. Its files ("
      f"{checkpoint_files(path)}) are corrupt or truncated, or were written by a model "
      "of another shape. Delete this checkpoint (the previous one is kept alongside it), "
      "leave it out (a smaller --average_last_n / --last_n), or point --model_dir / "
      "--checkpoint_path elsewhere.")


def read_tensor(path: str, reader, key: str):
  """reader.get_tensor(key) of checkpoint `path`, a CheckpointError if its files are bad."""
  try:
    return reader.get_tensor(key)
  except READ_ERRORS as error:
    raise unreadable(path, error) from None


def restore(checkpoint: tf.train.Checkpoint, path: str, expect_partial: bool = False):
  """Restores `path` into `checkpoint`, turning TensorFlow's errors into a clear one.

  Raises:
    CheckpointError: naming the checkpoint, its files, what went wrong and what to do.
  """
  try:
    status = checkpoint.restore(path)
    if expect_partial:
      status.expect_partial()
    else:
      status.assert_existing_objects_matched()
    return status
  except (*READ_ERRORS, AssertionError) as error:
    raise unreadable(path, error, "restore") from None
