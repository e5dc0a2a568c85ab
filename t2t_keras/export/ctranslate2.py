"""Exports a trained model to CTranslate2, a C++ inference engine for CPUs and GPUs.

CTranslate2 (OpenNMT's engine) serves Transformers faster than graph-mode TensorFlow
on CPU, and quantized to int8 about twice as fast again. It is also an independent
check: an engine written by other people must produce our translations from our
weights. The model is described with its Python spec API
(`ctranslate2.specs.TransformerSpec`) from the weights in memory; no checkpoint file
format is involved.

What makes the two engines agree (each checked by tests/ctranslate2_export_test.py):
- Embeddings are scaled by sqrt(d_model) in both (`scale_embeddings`).
- Positions: the paper's interleaved sin/cos (t2t_keras) differ from CTranslate2's
  built-in concatenated halves, so the table itself is exported (`encodings`),
  `max_position` rows (learned positions: the trained table). Relative positions
  (Shaw et al.) are CTranslate2's `relative_position` spec, as OpenNMT-tf's models
  convert: each self-attention's key and value embeddings, (2K + 1, head size), with
  no position table; K is read from their shape.
- Start and end: the decoder starts from BOS (`decoder_start_token`), sources end with
  EOS (`add_source_eos`); PAD, EOS, UNK and BOS keep their ids and piece strings.
- LayerNorm epsilon (`layer_norm_epsilon`), pre-norm or post-norm, the final norm of a
  pre-norm stack, no attention biases, ReLU feed-forward with biases.
- Attention scaling 1/sqrt(key size): CTranslate2 scales by its `head_dim`, which is
  set to the per-head key size. CTranslate2 has one head size for queries, keys and
  values, so models with different key and value sizes are refused.
- Length penalty: CTranslate2's `length_penalty` divides by length^p, not GNMT's
  ((5 + length) / 6)^alpha; with `length_penalty=0` and `--alpha=0` both rank by the
  plain log-probability (tested to give the same beams).
"""

from __future__ import annotations

import os
import tempfile
from typing import List, Optional

import numpy as np
from absl import logging

from t2t_keras import BOS_ID, EOS_ID, NUM_RESERVED_IDS, PAD_ID, UNK_ID
from t2t_keras.configs import ModelConfig
from t2t_keras.errors import ExportError
from t2t_keras.export import QUANTIZATIONS, ExportSettings, publish
from t2t_keras.inference import loading
from t2t_keras.model.layers import position as position_lib
from t2t_keras.trained import modeldir

