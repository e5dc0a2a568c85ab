"""Line-aligned UTF-8 text files as the entry points read them (no TensorFlow here:
`t2t_keras.evaluate` starts without it; only remote paths such as gs:// load it)."""

from __future__ import annotations

import sys
from typing import List, Optional, Type


def decode_line(raw: bytes, number: int, what: str, path: str,
                error: Type[Exception] = ValueError) -> str:
  """One line's bytes as text, without its line end ("\\n", "\\r\\n").

  Args:
    raw: the line, with or without its line end.
    number: its 1-based line number (for the message).
    what: the flag that named the file, e.g. "--hypotheses".
    path: the file.
    error: the exception class to raise.

  Raises:
    `error`, naming the flag (`what`), the file and the line that is not UTF-8.
  """
  try:
    return raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8")
  except UnicodeDecodeError as reason:
    raise error(f"{what} {path} line {number} is not valid UTF-8 ({reason.reason} at "
                f"byte {reason.start}); fix or re-encode the file (e.g. iconv -f latin1 "
                "-t utf-8).") from None


def split_lines(data: bytes, what: str, path: str,
                error: Type[Exception] = ValueError) -> List[str]:
  """The lines of a file's bytes, without line ends (a final newline is optional).

  Raises:
    `error`, naming the flag (`what`), the file and the line that is not UTF-8.
  """
  lines = data.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  return [decode_line(line, number, what, path, error)
          for number, line in enumerate(lines, 1)]


def read_bytes(path: str, what: str, error: Type[Exception] = ValueError) -> bytes:
  """All the bytes of a local or remote (gs://, s3://, ...) file.

  Raises:
    `error`, naming the flag (`what`) and the file, when it is missing or unreadable.
  """
  if "://" in path:  # TensorFlow's file system layer, loaded only for such paths
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not tf.io.gfile.exists(path):
      raise error(f"{what} {path} does not exist.")
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  try:
    with open(path, "rb") as f:
      return f.read()
  except OSError as reason:
    raise error(f"{what} {path} cannot be read: {reason.strerror}.") from None


def read_lines(path: Optional[str], what: str,
               error: Type[Exception] = ValueError) -> List[str]:
  """The lines of a UTF-8 file (stdin when `path` is None), without line ends.

  Args:
    path: a local or remote file, or None for standard input.
    what: the flag that named the file, for messages.
    error: the exception class to raise (each command's user error).

  Raises:
    `error`: the file is missing or unreadable, or a line is not UTF-8 (naming the
      flag, the file and the line).
  """
  if path is None:
    return split_lines(sys.stdin.buffer.read(), what, "<stdin>", error)
  return split_lines(read_bytes(path, what, error), what, path, error)
