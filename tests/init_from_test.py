"""Fine-tuning (--init_from): the source's weights exactly, shared pieces' rows kept
under a new vocabulary, shapes checked, and the CLI run on real text."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.trained import modeldir
from t2t_keras.errors import CheckpointError, ModelDirError
from t2t_keras.model import create_model
from t2t_keras.training import init_from
from tests import inprocess

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def test_weights_are_the_checkpoints_and_other_shapes_are_refused(tiny_model_dir):
  config = modeldir.load_model_config(tiny_model_dir)
  keras.utils.set_random_seed(5)  # other initial weights than the source's
  model = create_model(config)
  record = init_from.initialize(model, tiny_model_dir)
  saved = tf.train.latest_checkpoint(tiny_model_dir)
  assert record["checkpoint"] == saved and record["optimizer"] == "fresh"
  source = create_model(config)
  tf.train.Checkpoint(model=source).read(saved).expect_partial()
  for mine, theirs in zip(model.weights, source.weights):
    np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
  assert record["variables"] == len(model.weights)
  wider = create_model(dataclasses.replace(config, filter_size=48))
  with pytest.raises(CheckpointError, match=r"has shape \(16, 32\) there but \(16, 48\)"):
    init_from.initialize(wider, tiny_model_dir, fix="Give the source's flags.")
  with pytest.raises(ModelDirError, match="no such model directory or checkpoint"):
    init_from.checkpoint_of(os.path.join(tiny_model_dir, "nothing"))


def test_a_new_vocabulary_keeps_the_rows_of_shared_pieces(tiny_model_dir):
  """--init_from_vocab=new: a row of a piece both vocabularies hold is the source's
  row of that piece (wherever its id moved); a new piece's row is untouched."""
  from t2t_keras.data.tokens import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  config = modeldir.load_model_config(tiny_model_dir)
  old = init_from.pieces(tokenizer_lib.load_tokenizer(modeldir.vocab_path(tiny_model_dir)))
  # Control ids stay; the other pieces reversed, 10 of them replaced by new ones.
  body = old[4:][::-1]
  new = old[:4] + [f"NEW{i}" if i % 7 == 0 else p for i, p in enumerate(body)] + ["X", "Y"]
  keras.utils.set_random_seed(6)
  model = create_model(dataclasses.replace(config, vocab_size=len(new)))
  before = {w.path: w.numpy().copy() for w in model.weights}
  record = init_from.initialize(model, tiny_model_dir, old_pieces=old, new_pieces=new)
  fresh = sum(p.startswith("NEW") for p in new) + 2
  assert record["vocabulary"] == "new" and record["pieces_new"] == fresh
  assert record["pieces_kept"] == len(new) - 4 - fresh
  source = create_model(config)
  tf.train.Checkpoint(model=source).read(tf.train.latest_checkpoint(tiny_model_dir)
                                         ).expect_partial()
  sized = [(w, s) for w, s in zip(model.weights, source.weights) if w.shape != s.shape]
  assert sized, "no vocabulary-sized variable"
  index = {p: i for i, p in enumerate(old)}
  for weight, theirs in sized:
    axis = [a for a, (x, y) in enumerate(zip(weight.shape, theirs.shape)) if x != y][0]
    mine, theirs = np.moveaxis(weight.numpy(), axis, 0), np.moveaxis(theirs.numpy(), axis, 0)
    start = np.moveaxis(before[weight.path], axis, 0)
    for i, piece in enumerate(new):
      if piece in index:
        np.testing.assert_array_equal(mine[i], theirs[index[piece]])
      else:
        np.testing.assert_array_equal(mine[i], start[i])
  with pytest.raises(CheckpointError, match="same vocabulary"):
    init_from.initialize(model, tiny_model_dir, old_pieces=old, new_pieces=new,
                         optimizer=keras.optimizers.Adam())
  # A new vocabulary of the same size: the rows still follow their pieces.
  same_size = old[:4] + old[4:][::-1]
  model = create_model(config)
  record = init_from.initialize(model, tiny_model_dir, old_pieces=old, new_pieces=same_size)
  assert record["pieces_kept"] == len(old) - 4 and record["pieces_new"] == 0
  embedding = [w for w in model.weights if w.shape[0] == len(old)][0]
  theirs = [w for w in source.weights if w.path == embedding.path][0].numpy()
  np.testing.assert_array_equal(embedding.numpy()[4:], theirs[4:][::-1])
  np.testing.assert_array_equal(embedding.numpy()[:4], theirs[:4])


