"""Where graph-mode decoding spends its time: an op-level profile of the export.

The decode_speed.py workload (Transformer base, random weights, shared 32,000
vocabulary, beam 4, alpha 0.6, sources of 20 tokens, output limit source + 50) is
exported as TF Serving runs it (`export.saved_model.Translator`, no XLA) and loaded with the TF1
session loader; one `translate_ids` call per batch size is traced
(`RunOptions.FULL_TRACE`) and the executed kernels are summed by op type. Prints, per
batch size: the wall time, the number of kernels run and the wall time per kernel, then
the op types taking most of the kernel time (their total, share, count and mean). The
kernels of the two cores overlap, so the shares are of the summed kernel time, not of
the wall time; a wall time per kernel near the mean kernel time says that dispatch, not
arithmetic, is what the step costs.

`--model_dir` (and `--src`) instead exports a trained model directory the same way and
traces batches of real sentences (the first `batches` lines of `--src`, sorted by length
as a client batches) through the `serving_default` signature, strings in:

    python bench/profile_decode.py --model_dir=/tmp/m30k --average_last_n=3 \
        --src=../shared/data/multi30k/test2016.en --batches=1,32

`--gemm_rows=128` instead times the decoder step's matmul shapes alone (rows x d_model
x d_ff, rows x d_model x vocabulary, ...; XLA, float32) against the machine's measured
square-matmul peak: the ceiling any decoding step of that many rows can reach.

    python bench/profile_decode.py [--batches=1,32] [--top=15] [--gemm_rows=128]
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import IdTokenizer, machine, matmul_peak  # noqa: E402

flags.DEFINE_list("batches", ["1", "32"], "Batch sizes (sentences per request) to trace.")
flags.DEFINE_integer("length", 20, "Source tokens per sentence (EOS included).")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_integer("extra_decode_length", 50, "Output limit = source + this.")
flags.DEFINE_integer("vocab_size", 32000, "Shared vocabulary size.")
flags.DEFINE_integer("hidden_size", 512, "d_model (smaller for smoke runs).")
flags.DEFINE_integer("filter_size", 2048, "d_ff.")
flags.DEFINE_integer("num_hidden_layers", 6, "Layers per stack.")
flags.DEFINE_string("model_dir", None, "A trained model directory to export and trace "
                    "on real sentences instead of the random-weight workload.")
flags.DEFINE_string("src", None, "With --model_dir: source sentences, one per line.")
flags.DEFINE_integer("average_last_n", 0, "With --model_dir: average the last N checkpoints.")
flags.DEFINE_integer("top", 15, "Op types to print per batch size.")
flags.DEFINE_integer("gemm_rows", 0, "If > 0: time the step's matmul shapes at this many "
                     "rows (batch x beam) instead of profiling the export.")
FLAGS = flags.FLAGS


def kernel_times(step_stats):
  """{op type: [microseconds of each kernel run]} from a RunMetadata's step stats."""
  by_op = collections.defaultdict(list)
  for device in step_stats.dev_stats:
    for node in device.node_stats:
      # timeline_label is "name = Op(inputs)"; node_name is the node's name.
      label = node.timeline_label
      op = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node.node_name
      by_op[op].append(node.all_end_rel_micros)
  return by_op


