"""Attention weights of one translation, for pictures like the paper's Figures 3-5.

`attention_maps` translates a sentence (beam search), then re-runs the model with
teacher forcing on its own output to collect, per layer, the encoder self-attention,
decoder self-attention and encoder-decoder attention probabilities of every head.
`plot_maps` draws one PNG per (kind, layer) with one heatmap per head and the
subword tokens on the axes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import List

import numpy as np
import tensorflow as tf

from t2t_keras import EOS_ID
from t2t_keras.inference import decoding, translate
from t2t_keras.configs import DecodeConfig


@dataclasses.dataclass
class AttentionMaps:
  """Tokens and per-layer attention probabilities, each (heads, queries, keys)."""

  source_tokens: List[str]
  target_tokens: List[str]
  translation: str
  encoder: List[np.ndarray]  # (H, S, S)
  decoder: List[np.ndarray]  # (H, T, T)
  cross: List[np.ndarray]    # (H, T, S)


def pieces(tokenizer, ids) -> List[str]:
  """Readable subword strings of ids (SentencePiece pieces, or the ids themselves)."""
  proto = getattr(tokenizer, "model_proto", None)
  if proto is None:
    return ["</s>" if i == EOS_ID else str(i) for i in ids]
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  processor = spm.SentencePieceProcessor(model_proto=proto)
  return [processor.id_to_piece(int(i)) for i in ids]


def attention_maps(model, tokenizer, sentence: str, config: DecodeConfig) -> AttentionMaps:
  """Translates `sentence` with the settings `config` (its source cut to
  `config.max_input_length`) and returns the attention of every layer and head."""
  ids = list(tokenizer.tokenize(tf.constant([sentence])).to_list()[0]) + [EOS_ID]
  limit = config.max_input_length
  if limit and len(ids) > limit:
    ids = ids[:limit - 1] + [EOS_ID]
  inputs = tf.constant([ids], tf.int32)
  output_ids, _ = decoding.decode_ids(model, inputs, config)
  target = translate.strip_ids(output_ids[0, 0].numpy()) + [EOS_ID]
  encoded, mask, encoder_maps = model.encode(inputs, training=False, return_attention=True)
  _, decoder_maps = model.decode(tf.constant([target], tf.int32), encoded, mask,
                                 training=False, return_attention=True, inputs=inputs)
  translation = tokenizer.detokenize(tf.constant([target], tf.int32)).numpy()[0].decode(
      "utf-8", "replace")
  return AttentionMaps(
      source_tokens=pieces(tokenizer.source, ids),
      target_tokens=pieces(tokenizer.target, target),
      translation=translation,
      encoder=[np.asarray(m[0], np.float32) for m in encoder_maps],
      decoder=[np.asarray(self_map[0], np.float32) for self_map, _ in decoder_maps],
      cross=[np.asarray(cross_map[0], np.float32) for _, cross_map in decoder_maps])


KINDS = {"encoder": ("encoder self-attention", "source_tokens", "source_tokens"),
         "decoder": ("decoder self-attention", "target_tokens", "target_tokens"),
         "cross": ("encoder-decoder attention", "target_tokens", "source_tokens")}


def plot_maps(maps: AttentionMaps, output_dir: str, dpi: int = 100) -> List[str]:
  """Writes <output_dir>/<kind>_layer<i>.png (one heatmap per head); returns paths."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  os.makedirs(output_dir, exist_ok=True)
  paths = []
  for kind, (title, query_attr, key_attr) in KINDS.items():
    queries, keys = getattr(maps, query_attr), getattr(maps, key_attr)
    for layer, probs in enumerate(getattr(maps, kind)):
      heads = probs.shape[0]
      cols = min(heads, 4)
      rows = (heads + cols - 1) // cols
      cell = max(2.5, 0.28 * max(len(queries), len(keys)))
      fig, axes = plt.subplots(rows, cols, figsize=(cell * cols, cell * rows + 0.6),
                               squeeze=False)
      for head in range(rows * cols):
        ax = axes[head // cols][head % cols]
        if head >= heads:
          ax.axis("off")
          continue
        ax.imshow(probs[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {head}", fontsize=9)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(keys, rotation=90, fontsize=7)
        ax.set_yticks(range(len(queries)))
        ax.set_yticklabels(queries, fontsize=7)
      fig.suptitle(f"{title}, layer {layer}", fontsize=11)
      fig.tight_layout()
      path = os.path.join(output_dir, f"{kind}_layer{layer}.png")
      fig.savefig(path, dpi=dpi)
      plt.close(fig)
      paths.append(path)
  return paths
