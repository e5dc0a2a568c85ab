"""The model card of an export: what a served model is, in a small JSON file beside it.

A SavedModel in a TensorFlow Serving directory says nothing about the model behind it:
which data it was trained on, how big it is, how well it did. Its model card answers
that from the model directory at export time, so that whoever serves (or finds) the
export can tell, without the model directory:

  model             the resolved ModelConfig (config.json's "model" section)
  vocab_size        the vocabulary's size (and vocab_type for SentencePiece models);
                    with separate vocabularies the source's, and target_vocab_size
  parameters        the number of model weights
  training_data     the data the run names: files, TFDS dataset and direction,
                    synthetic task or treebank, with the dev set
  training          how the weights were optimised: --optimizer (and Adam's betas and
                    epsilon), --clip_grad_norm, the learning-rate schedule, label
                    smoothing, --accum_steps, and with --train_alignments the
                    guided head and weight (`guided_alignment`: layer, head, weight;
                    the alignments file is in training_data) (None when config.json
                    has no "train")
  checkpoints       the checkpoint(s) the weights come from (several: an average),
                    and `step`, the newest one's step
  dev_bleu          the last dev BLEU the run recorded (`--eval_bleu_sentences`), with
                    its step, sentence count and sacreBLEU's signature (None when the
                    run computed none; `signature` None for runs trained before the
                    signature was recorded: their BLEU comes from the TensorBoard logs)
  best_dev          the best dev result of `--keep_best_checkpoint` (best_eval.json)
  decoding          the decoding settings fixed in the export (beam, alpha, ...)
  t2t_keras_version, exported_at (UTC, ISO 8601)

It lives at `<version>/assets.extra/model_card.json`: `assets.extra/` is the
SavedModel's place for files that travel with a model but that its graph does not
load (TensorFlow Serving's warm-up requests live there too), so the card changes
neither the graph nor what the server loads. `tools/saved_model_cli.py show` prints it,
`tools/saved_model_cli.py card` prints the JSON.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
from collections.abc import Sequence

import tensorflow as tf

import t2t_keras
from t2t_keras.learning_curves import read_scalars
from t2t_keras.trained import modeldir

CARD_FILE = os.path.join("assets.extra", "model_card.json")  # in the version directory
CARD_FORMAT = 1  # bumped when a field changes meaning

# The DataConfig fields that name the training data, by --data_source.
_DATA_FIELDS = {
    "files": ("train_src", "train_tgt", "dev_src", "dev_tgt", "target_language_tags",
              "dev_target_language"),
    "parsing": ("train_src", "dev_src", "parsing_linearization"),
    "tfds": ("tfds_name", "source_lang", "target_lang", "tfds_train_subsets"),
    "synthetic": ("synthetic_task", "synthetic_vocab_size", "synthetic_min_length",
                  "synthetic_max_length", "synthetic_train_size"),
}


def training_data(data: dict) -> dict:
  """The fields of config.json's "data" section that name the training data.

  Any other `train_*` field (e.g. corpus weights) is kept too, so a new way of naming
  the data appears on the card without an edit here; and --packed_length when the
  pairs were trained packed.
  """
  source = data.get("source")
  names = _DATA_FIELDS.get(source, ())
  picked = {"source": source}
  for name, value in sorted(data.items()):
    if (name in names or name.startswith("train_")) and value not in (None, ""):
      picked[name] = value
  if "train_weights" not in picked:  # how weights share an epoch, without weights
    picked.pop("train_weights_by", None)
  if data.get("packed_length"):  # several pairs a row (data/batching/packing.py)
    picked["packed_length"] = data["packed_length"]
  return picked


# The TrainConfig fields that say how the weights were optimised.
_TRAINING_FIELDS = ("clip_grad_norm", "learning_rate_schedule", "learning_rate",
                    "learning_rate_warmup_steps", "label_smoothing", "accum_steps")
_ADAM_FIELDS = ("adam_beta1", "adam_beta2", "adam_epsilon")


def training(train: dict) -> dict | None:
  """The fields of config.json's "train" section that say how the weights were
  optimised; None when the run recorded none."""
  if not train:
    return None
  optimizer = train.get("optimizer", "adam")  # recorded before --optimizer: Adam
  names = _TRAINING_FIELDS + (_ADAM_FIELDS if optimizer == "adam" else ())
  return {"optimizer": optimizer, **{name: train[name] for name in names if name in train}}


def _step(checkpoint: str) -> int | None:
  match = re.search(r"-(\d+)$", checkpoint)
  return int(match.group(1)) if match else None


def dev_bleu(model_dir: str) -> dict | None:
  """The last dev BLEU of the run: its record (with the signature), else the eval logs."""
  record = modeldir.last_dev_bleu(model_dir)
  if record is not None:
    return record
  points = read_scalars(modeldir.logs_dir(model_dir, "eval")).get("bleu")
  if not points:
    return None
  step, bleu = points[-1]
  return {"bleu": bleu, "step": step, "signature": None,
          "note": "from the TensorBoard eval logs; the run recorded no signature"}


def build(translator, model_dir: str | None = None,
          checkpoints: Sequence[str] = (), now: datetime.datetime | None = None) -> dict:
  """The card of an export of `translator` (an export.saved_model.Translator) trained in model_dir.

  Args:
    translator: the exported module: its `model` (with `model_config`), decoding
      `config`, `max_input_length`, `tree_constraint` and `jit_compile`.
    model_dir: the model directory the weights come from (None: a model trained
      elsewhere; the card then holds what the translator knows).
    checkpoints: the checkpoint path(s) the weights were restored (or averaged) from.
    now: the export time (default: now).

  Returns:
    A JSON-serialisable dict (the fields of the module docstring).
  """
  model_config = translator.model.model_config
  card = {
      "format": f"t2t_keras model card {CARD_FORMAT}",
      "t2t_keras_version": t2t_keras.__version__,
      "exported_at": (now or datetime.datetime.now(datetime.UTC)).isoformat(
          timespec="seconds"),
      "model_dir": model_dir,
      "model": dataclasses.asdict(model_config),
      "vocab_size": int(model_config.vocab_size),
      **({"target_vocab_size": int(model_config.target_vocab_size)}
         if model_config.target_vocab_size else {}),
      "parameters": int(translator.model.count_params()),
      "checkpoints": [os.path.basename(p) for p in checkpoints] or None,
      "step": max((_step(p) for p in checkpoints if _step(p) is not None), default=None),
      "decoding": {**dataclasses.asdict(translator.config),
                   "max_input_length": int(translator.max_input_length),
                   "constrain_trees": translator.tree_constraint is not None,
                   "jit_compile": bool(translator.jit_compile)},
      "training_data": None, "training": None, "dev_bleu": None, "best_dev": None,
  }
  if model_dir:
    run = modeldir.load_run_config(model_dir)
    data = run.get("data", {})
    card["training_data"] = training_data(data)
    card["training"] = training(run.get("train"))
    guided = modeldir.guided_alignment_of(model_dir)
    if guided and card["training"] is not None:  # one head trained to align
      card["training"]["guided_alignment"] = {k: guided[k] for k in ("layer", "head",
                                                                      "weight")}
    if data.get("source") != "synthetic":
      card["vocab_type"] = data.get("vocab_type")
    card["dev_bleu"] = dev_bleu(model_dir)
    card["best_dev"] = modeldir.best_eval(model_dir)
  return card


def write(export_path: str, card: dict) -> str:
  """Writes `card` to `<export_path>/assets.extra/model_card.json`; returns its path."""
  path = os.path.join(export_path, CARD_FILE)
  tf.io.gfile.makedirs(os.path.dirname(path))
  with tf.io.gfile.GFile(path, "w") as f:
    json.dump(card, f, indent=2, sort_keys=True, default=str)
  return path


def read(export_path: str) -> dict | None:
  """The card of an export, or None when it has none (exports older than cards)."""
  path = os.path.join(export_path, CARD_FILE)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def describe(card: dict) -> str:
  """A few lines for a person: what the model is, what it was trained on, its score."""
  model = card.get("model") or {}
  header = (f"Model card ({CARD_FILE}): t2t_keras {card.get('t2t_keras_version')}, "
            f"exported {card.get('exported_at')}")
  lines = [header]
  layers = f"{model.get('num_hidden_layers')} layers"
  if model.get("num_encoder_layers") or model.get("num_decoder_layers"):
    layers = (f"{model.get('num_encoder_layers') or model.get('num_hidden_layers')}+"
              f"{model.get('num_decoder_layers') or model.get('num_hidden_layers')} layers")
  lines.append(f"  model: {layers}, hidden_size {model.get('hidden_size')}, filter_size "
               f"{model.get('filter_size')}, num_heads {model.get('num_heads')}, "
               f"{card.get('parameters'):,} parameters, vocabulary {card.get('vocab_size')}"
               + (f" (source), {card['target_vocab_size']} (target)"
                  if card.get("target_vocab_size") else ""))
  data = dict(card.get("training_data") or {})
  if data:
    source = data.pop("source", None)  # first; the file is written with sorted keys
    lines.append(f"  training data: source={source}"
                 + "".join(f", {k}={v}" for k, v in data.items()))
  trained = dict(card.get("training") or {})
  if trained:
    lines.append(f"  training: optimizer={trained.pop('optimizer')}"
                 + "".join(f", {k}={v}" for k, v in sorted(trained.items())))
  if card.get("checkpoints"):
    lines.append(f"  weights: {', '.join(card['checkpoints'])}")
  bleu = card.get("dev_bleu")
  if bleu:
    signature = bleu.get("signature") or "signature not recorded"
    lines.append(f"  last dev BLEU: {bleu['bleu']:.2f} at step {bleu.get('step')} "
                 f"({signature})")
  best = card.get("best_dev")
  if best:
    lines.append(f"  best dev {best.get('metric')}: {best.get('value'):.4g} at step "
                 f"{best.get('step')}")
  decoding = card.get("decoding") or {}
  lines.append(f"  decoding: beam_size {decoding.get('beam_size')}, alpha "
               f"{decoding.get('alpha')}, extra_decode_length "
               f"{decoding.get('extra_decode_length')}, max_input_length "
               f"{decoding.get('max_input_length')}")
  return "\n".join(lines)
