"""Scores translations: `python -m t2t_keras.evaluate --hypotheses=hyp.txt
--references=ref.txt [--references=ref2.txt] [--lowercase]`.

Prints sacreBLEU (cased and uncased) and chrF, each with its signature, then
sacreBLEU's summaries (n-gram precisions, brevity penalty, lengths). Files are
line-aligned UTF-8 text, one detokenized segment per line (sacreBLEU tokenizes);
several --references files score against multiple references.

A thin entry point over t2t_keras.metrics.bleu_report. It does not import
TensorFlow (only for gs:// and other remote paths), so it starts in about a second.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
from absl import logging

flags.DEFINE_string("hypotheses", None, "System output, one segment per line (UTF-8).")
flags.DEFINE_multi_string("references", None,
                          "Reference file, line-aligned with --hypotheses; repeat the flag "
                          "for multiple references.")
flags.DEFINE_boolean("lowercase", False,
                     "Score chrF case-insensitively too (BLEU is always printed both cased "
                     "and uncased).")
flags.DEFINE_enum("task", "translation", ["translation"],
                  "What is scored: translation (BLEU and chrF).")
flags.mark_flags_as_required(["hypotheses", "references"])
FLAGS = flags.FLAGS


class InputError(ValueError):
  """A missing, undecodable or misaligned input file; the message names it."""


def _read_bytes(path: str, what: str) -> bytes:
  if "://" in path:  # gs://, s3://, ...: TensorFlow's file system layer
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not tf.io.gfile.exists(path):
      raise InputError(f"{what} {path} does not exist.")
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  try:
    with open(path, "rb") as f:
      return f.read()
  except OSError as error:
    raise InputError(f"{what} {path} cannot be read: {error.strerror}.") from None


def read_segments(path: str, what: str) -> list:
  """Lines of a UTF-8 file without their line ends (a final newline is optional).

  Raises:
    InputError: the file is missing, or a line is not UTF-8 (naming file and line).
  """
  lines = _read_bytes(path, what).split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  segments = []
  for number, line in enumerate(lines, 1):
    try:
      segments.append(line.rstrip(b"\r").decode("utf-8"))
    except UnicodeDecodeError as error:
      raise InputError(f"{what} {path} line {number} is not valid UTF-8 ({error.reason} at "
                       f"byte {error.start}); re-encode the file (e.g. iconv -f latin1 -t "
                       "utf-8).") from None
  return segments


def read_inputs(hypotheses_path: str, reference_paths: list) -> tuple:
  """Hypotheses and reference streams, checked to be non-empty and line-aligned."""
  hypotheses = read_segments(hypotheses_path, "--hypotheses")
  if not hypotheses:
    raise InputError(f"--hypotheses {hypotheses_path} is empty: nothing to score.")
  references = []
  for path in reference_paths:
    stream = read_segments(path, "--references")
    if len(stream) != len(hypotheses):
      raise InputError(f"--references {path} has {len(stream)} lines but --hypotheses "
                       f"{hypotheses_path} has {len(hypotheses)}: they must be line-aligned "
                       "(one segment per line, same order).")
    references.append(stream)
  return hypotheses, references


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  from t2t_keras import metrics  # pylint: disable=import-outside-toplevel
  try:
    hypotheses, references = read_inputs(FLAGS.hypotheses, FLAGS.references)
  except InputError as error:
    logging.debug("input error", exc_info=True)
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  report = metrics.bleu_report(hypotheses, references, lowercase_chrf=FLAGS.lowercase)
  print(metrics.format_report(report, details=True))


if __name__ == "__main__":
  app.run(main)
