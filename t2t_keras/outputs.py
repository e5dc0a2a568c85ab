"""Output files of the decode and score commands: checked before any work, written whole.

An output may not be one of the command's inputs or another of its outputs: decoding
with `--output_alignments` equal to `--output_file` would overwrite the translations,
and an `--output_file` equal to `--input_file` would destroy the input. Both are
refused before the model is loaded, as is an output whose directory does not exist
(on local disk: object stores have no directories).

Each output is written to a hidden temporary name beside it (`.<name>.tmp-<pid>`) and
renamed to its final name only when the command has finished, so a command killed
half-way leaves no half-written file under the final name (at most a hidden
temporary). Paths go through `tf.io.gfile` (local disk, gs://); on object stores a
rename is a copy, and an object only ever appears whole.

The decode command's local outputs are the exception: it appends them window by window
as it goes, and resumes them after an interruption (`inference/bulk.py`); on object
stores it writes them as described here.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

from t2t_keras.errors import InputError


def _gfile():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  (entry points import
  return tf.io.gfile  # this module before TensorFlow's logging is quieted)


def normalized(path: str) -> str:
  """A comparable form of `path`: resolved on local disk (links, `..`), slashes
  collapsed on other file systems (gs://, ram://), which os.path.realpath would turn
  into paths under the working directory."""
  if "://" in path and not path.startswith("file://"):
    return re.sub(r"(?<!:)/+", "/", path).rstrip("/")
  return os.path.realpath(path[len("file://"):] if path.startswith("file://") else path)


def same_path(a: str, b: str) -> bool:
  return normalized(a) == normalized(b)


def check_paths(outputs: Dict[str, Optional[str]], inputs: Dict[str, Optional[str]]) -> None:
  """Refuses an output that is an input or another output, or lies in no directory.

  Args:
    outputs: flag name (e.g. "--output_file") -> path, or None when not given.
    inputs: flag name -> path, or None.

  Raises:
    InputError: naming both flags and the path, and what to do.
  """
  given_outputs = [(flag, path) for flag, path in outputs.items() if path]
  for i, (flag, path) in enumerate(given_outputs):
    for other, other_path in [(f, p) for f, p in inputs.items() if p] + given_outputs[:i]:
      if same_path(path, other_path):
        kind = "input" if other in inputs else "output"
        raise InputError(f"{flag}={path} is also {other} (an {kind} of this command): "
                         f"writing it would destroy the {kind}; choose another {flag}.")
    parent = os.path.dirname(path)
    local = "://" not in path or path.startswith("file://")  # object stores: no directories
    if parent and local and not _gfile().isdir(parent):
      raise InputError(f"{flag}={path}: the directory {parent} does not exist; create it "
                       "or choose another path.")


class PendingOutputs:
  """Files opened under temporary names and renamed together by `commit`.

  Use as a context manager: leaving it without `commit` (an error) removes the
  temporaries, so nothing appears under the final names.
  """

  def __init__(self):
    self._files: List[Tuple[str, str, object]] = []  # (temporary, final, file)

  def open(self, path: str):
    """A writable text file that becomes `path` at `commit`."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    handle = _gfile().GFile(temporary, "w")
    self._files.append((temporary, path, handle))
    return handle

  def commit(self) -> None:
    """Closes every file and renames each to its final name."""
    for _, _, handle in self._files:
      handle.close()
    for temporary, final, _ in self._files:
      _gfile().rename(temporary, final, overwrite=True)
    self._files = []

  def discard(self) -> None:
    """Closes and removes the temporaries not committed."""
    for temporary, _, handle in self._files:
      handle.close()
      if _gfile().exists(temporary):
        _gfile().remove(temporary)
    self._files = []

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.discard()
