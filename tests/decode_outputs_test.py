"""decode and score check every flag before any work, refuse an output that is an input
or another output, write outputs whole (temporary name, renamed at the end) and say in
one line how many inputs --max_input_length cut."""

import os
import uuid

import pytest
import tensorflow as tf

from t2t_keras import errors, outputs
from tests import inprocess

LONG = "a small red dog plays with the big ball in the park " * 3


def run(module, *args):
  """`python -m t2t_keras.<command> ARGS`, the command's main in this process
  (tests/inprocess.py): these tests check messages, exit codes and files."""
  return inprocess.run(module.split(".")[-1], *args)


@pytest.fixture
def files(tmp_path):
  source = tmp_path / "src.txt"
  source.write_text(f"the man runs\n{LONG}\n", encoding="utf-8")
  return tmp_path, source


def assert_refused_before_work(result, message):
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and message in last, result.stderr[-3000:]
  assert "decoding " not in result.stderr and "scoring " not in result.stderr, \
      "work was done before the flag was checked"


@pytest.mark.parametrize("flag, message", [
    ("--alignment_layer=5", "--alignment_layer=5 but the model has 2 decoder layers"),
    ("--alignment_head=9", "--alignment_head=9 but the model has 2 heads"),
])
def test_alignment_flags_are_checked_before_decoding(tiny_model_dir, files, flag, message):
  tmp_path, source = files
  result = run("t2t_keras.decode", f"--model_dir={tiny_model_dir}", f"--input_file={source}",
               f"--output_file={tmp_path / 'out.txt'}",
               f"--output_alignments={tmp_path / 'align.txt'}", flag)
  assert_refused_before_work(result, message)
  assert sorted(os.listdir(tmp_path)) == ["src.txt"]


@pytest.mark.parametrize("command, flags_, message", [
    ("decode", ["--output_file={o}", "--output_alignments={o}"],
     "--output_alignments={o} is also --output_file (an output of this command)"),
    ("decode", ["--output_file={s}"], "--output_file={s} is also --input_file (an input"),
    ("decode", ["--output_alignments={s}"], "--output_alignments={s} is also --input_file"),
    ("decode", ["--output_file={o}", "--reference_file={o}"],
     "--output_file={o} is also --reference_file"),
    ("score", ["--output_file={s}"], "--output_file={s} is also --source_file"),
    ("score", ["--output_file={t}/./out.txt"], "is also --target_file"),
    ("decode", ["--output_file={t}/missing/out.txt"], "the directory {t}/missing does not "
     "exist"),
])
def test_an_output_that_is_an_input_or_another_output_is_refused(tiny_model_dir, files,
                                                                 command, flags_, message):
  tmp_path, source = files
  names = dict(o=tmp_path / "out.txt", s=source, t=tmp_path)
  if command == "score" and "{t}/./out.txt" in flags_[0]:
    (tmp_path / "out.txt").write_text("the man runs\nein Mann\n", encoding="utf-8")
    inputs = [f"--source_file={source}", f"--target_file={tmp_path / 'out.txt'}"]
  elif command == "score":
    inputs = [f"--source_file={source}", f"--target_file={source}"]
  else:
    inputs = [f"--input_file={source}"]
  before = {p: p.read_bytes() for p in tmp_path.iterdir()}
  result = run(f"t2t_keras.{command}", f"--model_dir={tiny_model_dir}", *inputs,
               *[f.format(**names) for f in flags_])
  assert_refused_before_work(result, message.format(**names))
  assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written


