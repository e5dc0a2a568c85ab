"""One sentence's decoding time per output position, t2t_keras against CTranslate2.

    python bench/step_time.py --model_dir=<model> --src=test2016.en --line=1

One source sentence, beam search (beam 4, alpha 0), decoded alone by each engine with
its output held to at least each of --min_lengths positions (the same length limit for
all), so that the time's growth over the lengths is the cost of one step of the search
(one output position for the whole beam) and the rest is the encoder and per-request
work. Engines take turns, --repeats times; the median counts. Engines: the decode path
in graph mode and under XLA (`decoding.make_decode_fn`, what the exports run), the XLA
export in a TF1 session as TF Serving runs it (one export per length: the minimum
length is part of the export), CTranslate2 float32 on the same weights (converted as
`python -m t2t_keras.export --format=ctranslate2` converts).

With --matmul_floor, also the step's matrix products alone: the decoder's projections
and the output layer of this model, on beam-size rows, chained as in a step and
compiled by XLA in a loop (no attention, normalisation or search). Their time is what
a step cannot go below with XLA's own matmuls on this CPU; 1 row shows the
matrix-vector case.
"""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common  # noqa: E402  pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A trained model directory.", required=True)
flags.DEFINE_string("src", None, "Source sentences, one per line.", required=True)
flags.DEFINE_integer("line", 1, "Which line of --src (1-based).")
flags.DEFINE_list("min_lengths", ["12", "32"], "Output lengths to hold each engine to.")
flags.DEFINE_integer("repeats", 30, "Timed requests per engine and length.")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_integer("average_last_n", 1, "Checkpoints to average.")
flags.DEFINE_boolean("matmul_floor", True, "Also time the step's matrix products alone.")
flags.DEFINE_boolean("exact_lengths", False, "Hold each output to exactly each length (the "
                     "limit too): for a model that does not end its sentences, such as "
                     "one with untrained weights, whose step costs the same.")


