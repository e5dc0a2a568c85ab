"""End-to-end runs of the decode CLI and the attention-map tool on a model directory."""

import pytest
import os
import subprocess
import sys

import numpy as np

from t2t_keras.inference import attention_maps, loading
from t2t_keras.configs import DecodeConfig
from tests import inprocess, reported_scores
from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def run(*args, stdin=None):
  return subprocess.run([sys.executable, *args], input=stdin, capture_output=True,
                        text=True, cwd=REPO_ROOT, env=ENV, timeout=600, check=False)


def decode(*args, stdin=None):
  """The decode command in this process (tests/inprocess.py); the console-script test
  below runs it as a process."""
  return inprocess.run("decode", *args, stdin=stdin)


@pytest.mark.slow
def test_decode_cli_keeps_input_order_and_scores(tiny_model_dir, tmp_path):
  sentences = ["the man runs", "", "a small red dog plays with the big ball in the park",
               "Hund", "ein Mann läuft über der street"]
  source = tmp_path / "src.txt"
  source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
  output = tmp_path / "out.txt"
  result = decode(f"--model_dir={tiny_model_dir}", f"--input_file={source}",
                  f"--output_file={output}", "--beam_size=2", "--extra_decode_length=3",
                  "--decode_batch_size=2", f"--reference_file={source}")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = output.read_text(encoding="utf-8").split("\n")[:-1]
  assert len(lines) == len(sentences)
  assert "decoded 5/5 sentences" in result.stderr and "sentences/s" in result.stderr
  # The scores of the output file against the reference (here the sources), as
  # sacreBLEU computes them.
  assert reported_scores.printed(result.stderr) == reported_scores.recomputed(
      lines, sentences), (lines, result.stderr[-2000:])
  # (XLA decoding through the command: decoding_test's command test.)
  # A line equals decoding that sentence alone through stdin (the empty one and the
  # longest: both were batched with others above).
  for sentence, line in list(zip(sentences, lines))[1:3]:
    alone = decode(f"--model_dir={tiny_model_dir}", "--beam_size=2",
                   "--extra_decode_length=3", stdin=sentence + "\n")
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert alone.stdout == line + "\n"


def test_decode_cli_errors_are_clear(tiny_model_dir, tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine\n\xff\xfe broken\n")
  result = decode(f"--model_dir={tiny_model_dir}", f"--input_file={bad}")
  assert result.returncode == 1
  assert f"{bad} line 2 is not valid UTF-8" in result.stderr
  assert "Traceback" not in result.stderr
  result = decode(f"--model_dir={tmp_path}", f"--input_file={bad}")
  assert result.returncode == 1 and "config.json not found" in result.stderr
  good = tmp_path / "good.txt"
  good.write_text("the man runs\n")
  result = decode(f"--model_dir={tiny_model_dir}", "--average_last_n=3",
                  f"--input_file={good}")
  assert result.returncode == 1 and "holds 1 checkpoint" in result.stderr
  result = decode(f"--model_dir={tiny_model_dir}", "--constrain_trees",
                  f"--input_file={good}")
  assert result.returncode == 1 and "--constrain_trees" in result.stderr
  assert "needs a parsing model" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_attention_maps_are_distributions_and_pictures(tiny_model_dir, tmp_path):
  loaded = loading.load(tiny_model_dir)
  maps = attention_maps.attention_maps(loaded.model, loaded.tokenizer, "the man runs",
                                       DecodeConfig(beam_size=2, extra_decode_length=3))
  s, t = len(maps.source_tokens), len(maps.target_tokens)
  assert len(maps.encoder) == len(maps.decoder) == len(maps.cross) == 2
  assert maps.encoder[0].shape == (2, s, s) and maps.cross[1].shape == (2, t, s)
  for probs in maps.encoder + maps.decoder + maps.cross:
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-4)
  assert np.allclose(np.triu(maps.decoder[0][0], 1), 0.0)  # causal
  result = run(os.path.join("tools", "visualize_attention.py"),
               f"--model_dir={tiny_model_dir}", "--sentence=the man runs",
               f"--output_dir={tmp_path / 'png'}", "--beam_size=2",
               "--extra_decode_length=3")
  assert result.returncode == 0, result.stderr[-3000:]
  names = sorted(os.listdir(tmp_path / "png"))
  assert names == sorted(f"{k}_layer{i}.png" for k in ("encoder", "decoder", "cross")
                         for i in range(2))
  with open(tmp_path / "png" / "cross_layer1.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_console_scripts_run_the_entry_points(tiny_model_dir, tmp_path):
  """`pip install` puts t2t-train, t2t-decode, ... beside the interpreter; each runs the
  same code as `python -m t2t_keras.X` (here: a dry run, and decoding one file both ways)."""
  bin_dir = os.path.dirname(sys.executable)
  for name in ("train", "decode", "export", "evaluate", "score"):
    assert os.access(os.path.join(bin_dir, f"t2t-{name}"), os.X_OK), (
        f"t2t-{name} is not installed beside {sys.executable}: `pip install -e .` again")
  dry = subprocess.run([os.path.join(bin_dir, "t2t-train"), "--flagfile=flags/tiny.cfg",
                        "--dry_run"], capture_output=True, text=True, cwd=REPO_ROOT,
                       env=ENV, timeout=600, check=False)
  assert dry.returncode == 0, dry.stderr[-3000:]
  assert dry.stdout.splitlines()[-1].startswith("parameters: ")
  source = tmp_path / "src.txt"
  source.write_text("the man runs\na small dog\n", encoding="utf-8")
  outputs = []
  for command in ([os.path.join(bin_dir, "t2t-decode")], [sys.executable, "-m",
                                                           "t2t_keras.decode"]):
    output = tmp_path / f"out{len(outputs)}.txt"
    result = subprocess.run([*command, f"--model_dir={tiny_model_dir}",
                             f"--input_file={source}", f"--output_file={output}",
                             "--beam_size=2", "--extra_decode_length=3"],
                            capture_output=True, text=True, cwd=REPO_ROOT, env=ENV,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(output.read_text(encoding="utf-8"))
  assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == 2


def test_beam_translate_without_apache_beam_says_how_to_install_it(monkeypatch, tmp_path):
  # README's install has no Apache Beam (the beam extra): the tool says how to get it,
  # and --help works without it (tests/packaging_test.py). Beam is hidden here, so that
  # the lane with the extra (.ci/beam) sees the same.
  monkeypatch.setitem(sys.modules, "apache_beam", None)
  monkeypatch.delitem(sys.modules, "t2t_keras.inference.beam_pipeline", raising=False)
  result = inprocess.run("beam_translate", f"--saved_model={tmp_path}",
                         f"--input={tmp_path}/*", f"--output_dir={tmp_path}/out")
  assert result.returncode == 1
  assert 'needs Apache Beam: pip install -e ".[beam]"' in result.stderr
  result = inprocess.run("beam_translate", f"--input={tmp_path}/*")
  assert result.returncode == 1 and "--saved_model is required" in result.stderr
