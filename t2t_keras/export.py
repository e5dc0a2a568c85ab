"""Exports a trained model for TensorFlow Serving: `python -m t2t_keras.export
--model_dir=... [--export_dir=...]` writes `<export_dir>/<version>/` (a SavedModel
whose serving_default signature takes strings and returns translations).

Beam size, alpha and extra decode length are fixed at export (the --beam_size,
--alpha, --extra_decode_length flags); --average_last_n exports averaged weights.
--export_dir defaults to <model_dir>/export; the version defaults to the Unix time.

`--format=ctranslate2 [--quantization=int8|...]` writes a CTranslate2 model directory
into --export_dir itself (default <model_dir>/ctranslate2): model.bin, the vocabulary
and the run's SentencePiece model (see t2t_keras/ctranslate2_export.py).
"""

from __future__ import annotations

import os
import sys

from t2t_keras import console, errors

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_integer("export_version", 0, "Version number (default: Unix time).")
flags.DEFINE_enum("format", "saved_model", ["saved_model", "ctranslate2"],
                  "saved_model: TensorFlow Serving (strings in, translations out); "
                  "ctranslate2: a CTranslate2 model directory (pip install ctranslate2).")
flags.DEFINE_boolean(
    "export_jit_compile", False,
    "Compile the exported beam search with XLA (faster, and much lower latency on "
    "CPU). TensorFlow Serving runs it only when started with "
    "--xla_cpu_compilation_enabled=true (CPU; serving#1858), else requests fail. "
    "Each new batch size or source length bucket is compiled on its first request.")
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
flags.DEFINE_enum("quantization", None, ["int8", "int8_float32", "int8_float16",
                                         "int8_bfloat16", "int16", "float16",
                                         "bfloat16", "float32"],
                  "--format=ctranslate2 only: the weights' type (default float32).")


def export_ctranslate2(export_dir: str) -> str:
  """Restores the model (latest, --checkpoint_path or --average_last_n) and writes it
  as a CTranslate2 model directory."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras import ctranslate2_export, loading, modeldir
  checkpoint_path, average_last_n = t2t_flags.checkpoint_choice(sys.argv)
  loaded = loading.load(FLAGS.model_dir, checkpoint_path, average_last_n, "float32")
  vocab = modeldir.vocab_path(FLAGS.model_dir)
  return ctranslate2_export.export(
      loaded.model, loaded.model_config, loaded.tokenizer, export_dir,
      quantization=FLAGS.quantization,
      vocab_file=vocab if loaded.tokenizer.model_proto is not None else None)


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not FLAGS.model_dir:
    raise app.UsageError("--model_dir is required (the directory training wrote).")
  ctranslate2 = FLAGS.format == "ctranslate2"
  if FLAGS.quantization and not ctranslate2:
    print("error: --quantization is for --format=ctranslate2 (a SavedModel keeps "
          "float32 weights); add --format=ctranslate2 or drop --quantization",
          file=sys.stderr)
    sys.exit(2)
  if FLAGS.export_jit_compile and ctranslate2:
    print("error: --export_jit_compile is for --format=saved_model (CTranslate2 has its "
          "own kernels); drop one of them", file=sys.stderr)
    sys.exit(2)
  if (FLAGS.constrain_trees and ctranslate2
      and "constrain_trees" in t2t_flags.command_line_flags(sys.argv)):
    print("error: --constrain_trees is for --format=saved_model (a CTranslate2 model "
          "cannot carry the tree constraint); drop one of them", file=sys.stderr)
    sys.exit(2)
  limit_flags = [f"--{name}" for name in ("max_request_rows", "max_string_bytes",
                                          "max_request_tokens") if FLAGS[name].present]
  if limit_flags and ctranslate2:
    print(f"error: {', '.join(limit_flags)} limit requests to a SavedModel "
          "(--format=saved_model); a CTranslate2 model has no server of ours to enforce "
          "them: drop them", file=sys.stderr)
    sys.exit(2)
  from t2t_keras import modeldir  # pylint: disable=import-outside-toplevel
  export_dir = FLAGS.export_dir or modeldir.default_export_dir(FLAGS.model_dir, ctranslate2)
  errors.exit_on_user_error(lambda: run(export_dir, ctranslate2), (FileExistsError,))


def run(export_dir: str, ctranslate2: bool) -> None:
  """Checks the flags against the model directory, then writes the export."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras import modeldir, serving
  tf.get_logger().setLevel("ERROR")
  for warning in t2t_flags.check_inference_flags(
      sys.argv, modeldir.load_model_config(FLAGS.model_dir), "export",
      reads=("export_dir", "format", "quantization", "constrain_trees"),
      requested_vocab_size=modeldir.data_config_of(FLAGS.model_dir).vocab_size):
    logging.warning(warning)
  if ctranslate2:
    path = export_ctranslate2(export_dir)
    weights = FLAGS.quantization or "float32"
    print(f"exported {path} (CTranslate2, {weights} weights)\n"
          f"  python tools/ct2_translate.py --model={path} --input_file=in.txt")
    return
  limits = serving.RequestLimits(FLAGS.max_request_rows, FLAGS.max_string_bytes,
                                 FLAGS.max_request_tokens)
  path = serving.export_model_dir(FLAGS.model_dir, export_dir, t2t_flags.decode_config(),
                                  FLAGS.max_input_length,
                                  *t2t_flags.checkpoint_choice(sys.argv),
                                  FLAGS.export_version, FLAGS.constrain_trees,
                                  jit_compile=FLAGS.export_jit_compile, limits=limits)
  server_flag = " --xla_cpu_compilation_enabled=true" if FLAGS.export_jit_compile else ""
  print(f"exported {path}" + (" (beam search compiled with XLA)" if server_flag else "")
        + f"\n  limits per request: {limits.max_rows} rows (--max_request_rows), "
        f"{limits.max_string_bytes} bytes per string (--max_string_bytes), "
        f"{limits.max_tokens} source tokens (--max_request_tokens); sources cut to "
        f"{FLAGS.max_input_length} subwords (--max_input_length)"
        + f"\n  python tools/saved_model_cli.py show --dir {path} --all\n"
        f"  tensorflow_model_server --rest_api_port=8501 --model_name=transformer "
        f"--model_base_path={os.path.abspath(export_dir)}{server_flag}")

def console_main():
  """The `t2t-export` console script (setup.py)."""
  console.own_help(__name__)
  app.run(main)


if __name__ == "__main__":
  console_main()
