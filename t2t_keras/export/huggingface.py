"""Exports a trained model to Hugging Face transformers (PyTorch, safetensors).

`python -m t2t_keras.export --format=huggingface` writes a directory that
`transformers.AutoModelForSeq2SeqLM.from_pretrained(D)` and
`AutoTokenizer.from_pretrained(D)` load. Writing it needs only numpy, safetensors and
sentencepiece; loading it needs transformers and torch (`pip install -e
".[huggingface]"`).

The architecture is chosen by what transformers' code computes, not by name
(tests/huggingface_export_test.py checks the logits of each to 1e-4):
- post-norm (the paper) -> MarianMT: post-norm layers with no final norms, embeddings
  scaled by sqrt(d_model) (`scale_embedding`), static sinusoidal positions from 0, ReLU,
  the output projection tied to the decoder's embedding (`tie_word_embeddings`), and
  separate source and target matrices and vocabularies
  (`share_encoder_decoder_embeddings=False`, `decoder_vocab_size`).
- pre-norm (`--pre_norm`) -> Pegasus: pre-norm layers, a final LayerNorm after each
  stack, the same scaled embeddings and positions; one matrix for every embedding, so
  only models with `--shared_embeddings` (one vocabulary) map.
- The sinusoid: ours interleaves sin and cos (dimension 2i sin, 2i+1 cos); transformers'
  puts the sines in the first half and the cosines in the second, at the same
  frequencies. The model dimension is permuted (`permutation`: ours 0, 2, 4, ..., 1, 3,
  ...) in every weight that reads or writes the residual stream: the embeddings (and so
  the tied output projection), the LayerNorms, each attention's query/key/value inputs
  and output, the feed-forward's input and output. The network is equivariant to a
  permutation of that dimension (LayerNorm's statistics do not depend on the order), so
  this is exact, and the position table Marian computes is then ours. (Pegasus loads
  its table from the checkpoint: ours is written, in the same layout.)
- Attention: our projections have no biases (zero biases are written); scaling
  1/sqrt(d_model / heads) in both, so models with other --key_size / --value_size are
  refused. `final_logits_bias` is zero.
- LayerNorm epsilon: transformers' Marian and Pegasus build `nn.LayerNorm(d_model)`
  with its fixed epsilon 1e-5; ours is --norm_epsilon (default 1e-6). No configuration
  changes theirs: the one difference in the computation, at most about
  (1e-5 - eps) / (2 var) of a normalized value, within the tests' 1e-4 (and models
  trained with --norm_epsilon=1e-5 are exact).
- Ids: PAD 0, EOS 1, UNK 2 and BOS 3 keep theirs; decoding starts from BOS
  (`decoder_start_token_id` 3); sources end with EOS (MarianTokenizer appends it).
- Refused, naming the flag: relative positions (--position_embedding=relative),
  learned positions (--position_embedding=learned: both architectures compute their
  sinusoids), the source pointer (--source_pointer), head sizes other than
  d_model / heads (--key_size / --value_size), and pre-norm models without one shared
  matrix (--pre_norm with --separate_vocabularies or --noshared_embeddings).

The tokenizer is transformers' `MarianTokenizer` (also for the Pegasus models: the
`tokenizer_class` of tokenizer_config.json): the run's SentencePiece model(s) as
source.spm and target.spm, and vocab.json (piece -> id) with the same ids, and
target_vocab.json with --separate_vocabularies. A target-language tag <2xx> is also
in vocab.json as Marian's `>>xx<<`: a source written ">>de<< A dog." gets the tag's id
first, as decode's --target_language=de does.

generation_config.json: beam size; `length_penalty` = alpha (exact for --alpha=0, where
both rank by the log-probability; otherwise transformers divides by length^alpha where
GNMT divides by ((5 + length) / 6)^alpha: the export says so); `max_new_tokens` =
max_input_length + extra_decode_length (transformers has no "source length + N": this
is the bound ours reaches for the longest source; `generate(max_new_tokens=source
length + N)` per sentence is ours), with EOS forced at the last position as ours
(`forced_eos_token_id`); min_decode_length -> `min_new_tokens`. transformers' beam
search keeps an ended hypothesis only when its EOS ranks among the best num_beams of a
step's 2 x num_beams candidates (tensor2tensor's: any of them), so a few translations
differ even at alpha 0, ours then of the higher log-probability.
"""

from __future__ import annotations

