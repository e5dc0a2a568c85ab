"""Translates text with a trained model: `python -m t2t_keras.decode --model_dir=...
--input_file=... --output_file=...` (stdin / stdout when not given).

One sentence per line in, one translation per line out, in input order. Batches are
sorted by length internally; a progress line with sentences/s goes to stderr. With
`--return_beams` every beam is written as `score<TAB>translation`, beams of one input
on consecutive lines, inputs separated by an empty line. With `--reference_file`,
sacreBLEU (cased and uncased) and chrF of the output are printed at the end.
`--decode_jit_compile` decodes with XLA (`decoding.translate` pads batches so that it
compiles once per source-width bucket). `--constrain_trees` (parsing models) lets the
beam search write only valid trees over the input's words (`decoding.TreeConstraint`).

Paper settings: beam 4, alpha 0.6, input length + 50, average of the last 5 (base)
or 20 (big) checkpoints: `--beam_size=4 --alpha=0.6 --extra_decode_length=50
--average_last_n=5`.
"""

from __future__ import annotations

import sys

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_string("input_file", None, "Source sentences, one per line (default stdin).")
flags.DEFINE_string("output_file", None, "Where translations go (default stdout).")
flags.DEFINE_string("reference_file", None, "Reference translations: print BLEU and chrF.")
flags.DEFINE_string("checkpoint_path", None, "A specific checkpoint (default: latest).")
flags.DEFINE_integer("average_last_n", 0, "Average the last N checkpoints on the fly.")
flags.DEFINE_string("decode_dtype", None,
                    "Override the model's dtype for decoding (e.g. float32).")
flags.DEFINE_bool("constrain_trees", False,
                  "Parsing models: let beam search write only linearized trees over "
                  "exactly the input's words (one POS tag per word, balanced brackets, "
                  "no empty constituents), instead of repairing outputs afterwards.")


def read_lines(path, what):
  """Lines of a UTF-8 file (or stdin) without their newline; clear errors."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras.data.sources import DataError
  if path is None:
    data = sys.stdin.buffer.read()
    path = "<stdin>"
  else:
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
      raise DataError(f"{what} {path} line {number} is not valid UTF-8 ({error.reason} at "
                      f"byte {error.start}); fix or re-encode the file (e.g. iconv -f "
                      "latin1 -t utf-8).") from None
  return out


def run() -> None:
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras import decoding, inference
  from t2t_keras.data.sources import DataError
  from t2t_keras.training import checkpoints

  tf.get_logger().setLevel("WARNING")
  decode_config = t2t_flags.decode_config()
  for warning in t2t_flags.check_inference_flags(
      sys.argv, checkpoints.load_model_config(FLAGS.model_dir), "decode",
      requested_vocab_size=inference.data_config_of(FLAGS.model_dir).vocab_size):
    logging.warning(warning)
  loaded = inference.load(FLAGS.model_dir, FLAGS.checkpoint_path, FLAGS.average_last_n,
                          FLAGS.decode_dtype)
  sentences = read_lines(FLAGS.input_file, "--input_file")
  references = None
  if FLAGS.reference_file:
    references = read_lines(FLAGS.reference_file, "--reference_file")
    if len(references) != len(sentences):
      raise DataError(f"--reference_file {FLAGS.reference_file} has {len(references)} "
                      f"lines but --input_file {FLAGS.input_file or '<stdin>'} has "
                      f"{len(sentences)}: they must be line-aligned.")
  print(f"decoding {len(sentences)} sentences with {', '.join(loaded.checkpoints)} (beam "
        f"{decode_config.beam_size}, alpha {decode_config.alpha}, extra length "
        f"{decode_config.extra_decode_length})", file=sys.stderr, flush=True)
  constraint = None
  if FLAGS.constrain_trees:
    try:
      constraint = decoding.TreeConstraint.from_tokenizer(loaded.tokenizer)
    except ValueError as error:
      raise DataError(f"--constrain_trees with --model_dir={FLAGS.model_dir}: "
                      f"{error}") from None
  results = decoding.translate(loaded.model, loaded.tokenizer, sentences, decode_config,
                               max_input_length=FLAGS.max_input_length,
                               tree_constraint=constraint)
  out = (tf.io.gfile.GFile(FLAGS.output_file, "w") if FLAGS.output_file else sys.stdout)
  try:
    for result in results:
      if decode_config.return_beams:
        for text, score in zip(result.texts, result.scores):
          out.write(f"{score:.4f}\t{text}\n")
        out.write("\n")
      else:
        out.write(result.texts[0] + "\n")
  finally:
    if FLAGS.output_file:
      out.close()
  if references is not None:
    from t2t_keras import metrics
    report = metrics.bleu_report([r.texts[0] for r in results], [references])
    print(metrics.format_report(report), file=sys.stderr, flush=True)


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not FLAGS.model_dir:
    raise app.UsageError("--model_dir is required (the directory training wrote).")
  from t2t_keras.errors import USER_ERRORS  # pylint: disable=import-outside-toplevel
  try:
    run()
  except (*USER_ERRORS, flags.ValidationError) as error:
    logging.debug("user error", exc_info=True)
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
