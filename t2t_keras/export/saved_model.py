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
    int32 [B, K, T] (PAD after EOS), scores float32 [B, K], K the beam size with
    return_beams and 1 without (the search's final results only); for clients that tokenize
    themselves with assets/vocab.model (the vocabulary travels as an asset; with
    separate vocabularies assets/vocab.source.model tokenizes the inputs and
    assets/vocab.target.model detokenizes the outputs). A row
    ends at its first EOS: whatever follows is ignored, so TF Serving's batching may
    pad rows with any value (it pads with the tensor's first element).
  translate_with_prefix: inputs string [B] and target_prefix string [B] -> the outputs
    of serving_default, each starting with its row's prefix (an empty prefix decodes
    freely), the search continuing after it, as CTranslate2's `target_prefix`
    (interactive translation, terminology); graph mode in every export.
  translate_to_language (multilingual models, `--target_language_tags` at training):
    inputs string [B] and target_language string [B] ("de", "en", ...) -> the outputs
    of serving_default, each row translated into its language (its tag starts the
    source, language_tags.py; an unknown language is INVALID_ARGUMENT naming the
    model's languages). serving_default and translate_with_prefix translate into the
    export's `--target_language` (default: the dev files'); translate_ids clients put
    the tag id (the piece `<2xx>` of assets/vocab.model) first themselves.

Parsing models exported with `--constrain_trees` carry the tree constraint
(`parsing.constraint.TreeConstraint`) in both signatures: every output is a valid
linearized tree over the request's words.

With `jit_compile` (`python -m t2t_keras.export --export_jit_compile`) the beam search is an
XLA-compiled function inside the graph (TF Serving on CPU then needs
`--xla_cpu_compilation_enabled=true`) for requests of at most `xla_max_rows` rows
(`--export_xla_max_rows`), which it serves with the lowest latency; larger requests
take the graph-mode search, whose finished sentences leave the batch. Each XLA batch is
padded to a power-of-two number of rows and of source columns, so that few shapes are
compiled. Same translations either way. Such
an export carries TF Serving's warm-up file (`assets.extra/tf_serving_warmup_requests`,
`PredictionLog` records): one request per (rows, width) program a request within the
limits can need, which the server replays at load, compiling every program before it
reports the model available, so no request waits for a compilation.

