"""Scores existing translations with a trained model: `python -m t2t_keras.score
--model_dir=M --source_file=S --target_file=T [--output_file=F] [--per_token]`.

One line per pair, in input order: the total log probability of the target given
the source (natural log, EOS included), a tab, the number of target tokens (EOS
included); with `--per_token`, a tab and every token's log probability. Used to filter
back-translations, to rerank, and to compare engines (CTranslate2's `score_batch`
gives the same numbers for an exported model). `--model_dir=A,B` scores with the
ensemble's averaged log probabilities, renormalised as decode's search renormalises them
(the scores decode gives the ensemble's outputs).
"""

from __future__ import annotations

import sys

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags
from t2t_keras import outputs
from t2t_keras.configs import DecodeConfig
from t2t_keras.errors import DataError
from t2t_keras.textio import read_lines
from t2t_keras.trained import modeldir

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_string("source_file", None, "Source sentences, one per line.")
flags.DEFINE_string("target_file", None, "Target sentences (translations to score), "
                    "line-aligned with --source_file.")
t2t_flags.define_output_file("Where scores go (default stdout).")
flags.declare_key_flag("output_file")  # listed under this command's --help
flags.DEFINE_bool("per_token", False, "Append each token's log probability (space "
                  "separated, EOS last) after a tab.")


# The decoding flags scoring reads (which weights, how sources are cut and batched).
SCORING_FLAGS = ("average_last_n", "checkpoint_path", "decode_dtype", "decode_batch_size",
                 "max_input_length", "target_language")


def run() -> None:
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras.inference.translator import Translator

  tf.get_logger().setLevel("WARNING")
  model_dirs = t2t_flags.model_dirs()
  recipe = t2t_flags.use_recipe(model_dirs[0])  # its --average_last_n, ...
  for warning in t2t_flags.check_inference_flags(
      sys.argv, modeldir.load_model_config(model_dirs[0]), "score",
      reads=("source_file", "target_file", "output_file", "per_token"),
      requested_vocab_size=modeldir.data_config_of(model_dirs[0]).vocab_size):
    logging.warning(warning)
  outputs.check_paths({"--output_file": FLAGS.output_file},
                      {"--source_file": FLAGS.source_file,
                       "--target_file": FLAGS.target_file})
  sources = read_lines(FLAGS.source_file, "--source_file", DataError)
  targets = read_lines(FLAGS.target_file, "--target_file", DataError)
  if len(sources) != len(targets):
    raise DataError(f"--source_file {FLAGS.source_file} has {len(sources)} lines but "
                    f"--target_file {FLAGS.target_file} has {len(targets)}: they must be "
                    "line-aligned (one target per source).")
  # Scoring reads these decoding settings only, one batch at a time.
  config = DecodeConfig(batch_size=FLAGS.decode_batch_size,
                        max_input_length=FLAGS.max_input_length,
                        target_language=FLAGS.target_language, parallel_batches=1)
  translator = Translator.load(model_dirs, config, t2t_flags.weights_config(sys.argv))
  origin = recipe.describe(SCORING_FLAGS)
  print(f"scoring {len(sources)} pairs with {translator.describe_weights()}"
        f"{f'; {origin}' if origin else ''}", file=sys.stderr, flush=True)
  results = translator.score(list(zip(sources, targets)), progress=True, stream=sys.stderr)
  with outputs.PendingOutputs() as pending:  # renamed to --output_file when complete
    out = pending.open(FLAGS.output_file) if FLAGS.output_file else sys.stdout
    for result in results:
      line = f"{result.total:.4f}\t{len(result.log_probs)}"
      if FLAGS.per_token:
        line += "\t" + " ".join(f"{v:.4f}" for v in result.log_probs)
      out.write(line + "\n")
    pending.commit()
  if results:
    total = sum(r.total for r in results)
    tokens = sum(len(r.log_probs) for r in results)
    print(f"scored {len(results)} pairs: {total / tokens:.4f} nats per target token "
          f"(perplexity {2.718281828459045 ** (-total / tokens):.3f})", file=sys.stderr,
          flush=True)


def check_usage() -> None:
  if not FLAGS.source_file or not FLAGS.target_file:
    raise app.UsageError("--source_file and --target_file are required.")


command = console.Command(run, check=check_usage)
main, console_main = command.main, command.console_main  # console_main: python -m
console_script_main = command.console_script_main  # t2t-score

if __name__ == "__main__":
  console_main()
