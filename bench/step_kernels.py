"""Ops per decoding step, and decoding speed, on a trained model directory.

    python bench/step_kernels.py --model_dir=/tmp/lean_demo [--passes=5] [--out=ids.npz]

Ops per step: `decode_ids` is traced (graph mode: beam search with its growing cache,
greedy search; XLA: the slotted beam search) and the nodes of the search loop's body
are counted, the step's own ops and those of the loops and conditionals nested in it
(their bodies counted once each), before Grappler. Every node is a kernel TensorFlow
dispatches each step (constants too), so the count is the per-step dispatch work.

Speed: batches of random sources (a fixed seed; lengths 1 .. --max_length) are decoded
with beam --beam_size and greedily in graph mode (the decode command's path), after an
untimed pass; printed: the best and the median of --passes timed passes, and the
median CPU time (all threads) per sentence, steadier on a shared host. With --out the
ids and scores are saved, so two checkouts can be compared for equal translations.

With --export_dir (a SavedModel of `python -m t2t_keras.export`) and --src: the
kernels TensorFlow runs per output position, after Grappler (its fusions counted as
the one kernel they are), as TF Serving runs them: the SavedModel in a TF1 session,
one request of --batch_size lines of --src, traced (`RunOptions.FULL_TRACE`), once
with its outputs held to at least --min_lengths' first length and once to its second
(an export per length, `--min_decode_length`); the kernels' difference over the
difference in the search loop's iterations (its LoopCond kernels) is the cost of one
position of the search, the rest the request's own.
"""

from __future__ import annotations

import collections
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

flags.DEFINE_string("model_dir", None, "A trained model directory.")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
flags.DEFINE_integer("batches", 8, "Batches per pass.")
flags.DEFINE_integer("max_length", 10, "Longest source (tokens, EOS excluded).")
flags.DEFINE_integer("passes", 5, "Timed passes; the best counts.")
flags.DEFINE_string("out", None, "Save the ids and scores here (.npz).")
flags.DEFINE_bool("count_only", False, "Only count ops per step.")
flags.DEFINE_string("export_dir", None, "Count the kernels a SavedModel runs per output "
                    "position (see the docstring): a model directory to export from.")
flags.DEFINE_string("src", None, "--export_dir: source sentences, one per line.")
flags.DEFINE_list("min_lengths", ["8", "24"], "--export_dir: two output lengths.")
flags.DEFINE_integer("top_ops", 25, "--export_dir: the op types to show.")
FLAGS = flags.FLAGS


def body_ops(graph_def) -> int:
  """Nodes in the body of the (first) While of a traced function, with the bodies of
  the While/If ops nested in it, each counted once."""
  functions = {f.signature.name: f for f in graph_def.library.function}

  def nested(function_name, seen):
    if function_name in seen:
      return 0
    seen.add(function_name)
    function = functions[function_name]
    count = len(function.node_def)
    for node in function.node_def:
      for attr in ("body", "then_branch", "else_branch", "cond"):
        if attr in node.attr and node.attr[attr].func.name and attr != "cond":
          count += nested(node.attr[attr].func.name, seen)
    return count

  for node in graph_def.node:
    if node.op in ("While", "StatelessWhile"):
      return nested(node.attr["body"].func.name, set())
  for function in graph_def.library.function:  # the loop may sit in a called function
    for node in function.node_def:
      if node.op in ("While", "StatelessWhile"):
        return nested(node.attr["body"].func.name, set())
  raise ValueError("no while loop in the traced graph")


def count(model, config, width: int) -> int:
  import tensorflow as tf
  from t2t_keras.inference import decoding
  function = tf.function(lambda ids: decoding.decode_ids(model, ids, config),
                         autograph=False)
  concrete = function.get_concrete_function(tf.TensorSpec([config.batch_size, width],
                                                          tf.int32))
  return body_ops(concrete.graph.as_graph_def())


def sources(vocab: int, rng) -> list:
  batches = []
  for _ in range(FLAGS.batches):
    lengths = rng.integers(1, FLAGS.max_length + 1, FLAGS.batch_size)
    ids = np.zeros([FLAGS.batch_size, FLAGS.max_length + 1], np.int32)
    for row, length in enumerate(lengths):
      ids[row, :length] = rng.integers(4, vocab, length)
      ids[row, length] = 1  # EOS
    batches.append(ids)
  return batches