Per-request limits (`RequestLimits`, fixed at export, written to
`assets.extra/t2t_keras.json`): rows per request, bytes per string (ids per row for
translate_ids) and source tokens per request (rows x the longest row, after the cut to
`max_input_length`: the batch is padded to its longest row, so this is what sizes the
encoder's work and the key/value cache). A request over a limit fails with
INVALID_ARGUMENT naming the limit, its flag and the request's value; the row and byte
limits are checked before any tokenization (TensorFlow ops run in dependency order,
so the checks are control dependencies of the first string op), the token limit
before the beam search. translate_ids also refuses ids outside [0, vocab_size) before
a row's first EOS (ids after it are padding and ignored). The session goes on serving
the next request.

Odd requests: invalid UTF-8 bytes become U+FFFD; an empty string translates to
whatever the model emits for an empty source; sources longer than
`max_input_length` subwords are truncated to it (EOS included), which bounds the
memory of the cache (batch * beam * (max_input_length + extra) positions).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Optional

import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.trained import model_card, modeldir
from t2t_keras import language_tags
from t2t_keras.inference import decoding, loading
from t2t_keras.configs import DecodeConfig
from t2t_keras.errors import ExportError
from t2t_keras.export import ExportSettings, publish
from t2t_keras.parsing.constraint import TreeConstraint


@dataclasses.dataclass(frozen=True)
class RequestLimits:
  """What one request to an export may hold; over a limit it gets INVALID_ARGUMENT.

  The defaults bound a request to what a CPU server decodes in seconds and keep a
  merged batch of TF Serving's batching (`max_batch_size` 64, BUILD.md) within them:
  64 rows x `--max_input_length` 256 = 16,384 tokens. Under server-side batching the
  limits apply to the merged batch: keep `max_batch_size` <= max_rows and
  max_batch_size x max_input_length <= max_tokens.
  """

  max_rows: int = 256  # sentences (rows) per request
  max_string_bytes: int = 16384  # bytes per string; ids per row for translate_ids
  max_tokens: int = 16384  # rows x longest row in subwords (EOS included, after the cut)

  FLAG_NAMES = {"max_rows": "--max_request_rows", "max_string_bytes": "--max_string_bytes",
                "max_tokens": "--max_request_tokens"}

  def validate(self) -> "RequestLimits":
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{self.FLAG_NAMES[field.name]}={value} must be a positive integer.")
    return self


LIMITS_FILE = os.path.join("assets.extra", "t2t_keras.json")  # in the version directory
# TF Serving replays this file's requests when it loads a version (SavedModel warm-up).
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
SAVED_MODEL_FILE = "saved_model.pb"  # what every SavedModel reader opens first


def _check(condition, template: str, *values):
  """An assert op whose message is `template` formatted with the request's values."""
  return tf.debugging.Assert(condition, [tf.strings.format(template, values)], summarize=1)


class Translator(tf.Module):
  """The exported module: model weights, tokenizer and decoding functions."""

  def __init__(self, model, tokenizer, config: DecodeConfig, *,
               vocab_file=None, tree_constraint=None,
               jit_compile: bool = False, limits: Optional[RequestLimits] = None,
               data_config=None, xla_max_rows: int = 0):
    """Args: `config` the inference settings the export carries (`Format.carries`:
    sources cut to `config.max_input_length`, serving_default translating into
    `config.target_language`, default the dev files'); `jit_compile` the XLA beam
    search (`--export_jit_compile`; `config.jit_compile` is the decode command's) for
    requests of at most `xla_max_rows` rows, larger ones in graph mode (0: all);
    `tree_constraint` the `TreeConstraint` of `config.constrain_trees`; `vocab_file`
    the SentencePiece model carried as an asset, or the source's and the target's
    (a pair, separate vocabularies: `tokenizer` is then a `PairTokenizer`, which
    tokenizes with the source's and detokenizes with the target's)."""
    super().__init__(name="translator")
    # A multilingual model's target languages: name -> tag id (language_tags.py).
    self.languages = [] if data_config is None else language_tags.languages(data_config)
    self.default_tag = None
    target_language = config.target_language
    if data_config is not None:
      try:
        target_language = language_tags.check_request(target_language, data_config,
                                                      "--target_language")
      except ValueError as error:
        raise ExportError(str(error)) from None
    if self.languages:
      ids = [tokenizer.tag_id(language) for language in self.languages]
      self.default_tag = ids[self.languages.index(target_language)]
      self.tag_table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
          tf.constant(self.languages), tf.constant(ids, tf.int32)), default_value=-1)
    self.model = model
    self.limits = (limits or RequestLimits()).validate()
    self.vocab_size = int(model.model_config.vocab_size)
    # The tf.Variables under the Keras variables, tracked directly: TF Serving and
    # saved_model_cli load in graph (session) mode, which restores only variables the
    # SavedModel tracks as tf.Variables (as keras.export.ExportArchive does too).
    self.model_variables = [getattr(v, "value", v) for v in model.weights]
    self.tokenizer = tokenizer
    self.config = config
    self.tree_constraint = tree_constraint  # parsing: only valid trees (or None)
    self.max_input_length = int(config.max_input_length)
    self.jit_compile = bool(jit_compile)
    self.xla_max_rows = min(int(xla_max_rows) or self.limits.max_rows, self.limits.max_rows)
    # The graph-mode search, and the XLA one: fixed shapes, a request one batch of at
    # most xla_max_rows rows (padded to a power of two), which caps its halvings.
    self.graph_config = dataclasses.replace(config, jit_compile=False)
    self._searches = _Searches()
    self.xla_config = dataclasses.replace(
        config, jit_compile=True,
        batch_size=decoding.padded_width(self.xla_max_rows, minimum=1))
    if self.jit_compile:
      # Beam search alone is compiled (the string ops stay outside: XLA has no
      # tokenizer); XLA compiles once per input shape, so batches are padded to a
      # power of two rows and `decoding.padded_width` columns.
      self.decode_xla = tf.function(self._decode_padded, jit_compile=True, autograph=False)
    if isinstance(vocab_file, (list, tuple)):
      self.vocab_source, self.vocab_target = (tf.saved_model.Asset(f) for f in vocab_file)
    elif vocab_file:
      self.vocab = tf.saved_model.Asset(vocab_file)
    self.serve = tf.function(self._serve, input_signature=[
        tf.TensorSpec([None], tf.string, name="inputs")], autograph=False)
    self.translate_ids = tf.function(self._translate_ids, input_signature=[
        tf.TensorSpec([None, None], tf.int32, name="input_ids")], autograph=False)
    self.serve_with_prefix = tf.function(self._serve_with_prefix, input_signature=[
        tf.TensorSpec([None], tf.string, name="inputs"),
        tf.TensorSpec([None], tf.string, name="target_prefix")], autograph=False)
    if self.languages:
      self.serve_to_language = tf.function(self._serve_to_language, input_signature=[
          tf.TensorSpec([None], tf.string, name="inputs"),
          tf.TensorSpec([None], tf.string, name="target_language")], autograph=False)

  def check_shape(self, inputs: tf.Tensor, what: str, widths: tf.Tensor) -> tf.Tensor:
    """`inputs` once its rows and the widths of its rows are within the limits.

    Args:
      inputs: the request's tensor (rows first).
      what: how the width is measured, for the message ("bytes", "ids").
      widths: int32 [B] (strings: their lengths in bytes) or a scalar (ids: the width).
    """
    limits = self.limits
    rows = tf.shape(inputs)[0]
    widest = tf.reduce_max(tf.concat([tf.reshape(widths, [-1]), [0]], axis=0))
    checks = [
        _check(rows <= limits.max_rows,
               f"request of {{}} rows: this export takes at most {limits.max_rows} rows "
               f"per request (export flag {RequestLimits.FLAG_NAMES['max_rows']}); send fewer",
               rows),
        _check(widest <= limits.max_string_bytes,
               f"request with a row of {{}} {what}: this export takes at most "
               f"{limits.max_string_bytes} {what} per row (export flag "
               f"{RequestLimits.FLAG_NAMES['max_string_bytes']}); split the text", widest)]
    with tf.control_dependencies(checks):
      return tf.identity(inputs)

  def check_tokens(self, ids: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    """ids [max(batch, 1), S] once batch x S (rows x longest row) is within the limit."""
    tokens = batch * tf.shape(ids)[1]
    check = _check(tokens <= self.limits.max_tokens,
                   f"request of {{}} rows x {{}} tokens (its longest row, cut to "
                   f"{self.max_input_length}) = {{}} source tokens: this export takes at "
                   f"most {self.limits.max_tokens} (export flag "
                   f"{RequestLimits.FLAG_NAMES['max_tokens']}); send fewer or shorter rows",
                   batch, tf.shape(ids)[1], tokens)
    with tf.control_dependencies([check]):
      return tf.identity(ids)

  def encode_strings(self, strings: tf.Tensor, tags: Optional[tf.Tensor] = None
                     ) -> tf.Tensor:
    """Strings [B] -> int32 ids [B, S] ending with EOS, truncated, PAD after; a
    multilingual model's sources start with `tags` [B] (default: the default
    language's tag), counted in max_input_length."""
    strings = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace",
                                           replacement_char=0xFFFD)
    tokens = tf.cast(self.tokenizer.tokenize(strings), tf.int32)
    if self.default_tag is not None:
      if tags is None:
        tags = tf.fill([tf.shape(strings)[0]], self.default_tag)
      tokens = tf.concat([tf.RaggedTensor.from_tensor(tags[:, None]), tokens], axis=1)
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
    """ids [max(batch, 1), S]: the request's rows, or the row an empty request decodes
    (`_stand_ins`)."""
    del batch  # the rows say it
    ids = ids[:, :self.max_input_length]
    if not self.jit_compile:
      return self._decode_in_halves(ids)
    if self.xla_max_rows >= self.limits.max_rows:
      return self._decode_bucketed(ids)
    return tf.cond(tf.shape(ids)[0] <= self.xla_max_rows,
                   lambda: self._decode_bucketed(ids), lambda: self._decode_in_halves(ids))

  def _decode_in_halves(self, ids, target_prefix=None):
    """Graph mode: the rows in length order, searched as two independent halves that
    TensorFlow runs side by side, as the decode command keeps two batches in flight
    (--decode_parallel_batches): one search's ops are too small to keep both cores of
    a CPU busy. Every sentence's search is its own (its limit, its beams, its early
    stop), so the translations are those of one search over all rows; a one-row
    request leaves the second half empty, which costs a few milliseconds."""
    rows = tf.shape(ids)[0]
    order = tf.argsort(tf.reduce_sum(tf.cast(tf.not_equal(ids, PAD_ID), tf.int32), axis=1),
                       stable=True)
    halves = []
    for part in (order[:rows - rows // 2], order[rows - rows // 2:]):
      options = {"keys": part} if self.graph_config.sampling else {}
      if target_prefix is not None:
        options["target_prefix"] = tf.gather(target_prefix, part)
      halves.append(self._search(tf.gather(ids, part), **options))
    width = tf.maximum(tf.shape(halves[0][0])[2], tf.shape(halves[1][0])[2])
    output_ids = tf.concat([tf.pad(out, [[0, 0], [0, 0], [0, width - tf.shape(out)[2]]],
                                   constant_values=PAD_ID) for out, _ in halves], axis=0)
    scores = tf.concat([score for _, score in halves], axis=0)
    inverse = tf.math.invert_permutation(order)
    return tf.gather(output_ids, inverse), tf.gather(scores, inverse)

  def _search(self, ids, **options):
    """The graph-mode search of ids [B, S] (`decoding.decode_ids`, with its `options`),
    as one function per set of options that every half of every signature calls: traced
    and written into the SavedModel once, not once per call (six times: two halves in
    each of three signatures). TensorFlow inlines the calls, so each still runs as its
    own ops, side by side."""
    names = tuple(sorted(options))
    search = self._searches.functions.get(names)
    if search is None:
      def run(ids, *values):
        return decoding.decode_ids(self.model, ids, self.graph_config, self.tree_constraint,
                                   **dict(zip(names, values)))
      specs = [tf.TensorSpec([None, None], tf.int32, name="ids")] + [
          tf.TensorSpec([None] if name == "keys" else [None, None], tf.int32, name=name)
          for name in names]
      search = tf.function(run, input_signature=specs, autograph=False)
      self._searches.functions[names] = search
    return search(ids, *(tf.cast(options[name], tf.int32) for name in names))

  def _decode_padded(self, ids):
    return decoding.decode_ids(self.model, ids, self.xla_config, self.tree_constraint)

  def _decode_bucketed(self, ids):
    """XLA export: pads ids [B, S] to [R, W] (R the next power of two >= B, W the next
    power of two >= max(S, 16)) so that few shapes are ever compiled; filler rows are
    PAD alone, which `decode_ids` ends at step 0 (a lone EOS, an empty sentence, could
    run to its length limit). Padding changes no translation (limits are per
    sentence)."""
    rows, width = tf.shape(ids)[0], tf.shape(ids)[1]
    powers = 2 ** tf.range(31)
    padded_rows = tf.reduce_min(tf.where(powers >= rows, powers, powers[-1]))
    padded_width = tf.reduce_min(tf.where(powers >= tf.maximum(width, decoding.MIN_XLA_WIDTH),
                                          powers, powers[-1]))
    ids = tf.pad(ids, [[0, padded_rows - rows], [0, padded_width - width]],
                 constant_values=PAD_ID)
    output_ids, scores = self.decode_xla(ids)
    return output_ids[:rows], scores[:rows]

  def check_ids(self, input_ids: tf.Tensor) -> tf.Tensor:
    """input_ids once every id before its row's first EOS (or PAD) is in the vocabulary."""
    ended = tf.cumsum(tf.cast(tf.logical_or(tf.equal(input_ids, EOS_ID),
                                            tf.equal(input_ids, PAD_ID)), tf.int32),
                      axis=1) > 0
    # The lowest and highest id before the rows' ends (sentinels when there is none).
    low = tf.reduce_min(tf.concat([tf.reshape(tf.where(ended, tf.int32.max, input_ids),
                                              [-1]), [tf.int32.max]], 0))
    high = tf.reduce_max(tf.concat([tf.reshape(tf.where(ended, tf.int32.min, input_ids),
                                               [-1]), [tf.int32.min]], 0))
    check = _check((low >= 0) & (high < self.vocab_size),
                   f"request with ids from {{}} to {{}}: ids must be in [0, "
                   f"{self.vocab_size}) (the vocabulary of assets/vocab.model) before "
                   "the first EOS of each row", low, high)
    with tf.control_dependencies([check]):
      return tf.identity(input_ids)

  def _translate_ids(self, input_ids):
    input_ids = self.check_ids(self.check_shape(input_ids, "ids",
                                                tf.shape(input_ids)[1]))
    batch = tf.shape(input_ids)[0]
    input_ids = tf.concat([input_ids, tf.one_hot(tf.zeros([_stand_ins(batch)], tf.int32),
                                                 tf.shape(input_ids)[1], EOS_ID, PAD_ID,
                                                 dtype=tf.int32)], axis=0)
    ids = self.check_tokens(self.clean_ids(input_ids), batch)
    output_ids, scores = self._decode(ids, batch)
    # Without return_beams the search stops once each row's best beam is final: the
    # other K - 1 beams may be unfinished or not the K best, so they are not returned.
    results = tf.shape(output_ids)[1] if self.config.return_beams else 1
    return {"output_ids": output_ids[:batch, :results], "scores": scores[:batch, :results]}

  def _serve(self, inputs):
    inputs = self.check_shape(inputs, "bytes", tf.strings.length(inputs))
    batch = tf.shape(inputs)[0]
    inputs = tf.concat([inputs, tf.fill([_stand_ins(batch)], "")], axis=0)
    ids = self.check_tokens(self.encode_strings(inputs), batch)
    output_ids, scores = self._decode(ids, batch)
    return self._outputs(output_ids, scores, batch)

  def _outputs(self, output_ids, scores, batch):
    """The string signatures' outputs of the first `batch` rows (the request's)."""
    texts = self.tokenizer.detokenize(output_ids)[:batch]  # [B, K]
    scores = scores[:batch]
    outputs = {"outputs": texts[:, 0], "scores": scores[:, 0]}
    if self.config.return_beams:
      outputs.update(beams=texts, beam_scores=scores)
    return outputs


  def _serve_to_language(self, inputs, target_language):
    """`serving_default` with a target language per row (`translate_to_language`)."""
    inputs = self.check_shape(inputs, "bytes", tf.strings.length(inputs))
    batch = tf.shape(inputs)[0]
    tags = self.tag_table.lookup(target_language)
    unknown = tf.where(tags < 0, target_language, "")
    checks = [
        _check(tf.equal(tf.shape(target_language)[0], batch),
               "request with {} inputs but {} target_language rows: give one language "
               "per input", batch, tf.shape(target_language)[0]),
        _check(tf.reduce_all(tags >= 0),
               "request with target_language {}: this model translates into "
               f"{', '.join(self.languages)} only (--target_language_tags at training)",
               tf.strings.reduce_join(tf.boolean_mask(unknown, tags < 0), separator=", "))]
    with tf.control_dependencies(checks):
      inputs = tf.concat([inputs, tf.fill([_stand_ins(batch)], "")], axis=0)
      tags = tf.concat([tags, tf.fill([_stand_ins(batch)], self.default_tag)], axis=0)
    ids = self.check_tokens(self.encode_strings(inputs, tags), batch)
    output_ids, scores = self._decode(ids, batch)
    return self._outputs(output_ids, scores, batch)

  def _serve_with_prefix(self, inputs, target_prefix):
    """`serving_default` with a target prefix per row (empty: free): each output starts
    with its prefix's pieces (`processors.TargetPrefix`). The search runs in graph mode
    in every export (an XLA export would compile per prefix width at request time)."""
    inputs = self.check_shape(inputs, "bytes", tf.strings.length(inputs))
    target_prefix = self.check_shape(target_prefix, "bytes", tf.strings.length(target_prefix))
    batch = tf.shape(inputs)[0]
    same_rows = _check(tf.equal(tf.shape(target_prefix)[0], batch),
                       "request with {} inputs but {} target_prefix rows: give one prefix "
                       "per input (an empty string decodes freely)", batch,
                       tf.shape(target_prefix)[0])
    with tf.control_dependencies([same_rows]):
      inputs = tf.concat([inputs, tf.fill([_stand_ins(batch)], "")], axis=0)
      target_prefix = tf.concat([target_prefix, tf.fill([_stand_ins(batch)], "")], axis=0)
    ids = self.check_tokens(self.encode_strings(inputs), batch)
    ids = ids[:, :self.max_input_length]
    strings = tf.strings.unicode_transcode(target_prefix, "UTF-8", "UTF-8", errors="replace",
                                           replacement_char=0xFFFD)
    prefix = tf.cast(self.tokenizer.target.tokenize(strings),
                     tf.int32)[:, :self.max_input_length]
    output_ids, scores = self._decode_in_halves(ids, prefix.to_tensor(PAD_ID))
    return self._outputs(output_ids, scores, batch)


class _Searches:
  """The Translator's search functions by their options: a plain object, which
  tf.Module does not track, so that the SavedModel has them only as the functions its
  signatures call, not as attributes of its own."""

  def __init__(self):
    self.functions = {}


def _stand_ins(batch: tf.Tensor) -> tf.Tensor:
  """Rows of an empty sentence to decode with a request of `batch` rows: one for an
  empty request, so that it runs the same graph (outputs are cut to `batch` rows), and
  none otherwise: a row that rode along with every request ran, in a weak model, to
  its length limit, and the whole search with it."""
  return tf.cast(tf.equal(batch, 0), tf.int32)


def export(translator: Translator, export_dir: str, version: Optional[int] = None,
           model_dir: Optional[str] = None, checkpoints=()) -> str:
  """Writes the SavedModel to export_dir/<version>/ (TF Serving's layout).

  The version is written whole under `export_dir/.tmp-<version>` and then made visible
  (`publish`: a rename on local disk; on object stores a copy with saved_model.pb
  last), so TF Serving polling export_dir never loads half an export. The request
  limits go to `<version>/assets.extra/t2t_keras.json`, the model card (of
  `model_dir` and `checkpoints`, t2t_keras.trained.model_card) to `assets.extra/model_card.json`.

  Args:
    translator: the module to export.
    export_dir: the model base path TF Serving watches (local, gs://, ...).
    version: a positive integer; default the current Unix time, so later exports
      have higher versions and TF Serving switches to them.

  Returns:
    The versioned directory.

  Raises:
    FileExistsError: the version exists (or is a leftover of an interrupted export).
  """
  version = version or int(time.time())
  path = os.path.join(export_dir, str(version))
  tmp = publish.prepare(path, SAVED_MODEL_FILE, "pass another --export_version or remove it")
  signatures = {"serving_default": translator.serve,
                "translate_ids": translator.translate_ids,
                "translate_with_prefix": translator.serve_with_prefix}
  if translator.languages:
    signatures["translate_to_language"] = translator.serve_to_language
  tf.saved_model.save(translator, tmp, signatures=signatures)
  tf.io.gfile.makedirs(os.path.join(tmp, os.path.dirname(LIMITS_FILE)))
  with tf.io.gfile.GFile(os.path.join(tmp, LIMITS_FILE), "w") as f:
    json.dump({"max_input_length": translator.max_input_length,
               **dataclasses.asdict(translator.limits)}, f, indent=2)
  model_card.write(tmp, model_card.build(translator, model_dir, checkpoints))
  if translator.jit_compile:
    write_warmup(os.path.join(tmp, WARMUP_FILE), warmup_requests(translator))
  return publish.publish(tmp, path, SAVED_MODEL_FILE)


def xla_buckets(max_input_length: int, limits: RequestLimits, max_rows: int = 0) -> list:
  """The (rows, width) shapes the XLA export compiles for requests within `limits` of
  at most `max_rows` rows (0: `limits.max_rows`), each with the smallest request that
  reaches it: [(rows, width, request rows, request width)], widths counting EOS. A
  bucket is reachable when its smallest request (half its rows + 1, half its width +
  1) is within the token limit."""
  def powers(first, last):
    value = first
    while True:
      yield value
      if value >= last:
        return
      value *= 2
  widest = decoding.padded_width(max_input_length)  # sources are cut to max_input_length
  max_rows = min(max_rows or limits.max_rows, limits.max_rows)
  buckets = []
  for rows in powers(1, decoding.padded_width(max_rows, minimum=1)):
    for width in powers(decoding.MIN_XLA_WIDTH, widest):
      need_rows = 1 if rows == 1 else rows // 2 + 1
      need_width = 2 if width == decoding.MIN_XLA_WIDTH else width // 2 + 1
      if (need_rows <= max_rows and need_width <= max_input_length
          and need_rows * need_width <= limits.max_tokens):
        buckets.append((rows, width, need_rows, need_width))
  return buckets


def warmup_requests(translator: Translator) -> list:
  """One request (a list of strings) per reachable XLA bucket (`xla_buckets`): rows of
  a word the vocabulary holds whole, repeated to the bucket's smallest width."""
  word = _one_piece_word(translator.tokenizer.source)
  return [[" ".join([word] * (width - 1))] * rows for _, _, rows, width in
          xla_buckets(translator.max_input_length, translator.limits,
                      translator.xla_max_rows)]


def _one_piece_word(tokenizer) -> str:
  """A word that the tokenizer writes as one piece, also when repeated."""
  candidates = ["a", "the", "1", "x", "0", "I"]
  if hasattr(tokenizer, "vocab_size"):
    candidates += [tokenizer.detokenize(tf.constant([[i]])).numpy()[0].decode("utf-8")
                   for i in range(4, min(int(tokenizer.vocab_size), 200))]
  for word in candidates:
    word = word.strip()
    if not word or " " in word:
      continue
    ids = tokenizer.tokenize(tf.constant([" ".join([word] * 5)])).to_list()[0]
    if len(ids) == 5:
      return word
  raise ValueError("no word of the vocabulary tokenizes to one piece: cannot write "
                   "TF Serving's warm-up requests")


def write_warmup(path: str, requests: list) -> None:
  """TF Serving's warm-up file: a TFRecord of `PredictionLog`s, one `serving_default`
  request of `inputs` strings each (tensorflow-serving-api's protos)."""
  try:
    # pylint: disable=import-outside-toplevel
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2
  except ImportError:
    raise ImportError("TF Serving's warm-up requests need tensorflow-serving-api of "
                      "TensorFlow's release line: pip install 't2t_keras[tensorflow]' "
                      "(BUILD.md: --no-deps on a TPU VM)") from None
  with tf.io.TFRecordWriter(path) as writer:
    for strings in requests:
      request = predict_pb2.PredictRequest()
      request.model_spec.signature_name = "serving_default"
      request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(strings, dtype=tf.string))
      log = prediction_log_pb2.PredictionLog(
          predict_log=prediction_log_pb2.PredictLog(request=request))
      writer.write(log.SerializeToString())


def read_limits(path: str) -> dict:
  """The limits an export was written with (`assets.extra/t2t_keras.json`)."""
  with tf.io.gfile.GFile(os.path.join(path, LIMITS_FILE)) as f:
    return json.load(f)


def translator_of(settings: ExportSettings) -> tuple:
  """(the `Translator` of the model directory's weights and settings, the checkpoints
  its weights come from). ExportError for a --decode_dtype the model cannot take and
  for --constrain_trees on a model that is no parser."""
  model_dir, config, dtype = settings.model_dir, settings.decode_config, settings.weights.dtype
  if dtype:
    try:
      dataclasses.replace(modeldir.load_model_config(model_dir), dtype=dtype).validate()
    except ValueError as error:
      raise ExportError(f"--decode_dtype={dtype} sets the exported model's dtype: "
                        f"{error}") from None
  loaded = loading.load(model_dir, settings.weights.checkpoint_path,
                        settings.weights.average_last_n, dtype)
  constraint = None
  if config.constrain_trees:
    try:
      constraint = TreeConstraint.from_tokenizer(
          loaded.tokenizer, loaded.data_config.parsing_linearization)
    except ValueError as error:
      raise ExportError(f"--constrain_trees with --model_dir={model_dir}: {error}") from None
  translator = Translator(
      loaded.model, loaded.tokenizer, config,
      vocab_file=modeldir.vocab_file_of(loaded.tokenizer, model_dir),
      tree_constraint=constraint, jit_compile=settings.jit_compile,
      limits=limits_of(settings), data_config=loaded.data_config,
      xla_max_rows=settings.xla_max_rows)
  return translator, loaded.checkpoints


# The format's interface (t2t_keras/export/__init__.py: `Format`).
def default_dir(model_dir: str) -> str:
  return modeldir.default_export_dir(model_dir)


def limits_of(settings: ExportSettings) -> RequestLimits:
  return RequestLimits(settings.max_request_rows, settings.max_string_bytes,
                       settings.max_request_tokens)


def export_from_settings(settings: ExportSettings) -> str:
  """Loads the model directory and writes `<export_dir>/<version>/` (the model's
  compute dtype `settings.weights.dtype`, --decode_dtype, default its own, as
  `python -m t2t_keras.decode --decode_dtype` decodes); returns it."""
  translator, checkpoints = translator_of(settings)
  return export(translator, settings.export_dir, settings.version or None,
                settings.model_dir, checkpoints)


def describe(path: str, settings: ExportSettings) -> str:
  limits = limits_of(settings)
  server_flag = " --xla_cpu_compilation_enabled=true" if settings.jit_compile else ""
  warmup = ""
  if settings.jit_compile:
    count = len(xla_buckets(settings.decode_config.max_input_length, limits,
                            settings.xla_max_rows))
    rows = min(settings.xla_max_rows or limits.max_rows, limits.max_rows)
    split = ("" if rows >= limits.max_rows else
             f"; requests of more than {rows} rows are searched in graph mode "
             "(--export_xla_max_rows)")
    warmup = (f"\n  requests of up to {rows} rows are searched by XLA{split}"
              f"\n  {count} XLA programs (rows x source width) are compiled when TF Serving "
              f"loads it ({WARMUP_FILE}): the model is available after that, and no "
              "request waits for a compilation")
  return (f"exported {path}" + (" (beam search compiled with XLA)" if server_flag else "")
          + warmup
          + f"\n  limits per request: {limits.max_rows} rows (--max_request_rows), "
          f"{limits.max_string_bytes} bytes per string (--max_string_bytes), "
          f"{limits.max_tokens} source tokens (--max_request_tokens); sources cut to "
          f"{settings.decode_config.max_input_length} subwords (--max_input_length)"
          + f"\n  python tools/saved_model_cli.py show --dir {path} --all\n"
          f"  tensorflow_model_server --rest_api_port=8501 --model_name=transformer "
          f"--model_base_path={os.path.abspath(settings.export_dir)}{server_flag}")
