"""The model card of an export names the run: its model, vocabulary, training data, dev
BLEU with sacreBLEU's signature and weights; tools/saved_model_cli.py shows it."""

import dataclasses
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
import types

import pytest
import tensorflow as tf

import t2t_keras
from t2t_keras.trained import model_card, modeldir
from t2t_keras import metrics
from t2t_keras.inference import loading
from t2t_keras.configs import DataConfig, DecodeConfig, ModelConfig
from t2t_keras.export import ExportSettings
from t2t_keras.export.saved_model import export_from_settings
from t2t_keras.tools import saved_model_cli
from tests.conftest import REPO_ROOT

DECODE = DecodeConfig(beam_size=3, alpha=0.8, extra_decode_length=4)
DATA = DataConfig(source="files", train_src="corpus/train.en", train_tgt="corpus/train.de",
                  dev_src="corpus/dev.en", dev_tgt="corpus/dev.de", vocab_size=120)
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def copy_model_dir(source, destination):
  """A private copy of the shared tiny model directory (files only: other tests export
  into the original)."""
  os.makedirs(destination)
  for name in os.listdir(source):
    if os.path.isfile(os.path.join(source, name)):
      shutil.copy2(os.path.join(source, name), destination)
  return str(destination)


@pytest.fixture(scope="module")
def run_dir(tiny_model_dir, tmp_path_factory):
  """A model directory whose run trained on named files and recorded a dev BLEU."""
  path = copy_model_dir(tiny_model_dir, tmp_path_factory.mktemp("card") / "run")
  modeldir.write_or_check_config(path, modeldir.load_model_config(path), data=DATA)
  report = metrics.bleu_report(["a man runs in the park with his small dog ."],
                               [["a man runs in the park with a small dog ."]])
  assert report["bleu"] > 10
  modeldir.record_dev_bleu(path, {"bleu": report["bleu"], "step": 7,
                                  "signature": report["bleu_signature"], "sentences": 2,
                                  "dev_src": DATA.dev_src, "dev_tgt": DATA.dev_tgt})
  with open(modeldir.best_state_path(path), "w", encoding="utf-8") as f:
    json.dump({"metric": "bleu", "value": report["bleu"], "step": 7,
               "evaluations_since_best": 0}, f)
  return path


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
  before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
  path = export_from_settings(ExportSettings(
      run_dir, str(tmp_path_factory.mktemp("card_export")),
      dataclasses.replace(DECODE, max_input_length=20), version=3))
  after = datetime.datetime.now(datetime.timezone.utc)
  return path, before, after


@pytest.mark.slow
def test_the_card_of_an_export_names_the_run(run_dir, exported):
  path, before, after = exported
  assert os.path.isfile(os.path.join(path, "assets.extra", "model_card.json"))
  card = model_card.read(path)
  loaded = loading.load(run_dir)
  config = modeldir.load_run_config(run_dir)
  assert card["model"] == config["model"]
  assert card["vocab_size"] == loaded.tokenizer.vocab_size == loaded.model_config.vocab_size
  assert card["vocab_type"] == DATA.vocab_type
  assert card["parameters"] == loaded.model.count_params()
  assert card["training_data"] == {"source": "files", "train_src": DATA.train_src,
                                   "train_tgt": DATA.train_tgt, "dev_src": DATA.dev_src,
                                   "dev_tgt": DATA.dev_tgt}
  assert card["dev_bleu"] == modeldir.last_dev_bleu(run_dir)
  assert card["dev_bleu"]["signature"].startswith("nrefs:1|case:mixed|")
  assert card["best_dev"]["metric"] == "bleu" and card["best_dev"]["step"] == 7
  assert card["checkpoints"] == ["ckpt-7"] and card["step"] == 7
  assert card["t2t_keras_version"] == t2t_keras.__version__
  assert before <= datetime.datetime.fromisoformat(card["exported_at"]) <= after
  assert card["decoding"]["beam_size"] == 3 and card["decoding"]["alpha"] == 0.8
  assert card["decoding"]["max_input_length"] == 20
  # What the export's searches do, not the config's default (`attention_by_size`).
  assert card["decoding"]["attention_by_size"] is True
  assert card["model_dir"] == run_dir


