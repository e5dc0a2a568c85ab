"""Draws a run's learning curves from its TensorBoard logs into a PNG.

  python tools/plot_learning_curve.py --model_dir=/tmp/m30k --output=curve.png

Reads the scalars the trainer writes: `<model_dir>/eval` (dev loss, accuracy, and BLEU
when training ran with --eval_bleu_sentences, each with `train_minutes`) and
`<model_dir>/train` (training loss). The x axis is training time in minutes (dev
evaluation excluded) when the run logged it, else the step. Panels: training and
dev loss, and dev BLEU when present. Several `--model_dir`s (comma-separated) are
drawn on the same axes for comparisons; `--labels` names them.

After `pip install`, `t2t-plot-learning-curve` is this tool (same flags).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from t2t_keras.trained import modeldir  # noqa: E402
from t2t_keras import console  # noqa: E402

console.quiet_tensorflow()  # before TensorFlow is imported

flags.DEFINE_list("model_dir", None, "Training directories (comma-separated).")
flags.DEFINE_list("labels", None, "A legend label per --model_dir (default: its name).")
flags.DEFINE_string("output", None, "The PNG to write.")
flags.DEFINE_string("title", None, "Figure title (default: the model directories).")
flags.mark_flags_as_required(["model_dir", "output"])
FLAGS = flags.FLAGS

# pylint: disable=wrong-import-position
from t2t_keras.learning_curves import plot, read_scalars  # noqa: E402

def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  labels = FLAGS.labels or [os.path.basename(os.path.normpath(d)) for d in FLAGS.model_dir]
  if len(labels) != len(FLAGS.model_dir):
    raise app.UsageError(f"--labels has {len(labels)} names for {len(FLAGS.model_dir)} "
                         "--model_dir entries.")
  runs = []
  for label, model_dir in zip(labels, FLAGS.model_dir):
    train = read_scalars(modeldir.logs_dir(model_dir, "train"))
    ev = read_scalars(modeldir.logs_dir(model_dir, "eval"))
    if not train and not ev:
      print(f"error: no TensorBoard scalars under {model_dir}/train or {model_dir}/eval: "
            "is it the --model_dir of a training run?", file=sys.stderr)
      sys.exit(1)
    runs.append((label, train, ev))
  panels = plot(runs, FLAGS.output, FLAGS.title or ", ".join(FLAGS.model_dir))
  print(f"wrote {FLAGS.output} ({' and '.join(panels)})")


def console_main():
  """The `t2t-plot-learning-curve` command (setup.py) and `python tools/plot_learning_curve.py`."""
  console.own_help(__name__)
  app.run(main)


if __name__ == "__main__":
  console_main()
