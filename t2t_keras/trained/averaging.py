"""Checkpoint averaging: the mean of the model weights of the last N checkpoints.

The paper decodes with the average of the last 5 (base) or 20 (big) checkpoints,
written 10 minutes apart: averaging smooths the noise of the final Adam steps and
is worth a fraction of a BLEU point for free.

Which checkpoint entries are model weights is read from each checkpoint's object
graph, not from the entry names: TensorFlow names a variable by its SHORTEST path from
the checkpoint root, and the trainer's `tf.train.Checkpoint(model=..., optimizer=...)`
reaches most model variables through the optimizer first (as
`optimizer/_trainable_variables/3/...`). Walking the graph from the `model` node gives
every model variable one model-relative name (`model/encoder_layer_0/.../_kernel`, the
name `tf.train.Checkpoint(model=model)` writes) and leaves optimizer slots, iteration
counters and the save counter out. Checking names and shapes before reading any value
lets a mismatch be reported with the checkpoint, the variable and both shapes.

Sums are kept in float64 and cast to each variable's dtype at the end, so averaging 20
float32 (or bfloat16) checkpoints adds no rounding of its own.
"""

from __future__ import annotations

import collections
import os
import re
from typing import Dict, NamedTuple, Optional, Sequence, Union

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from google.protobuf import message
from tensorflow.core.protobuf import trackable_object_graph_pb2

from t2t_keras.trained import checkpoints, modeldir
from t2t_keras import outputs
from t2t_keras.errors import CheckpointError, ModelDirError
from t2t_keras.model import create_model

_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_VARIABLE_ATTRIBUTE = "VARIABLE_VALUE"
_ROOT_NAME = "model"  # the keyword trainer, decoding and export give the model
_MAX_NAMES_SHOWN = 5


class _Entry(NamedTuple):
  """Where a model variable lives in one checkpoint."""

  key: str
  shape: tuple
  dtype: tf.DType


def _step_of(path: str) -> Optional[int]:
  """The step in a `ckpt-<step>` prefix (the trainer numbers checkpoints by step)."""
  match = re.search(r"-(\d+)$", path)
  return int(match.group(1)) if match else None


# ---------------------------------------------------------------- names and shapes
def _reader(path: str):
  try:
    if tf.io.gfile.exists(path + ".index"):  # a prefix: read it as such (load_checkpoint
      # asks isdir first, which file systems that list by name prefix, as ram:// does,
      # answer yes for `ckpt-7` beside `ckpt-7.index`)
      return tf.compat.v1.train.NewCheckpointReader(path)
    return tf.train.load_checkpoint(path)
  except checkpoints.READ_ERRORS as error:
    raise checkpoints.unreadable(path, error) from None


def _model_entries(path: str, reader) -> Dict[str, _Entry]:
  """Model-relative name -> checkpoint entry of every variable under the model object.

  A breadth-first walk of the checkpoint's object graph from the root's `model`
  child, naming each variable by its first path (children in stored order), as
  `tf.train.Checkpoint(model=model)` names them when it saves.
  """
  if not reader.has_tensor(_OBJECT_GRAPH_KEY):
    raise CheckpointError(f"{path} has no object graph: it is a name-based (TF1) "
                          "checkpoint, not one written by t2t_keras.")
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  try:  # the first read of the data file: a truncated one fails here
    graph.ParseFromString(checkpoints.read_tensor(path, reader, _OBJECT_GRAPH_KEY))
  except message.DecodeError as error:
    raise checkpoints.unreadable(path, error) from None
  model_ids = [c.node_id for c in graph.nodes[0].children if c.local_name == _ROOT_NAME]
  if not model_ids:
    top = [c.local_name for c in graph.nodes[0].children]
    raise CheckpointError(f"{path} holds no `{_ROOT_NAME}` object (its top-level objects: "
                          f"{top}): it was not written by t2t_keras.")
  shapes = reader.get_variable_to_shape_map()
  dtypes = reader.get_variable_to_dtype_map()
  names = {model_ids[0]: _ROOT_NAME}
  queue = collections.deque(model_ids)
  entries = {}
  while queue:
    node_id = queue.popleft()
    node = graph.nodes[node_id]
    for attribute in node.attributes:
      if attribute.name == _VARIABLE_ATTRIBUTE:
        key = attribute.checkpoint_key
        entries[names[node_id]] = _Entry(key, tuple(shapes[key]), dtypes[key])
    for child in node.children:
      if child.node_id not in names:
        names[child.node_id] = f"{names[node_id]}/{child.local_name}"
        queue.append(child.node_id)
  return entries


