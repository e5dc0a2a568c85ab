"""Scores translations: `python -m t2t_keras.evaluate --hypotheses=hyp.txt
--references=ref.txt [--references=ref2.txt]`.

Prints sacreBLEU (cased and uncased) and chrF with their signatures. Files are
line-aligned UTF-8 text, one segment per line, detokenized (sacreBLEU tokenizes).
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags

flags.DEFINE_string("hypotheses", None, "System output, one segment per line.")
flags.DEFINE_multi_string("references", None, "Reference file(s), line-aligned.")
flags.DEFINE_enum("task", "translation", ["translation"], "What is scored.")
FLAGS = flags.FLAGS


def read_segments(path: str, what: str):
  """Lines of a UTF-8 file; DataError naming the file and line on bad input."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras.data.sources import DataError
  if not tf.io.gfile.exists(path):
    raise DataError(f"{what} {path} does not exist.")
  with tf.io.gfile.GFile(path, "rb") as f:
    data = f.read()
  lines = data.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for number, line in enumerate(lines, 1):
    try:
      out.append(line.rstrip(b"\r").decode("utf-8"))
    except UnicodeDecodeError as error:
      raise DataError(f"{what} {path} line {number} is not valid UTF-8 ({error.reason}); "
                      "re-encode it as UTF-8.") from None
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not FLAGS.hypotheses or not FLAGS.references:
    raise app.UsageError("--hypotheses and --references are required.")
  # pylint: disable=import-outside-toplevel
  from t2t_keras import metrics
  from t2t_keras.data.sources import DataError
  try:
    hypotheses = read_segments(FLAGS.hypotheses, "--hypotheses")
    references = []
    for path in FLAGS.references:
      refs = read_segments(path, "--references")
      if len(refs) != len(hypotheses):
        raise DataError(f"--references {path} has {len(refs)} lines but --hypotheses "
                        f"{FLAGS.hypotheses} has {len(hypotheses)}: they must be "
                        "line-aligned.")
      references.append(refs)
  except DataError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  print(metrics.format_report(metrics.bleu_report(hypotheses, references)))


if __name__ == "__main__":
  app.run(main)