import datetime
import json
import os
import types
from typing import Dict, List, Optional

import numpy as np

from t2t_keras import BOS_ID, EOS_ID, PAD_ID, UNK_ID, language_tags
from t2t_keras.configs import DecodeConfig, ModelConfig
from t2t_keras.errors import ExportError
from t2t_keras.export import ExportSettings, publish
from t2t_keras.inference import loading
from t2t_keras.model.layers import position as position_lib
from t2t_keras.trained import model_card, modeldir

INSTALL_HINT = 'pip install -e ".[huggingface]"  (or: pip install transformers torch)'
WEIGHTS_FILE = "model.safetensors"  # written last: its presence marks a whole export
RESERVED_TOKENS = {PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>", BOS_ID: "<s>"}
# Rows of the position tables transformers computes (max_position_embeddings).
MAX_POSITIONS = 4096


def check_supported(config: ModelConfig) -> None:
  """Raises ExportError naming the flag of anything transformers cannot compute."""
  if config.position_embedding == "relative":
    raise ExportError("transformers' MarianMT and Pegasus have no relative positions "
                      "(this model was trained with --position_embedding=relative): "
                      "export it with --format=ctranslate2 or --format=saved_model")
  if config.position_embedding != "sinusoid":
    raise ExportError(f"--position_embedding={config.position_embedding}: transformers' "
                      "MarianMT and Pegasus compute static sinusoidal positions, not a "
                      "learned table: export it with --format=ctranslate2 or "
                      "--format=saved_model")
  if config.source_pointer:
    raise ExportError("transformers has no source pointer (this model was trained with "
                      "--source_pointer): export it with --format=saved_model")
  per_head = config.hidden_size // config.num_heads
  if (config.hidden_size % config.num_heads or config.head_key_size != per_head
      or config.head_value_size != per_head):
    raise ExportError(f"transformers' attention has heads of d_model / heads, but this "
                      f"model has keys of {config.head_key_size} and values of "
                      f"{config.head_value_size} per head (--key_size / --value_size): "
                      "export it with --format=ctranslate2 or --format=saved_model")
  if config.pre_norm and not config.shared_embeddings:
    raise ExportError("a pre-norm model (--pre_norm) maps onto transformers' Pegasus, "
                      "which has one embedding matrix for source, target and output: "
                      "this model has its own (--separate_vocabularies or "
                      "--noshared_embeddings); export it with --format=ctranslate2 or "
                      "--format=saved_model")


def architecture(config: ModelConfig) -> str:
  """The transformers model type that computes `config`'s network."""
  return "pegasus" if config.pre_norm else "marian"


def permutation(hidden_size: int) -> np.ndarray:
  """Our model dimension in transformers' order: P[i] is our dimension of theirs i.

  Our sinusoid has sin at even and cos at odd dimensions; theirs has the sines first
  (the same frequencies in the same order), then the cosines."""
  dims = np.arange(hidden_size)
  return np.concatenate([dims[0::2], dims[1::2]])


def _numpy(variable) -> np.ndarray:
  return np.asarray(variable.numpy(), dtype=np.float32)


def state_dict(model, config: ModelConfig, permute: bool = True) -> Dict[str, np.ndarray]:
  """The model's weights under transformers' names, as (out, in) matrices.

  Args:
    model: a built, restored `Transformer`.
    config: its ModelConfig (`check_supported`).
    permute: apply `permutation` (False only to show a test that it is needed).
  """
  check_supported(config)
  size = config.hidden_size
  p = permutation(size) if permute else np.arange(size)
  weights = {}

  def norm(name, layer):
    weights[f"{name}.weight"] = _numpy(layer.gamma)[p]
    weights[f"{name}.bias"] = _numpy(layer.beta)[p]

  def attention(name, layer):
    for ours, theirs in ((layer.query_dense, "q_proj"), (layer.key_dense, "k_proj"),
                         (layer.value_dense, "v_proj")):
      kernel = _numpy(ours.kernel).reshape(size, -1)  # (D, H, K) -> (D, H * K)
      weights[f"{name}.{theirs}.weight"] = np.ascontiguousarray(kernel[p].T)
      weights[f"{name}.{theirs}.bias"] = np.zeros(kernel.shape[1], np.float32)
    kernel = _numpy(layer.output_dense.kernel).reshape(-1, size)  # (H, K, D) -> (H*K, D)
    weights[f"{name}.out_proj.weight"] = np.ascontiguousarray(kernel[:, p].T)
    weights[f"{name}.out_proj.bias"] = np.zeros(size, np.float32)

  def ffn(name, layer):
    weights[f"{name}.fc1.weight"] = np.ascontiguousarray(
        _numpy(layer.ffn.filter_dense.kernel)[p].T)
    weights[f"{name}.fc1.bias"] = _numpy(layer.ffn.filter_dense.bias)
    weights[f"{name}.fc2.weight"] = np.ascontiguousarray(
        _numpy(layer.ffn.output_dense.kernel)[:, p].T)
    weights[f"{name}.fc2.bias"] = _numpy(layer.ffn.output_dense.bias)[p]

  for i, layer in enumerate(model.encoder_layers):
    name = f"model.encoder.layers.{i}"
    attention(f"{name}.self_attn", layer.self_attention)
    norm(f"{name}.self_attn_layer_norm", layer.self_attention_residual.norm)
    ffn(name, layer)
    norm(f"{name}.final_layer_norm", layer.ffn_residual.norm)
  for i, layer in enumerate(model.decoder_layers):
    name = f"model.decoder.layers.{i}"
    attention(f"{name}.self_attn", layer.self_attention)
    norm(f"{name}.self_attn_layer_norm", layer.self_attention_residual.norm)
    attention(f"{name}.encoder_attn", layer.cross_attention)
    norm(f"{name}.encoder_attn_layer_norm", layer.cross_attention_residual.norm)
    ffn(name, layer)
    norm(f"{name}.final_layer_norm", layer.ffn_residual.norm)
  if config.pre_norm:  # Pegasus' final norms
    norm("model.encoder.layer_norm", model.encoder_norm)
    norm("model.decoder.layer_norm", model.decoder_norm)
    # Pegasus checkpoints hold their position tables (Marian's leave them out, and
    # Marian computes them): ours, in transformers' layout, which is its own formula.
    table = np.asarray(position_lib.sinusoid(np.arange(MAX_POSITIONS), size),
                       dtype=np.float32)[:, p]
    for stack in ("encoder", "decoder"):
      weights[f"model.{stack}.embed_positions.weight"] = np.ascontiguousarray(table)

  def embedding(layer):
    return np.ascontiguousarray(_numpy(layer.embeddings)[:, p])

  if config.shared_embeddings:  # tied: the encoder's, decoder's and output's
    weights["model.shared.weight"] = embedding(model.source_embedding)
  else:
    weights["model.encoder.embed_tokens.weight"] = embedding(model.source_embedding)
    weights["model.decoder.embed_tokens.weight"] = embedding(model.target_embedding)
    if not config.shared_decoder_embeddings:
      weights["lm_head.weight"] = embedding(model.softmax_embedding)
  weights["final_logits_bias"] = np.zeros((1, config.output_vocab_size), np.float32)
  return weights


def model_config(config: ModelConfig) -> dict:
  """config.json: transformers' configuration of the same network."""
  check_supported(config)
  kind = architecture(config)
  common = {
      "model_type": kind,
      "architectures": ["PegasusForConditionalGeneration" if kind == "pegasus"
                        else "MarianMTModel"],
      "vocab_size": config.vocab_size,
      "d_model": config.hidden_size,
      "encoder_layers": config.encoder_layers,
      "decoder_layers": config.decoder_layers,
      "encoder_attention_heads": config.num_heads,
      "decoder_attention_heads": config.num_heads,
      "encoder_ffn_dim": config.filter_size,
      "decoder_ffn_dim": config.filter_size,
      "activation_function": "relu",
      "scale_embedding": True,
      "max_position_embeddings": MAX_POSITIONS,
      # Training's rates, for fine-tuning; inference (model.eval()) drops none.
      "dropout": config.layer_prepostprocess_dropout,
      "attention_dropout": config.attention_dropout,
      "activation_dropout": config.relu_dropout,
      "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID,
      "decoder_start_token_id": BOS_ID, "forced_eos_token_id": EOS_ID,
      "is_encoder_decoder": True,
      "tie_word_embeddings": config.shared_embeddings or config.shared_decoder_embeddings,
      "dtype": "float32",
  }
  if kind == "marian":
    common.update(decoder_vocab_size=config.output_vocab_size,
                  share_encoder_decoder_embeddings=config.shared_embeddings)
  return common


def generation_config(decode: DecodeConfig) -> dict:
  """generation_config.json: the recipe's beam search (see the module docstring)."""
  generation = {
      "decoder_start_token_id": BOS_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID,
      "pad_token_id": PAD_ID, "forced_eos_token_id": EOS_ID,
      "num_beams": decode.beam_size, "do_sample": False,
      "length_penalty": float(decode.alpha),
      "max_new_tokens": decode.max_input_length + decode.extra_decode_length,
  }
  if decode.min_decode_length:
    generation["min_new_tokens"] = decode.min_decode_length
  return generation


def _pieces(model_proto: bytes) -> List[str]:
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  processor = spm.SentencePieceProcessor(model_proto=model_proto)
  pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
  for token_id, token in RESERVED_TOKENS.items():
    pieces[token_id] = token
  return pieces


def vocabulary(model_proto: bytes, languages=()) -> Dict[str, int]:
  """vocab.json: piece -> id of a SentencePiece model, and Marian's `>>xx<<` for the
  id of each target-language tag <2xx> it holds."""
  pieces = _pieces(model_proto)
  vocab = {piece: i for i, piece in enumerate(pieces)}
  if len(vocab) != len(pieces):
    raise ExportError("the vocabulary has duplicate pieces; transformers' tokenizer "
                      "needs one string per id")
  for language in languages:
    tag = language_tags.tag(language)
    if tag in vocab:
      vocab[f">>{language}<<"] = vocab[tag]
  return vocab


def tokenizer_files(tokenizer, languages=(), max_input_length: int = 256
                    ) -> Dict[str, bytes]:
  """The files of a MarianTokenizer (name -> contents); {} for the synthetic tasks'
  integer tokenizer (no SentencePiece model to give)."""
  source, target = tokenizer.source.model_proto, tokenizer.target.model_proto
  if source is None:
    return {}
  separate = tokenizer.source is not tokenizer.target
  files = {"source.spm": source, "target.spm": target,
           "vocab.json": _json(vocabulary(source, languages))}
  if separate:
    files["target_vocab.json"] = _json(vocabulary(target))
  special = {"pad_token": RESERVED_TOKENS[PAD_ID], "eos_token": RESERVED_TOKENS[EOS_ID],
             "unk_token": RESERVED_TOKENS[UNK_ID], "bos_token": RESERVED_TOKENS[BOS_ID]}
  files["tokenizer_config.json"] = _json({
      "tokenizer_class": "MarianTokenizer", "separate_vocabs": separate,
      # `tokenizer(texts, truncation=True)` cuts sources as --max_input_length does
      # (EOS included).
      "model_max_length": max_input_length, **special})
  files["special_tokens_map.json"] = _json(special)
  return files


def _json(value) -> bytes:
  return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def model_card_readme(card: dict, config: ModelConfig, languages=()) -> str:
  """README.md: the Hub's front matter, how to use the model, and the model card of a
  SavedModel export (t2t_keras/trained/model_card.py) as JSON."""
  kind = architecture(config)
  tag = f">>{languages[0]}<< " if languages else ""
  # The card's own lines, without the SavedModel's path of its JSON file.
  described = (model_card.describe(card).replace(f" ({model_card.CARD_FILE})", "", 1)
               if card else "(none: exported from a model in memory)")
  return f"""---
library_name: transformers
pipeline_tag: translation
tags:
- t2t_keras
- {kind}
---

# A t2t_keras Transformer in transformers ({kind})

Trained with t2t_keras and exported with `python -m t2t_keras.export --format=huggingface`:
the same network as transformers' {kind} architecture (its weights mapped exactly; see
t2t_keras/export/huggingface.py), with the run's SentencePiece vocabulary as a
`MarianTokenizer`.

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
path = "."  # this directory, or its repository id on the Hub
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForSeq2SeqLM.from_pretrained(path)
batch = tokenizer(["{tag}A dog runs in the park."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```
{"A multilingual model: start each source with the target language, " + ", ".join(
    f"`>>{language}<<`" for language in languages) + "." if languages else ""}

Decoding (generation_config.json) is the recipe's beam search, except that
transformers' `length_penalty` divides a hypothesis' log-probability by length^alpha
where t2t_keras divides by ((5 + length) / 6)^alpha (the same ranking at alpha 0), and
`max_new_tokens` is a fixed bound where t2t_keras allows the source's length +
extra_decode_length.

## Model card

```
{described}
```

```json
{json.dumps(card, indent=2, sort_keys=True, default=str)}
```
"""


def write(weights: Dict[str, np.ndarray], files: Dict[str, bytes], export_dir: str,
          force: bool = False) -> str:
  """Writes the directory: `files`, then the weights last (published whole)."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # tf.io.gfile: gs://
  from safetensors.numpy import save as save_safetensors
  check_target(export_dir, force)
  if force and tf.io.gfile.exists(export_dir):
    tf.io.gfile.rmtree(export_dir)
  tmp = publish.prepare(export_dir, WEIGHTS_FILE, "pick a new --export_dir (or remove it)",
                        allow_empty=True)
  tf.io.gfile.makedirs(tmp)
  files = dict(files)
  files[WEIGHTS_FILE] = save_safetensors(weights, metadata={"format": "pt"})
  for name, contents in files.items():
    with tf.io.gfile.GFile(os.path.join(tmp, name), "wb") as f:
      f.write(contents)
  return publish.publish(tmp, export_dir, WEIGHTS_FILE)


def check_target(export_dir: str, force: bool = False) -> None:
  """Refuses a non-empty `export_dir`, before any work."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if tf.io.gfile.isdir(export_dir) and tf.io.gfile.listdir(export_dir) and not force:
    if not tf.io.gfile.exists(os.path.join(export_dir, WEIGHTS_FILE)):
      publish.prepare(export_dir, WEIGHTS_FILE, "")  # raises: an interrupted export
    raise ExportError(f"{export_dir} is not empty: pick a new --export_dir (or remove it)")


def export(model, config: ModelConfig, tokenizer, export_dir: str,
           decode: DecodeConfig = DecodeConfig(), languages=(),
           card: Optional[dict] = None, force: bool = False) -> str:
  """Writes a transformers model directory for a restored model.

  Args:
    model, config, tokenizer: the restored model, its ModelConfig and its tokenizer.
    export_dir: the directory to write (local or gs://); it appears whole or not at all.
    decode: the decoding settings generation_config.json carries.
    languages: the target languages of a multilingual model (their tags).
    card: the model card (`model_card.build`); None writes a README without one.
    force: overwrite an existing directory.

  Returns:
    export_dir.
  """
  check_supported(config)
  check_target(export_dir, force)
  files = tokenizer_files(tokenizer, languages, decode.max_input_length)
  files["config.json"] = _json(model_config(config))
  files["generation_config.json"] = _json(generation_config(decode))
  files["README.md"] = model_card_readme(card or {}, config, list(languages)).encode()
  return write(state_dict(model, config), files, export_dir, force)


# The format's interface (t2t_keras/export/__init__.py: `Format`).
def default_dir(model_dir: str) -> str:
  return os.path.join(model_dir, "huggingface")


def export_from_settings(settings: ExportSettings) -> str:
  """Restores the model (latest, checkpoint_path or average_last_n) in float32 and
  writes it as a transformers model directory."""
  # pylint: disable=import-outside-toplevel
  from absl import logging
  check_target(settings.export_dir)
  loaded = loading.load(settings.model_dir, settings.weights.checkpoint_path,
                        settings.weights.average_last_n, "float32")
  check_supported(loaded.model_config)
  decode = settings.decode_config
  if decode.alpha:
    logging.warning("--alpha=%g: transformers' length_penalty divides by length^%g, not "
                    "by GNMT's ((5 + length) / 6)^%g: generate ranks some beams "
                    "differently (--alpha=0 ranks as t2t_keras does)", decode.alpha,
                    decode.alpha, decode.alpha)
  languages = language_tags.languages(modeldir.data_config_of(settings.model_dir))
  translator = types.SimpleNamespace(
      model=loaded.model, config=decode, max_input_length=decode.max_input_length,
      tree_constraint=None, jit_compile=False)
  card = model_card.build(translator, settings.model_dir, loaded.checkpoints,
                          now=datetime.datetime.now(datetime.UTC))
  card["format"] += f"; exported as transformers {architecture(loaded.model_config)}"
  return export(loaded.model, loaded.model_config, loaded.tokenizer, settings.export_dir,
                decode, languages, card)


def describe(path: str, settings: ExportSettings) -> str:
  del settings
  return (f"exported {path} (transformers, PyTorch safetensors)\n"
          f"  AutoModelForSeq2SeqLM.from_pretrained({path!r}), "
          f"AutoTokenizer.from_pretrained({path!r})")