def executed_kernels(export_path: str, lines):
  """(kernels, loop iterations) the SavedModel runs for one request of `lines`, after
  Grappler (a TF1 session as TF Serving's, traced)."""
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (the tokenizer's ops)
  graph = tf.Graph()
  session = tf.compat.v1.Session(graph=graph)
  with graph.as_default():
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_path)
  signature = meta.signature_def["serving_default"]
  feeds = {signature.inputs["inputs"].name: np.array(lines, object)}
  fetches = [t.name for t in signature.outputs.values()]
  session.run(fetches, feeds)  # untimed: the first run optimizes the graph
  metadata = tf.compat.v1.RunMetadata()
  session.run(fetches, feeds, options=tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
  stats = [node for device in metadata.step_stats.dev_stats for node in device.node_stats]
  # A node's label is "name = Op(inputs)".
  kinds = [node.timeline_label.partition(" = ")[2].partition("(")[0] for node in stats]
  ops = collections.Counter(kinds)
  micros = collections.Counter()
  for kind, node in zip(kinds, stats):
    micros[kind] += node.op_end_rel_micros
  return ops, ops["LoopCond"], micros


def kernels_per_position():
  """--export_dir: kernels per output position and per request (see the docstring)."""
  import tempfile

  from t2t_keras.configs import DecodeConfig, WeightsConfig
  from t2t_keras.export import ExportSettings
  from t2t_keras.export.saved_model import export_from_settings
  with open(FLAGS.src, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for line in f][:FLAGS.batch_size]
  lengths = [int(n) for n in FLAGS.min_lengths]
  counts = []
  for length in lengths:
    path = export_from_settings(ExportSettings(
        model_dir=FLAGS.export_dir, export_dir=tempfile.mkdtemp(), weights=WeightsConfig(),
        decode_config=DecodeConfig(beam_size=FLAGS.beam_size, alpha=0.0, min_decode_length=length,
                            extra_decode_length=length + 2)))
    counts.append(executed_kernels(path, lines))
  (short_ops, short_loops, _), (long_ops, long_loops, long_micros) = counts
  short, long = sum(short_ops.values()), sum(long_ops.values())
  per_position = (long - short) / (long_loops - short_loops)
  print(f"{len(lines)} sentences, beam {FLAGS.beam_size}: {short:,} kernels in "
        f"{short_loops} loop conditions, {long:,} in {long_loops}; per position "
        f"{per_position:.0f}; the rest {short - per_position * short_loops:.0f}")
  kinds = (long_ops - short_ops).most_common(FLAGS.top_ops)
  print("per position by op: " + ", ".join(
      f"{op} {n / (long_loops - short_loops):.1f}" for op, n in kinds))
  total = sum(long_micros.values())
  print(f"kernel time of the request at {lengths[1]} positions, {total / 1e3:.1f} ms (traced, "
        "so slower than untraced; the kernels' own time, not the gaps between them): " +
        ", ".join(f"{op} {100 * t / total:.1f}%" for op, t in long_micros.most_common(
            FLAGS.top_ops)))


def main(argv):
  del argv
  if FLAGS.export_dir:
    if not FLAGS.src:
      raise app.UsageError("--export_dir counts kernels on sentences: give --src")
    kernels_per_position()
    return
  if not FLAGS.model_dir:
    raise app.UsageError("give --model_dir (a trained model directory), or --export_dir "
                         "and --src")
  import dataclasses

  import tensorflow as tf
  from t2t_keras.configs import DecodeConfig
  from t2t_keras.inference import decoding, loading
  loaded = loading.load(FLAGS.model_dir)
  model = loaded.model
  base = DecodeConfig(beam_size=FLAGS.beam_size, alpha=0.6, extra_decode_length=4,
                      batch_size=FLAGS.batch_size)
  configs = {"beam": base, "greedy": dataclasses.replace(base, beam_size=1)}
  for name, config in configs.items():
    print(f"ops per step, graph {name}: {count(model, config, 16)}")
  print(f"ops per step, XLA beam: "
        f"{count(model, dataclasses.replace(base, jit_compile=True), 16)}")
  if FLAGS.count_only:
    return
  batches = sources(model.model_config.vocab_size, np.random.default_rng(0))
  saved = {}
  for name, config in configs.items():
    decode = decoding.make_decode_fn(model, config)
    outputs = [decode(tf.constant(b)) for b in batches]  # untimed: traces
    for i, (ids, scores) in enumerate(outputs):
      saved[f"{name}_ids_{i}"], saved[f"{name}_scores_{i}"] = ids.numpy(), scores.numpy()
    times, cpu = [], []
    for _ in range(FLAGS.passes):
      start, start_cpu = time.perf_counter(), time.process_time()
      for b in batches:
        decode(tf.constant(b))[0].numpy()
      times.append(time.perf_counter() - start)
      cpu.append(time.process_time() - start_cpu)
    sentences = FLAGS.batches * FLAGS.batch_size
    # On a shared host the CPU time (all threads) a pass takes varies less than its
    # wall time, which counts the cores other jobs took.
    print(f"{name}: best {sentences / min(times):.0f} sentences/s, median "
          f"{sentences / sorted(times)[len(times) // 2]:.0f}; CPU ms per sentence: median "
          f"{1000 * sorted(cpu)[len(cpu) // 2] / sentences:.2f}")
  if FLAGS.out:
    np.savez(FLAGS.out, **saved)


if __name__ == "__main__":
  app.run(main)
