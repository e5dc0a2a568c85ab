"""Learning curves from a training run's TensorBoard logs.

The trainer writes `<model_dir>/train` (training loss, learning rate, throughput) and
`<model_dir>/eval` (dev loss, accuracy, BLEU when --eval_bleu_sentences is set, and
`train_minutes`: training time with dev evaluation excluded). `read_scalars` reads
them back; `plot` draws loss (and dev BLEU) against training time or step.
Used by t2t_keras/tools/plot_learning_curve.py and t2t_keras/tools/run_recipe.py.
"""

from __future__ import annotations

import collections
import os
from typing import Dict, List, Tuple

Series = Dict[str, List[Tuple[int, float]]]  # tag -> [(step, value)] sorted by step


def read_scalars(log_dir: str) -> Series:
  """Every scalar of the event files in `log_dir` as tag -> sorted (step, value).

  A step logged twice (a resumed run re-evaluating the same step) keeps the last value.
  """
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  from tensorflow.core.util import event_pb2
  values: Dict[str, Dict[int, float]] = collections.defaultdict(dict)
  if not tf.io.gfile.isdir(log_dir):
    return {}
  for name in sorted(tf.io.gfile.listdir(log_dir)):
    if "tfevents" not in name:
      continue
    # Records read as tf.data does: tf.compat.v1.train.summary_iterator logs a
    # deprecation warning into the user's terminal.
    try:
      for record in tf.data.TFRecordDataset(os.path.join(log_dir, name)):
        event = event_pb2.Event.FromString(record.numpy())
        for value in event.summary.value:
          if value.HasField("tensor"):
            number = float(tf.make_ndarray(value.tensor))
          elif value.HasField("simple_value"):
            number = value.simple_value
          else:
            continue
          values[value.tag][int(event.step)] = number
    except tf.errors.DataLossError:
      pass  # a live run's last record, half written: the curves up to it
  return {tag: sorted(points.items()) for tag, points in values.items()}


def time_axis(eval_scalars: Series):
  """step -> training minutes from the eval logs' `train_minutes`, or None."""
  points = eval_scalars.get("train_minutes")
  return dict(points) if points else None


def interpolate(step: int, known: Dict[int, float]) -> float:
  """Training minutes at `step`, linear between the logged evaluation steps."""
  steps = sorted(known)
  if step <= steps[0]:
    return known[steps[0]] * step / max(steps[0], 1)
  for a, b in zip(steps, steps[1:]):
    if a <= step <= b:
      return known[a] + (known[b] - known[a]) * (step - a) / max(b - a, 1)
  last = steps[-1]
  rate = known[last] / max(last, 1)
  return known[last] + rate * (step - last)


def plot(runs, output: str, title: str) -> List[str]:
  """Draws the curves of `runs` [(label, train scalars, eval scalars)] into `output`.

  Returns:
    The panel names drawn.
  """
  # pylint: disable=import-outside-toplevel
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  has_bleu = any("bleu" in ev for _, _, ev in runs)
  panels = ["loss"] + (["bleu"] if has_bleu else [])
  fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
  axes = axes[0]
  use_time = all(time_axis(ev) for _, _, ev in runs)
  for label, train, ev in runs:
    minutes = time_axis(ev) if use_time else None

    def x_of(points):
      steps = [s for s, _ in points]
      return [interpolate(s, minutes) for s in steps] if minutes else steps

    if "loss" in train:
      axes[0].plot(x_of(train["loss"]), [v for _, v in train["loss"]], alpha=0.6,
                   label=f"{label} train")
    if "loss" in ev:
      axes[0].plot(x_of(ev["loss"]), [v for _, v in ev["loss"]], marker="o", markersize=3,
                   label=f"{label} dev")
    if has_bleu and "bleu" in ev:
      axes[1].plot(x_of(ev["bleu"]), [v for _, v in ev["bleu"]], marker="o", markersize=3,
                   label=label)
      best_step, best = max(ev["bleu"], key=lambda p: p[1])
      axes[1].annotate(f"{best:.1f}", (x_of([(best_step, best)])[0], best),
                       textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
  xlabel = "training minutes (dev evaluation excluded)" if use_time else "step"
  axes[0].set_ylabel("cross-entropy (nats/token, label-smoothed for train)")
  axes[0].set_title("loss")
  if has_bleu:
    axes[1].set_ylabel("sacreBLEU")
    axes[1].set_title("dev BLEU (beam search, cased)")
  for ax in axes:
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(output, dpi=110)
  plt.close(fig)
  return panels