def matmul_floor(model_config, rows: int, steps: int = 100) -> float:
  """Seconds per step of the decoder's matrix products and the output layer, on `rows`
  rows, chained as in a step, in an XLA-compiled loop of `steps` steps."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  d, f, v = model_config.hidden_size, model_config.filter_size, model_config.vocab_size
  rng = tf.random.Generator.from_seed(0)
  kernels = []
  for _ in range(model_config.num_hidden_layers):
    # Self-attention's fused query/key/value and output; cross-attention's query and
    # output (its keys and values are made once per sentence); the feed-forward pair.
    kernels.append([tf.Variable(rng.normal([a, b]) * 0.05)
                    for a, b in ((d, 3 * d), (d, d), (d, d), (d, d), (d, f), (f, d))])
  embedding = tf.Variable(rng.normal([d, v]) * 0.05)

  @tf.function(jit_compile=True)
  def loop(x):
    def body(i, x):
      for qkv, out, cross_q, cross_out, ff1, ff2 in kernels:
        x = x + tf.matmul(tf.matmul(x, qkv)[:, :d], out)
        x = x + tf.matmul(tf.matmul(x, cross_q), cross_out)
        x = x + tf.matmul(tf.nn.relu(tf.matmul(x, ff1)), ff2)
        x = x / (1.0 + tf.reduce_max(tf.abs(x)))  # keeps the values finite
      return i + 1, x + 1e-6 * tf.reduce_max(tf.matmul(x, embedding))
    return tf.while_loop(lambda i, x: i < steps, body, (0, x))[1]

  x = rng.normal([rows, d])
  loop(x).numpy()
  times = []
  for _ in range(7):
    start = time.perf_counter()
    loop(x).numpy()
    times.append(time.perf_counter() - start)
  return statistics.median(times) / steps


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  import ctranslate2

  import numpy as np
  import sentencepiece

  from t2t_keras.trained import modeldir
  from t2t_keras.configs import DecodeConfig, WeightsConfig
  from t2t_keras.export import ExportSettings
  from t2t_keras.export import ctranslate2 as ct2_export
  from t2t_keras.export import saved_model
  from t2t_keras.inference import decoding, loading, translate

  with open(FLAGS.src, encoding="utf-8") as f:
    sentence = f.read().splitlines()[FLAGS.line - 1]
  loaded = loading.load(FLAGS.model_dir, average_last_n=FLAGS.average_last_n,
                        dtype="float32")
  spm = sentencepiece.SentencePieceProcessor(model_file=modeldir.vocab_path(FLAGS.model_dir))
  tokens = spm.encode(sentence, out_type=str)
  lengths = [int(n) for n in FLAGS.min_lengths]
  limit = max(lengths) + 50  # output positions past the source's, for every length

  def config_for(length, jit):
    return DecodeConfig(beam_size=FLAGS.beam_size, alpha=0.0, batch_size=1,
                        extra_decode_length=limit, min_decode_length=length,
                        decode_length=length if FLAGS.exact_lengths else None,
                        jit_compile=jit, parallel_batches=1)

  tmp = tempfile.mkdtemp(prefix="step_time_")
  # The loaded session and translator hold what they need: the files go at the end.
  atexit.register(shutil.rmtree, tmp, True)
  ct2_path = os.path.join(tmp, "ct2")
  ct2_export.export(loaded.model, loaded.model_config, loaded.tokenizer, ct2_path)
  translator = ctranslate2.Translator(ct2_path, device="cpu")
  print(f"{common.machine()}; CTranslate2 {ctranslate2.__version__}; line {FLAGS.line} "
        f"of {FLAGS.src}: {len(tokens)} pieces; beam {FLAGS.beam_size}", flush=True)

  # engine -> length -> a function that decodes once and returns the output's pieces.
  engines = {}
  for name, jit in (("graph", False), ("XLA", True)):
    engines[name] = {}
    for length in lengths:
      config = config_for(length, jit)
      decode_fn = decoding.make_decode_fn(loaded.model, config)
      engines[name][length] = (
          lambda fn=decode_fn, c=config: len(translate.translate(
              fn, loaded.tokenizer, [sentence], c, progress=False)[0].ids[0]))
  engines["export XLA"] = {}
  for length in lengths:
    path = saved_model.export_from_settings(ExportSettings(
        FLAGS.model_dir, os.path.join(tmp, f"export{length}"), config_for(length, False),
        WeightsConfig(average_last_n=FLAGS.average_last_n), jit_compile=True))
    run = common.session_signature(path, "serving_default", "inputs", "outputs")
    # Positions: the output's pieces again, and its EOS.
    engines["export XLA"][length] = (lambda r=run: len(spm.encode(
        r(np.array([sentence], dtype=object))[0].decode("utf-8"))) + 1)
  engines["ct2 float32"] = {
      length: (lambda n=length: len(translator.translate_batch(
          [tokens], beam_size=FLAGS.beam_size, length_penalty=0.0, min_decoding_length=n,
          max_decoding_length=n if FLAGS.exact_lengths else len(tokens) + limit
      )[0].hypotheses[0]) + 1)  # and EOS, as the ids count it
      for length in lengths}

  times = {(name, n): [] for name in engines for n in lengths}
  positions = {}
  for name, by_length in engines.items():  # warm-up: traces and compiles
    for n, run in by_length.items():
      positions[name, n] = run()
  for _ in range(FLAGS.repeats):
    for name, by_length in engines.items():
      for n, run in by_length.items():
        start = time.perf_counter()
        run()
        times[name, n].append(time.perf_counter() - start)

  rows = []
  for name in engines:
    medians = [statistics.median(times[name, n]) for n in lengths]
    spans = [positions[name, n] for n in lengths]
    step = ((medians[-1] - medians[0]) / (spans[-1] - spans[0])
            if spans[-1] > spans[0] else float("nan"))
    rows.append([name] + [f"{m * 1e3:.1f} ms ({p})" for m, p in zip(medians, spans)]
                + [f"{step * 1e3:.3f}", f"{(medians[0] - step * spans[0]) * 1e3:.1f}"])
  print("\nMedian request time (output positions, with EOS) at each minimum length; the "
        "step: the slope over the lengths; the rest: the fixed part")
  common.print_table(rows, ["engine"] + [f"min length {n}" for n in lengths]
                     + ["ms a step", "ms fixed"])
  if FLAGS.matmul_floor:
    config = loaded.model_config
    for rows_ in (FLAGS.beam_size, 1):
      print(f"the step's matrix products alone (XLA, {rows_} rows, {config.num_hidden_layers} "
            f"layers, d_model {config.hidden_size}, d_ff {config.filter_size}, vocabulary "
            f"{config.vocab_size}): {matmul_floor(config, rows_) * 1e3:.3f} ms a step")


if __name__ == "__main__":
  app.run(main)
