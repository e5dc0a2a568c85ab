"""The model directory: its layout, config.json, flags.txt, the batch plan's key, the
vocabulary.

Training writes one self-contained directory per model, and every command that uses a
model reads it back: decode, score, export, the tools that average checkpoints, draw
learning curves and visualise attention. This module is the one place that knows what
the directory holds, so that a new file (or a renamed one) is one edit:

  config.json          the resolved ModelConfig and the data, training and decoding
                       settings (`write_or_check_config`, `load_model_config`), and
                       the decoding flags the recipe set, which decode, score, export
                       and `loading.load` default to (`recipe_decoding_of`)
  flags.txt            the flags of every run, as a recipe (`append_flags`)
  data_plan.json       what the batch plan depends on, checked at a restart
                       (`plan_key`, `check_plan`)
  vocab.model          a copy of the SentencePiece model training used; synthetic
                       tasks need none (`save_vocab`, `loading.load_model_tokenizer`)
  vocab.source.model, vocab.target.model
                       instead, the two models of --separate_vocabularies (config.json's
                       data section says which a directory holds: `vocab_paths`)
  ckpt-<step>.*        checkpoints of model, optimizer and dropout seeds, listed in
                       `checkpoint` (`checkpoint_paths`, `choose_checkpoints`)
  train/, eval/        TensorBoard logs (`logs_dir`)
  best/, best_eval.json  the best checkpoint by dev BLEU or loss and its record
  dev_bleu.json        the last dev BLEU with sacreBLEU's signature (`record_dev_bleu`),
                       for the model card of an export
  .worker-<i>/         scratch checkpoints of the non-chief workers (deleted once written)
  export/, ctranslate2/  default export directories

Every file goes through tf.io.gfile (the directory may be on gs://) and is written
under a unique temporary name, then renamed over the final one, so that a reader never
sees half a file; in multi-worker runs only the chief writes here.

A model directory can be copied to another machine (or bucket) and decoded or exported
there without the training data. A restart whose model shape differs is refused with
the differing flags named, because restoring would fail deep inside TensorFlow (or,
worse, silently skip variables).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import tempfile
import time
import uuid
from typing import List, Optional

import tensorflow as tf
from absl import logging

from t2t_keras.configs import (DataConfig, DecodeConfig, ModelConfig, TrainConfig,
                               WeightsConfig, flag_name)
from t2t_keras.errors import ModelDirError

CONFIG_FILE = "config.json"
FLAGS_FILE = "flags.txt"
PLAN_FILE = "data_plan.json"
VOCAB_FILE = "vocab.model"
SIDE_VOCAB_FILES = ("vocab.source.model", "vocab.target.model")  # separate vocabularies
VOCAB_PATTERNS = ("*.model", "*.vocab")  # SentencePiece files copied with a model
CHECKPOINT_PREFIX = "ckpt"
BEST_DIR = "best"
BEST_STATE_FILE = "best_eval.json"
DEV_BLEU_FILE = "dev_bleu.json"
EXPORT_DIR = "export"
CTRANSLATE2_DIR = "ctranslate2"
# ModelConfig fields that change variable shapes or the computation a checkpoint encodes.
SHAPE_FIELDS = ("vocab_size", "target_vocab_size", "hidden_size", "filter_size", "num_heads",
                "num_hidden_layers", "num_encoder_layers", "num_decoder_layers", "key_size",
                "value_size", "position_embedding", "pre_norm", "shared_embeddings",
                "shared_decoder_embeddings", "source_pointer")


# ---------------------------------------------------------------- layout
def flags_path(model_dir: str) -> str:
  return os.path.join(model_dir, FLAGS_FILE)


def vocab_path(model_dir: str) -> str:
  return os.path.join(model_dir, VOCAB_FILE)


def vocab_paths(model_dir: str, data_config: Optional[DataConfig] = None) -> List[str]:
  """The vocabulary files of a model directory: [vocab.model], or with
  --separate_vocabularies [vocab.source.model, vocab.target.model]. Directories written
  before the flag existed have no such setting in config.json: one shared vocabulary."""
  data_config = data_config or data_config_of(model_dir)
  if getattr(data_config, "separate_vocabularies", False):
    return [os.path.join(model_dir, name) for name in SIDE_VOCAB_FILES]
  return [vocab_path(model_dir)]


def logs_dir(model_dir: str, split: str) -> str:
  """TensorBoard logs of "train" or "eval"."""
  return os.path.join(model_dir, split)


def best_dir(model_dir: str) -> str:
  return os.path.join(model_dir, BEST_DIR)


def best_state_path(model_dir: str) -> str:
  return os.path.join(model_dir, BEST_STATE_FILE)


def _read_json(path: str) -> Optional[dict]:
  """A small JSON record, or None when it is missing or unreadable (it only informs)."""
  if not tf.io.gfile.exists(path):
    return None
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, tf.errors.OpError, UnicodeDecodeError) as error:
    logging.warning("cannot read %s (%s); going on without it", path, error)
    return None


def best_eval(model_dir: str) -> Optional[dict]:
  """The record of the best checkpoint (best_eval.json), or None."""
  return _read_json(best_state_path(model_dir))


def record_dev_bleu(model_dir: str, record: dict) -> None:
  """Replaces the record of the last dev BLEU (the chief's eval hook writes it)."""
  _write_atomic(os.path.join(model_dir, DEV_BLEU_FILE),
                json.dumps(record, indent=2, sort_keys=True))


def last_dev_bleu(model_dir: str) -> Optional[dict]:
  """The last dev BLEU recorded by `record_dev_bleu` (bleu, step, signature, ...), or None."""
  return _read_json(os.path.join(model_dir, DEV_BLEU_FILE))


def worker_scratch_dir(worker_id: int) -> str:
  """A new local directory where a non-chief worker saves its share of each checkpoint.

  Every worker of a MultiWorkerMirroredStrategy run takes part in saving, and only the
  chief's files are kept: TensorFlow's guide to custom training loops with that
  strategy ("Custom training loop with Keras and MultiWorkerMirroredStrategy", its
  `write_filepath` and `_get_temp_dir`) has each other worker save to a directory of its
  own and `tf.io.gfile.rmtree` it after every save. The guide's directory sits beside
  the chief's (`workertemp_<task id>`): under a gs:// --model_dir that is a full
  checkpoint uploaded by every other worker at every save, and deleted again (about
  2.5 GB for the big model with Adam, inside a Spot VM's 30 s notice). Nothing ever
  reads those files, so they go to this host's temporary directory (Python's
  `tempfile`: $TMPDIR, else /tmp), emptied after each save (`discard_worker_dir`) and
  removed when training ends (`remove_worker_dir`) or, at the latest, at exit.
  """
  directory = tempfile.mkdtemp(prefix=f"t2t_keras-worker-{worker_id}-")
  atexit.register(remove_worker_dir, directory)
  return directory


def discard_worker_dir(directory: str) -> None:
  """Empties a non-chief worker's scratch directory (`worker_scratch_dir`, with its
  best/) once a save is written: kept, every save would leave a full copy of the
  checkpoint. The directory itself stays (it is this process's, from mkdtemp) for the
  next save."""
  if not os.path.isdir(directory):
    return
  for name in os.listdir(directory):
    path = os.path.join(directory, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)


def remove_worker_dir(directory: str) -> None:
  """Removes a scratch directory of `worker_scratch_dir` (nothing if already gone)."""
  shutil.rmtree(directory, ignore_errors=True)


def default_export_dir(model_dir: str, ctranslate2: bool = False) -> str:
  return os.path.join(model_dir, CTRANSLATE2_DIR if ctranslate2 else EXPORT_DIR)


def _write_atomic(path: str, data, binary: bool = False) -> None:
  """Writes `data` to a unique temporary name, then renames it over `path`."""
  tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
  with tf.io.gfile.GFile(tmp, "wb" if binary else "w") as f:
    f.write(data)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def append_flags(model_dir: str, flags_text: str) -> None:
  """Appends a run's flags (absl's `flags_into_string`) to flags.txt, headed by the
  time, so that the file is a recipe of the latest run and a history of the others.
  (absl's own `append_flags_into_file` uses Python's open, which fails on gs://.)"""
  path = flags_path(model_dir)
  old = ""
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      old = f.read()
  header = f"# run started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
  _write_atomic(path, old + header + flags_text)


# ---------------------------------------------------------------- the batch plan
def plan_key(data_config: DataConfig, train_config, replicas: int) -> dict:
  """What decides which pairs each step trains on (see t2t_keras.data.batching.plan)."""
  key = {}
  if data_config.train_weights:  # several corpora (absent before them: records compare)
    key = {"train_weights": data_config.train_weights,
           "train_weights_by": data_config.train_weights_by}
  if data_config.packed_length:  # absent when unpacked: older records still compare
    key["packed_length"] = data_config.packed_length
    # How rows are filled (packing.py); the first packing, one bucket's pairs a row,
    # recorded none, so a restart of such a run says that its plan changed.
    key["packing"] = "length strata"
  return {**key, "replicas": replicas, "accum_steps": train_config.accum_steps,
          # The plan's run length (kept under its first name, so that older records
          # still compare): steps kept on one bucket with static shapes (packed rows
          # have one shape: their steps mix buckets).
          "steps_per_loop": (min(train_config.steps_per_loop, train_config.static_run_steps)
                             if data_config.static_shapes and not data_config.packed_length
                             else 1),
          "seed": data_config.seed, "batch_size": data_config.batch_size,
          "max_length": data_config.max_length, "bucket_min": data_config.bucket_min,
          "bucket_growth": data_config.bucket_growth,
          "static_shapes": data_config.static_shapes}


def record_plan(model_dir: str, key: dict) -> None:
  """Records the batch plan's key (after a checkpoint trained on it is saved)."""
  _write_atomic(os.path.join(model_dir, PLAN_FILE), json.dumps({"key": key}, indent=2,
                                                               sort_keys=True))


def check_plan(model_dir: str, key: dict) -> Optional[str]:
  """Compares a restart's batch plan with the one the checkpoints were trained on.

  Returns:
    One line saying what changed and what happens to the interrupted epoch, or None.
  """
  path = os.path.join(model_dir, PLAN_FILE)
  line = None
  latest = tf.train.latest_checkpoint(model_dir)
  if latest and tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      try:
        saved = json.load(f).get("key", {})
      except json.JSONDecodeError:
        saved = {}
    changed = [f"{name} {saved.get(name)} -> {value}" for name, value in key.items()
               if saved.get(name) != value]
    if changed:
      line = (f"the batch plan changed since {os.path.basename(latest)} was saved ("
              f"{', '.join(changed)}): training resumes at the same step in the new plan, "
              "whose epochs hold other batches, so the rest of the interrupted epoch is "
              "not replayed in its old order (some of its pairs come again, others only "
              "in the next epoch); the next epochs are whole.")
  return line


# ---------------------------------------------------------------- config.json
def _shape_of(config: ModelConfig) -> dict:
  shape = {name: getattr(config, name) for name in SHAPE_FIELDS}
  shape["encoder_layers"] = config.encoder_layers
  shape["decoder_layers"] = config.decoder_layers
  shape["key_size"], shape["value_size"] = config.head_key_size, config.head_value_size
  if config.position_embedding == "learned":
    shape["max_position"] = config.max_position
  if config.position_embedding == "relative":
    shape["max_relative_position"] = config.max_relative_position
  del shape["num_hidden_layers"], shape["num_encoder_layers"], shape["num_decoder_layers"]
  return shape


def _optimizer_of(train) -> dict:
  """--optimizer of a TrainConfig or its record: its slot variables are in every
  checkpoint, so a restart with another cannot resume them. A record from before the
  flag existed was trained with Adam."""
  record = dataclasses.asdict(train) if dataclasses.is_dataclass(train) else train
  return {"optimizer": record.get("optimizer", "adam")}


def load_run_config(model_dir: str) -> dict:
  """All sections of config.json ("model", "data", "train", ...).

  Raises:
    ModelDirError: config.json is missing or not JSON, naming the file and what to do.
  """
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    raise ModelDirError(f"{path} not found: is --model_dir={model_dir} a t2t_keras model "
                        "directory (written by python -m t2t_keras.train)?")
  with tf.io.gfile.GFile(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as error:
      raise ModelDirError(f"{path} is not valid JSON ({error}); restore it from a backup "
                          "or start a new model directory.") from None


def _section(config_class, saved: dict):
  fields = {f.name for f in dataclasses.fields(config_class)}
  return config_class(**{k: v for k, v in saved.items() if k in fields})


def load_model_config(model_dir: str) -> ModelConfig:
  """The ModelConfig a model directory was trained with."""
  return _section(ModelConfig, load_run_config(model_dir)["model"])


def data_config_of(model_dir: str) -> DataConfig:
  """The DataConfig recorded in model_dir/config.json."""
  return _section(DataConfig, load_run_config(model_dir).get("data", {}))


# config.json's section of the decoding flags the training recipe set (flag -> value).
RECIPE_SECTION = "recipe_decoding"


def recipe_decoding_of(model_dir: str) -> dict:
  """The decoding flags (DecodeConfig's and WeightsConfig's, by flag name) that the
  training run was given, on its command line or in its recipe: the recipe's way to
  decode this model (beam, alpha, --average_last_n, ...). Empty for a directory
  written before they were recorded, or trained without any."""
  return dict(load_run_config(model_dir).get(RECIPE_SECTION) or {})


def _from_recipe(config_class, recipe: dict):
  """`config_class` with the fields whose flags `recipe` sets, the others default."""
  return config_class(**{f.name: recipe[flag_name(f)] for f in dataclasses.fields(config_class)
                         if flag_name(f) in recipe})


def recipe_decode_config(model_dir: str) -> DecodeConfig:
  """The DecodeConfig the model's recipe decodes with (`recipe_decoding_of`; the
  defaults where it set nothing)."""
  return _from_recipe(DecodeConfig, recipe_decoding_of(model_dir))


def recipe_weights(model_dir: str) -> WeightsConfig:
  """The WeightsConfig of the model's recipe (--average_last_n, --decode_dtype)."""
  return _from_recipe(WeightsConfig, recipe_decoding_of(model_dir))


def guided_alignment_of(model_dir: str) -> Optional[dict]:
  """How a model trained with guided alignment (--train_alignments) was guided:
  {"alignments": file, "layer": decoder layer, "head": head, "weight": weight}; None
  for a model trained without (or a model directory older than the flags)."""
  run = load_run_config(model_dir)
  return _guidance(run.get("data") or {}, run.get("train") or {})


def _guidance(data, train) -> Optional[dict]:
  """`guided_alignment_of` from config.json's "data" and "train" sections (dicts or
  the configs)."""
  data, train = ({} if x is None else dataclasses.asdict(x) if dataclasses.is_dataclass(x)
                 else x for x in (data, train))
  if not data.get("train_alignments"):
    return None
  defaults = TrainConfig()
  return {"alignments": data["train_alignments"],
          "layer": train.get("guided_alignment_layer", defaults.guided_alignment_layer),
          "head": train.get("guided_alignment_head", defaults.guided_alignment_head),
          "weight": train.get("guided_alignment_weight", defaults.guided_alignment_weight)}


def write_or_check_config(model_dir: str, model_config: ModelConfig, **sections) -> None:
  """Writes config.json on the first run; on a restart refuses a different model shape
  or optimizer.

  Args:
    model_dir: the model directory.
    model_config: the requested model.
    **sections: other dataclasses or dicts to record (data, train, ...).

  Raises:
    ModelDirError: naming every differing shape flag (and --optimizer, when `train`
      is given) with both values.
  """
  path = os.path.join(model_dir, CONFIG_FILE)
  tf.io.gfile.makedirs(model_dir)
  if tf.io.gfile.exists(path):
    saved = load_model_config(model_dir)
    old, new = _shape_of(saved), _shape_of(model_config)
    if "train" in sections:
      old.update(_optimizer_of(load_run_config(model_dir).get("train") or {}))
      new.update(_optimizer_of(sections["train"]))
    diffs = [f"--{k}: saved {old[k]!r}, requested {new[k]!r}" for k in old if old[k] != new[k]]
    if diffs:
      raise ModelDirError(
          f"{model_dir} holds a model of a different shape or optimizer, so its "
          "checkpoints cannot be restored: " + "; ".join(diffs) + ". Use the saved "
          "values to resume, or a new --model_dir to train a new model.")
    for key, value in dataclasses.asdict(model_config).items():
      if getattr(saved, key) != value:
        logging.warning("%s changed since the last run: %r -> %r", key,
                        getattr(saved, key), value)
    if "data" in sections and "train" in sections:  # decode reads the latest
      old_guide = guided_alignment_of(model_dir)
      new_guide = _guidance(sections["data"], sections["train"])
      if old_guide != new_guide:
        logging.warning("guided alignment changed since the last run: %s -> %s; decode "
                        "--output_alignments reads the new setting", old_guide, new_guide)
  record = {"model": dataclasses.asdict(model_config)}
  for name, section in sections.items():
    record[name] = dataclasses.asdict(section) if dataclasses.is_dataclass(section) else section
  _write_atomic(path, json.dumps(record, indent=2, sort_keys=True))


# ---------------------------------------------------------------- vocabulary
def _protos(tokenizer) -> Optional[List[bytes]]:
  """The SentencePiece models of a tokenizer: one shared, or the source's and the
  target's (a `PairTokenizer`); None for the synthetic tasks' symbol ids."""
  if getattr(tokenizer, "model_proto", None) is not None:
    return [tokenizer.model_proto]
  if getattr(tokenizer, "target_vocab_size", None):  # PairTokenizer
    return [tokenizer.source.model_proto, tokenizer.target.model_proto]
  return None


def _names(protos: List[bytes]) -> tuple:
  return (VOCAB_FILE,) if len(protos) == 1 else SIDE_VOCAB_FILES


def save_vocab(tokenizer, model_dir: str):
  """Copies the tokenizer's SentencePiece model(s) into model_dir (if it has any).

  Returns:
    The path of vocab.model, or the paths of vocab.source.model and vocab.target.model
    (separate vocabularies), or None.

  Raises:
    ModelDirError: model_dir already holds another vocabulary.
  """
  protos = _protos(tokenizer)
  if protos is None:
    return None
  paths = []
  for proto, name in zip(protos, _names(protos)):
    path = os.path.join(model_dir, name)
    paths.append(path)
    if tf.io.gfile.exists(path):
      with tf.io.gfile.GFile(path, "rb") as f:
        if f.read() == proto:
          continue
      raise ModelDirError(
          f"{path} holds a different vocabulary than this run's "
          f"({tokenizer.vocab_file or 'built in memory'}): the checkpoints in {model_dir} "
          "belong to that vocabulary. Use a new --model_dir for new data.")
    tf.io.gfile.makedirs(model_dir)
    _write_atomic(path, proto, binary=True)
  return paths[0] if len(paths) == 1 else paths


def vocab_file_of(tokenizer, model_dir: str):
  """The model directory's copy of the tokenizer's vocabulary (None: it has none; a
  list of the source's and the target's with separate vocabularies)."""
  protos = _protos(tokenizer)
  if protos is None:
    return None
  paths = [os.path.join(model_dir, name) for name in _names(protos)]
  return paths[0] if len(paths) == 1 else paths


def copy_config_and_vocab(model_dir: str, output_dir: str) -> List[str]:
  """Copies config.json and the SentencePiece files, so that `output_dir` (e.g. a
  directory of averaged weights) serves as a model directory; returns their names."""
  copied = []
  for pattern in (CONFIG_FILE,) + VOCAB_PATTERNS:
    for source in tf.io.gfile.glob(os.path.join(model_dir, pattern)):
      tf.io.gfile.copy(source, os.path.join(output_dir, os.path.basename(source)),
                       overwrite=True)
      copied.append(os.path.basename(source))
  return copied
