"""A SavedModel for TensorFlow Serving: strings in, translations out.

The exported graph holds the whole path: UTF-8 repair, SentencePiece tokenization
(TensorFlow Text's op, which TF Serving has built in), truncation, beam search over
the key/value cache and detokenization. Nothing but TensorFlow and TensorFlow Text
ops: a client needs neither t2t_keras nor a tokenizer.

Signatures:
  serving_default: inputs string [B] -> outputs string [B] (best translation),
    scores float32 [B]; with return_beams also beams string [B, K] and beam_scores
    float32 [B, K].
  translate_ids: input_ids int32 [B, S] (ids + EOS, then any padding) -> output_ids
    int32 [B, K, T] (PAD after EOS), scores float32 [B, K]; for clients that tokenize
    themselves with assets/vocab.model (the vocabulary travels as an asset). A row
    ends at its first EOS: whatever follows is ignored, so TF Serving's batching may
    pad rows with any value (it pads with the tensor's first element).

Parsing models exported with `--constrain_trees` carry the tree constraint
(`parsing.constraint.TreeConstraint`) in both signatures: every output is a valid
linearized tree over the request's words.

With `jit_compile` (`t2t_keras.export --export_jit_compile`) the beam search is an
XLA-compiled function inside the graph (TF Serving on CPU then needs
`--xla_cpu_compilation_enabled=true`); each batch is padded to a power-of-two number of
rows and of source columns, so that few shapes are compiled. Same translations.

Odd requests: invalid UTF-8 bytes become U+FFFD; an empty string translates to
whatever the model emits for an empty source; sources longer than
`max_input_length` subwords are truncated to it (EOS included), which bounds the
memory of the cache (batch * beam * (max_input_length + extra) positions).
"""

from __future__ import annotations

import os
import time
from typing import Optional

import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras import decoding
from t2t_keras.configs import DecodeConfig
from t2t_keras.translate import MIN_XLA_WIDTH


class Translator(tf.Module):
  """The exported module: model weights, tokenizer and decoding functions."""

  def __init__(self, model, tokenizer, config: DecodeConfig, max_input_length: int,
               vocab_file: Optional[str] = None, tree_constraint=None,
               jit_compile: bool = False):
    super().__init__(name="translator")
    self.model = model
    # The tf.Variables under the Keras variables, tracked directly: TF Serving and
    # saved_model_cli load in graph (session) mode, which restores only variables the
    # SavedModel tracks as tf.Variables (as keras.export.ExportArchive does too).
    self.model_variables = [getattr(v, "value", v) for v in model.weights]
    self.tokenizer = tokenizer
    self.config = config
    self.tree_constraint = tree_constraint  # parsing: only valid trees (or None)
    self.max_input_length = int(max_input_length)
    self.jit_compile = bool(jit_compile)
    if self.jit_compile:
      # Beam search alone is compiled (the string ops stay outside: XLA has no
      # tokenizer); XLA compiles once per input shape, so batches are padded to a
      # power of two rows and `translate.padded_width` columns.
      self.decode_xla = tf.function(self._decode_padded, jit_compile=True, autograph=False)
    if vocab_file:
      self.vocab = tf.saved_model.Asset(vocab_file)
    self.serve = tf.function(self._serve, input_signature=[
        tf.TensorSpec([None], tf.string, name="inputs")], autograph=False)
    self.translate_ids = tf.function(self._translate_ids, input_signature=[
        tf.TensorSpec([None, None], tf.int32, name="input_ids")], autograph=False)

  def encode_strings(self, strings: tf.Tensor) -> tf.Tensor:
    """Strings [B] -> int32 ids [B, S] ending with EOS, truncated, PAD after."""
    strings = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace",
                                           replacement_char=0xFFFD)
    tokens = self.tokenizer.tokenize(strings)
    tokens = tokens[:, :self.max_input_length - 1]
    eos = tf.fill([tf.shape(strings)[0], 1], EOS_ID)
    return tf.concat([tf.cast(tokens, tf.int32), eos], axis=1).to_tensor(PAD_ID)

  def clean_ids(self, input_ids: tf.Tensor) -> tf.Tensor:
    """Client ids [B, W] -> ids [B, S] ending with EOS, PAD after, at most max_input_length.

    A row ends at its first EOS (or PAD); everything after it is padding, whatever its
    value: TF Serving's batching (`pad_variable_length_inputs`) pads an int32 input
    with the tensor's first element, not with 0, so a short request batched with a
    long one arrives followed by copies of a real token. A row without EOS ends at the
    width. Rows longer than max_input_length - 1 tokens are cut and EOS re-appended,
    as the string signature does.
    """
    ended = tf.cumsum(tf.cast(tf.logical_or(tf.equal(input_ids, EOS_ID),
                                            tf.equal(input_ids, PAD_ID)), tf.int32),
                      axis=1) > 0
    tokens = tf.where(ended, PAD_ID, input_ids)[:, :self.max_input_length - 1]
    lengths = tf.reduce_sum(1 - tf.cast(ended, tf.int32), axis=1)
    lengths = tf.minimum(lengths, self.max_input_length - 1)  # [B]
    width = tf.reduce_max(tf.concat([lengths, [0]], axis=0)) + 1
    tokens = tf.pad(tokens, [[0, 0], [0, 1]])[:, :width]  # [B, S]
    return tokens + tf.one_hot(lengths, width, EOS_ID, PAD_ID, dtype=tf.int32)

  def _decode(self, ids, batch):
    """ids [batch + 1, S]: the request's rows and the ride-along row (see _serve)."""
    ids = ids[:, :self.max_input_length]
    if self.jit_compile:
      # The ride-along row would double the padded rows of a power-of-two batch; XLA
      # needs it only for an empty request.
      return self._decode_bucketed(ids[:tf.maximum(batch, 1)])
    return decoding.decode_ids(self.model, ids, self.config,
                               tree_constraint=self.tree_constraint)

  def _decode_padded(self, ids):
    return decoding.decode_ids(self.model, ids, self.config, in_place_cache=True,
                               tree_constraint=self.tree_constraint)

  def _decode_bucketed(self, ids):
    """XLA export: pads ids [B, S] to [R, W] (R the next power of two >= B, W the next
    power of two >= max(S, 16)) so that few shapes are ever compiled; filler rows hold
    a lone EOS. Padding changes no translation (limits are per sentence)."""
    rows, width = tf.shape(ids)[0], tf.shape(ids)[1]
    powers = 2 ** tf.range(31)
    padded_rows = tf.reduce_min(tf.where(powers >= rows, powers, powers[-1]))
    padded_width = tf.reduce_min(tf.where(powers >= tf.maximum(width, MIN_XLA_WIDTH),
                                          powers, powers[-1]))
    ids = tf.pad(ids, [[0, padded_rows - rows], [0, padded_width - width]],
                 constant_values=PAD_ID)
    filler = tf.range(padded_rows) >= rows
    ids = tf.where(filler[:, None] & tf.equal(tf.range(padded_width), 0)[None], EOS_ID, ids)
    output_ids, scores = self.decode_xla(ids)
    return output_ids[:rows], scores[:rows]

  def _translate_ids(self, input_ids):
    batch = tf.shape(input_ids)[0]
    input_ids = tf.concat([input_ids, tf.one_hot([0], tf.shape(input_ids)[1], EOS_ID, PAD_ID,
                                                 dtype=tf.int32)], axis=0)
    output_ids, scores = self._decode(self.clean_ids(input_ids), batch)
    return {"output_ids": output_ids[:batch], "scores": scores[:batch]}

  def _serve(self, inputs):
    # One empty sentence rides along so that an empty request (B = 0) needs no special
    # graph; it is short, so it never lengthens the search.
    batch = tf.shape(inputs)[0]
    inputs = tf.concat([inputs, [""]], axis=0)
    output_ids, scores = self._decode(self.encode_strings(inputs), batch)
    texts = self.tokenizer.detokenize(output_ids)[:batch]  # [B, K]
    scores = scores[:batch]
    outputs = {"outputs": texts[:, 0], "scores": scores[:, 0]}
    if self.config.return_beams:
      outputs.update(beams=texts, beam_scores=scores)
    return outputs


