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

  from t2t_keras.trained import modeldir
  from t2t_keras import language_tags
  from t2t_keras.inference import loading, scoring, translate
  from t2t_keras.textio import read_lines
  from t2t_keras.errors import ConfigError, DataError

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
  try:
    language = language_tags.check_request(
        FLAGS.target_language, modeldir.data_config_of(model_dirs[0]), "--target_language")
  except ValueError as error:
    raise ConfigError(str(error)) from None
  weights = t2t_flags.weights_config(sys.argv)
  model, loaded = loading.load_ensemble(model_dirs, weights.checkpoint_path,
                                        weights.average_last_n, weights.dtype)
  tokenizer = loaded[0].tokenizer
  tag = [tokenizer.tag_id(language)] if language else []  # the source's first piece
  origin = recipe.describe(SCORING_FLAGS)
  used = "; ".join(("the average of " if len(l.checkpoints) > 1 else "")
                   + ", ".join(l.checkpoints) for l in loaded)
  print(f"scoring {len(sources)} pairs with {used}{f'; {origin}' if origin else ''}",
        file=sys.stderr, flush=True)
  source_ids = [scoring.with_eos(tag + s) for s in tokenizer.tokenize(tf.constant(
      sources or [""])).to_list()]
  target_ids = [scoring.with_eos(t) for t in tokenizer.target.tokenize(tf.constant(targets or
                                                                            [""])).to_list()]
  if not sources:
    source_ids = target_ids = []
  limit = FLAGS.max_input_length
  note = translate.truncation_note(sum(len(s) > limit for s in source_ids),
                                   len(source_ids), limit, "sources", "score")
  if note:
    print(note, file=sys.stderr, flush=True)
  source_ids = [s if len(s) <= limit else s[:limit - 1] + [s[-1]] for s in source_ids]
  meter = console.Progress(len(sources), unit="pairs", verb="scored")
  results = scoring.force(model, source_ids, target_ids,
                          batch_size=FLAGS.decode_batch_size, progress=meter)
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