INSTALL_HINT = 'pip install -e ".[ctranslate2]"  (or: pip install ctranslate2)'
MODEL_FILE = "model.bin"  # what ctranslate2.Translator opens first
RESERVED_TOKENS = {PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>", BOS_ID: "<s>"}


def _ctranslate2():
  try:
    import ctranslate2  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ExportError(f"--format=ctranslate2 needs the ctranslate2 package: "
                      f"{INSTALL_HINT}") from None
  return ctranslate2


def check_supported(config: ModelConfig):
  """Raises ExportError naming the flag of anything CTranslate2 cannot represent."""
  if config.source_pointer:
    raise ExportError(
        "CTranslate2's Transformer has no source pointer (this model was trained with "
        "--source_pointer): export it as a SavedModel (--format=saved_model) instead.")
  if config.head_key_size != config.head_value_size:
    raise ExportError(
        f"CTranslate2 has one head size for queries, keys and values, but this model has "
        f"keys of {config.head_key_size} and values of {config.head_value_size} per head "
        "(--key_size / --value_size): export it as a "
        "SavedModel (--format=saved_model) instead.")


def vocabulary(tokenizer) -> List[str]:
  """The token strings of all ids, as clients pass them to CTranslate2.

  SentencePiece models: their pieces (clients tokenize with the exported `.model`).
  The synthetic tasks' integer tokenizer: the ids as decimal strings ("5 9 4".split()).
  """
  proto = getattr(tokenizer, "model_proto", None)
  if proto is not None:
    import sentencepiece as spm  # pylint: disable=import-outside-toplevel
    processor = spm.SentencePieceProcessor(model_proto=proto)
    tokens = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
  else:
    tokens = [str(i) for i in range(tokenizer.vocab_size)]
  for token_id, token in RESERVED_TOKENS.items():
    tokens[token_id] = token
  if len(set(tokens)) != len(tokens):
    raise ExportError("the vocabulary has duplicate pieces; CTranslate2 needs one string "
                      "per id")
  assert len(tokens) >= NUM_RESERVED_IDS
  return tokens


def _numpy(variable) -> np.ndarray:
  return np.asarray(variable.numpy(), dtype=np.float32)


def _set_norm(spec, norm):
  spec.gamma = _numpy(norm.gamma)
  spec.beta = _numpy(norm.beta)


def _projection(dense, heads_out: bool) -> np.ndarray:
  """A HeadDense kernel as CTranslate2's [out, in] matrix."""
  kernel = _numpy(dense.kernel)
  if heads_out:  # (D, H, K) -> (H * K, D)
    return kernel.reshape(kernel.shape[0], -1).T
  return kernel.reshape(-1, kernel.shape[-1]).T  # (H, K, D) -> (D, H * K)


def _set_attention(spec, attention, residual, self_attention: bool):
  if attention.max_relative_position:
    spec.relative_position_keys = _numpy(attention.relative_position_keys)
    spec.relative_position_values = _numpy(attention.relative_position_values)
  query = _projection(attention.query_dense, True)
  key = _projection(attention.key_dense, True)
  value = _projection(attention.value_dense, True)
  if self_attention:
    spec.linear[0].weight = np.concatenate([query, key, value])
  else:
    spec.linear[0].weight = query
    spec.linear[1].weight = np.concatenate([key, value])
  spec.linear[-1].weight = _projection(attention.output_dense, False)
  _set_norm(spec.layer_norm, residual.norm)


def _set_ffn(spec, layer):
  spec.linear_0.weight = _numpy(layer.ffn.filter_dense.kernel).T
  spec.linear_0.bias = _numpy(layer.ffn.filter_dense.bias)
  spec.linear_1.weight = _numpy(layer.ffn.output_dense.kernel).T
  spec.linear_1.bias = _numpy(layer.ffn.output_dense.bias)
  _set_norm(spec.layer_norm, layer.ffn_residual.norm)


POSITIONS = 4096  # rows of the exported position table (CTranslate2 stops beyond it)


def _positions(model, config: ModelConfig, encoder: bool) -> np.ndarray:
  """The position table: the paper's sinusoids, or the learned table padded with its
  last row (t2t_keras clamps positions beyond max_position to the last one)."""
  rows = max(POSITIONS, config.max_position)
  if config.position_embedding == "learned":
    layer = model.encoder_position if encoder else model.decoder_position
    table = _numpy(layer.position_embeddings)
    return np.concatenate([table, np.repeat(table[-1:], rows - len(table), axis=0)])
  return np.asarray(position_lib.sinusoid(np.arange(rows), config.hidden_size),
                    dtype=np.float32)


def build_spec(model, config: ModelConfig, tokens: List[str],
               target_tokens: Optional[List[str]] = None, alignment_layer: int = -1):
  """A `ctranslate2.specs.TransformerSpec` holding the model's weights.

  Args:
    model: a built, restored `Transformer`.
    config: its ModelConfig.
    tokens: the vocabulary (see `vocabulary`), the source's with separate vocabularies.
    target_tokens: the target's vocabulary when it has its own; None = `tokens`.
    alignment_layer: the decoder layer CTranslate2's alignments (`return_alignment`)
      read, head 0 of it (its `alignment_heads` = 1): a guided model's guided layer.
  """
  ct2 = _ctranslate2()
  specs = ct2.specs
  check_supported(config)
  relative = config.position_embedding == "relative"
  common = dict(pre_norm=config.pre_norm, head_dim=config.head_key_size,
                relative_position=relative)
  encoder = specs.TransformerEncoderSpec(config.encoder_layers, config.num_heads, **common)
  decoder = specs.TransformerDecoderSpec(config.decoder_layers, config.num_heads,
                                         alignment_layer=alignment_layer, **common)
  spec = specs.TransformerSpec(encoder, decoder)
  spec.config.layer_norm_epsilon = float(config.norm_epsilon)
  spec.config.unk_token = RESERVED_TOKENS[UNK_ID]
  spec.config.bos_token = RESERVED_TOKENS[BOS_ID]
  spec.config.eos_token = RESERVED_TOKENS[EOS_ID]
  spec.config.decoder_start_token = RESERVED_TOKENS[BOS_ID]
  spec.config.add_source_eos = True
  spec.register_source_vocabulary(tokens)
  spec.register_target_vocabulary(tokens if target_tokens is None else target_tokens)

  encoder.embeddings[0].weight = _numpy(model.source_embedding.embeddings)
  if not relative:
    encoder.position_encodings.encodings = _positions(model, config, encoder=True)
  for layer_spec, layer in zip(encoder.layer, model.encoder_layers):
    _set_attention(layer_spec.self_attention, layer.self_attention,
                   layer.self_attention_residual, self_attention=True)
    _set_ffn(layer_spec.ffn, layer)
  decoder.embeddings.weight = _numpy(model.target_embedding.embeddings)
  if not relative:
    decoder.position_encodings.encodings = _positions(model, config, encoder=False)
  for layer_spec, layer in zip(decoder.layer, model.decoder_layers):
    _set_attention(layer_spec.self_attention, layer.self_attention,
                   layer.self_attention_residual, self_attention=True)
    _set_attention(layer_spec.attention, layer.cross_attention,
                   layer.cross_attention_residual, self_attention=False)
    _set_ffn(layer_spec.ffn, layer)
  if config.pre_norm:
    _set_norm(encoder.layer_norm, model.encoder_norm)
    _set_norm(decoder.layer_norm, model.decoder_norm)
  decoder.projection.weight = _numpy(model.softmax_embedding.embeddings)
  return spec


def export(model, config: ModelConfig, tokenizer, export_dir: str,
           quantization: Optional[str] = None, vocab_file=None,
           force: bool = False) -> str:
  """Writes a CTranslate2 model directory: model.bin, the vocabulary, and the run's
  SentencePiece model (`vocab_file`, copied as `sentencepiece.model`) if it has one;
  with separate vocabularies (`vocab_file` the source's and the target's) both
  vocabularies and both models, as `source.model` and `target.model`.

  Args:
    model, config, tokenizer: the restored model, its ModelConfig and its tokenizer.
    export_dir: the directory to write (must not hold files unless `force`); local or
      any tf.io.gfile file system (gs://). It appears complete or not at all.
    quantization: None (float32 weights) or one of QUANTIZATIONS; CTranslate2 can also
      quantize when it loads (`compute_type`).
    vocab_file: the SentencePiece model to copy for clients, or a list of the
      source's and the target's.
    force: overwrite an existing directory.

  Returns:
    export_dir.
  """
  check_target(export_dir, quantization, force)
  spec = build_spec(model, config, vocabulary(tokenizer.source),
                    vocabulary(tokenizer.target))
  return write(spec, export_dir, quantization, vocab_file, force)


def check_target(export_dir: str, quantization: Optional[str], force: bool) -> None:
  """Refuses an unknown quantization or a non-empty `export_dir`, before any work."""
  if quantization is not None and quantization not in QUANTIZATIONS:
    raise ExportError(f"--quantization={quantization} is not one of "
                      f"{', '.join(QUANTIZATIONS)}")
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  (tf.io.gfile: gs://)
  if tf.io.gfile.isdir(export_dir) and tf.io.gfile.listdir(export_dir) and not force:
    if not tf.io.gfile.exists(os.path.join(export_dir, MODEL_FILE)):
      publish.prepare(export_dir, MODEL_FILE, "")  # raises: an interrupted export
    raise ExportError(f"{export_dir} is not empty: pick a new --export_dir (or remove it)")


def write(spec, export_dir: str, quantization: Optional[str], vocab_file,
          force: bool) -> str:
  """Writes `spec` (`build_spec`) as `export` says, after `check_target`."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  (tf.io.gfile: gs://)
  spec.validate()
  spec.optimize(quantization=quantization)
  if force and tf.io.gfile.exists(export_dir):
    tf.io.gfile.rmtree(export_dir)
  # Written whole under a hidden sibling, then published with model.bin last
  # (t2t_keras/export/publish.py): CTranslate2 never opens a half-copied directory.
  tmp = publish.prepare(export_dir, MODEL_FILE, "pick a new --export_dir (or remove it)",
                        allow_empty=True)
  tf.io.gfile.makedirs(tmp)
  with tempfile.TemporaryDirectory() as local:  # CTranslate2 writes local files only
    spec.save(local)
    if isinstance(vocab_file, (list, tuple)):
      for path, name in zip(vocab_file, ("source.model", "target.model")):
        tf.io.gfile.copy(path, os.path.join(local, name))
    elif vocab_file:
      tf.io.gfile.copy(vocab_file, os.path.join(local, "sentencepiece.model"))
    for name in os.listdir(local):
      tf.io.gfile.copy(os.path.join(local, name), os.path.join(tmp, name), overwrite=True)
  return publish.publish(tmp, export_dir, MODEL_FILE)


# The format's interface (t2t_keras/export/__init__.py: `Format`).
def default_dir(model_dir: str) -> str:
  return modeldir.default_export_dir(model_dir, ctranslate2=True)


def export_from_settings(settings: ExportSettings) -> str:
  """Restores the model (latest, checkpoint_path or average_last_n) in float32 and
  writes it as a CTranslate2 model directory (weights of `settings.quantization`)."""
  check_target(settings.export_dir, settings.quantization, False)
  loaded = loading.load(settings.model_dir, settings.weights.checkpoint_path,
                        settings.weights.average_last_n, "float32")
  tokenizer = loaded.tokenizer
  # A guided model aligns with its guided layer (--train_alignments).
  spec = build_spec(loaded.model, loaded.model_config, vocabulary(tokenizer.source),
                    vocabulary(tokenizer.target), guided_alignment_layer(settings.model_dir))
  return write(spec, settings.export_dir, settings.quantization,
               modeldir.vocab_file_of(tokenizer, settings.model_dir), False)


def guided_alignment_layer(model_dir: str) -> int:
  """The decoder layer CTranslate2 should align with: a guided model's guided layer
  (--train_alignments), else the last. CTranslate2 averages the first
  `alignment_heads` heads of that layer, so only head 0 (the default guided head)
  can be read alone: another guided head is said, not silently replaced."""
  guided = modeldir.guided_alignment_of(model_dir)
  if guided is None:
    return -1
  if guided["head"] != 0:
    logging.warning("the model's guided head is head %d of decoder layer %d, but "
                    "CTranslate2 aligns with head 0 of a layer: its alignments "
                    "(return_alignment) read head 0 of layer %d; train with "
                    "--guided_alignment_head=0 to align with CTranslate2", guided["head"],
                    guided["layer"], guided["layer"])
  return guided["layer"]


def describe(path: str, settings: ExportSettings) -> str:
  return (f"exported {path} (CTranslate2, {settings.quantization or 'float32'} weights)\n"
          f"  python tools/ct2_translate.py --model={path} --input_file=in.txt")
