"""TensorFlow's saved_model_cli with TensorFlow Text's ops registered, and the model card.

The stock `saved_model_cli run` cannot execute t2t_keras exports: their graphs use
TensorFlow Text's SentencePiece ops, which only exist in a process that imported
tensorflow_text (TensorFlow Serving has them built in). Same arguments as
saved_model_cli, e.g.

  python tools/saved_model_cli.py show --dir /tmp/export/1 --all
  python tools/saved_model_cli.py run --dir /tmp/export/1 --tag_set serve \\
      --signature_def serving_default --input_exprs "inputs=['A dog runs.']"

`show` starts with the export's model card (t2t_keras.trained.model_card: the model, its
training data, its last dev BLEU with sacreBLEU's signature); `card --dir D` prints
the card alone, as JSON. After `pip install`, `t2t-saved-model-cli` is this tool.
"""

import json
import sys
from collections.abc import Sequence

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported (t2t_keras.trained imports it)

from t2t_keras.trained import model_card  # noqa: E402


def _dir_argument(argv: Sequence[str]) -> str | None:
  """The value of `--dir D` or `--dir=D` in argv, if any."""
  for i, arg in enumerate(argv):
    if arg.startswith("--dir="):
      return arg[len("--dir="):]
    if arg == "--dir" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def show_card(argv: Sequence[str], out=None) -> int:
  """`card --dir D`: prints the card as JSON (exit 0), or says there is none (exit 1)."""
  out = out or sys.stdout
  path = _dir_argument(argv)
  if not path:
    print("error: card needs --dir, the export's version directory "
          "(e.g. --dir /models/transformer/1)", file=sys.stderr)
    return 2
  card = model_card.read(path)
  if card is None:
    print(f"error: {path} has no {model_card.CARD_FILE} (exported before model cards, "
          "or not a t2t_keras export)", file=sys.stderr)
    return 1
  print(json.dumps(card, indent=2, sort_keys=True), file=out)
  return 0


def console_main():
  """The `t2t-saved-model-cli` command (setup.py) and `python tools/saved_model_cli.py`."""
  argv = sys.argv
  if len(argv) > 1 and argv[1] == "card":
    sys.exit(show_card(argv))
  # pylint: disable=import-outside-toplevel
  import tensorflow_text  # noqa: F401  pylint: disable=unused-import
  from tensorflow.python.tools import saved_model_cli
  # --help: this docstring and saved_model_cli's flags (absl answers --help before its
  # argparse commands could).
  console.own_help(__name__, adopt=(saved_model_cli.__name__,))

  path = _dir_argument(argv)
  if len(argv) > 1 and argv[1] == "show" and path:
    card = model_card.read(path)
    if card is not None:
      print(model_card.describe(card) + "\n", flush=True)
  sys.argv[0] = "saved_model_cli"
  sys.exit(saved_model_cli.main())


if __name__ == "__main__":
  console_main()
