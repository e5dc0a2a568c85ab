"""tools/beam_translate.py: RunInference over the exported SavedModel on Beam's
DirectRunner translates each input file into the output file of its name, line for
line and in order, as the decode command does; lines decode refuses (invalid UTF-8) or
cuts (over-long) are handled as the export does and counted.

Needs Apache Beam (the beam extra): CI runs this file in its own lane (.ci/beam);
elsewhere it is skipped (tests/conftest.py, BEAM_SKIP)."""
# pylint: disable=redefined-outer-name  (pytest fixtures)

import os
import random
import re

import pytest

from tests import inprocess
from tests.conftest import BEAM_SKIP, TINY_EXPORT_DECODE, TINY_EXPORT_MAX_INPUT

beam = pytest.importorskip("apache_beam", reason=BEAM_SKIP)

from t2t_keras.inference import beam_pipeline  # noqa: E402

CORPUS_LINES = 300
# The odd file: a plain line, one not UTF-8 (latin-1), one longer than the export's
# max_input_length (24) subwords, an empty one, a CRLF one, and one longer than its
# max_string_bytes (16384: the export refuses longer strings), which decode takes whole.
ODD = [b"a man runs in the park .", b"caf\xe9 au lait , ein Mann", b"the dog " * 40,
       b"", b"ein Hund spielt\r", b"the cat sits on the red ball . " * 600]
DECODE_FLAGS = [f"--beam_size={TINY_EXPORT_DECODE['beam_size']}",
                f"--alpha={TINY_EXPORT_DECODE['alpha']}",
                f"--extra_decode_length={TINY_EXPORT_DECODE['extra_decode_length']}",
                f"--max_input_length={TINY_EXPORT_MAX_INPUT}"]


class ShuffleLines(beam.PTransform):
  """Beam's Reshuffle as a distributed runner may do it: the lines come out in another
  order (seeded). The DirectRunner's own Reshuffle keeps their order, which would hide
  a pipeline that relies on it."""

  def expand(self, pcoll):
    def shuffled(item):
      lines = list(item[1])
      random.Random(0).shuffle(lines)
      return lines
    return (pcoll | beam.Map(lambda line: (0, line)) | beam.GroupByKey()
            | beam.FlatMap(shuffled))


def counters(stderr):
  """The counters the tool printed at the end, by name."""
  return {name: int(value) for value, name in
          re.findall(r"^\s+(\d+)\s+.*\((\w+)\)$", stderr, re.MULTILINE)}


def decode(model_dir, input_file, output_file):
  """The decode command's output lines (bytes) and how many inputs it cut."""
  result = inprocess.run("decode", f"--model_dir={model_dir}", f"--input_file={input_file}",
                         f"--output_file={output_file}", *DECODE_FLAGS)
  assert result.returncode == 0, result.stderr
  cut = re.search(r"note: (\d+) of \d+ input sentences were longer", result.stderr)
  with open(output_file, "rb") as f:
    return f.read().split(b"\n")[:-1], int(cut.group(1)) if cut else 0


@pytest.mark.slow
def test_pipeline_translates_each_file_in_order_as_decode_does(
    tiny_model_dir, tiny_export, shared_data, tmp_path, monkeypatch):
  monkeypatch.setattr(beam_pipeline.beam, "Reshuffle", ShuffleLines)
  inputs, outputs = tmp_path / "in", tmp_path / "out"
  inputs.mkdir()
  with open(os.path.join(shared_data, "multi30k", "test2016.en"), "rb") as f:
    corpus = f.read().split(b"\n")[:CORPUS_LINES]
  (inputs / "multi30k.en").write_bytes(b"\n".join(corpus) + b"\n")
  (inputs / "odd.txt").write_bytes(b"\n".join(ODD))  # the last line has no newline
  (inputs / "empty.txt").write_bytes(b"")
  base, _ = tiny_export
  # Chunks of 64 lines: the 300-line file is written as 5 chunks, concatenated in order.
  result = inprocess.run("beam_translate", f"--saved_model={base}",
                         f"--input={inputs}/*", f"--output_dir={outputs}",
                         "--chunk_lines=64", "--runner=DirectRunner")
  assert result.returncode == 0, result.stderr
  assert sorted(os.listdir(outputs)) == ["empty.txt", "multi30k.en", "odd.txt"]

  # The decode command refuses the invalid line: it gets the line as the export reads it.
  fixed = tmp_path / "odd_fixed.txt"
  fixed.write_text(b"\n".join(ODD).decode("utf-8", "replace"), encoding="utf-8")
  same = total = cut = 0
  for name, source in (("multi30k.en", inputs / "multi30k.en"), ("odd.txt", fixed)):
    expected, cut_here = decode(tiny_model_dir, source, tmp_path / f"{name}.decoded")
    got = (outputs / name).read_bytes().split(b"\n")
    assert got[-1] == b"" and len(got) - 1 == len(expected), name  # line for line
    same += sum(a == b for a, b in zip(got, expected))
    total += len(expected)
    cut += cut_here
  print(f"beam pipeline == decode command on {same} of {total} lines "
        f"({100 * same / total:.2f}%)")
  assert same >= 0.99 * total
  assert (outputs / "empty.txt").read_bytes() == b""

  assert counters(result.stderr) == {
      "input_files": 3, "input_lines": CORPUS_LINES + len(ODD),
      "invalid_utf8_lines": 1, "cut_to_max_string_bytes": 1,
      "cut_to_max_input_length": cut, "translated_lines": CORPUS_LINES + len(ODD),
      "output_files": 3}
  assert cut >= 2  # the odd file's two long lines, and the corpus's longer sentences
  assert not os.path.exists(outputs / beam_pipeline.TEMPORARY_DIR)


