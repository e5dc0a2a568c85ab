"""The Apache Beam pipeline of `python -m t2t_keras.tools.beam_translate`: files of
sentences through an exported SavedModel with RunInference, one output file per input.

Steps (any runner; the DirectRunner by default):
  1. `ReadLines`: each input file read forward in one worker (lines as the decode
     command counts them: split at "\\n", a last line without a newline counts, a
     trailing "\\r" dropped), every line keyed by (file, line number); the file's line
     count goes to a side output. A `Reshuffle` then spreads the lines over workers.
  2. `Prepare`: each line's bytes as the export takes them, counted (`COUNTERS`):
     invalid UTF-8 is sent as it is (the SavedModel turns it into U+FFFD, as TF Serving
     does; `invalid_utf8="fail"` stops the pipeline naming the file and line, as the
     decode command refuses such a file); a line of more than the export's
     `max_string_bytes` is cut to it at a character boundary (the export would refuse
     the whole batch); lines longer than `max_input_length` subwords are counted (the
     SavedModel cuts them to it, as the decode command does).
  3. `RunInference` with `SavedModelHandler` (strings in, strings out through the
     `serving_default` signature), batched by RunInference's `BatchElements` within the
     export's per-request limits.
  4. Ordered output in bounded memory: translations are grouped per (file, chunk of
     `chunk_lines` lines), each chunk sorted and written to a temporary file; then per
     file the chunks are concatenated in order (streamed: no worker holds a whole file)
     into `<output_dir>/<input file name>`, written under a temporary name and renamed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import posixpath
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import apache_beam as beam
import sentencepiece as spm
import tensorflow as tf
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.ml.inference.base import (KeyedModelHandler, ModelHandler,
                                           PredictionResult, RunInference)
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from tensorflow.core.protobuf import saved_model_pb2

# Registers TensorFlow Text's ops, which the export's graph holds (and checks the release).
from t2t_keras.data.tokens import tokenizer as tokenizer_lib  # noqa: F401  pylint: disable=unused-import
from t2t_keras.errors import DataError, InputError
from t2t_keras.export import saved_model as saved_model_lib

NAMESPACE = "t2t_keras"
# Counter name -> what it counts (printed at the end in this order).
COUNTERS = {
    "input_files": "input files",
    "input_lines": "input lines",
    "invalid_utf8_lines": "lines that were not valid UTF-8 (invalid bytes -> U+FFFD)",
    "cut_to_max_string_bytes": "lines cut to the export's max_string_bytes",
    "cut_to_max_input_length": "lines longer than max_input_length subwords (cut to it)",
    "translated_lines": "lines translated",
    "output_files": "output files written",
}
TEMPORARY_DIR = ".beam_translate-tmp"  # in --output_dir, removed as files complete
_CHUNK_BYTES = 1 << 20  # bytes read or copied at a time
INVALID_UTF8 = ("replace", "fail")


def _counter(name: str):
  return Metrics.counter(NAMESPACE, name)


@dataclasses.dataclass(frozen=True)
class ExportInfo:
  """What the pipeline needs to know of an export (a SavedModel version directory)."""

  path: str
  max_input_length: int
  max_rows: int
  max_string_bytes: int
  max_tokens: int
  vocab: Optional[str]  # the SentencePiece model sources are tokenized with (None: ids)
  tagged: bool  # a multilingual model: a target-language tag starts every source

  @property
  def largest_batch(self) -> int:
    """The most lines one request may hold within the export's limits (rows, and rows
    x the longest source, which is at most max_input_length subwords)."""
    return max(1, min(self.max_rows, self.max_tokens // self.max_input_length))


def resolve_export(path: str) -> str:
  """`path` itself when it holds saved_model.pb, else its highest numbered version
  (TF Serving's layout, as `python -m t2t_keras.export` writes it).

  Raises:
    InputError: neither.
  """
  if FileSystems.exists(posixpath.join(path, saved_model_lib.SAVED_MODEL_FILE)):
    return path
  versions = []
  for match in FileSystems.match([posixpath.join(path, "*", saved_model_lib.SAVED_MODEL_FILE)
                                  ])[0].metadata_list:
    version = posixpath.basename(posixpath.dirname(match.path))
    if version.isdigit():
      versions.append((int(version), posixpath.dirname(match.path)))
  if not versions:
    raise InputError(f"--saved_model={path} holds no {saved_model_lib.SAVED_MODEL_FILE}, "
                     "nor versions <N>/ that do: give the --export_dir of `python -m "
                     "t2t_keras.export` or one of its versions.")
  return max(versions)[1]


def read_export(path: str) -> ExportInfo:
  """The limits, vocabulary and languages of the export at `path` (a version)."""
  try:
    limits = saved_model_lib.read_limits(path)
  except tf.errors.NotFoundError:
    raise InputError(f"--saved_model={path} has no {saved_model_lib.LIMITS_FILE}: export "
                     "it with `python -m t2t_keras.export`.") from None
  proto = saved_model_pb2.SavedModel()
  with FileSystems.open(posixpath.join(path, saved_model_lib.SAVED_MODEL_FILE),
                        compression_type=CompressionTypes.UNCOMPRESSED) as f:
    proto.ParseFromString(f.read())
  signatures = proto.meta_graphs[0].signature_def
  if "serving_default" not in signatures:
    raise InputError(f"--saved_model={path} has no serving_default signature: export it "
                     "with `python -m t2t_keras.export`.")
  vocab = None
  for name in ("vocab.source.model", "vocab.model"):  # separate vocabularies: the source's
    candidate = posixpath.join(path, "assets", name)
    if FileSystems.exists(candidate):
      vocab = candidate
      break
  return ExportInfo(path, int(limits["max_input_length"]), int(limits["max_rows"]),
                    int(limits["max_string_bytes"]), int(limits["max_tokens"]), vocab,
                    "translate_to_language" in signatures)


def split_lines(f) -> Iterator[bytes]:
  """The lines of a binary file, read in chunks, as the decode command reads them
  (`inference/bulk.py`): without "\\n" and a "\\r" before it; a last line without a
  newline counts, an empty file has none."""
  buffer = b""
  while True:
    chunk = f.read(_CHUNK_BYTES)
    if not chunk:
      break
    buffer += chunk
    lines = buffer.split(b"\n")
    buffer = lines.pop()
    for line in lines:
      yield line[:-1] if line.endswith(b"\r") else line
  if buffer:
    yield buffer[:-1] if buffer.endswith(b"\r") else buffer


class ReadLines(beam.DoFn):
  """file path -> ((path, line number), line bytes) for each line; the main output,
  and (path, number of lines) to the "counts" output."""

  def process(self, path: str):
    count = 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
      for count, line in enumerate(split_lines(f), 1):
        yield (path, count - 1), line
    _counter("input_files").inc()
    _counter("input_lines").inc(count)
    yield beam.pvalue.TaggedOutput("counts", (path, count))


def cut_utf8(data: bytes, limit: int) -> bytes:
  """The first `limit` bytes of `data`, less a character that the cut would split."""
  if len(data) <= limit:
    return data
  data = data[:limit]
  if not data:
    return data
  start = len(data) - 1  # the last character's first byte
  while start > 0 and len(data) - start < 4 and (data[start] & 0xC0) == 0x80:
    start -= 1
  lead = data[start]
  length = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else (
      4 if lead >> 3 == 30 else 1)
  return data[:start] if len(data) - start < length else data


class Prepare(beam.DoFn):
  """((path, n), line bytes) -> ((path, n), the bytes sent to the model), counting the
  lines the decode command would refuse (invalid UTF-8) or cut (over-long)."""

  def __init__(self, export: ExportInfo, invalid_utf8: str = "replace"):
    super().__init__()
    if invalid_utf8 not in INVALID_UTF8:
      raise InputError(f"--invalid_utf8={invalid_utf8}: give one of {INVALID_UTF8}.")
    self.export, self.invalid_utf8 = export, invalid_utf8
    self._processor = None

  def setup(self):
    if self.export.vocab:
      with FileSystems.open(self.export.vocab,
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
        self._processor = spm.SentencePieceProcessor(model_proto=f.read())

  def pieces(self, text: str) -> int:
    """Source length in subwords as the export counts it: tag, pieces, EOS."""
    if self._processor is None:  # the synthetic tasks: ids as words
      pieces = len(text.split())
    else:
      pieces = len(self._processor.encode(text))
    return pieces + int(self.export.tagged) + 1

  def process(self, element):
    (path, number), line = element
    try:
      text = line.decode("utf-8")
    except UnicodeDecodeError as reason:
      if self.invalid_utf8 == "fail":
        raise DataError(f"--input {path} line {number + 1} is not valid UTF-8 "
                        f"({reason.reason} at byte {reason.start}); fix or re-encode the "
                        "file (e.g. iconv -f latin1 -t utf-8), or pass "
                        "--invalid_utf8=replace.") from None
      _counter("invalid_utf8_lines").inc()
      text = line.decode("utf-8", "replace")  # the model replaces them in its graph
    if len(line) > self.export.max_string_bytes:
      _counter("cut_to_max_string_bytes").inc()
      line = cut_utf8(line, self.export.max_string_bytes)
    if self.pieces(text) > self.export.max_input_length:
      _counter("cut_to_max_input_length").inc()
    yield (path, number), line


class SavedModelHandler(ModelHandler):
  """RunInference's model: the export's `serving_default` signature, strings in,
  best translations out.

  Not Beam's `TFModelHandlerTensor`: it loads with `tf.keras.models.load_model` (Keras
  3 loads only .keras and .h5 files, not a TensorFlow SavedModel, and Beam resolves
  the path through tensorflow_hub) and calls the loaded object on one stacked tensor,
  where this export is called through a named signature (`inputs` -> a dict of
  `outputs`, `scores`, ...).
  """

  def __init__(self, path: str, max_batch_size: int, min_batch_size: int = 1):
    super().__init__()
    self.path = path
    self.max_batch_size, self.min_batch_size = max_batch_size, min(min_batch_size,
                                                                    max_batch_size)

  def load_model(self):
    return tf.saved_model.load(self.path)

  def run_inference(self, batch: Sequence[bytes], model,
                    inference_args: Optional[dict] = None) -> Iterable[PredictionResult]:
    del inference_args
    outputs = model.signatures["serving_default"](
        inputs=tf.constant(list(batch), tf.string))["outputs"].numpy()
    _counter("translated_lines").inc(len(batch))
    return [PredictionResult(example, text) for example, text in zip(batch, outputs)]

  def get_num_bytes(self, batch: Sequence[bytes]) -> int:
    return sum(len(line) for line in batch)

  def get_metrics_namespace(self) -> str:
    return NAMESPACE

  def batch_elements_kwargs(self) -> Dict[str, int]:
    return {"min_batch_size": self.min_batch_size, "max_batch_size": self.max_batch_size}


def output_path(output_dir: str, path: str) -> str:
  return posixpath.join(output_dir, posixpath.basename(path))


def _chunk_path(output_dir: str, path: str, chunk: int) -> str:
  return posixpath.join(output_dir, TEMPORARY_DIR,
                        f"{posixpath.basename(path)}.{chunk:09d}")


class WriteChunk(beam.DoFn):
  """((path, chunk), [(n, translation)]) -> a temporary file of the chunk's lines in
  order; emits (path, chunk)."""

  def __init__(self, output_dir: str, chunk_lines: int):
    super().__init__()
    self.output_dir, self.chunk_lines = output_dir, chunk_lines

  def process(self, element):
    (path, chunk), lines = element
    lines = sorted(lines)
    first = chunk * self.chunk_lines
    numbers = [number for number, _ in lines]
    if numbers != list(range(first, first + len(lines))):
      raise RuntimeError(f"{path}: chunk {chunk} has lines {numbers[:5]}... , not the "
                         f"consecutive lines from {first}")
    with FileSystems.create(_chunk_path(self.output_dir, path, chunk),
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
      f.write(b"".join(text + b"\n" for _, text in lines))
    yield path, chunk


class Concatenate(beam.DoFn):
  """(path, {"counts": [lines], "chunks": [chunk...]}) -> `<output_dir>/<name>`: the
  chunks copied in order (streamed), under a temporary name renamed at the end."""

  def __init__(self, output_dir: str, chunk_lines: int):
    super().__init__()
    self.output_dir, self.chunk_lines = output_dir, chunk_lines

  def process(self, element):
    path, grouped = element
    (lines,) = grouped["counts"]
    chunks = sorted(grouped["chunks"])
    expected = list(range(math.ceil(lines / self.chunk_lines)))
    if chunks != expected:
      raise RuntimeError(f"{path}: {lines} lines but chunks {chunks} were written, not "
                         f"{expected}")
    final = output_path(self.output_dir, path)
    temporary = posixpath.join(self.output_dir, TEMPORARY_DIR, posixpath.basename(path))
    parts = [_chunk_path(self.output_dir, path, chunk) for chunk in chunks]
    with FileSystems.create(temporary,
                            compression_type=CompressionTypes.UNCOMPRESSED) as out:
      for part in parts:
        with FileSystems.open(part, compression_type=CompressionTypes.UNCOMPRESSED) as f:
          while True:
            block = f.read(_CHUNK_BYTES)
            if not block:
              break
            out.write(block)
    if FileSystems.exists(final):  # rename does not replace on every file system
      FileSystems.delete([final])
    FileSystems.rename([temporary], [final])
    if parts:
      FileSystems.delete(parts)
    _counter("output_files").inc()
    yield final


def check_inputs(pattern: str, output_dir: str) -> List[str]:
  """The files `pattern` (comma-separated patterns) matches, sorted.

  Raises:
    InputError: no file matches; two share a name (their outputs would); an output
      would overwrite an input.
  """
  paths = []
  for one in (p.strip() for p in pattern.split(",") if p.strip()):
    try:
      matched = FileSystems.match([one])[0].metadata_list
    except Exception as error:  # pylint: disable=broad-except  (BeamIOError, ...)
      raise InputError(f"--input={one}: {error}") from None
    paths += [m.path for m in matched if not m.path.endswith("/")]
  paths = sorted(set(paths))
  if not paths:
    raise InputError(f"--input={pattern} matches no file: give a file, a pattern "
                     "(data/*.txt, gs://bucket/part-*) or several, comma-separated.")
  names: Dict[str, str] = {}
  for path in paths:
    name = posixpath.basename(path)
    if name in names:
      raise InputError(f"--input={pattern} matches {names[name]} and {path}: each output "
                       f"is --output_dir/<input's name>, so names must differ; run them "
                       "separately.")
    names[name] = path
    if os.path.abspath(output_path(output_dir, path)) == os.path.abspath(path):
      raise InputError(f"--output_dir={output_dir} holds the input {path}: its "
                       "translations would overwrite it; give another --output_dir.")
  return paths


def build(pipeline, paths: List[str], export: ExportInfo, output_dir: str, *,
          max_batch_size: int, chunk_lines: int, invalid_utf8: str = "replace"):
  """Adds the steps to `pipeline`; returns the PCollection of output paths."""
  read = (pipeline
          | "Files" >> beam.Create(paths)
          | "ReadLines" >> beam.ParDo(ReadLines()).with_outputs("counts", main="lines"))
  handler = KeyedModelHandler(SavedModelHandler(export.path, max_batch_size))
  chunks = (read.lines
            | "Spread" >> beam.Reshuffle()
            | "Prepare" >> beam.ParDo(Prepare(export, invalid_utf8))
            | "Translate" >> RunInference(handler)
            | "ByChunk" >> beam.Map(lambda item, size: ((item[0][0], item[0][1] // size),
                                                        (item[0][1], item[1].inference)),
                                    chunk_lines)
            | "GroupChunk" >> beam.GroupByKey()
            | "WriteChunk" >> beam.ParDo(WriteChunk(output_dir, chunk_lines)))
  return ({"counts": read.counts, "chunks": chunks}
          | "PerFile" >> beam.CoGroupByKey()
          | "Concatenate" >> beam.ParDo(Concatenate(output_dir, chunk_lines)))


def pipeline_options(args: List[str]) -> PipelineOptions:
  """Beam's pipeline options of `args` (--runner, --project, ...; the DirectRunner by
  default).

  Raises:
    InputError: an argument that is neither this tool's flag nor an option Beam knows
      (Beam would drop it with a warning).
  """
  options = PipelineOptions(args)
  known = set(options.get_all_options(retain_unknown_options=False))
  unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - known)
  if unknown:
    raise InputError(f"{', '.join('--' + name for name in unknown)}: neither a flag of "
                     "beam_translate (--help) nor a Beam pipeline option.")
  return options


def runner_name(options: PipelineOptions) -> str:
  """The runner `options` name (Beam's default: the DirectRunner)."""
  runner = options.view_as(StandardOptions).runner
  if runner is None or isinstance(runner, str):
    return runner or "DirectRunner"
  return type(runner).__name__  # a runner object (PipelineOptions(runner=...))


def counters(result) -> Dict[str, int]:
  """The pipeline's counters by name (committed where the runner has them)."""
  values = {name: 0 for name in COUNTERS}
  query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
  for counter in query["counters"]:
    value = counter.committed if counter.committed is not None else counter.attempted
    if counter.key.metric.name in values:
      values[counter.key.metric.name] += int(value or 0)
  return values


def describe_counters(values: Dict[str, int]) -> str:
  return "\n".join(f"  {values[name]:>10}  {what} ({name})" for name, what in
                   COUNTERS.items())


def run(paths: List[str], export: ExportInfo, output_dir: str, options: PipelineOptions,
        *, max_batch_size: int, chunk_lines: int, invalid_utf8: str = "replace"
        ) -> Tuple[Dict[str, int], str]:
  """Runs the pipeline to its end; returns (counters, the runner's final state)."""
  pipeline = beam.Pipeline(options=options)
  build(pipeline, paths, export, output_dir, max_batch_size=max_batch_size,
        chunk_lines=chunk_lines, invalid_utf8=invalid_utf8)
  result = pipeline.run()
  state = result.wait_until_finish()
  temporary = posixpath.join(output_dir, TEMPORARY_DIR)
  if FileSystems.exists(temporary):  # its chunks are gone: each file removed its own
    FileSystems.delete([temporary])
  return counters(result), str(state)

