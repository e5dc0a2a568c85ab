"""inference.Translator, the Python API's front door: the same bytes as the decode and
score commands, and the decode command's own choices (XLA or graph mode, batches at a
time), so that a library user decodes as fast as the command."""

import dataclasses
import os

import numpy as np
import pytest

from t2t_keras.configs import DecodeConfig
from t2t_keras.inference import translator as translator_lib
from tests import inprocess


def reverse_lines(n, seed=5, longest=9):
  """`n` sentences of the reverse task's words (ids 4..23 written as numbers)."""
  rng = np.random.default_rng(seed)
  return [" ".join(str(w) for w in rng.integers(4, 24, rng.integers(1, longest + 1)))
          for _ in range(n)]


def test_translator_is_the_inference_packages_front_door():
  """`from t2t_keras.inference import Translator` is the class of translator.py."""
  from t2t_keras.inference import Translator  # pylint: disable=import-outside-toplevel
  assert Translator is translator_lib.Translator


@pytest.mark.slow
def test_translator_translates_and_scores_as_the_commands(trained_reverse_dir, tmp_path):
  """`Translator.load(...).translate(lines)` writes the decode command's bytes, and
  `.score(pairs)` the score command's numbers, for the same settings: here sources
  cut to 6 pieces (--max_input_length), which some of the lines are longer than."""
  lines = reverse_lines(12)
  assert max(len(line.split()) for line in lines) + 1 > 6  # some are cut
  source = tmp_path / "in.txt"
  source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  translator = translator_lib.Translator.load(trained_reverse_dir,
                                              DecodeConfig(max_input_length=6))
  translations = translator.translate(lines)

  decoded = inprocess.run("decode", f"--model_dir={trained_reverse_dir}",
                          f"--input_file={source}", f"--output_file={tmp_path / 'out.txt'}",
                          "--max_input_length=6")
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  assert (tmp_path / "out.txt").read_bytes() == "".join(
      t + "\n" for t in translations).encode("utf-8")

  targets = [" ".join(reversed(line.split())) for line in lines]  # the right answers
  (tmp_path / "tgt.txt").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
  scored = translator.score(list(zip(lines, targets)))
  command = inprocess.run("score", f"--model_dir={trained_reverse_dir}",
                          f"--source_file={source}", f"--target_file={tmp_path / 'tgt.txt'}",
                          "--max_input_length=6", "--per_token")
  assert command.returncode == 0, command.stderr[-3000:]
  assert command.stdout.splitlines() == [
      f"{r.total:.4f}\t{len(r.log_probs)}\t" + " ".join(f"{v:.4f}" for v in r.log_probs)
      for r in scored]
  # A source over --max_input_length scores as its first 5 pieces and EOS
  long = next(i for i, line in enumerate(lines) if len(line.split()) > 5)
  cut = " ".join(lines[long].split()[:5])
  # (alone, not in a batch of 12: the same up to float rounding)
  assert translator.score([(cut, targets[long])])[0].total == pytest.approx(
      scored[long].total, abs=1e-3)


@pytest.mark.slow
def test_translator_makes_the_decode_commands_choices(trained_reverse_dir, tmp_path,
                                                      monkeypatch):
  """For the same settings the Translator chooses as the decode command: XLA for
  greedy search from AUTO_XLA_SENTENCES sentences on (lowered to 8 here), graph mode
  for beam search or fewer sentences, unless told; batches at a time one per core (at
  most AUTO_PARALLEL_BATCHES_MAX), capped at the input's batches. Given no count of
  sentences at load, it chooses XLA or graph mode for each call's lines."""
  many = 8
  monkeypatch.setattr(translator_lib, "AUTO_XLA_SENTENCES", many)
  lines = reverse_lines(many, seed=6)
  source = tmp_path / "in.txt"
  source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  decoded = inprocess.run("decode", f"--model_dir={trained_reverse_dir}",
                          f"--input_file={source}", "--beam_size=1", "--decode_batch_size=2")
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  command_line = next(x for x in decoded.stderr.splitlines() if x.startswith("decoding "))

  greedy = DecodeConfig(beam_size=1, batch_size=2)
  translator = translator_lib.Translator.load(trained_reverse_dir, greedy, sentences=many)
  cores = len(os.sched_getaffinity(0))
  assert translator.decode_config.jit_compile
  assert translator.decode_config.parallel_batches == min(
      cores, translator_lib.AUTO_PARALLEL_BATCHES_MAX, many // 2)
  assert translator.describe(many) == command_line
  assert translator.translate(lines) == decoded.stdout.splitlines()

  per_call = translator_lib.Translator.load(trained_reverse_dir, greedy)
  assert per_call.config_for(many).jit_compile and not per_call.config_for(many - 1).jit_compile
  assert per_call.translate(lines) == decoded.stdout.splitlines()
  beams = translator_lib.Translator.load(trained_reverse_dir,
                                         dataclasses.replace(greedy, beam_size=4),
                                         sentences=many)
  assert not beams.decode_config.jit_compile
  told = translator_lib.Translator.load(trained_reverse_dir, greedy, sentences=many, xla=False)
  assert not told.decode_config.jit_compile and told.xla_given
