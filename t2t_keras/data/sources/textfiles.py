"""Text files as the data reads them: a fast validating scan with errors that name the
file and line, and a content fingerprint (the commands' UTF-8 lines: t2t_keras.textio).

Bad input must fail loudly before training starts, never corrupt silently: files are
checked once (line counts match, valid UTF-8) by a fast chunked scan whose result the
cache module stores, and every problem raises `DataError` naming file, line and fix.
Paths may be local or remote (gs://): everything goes through tf.io.gfile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import List, Tuple

import tensorflow as tf

from t2t_keras.errors import DataError

_CHUNK_BYTES = 16 << 20
_HASH_CHUNK_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class FileScan:
  """Result of scanning one text file.

  Attributes:
    path: the file.
    num_lines: lines as tf.data.TextLineDataset counts them.
    invalid_lines: 1-based numbers of lines that are not valid UTF-8.
  """

  path: str
  num_lines: int
  invalid_lines: Tuple[int, ...] = ()


def _invalid_utf8_error(path: str, line: int, error: UnicodeDecodeError) -> DataError:
  bad = error.object[error.start:error.start + 4]
  return DataError(
      f"{path}:{line}: invalid UTF-8 (bytes {bad!r}). Convert the file to UTF-8 "
      "(e.g. `iconv -f latin1 -t utf-8`), or set skip_invalid_utf8 "
      "(--skip_invalid_utf8) to skip and count such pairs.")


def open_binary(path: str):
  """Python's fast local reader, or tf.io.gfile for remote paths (gs://...)."""
  return tf.io.gfile.GFile(path, "rb") if "://" in path else open(path, "rb")


def check_file_exists(path: str):
  """Raises DataError naming the file and the flags to check if it is missing."""
  if not path or not tf.io.gfile.exists(path) or tf.io.gfile.isdir(path):
    # The CPU recipes read data/<corpus>/...: say how to get them.
    fetch = (" The recipes' corpora under data/ come from `python -m "
             "t2t_keras.tools.datagen` (docs/data.md)." if path and
             os.path.normpath(path).startswith("data" + os.sep) else "")
    raise DataError(f"Data file {path!r} does not exist; check the --train_src/"
                    "--train_tgt/--dev_src/--dev_tgt flags (relative paths resolve "
                    f"from the current directory, {os.getcwd()}).{fetch}")


def scan_text_file(path: str, skip_invalid_utf8: bool = False) -> FileScan:
  """Counts lines and checks UTF-8 in large chunks (hundreds of MB/s).

  Args:
    path: a text file, one sentence per line.
    skip_invalid_utf8: record invalid lines instead of raising.

  Returns:
    A FileScan.

  Raises:
    DataError: the file is missing, or has invalid UTF-8 and skipping is off.
  """
  check_file_exists(path)
  num_lines = 0
  invalid: List[int] = []
  carry = b""
  with open_binary(path) as f:
    while True:
      block = f.read(_CHUNK_BYTES)
      data = carry + block
      if not block:  # End of file: a last line without "\n" still counts.
        complete, carry = data, b""
      else:
        cut = data.rfind(b"\n") + 1
        complete, carry = data[:cut], data[cut:]
      if complete:
        try:
          complete.decode("utf-8")
        except UnicodeDecodeError as e:
          if not skip_invalid_utf8:
            line = num_lines + complete.count(b"\n", 0, e.start) + 1
            raise _invalid_utf8_error(path, line, e) from None
          for i, line_bytes in enumerate(complete.split(b"\n")):
            try:
              line_bytes.decode("utf-8")
            except UnicodeDecodeError:
              invalid.append(num_lines + i + 1)
        num_lines += complete.count(b"\n")
        if not block and not complete.endswith(b"\n"):
          num_lines += 1
      if not block:
        break
  return FileScan(path=path, num_lines=num_lines, invalid_lines=tuple(invalid))


def validate_parallel_files(src_path: str, tgt_path: str,
                            skip_invalid_utf8: bool = False) -> Tuple[FileScan, FileScan]:
  """Checks that two line-aligned files exist, are UTF-8 and have equal line counts.

  Raises:
    DataError: with both file names and counts when the files are not aligned.
  """
  src, tgt = (scan_text_file(p, skip_invalid_utf8) for p in (src_path, tgt_path))
  if src.num_lines != tgt.num_lines:
    raise DataError(
        f"Parallel files are not line-aligned: {src_path} has {src.num_lines} lines "
        f"but {tgt_path} has {tgt.num_lines}. Each line of the source file must be "
        "the translation of the same line of the target file; fix or re-export them.")
  if src.num_lines == 0:
    raise DataError(f"Parallel files {src_path} and {tgt_path} are empty; point the "
                    "flags at files with one sentence per line.")
  return src, tgt


_HASHED = {}  # (path, size, mtime) -> sha256: each file is hashed once per process


def file_fingerprint(path: str) -> dict:
  """The content identity of a file: its size and the SHA-256 of all its bytes.

  A streamed hash (about 0.5-1 GB/s locally) is cheap next to tokenizing the file, and
  unlike size, modification time and the first and last megabyte, it changes with
  any edit anywhere, and not with a `touch` or a copy. Computed once per process.
  """
  check_file_exists(path)
  stat = tf.io.gfile.stat(path)
  key = (path, stat.length, stat.mtime_nsec)
  if key not in _HASHED:
    sha = hashlib.sha256()
    with open_binary(path) as f:
      for chunk in iter(lambda: f.read(_HASH_CHUNK_BYTES), b""):
        sha.update(chunk)
    _HASHED[key] = sha.hexdigest()
  return {"size": stat.length, "sha256": _HASHED[key]}
