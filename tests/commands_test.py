"""Every command's main in the quick lane, along the path a user walks: train a few
steps of the tiny recipe, then decode, score, evaluate, export, average and draw that
model, each command checked against another one's output (tests/inprocess.py runs them
in this process; tests/tools_test.py and the tools' own tests start them as processes:
t2t-query-server there, against a stand-in server, and t2t-saved-model-cli, whose
flags are TensorFlow's argparse ones, only there)."""

import numpy as np
import pytest

from tests import inprocess
from tests.conftest import SessionModel

STEPS = 6
SOURCES = ["5 6 7", "4 9 9 8 12", "10"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A model directory after `python -m t2t_keras.train` ran STEPS steps of tiny.cfg."""
  model_dir = tmp_path_factory.mktemp("commands") / "run"
  result = inprocess.run("train", "--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}",
                         f"--train_steps={STEPS}", "--log_every=3", "--eval_every=6",
                         "--save_checkpoint_steps=6", "--show_examples=0")
  return model_dir, result


def test_train_command_trains_logs_evaluates_and_saves(trained):
  model_dir, result = trained
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  assert f"step 3/{STEPS}" in result.stdout and f"step {STEPS}/{STEPS}" in result.stdout
  assert f"eval at step {STEPS}" in result.stdout, result.stdout[-2000:]
  assert (model_dir / f"ckpt-{STEPS}.index").exists()
  assert (model_dir / "config.json").exists() and (model_dir / "flags.txt").exists()


@pytest.fixture(scope="module")
def decoded(trained, tmp_path_factory):
  model_dir, _ = trained
  work = tmp_path_factory.mktemp("decoded")
  source, output = work / "src.txt", work / "hyp.txt"
  source.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
  result = inprocess.run("decode", f"--model_dir={model_dir}", f"--input_file={source}",
                         f"--output_file={output}", "--beam_size=2", "--alpha=0",
                         "--extra_decode_length=3", "--return_beams")
  assert result.returncode == 0, result.stderr[-3000:]
  blocks = output.read_text(encoding="utf-8").split("\n\n")
  beams = [[line.split("\t") for line in block.splitlines()] for block in blocks if block]
  return model_dir, source, beams


def test_decode_and_score_commands_agree(decoded, tmp_path):
  """score's log probability of each best beam is the one beam search computed."""
  model_dir, source, beams = decoded
  assert len(beams) == len(SOURCES) and all(len(b) == 2 for b in beams)
  best = tmp_path / "best.txt"
  best.write_text("".join(b[0][1] + "\n" for b in beams), encoding="utf-8")
  out = tmp_path / "scores.txt"
  result = inprocess.run("score", f"--model_dir={model_dir}", f"--source_file={source}",
                         f"--target_file={best}", f"--output_file={out}", "--per_token")
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
  assert len(rows) == len(SOURCES)
  totals = [float(r[0]) for r in rows]
  # A hypothesis stopped by the length limit (input + EOS + 3) had EOS forced: beam
  # search does not count that EOS, score does (a log probability below 0).
  limits = [len(s.split()) + 1 + 3 for s in SOURCES]
  ended = [len(b[0][1].split()) + 1 < limit for b, limit in zip(beams, limits)]
  assert any(ended), beams
  for total, b, free in zip(totals, beams, ended):
    if free:
      assert total == pytest.approx(float(b[0][0]), abs=1e-3), (beams, totals)
    else:
      assert total < float(b[0][0]), (beams, totals)
  np.testing.assert_allclose(totals, [sum(map(float, r[2].split())) for r in rows],
                             atol=1e-3)


def test_evaluate_command_scores_a_copy_at_100_and_a_change_below(decoded, tmp_path):
  _, source, _ = decoded
  changed = tmp_path / "changed.txt"
  changed.write_text("5 6 7\n4 9 8\n11\n", encoding="utf-8")
  same = inprocess.run("evaluate", f"--hypotheses={source}", f"--references={source}")
  other = inprocess.run("evaluate", f"--hypotheses={changed}", f"--references={source}")
  assert same.returncode == other.returncode == 0, same.stderr + other.stderr
  assert "BLEU = 100.00" in same.stdout, same.stdout
  assert "BLEU = 100.00" not in other.stdout and "BLEU = " in other.stdout, other.stdout


def test_export_command_serves_what_decode_wrote(decoded, tmp_path):
  """The SavedModel, loaded as TF Serving loads it, translates as decode did."""
  model_dir, _, beams = decoded
  result = inprocess.run("export", f"--model_dir={model_dir}",
                         f"--export_dir={tmp_path / 'export'}", "--export_version=1",
                         "--beam_size=2", "--alpha=0", "--extra_decode_length=3",
                         "--max_request_rows=8")
  assert result.returncode == 0, result.stderr[-3000:]
  served = SessionModel(str(tmp_path / "export" / "1"))
  outputs = served.run(inputs=np.array(SOURCES, object))
  texts = [t.decode("utf-8") for t in outputs["outputs"]]
  assert texts == [b[0][1] for b in beams]
  # Without --return_beams the search stops at each row's first final beam: the ids
  # signature returns that one result, not K beams of which K - 1 may be unfinished.
  ids = served.run("translate_ids", input_ids=np.array([[5, 6, 7, 1]], np.int32))
  assert ids["output_ids"].shape[:2] == (1, 1) and ids["scores"].shape == (1, 1), ids


def test_a_bad_flag_is_named_and_exits_nonzero(trained):
  model_dir, _ = trained
  result = inprocess.run("decode", f"--model_dir={model_dir}", "--beam_size=0")
  assert result.returncode != 0
  assert "beam_size" in result.stderr, result.stderr[-2000:]


def test_average_checkpoints_tool_of_one_checkpoint_decodes_as_the_model(decoded, tmp_path):
  """t2t-average-checkpoints (its main here): the average of the last checkpoint is a
  model directory that decodes exactly as the model."""
  model_dir, source, beams = decoded
  averaged = tmp_path / "avg"
  result = inprocess.run("average_checkpoints", f"--model_dir={model_dir}",
                         f"--output_dir={averaged}", "--last_n=1")
  assert result.returncode == 0, result.stderr[-3000:]
  output = tmp_path / "hyp.txt"
  result = inprocess.run("decode", f"--model_dir={averaged}", f"--input_file={source}",
                         f"--output_file={output}", "--beam_size=2", "--alpha=0",
                         "--extra_decode_length=3")
  assert result.returncode == 0, result.stderr[-3000:]
  assert output.read_text(encoding="utf-8").splitlines() == [b[0][1] for b in beams]
  missing = inprocess.run("average_checkpoints", f"--output_dir={tmp_path / 'x'}")
  assert missing.returncode != 0 and "--model_dir" in missing.stderr, missing.stderr


def test_picture_tools_write_pngs(trained, tmp_path):
  """t2t-plot-learning-curve and t2t-visualize-attention (their mains here)."""
  model_dir, _ = trained
  curve = tmp_path / "curve.png"
  result = inprocess.run("plot_learning_curve", f"--model_dir={model_dir}",
                         f"--output={curve}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  result = inprocess.run("visualize_attention", f"--model_dir={model_dir}",
                         "--sentence=5 6 7", f"--output_dir={tmp_path / 'att'}",
                         "--beam_size=2", "--extra_decode_length=3")
  assert result.returncode == 0, result.stderr[-3000:]
  assert sorted(p.name for p in (tmp_path / "att").iterdir()) == sorted(
      f"{kind}_layer{i}.png" for kind in ("encoder", "decoder", "cross") for i in range(2))


def test_linearize_trees_tool_writes_words_and_trees(tmp_path):
  trees = tmp_path / "t.mrg"
  trees.write_text("(S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .))\n", encoding="utf-8")
  words, linear = tmp_path / "words.txt", tmp_path / "linear.txt"
  result = inprocess.run("linearize_trees", f"--trees={trees}", f"--sentences={words}",
                         f"--linearized={linear}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert words.read_text(encoding="utf-8") == "The dog barks .\n"
  assert linear.read_text(encoding="utf-8") == "(S (NP DT NN ) (VP VBZ ) . )\n"


def test_ctranslate2_export_and_tool_translate_every_line(trained, tmp_path):
  """export --format=ctranslate2, then t2t-ct2-translate (its main here) writes a line
  per input; tests/ctranslate2_export_test.py compares the translations with ours."""
  model_dir, _ = trained
  result = inprocess.run("export", f"--model_dir={model_dir}", "--format=ctranslate2",
                         f"--export_dir={tmp_path / 'ct2'}")
  assert result.returncode == 0, result.stderr[-3000:]
  source, output = tmp_path / "src.txt", tmp_path / "out.txt"
  source.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
  result = inprocess.run("ct2_translate", f"--model={tmp_path / 'ct2'}",
                         f"--input_file={source}", f"--output_file={output}",
                         "--beam_size=2", "--extra_decode_length=3")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"{len(SOURCES)}/{len(SOURCES)} sentences" in result.stderr, result.stderr
  assert len(output.read_text(encoding="utf-8").splitlines()) == len(SOURCES)


@pytest.mark.slow  # 20 s: a 2-replica run with an export (the quick lane has the rest)
def test_examples_and_export_after_training_use_the_host_copy(tmp_path, monkeypatch):
  """After a run on 2 replicas, the examples and the export read a plain copy of the
  trained weights (as on a TPU, where the training variables live on the chips), and
  the examples decode only the sentences they print (the whole dev set is decoded only
  with --dev_exact_match: README's demo checks that figure)."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  from t2t_keras.export import saved_model
  from t2t_keras.inference import decoding
  decoded, real_make = [], decoding.make_decode_fn

  def spy_make(model, *args, **kwargs):
    decode = real_make(model, *args, **kwargs)

    def spy(inputs, *more, **kw):
      decoded.append((model, int(inputs.shape[0])))
      return decode(inputs, *more, **kw)
    return spy
  monkeypatch.setattr(decoding, "make_decode_fn", spy_make)
  exported, real_translator = [], saved_model.Translator.__init__

  def spy_translator(translator, model, *args, **kwargs):
    exported.append(model)
    real_translator(translator, model, *args, **kwargs)
  monkeypatch.setattr(saved_model.Translator, "__init__", spy_translator)
  result = inprocess.run(
      "train", "--flagfile=flags/tiny.cfg", f"--model_dir={tmp_path / 'run'}",
      "--strategy=mirrored", "--num_logical_devices=2", "--train_steps=2", "--log_every=2",
      "--eval_every=2", "--save_checkpoint_steps=2", "--synthetic_eval_size=24",
      "--show_examples=3", "--export")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  assert "on 2 replica(s)" in result.stdout and "exported " in result.stdout
  assert result.stdout.count("    output:    ") == 3, result.stdout[-2000:]
  assert "dev exact match" not in result.stdout
  models = {id(model) for model, _ in decoded} | {id(model) for model in exported}
  assert len(models) == 1 and len(exported) == 1, "one host copy for examples and export"
  assert not any(isinstance(v.value, tf.distribute.DistributedValues)
                 for v in exported[0].variables)  # plain variables, not the training model's
  assert sum(n for _, n in decoded) == 3  # only the examples shown are decoded
