"""Loading a trained model for inference: the model directory's config and vocabulary,
the model built from them, and the checkpoint (or the average of several) restored.

Sits above t2t_keras.trained.modeldir (the directory's files), t2t_keras.trained.checkpoints (which
checkpoints, restoring them) and t2t_keras.trained.averaging; decode, score, export and the
tools load models through here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import tensorflow as tf
from absl import logging

from t2t_keras.trained import averaging, checkpoints
from t2t_keras.configs import DataConfig, DecodeConfig, ModelConfig
from t2t_keras.data.sources import sources
from t2t_keras.data.tokens import tokenizer as tokenizer_lib
from t2t_keras.inference.ensemble import Ensemble
from t2t_keras.errors import ModelDirError
from t2t_keras.model import create_model
from t2t_keras.trained.modeldir import (VOCAB_FILE, data_config_of, load_model_config,
                                recipe_decode_config, recipe_weights, vocab_paths)


def load_model_tokenizer(model_dir: str, data_config: Optional[DataConfig] = None):
  """The tokenizer the model in model_dir was trained with: its vocab.model, or with
  --separate_vocabularies (config.json's data section) vocab.source.model and
  vocab.target.model joined in a `PairTokenizer`."""
  data_config = data_config or data_config_of(model_dir)
  source = sources.data_source(data_config)
  if not source.is_text:
    return tokenizer_lib.IntegerTokenizer(source.vocab_size)
  paths = vocab_paths(model_dir, data_config)
  for path in paths:
    if not tf.io.gfile.exists(path):
      raise ModelDirError(
          f"{path} not found: model directories written by t2t_keras.train hold a copy "
          "of their vocabulary. Copy the vocabulary the model was trained with there.")
  tokenizers = [tokenizer_lib.load_tokenizer(path) for path in paths]
  return tokenizers[0] if len(tokenizers) == 1 else tokenizer_lib.PairTokenizer(*tokenizers)


@dataclasses.dataclass
class Loaded:
  """A restored model with what decoding and export need."""

  model: tf.keras.Model
  tokenizer: tf.Module
  model_config: ModelConfig
  data_config: DataConfig
  checkpoints: Sequence[str]  # the checkpoint(s) the weights come from
  # The decoding settings of the model's training recipe (DecodeConfig's defaults where
  # it set none): decode with `dataclasses.replace(loaded.decode_config, ...)`.
  decode_config: DecodeConfig = DecodeConfig()


def load(model_dir: str, checkpoint_path: Optional[str] = None,
         average_last_n: Optional[int] = None, dtype: Optional[str] = None) -> Loaded:
  """Builds the model of model_dir and restores a checkpoint (or an average).

  Args:
    model_dir: a model directory written by training.
    checkpoint_path: a specific checkpoint (default: the latest).
    average_last_n: average the weights of the last N checkpoints in memory; None: as
      the model's training recipe says (its --average_last_n; with `checkpoint_path`,
      or without a recipe, none).
    dtype: override the compute dtype (e.g. "float32" to decode a bfloat16 model);
      None: the recipe's --decode_dtype, else the model's own.

  Raises:
    ModelDirError / CheckpointError with what to do.
  """
  model_config = load_model_config(model_dir)
  recipe = recipe_weights(model_dir)
  if average_last_n is None:
    average_last_n = 0 if checkpoint_path else recipe.average_last_n
  dtype = dtype or recipe.dtype
  if dtype:
    model_config = dataclasses.replace(model_config, dtype=dtype)
  data_config = data_config_of(model_dir)
  tokenizer = load_model_tokenizer(model_dir, data_config)
  model = create_model(model_config)
  used = checkpoints.choose_checkpoints(model_dir, checkpoint_path, average_last_n)
  if len(used) > 1:
    averaging.average_into_model(model, used)
  else:
    available = checkpoints.listed_checkpoints(model_dir)
    averaging.check_matches_model(
        model, used[0], f"Pass a checkpoint of the model in --model_dir={model_dir} (its "
        f"checkpoints: {', '.join(os.path.basename(p) for p in available) or 'none'}), "
        "or the --model_dir that wrote this one.")
    # Optimizer slots and counters are not needed to decode: only the model is checked.
    checkpoints.restore(tf.train.Checkpoint(model=model), used[0], expect_partial=True)
  logging.info("Loaded %s", ", ".join(used))
  return Loaded(model, tokenizer, model_config, data_config, used,
                recipe_decode_config(model_dir))


def load_ensemble(model_dirs: Sequence[str], checkpoint_path: Optional[str] = None,
                  average_last_n: Optional[int] = None, dtype: Optional[str] = None):
  """Loads one model, or several that share a vocabulary as an `ensemble.Ensemble`
  (`load`'s arguments, for each model).

  Returns:
    (the model to decode with, the Loaded of every model directory).

  Raises:
    ModelDirError: when the models' vocabularies differ (naming both directories).
  """
  if len(model_dirs) > 1 and checkpoint_path:
    raise ModelDirError(
        "--checkpoint_path names one checkpoint but --model_dir lists "
        f"{len(model_dirs)} models: drop --checkpoint_path (each model's latest "
        "checkpoint, or --average_last_n of each, is used).")
  loaded = [load(d, checkpoint_path, average_last_n, dtype) for d in model_dirs]
  first = loaded[0]
  for model_dir, other in zip(model_dirs[1:], loaded[1:]):
    same = (tokenizer_lib.tokenizer_digest(first.tokenizer)
            == tokenizer_lib.tokenizer_digest(other.tokenizer)
            and first.model_config.vocab_size == other.model_config.vocab_size
            and first.model_config.output_vocab_size == other.model_config.output_vocab_size)
    if not same:
      raise ModelDirError(
          f"--model_dir {model_dir} was trained with another vocabulary than "
          f"{model_dirs[0]} ({VOCAB_FILE} or vocabulary size differ): an ensemble's "
          "models must share one vocabulary (train them with the same --vocab_file).")
  if len(loaded) == 1:
    return first.model, loaded
  return Ensemble([l.model for l in loaded]), loaded


def on_device(model, device: str):
  """`model` (a Transformer or an `Ensemble`) with its variables on `device`: the
  model itself when they are there already, else a copy made there, each weight read
  once from `model` (through the host). Decoding on several devices
  (`Translator`, --decode_devices) gives each device such a copy, so that its steps
  read their weights from its own memory, never across devices."""
  if isinstance(model, Ensemble):
    members = [on_device(m, device) for m in model.models]
    same = all(c is m for c, m in zip(members, model.models))
    return model if same else Ensemble(members)
  where = tf.DeviceSpec.from_string(device)
  if all(_same_device(tf.DeviceSpec.from_string(v.value.device), where)
         for v in model.weights):
    return model
  with tf.device(device):
    copy = create_model(model.model_config)
    copy.set_weights(model.get_weights())
  return copy


def _same_device(spec: tf.DeviceSpec, where: tf.DeviceSpec) -> bool:
  return (spec.device_type or "").upper() == (where.device_type or "").upper() and (
      spec.device_index or 0) == (where.device_index or 0)
