"""Exports a trained model for TensorFlow Serving: `python -m t2t_keras.export
--model_dir=... [--export_dir=...]` writes `<export_dir>/<version>/` (a SavedModel
whose serving_default signature takes strings and returns translations).

Beam size, alpha and extra decode length are fixed at export (the --beam_size,
--alpha, --extra_decode_length flags); --average_last_n exports averaged weights.
--export_dir defaults to <model_dir>/export; the version defaults to the Unix time.
"""

from __future__ import annotations

import os
import sys

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_integer("export_version", 0, "Version number (default: Unix time).")
flags.DEFINE_string("checkpoint_path", None, "A specific checkpoint (default: latest).")
flags.DEFINE_integer("average_last_n", 0, "Export the average of the last N checkpoints.")


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not FLAGS.model_dir:
    raise app.UsageError("--model_dir is required (the directory training wrote).")
  export_dir = FLAGS.export_dir or os.path.join(FLAGS.model_dir, "export")
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras import serving
  from t2t_keras.errors import USER_ERRORS
  tf.get_logger().setLevel("ERROR")
  from t2t_keras import inference
  from t2t_keras.training import checkpoints
  try:
    for warning in t2t_flags.check_inference_flags(
        sys.argv, checkpoints.load_model_config(FLAGS.model_dir), "export",
        reads=("export_dir",),
        requested_vocab_size=inference.data_config_of(FLAGS.model_dir).vocab_size):
      logging.warning(warning)
    path = serving.export_model_dir(FLAGS.model_dir, export_dir, t2t_flags.decode_config(),
                            FLAGS.max_input_length, FLAGS.checkpoint_path,
                            FLAGS.average_last_n, FLAGS.export_version)
  except (*USER_ERRORS, FileExistsError, flags.ValidationError) as error:
    logging.debug("user error", exc_info=True)
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  print(f"exported {path}\n  python tools/saved_model_cli.py show --dir {path} --all\n"
        f"  tensorflow_model_server --rest_api_port=8501 --model_name=transformer "
        f"--model_base_path={os.path.abspath(export_dir)}")


if __name__ == "__main__":
  app.run(main)
