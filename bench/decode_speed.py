"""Decoding speed of Transformer base with beam search on this machine.

Transformer base (6+6 layers, d_model 512, d_ff 2048, 8 heads), shared 32,000
vocabulary, random weights; 64 source sentences of 20 tokens, batch 32, beam 4,
alpha 0.6, decoding to the maximum length of 70 (= 20 + 50; random weights never
choose EOS). Prints sentences/s, target tokens/s and the ratio of the estimated
matmul FLOP/s to the machine's measured float32 matmul peak, for each config:
  graph        decoding.decode_ids in a tf.function (the decode CLI's default);
  xla          the same compiled with XLA (--decode_jit_compile);
  saved_model  the model exported (serving.Translator) and loaded as TF Serving loads
               it: the TF1 session loader, the `translate_ids` signature fed and
               fetched by tensor name, no XLA.

    python bench/decode_speed.py [--configs=graph,xla,saved_model] [--repeats=2]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import machine, matmul_peak, print_table, session_signature  # noqa: E402

flags.DEFINE_list("configs", ["graph", "xla", "saved_model"],
                  "graph (tf.function), xla, saved_model (exported, session-mode loader).")
flags.DEFINE_integer("sentences", 64, "Source sentences.")
flags.DEFINE_integer("length", 20, "Source tokens per sentence (EOS included).")
flags.DEFINE_integer("batch", 32, "Sentences per batch.")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_float("alpha", 0.6, "Length penalty.")
flags.DEFINE_integer("extra_decode_length", 50, "Output length limit = source + this.")
flags.DEFINE_integer("vocab_size", 32000, "Shared vocabulary size.")
flags.DEFINE_integer("repeats", 2, "Timed passes over the sentences (best is reported).")
FLAGS = flags.FLAGS


def decode_flops(config, batch: int, source: int, steps: int, beam: int) -> float:
  """Matmul FLOPs of encoding and `steps` cached decoder steps (2 per multiply-add)."""
  d, f, h = config.hidden_size, config.filter_size, config.num_heads
  dk, dv = config.head_key_size, config.head_value_size
  attn_proj = d * h * (2 * dk + 2 * dv)
  ffn = 2 * d * f
  encoder = batch * source * config.encoder_layers * (attn_proj + ffn) \
      + batch * config.encoder_layers * 2 * source * source * h * (dk + dv) / 2
  cross_kv = batch * source * config.decoder_layers * d * h * (dk + dv)
  rows = batch * beam
  per_step = rows * (config.decoder_layers * (attn_proj + d * h * (dk + dv) + ffn)
                     + d * config.vocab_size)
  attention = sum(rows * config.decoder_layers * h * (dk + dv) * (t + 1 + source)
                  for t in range(steps))
  return 2 * (encoder + cross_kv + per_step * steps + attention)


def session_decoder(model, decode_config, export_dir: str):
  """The model exported and loaded as tensorflow_model_server loads it: ids -> ids."""
  from t2t_keras import serving  # pylint: disable=import-outside-toplevel
  translator = serving.Translator(model, _IdTokenizer(), decode_config,
                                  max_input_length=FLAGS.length + 1)
  path = serving.export(translator, export_dir, version=1)
  translate_ids = session_signature(path, "translate_ids", "input_ids", "output_ids")
  return lambda batch: (translate_ids(batch.numpy()),)


class _IdTokenizer:
  """Stands in for the vocabulary: the benchmark feeds ids (translate_ids)."""

  def tokenize(self, strings):  # pragma: no cover - serving_default is not timed
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.strings.to_number(tf.strings.split(strings), tf.int32)

  def detokenize(self, ids):  # pragma: no cover
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.strings.reduce_join(tf.strings.as_string(ids), axis=-1, separator=" ")


def measure(kind: str):
  # pylint: disable=import-outside-toplevel
  import tempfile

  import keras
  import numpy as np
  import tensorflow as tf

  from t2t_keras import EOS_ID, decoding
  from t2t_keras.configs import DecodeConfig, ModelConfig
  from t2t_keras.model import create_model

  keras.utils.set_random_seed(0)
  config = ModelConfig(vocab_size=FLAGS.vocab_size)
  model = create_model(config)
  decode_config = DecodeConfig(beam_size=FLAGS.beam_size, alpha=FLAGS.alpha,
                               extra_decode_length=FLAGS.extra_decode_length)
  xla = kind == "xla"
  tmp = tempfile.TemporaryDirectory()
  if kind == "saved_model":
    fn = session_decoder(model, decode_config, tmp.name)
  else:
    fn = tf.function(lambda x: decoding.decode_ids(model, x, decode_config,
                                                   in_place_cache=xla),
                     jit_compile=xla or None, autograph=False)
  rng = np.random.default_rng(0)
  sources = rng.integers(4, FLAGS.vocab_size, (FLAGS.sentences, FLAGS.length)).astype("int32")
  sources[:, -1] = EOS_ID
  batches = [tf.constant(sources[i:i + FLAGS.batch])
             for i in range(0, FLAGS.sentences, FLAGS.batch)]
  fn(batches[0])  # trace / compile
  best, tokens = float("inf"), 0
  for _ in range(FLAGS.repeats):
    start, tokens = time.perf_counter(), 0
    for batch in batches:
      ids = fn(batch)[0]
      best_ids = np.asarray(ids)[:, 0]
      tokens += int(np.sum(best_ids != 0))
    best = min(best, time.perf_counter() - start)
  steps = FLAGS.length + FLAGS.extra_decode_length
  total_flops = sum(decode_flops(config, int(b.shape[0]), FLAGS.length, steps,
                                 FLAGS.beam_size) for b in batches)
  tmp.cleanup()
  return FLAGS.sentences / best, tokens / best, total_flops / best, tokens


def main(argv):
  del argv
  print(f"machine: {machine()}")
  peak = matmul_peak("float32")
  print(f"measured float32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
  rows = []
  for config in FLAGS.configs:
    if config not in ("graph", "xla", "saved_model"):
      raise app.UsageError(f"--configs: unknown config {config!r}; use graph, xla, "
                           "saved_model.")
    sentences, tokens, flop_rate, count = measure(config)
    rows.append((f"float32+{config}", f"{sentences:.2f}", f"{tokens:,.0f}",
                 f"{flop_rate / 1e9:.1f}", f"{flop_rate / peak:.2f}"))
    how = (" (exported, TF1 session loader, translate_ids by tensor name, as TF Serving)"
           if config == "saved_model" else "")
    print(f"float32+{config}: {sentences:.2f} sentences/s, {tokens:,.0f} target tokens/s "
          f"({count} tokens){how}", flush=True)
  print()
  print_table(rows, ["config", "sentences/s", "target tok/s", "GFLOP/s", "ratio to peak"])


if __name__ == "__main__":
  app.run(main)
