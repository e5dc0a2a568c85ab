"""Memory of one input pipeline of the training input, per pair of the corpus.

Writes a tokenized cache of --pairs synthetic pairs (lengths around --mean_ids a side,
as WMT's subwords) in the cache's layout, then, in a fresh process per case, builds
`TrainData`'s plan for pipeline 0 of P and runs the first op of its dataset (the
loader of its share): the bytes of the share it keeps, and the process's resident
memory after it and at its peak (the files are read whole, one at a time, before the
share is kept; the allocator keeps freed memory for reuse, so resident exceeds the
share). Static shapes: one dataset per pool, measured for the largest pool.

  .venv/bin/python bench/input_memory.py [--pairs=1000000] [--pipelines=1,4]

Per-pair figures scale to a corpus: x 4.5M for WMT14 EN-DE, x 36M for EN-FR.
"""

import os
import subprocess
import sys
import tempfile

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

flags.DEFINE_integer("pairs", 1_000_000, "Pairs in the corpus.")
flags.DEFINE_integer("mean_ids", 30, "Mean ids a side.")
flags.DEFINE_list("pipelines", ["1", "4"], "Input pipelines (hosts) to measure.")
flags.DEFINE_string("child", None, "Internal: measure one case.")
FLAGS = flags.FLAGS


def _memory():
  with open("/proc/self/status", encoding="ascii") as f:
    fields = dict(line.split(":", 1) for line in f)
  return [int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")]


def _write_cache(folder):
  import numpy as np  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.tokens import cache  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  lengths = np.clip(rng.normal(FLAGS.mean_ids, 12, [FLAGS.pairs, 2]), 1, 250).astype(
      np.int32)
  ids = [rng.integers(4, 32000, int(lengths[:, i].sum()), dtype=np.int32)
         for i in range(2)]
  for length, arrays in cache.group_by_length(*ids, lengths).items():
    for what, array in zip(("source", "target", "lengths"), arrays):
      with open(cache._file(folder, length, what), "wb") as f:  # pylint: disable=protected-access
        f.write(array.astype("<i4").tobytes())
  np.save(os.path.join(folder, "lengths.npy"), lengths)


def _child(folder, case):
  # pylint: disable=import-outside-toplevel
  import numpy as np
  import tensorflow as tf
  from t2t_keras.configs import DataConfig
  from t2t_keras.data.tokens import cache
  from t2t_keras.data.batching import pipeline
  pipelines, static = int(case.split(",")[0]), case.endswith("static")
  split = cache.TokenizedSplit(path=folder, lengths=np.load(
      os.path.join(folder, "lengths.npy")), invalid_utf8=0)
  data = pipeline.TrainData(DataConfig(batch_size=4096, max_length=256), split)
  plan = data.plan(pipelines)
  # What a dataset loads: every pool (dynamic), or one pool (static: the largest).
  pools = ([int(np.argmax(plan.pool_pairs))] if static
           else list(range(len(plan.pool_bucket))))
  load = tf.function(plan.share_loader(split, pools, pipelines, 0))
  before, _ = _memory()
  share = load()
  after, peak = _memory()
  live = sum(t.values.numpy().nbytes + t.row_splits.numpy().nbytes for t in share)
  read = sum(plan.pool_pairs[p] for p in pools)
  print(f"{case:>10}: {read} pairs read; share {live / FLAGS.pairs:4.0f} B/pair of the "
        f"corpus; resident +{(after - before) / FLAGS.pairs:4.0f}, peak "
        f"+{(peak - before) / FLAGS.pairs:4.0f} B/pair", flush=True)


def main(_):
  if FLAGS.child:
    _child(*FLAGS.child.split(":"))
    return
  with tempfile.TemporaryDirectory() as folder:
    _write_cache(folder)
    for pipelines in FLAGS.pipelines:
      for mode in ("dynamic", "static"):
        subprocess.run([sys.executable, __file__, f"--pairs={FLAGS.pairs}",
                        f"--child={folder}:{pipelines},{mode}"], check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


if __name__ == "__main__":
  app.run(main)
