"""Exports a trained model for TensorFlow Serving: `python -m t2t_keras.export
--model_dir=... [--export_dir=...]` writes `<export_dir>/<version>/` (a SavedModel
whose serving_default signature takes strings and returns translations).

Beam size, alpha and extra decode length are fixed at export (the --beam_size,
--alpha, --extra_decode_length flags); --average_last_n exports averaged weights. The
decoding flags not given default to the model directory's recipe (those its training
run was given, `flags.use_recipe`), as decode's do.
--export_dir defaults to <model_dir>/export; the version defaults to the Unix time.

`--format=ctranslate2 [--quantization=int8|...]` writes a CTranslate2 model directory
into --export_dir itself (default <model_dir>/ctranslate2): model.bin, the vocabulary
and the run's SentencePiece model (see t2t_keras/export/ctranslate2.py).

`--format=huggingface` writes a transformers model directory (MarianMT or Pegasus,
safetensors, a MarianTokenizer; default <model_dir>/huggingface; see
t2t_keras/export/huggingface.py and docs/huggingface.md).

Decoding settings a format does not carry (t2t_keras/export/__init__.py declares them
per format: a CTranslate2 model carries none) are refused when typed on the command
line, naming where each goes instead; --decode_dtype sets the SavedModel's compute
dtype.
"""

from __future__ import annotations

import sys

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import export  # noqa: E402
from t2t_keras import flags as t2t_flags  # noqa: E402
from t2t_keras.trained import modeldir  # noqa: E402

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_integer("export_version", 0, "Version number (default: Unix time).")
flags.DEFINE_enum("format", "saved_model", list(export.FORMATS),
                  "; ".join(f"{f.name}: {f.help}" for f in export.FORMATS.values()) + ".")
flags.DEFINE_boolean(
    "export_jit_compile", False,
    "Compile the exported beam search with XLA (faster, and much lower latency on "
    "CPU). TensorFlow Serving runs it only when started with "
    "--xla_cpu_compilation_enabled=true (CPU; serving#1858), else requests fail. "
    "Each new batch size or source length bucket is compiled on its first request.")
flags.DEFINE_integer("export_xla_max_rows", export.XLA_MAX_ROWS,
                     "With --export_jit_compile: requests of at most this many rows are "
                     "searched by XLA (lowest latency), larger ones in graph mode (their "
                     "finished sentences leave the batch); 0: every request by XLA.",
                     lower_bound=0)
flags.DEFINE_integer("max_request_rows", 256,
                     "--format=saved_model: sentences (rows) per request; more is refused "
                     "with INVALID_ARGUMENT before any work. Under TF Serving's batching "
                     "it applies to the merged batch (keep max_batch_size within it).",
                     lower_bound=1)
flags.DEFINE_integer("max_string_bytes", 16384,
                     "--format=saved_model: bytes per input string (ids per row for "
                     "translate_ids); longer is refused before tokenization. Strings within "
                     "it are still cut to --max_input_length subwords.", lower_bound=1)
flags.DEFINE_integer("max_request_tokens", 16384,
                     "--format=saved_model: source tokens per request, counted as rows x "
                     "the longest row (after the cut to --max_input_length), which sizes "
                     "the key/value cache; more is refused before decoding.", lower_bound=1)
flags.DEFINE_enum("quantization", None, list(export.QUANTIZATIONS),
                  "--format=ctranslate2 only: the weights' type (default float32).")


def check_flags() -> None:
  """Refuses flags typed for a format that would drop them (`Format.check_flags`)."""
  export.FORMATS[FLAGS.format].check_flags(
      {name: FLAGS[name].value for name in t2t_flags.command_line_flags(sys.argv)})


def run() -> None:
  """Checks the flags against the model directory, then writes the export."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  tf.get_logger().setLevel("ERROR")
  export_format = export.FORMATS[FLAGS.format]
  recipe = t2t_flags.use_recipe(FLAGS.model_dir)  # before the flags are read
  origin = recipe.describe(export_format.carries + ("average_last_n", "checkpoint_path"))
  if origin:
    print(f"exporting {FLAGS.model_dir}: {origin}", flush=True)
  for warning in t2t_flags.check_inference_flags(
      sys.argv, modeldir.load_model_config(FLAGS.model_dir), "export",
      reads=("export_dir",),
      requested_vocab_size=modeldir.data_config_of(FLAGS.model_dir).vocab_size):
    logging.warning(warning)
  settings = export.ExportSettings(
      model_dir=FLAGS.model_dir,
      export_dir=FLAGS.export_dir or export_format.default_dir(FLAGS.model_dir),
      decode_config=t2t_flags.decode_config(), weights=t2t_flags.weights_config(sys.argv),
      version=FLAGS.export_version, jit_compile=FLAGS.export_jit_compile,
      xla_max_rows=FLAGS.export_xla_max_rows,
      max_request_rows=FLAGS.max_request_rows, max_string_bytes=FLAGS.max_string_bytes,
      max_request_tokens=FLAGS.max_request_tokens, quantization=FLAGS.quantization)
  path = export_format.export(settings)
  print(export_format.describe(path, settings))


command = console.Command(run, check=check_flags, extra_errors=(FileExistsError,))
main, console_main = command.main, command.console_main  # console_main: python -m
console_script_main = command.console_script_main  # t2t-export

if __name__ == "__main__":
  console_main()
