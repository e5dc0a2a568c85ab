"""CTranslate2 export: another engine must score and translate exactly as t2t_keras.

Each configuration the flags allow (post-norm and pre-norm, sinusoidal and learned
positions, shared and separate embeddings, per-head key sizes != d_model / heads) is
exported from a tiny model and compared, independently of our decoding code where
possible:
- CTranslate2's `score_batch` log-probabilities equal our teacher-forced log-softmax
  within 1e-3 per token (EOS included);
- greedy decoding gives the same ids and scores;
- beam 4 without length penalty gives the same best hypothesis, on a trained model.
"""

import dataclasses
import os
import subprocess
import sys

import ctranslate2
import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.export import ctranslate2 as ce
from t2t_keras.inference import decoding, loading
from t2t_keras.configs import DecodeConfig, ModelConfig
from t2t_keras.data.tokens.tokenizer import IntegerTokenizer
from t2t_keras.model import create_model
from tests import inprocess
from tests.conftest import REPO_ROOT


VOCAB = 24
BASE = ModelConfig(vocab_size=VOCAB, hidden_size=32, filter_size=64, num_heads=4,
                   num_hidden_layers=2, layer_prepostprocess_dropout=0.0)
CONFIGS = {
    "paper": BASE,  # post-norm, sinusoids, shared embeddings
    "pre_norm_learned_separate": dataclasses.replace(
        BASE, pre_norm=True, position_embedding="learned", max_position=64,
        shared_embeddings=False, num_decoder_layers=1),
    "head_size_16_of_32": dataclasses.replace(BASE, key_size=16, value_size=16,
                                              norm_epsilon=1e-3),
    # Shaw et al.: K = 3, shorter than the sentences, so clipping matters
    "relative_pre_norm": dataclasses.replace(BASE, pre_norm=True,
                                             position_embedding="relative",
                                             max_relative_position=3),
}


def _sources(n=8, seed=0):
  rng = np.random.default_rng(seed)
  return [list(rng.integers(4, VOCAB, size=rng.integers(2, 9))) for _ in range(n)]


def _tokens(ids):
  return [str(int(i)) for i in ids]


def _export(model, config, path):
  ce.export(model, config, IntegerTokenizer(config.vocab_size), str(path))
  return ctranslate2.Translator(str(path), device="cpu", compute_type="float32")


def _padded(rows, end=True):
  rows = [list(r) + ([EOS_ID] if end else []) for r in rows]
  width = max(map(len, rows))
  return tf.constant([r + [PAD_ID] * (width - len(r)) for r in rows], tf.int32)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_scores_and_greedy_match_ours(tmp_path, name):
  config = CONFIGS[name]
  keras.utils.set_random_seed(3)
  model = create_model(config)
  translator = _export(model, config, tmp_path / name)
  sources = _sources()
  targets = _sources(seed=1)
  logits = model({"inputs": _padded(sources), "targets": _padded(targets)})
  log_probs = tf.nn.log_softmax(logits).numpy()
  theirs = translator.score_batch([_tokens(s) for s in sources],
                                  [_tokens(t) for t in targets])
  for row, (target, result) in enumerate(zip(targets, theirs)):
    ids = list(target) + [EOS_ID]
    ours = log_probs[row, np.arange(len(ids)), ids]
    np.testing.assert_allclose(result.log_probs, ours, atol=1e-3)

  extra = 5
  ids, scores = decoding.decode_ids(model, _padded(sources),
                                    DecodeConfig(beam_size=1, extra_decode_length=extra))
  vocab = ce.vocabulary(IntegerTokenizer(VOCAB))
  for source, row, score in zip(sources, ids.numpy()[:, 0], scores.numpy()[:, 0]):
    # Our limit: source + EOS + extra tokens, EOS forced at the last: at most
    # len + extra tokens before EOS, CTranslate2's max_decoding_length.
    (result,) = translator.translate_batch(
        [_tokens(source)], beam_size=1, length_penalty=0.0,
        max_decoding_length=len(source) + extra,
        min_decoding_length=0, return_scores=True)
    row = list(row)
    ours = row[:row.index(EOS_ID)]
    assert [vocab.index(t) for t in result.hypotheses[0]] == ours
    assert result.scores[0] == pytest.approx(float(score), abs=1e-3)


def test_unsupported_head_sizes_are_refused_naming_the_flags(tmp_path):
  config = dataclasses.replace(BASE, key_size=16, value_size=8)
  with pytest.raises(ce.ExportError, match="--key_size / --value_size"):
    ce.export(create_model(config), config, IntegerTokenizer(VOCAB), str(tmp_path))


def test_source_pointer_models_are_refused_naming_the_flag(tmp_path):
  config = dataclasses.replace(BASE, source_pointer=True)
  with pytest.raises(ce.ExportError, match="--source_pointer"):
    ce.export(create_model(config), config, IntegerTokenizer(VOCAB), str(tmp_path))