def test_the_optimizer_option_takes_the_checkpoints_moments_and_step(tmp_path):
  """--init_from_optimizer: Adam's moments and step are the source run's."""
  from t2t_keras.configs import ModelConfig, TrainConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel
  config = ModelConfig(vocab_size=40, hidden_size=16, filter_size=32, num_heads=2,
                       num_hidden_layers=1)
  source = Trainer(config, TrainConfig(model_dir=str(tmp_path / "a")))
  for variable in source.optimizer.variables:
    variable.assign(tf.fill(variable.shape, tf.cast(3, variable.dtype)))
  path = tf.train.Checkpoint(model=source.model, optimizer=source.optimizer).save(
      str(tmp_path / "a" / "ckpt"))
  tuned = Trainer(config, TrainConfig(model_dir=str(tmp_path / "b")))
  record = init_from.initialize(tuned.model, path, optimizer=tuned.optimizer)
  assert record["optimizer"] == "kept" and record["step"] == 3
  for mine, theirs in zip(tuned.optimizer.variables, source.optimizer.variables):
    np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def write_corpus(path, lines, source, target):
  os.makedirs(path, exist_ok=True)
  for name in ("train", "dev"):
    with open(os.path.join(path, f"{name}.en"), "w", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in source[:lines])
    with open(os.path.join(path, f"{name}.de"), "w", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in target[:lines])


def train(model_dir, data, *flags):
  """`python -m t2t_keras.train` in this process (tests/inprocess.py)."""
  args = ["--data_source=files", f"--train_src={data}/train.en",
          f"--train_tgt={data}/train.de", f"--dev_src={data}/dev.en",
          f"--dev_tgt={data}/dev.de", "--vocab_size=300", "--hidden_size=32",
          "--filter_size=64", "--num_heads=2", "--num_hidden_layers=1", "--batch_size=512",
          "--train_steps=3", "--log_every=1", "--eval_every=1000", "--eval_bleu_sentences=0",
          "--show_examples=0", "--save_checkpoint_steps=3", f"--model_dir={model_dir}",
          *flags]
  return inprocess.run("train", *args)


