"""tools/ct2_translate.py decodes with the project decoder's length limits (sources cut
to --max_input_length, translations at most source length + --extra_decode_length, per
sentence): its translations are the decode command's; it says in one line what was cut,
and reads and writes gs://-style paths (ram:// here) through tf.io.gfile."""
# pylint: disable=redefined-outer-name  (pytest fixtures)

import os
import re
import subprocess
import sys

import pytest

from t2t_keras.trained import modeldir
from t2t_keras.inference import loading
from t2t_keras.export import ctranslate2 as ct2_export
from tests import inprocess
from tests.conftest import REPO_ROOT

ctranslate2 = pytest.importorskip("ctranslate2")
sentencepiece = pytest.importorskip("sentencepiece")

TOOL = os.path.join(REPO_ROOT, "tools", "ct2_translate.py")
SENTENCES = ["the man runs", "a small red dog plays with the big ball in the park " * 2,
             "", "Hund"]
LIMITS = ["--max_input_length=8", "--extra_decode_length=2", "--beam_size=2"]


@pytest.fixture(scope="module")
def ct2_dir(tiny_model_dir, tmp_path_factory):
  loaded = loading.load(tiny_model_dir, dtype="float32")
  return ct2_export.export(
      loaded.model, loaded.model_config, loaded.tokenizer,
      str(tmp_path_factory.mktemp("ct2") / "model"),
      vocab_file=modeldir.vocab_path(tiny_model_dir))


def run(*args):
  return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                        cwd=REPO_ROOT, timeout=300, check=False,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


@pytest.mark.slow
def test_limits_and_cuts_are_the_decode_commands(tiny_model_dir, ct2_dir, tmp_path):
  """Greedy (where CTranslate2's search and ours agree), the tool's translations are
  the decode command's with the same flags: sources cut to --max_input_length, each
  translation at most its source's length + --extra_decode_length; its note on cut
  sentences is decode's."""
  source = tmp_path / "in.txt"
  source.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
  limits = ["--max_input_length=8", "--extra_decode_length=2", "--beam_size=1"]
  result = run(TOOL, f"--model={ct2_dir}", f"--input_file={source}", *limits)
  assert result.returncode == 0, result.stderr[-3000:]
  decoded = inprocess.run("decode", f"--model_dir={tiny_model_dir}",
                          f"--input_file={source}", *limits)
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  ours, theirs = decoded.stdout.split("\n")[:-1], result.stdout.split("\n")[:-1]
  assert len(ours) == len(theirs) == len(SENTENCES)
  # An empty line: CTranslate2 returns no translation for an empty source, where our
  # decoder translates the source EOS alone; every other line is decode's.
  for sentence, mine, tool in zip(SENTENCES, ours, theirs):
    assert tool == (mine if sentence else ""), (sentence, theirs, ours)
  cut = ("note: 1 of 4 input sentences were longer than --max_input_length=8 subwords "
         "(EOS included) and were cut to it")
  assert cut in decoded.stderr and cut in result.stderr
  # Both limits bind here, so equal outputs say the limits are equal: a sentence was
  # cut (above), and translations stopped at their length limit.
  assert re.search(r"note: [1-4] of 4 translations reached their length limit",
                   result.stderr), result.stderr[-3000:]


RAM_SCRIPT = r"""
import os, runpy, sys
import tensorflow as tf
local, tool, *flags = sys.argv[1:]
tf.io.gfile.makedirs("ram://ct2")
for name in os.listdir(local):
  tf.io.gfile.copy(os.path.join(local, name), "ram://ct2/" + name)
with tf.io.gfile.GFile("ram://in.txt", "w") as f:
  f.write(sys.stdin.read())
sys.argv = [tool, "--model=ram://ct2", "--input_file=ram://in.txt",
            "--output_file=ram://out.txt", *flags]
try:
  runpy.run_path(tool, run_name="__main__")
except SystemExit as error:
  assert not error.code, error.code
with tf.io.gfile.GFile("ram://out.txt") as f:
  sys.stdout.write(f.read())
"""


@pytest.mark.slow
def test_gs_style_paths_go_through_gfile(ct2_dir):
  text = "".join(s + "\n" for s in SENTENCES)
  local = subprocess.run([sys.executable, TOOL, f"--model={ct2_dir}",
                          "--input_file=/dev/stdin", *LIMITS], input=text,
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                         check=False)
  assert local.returncode == 0, local.stderr[-3000:]
  remote = subprocess.run([sys.executable, "-c", RAM_SCRIPT, ct2_dir, TOOL, *LIMITS],
                          input=text, capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=300, check=False)
  assert remote.returncode == 0, remote.stderr[-3000:]
  assert remote.stdout == local.stdout and len(local.stdout.splitlines()) == 4