@pytest.fixture(scope="module")
def trained(trained_reverse_dir, tmp_path_factory):
  """conftest's tiny model trained on the reverse task (pre-norm BASE): peaked
  distributions, so beam search has real choices to agree on. (model, config, model
  directory, a directory to write in)."""
  loaded = loading.load(trained_reverse_dir)
  assert loaded.model_config == dataclasses.replace(BASE, pre_norm=True)
  return (loaded.model, loaded.model_config, trained_reverse_dir,
          tmp_path_factory.mktemp("ct2_trained"))


@pytest.mark.slow
def test_beam_search_matches_ours_on_a_trained_model(trained):
  model, config, _, tmp = trained
  translator = _export(model, config, tmp / "ct2")
  sources = _sources(n=32, seed=5)
  extra = 5
  ids, scores = decoding.decode_ids(model, _padded(sources),
                                    DecodeConfig(beam_size=4, alpha=0.0,
                                                 extra_decode_length=extra))
  vocab = ce.vocabulary(IntegerTokenizer(VOCAB))
  same = 0
  for source, row, score in zip(sources, ids.numpy()[:, 0], scores.numpy()[:, 0]):
    (result,) = translator.translate_batch(
        [_tokens(source)], beam_size=4, length_penalty=0.0,
        max_decoding_length=len(source) + extra, min_decoding_length=0,
        return_scores=True)
    row = list(row)
    ours = row[:row.index(EOS_ID)]
    theirs = [vocab.index(t) for t in result.hypotheses[0]]
    # CTranslate2's beam search never returns an empty hypothesis; ours may, when it
    # scores best. Then theirs is a worse one.
    if not ours:
      assert result.scores[0] < score
      continue
    assert theirs == ours
    assert result.scores[0] == pytest.approx(float(score), abs=1e-3)
    same += 1
  assert same >= 24  # a trained model rarely prefers the empty translation


@pytest.mark.slow
def test_export_command_writes_model_vocabulary_and_int8(trained, tmp_path):
  """`python -m t2t_keras.export --format=ctranslate2` on a model directory; int8
  weights translate the same as float32 on this model."""
  _, _, model_dir, _ = trained
  outputs = {}
  for quantization in ("", "int8"):
    out = tmp_path / (quantization or "float32")
    command = [f"--model_dir={model_dir}", f"--export_dir={out}", "--format=ctranslate2"]
    if quantization:  # and a named checkpoint, as for the SavedModel export
      command += [f"--quantization={quantization}",
                  f"--checkpoint_path={tf.train.latest_checkpoint(str(model_dir))}"]
    result = inprocess.run("export", *command)  # its main, in this process
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.path.exists(out / "model.bin") and "CTranslate2" in result.stdout
    translator = ctranslate2.Translator(str(out), device="cpu")
    outputs[quantization] = [r.hypotheses[0] for r in translator.translate_batch(
        [_tokens(s) for s in _sources(n=16, seed=7)], beam_size=4)]
  agree = sum(a == b for a, b in zip(outputs[""], outputs["int8"]))
  assert agree >= 12, outputs
  # tools/ct2_translate.py: a file in, one translation per line out.
  (tmp_path / "in.txt").write_text(
      "\n".join(" ".join(_tokens(s)) for s in _sources(n=16, seed=7)) + "\n")
  result = subprocess.run(
      [sys.executable, "tools/ct2_translate.py", f"--model={tmp_path / 'float32'}",
       f"--input_file={tmp_path / 'in.txt'}", f"--output_file={tmp_path / 'out.txt'}",
       "--length_penalty=1"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "16/16 sentences" in result.stderr
  written = (tmp_path / "out.txt").read_text().splitlines()
  assert written == [" ".join(h) for h in outputs[""]]


@pytest.mark.slow
def test_missing_package_and_misused_flags_get_clear_errors(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if not installed
  with pytest.raises(ce.ExportError, match=r'pip install -e "\.\[ctranslate2\]"'):
    ce.export(create_model(BASE), BASE, IntegerTokenizer(VOCAB), str(tmp_path / "a"))
  monkeypatch.undo()
  with pytest.raises(ce.ExportError, match="--quantization=int4 is not one of"):
    ce.export(create_model(BASE), BASE, IntegerTokenizer(VOCAB), str(tmp_path / "b"),
              quantization="int4")
  result = inprocess.run("export", f"--model_dir={tmp_path}", "--quantization=int8")
  assert result.returncode == 2
  assert "--quantization is for --format=ctranslate2" in result.stderr
  result = inprocess.run("export", f"--model_dir={tmp_path}", "--format=ctranslate2",
                         "--export_jit_compile")
  assert result.returncode == 2
  assert "--export_jit_compile is for --format=saved_model" in result.stderr
