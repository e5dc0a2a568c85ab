"""Measures the input pipeline's throughput (sentence pairs/s, tokens/s) on real data.

The training step must never wait for data, so the pipeline must deliver batches
faster than the model consumes them. This prints two figures on Tatoeba DE-EN:
  * cold: tokenizing text in tf.data (what the first run pays once per corpus),
  * warm: token-budget batches from the tokenized cache (what every step sees).
The 8k vocabulary and the cache are built once into --work_dir and reused.

  .venv/bin/python bench/pipeline_throughput.py [--seconds=10] [--static_shapes]
"""

import os
import sys
import time

from absl import app, flags, logging

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import tensorflow as tf  # noqa: E402

from t2t_keras import PAD_ID  # noqa: E402
from t2t_keras.configs import DataConfig  # noqa: E402
from t2t_keras.data.tokens import cache  # noqa: E402
from t2t_keras.data.sources import sources  # noqa: E402
from t2t_keras.data import make_datasets  # noqa: E402

flags.DEFINE_string("corpus", os.path.join(os.path.dirname(REPO), "shared", "data",
                                           "tatoeba_deu_eng"),
                    "Folder with train.en / train.de.")
flags.DEFINE_string("work_dir", "/tmp/t2t_keras_bench", "Vocabulary and cache.")
flags.DEFINE_integer("vocab_size", 8000, "Shared BPE vocabulary size.")
flags.DEFINE_integer("batch_size", 4096, "Token budget per batch.")
flags.DEFINE_integer("max_length", 256, "Longest pair kept.")
flags.DEFINE_boolean("static_shapes", False, "Pad to bucket boundaries (TPU mode).")
flags.DEFINE_float("seconds", 10.0, "Duration of each measurement.")
flags.DEFINE_integer("cold_pairs", 50_000, "Pairs tokenized for the cold figure.")
FLAGS = flags.FLAGS


def _measure(ds: tf.data.Dataset, seconds: float, count_fn):
  """Iterates ds for about `seconds` (after a warm-up); returns (units..., elapsed)."""
  iterator = iter(ds)
  warm_up = time.perf_counter()
  while time.perf_counter() - warm_up < seconds / 2:  # Fill shuffle buffer, prefetch.
    next(iterator)
  totals, start = None, time.perf_counter()
  while time.perf_counter() - start < seconds:
    counts = count_fn(next(iterator))
    totals = counts if totals is None else [a + b for a, b in zip(totals, counts)]
  return totals, time.perf_counter() - start


def main(argv):
  del argv
  if not os.path.isdir(FLAGS.corpus):
    sys.exit(f"Corpus folder {FLAGS.corpus} not found (expected ../shared/data).")
  config = DataConfig(
      source="files", train_src=os.path.join(FLAGS.corpus, "train.en"),
      train_tgt=os.path.join(FLAGS.corpus, "train.de"), data_dir=FLAGS.work_dir,
      vocab_size=FLAGS.vocab_size, batch_size=FLAGS.batch_size,
      max_length=FLAGS.max_length, static_shapes=FLAGS.static_shapes)
  start = time.perf_counter()
  data = make_datasets(config)
  print(f"Setup (vocabulary + cache, built on the first run only): "
        f"{time.perf_counter() - start:.1f}s; vocab_size={data.vocab_size}; "
        f"{data.train_stats.kept_for_training} training pairs")

  text = sources.text_pairs(config, "train").take(FLAGS.cold_pairs).cache().repeat()
  cold = cache.tokenize_pairs(text, data.tokenizer, None)  # Batches of ragged ids.
  (pairs, tokens), secs = _measure(
      cold, FLAGS.seconds / 2,
      lambda b: [int(b[0].nrows()), int(tf.size(b[0].flat_values) +
                                        tf.size(b[1].flat_values))])
  print(f"cold (tokenize text in tf.data): {pairs / secs:,.0f} pairs/s, "
        f"{tokens / secs:,.0f} tokens/s")

  def count(batch):  # In the graph, so Python work per batch stays negligible.
    real = [tf.cast(batch[k] != PAD_ID, tf.int32) for k in ("inputs", "targets")]
    return tf.stack([tf.reduce_sum(real[0][:, 0]), tf.reduce_sum(real[0]) +
                     tf.reduce_sum(real[1]), tf.size(real[0]) + tf.size(real[1]), 1])

  (pairs, tokens, padded, batches), secs = _measure(
      data.train_fn().map(count), FLAGS.seconds, lambda c: c.numpy().tolist())
  mode = "static" if FLAGS.static_shapes else "dynamic"
  print(f"warm ({mode} shapes, batch_size={FLAGS.batch_size}): "
        f"{pairs / secs:,.0f} pairs/s, {tokens / secs:,.0f} tokens/s "
        f"(ids incl. EOS, both sides), {batches / secs:,.1f} batches/s, "
        f"padding {1 - tokens / padded:.1%}")


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  app.run(main)
