"""Exports a trained model for TensorFlow Serving: `python -m t2t_keras.export
--model_dir=... --export_dir=...` writes `<export_dir>/<version>/` (a SavedModel
whose serving_default signature takes strings and returns translations).

Beam size, alpha and extra decode length are fixed at export (the --beam_size,
--alpha, --extra_decode_length flags); --average_last_n exports averaged weights.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from absl import logging

from t2t_keras import flags as t2t_flags

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_string("export_dir", None, "Base directory: the export goes to <dir>/<version>.")
flags.DEFINE_integer("export_version", 0, "Version number (default: Unix time).")
flags.DEFINE_string("checkpoint_path", None, "A specific checkpoint (default: latest).")
flags.DEFINE_integer("average_last_n", 0, "Export the average of the last N checkpoints.")
flags.DEFINE_integer("max_input_length", 256,
                     "Longer sources are truncated to this many subwords (EOS included); "
                     "bounds the memory of one request.")


def export_model_dir(model_dir: str, export_dir: str, decode_config, max_input_length: int,
                     checkpoint_path=None, average_last_n: int = 0, version: int = 0) -> str:
  """Loads model_dir and exports it; returns the versioned export path."""
  # pylint: disable=import-outside-toplevel
  import os

  from t2t_keras import inference, serving
  loaded = inference.load(model_dir, checkpoint_path, average_last_n)
  vocab = os.path.join(model_dir, inference.VOCAB_FILE)
  translator = serving.Translator(
      loaded.model, loaded.tokenizer, decode_config, max_input_length,
      vocab_file=vocab if getattr(loaded.tokenizer, "model_proto", None) else None)
  return serving.export(translator, export_dir, version or None)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not FLAGS.model_dir or not FLAGS.export_dir:
    raise app.UsageError("--model_dir and --export_dir are required.")
  if FLAGS.max_input_length < 2:
    raise app.UsageError(f"--max_input_length={FLAGS.max_input_length} must be >= 2 "
                         "(at least one token and EOS).")
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras.errors import USER_ERRORS
  tf.get_logger().setLevel("ERROR")
  try:
    path = export_model_dir(FLAGS.model_dir, FLAGS.export_dir, t2t_flags.decode_config(),
                            FLAGS.max_input_length, FLAGS.checkpoint_path,
                            FLAGS.average_last_n, FLAGS.export_version)
  except (*USER_ERRORS, FileExistsError) as error:
    logging.debug("user error", exc_info=True)
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  print(f"exported {path}\n  saved_model_cli show --dir {path} --all\n"
        f"  tensorflow_model_server --rest_api_port=8501 --model_name=transformer "
        f"--model_base_path={FLAGS.export_dir}")


if __name__ == "__main__":
  app.run(main)
