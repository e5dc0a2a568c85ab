"""What a SavedModel export serves: the `tf.Module` whose functions are its signatures.

`Translator` holds the model's weights, the tokenizer and the decoding functions, and
builds the graph each signature runs: the request's checks against its
`RequestLimits`, UTF-8 repair, tokenization, the cut to `max_input_length`, the
search (graph mode, or XLA for requests within `xla_max_rows`) and detokenization.
This is the graph; writing it to disk as TF Serving loads it (the versioned
directory, the limits file, the warm-up requests, the model card) is
`saved_model.py`'s, whose docstring is the signatures' contract.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras import language_tags
from t2t_keras.inference import decoding
from t2t_keras.configs import DecodeConfig
from t2t_keras.errors import ExportError


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
    # The decoding step's weights in the layout it reads them (the transposed output
    # embedding, the fused self-attention kernels), stored rather than made again by
    # every request: `Transformer.store_step_weights`.
    self.step_variables = model.store_step_weights()
    self.tokenizer = tokenizer
    # Its searches choose attention by size (`DecodeConfig.attention_by_size`): the
    # client makes the batches, and a request's latency counts.
    self.config = config = dataclasses.replace(config, attention_by_size=True)
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
    stop), so the translations are those of one search over all rows (up to the last
    digits, where attention is chosen by size: `DecodeConfig.attention_by_size`); a
    one-row request leaves the second half empty, which costs a few milliseconds."""
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
    sentence), up to the last digits where the padded rows move attention's choice by
    size (`DecodeConfig.attention_by_size`)."""
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