def export(translator: Translator, export_dir: str, version: Optional[int] = None) -> str:
  """Writes the SavedModel to export_dir/<version>/ (TF Serving's layout).

  Args:
    translator: the module to export.
    export_dir: the model base path TF Serving watches.
    version: a positive integer; default the current Unix time, so later exports
      have higher versions and TF Serving switches to them.

  Returns:
    The versioned directory.
  """
  version = version or int(time.time())
  path = os.path.join(export_dir, str(version))
  if tf.io.gfile.exists(path):
    raise FileExistsError(f"{path} exists; pass another --export_version or remove it.")
  tmp = os.path.join(export_dir, f".tmp-{version}")
  signatures = {"serving_default": translator.serve,
                "translate_ids": translator.translate_ids}
  tf.saved_model.save(translator, tmp, signatures=signatures)
  tf.io.gfile.rename(tmp, path)  # TF Serving never sees a half-written version
  return path


def export_model_dir(model_dir: str, export_dir: str, decode_config, max_input_length: int,
                     checkpoint_path=None, average_last_n: int = 0, version: int = 0,
                     constrain_trees: bool = False, jit_compile: bool = False) -> str:
  """Loads model_dir and exports it; returns the versioned export path.

  `constrain_trees`: a parsing model's export writes only valid trees (ExportError
  for a model that is not a parsing model). `jit_compile`: beam search compiled with
  XLA (`Translator`).
  """
  # pylint: disable=import-outside-toplevel
  from t2t_keras import modeldir
  from t2t_keras.errors import ExportError
  loaded = modeldir.load(model_dir, checkpoint_path, average_last_n)
  constraint = None
  if constrain_trees:
    from t2t_keras.parsing.constraint import TreeConstraint
    try:
      constraint = TreeConstraint.from_tokenizer(
          loaded.tokenizer, loaded.data_config.parsing_linearization)
    except ValueError as error:
      raise ExportError(f"--constrain_trees with --model_dir={model_dir}: {error}") from None
  vocab = modeldir.vocab_path(model_dir)
  translator = Translator(
      loaded.model, loaded.tokenizer, decode_config, max_input_length,
      vocab_file=vocab if getattr(loaded.tokenizer, "model_proto", None) else None,
      tree_constraint=constraint, jit_compile=jit_compile)
  return export(translator, export_dir, version or None)
