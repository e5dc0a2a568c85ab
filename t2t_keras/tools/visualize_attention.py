"""Draws the attention of a trained model on one sentence (the paper's Figures 3-5).

  python tools/visualize_attention.py --model_dir=/tmp/t2t_demo \
      --sentence="3 1 4 1 5 9" --output_dir=/tmp/attention

Writes encoder_layer<i>.png (encoder self-attention), decoder_layer<i>.png (decoder
self-attention) and cross_layer<i>.png (encoder-decoder attention), one heatmap per
head with the subword tokens on the axes, for the model's own translation.

After `pip install`, `t2t-visualize-attention` is this tool (same flags).
"""


from absl import app, flags

from t2t_keras import console, errors  # noqa: E402

console.quiet_tensorflow()  # before TensorFlow is imported

from t2t_keras import flags as t2t_flags  # noqa: E402
from t2t_keras.inference import attention_maps, loading  # noqa: E402

t2t_flags.define_decode_flags()
flags.DEFINE_string("model_dir", None, "A model directory written by training.")
flags.DEFINE_string("sentence", None, "The source sentence.")
flags.DEFINE_string("output_dir", "attention", "Where the PNG files go.")
FLAGS = flags.FLAGS


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not FLAGS.model_dir or FLAGS.sentence is None:
    raise app.UsageError("--model_dir and --sentence are required.")
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  tf.get_logger().setLevel("ERROR")
  loaded = loading.load(FLAGS.model_dir, FLAGS.checkpoint_path)
  maps = attention_maps.attention_maps(loaded.model, loaded.tokenizer, FLAGS.sentence,
                                       t2t_flags.decode_config())
  paths = attention_maps.plot_maps(maps, FLAGS.output_dir)
  print(f"source:      {' '.join(maps.source_tokens)}\n"
        f"translation: {maps.translation}\n"
        f"wrote {len(paths)} pictures to {FLAGS.output_dir}")


def console_main():
  """The `t2t-visualize-attention` command (setup.py) and `python tools/visualize_attention.py`."""
  console.own_help(__name__)
  app.run(errors.reporting_user_errors(main))


if __name__ == "__main__":
  console_main()