@pytest.mark.slow
def test_fine_tuning_from_the_command_line(shared_data, tmp_path):
  """A Multi30k run, then runs that start from it: on its vocabulary (the default), on a
  new one built from other text; a model of other shape is refused before any step,
  naming the variable and the fix; a restarted run resumes its own."""
  def lines(name):
    with open(os.path.join(shared_data, "multi30k", name), encoding="utf-8") as f:
      return [l.rstrip("\n") for l in f]
  en, de = lines("train.en"), lines("train.de")
  first, second = tmp_path / "data1", tmp_path / "data2"
  write_corpus(first, 400, en, de)
  write_corpus(second, 400, en[5000:], de[5000:])
  source = tmp_path / "source"
  result = train(source, first)
  assert result.returncode == 0, result.stderr[-3000:]

  tuned = tmp_path / "tuned"
  result = train(tuned, second, f"--init_from={source}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"initialized from {source}/ckpt-3" in result.stdout, result.stdout[-2000:]
  record = json.loads((tuned / "init_from.json").read_text())
  assert record["vocabulary"] == "source" and record["optimizer"] == "fresh"
  assert ((tuned / "vocab.model").read_bytes() == (source / "vocab.model").read_bytes())
  again = train(tuned, second, f"--init_from={source}", "--train_steps=6")
  assert again.returncode == 0 and "initialized from" not in again.stdout
  assert "resumed from" in again.stdout, again.stdout[-2000:]

  # A new vocabulary built from the new data: shared pieces keep their rows.
  result = train(tmp_path / "new_vocab", second, f"--init_from={source}",
                 "--init_from_vocab=new", "--vocab_size=280")
  assert result.returncode == 0, result.stderr[-3000:]
  record = json.loads((tmp_path / "new_vocab" / "init_from.json").read_text())
  assert record["vocabulary"] == "new" and record["pieces_kept"] > 100, record

  result = train(tmp_path / "wider", second, f"--init_from={source}", "--filter_size=48")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "Fine-tuning needs the source's model shape" in result.stderr
  assert not tf.train.latest_checkpoint(str(tmp_path / "wider"))


class FakeAgreement:
  """A worker of a multi-worker run whose chief found `chief_value` (chief_number)."""

  def __init__(self, chief, chief_value=None):
    self.chief, self.multi_worker, self.chief_value = chief, True, chief_value

  def chief_number(self, value):
    return value if self.chief else self.chief_value


def test_every_worker_starts_from_the_checkpoint_the_chief_names(tmp_path):
  """A worker builds the chief's checkpoint (ckpt-<its step>), not its own latest one; a
  chief that finds nothing stops every worker with a message."""
  (tmp_path / "ckpt-7.index").write_text("")
  with open(tmp_path / "checkpoint", "w", encoding="utf-8") as f:
    f.write('model_checkpoint_path: "ckpt-7"\nall_model_checkpoint_paths: "ckpt-7"\n')
  chief = init_from.agreed_checkpoint(str(tmp_path), FakeAgreement(True))
  assert chief == str(tmp_path / "ckpt-7")
  # The source run wrote ckpt-9 since: the worker still takes the chief's ckpt-7.
  worker = init_from.agreed_checkpoint(str(tmp_path), FakeAgreement(False, 7))
  assert worker == str(tmp_path / "ckpt-7")
  prefix = init_from.agreed_checkpoint(str(tmp_path / "ckpt-7"), FakeAgreement(False, 7))
  assert prefix == str(tmp_path / "ckpt-7")
  with pytest.raises(ModelDirError, match="the chief found no checkpoint"):
    init_from.agreed_checkpoint(str(tmp_path / "none"), FakeAgreement(False, -1))



def train_symbols(model_dir, *flags):
  """A few steps of flags/tiny.cfg (the synthetic copy task: symbol ids, no vocabulary
  file, as the README's demo), in this process."""
  return inprocess.run("train", "--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}",
                       "--train_steps=3", "--save_checkpoint_steps=3", "--eval_every=1000",
                       "--log_every=1", "--show_examples=0", "--synthetic_train_size=200",
                       "--synthetic_eval_size=20", *flags)


def symbol_model_dir(path):
  """A model directory as training on flags/tiny.cfg writes it (config.json, ckpt-7; no
  vocabulary file: the synthetic task's vocabulary is its 16 symbols and 4 reserved
  ids), with random weights."""
  from t2t_keras.configs import DataConfig, ModelConfig  # pylint: disable=import-outside-toplevel
  config = ModelConfig(vocab_size=20, hidden_size=32, filter_size=64, num_heads=4,
                       num_hidden_layers=2, layer_prepostprocess_dropout=0.0)
  modeldir.write_or_check_config(str(path), config, data=DataConfig(
      source="synthetic", synthetic_task="copy", synthetic_vocab_size=16))
  tf.train.CheckpointManager(tf.train.Checkpoint(model=create_model(config)), str(path),
                             3).save(7)
  return path


def test_a_synthetic_task_model_is_a_valid_init_from(tmp_path, tiny_model_dir):
  """A model of a symbol task (the README's demo) fine-tunes on its symbols, and with
  --init_from_vocab=new onto more symbols (rows by symbol id); a text run from it, a
  symbol run from a text model, or another number of symbols, is told why the source's
  vocabulary cannot serve and what to pass (before: "its vocabulary .../vocab.model is
  missing; copy the vocabulary..." for a model that never had one)."""
  source = symbol_model_dir(tmp_path / "source")
  tuned = tmp_path / "tuned"
  result = train_symbols(tuned, f"--init_from={source}", "--synthetic_task=reverse")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert f"initialized from {source}/ckpt-7" in result.stdout, result.stdout[-2000:]
  assert json.loads((tuned / "init_from.json").read_text())["vocabulary"] == "source"

  # --init_from_vocab=new reads the source's tokenizer as train's start_from does.
  from t2t_keras.inference import loading  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.tokens import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  old = init_from.pieces(loading.load_model_tokenizer(str(source)))
  new = init_from.pieces(tokenizer_lib.IntegerTokenizer(22))
  model = create_model(dataclasses.replace(modeldir.load_model_config(str(source)),
                                           vocab_size=22))
  record = init_from.initialize(model, str(source), old_pieces=old, new_pieces=new)
  # 16 symbols shared (same ids), 2 new ones; the 4 reserved ids keep their rows.
  assert (record["pieces_kept"], record["pieces_new"]) == (16, 2), record
  text = init_from.pieces(tokenizer_lib.load_tokenizer(modeldir.vocab_path(tiny_model_dir)))
  assert not set(old[4:]) & set(text), "a symbol matched a text piece"
  # What the refusals below offer: a text vocabulary over a symbol model's weights.
  model = create_model(dataclasses.replace(modeldir.load_model_config(str(source)),
                                           vocab_size=len(text)))
  record = init_from.initialize(model, str(source), old_pieces=old, new_pieces=text)
  assert (record["pieces_kept"], record["pieces_new"]) == (0, len(text) - 4), record

  data = tmp_path / "text"
  write_corpus(data, 3, ["a b c"] * 3, ["x y z"] * 3)
  result = inprocess.run(
      "train", "--flagfile=flags/tiny.cfg", f"--model_dir={tmp_path / 'text_run'}",
      "--data_source=files", f"--train_src={data}/train.en", f"--train_tgt={data}/train.de",
      f"--init_from={source}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "was trained on --data_source=synthetic (symbol ids" in result.stderr, \
      result.stderr[-2000:]
  assert "pass --init_from_vocab=new" in result.stderr, result.stderr[-2000:]
  result = train_symbols(tmp_path / "from_text", f"--init_from={tiny_model_dir}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "SentencePiece vocabulary), which cannot tokenize the symbol ids" in \
      result.stderr and "pass --init_from_vocab=new" in result.stderr, result.stderr[-2000:]
  result = train_symbols(tmp_path / "more", f"--init_from={source}",
                         "--synthetic_vocab_size=18")
  assert result.returncode == 1, result.stderr[-3000:]
  assert "give --synthetic_vocab_size=16, or pass --init_from_vocab=new" in result.stderr


@pytest.mark.slow
def test_fine_tuning_a_trained_synthetic_model_onto_more_symbols(trained_reverse_dir,
                                                                 tmp_path):
  """The CLI path of --init_from_vocab=new from what training wrote for a symbol task
  (before: "Vocabulary .../vocab.model does not exist; build it with
  tools/build_vocab.py")."""
  from tests.conftest import REVERSE_VOCAB  # pylint: disable=import-outside-toplevel
  tuned = tmp_path / "tuned"
  result = train_symbols(tuned, f"--init_from={trained_reverse_dir}",
                         "--init_from_vocab=new", "--hidden_size=32", "--filter_size=64",
                         "--num_heads=4", "--pre_norm=true",
                         f"--synthetic_vocab_size={REVERSE_VOCAB - 4 + 2}")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  record = json.loads((tuned / "init_from.json").read_text())
  assert (record["vocabulary"], record["pieces_kept"], record["pieces_new"]) == (
      "new", REVERSE_VOCAB - 4, 2), record
