"""Per-step cost of beam search at a forced length: Transformer base, random weights.

What it measures: the cost of a decoding step (matmuls, cache, beam bookkeeping) when
every row runs to the length limit. What users meet is bench/decode_real.py: a trained
model ends its sentences, so the early stop, finished sentences and the cache's size
decide the speed there, and none of them shows here.

Transformer base (6+6 layers, d_model 512, d_ff 2048, 8 heads), shared 32,000
vocabulary, random weights; 64 source sentences of 20 tokens, batch 32, beam 4,
alpha 0.6, decoding to the maximum length of 70 (= 20 + 50; random weights never
choose EOS). Prints sentences/s, target tokens/s and the ratio of the estimated
matmul FLOP/s to the machine's measured float32 matmul peak, for each config:
  graph        decoding.decode_ids in a tf.function (the decode CLI's default);
  xla          the same compiled with XLA (--decode_jit_compile);
  saved_model  the model exported (export.saved_model.Translator) and loaded as TF Serving loads
               it: the TF1 session loader, the `translate_ids` signature fed and
               fetched by tensor name, no XLA;
  saved_model_xla  the same exported with `--export_jit_compile` (beam search compiled
               by XLA inside the SavedModel; TF Serving needs
               --xla_cpu_compilation_enabled=true);
  ctranslate2  the same weights exported with `t2t_keras.export --format=ctranslate2`
               and decoded by CTranslate2 float32 `translate_batch` (beam 4, its
               length penalty at alpha, 70-token limit; needs the ctranslate2 extra).
The configs run alternately, one timed pass each in turn (`--repeats` rounds, the best
pass reported), so that they share the host's moods; each line gives the ratio to
CTranslate2 when it is among them. Translations are not compared here (random
weights; tests/ctranslate2_export_test.py compares them on a trained model), only
the output tokens, which should be the same count on every path.

    python bench/decode_speed.py [--configs=graph,xla,saved_model,ctranslate2] [--repeats=3]
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import (IdTokenizer, machine, matmul_peak, print_table,  # noqa: E402
                          session_signature)

CONFIGS = ("graph", "xla", "saved_model", "saved_model_xla", "ctranslate2")
flags.DEFINE_list("configs", list(CONFIGS),
                  "graph (tf.function), xla, saved_model (exported, session-mode loader), "
                  "saved_model_xla (exported with --export_jit_compile), "
                  "ctranslate2 (the same weights, CTranslate2 float32).")
flags.DEFINE_integer("sentences", 64, "Source sentences.")
flags.DEFINE_integer("length", 20, "Source tokens per sentence (EOS included).")
flags.DEFINE_integer("batch", 32, "Sentences per batch.")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_float("alpha", 0.6, "Length penalty.")
flags.DEFINE_integer("extra_decode_length", 50, "Output length limit = source + this.")
flags.DEFINE_integer("vocab_size", 32000, "Shared vocabulary size.")
flags.DEFINE_integer("repeats", 3, "Timed passes over the sentences per config, "
                     "alternating (the best is reported).")
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


def session_decoder(model, decode_config, export_dir: str, jit_compile: bool = False):
  """The model exported and loaded as tensorflow_model_server loads it: ids -> ids."""
  from t2t_keras.export import saved_model  # pylint: disable=import-outside-toplevel
  translator = saved_model.Translator(
      model, IdTokenizer(), dataclasses.replace(decode_config, max_input_length=FLAGS.length + 1),
      jit_compile=jit_compile)
  path = saved_model.export(translator, export_dir, version=1)
  translate_ids = session_signature(path, "translate_ids", "input_ids", "output_ids")
  return lambda batch: (translate_ids(batch.numpy()),)


def ctranslate2_decoder(model, config, export_dir: str):
  """The same weights exported with `--format=ctranslate2`, decoded by CTranslate2
  float32 `translate_batch` (beam, length penalty and length limit as ours)."""
  # pylint: disable=import-outside-toplevel
  import ctranslate2

  from t2t_keras.export import ctranslate2 as ct2_export
  from t2t_keras.data.tokens.tokenizer import IntegerTokenizer
  path = ct2_export.export(model, config, IntegerTokenizer(FLAGS.vocab_size),
                           export_dir)
  translator = ctranslate2.Translator(path, device="cpu", compute_type="float32",
                                      inter_threads=1, intra_threads=os.cpu_count() or 1)

  def decode(batch):
    tokens = [[str(i) for i in row if i > 1] + ["</s>"] for row in batch.numpy()]
    results = translator.translate_batch(
        tokens, beam_size=FLAGS.beam_size, length_penalty=FLAGS.alpha,
        max_batch_size=FLAGS.batch,
        max_decoding_length=FLAGS.length + FLAGS.extra_decode_length)
    return [len(r.hypotheses[0]) for r in results]
  return decode, f" (CTranslate2 {ctranslate2.__version__}, {os.cpu_count()} threads)"


def decoders(configs):
  """One random-weight model; {config: (batch -> output tokens per sentence, note)}."""
  # pylint: disable=import-outside-toplevel
  import keras
  import numpy as np
  import tensorflow as tf

  from t2t_keras.inference import decoding
  from t2t_keras.configs import DecodeConfig, ModelConfig
  from t2t_keras.model import create_model

  keras.utils.set_random_seed(0)
  config = ModelConfig(vocab_size=FLAGS.vocab_size)
  model = create_model(config)
  decode_config = DecodeConfig(beam_size=FLAGS.beam_size, alpha=FLAGS.alpha,
                               extra_decode_length=FLAGS.extra_decode_length)
  tmp = tempfile.mkdtemp(prefix="decode_speed_")  # removed by main
  made = {}
  for kind in configs:
    if kind in ("saved_model", "saved_model_xla"):
      xla = kind == "saved_model_xla"
      fn = session_decoder(model, decode_config, os.path.join(tmp, kind), jit_compile=xla)
      note = (" (exported" + (" with --export_jit_compile" if xla else "")
              + ", TF1 session loader, translate_ids by tensor name, as TF Serving)")
    elif kind == "ctranslate2":
      made[kind] = ctranslate2_decoder(model, config, os.path.join(tmp, "ct2"))
      continue
    else:
      xla = kind == "xla"
      fn = tf.function(lambda x, xla=xla: decoding.decode_ids(
          model, x, dataclasses.replace(decode_config, jit_compile=xla)),
                       jit_compile=xla or None, autograph=False)
      note = ""
    made[kind] = (lambda batch, fn=fn: list(np.sum(np.asarray(fn(batch)[0])[:, 0] != 0,
                                                  axis=-1)), note)
  return config, made, tmp


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  import numpy as np
  import tensorflow as tf

  from t2t_keras import EOS_ID
  for config in FLAGS.configs:
    if config not in CONFIGS:
      raise app.UsageError(f"--configs: unknown config {config!r}; use "
                           f"{', '.join(CONFIGS)}.")
  print(f"machine: {machine()}")
  peak = matmul_peak("float32")
  print(f"measured float32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
  model_config, made, tmp = decoders(FLAGS.configs)
  rng = np.random.default_rng(0)
  sources = rng.integers(4, FLAGS.vocab_size, (FLAGS.sentences, FLAGS.length)).astype("int32")
  sources[:, -1] = EOS_ID
  batches = [tf.constant(sources[i:i + FLAGS.batch])
             for i in range(0, FLAGS.sentences, FLAGS.batch)]
  for decode, _ in made.values():
    decode(batches[0])  # trace / compile / warm up
  best = {kind: float("inf") for kind in made}
  tokens = {}
  for _ in range(FLAGS.repeats):  # the configs alternate, pass by pass
    for kind, (decode, _) in made.items():
      start, count = time.perf_counter(), 0
      for batch in batches:
        count += int(sum(decode(batch)))
      best[kind] = min(best[kind], time.perf_counter() - start)
      tokens[kind] = count
  steps = FLAGS.length + FLAGS.extra_decode_length
  total_flops = sum(decode_flops(model_config, int(b.shape[0]), FLAGS.length, steps,
                                 FLAGS.beam_size) for b in batches)
  reference = best.get("ctranslate2")
  rows = []
  for kind, (_, note) in made.items():
    seconds = best[kind]
    name = "float32+" + kind
    versus = f", {reference / seconds:.2f}x CTranslate2" if reference else ""
    print(f"{name}: {FLAGS.sentences / seconds:.2f} sentences/s, "
          f"{tokens[kind] / seconds:,.0f} target tokens/s ({tokens[kind]} tokens{versus})"
          f"{note}", flush=True)
    rows.append((name, f"{FLAGS.sentences / seconds:.2f}", f"{tokens[kind] / seconds:,.0f}",
                 f"{total_flops / seconds / 1e9:.1f}", f"{total_flops / seconds / peak:.2f}",
                 f"{reference / seconds:.2f}" if reference else "-"))
  print()
  print_table(rows, ["config", "sentences/s", "target tok/s", "GFLOP/s", "ratio to peak",
                     "x CTranslate2"])
  shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  app.run(main)
