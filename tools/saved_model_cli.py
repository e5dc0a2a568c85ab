"""TensorFlow's saved_model_cli with TensorFlow Text's ops registered.

The stock `saved_model_cli run` cannot execute t2t_keras exports: their graphs use
TensorFlow Text's SentencePiece ops, which only exist in a process that imported
tensorflow_text (TensorFlow Serving has them built in). Same arguments as
saved_model_cli, e.g.

  python tools/saved_model_cli.py show --dir /tmp/export/1 --all
  python tools/saved_model_cli.py run --dir /tmp/export/1 --tag_set serve \
      --signature_def serving_default --input_exprs "inputs=['A dog runs.']"
"""

import sys

import tensorflow_text  # noqa: F401  pylint: disable=unused-import
from tensorflow.python.tools import saved_model_cli

if __name__ == "__main__":
  sys.argv[0] = "saved_model_cli"
  sys.exit(saved_model_cli.main())
