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
"""

from __future__ import annotations

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


def main(argv):
  del argv
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
  flags.mark_flag_as_required("model_dir")
  app.run(main)