def _live_variables(model) -> Dict[str, tf.Variable]:
  """Model-relative name -> variable of a built model, named as in `_model_entries`."""
  names = {id(model): _ROOT_NAME}
  queue = collections.deque([model])
  variables = {}
  while queue:
    obj = queue.popleft()
    if isinstance(obj, (tf.Variable, keras.Variable)):
      variables[names[id(obj)]] = obj
    for local_name, child in tf.train.TrackableView.children(obj).items():
      if id(child) not in names:
        names[id(child)] = f"{names[id(obj)]}/{local_name}"
        queue.append(child)
  return variables


def _listing(names) -> str:
  names = sorted(names)
  more = len(names) - _MAX_NAMES_SHOWN
  return ", ".join(names[:_MAX_NAMES_SHOWN]) + (f" and {more} more" if more > 0 else "")


_AVERAGE_FIX = "Average only checkpoints of one training run (one --model_dir)."


def _check_same_variables(path: str, entries: Dict[str, _Entry],
                          ref_shapes: Dict[str, tuple], ref_what: str,
                          fix: str = _AVERAGE_FIX) -> None:
  """Refuses a checkpoint whose model variables or shapes differ from the reference."""
  missing, extra = set(ref_shapes) - set(entries), set(entries) - set(ref_shapes)
  if missing or extra:
    parts = []
    if missing:
      parts.append(f"lacks {len(missing)} variable(s) that {ref_what} has: "
                   f"{_listing(missing)}")
    if extra:
      parts.append(f"has {len(extra)} variable(s) that {ref_what} lacks: "
                   f"{_listing(extra)}")
    raise CheckpointError(f"checkpoint {path} belongs to another model: it "
                          + "; it ".join(parts) + ". " + fix)
  for name, entry in entries.items():
    if entry.shape != tuple(ref_shapes[name]):
      raise CheckpointError(
          f"checkpoint {path} belongs to another model: variable {name} has shape "
          f"{entry.shape} there but {tuple(ref_shapes[name])} in {ref_what}. " + fix)


# ---------------------------------------------------------------- averaging
def _mean_of(paths: Sequence[str], ref_shapes: Optional[Dict[str, tuple]] = None,
             ref_what: str = "") -> tuple:
  """float64 means of the model variables of `paths`, checked against a reference.

  The reference is `ref_shapes` (a model's own variables) or else the first checkpoint.
  Every checkpoint is checked before any value is read, so a mismatch in the last one
  fails fast. Returns (name -> mean, name -> entry of the newest checkpoint).
  """
  readers = [_reader(path) for path in paths]
  all_entries = [_model_entries(path, reader) for path, reader in zip(paths, readers)]
  if ref_shapes is None:
    ref_shapes = {name: entry.shape for name, entry in all_entries[0].items()}
    ref_what = paths[0]
  for path, entries in zip(paths, all_entries):
    _check_same_variables(path, entries, ref_shapes, ref_what)
  sums: Dict[str, np.ndarray] = {}
  for i, (path, reader, entries) in enumerate(zip(paths, readers, all_entries), 1):
    for name, entry in entries.items():
      value = checkpoints.read_tensor(path, reader, entry.key)
      if not entry.dtype.is_floating:
        sums[name] = np.asarray(value)  # integer state (e.g. seeds): keep the newest
      elif name in sums:
        sums[name] += np.asarray(value, np.float64)
      else:
        sums[name] = np.array(value, np.float64)
    logging.info("averaging checkpoint %d/%d: %s (%d model variables)", i, len(paths),
                 path, len(entries))
  newest = all_entries[-1]
  means = {name: total / len(paths) if newest[name].dtype.is_floating else total
           for name, total in sums.items()}
  return means, newest