def test_outputs_are_whole_and_truncation_is_reported(tiny_model_dir, files):
  tmp_path, source = files
  result = run("t2t_keras.decode", f"--model_dir={tiny_model_dir}", f"--input_file={source}",
               f"--output_file={tmp_path / 'out.txt'}", "--beam_size=1",
               "--extra_decode_length=2", f"--output_alignments={tmp_path / 'align.txt'}",
               "--max_input_length=8")
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("note: 1 of 2 input sentences were longer than --max_input_length=8 subwords "
          "(EOS included) and were cut to it; raise --max_input_length to translate them "
          "whole.") in result.stderr
  assert sorted(os.listdir(tmp_path)) == ["align.txt", "out.txt", "src.txt"]  # no temporary
  assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 2
  assert len((tmp_path / "align.txt").read_text(encoding="utf-8").splitlines()) == 2
  result = run("t2t_keras.score", f"--model_dir={tiny_model_dir}", f"--source_file={source}",
               f"--target_file={source}", f"--output_file={tmp_path / 'scores.txt'}",
               "--max_input_length=8")
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("note: 1 of 2 sources were longer than --max_input_length=8 subwords (EOS "
          "included) and were cut to it; raise --max_input_length to score them whole."
          ) in result.stderr
  result = run("t2t_keras.score", f"--model_dir={tiny_model_dir}", f"--source_file={source}",
               f"--target_file={source}")
  assert result.returncode == 0 and "note:" not in result.stderr, result.stderr[-3000:]


def test_target_prefix_file_starts_each_translation_and_must_be_line_aligned(
    tiny_model_dir, files):
  """decode --target_prefix_file: each line's translation starts with its prefix (an
  empty line decodes freely, as without the flag); a file of another length is refused
  before any work, naming both files."""
  tmp_path, source = files
  prefixes = tmp_path / "prefix.txt"
  prefixes.write_text("\nein kleiner roter Hund\n", encoding="utf-8")
  common = ("t2t_keras.decode", f"--model_dir={tiny_model_dir}", f"--input_file={source}",
            "--extra_decode_length=3")
  result = run(*common, f"--output_file={tmp_path / 'out.txt'}",
               f"--target_prefix_file={prefixes}")
  assert result.returncode == 0, result.stderr[-3000:]
  free = run(*common, f"--output_file={tmp_path / 'free.txt'}")
  assert free.returncode == 0, free.stderr[-3000:]
  out = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
  assert out[1].startswith("ein kleiner roter Hund"), out
  assert out[0] == (tmp_path / "free.txt").read_text(encoding="utf-8").splitlines()[0]
  prefixes.write_text("one line\n", encoding="utf-8")
  result = run(*common, f"--output_file={tmp_path / 'refused.txt'}",
               f"--target_prefix_file={prefixes}")
  assert_refused_before_work(result, f"--target_prefix_file {prefixes} has 1 lines but "
                             f"--input_file {source} has 2: they must be line-aligned.")
  assert not (tmp_path / "refused.txt").exists()


@pytest.mark.parametrize("where", ["local", "ram"])
def test_an_interrupted_command_leaves_no_file_under_the_final_name(tmp_path, where):
  if where == "local":
    directory = str(tmp_path)
  else:  # an empty directory of its own: ram:// is one filesystem for the whole process
    directory = f"ram://outputs_test_{uuid.uuid4().hex}"
    tf.io.gfile.makedirs(directory)
  assert tf.io.gfile.listdir(directory) == []
  final = os.path.join(directory, "out.txt")
  with pytest.raises(KeyboardInterrupt):
    with outputs.PendingOutputs() as pending:
      pending.open(final).write("half of the translations\n")
      raise KeyboardInterrupt  # killed before the end
  assert not tf.io.gfile.exists(final)
  assert tf.io.gfile.listdir(directory) == []  # the temporary is gone too
  with outputs.PendingOutputs() as pending:
    pending.open(final).write("all of them\n")
    assert not tf.io.gfile.exists(final)  # nothing under the final name until the end
    pending.commit()
  with tf.io.gfile.GFile(final) as f:
    assert f.read() == "all of them\n"
  with pytest.raises(errors.InputError, match="is also --input_file"):
    outputs.check_paths({"--output_file": final + "/"}, {"--input_file": final})
