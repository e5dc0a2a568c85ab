"""t2t_keras.textio: the one UTF-8 line reader of the commands (evaluate, score, decode's
resume and its streamed inputs), with errors that name the flag, the file and the line."""

import io
import re
import sys

import pytest

from t2t_keras import textio
from t2t_keras.errors import DataError, InputError
from t2t_keras.inference import bulk

BAD = b"fine\r\nstill fine\ncaf\xe9 au lait\n"
BAD_LINE = re.escape("line 3 is not valid UTF-8 (invalid continuation byte at byte 3)")


def test_a_file_and_stdin_read_the_same_lines(tmp_path, monkeypatch):
  path = tmp_path / "in.txt"
  path.write_bytes(b"one\r\ntwo\n\nlast without newline")
  lines = ["one", "two", "", "last without newline"]
  assert textio.read_lines(str(path), "--source_file", DataError) == lines
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
  assert textio.read_lines(None, "--source_file", DataError) == lines


def test_every_reader_names_the_flag_file_and_line_alike(tmp_path, monkeypatch):
  """The whole-file reader, stdin and decode's streamed reader raise one message."""
  path = tmp_path / "bad.txt"
  path.write_bytes(BAD)
  name = re.escape(str(path))
  with pytest.raises(InputError, match=f"^--hypotheses {name} {BAD_LINE}; fix or re-encode"):
    textio.read_lines(str(path), "--hypotheses", InputError)
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BAD)))
  with pytest.raises(DataError, match=f"^--input_file <stdin> {BAD_LINE}"):
    textio.read_lines(None, "--input_file", DataError)
  reader = bulk.LineReader(str(path), "--input_file")
  assert reader.read(2) == ["fine", "still fine"]
  with pytest.raises(DataError, match=f"^--input_file {name} {BAD_LINE}"):
    reader.read(1)
  reader.close()


def test_a_missing_file_names_the_flag(tmp_path):
  with pytest.raises(DataError, match="^--target_file .*nope.txt cannot be read: No such file"):
    textio.read_lines(str(tmp_path / "nope.txt"), "--target_file", DataError)
