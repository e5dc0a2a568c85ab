"""Model-directory bookkeeping: the resolved configuration and checkpoint restore.

The model directory holds `config.json` (the resolved ModelConfig and the data and
training settings), the vocabulary, TensorBoard logs and `ckpt-<step>` checkpoints of
model, optimizer and input iterator. A restart with the same command resumes; a restart
whose model shape differs is refused with the differing flags named, because restoring
would fail deep inside TensorFlow (or, worse, silently skip variables).
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf
from absl import logging

from t2t_keras.configs import ModelConfig
from t2t_keras.errors import CheckpointError, ModelDirError  # noqa: F401  (raised here)

CONFIG_FILE = "config.json"
# ModelConfig fields that change variable shapes or the computation a checkpoint encodes.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "filter_size", "num_heads",
                "num_hidden_layers", "num_encoder_layers", "num_decoder_layers", "key_size",
                "value_size", "position_embedding", "pre_norm", "shared_embeddings")


def _shape_of(config: ModelConfig) -> dict:
  shape = {name: getattr(config, name) for name in SHAPE_FIELDS}
  shape["encoder_layers"] = config.encoder_layers
  shape["decoder_layers"] = config.decoder_layers
  shape["key_size"], shape["value_size"] = config.head_key_size, config.head_value_size
  if config.position_embedding == "learned":
    shape["max_position"] = config.max_position
  del shape["num_hidden_layers"], shape["num_encoder_layers"], shape["num_decoder_layers"]
  return shape


def load_model_config(model_dir: str) -> ModelConfig:
  """The ModelConfig a model directory was trained with."""
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    raise ModelDirError(f"{path} not found: is --model_dir={model_dir} a t2t_keras model "
                        "directory (written by python -m t2t_keras.train)?")
  with tf.io.gfile.GFile(path) as f:
    try:
      saved = json.load(f)
    except json.JSONDecodeError as error:
      raise ModelDirError(f"{path} is not valid JSON ({error}); restore it from a backup "
                          "or start a new model directory.") from None
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  return ModelConfig(**{k: v for k, v in saved["model"].items() if k in fields})


def load_run_config(model_dir: str) -> dict:
  """All sections of config.json ("model", "data", "train", ...)."""
  with tf.io.gfile.GFile(os.path.join(model_dir, CONFIG_FILE)) as f:
    return json.load(f)


def write_or_check_config(model_dir: str, model_config: ModelConfig, **sections) -> None:
  """Writes config.json on the first run; on a restart refuses a different model shape.

  Args:
    model_dir: the model directory.
    model_config: the requested model.
    **sections: other dataclasses or dicts to record (data, train, ...).

  Raises:
    ModelDirError: naming every differing shape flag with both values.
  """
  path = os.path.join(model_dir, CONFIG_FILE)
  tf.io.gfile.makedirs(model_dir)
  if tf.io.gfile.exists(path):
    saved = load_model_config(model_dir)
    old, new = _shape_of(saved), _shape_of(model_config)
    diffs = [f"--{k}: saved {old[k]!r}, requested {new[k]!r}" for k in old if old[k] != new[k]]
    if diffs:
      raise ModelDirError(
          f"{model_dir} holds a model of a different shape, so its checkpoints cannot be "
          "restored: " + "; ".join(diffs) + ". Use the saved values to resume, or a new "
          "--model_dir to train a new model.")
    for key, value in dataclasses.asdict(model_config).items():
      if getattr(saved, key) != value:
        logging.warning("%s changed since the last run: %r -> %r", key,
                        getattr(saved, key), value)
  record = {"model": dataclasses.asdict(model_config)}
  for name, section in sections.items():
    record[name] = dataclasses.asdict(section) if dataclasses.is_dataclass(section) else section
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    json.dump(record, f, indent=2, sort_keys=True)
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def restore(checkpoint: tf.train.Checkpoint, path: str, expect_partial: bool = False):
  """Restores `path` into `checkpoint`, turning TensorFlow's errors into a clear one.

  Raises:
    CheckpointError: naming the checkpoint, what went wrong and what to do.
  """
  try:
    status = checkpoint.restore(path)
    if expect_partial:
      status.expect_partial()
    else:
      status.assert_existing_objects_matched()
    return status
  except (tf.errors.OpError, ValueError, AssertionError, IndexError, KeyError) as error:
    detail = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    raise CheckpointError(
        f"cannot restore checkpoint {path}: {type(error).__name__}: {detail}. The files are "
        "corrupt or truncated, or were written by a model of another shape. Delete this "
        "checkpoint (the previous one is kept alongside it) or point --model_dir / "
        "--checkpoint_path elsewhere.") from None
