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

from t2t_keras.trained import model_card, modeldir
from t2t_keras.inference import decoding, loading
from t2t_keras.errors import ExportError
from t2t_keras.export import ExportSettings, publish
from t2t_keras.parsing.constraint import TreeConstraint
# The module the SavedModel serves, and the limits its signatures enforce (serving.py).
from t2t_keras.export.serving import RequestLimits, Translator


LIMITS_FILE = os.path.join("assets.extra", "t2t_keras.json")  # in the version directory
# TF Serving replays this file's requests when it loads a version (SavedModel warm-up).
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
SAVED_MODEL_FILE = "saved_model.pb"  # what every SavedModel reader opens first


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
