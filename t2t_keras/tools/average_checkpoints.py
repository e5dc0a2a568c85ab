"""Averages the model weights of the last N checkpoints into a new model directory.

  python tools/average_checkpoints.py --model_dir=M --output_dir=M_avg --last_n=5

The output directory holds `ckpt-<newest step>` (model weights only), `config.json`
and the vocabulary, so it works as the --model_dir of decode and export. To decode
with an average without writing one, use `decode --average_last_n=5` instead.

It is a thin CLI: the work is t2t_keras.trained.averaging.write_averaged.

After `pip install`, `t2t-average-checkpoints` is this tool (same flags).
"""


from absl import app, flags, logging

from t2t_keras import console, errors  # noqa: E402

console.quiet_tensorflow()  # before TensorFlow is imported

from t2t_keras.trained import averaging  # noqa: E402

flags.DEFINE_string("model_dir", None, "The training directory holding ckpt-<step> files.")
flags.DEFINE_string("output_dir", None,
                    "Where the averaged checkpoint, config.json and vocabulary go.")
flags.DEFINE_integer("last_n", 5, "How many of the newest checkpoints to average "
                     "(the paper: 5 for base, 20 for big).", lower_bound=1)
flags.DEFINE_boolean("overwrite", False, "Replace checkpoints already in --output_dir.")
flags.mark_flags_as_required(["model_dir", "output_dir"])
FLAGS = flags.FLAGS


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  tf.get_logger().setLevel("WARNING")
  path = averaging.write_averaged(FLAGS.model_dir, FLAGS.output_dir, FLAGS.last_n,
                                  overwrite=FLAGS.overwrite)
  print(f"wrote {path}: the average of the last {FLAGS.last_n} checkpoint(s) of "
        f"{FLAGS.model_dir}")


def console_main():
  """The `t2t-average-checkpoints` command (setup.py) and `python tools/average_checkpoints.py`."""
  console.own_help(__name__)
  logging.set_verbosity(logging.INFO)
  app.run(errors.reporting_user_errors(main))


if __name__ == "__main__":
  console_main()