def test_saved_model_cli_card_prints_the_json(exported, tmp_path, capsys):
  path = exported[0]
  out = io.StringIO()
  assert saved_model_cli.show_card(["t2t-saved-model-cli", "card", "--dir", path], out) == 0
  assert json.loads(out.getvalue()) == model_card.read(path)
  out = io.StringIO()
  assert saved_model_cli.show_card(["x", "card", f"--dir={path}"], out) == 0
  assert json.loads(out.getvalue())["step"] == 7
  # An export without a card (older, or not ours) and a missing --dir are said so.
  assert saved_model_cli.show_card(["x", "card", "--dir", str(tmp_path)], io.StringIO()) == 1
  assert "has no assets.extra/model_card.json" in capsys.readouterr().err
  assert saved_model_cli.show_card(["x", "card"], io.StringIO()) == 2


@pytest.mark.slow
def test_saved_model_cli_show_starts_with_the_card(exported):
  """The repository launcher, as a user runs it: the card, then TensorFlow's listing."""
  path = exported[0]
  card = model_card.read(path)
  show = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "saved_model_cli.py"),
                         "show", "--dir", path, "--all"], capture_output=True, text=True,
                        timeout=300, check=False, cwd=REPO_ROOT, env=ENV)
  assert show.returncode == 0, show.stderr[-2000:]
  first = show.stdout.index("Model card")
  assert first < show.stdout.index("serving_default")
  bleu = card["dev_bleu"]
  assert (f"last dev BLEU: {bleu['bleu']:.2f} at step 7 ({bleu['signature']})"
          in show.stdout)
  assert ("training data: source=files, dev_src=corpus/dev.en, dev_tgt=corpus/dev.de, "
          "train_src=corpus/train.en, train_tgt=corpus/train.de") in show.stdout
  assert f"{card['parameters']:,} parameters, vocabulary {card['vocab_size']}" in show.stdout


class _FakeModel:
  def __init__(self, config):
    self.model_config = config

  def count_params(self):
    return 1234


def fake_translator(model_dir):
  return types.SimpleNamespace(model=_FakeModel(modeldir.load_model_config(model_dir)),
                               config=DECODE, max_input_length=16, tree_constraint=None,
                               jit_compile=False)


def test_dev_bleu_of_older_runs_comes_from_the_eval_logs(tiny_model_dir, tmp_path):
  """A run trained before dev_bleu.json: the last BLEU of its TensorBoard logs, its
  signature unknown; a run that computed no BLEU: none."""
  path = copy_model_dir(tiny_model_dir, tmp_path / "old")
  translator = fake_translator(path)
  assert model_card.build(translator, path)["dev_bleu"] is None
  writer = tf.summary.create_file_writer(modeldir.logs_dir(path, "eval"))
  with writer.as_default():
    for step, bleu in ((100, 3.5), (200, 7.25)):
      tf.summary.scalar("bleu", bleu, step=step)
      tf.summary.scalar("loss", 1.0, step=step)
  writer.close()
  card = model_card.build(translator, path, ["/x/ckpt-150", "/x/ckpt-200"])
  assert card["dev_bleu"]["bleu"] == 7.25 and card["dev_bleu"]["step"] == 200
  assert card["dev_bleu"]["signature"] is None
  assert card["checkpoints"] == ["ckpt-150", "ckpt-200"] and card["step"] == 200
  assert "signature not recorded" in model_card.describe(card)


def test_a_card_without_a_model_dir_and_the_data_fields_by_source():
  translator = types.SimpleNamespace(
      model=_FakeModel(ModelConfig(vocab_size=40)), config=DECODE,
      max_input_length=16, tree_constraint=None, jit_compile=True)
  card = model_card.build(translator, None, now=datetime.datetime(2026, 1, 2, 3, 4, 5))
  assert card["training_data"] is None and card["dev_bleu"] is None
  assert card["exported_at"] == "2026-01-02T03:04:05" and card["vocab_size"] == 40
  assert card["decoding"]["jit_compile"] is True
  json.dumps(card)  # serialisable as it is
  tfds = model_card.training_data({"source": "tfds", "tfds_name": "wmt14_translate/de-en",
                                   "source_lang": "en", "target_lang": "de",
                                   "train_src": None, "synthetic_task": "copy"})
  assert tfds == {"source": "tfds", "tfds_name": "wmt14_translate/de-en",
                  "source_lang": "en", "target_lang": "de"}
  # Any other train_* setting (e.g. corpus weights) is named too.
  files = model_card.training_data({"source": "files", "train_src": "a.en,b.en",
                                    "train_tgt": "a.de,b.de", "train_weights": "1,3",
                                    "tfds_name": "ignored"})
  assert files == {"source": "files", "train_src": "a.en,b.en", "train_tgt": "a.de,b.de",
                   "train_weights": "1,3"}
