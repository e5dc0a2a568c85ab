"""Fine-tuning: a new run that starts from another run's weights (`--init_from`).

`python -m t2t_keras.train ... --init_from=DIR_OR_CHECKPOINT` builds the model of
this run's flags, checks that it has the shapes of the checkpoint's model (every
difference named), and assigns the checkpoint's weights before the first step; the
optimizer starts fresh at step 0 (warm-up included), unless `--init_from_optimizer`
also takes the checkpoint's optimizer state (Adam's moments or Adafactor's factors:
the same --optimizer) and step. It applies once, to a model
directory without checkpoints: a restarted fine-tuning run resumes its own.

Vocabulary (`--init_from_vocab`):
  * `source` (default): the run trains on the checkpoint's vocabulary (its model
    directory's copy); the new data is tokenized with it. A synthetic task's model
    (the README's demo) has no vocabulary file: its vocabulary is its symbol ids, and a
    run on the same number of symbols needs nothing more.
  * `new`: the run builds or reads its own vocabulary as any run does; the embedding
    rows (and any other vocabulary-sized axis) of pieces both vocabularies hold are
    copied from the checkpoint, the others keep their fresh initialisation, as
    OpenNMT-tf's `update_vocab`. Symbols match symbols by id (a task with more symbols
    keeps the rows of those it shares); no symbol is a text piece.
With --separate_vocabularies the parent's two vocabularies are taken (source), and a
parent and a run of different vocabulary modes are refused, naming the flags.
A text model's pieces cannot tokenize symbol ids, nor symbols text: with the source's
vocabulary such a run is refused, naming --init_from_vocab=new (`check_vocabularies`).
What was done is recorded in `<model_dir>/init_from.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import List, Optional

import numpy as np
import tensorflow as tf
from absl import flags

from t2t_keras.trained import averaging, checkpoints, modeldir
from t2t_keras.configs import DataConfig
from t2t_keras.data.sources import sources
from t2t_keras.errors import CheckpointError, ModelDirError
from t2t_keras.inference import loading

RECORD_FILE = "init_from.json"
VOCAB_CHOICES = ("source", "new")


def checkpoint_of(init_from: str) -> str:
  """The checkpoint prefix `--init_from` names: a model directory's latest checkpoint
  (its `best/` is a directory too), or a checkpoint prefix itself."""
  if tf.io.gfile.exists(init_from + ".index"):
    return init_from
  if tf.io.gfile.isdir(init_from):
    latest = tf.train.latest_checkpoint(init_from)
    if latest:
      return latest
    raise ModelDirError(f"--init_from={init_from} holds no checkpoint: give a trained "
                        "model directory or a checkpoint prefix such as DIR/ckpt-1000.")
  raise ModelDirError(f"--init_from={init_from}: no such model directory or checkpoint "
                      "(a prefix such as DIR/ckpt-1000, without .index).")


def source_dir(path: str) -> str:
  """The model directory of a checkpoint prefix (`best/` checkpoints: its parent)."""
  directory = os.path.dirname(path)
  if os.path.basename(directory.rstrip("/")) == os.path.basename(
      modeldir.best_dir("x").rstrip("/")):
    directory = os.path.dirname(directory.rstrip("/"))
  return directory


def agreed_checkpoint(init_from: str, agreement) -> str:
  """`checkpoint_of(init_from)` as the chief resolves it, on every worker: a model
  directory's latest checkpoint may change while the workers look (its run still
  training), and every worker must start from the same weights."""
  path, failure = None, None
  if agreement.chief:
    try:
      path = checkpoint_of(init_from)
    except ModelDirError as error:
      failure = error
  step = path and averaging._step_of(path)  # pylint: disable=protected-access
  if agreement.chief and path and (step is None or path != os.path.join(
      os.path.dirname(path), f"{modeldir.CHECKPOINT_PREFIX}-{step}")):
    step = None  # a prefix of another name: every worker reads the one given
  shared = agreement.chief_number(-1 if failure else (step if step is not None else -2))
  if failure:
    raise failure
  if shared == -1:
    raise ModelDirError(f"--init_from={init_from}: the chief found no checkpoint there "
                        "(its output says why).")
  if shared == -2:
    return path or init_from
  directory = (init_from if not tf.io.gfile.exists(init_from + ".index")
               else os.path.dirname(init_from))
  return os.path.join(directory, f"{modeldir.CHECKPOINT_PREFIX}-{shared}")


def source_vocab(checkpoint: str, init_from: str, data_config: Optional[DataConfig] = None):
  """The vocabulary file of the run `checkpoint` belongs to (`--init_from_vocab=source`);
  with `data_config` (the source's) of --separate_vocabularies, its two files as a
  (source, target) tuple."""
  paths = modeldir.vocab_paths(source_dir(checkpoint), data_config or DataConfig())
  for path in paths:
    if not tf.io.gfile.exists(path):
      raise ModelDirError(f"--init_from={init_from}: its vocabulary {path} is missing; "
                          "copy the vocabulary that model was trained with there, or "
                          "pass --init_from_vocab=new to train on this run's own.")
  return paths[0] if len(paths) == 1 else tuple(paths)


def _symbols(config: DataConfig) -> bool:
  return not sources.SOURCE_CLASSES[config.source].is_text


def check_vocabularies(init_from: str, source: DataConfig, run: DataConfig,
                       vocab: str) -> None:
  """Refuses a run the source's vocabulary (`vocab` "source") cannot tokenize.

  Args:
    init_from: the flag's value, for messages.
    source: the DataConfig the source model was trained with (its config.json).
    run: this run's DataConfig.
    vocab: --init_from_vocab.

  Raises:
    ModelDirError: text and symbol ids on either side, or another number of symbols,
      saying what to pass.
  """
  _check_vocabulary_mode(init_from, source, run, vocab)
  if vocab != "source" or not (_symbols(source) or _symbols(run)):
    return  # text and text: the source's pieces tokenize the run's text
  new = "pass --init_from_vocab=new to train on this run's own"
  if _symbols(source) and _symbols(run):
    if source.synthetic_vocab_size != run.synthetic_vocab_size:
      raise ModelDirError(
          f"--init_from={init_from} was trained on --synthetic_vocab_size="
          f"{source.synthetic_vocab_size} symbols, this run on "
          f"{run.synthetic_vocab_size}: give --synthetic_vocab_size="
          f"{source.synthetic_vocab_size}, or {new} (the symbols both hold keep their "
          "rows).")
  elif _symbols(source):
    raise ModelDirError(
        f"--init_from={init_from} was trained on --data_source={source.source} (symbol "
        "ids, no vocabulary file), which cannot tokenize the text of --data_source="
        f"{run.source}: {new} SentencePiece vocabulary (the embedding rows start fresh; "
        f"every other weight is the source's), or train on --data_source={source.source}.")
  else:
    raise ModelDirError(
        f"--init_from={init_from} was trained on text (--data_source={source.source}, a "
        "SentencePiece vocabulary), which cannot tokenize the symbol ids of "
        f"--data_source={run.source}: {new} symbols (the embedding rows start fresh; "
        "every other weight is the source's), or train on text.")


def _check_vocabulary_mode(init_from: str, source: DataConfig, run: DataConfig,
                           vocab: str) -> None:
  """Refuses one shared vocabulary on one side and two on the other: the embeddings'
  shapes (and their meaning) differ, so the fix is a flag, said now rather than as a
  variable's shape after the data is read."""
  parent = bool(getattr(source, "separate_vocabularies", False))
  child = bool(getattr(run, "separate_vocabularies", False))
  if parent and not child:
    raise ModelDirError(
        f"--init_from={init_from} was trained with --separate_vocabularies (a source and "
        "a target vocabulary), this run with one shared vocabulary: add "
        "--separate_vocabularies --noshared_embeddings (the run takes both of its "
        "vocabularies), or start from a model of one shared vocabulary.")
  if child and not parent:
    raise ModelDirError(
        f"--init_from={init_from} was trained with one shared vocabulary, this run with "
        "--separate_vocabularies: drop --separate_vocabularies (and "
        "--target_vocab_size; the run takes the source's vocabulary), or train from "
        "scratch.")
  if parent and vocab != "source":
    # Mapping rows piece by piece would need two maps (encoder rows by source pieces,
    # decoder and softmax rows by target pieces); not written yet.
    raise ModelDirError(
        f"--init_from={init_from} uses --separate_vocabularies, which "
        f"--init_from_vocab={vocab} does not map yet: use --init_from_vocab=source (the "
        "default; the run takes both of its vocabularies), or train from scratch.")


def pieces(tokenizer) -> List[str]:
  """The pieces of a tokenizer by id: SentencePiece's, or a symbol task's ids as
  "<symbol N>" (no SentencePiece piece has that form, so none matches a symbol)."""
  proto = getattr(tokenizer, "model_proto", None)
  if proto is None:
    return [f"<symbol {i}>" for i in range(tokenizer.vocab_size)]
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  processor = spm.SentencePieceProcessor(model_proto=proto)
  return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def _vocab_axis(name, old_shape, new_shape, old_size, new_size) -> Optional[int]:
  """The vocabulary-sized axis of a variable (None: it has none): sized `old_size` in
  the checkpoint and `new_size` in the model, every other axis the same."""
  if len(old_shape) != len(new_shape):
    return None
  axes = [a for a, (o, n) in enumerate(zip(old_shape, new_shape))
          if o == old_size and n == new_size
          and all(x == y for b, (x, y) in enumerate(zip(old_shape, new_shape)) if b != a)]
  if len(axes) > 1:
    raise CheckpointError(f"variable {name} of shape {tuple(new_shape)} has more than one "
                          "axis of the vocabulary's size: cannot tell which to map; use "
                          "--init_from_vocab=source.")
  return axes[0] if axes else None


def initialize(model, init_from: str, optimizer=None, old_pieces=None, new_pieces=None,
               fix: str = "") -> dict:
  """Assigns the weights of the checkpoint `init_from` names to a built model.

  Args:
    model: the new run's built model.
    init_from: a model directory or checkpoint prefix (on several workers, the one
      `agreed_checkpoint` returns).
    optimizer: also restore the checkpoint's optimizer state and step (same shapes).
    old_pieces / new_pieces: the two vocabularies' pieces by id
      (`--init_from_vocab=new`): vocabulary-sized axes are mapped piece by piece,
      whether or not the sizes differ.
    fix: what to do when the shapes disagree, for the message.

  Returns:
    The record written to init_from.json (checkpoint, rows kept, ...).

  Raises:
    CheckpointError: another model (a variable missing, extra or of another shape, named
      with both shapes), or an unreadable checkpoint.
  """
  path = checkpoint_of(init_from)
  reader = averaging._reader(path)  # pylint: disable=protected-access
  entries = averaging._model_entries(path, reader)  # pylint: disable=protected-access
  variables = averaging._live_variables(model)  # pylint: disable=protected-access
  shapes = {name: tuple(v.shape) for name, v in variables.items()}
  record = {"checkpoint": path, "vocabulary": "source", "optimizer": "fresh"}
  remap = {}
  if old_pieces is not None and new_pieces is not None:
    index = {piece: i for i, piece in enumerate(old_pieces)}
    # Control ids (PAD, EOS, UNK, BOS) keep their roles; pieces match by their text.
    rows = [i if i < 4 else index.get(piece, -1) for i, piece in enumerate(new_pieces)]
    rows = np.array([r if r < len(old_pieces) else -1 for r in rows])
    # By axis size, not by a change of shape: two vocabularies of the same size
    # still differ in which piece each row holds.
    for name, entry in entries.items():
      if name in shapes:
        axis = _vocab_axis(name, entry.shape, shapes[name], len(old_pieces),
                           len(new_pieces))
        if axis is not None:
          remap[name] = axis
    kept = int(np.sum(rows[4:] >= 0))
    record.update(vocabulary="new", pieces_kept=kept,
                  pieces_new=len(new_pieces) - 4 - kept, source_pieces=len(old_pieces))
  checked = {name: entry for name, entry in entries.items() if name not in remap}
  averaging._check_same_variables(  # pylint: disable=protected-access
      path, checked, {n: s for n, s in shapes.items() if n not in remap},
      "the model of this run's flags", fix)
  for name, variable in variables.items():
    value = np.asarray(checkpoints.read_tensor(path, reader, entries[name].key))
    if name in remap:
      axis = remap[name]
      fresh = np.array(variable.numpy())
      old = np.moveaxis(value, axis, 0)
      new = np.moveaxis(fresh, axis, 0)  # a view: writes go to `fresh`
      found = rows >= 0
      new[found] = old[rows[found]]
      value = fresh
    variable.assign(value.astype(variable.dtype.as_numpy_dtype
                                 if hasattr(variable.dtype, "as_numpy_dtype")
                                 else tf.as_dtype(variable.dtype).as_numpy_dtype))
  if optimizer is not None:
    if record["vocabulary"] == "new":
      raise CheckpointError("--init_from_optimizer keeps the checkpoint's optimizer state, "
                            "which is per vocabulary row: it needs the same vocabulary "
                            "(--init_from_vocab=source).")
    try:
      # Optimizers' slots are matched by position: another optimizer's (Adam's moments
      # read as Adafactor's factors) fails on a shape (ValueError) if not on a name.
      tf.train.Checkpoint(model=model, optimizer=optimizer).read(
          path).assert_existing_objects_matched()
    except (AssertionError, ValueError) as error:
      raise CheckpointError(
          f"--init_from_optimizer: {path} holds no optimizer state of this run's kind "
          "(one trained with another --optimizer, or with --dtype=mixed_float16 and one "
          f"not): {str(error)[:300]}. "
          "Drop --init_from_optimizer to start with a fresh one.") from None
    record.update(optimizer="kept", step=int(optimizer.iterations.numpy()))
  record["variables"] = len(variables)
  return record


def write_record(model_dir: str, record: dict) -> None:
  with tf.io.gfile.GFile(os.path.join(model_dir, RECORD_FILE), "w") as f:
    json.dump(record, f, indent=1, sort_keys=True)


def read_record(model_dir: str) -> Optional[dict]:
  path = os.path.join(model_dir, RECORD_FILE)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def init_from_data_config(train_config, data_config, checkpoint, vocab_file_given=False):
  """--init_from with --init_from_vocab=source: the data is tokenized with the source
  run's vocabulary (its model directory's copy; on a restart, `checkpoint` None, this
  run's own copy of it when the source is gone). `vocab_file_given`: --vocab_file was
  given, which this refuses."""
  if checkpoint is not None:
    check_vocabularies(train_config.init_from, modeldir.data_config_of(source_dir(checkpoint)),
                       data_config, train_config.init_from_vocab)
  if (train_config.init_from_vocab != "source"
      or not sources.SOURCE_CLASSES[data_config.source].is_text):
    return data_config  # its own vocabulary, or symbol ids: the same as the source's
  if vocab_file_given:
    raise flags.ValidationError(
        f"--vocab_file={data_config.vocab_file} with --init_from: the run trains on the "
        "source model's vocabulary (--init_from_vocab=source, the default); drop "
        "--vocab_file, or pass --init_from_vocab=new to train on this one (shared pieces "
        "keep their embeddings).")
  if data_config.separate_vocabularies:
    return _init_from_side_vocabs(train_config, data_config, checkpoint)
  if checkpoint is None:  # a restart: as the first run of this model directory chose
    own = modeldir.data_config_of(train_config.model_dir)
    vocab = own.vocab_file
    if not vocab or not tf.io.gfile.exists(vocab):
      vocab = modeldir.vocab_path(train_config.model_dir)
    return dataclasses.replace(data_config, vocab_file=vocab, vocab_size=own.vocab_size,
                               vocab_type=own.vocab_type)
  vocab = source_vocab(checkpoint, train_config.init_from)
  source = modeldir.data_config_of(source_dir(checkpoint))
  return dataclasses.replace(data_config, vocab_file=vocab, vocab_size=source.vocab_size,
                             vocab_type=source.vocab_type)


def _init_from_side_vocabs(train_config, data_config, checkpoint):
  """`init_from_data_config` with --separate_vocabularies: both of the source run's
  vocabularies (its model directory's copies), with their sizes; on a restart this
  run's own copies of them (the source may be gone)."""
  if checkpoint is None:
    own = modeldir.data_config_of(train_config.model_dir)
    files = tuple(modeldir.vocab_paths(train_config.model_dir, own))
  else:
    own = modeldir.data_config_of(source_dir(checkpoint))
    files = source_vocab(checkpoint, train_config.init_from, own)
  return dataclasses.replace(data_config, side_vocab_files=files, vocab_size=own.vocab_size,
                             target_vocab_size=own.target_vocab_size,
                             vocab_type=own.vocab_type)


def start_from(trainer, tokenizer, train_config, checkpoint: str, chief: bool) -> None:
  """--init_from: the source checkpoint's weights (and with --init_from_optimizer its
  optimizer state) into the new run's model, recorded in init_from.json."""
  old_pieces = new_pieces = None
  if train_config.init_from_vocab == "new":
    # The source's tokenizer as its config.json says: SentencePiece or symbol ids.
    old = loading.load_model_tokenizer(source_dir(checkpoint))
    old_pieces, new_pieces = pieces(old), pieces(tokenizer)
  record = initialize(
      trainer.model, checkpoint,
      optimizer=trainer.optimizer if train_config.init_from_optimizer else None,
      old_pieces=old_pieces, new_pieces=new_pieces,
      fix="Fine-tuning needs the source's model shape: give the flags of the model "
      f"{train_config.init_from} was trained with (its config.json).")
  if chief:
    write_record(train_config.model_dir, record)
  vocab = ("the source's vocabulary" if record["vocabulary"] == "source" else
           f"a new vocabulary ({record['pieces_kept']} pieces kept, "
           f"{record['pieces_new']} new)")
  print(f"initialized from {record['checkpoint']}: {record['variables']} variables, "
        f"{vocab}, optimizer {record['optimizer']}", flush=True)