def gemm_ceiling(rows: int) -> None:
  """Each matmul shape of a decoder step at `rows` rows, XLA-compiled: GFLOP/s and
  ratio to the square-matmul peak, and the FLOP-weighted ratio of a whole step."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  d, f, v = FLAGS.hidden_size, FLAGS.filter_size, FLAGS.vocab_size
  layers = FLAGS.num_hidden_layers
  # (name, inner, outer, calls per step)
  shapes = [("attention projection", d, d, 6 * layers), ("feed-forward in", d, f, layers),
            ("feed-forward out", f, d, layers), ("output layer", d, v, 1)]
  peak = matmul_peak("float32")
  print(f"measured float32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
  total_flops = total_seconds = 0.0
  for name, inner, outer, calls in shapes:
    a = tf.random.normal([rows, inner])
    w = tf.random.normal([inner, outer])
    run = tf.function(lambda a, w: tf.reduce_sum(tf.matmul(a, w)), jit_compile=True)
    run(a, w).numpy()
    best = float("inf")
    for _ in range(20):
      start = time.perf_counter()
      run(a, w).numpy()
      best = min(best, time.perf_counter() - start)
    flops = 2 * rows * inner * outer
    total_flops += flops * calls
    total_seconds += best * calls
    print(f"  {name:<22} {rows} x {inner} x {outer}: {flops / best / 1e9:6.1f} GFLOP/s, "
          f"{flops / best / peak:.2f} of peak ({calls} per step)")
  print(f"a step's matmuls together: {total_flops / total_seconds / peak:.2f} of peak")


def main(argv):
  del argv
  if FLAGS.model_dir and not FLAGS.src:
    raise app.UsageError("--model_dir needs --src: the sentences to trace")
  if FLAGS.gemm_rows:
    print(f"machine: {machine()}")
    gemm_ceiling(FLAGS.gemm_rows)
    return
  # pylint: disable=import-outside-toplevel
  import keras
  import numpy as np
  import tensorflow as tf
  import sentencepiece
  import tensorflow_text  # noqa: F401

  from t2t_keras.trained import modeldir
  from t2t_keras import EOS_ID
  from t2t_keras.export import saved_model
  from t2t_keras.configs import DecodeConfig, ModelConfig, WeightsConfig
  from t2t_keras.export import ExportSettings
  from t2t_keras.model import create_model

  print(f"machine: {machine()}")
  keras.utils.set_random_seed(0)
  if not FLAGS.model_dir:
    config = ModelConfig(vocab_size=FLAGS.vocab_size, hidden_size=FLAGS.hidden_size,
                         filter_size=FLAGS.filter_size,
                         num_hidden_layers=FLAGS.num_hidden_layers)
    model = create_model(config)
  decode_config = DecodeConfig(beam_size=FLAGS.beam_size, alpha=0.6,
                               extra_decode_length=FLAGS.extra_decode_length)
  with tempfile.TemporaryDirectory() as tmp:
    if FLAGS.model_dir:
      path = saved_model.export_from_settings(ExportSettings(
          FLAGS.model_dir, tmp, DecodeConfig(beam_size=FLAGS.beam_size, alpha=0.0,
                                             min_decode_length=1, extra_decode_length=50),
          WeightsConfig(average_last_n=FLAGS.average_last_n)))
    else:
      translator = saved_model.Translator(
          model, IdTokenizer(),
          dataclasses.replace(decode_config, max_input_length=FLAGS.length + 1))
      path = saved_model.export(translator, tmp, version=1)
    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
      meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
    if FLAGS.model_dir:
      signature = meta.signature_def["serving_default"]
      feed, fetch = signature.inputs["inputs"].name, signature.outputs["outputs"].name
      with open(FLAGS.src, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
      spm = sentencepiece.SentencePieceProcessor(model_file=modeldir.vocab_path(FLAGS.model_dir))
    else:
      signature = meta.signature_def["translate_ids"]
      feed = signature.inputs["input_ids"].name
      fetch = signature.outputs["output_ids"].name
    rng = np.random.default_rng(0)
    for batch in (int(b) for b in FLAGS.batches):
      if FLAGS.model_dir:
        ids = np.array(sorted(lines[:batch], key=lambda line: len(line.split())),
                       dtype=object)
      else:
        ids = rng.integers(4, FLAGS.vocab_size, (batch, FLAGS.length)).astype("int32")
        ids[:, -1] = EOS_ID
      session.run(fetch, {feed: ids})  # warm up
      start = time.perf_counter()
      out = session.run(fetch, {feed: ids})
      wall = time.perf_counter() - start
      if FLAGS.model_dir:  # decoding steps: the pieces of the longest output, with EOS
        steps = 1 + max(len(spm.encode(text.decode("utf-8"))) for text in out)
      else:
        steps = int(out.shape[-1])
      options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
      metadata = tf.compat.v1.RunMetadata()
      session.run(fetch, {feed: ids}, options=options, run_metadata=metadata)
      by_op = kernel_times(metadata.step_stats)
      kernels = sum(len(v) for v in by_op.values())
      total = sum(sum(v) for v in by_op.values())
      print(f"\nbatch {batch} x beam {FLAGS.beam_size}, {steps} output positions: wall "
            f"{wall * 1000:.0f} ms untraced, {kernels:,} kernels "
            f"({kernels / steps:,.0f} per position), summed kernel time {total / 1000:.0f} ms "
            f"(mean {total / max(kernels, 1):.1f} us), wall per kernel "
            f"{wall * 1e6 / max(kernels, 1):.1f} us")
      ranked = sorted(by_op.items(), key=lambda kv: -sum(kv[1]))[:FLAGS.top]
      print(f"  {'op':<28}{'ms':>9}{'share':>8}{'count':>9}{'mean us':>10}")
      for op, times in ranked:
        print(f"  {op:<28}{sum(times) / 1000:>9.1f}{sum(times) / total:>8.1%}"
              f"{len(times):>9,}{sum(times) / len(times):>10.1f}")


if __name__ == "__main__":
  app.run(main)
