"""Checkpoints: which to use, and restoring or reading them with errors a person can
act on.

Training, decode, score, export and the tools all come here: choosing checkpoints
(the latest, `--checkpoint_path` (a prefix or a directory such as <model_dir>/best),
the last `--average_last_n`), checking the `checkpoint` state file (it may name
nothing outside its directory), restoring with one CheckpointError that names the
checkpoint, its files and what to do. Averaging weights is t2t_keras.trained.averaging's;
the model directory's other files are t2t_keras.trained.modeldir's; building a model and
restoring it for inference is t2t_keras.inference.loading's.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Union

import tensorflow as tf

from t2t_keras.errors import CheckpointError, ModelDirError

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


def checkpoint_paths(model_dir_or_paths: Union[str, Sequence[str]],
                     last_n: Optional[int] = None, flag: str = "--last_n") -> List[str]:
  """The last `last_n` checkpoints of a model directory (or of a list), oldest first.

  Args:
    model_dir_or_paths: a model directory (its `checkpoint` file lists the kept
      checkpoints) or checkpoint prefixes such as `.../ckpt-1000`, oldest first.
    last_n: how many of the newest to take (None: all of them).
    flag: the command's flag for `last_n`, for messages.

  Raises:
    ModelDirError: the directory does not exist or holds no checkpoint.
    CheckpointError: fewer than `last_n` checkpoints exist.
  """
  if isinstance(model_dir_or_paths, (str, os.PathLike)):
    model_dir = os.fspath(model_dir_or_paths)
    if not tf.io.gfile.isdir(model_dir):
      raise ModelDirError(f"{model_dir} does not exist: pass the --model_dir training "
                          "wrote its checkpoints to.")
    paths = listed_checkpoints(model_dir)
    if not paths:
      raise ModelDirError(f"{model_dir} holds no checkpoint (no `checkpoint` file listing "
                          "ckpt-<step> files): train first, or point at the directory "
                          "training wrote.")
    where = model_dir
  else:
    paths = [os.fspath(p) for p in model_dir_or_paths]
    if not paths:
      raise ModelDirError("no checkpoint paths given to average.")
    where = "the given list"
  if last_n is None:
    return paths
  if last_n < 1:
    raise ModelDirError(f"{flag}={last_n}: average at least 1 checkpoint.")
  if last_n > len(paths):
    raise CheckpointError(
        f"cannot average the last {last_n} checkpoints: {where} holds {len(paths)} "
        f"checkpoint(s) ({', '.join(os.path.basename(p) for p in paths)}). Lower "
        f"{flag}, or keep more with --keep_checkpoint_max when training.")
  return paths[-last_n:]


def _normalized(path: str) -> str:
  scheme, sep, rest = path.rpartition("://")
  return scheme + sep + os.path.normpath(rest)


def check_checkpoint_state(directory: str):
  """The directory's `checkpoint` state (None if it has none), refused when it names
  checkpoints outside the directory.

  A model directory downloaded or copied from elsewhere may list absolute or `..`
  paths; TensorFlow would read those, and a training run resumed there would delete
  them while rotating checkpoints.

  Raises:
    CheckpointError: naming the state file, the path and what to do.
  """
  if not tf.io.gfile.isdir(directory):
    return None
  state = tf.train.get_checkpoint_state(directory)
  if state is None:
    return None
  home = _normalized(directory)
  for path in [state.model_checkpoint_path, *state.all_model_checkpoint_paths]:
    if path and _normalized(os.path.dirname(path)) != home:
      raise CheckpointError(
          f"{os.path.join(directory, 'checkpoint')} names {path}, which is outside "
          f"{directory}: a model directory's checkpoints must lie in it (reading or "
          "rotating them elsewhere could read or delete other files). Edit the file to "
          "name only ckpt-<step> files of this directory (e.g. model_checkpoint_path: "
          "\"ckpt-1000\"), or delete it to start without checkpoints.")
  return state


def listed_checkpoints(directory: str) -> List[str]:
  """The checkpoints a directory's `checkpoint` file lists, oldest first ([] if none).

  Raises:
    CheckpointError: the file names checkpoints outside the directory.
  """
  state = check_checkpoint_state(directory)
  return list(state.all_model_checkpoint_paths) if state else []


def choose_checkpoints(model_dir: str, checkpoint_path: Optional[str] = None,
                       average_last_n: int = 0) -> List[str]:
  """The checkpoint(s) decode, score and export take: --checkpoint_path (a prefix, or a
  directory such as <model_dir>/best: its latest), the last --average_last_n, or the
  latest.

  Raises:
    ModelDirError / CheckpointError: naming the flags, the directory and what to do.
  """
  if checkpoint_path and tf.io.gfile.isdir(checkpoint_path):
    check_checkpoint_state(checkpoint_path)
    directory, checkpoint_path = checkpoint_path, tf.train.latest_checkpoint(checkpoint_path)
    if checkpoint_path is None:
      raise CheckpointError(
          f"--checkpoint_path={directory} is a directory without a checkpoint: name a "
          "checkpoint (e.g. <model_dir>/ckpt-1000) or a directory training saved into "
          "(e.g. <model_dir>/best, written with --keep_best_checkpoint).")
  if average_last_n > 1:
    if checkpoint_path:
      raise ModelDirError("--checkpoint_path and --average_last_n exclude each "
                          "other: averaging takes the last N of --model_dir.")
    return checkpoint_paths(model_dir, average_last_n, flag="--average_last_n")
  if checkpoint_path:
    return [checkpoint_path]
  available = listed_checkpoints(model_dir)
  if not available:
    raise CheckpointError(f"{model_dir} holds no checkpoint yet: train first "
                          "or pass --checkpoint_path.")
  return available[-1:]
