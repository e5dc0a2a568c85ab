"""Turns a treebank file into the parsing task's line-aligned text files.

  python tools/linearize_trees.py --trees=data/ptb_wsj_sample/test.mrg \
      --sentences=/tmp/test.words [--linearized=/tmp/test.linear]

--sentences receives each cleaned tree's words (the input `python -m t2t_keras.decode`
translates into trees), --linearized the targets as training sees them
(`(S (NP NNP ) (VP VBZ ) . )`, or with --linearization=words
`(S (NP John NNP ) (VP runs VBZ ) . . )`). Trees are cleaned as for training
(t2t_keras.parsing): empty elements, function tags, indices and the empty root removed.
Linearizing the output trees of another parser lets
`python -m t2t_keras.evaluate --task=parsing` score them.

A thin CLI over t2t_keras.parsing; it does not import TensorFlow.

After `pip install`, `t2t-linearize-trees` is this tool (same flags).
"""

import sys

from absl import app, flags

from t2t_keras import console, errors  # noqa: E402

console.quiet_tensorflow()  # before TensorFlow is imported

from t2t_keras import parsing  # noqa: E402

flags.DEFINE_string("trees", None, "Bracketed trees (.mrg), one per line or spanning lines.")
flags.DEFINE_string("sentences", None, "Where the words go, one sentence per line.")
flags.DEFINE_string("linearized", None, "Where the linearized trees go, one per line.")
flags.DEFINE_enum("linearization", "tags", ["tags", "words"],
                  "--linearized's format (a model's --parsing_linearization): tags only, "
                  "or each word followed by its tag.")
flags.mark_flags_as_required(["trees"])
FLAGS = flags.FLAGS


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not (FLAGS.sentences or FLAGS.linearized):
    raise app.UsageError("Nothing to write: give --sentences and/or --linearized.")
  try:
    with open(FLAGS.trees, "rb") as f:
      data = f.read()
  except OSError as error:
    sys.exit(f"error: --trees {FLAGS.trees} cannot be read: {error.strerror}.")
  pairs = parsing.read_examples(parsing.decode_utf8(data, FLAGS.trees), FLAGS.trees,
                                FLAGS.linearization)
  for path, column in ((FLAGS.sentences, 0), (FLAGS.linearized, 1)):
    if path:
      with open(path, "w", encoding="utf-8") as f:
        f.writelines(pair[column] + "\n" for pair in pairs)
  print(f"{len(pairs)} trees from {FLAGS.trees}: "
        + ", ".join(f"{what} -> {path}" for what, path in
                    (("sentences", FLAGS.sentences), ("linearized", FLAGS.linearized))
                    if path))


def console_main():
  """The `t2t-linearize-trees` command (setup.py) and `python tools/linearize_trees.py`."""
  console.own_help(__name__)
  app.run(errors.reporting_user_errors(main))


if __name__ == "__main__":
  console_main()