def average_checkpoints(model_dir_or_paths: Union[str, Sequence[str]],
                        last_n: Optional[int] = None) -> Dict[str, np.ndarray]:
  """The mean of the model weights of the last `last_n` checkpoints.

  Args:
    model_dir_or_paths: a model directory or checkpoint prefixes, oldest first.
    last_n: how many of the newest checkpoints to average (None: all given).

  Returns:
    Model-relative variable name (as `tf.train.Checkpoint(model=model)` names it,
    e.g. `model/source_embedding/embeddings`) -> mean, in the checkpoint's dtype.
    Integer variables take the newest checkpoint's value.

  Raises:
    ModelDirError: no such directory, or no checkpoint in it.
    CheckpointError: too few checkpoints; unreadable ones; checkpoints whose model
      variables or shapes differ (naming the checkpoint, variable and both shapes).
  """
  paths = checkpoints.checkpoint_paths(model_dir_or_paths, last_n)
  means, entries = _mean_of(paths)
  return {name: mean.astype(entries[name].dtype.as_numpy_dtype)
          for name, mean in means.items()}


def average_into_model(model, paths: Sequence[str]) -> None:
  """Assigns the mean of the checkpoints' model weights to a built model, in memory.

  What `decode --average_last_n` and `export --average_last_n` use: nothing is written.

  Args:
    model: a built model (`create_model`) of the checkpoints' configuration.
    paths: checkpoint prefixes (e.g. the last N of a model directory).

  Raises:
    CheckpointError: a checkpoint misses a model variable, has extra ones or another
      shape (naming the checkpoint, the variable and both shapes), or cannot be read.
  """
  paths = [os.fspath(p) for p in paths]
  if not paths:
    raise CheckpointError("no checkpoints to average.")
  variables = _live_variables(model)
  shapes = {name: tuple(v.shape) for name, v in variables.items()}
  means, _ = _mean_of(paths, shapes, "the model built from config.json")
  for name, variable in variables.items():
    variable.assign(means[name].astype(tf.as_dtype(variable.dtype).as_numpy_dtype))
  logging.info("assigned the average of %d checkpoint(s) to %d variables", len(paths),
               len(variables))


def check_matches_model(model, path: str, fix: str) -> None:
  """Refuses a checkpoint whose model variables or shapes differ from a built model's.

  `tf.train.Checkpoint.restore(...).expect_partial()` would leave a variable the
  checkpoint lacks at its random initial value without a word; this names it.

  Raises:
    CheckpointError: naming the checkpoint, the variables and shapes, and `fix`.
  """
  shapes = {name: tuple(v.shape) for name, v in _live_variables(model).items()}
  entries = _model_entries(path, _reader(path))
  _check_same_variables(path, entries, shapes, "the model built from config.json", fix)


def write_averaged(model_dir: str, output_dir: str, last_n: int,
                   overwrite: bool = False) -> str:
  """Writes the average of the last `last_n` checkpoints as a new model directory.

  `output_dir` gets `ckpt-<newest step>` (model weights only: no optimizer slots,
  iterator or counters), `config.json` and the vocabulary files (*.model, *.vocab),
  so it serves as the --model_dir of decode and export.

  Args:
    model_dir: the training directory.
    output_dir: where to write; must differ from model_dir.
    last_n: how many of the newest checkpoints to average.
    overwrite: replace checkpoints already in output_dir (otherwise refused).

  Returns:
    The prefix of the written checkpoint.

  Raises:
    ModelDirError / CheckpointError: naming the offending directory, checkpoint or
      variable, and what to do.
  """
  paths = checkpoints.checkpoint_paths(model_dir, last_n)
  if outputs.same_path(output_dir, model_dir):  # gs:// too (not os.path.realpath)
    raise ModelDirError(f"--output_dir is --model_dir ({model_dir}): writing there would "
                        "mix the average with the training checkpoints. Choose a new "
                        f"directory, e.g. {model_dir.rstrip('/')}_avg.")
  existing = checkpoints.listed_checkpoints(output_dir)
  if existing and not overwrite:
    raise ModelDirError(f"{output_dir} already holds checkpoints "
                        f"({', '.join(map(os.path.basename, existing))}): choose an empty "
                        "--output_dir, or pass --overwrite to replace them.")
  model = create_model(modeldir.load_model_config(model_dir))
  average_into_model(model, paths)
  tf.io.gfile.makedirs(output_dir)
  steps = [s for s in map(_step_of, paths) if s is not None]
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), output_dir,
                                       max_to_keep=1)
  written = manager.save(checkpoint_number=max(steps) if steps else None)
  copied = modeldir.copy_config_and_vocab(model_dir, output_dir)
  logging.info("wrote %s (the average of %s) and copied %s", written,
               ", ".join(map(os.path.basename, paths)), ", ".join(copied) or "nothing")
  return written