def test_invalid_utf8_fail_names_the_file_and_line(tiny_export, tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"a man runs\ncaf\xe9\n")
  result = inprocess.run("beam_translate", f"--saved_model={tiny_export[1]}",
                         f"--input={bad}", f"--output_dir={tmp_path / 'out'}",
                         "--invalid_utf8=fail")
  assert result.returncode != 0
  assert f"{bad} line 2 is not valid UTF-8" in result.stderr


def test_bad_flags_are_refused_before_the_pipeline_runs(tiny_export, tmp_path):
  base, version = tiny_export
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  for d in "ab":
    (tmp_path / d / "x.txt").write_text("a\n", encoding="utf-8")
  cases = {
      (f"--input={tmp_path}/nothing*", f"--output_dir={tmp_path}/o"): "matches no file",
      (f"--input={tmp_path}/*/x.txt", f"--output_dir={tmp_path}/o"): "names must differ",
      (f"--input={tmp_path}/a/x.txt", f"--output_dir={tmp_path}/a"): "would overwrite",
      (f"--input={tmp_path}/a/x.txt", f"--output_dir={tmp_path}/o",
       "--saved_mdoel=x"): "--saved_mdoel: neither a flag of beam_translate",
      (f"--input={tmp_path}/a/x.txt", f"--output_dir={tmp_path}/o",
       "--max_batch_size=1000"): "the export takes at most 256 lines per request",
  }
  for args, message in cases.items():
    result = inprocess.run("beam_translate", f"--saved_model={base}", *args)
    assert result.returncode != 0 and message in result.stderr, (args, result.stderr)
  result = inprocess.run("beam_translate", f"--saved_model={tmp_path}",
                         f"--input={tmp_path}/a/x.txt", f"--output_dir={tmp_path}/o")
  assert "holds no saved_model.pb" in result.stderr
  assert beam_pipeline.resolve_export(base) == version
  assert not os.path.exists(tmp_path / "o")


def test_lines_are_split_as_decode_splits_them():
  import io  # pylint: disable=import-outside-toplevel
  for data, lines in {b"": [], b"a\n": [b"a"], b"a\r\nb": [b"a", b"b"], b"\n\n": [b"", b""],
                      b"a\nb\n": [b"a", b"b"]}.items():
    assert list(beam_pipeline.split_lines(io.BytesIO(data))) == lines, data
  text = "aé€😀".encode("utf-8")  # characters of 1, 2, 3 and 4 bytes
  for limit in range(len(text) + 1):
    cut = beam_pipeline.cut_utf8(text, limit)
    assert len(cut) <= limit and text.startswith(cut)
    cut.decode("utf-8")  # no character split
    assert len(cut) > limit - 4


def test_export_limits_size_the_batches(tiny_export):
  info = beam_pipeline.read_export(tiny_export[1])
  assert (info.max_input_length, info.vocab.endswith("vocab.model"), info.tagged) == (
      TINY_EXPORT_MAX_INPUT, True, False)
  assert info.largest_batch == min(info.max_rows, info.max_tokens // TINY_EXPORT_MAX_INPUT)
