"""Loading a trained model directory for decoding, export and attention maps.

A model directory is self-contained: `config.json` (model and data settings),
`vocab.model` (a copy of the SentencePiece model training used; synthetic tasks need
none) and the `ckpt-<step>` checkpoints. It can be copied to another machine (or
bucket) and decoded or exported there without the training data.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import tensorflow as tf
from absl import logging

from t2t_keras.configs import DataConfig, ModelConfig
from t2t_keras.data import sources
from t2t_keras.data import tokenizer as tokenizer_lib
from t2t_keras.model import create_model
from t2t_keras.training import checkpoints

VOCAB_FILE = "vocab.model"


def save_vocab(tokenizer, model_dir: str) -> Optional[str]:
  """Copies the tokenizer's SentencePiece model into model_dir (if it has one)."""
  proto = getattr(tokenizer, "model_proto", None)
  if proto is None:
    return None
  path = os.path.join(model_dir, VOCAB_FILE)
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path, "rb") as f:
      if f.read() == proto:
        return path
    raise checkpoints.ModelDirError(
        f"{path} holds a different vocabulary than this run's "
        f"({tokenizer.vocab_file or 'built in memory'}): the checkpoints in {model_dir} "
        "belong to that vocabulary. Use a new --model_dir for new data.")
  tf.io.gfile.makedirs(model_dir)
  with tf.io.gfile.GFile(path + ".tmp", "wb") as f:
    f.write(proto)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
  return path


def data_config_of(model_dir: str) -> DataConfig:
  """The DataConfig recorded in model_dir/config.json."""
  saved = checkpoints.load_run_config(model_dir).get("data", {})
  fields = {f.name for f in dataclasses.fields(DataConfig)}
  return DataConfig(**{k: v for k, v in saved.items() if k in fields})


def load_tokenizer(model_dir: str, data_config: Optional[DataConfig] = None):
  """The tokenizer the model in model_dir was trained with."""
  data_config = data_config or data_config_of(model_dir)
  if data_config.source == "synthetic":
    return tokenizer_lib.IntegerTokenizer(sources.synthetic_vocab_size(data_config))
  path = os.path.join(model_dir, VOCAB_FILE)
  if not tf.io.gfile.exists(path):
    raise checkpoints.ModelDirError(
        f"{path} not found: model directories written by t2t_keras.train hold a copy of "
        "their vocabulary. Copy the vocabulary the model was trained with there.")
  return tokenizer_lib.load_tokenizer(path)


def checkpoint_paths(model_dir: str) -> list:
  """The checkpoints of model_dir, oldest first."""
  state = tf.train.get_checkpoint_state(model_dir)
  return list(state.all_model_checkpoint_paths) if state else []


@dataclasses.dataclass
class Loaded:
  """A restored model with what decoding and export need."""

  model: tf.keras.Model
  tokenizer: tf.Module
  model_config: ModelConfig
  data_config: DataConfig
  checkpoints: Sequence[str]  # the checkpoint(s) the weights come from


def load(model_dir: str, checkpoint_path: Optional[str] = None, average_last_n: int = 0,
         dtype: Optional[str] = None) -> Loaded:
  """Builds the model of model_dir and restores a checkpoint (or an average).

  Args:
    model_dir: a model directory written by training.
    checkpoint_path: a specific checkpoint (default: the latest).
    average_last_n: average the weights of the last N checkpoints in memory.
    dtype: override the compute dtype (e.g. "float32" to decode a bfloat16 model).

  Raises:
    ModelDirError / CheckpointError with what to do.
  """
  model_config = checkpoints.load_model_config(model_dir)
  if dtype:
    model_config = dataclasses.replace(model_config, dtype=dtype)
  data_config = data_config_of(model_dir)
  tokenizer = load_tokenizer(model_dir, data_config)
  model = create_model(model_config)
  available = checkpoint_paths(model_dir)
  if checkpoint_path and tf.io.gfile.isdir(checkpoint_path):
    # A directory of checkpoints (e.g. <model_dir>/best): its latest one.
    directory, checkpoint_path = checkpoint_path, tf.train.latest_checkpoint(checkpoint_path)
    if checkpoint_path is None:
      raise checkpoints.CheckpointError(
          f"--checkpoint_path={directory} is a directory without a checkpoint: name a "
          "checkpoint (e.g. <model_dir>/ckpt-1000) or a directory training saved into "
          "(e.g. <model_dir>/best, written with --keep_best_checkpoint).")
  if average_last_n > 1:
    if checkpoint_path:
      raise checkpoints.ModelDirError("--checkpoint_path and --average_last_n exclude each "
                                      "other: averaging takes the last N of --model_dir.")
    if len(available) < average_last_n:
      raise checkpoints.CheckpointError(
          f"--average_last_n={average_last_n} but {model_dir} holds {len(available)} "
          "checkpoint(s); lower it (training keeps --keep_checkpoint_max of them).")
    from t2t_keras.training import averaging  # pylint: disable=import-outside-toplevel
    used = available[-average_last_n:]
    averaging.average_into_model(model, used)
  else:
    path = checkpoint_path or (available[-1] if available else None)
    if path is None:
      raise checkpoints.CheckpointError(f"{model_dir} holds no checkpoint yet: train first "
                                        "or pass --checkpoint_path.")
    from t2t_keras.training import averaging  # pylint: disable=import-outside-toplevel
    averaging.check_matches_model(
        model, path, f"Pass a checkpoint of the model in --model_dir={model_dir} (its "
        f"checkpoints: {', '.join(os.path.basename(p) for p in available) or 'none'}), "
        "or the --model_dir that wrote this one.")
    # Optimizer slots and counters are not needed to decode: only the model is checked.
    checkpoints.restore(tf.train.Checkpoint(model=model), path, expect_partial=True)
    used = [path]
  logging.info("Loaded %s", ", ".join(used))
  return Loaded(model, tokenizer, model_config, data_config, used)


def load_ensemble(model_dirs: Sequence[str], checkpoint_path: Optional[str] = None,
                  average_last_n: int = 0, dtype: Optional[str] = None):
  """Loads one model, or several that share a vocabulary as an `ensemble.Ensemble`.

  Returns:
    (the model to decode with, the Loaded of every model directory).

  Raises:
    ModelDirError: when the models' vocabularies differ (naming both directories).
  """
  from t2t_keras.ensemble import Ensemble  # pylint: disable=import-outside-toplevel
  if len(model_dirs) > 1 and checkpoint_path:
    raise checkpoints.ModelDirError(
        "--checkpoint_path names one checkpoint but --model_dir lists "
        f"{len(model_dirs)} models: drop --checkpoint_path (each model's latest "
        "checkpoint, or --average_last_n of each, is used).")
  loaded = [load(d, checkpoint_path, average_last_n, dtype) for d in model_dirs]
  first = loaded[0]
  for model_dir, other in zip(model_dirs[1:], loaded[1:]):
    same = (getattr(first.tokenizer, "model_proto", None)
            == getattr(other.tokenizer, "model_proto", None)
            and first.tokenizer.vocab_size == other.tokenizer.vocab_size
            and first.model_config.vocab_size == other.model_config.vocab_size)
    if not same:
      raise checkpoints.ModelDirError(
          f"--model_dir {model_dir} was trained with another vocabulary than "
          f"{model_dirs[0]} ({VOCAB_FILE} or vocabulary size differ): an ensemble's "
          "models must share one vocabulary (train them with the same --vocab_file).")
  if len(loaded) == 1:
    return first.model, loaded
  return Ensemble([l.model for l in loaded]), loaded
