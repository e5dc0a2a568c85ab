"""Line-aligned UTF-8 text files as the entry points read them (no TensorFlow here:
`t2t_keras.evaluate` starts without it)."""

from __future__ import annotations

from typing import List, Type


def split_lines(data: bytes, what: str, path: str,
                error: Type[Exception] = ValueError) -> List[str]:
  """The lines of a file's bytes, without line ends (a final newline is optional).

  Raises:
    `error`, naming the flag (`what`), the file and the line that is not UTF-8.
  """
  lines = data.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, 1):
    try:
      out.append(line.rstrip(b"\r").decode("utf-8"))
    except UnicodeDecodeError as reason:
      raise error(f"{what} {path} line {number} is not valid UTF-8 ({reason.reason} at "
                  f"byte {reason.start}); fix or re-encode the file (e.g. iconv -f latin1 "
                  "-t utf-8).") from None
  return out
