"""Shared benchmark helpers: the machine's measured matmul peak, timing, table output."""

from __future__ import annotations

import os
import platform
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def cpu_model() -> str:
  """The CPU's model name as `lscpu` prints it (e.g. "AMD EPYC 9B14")."""
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
      if line.startswith("Model name:"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or "unknown CPU"


def session_signature(path: str, signature_name: str, input_name: str, output_name: str,
                      threads: int = 0, inter_threads: int = 0):
  """A SavedModel loaded as tensorflow_model_server loads it (the TF1 session loader,
  tensors fed and fetched by name): a function numpy input -> numpy output, safe to
  call from several threads (as the server runs concurrent requests). `threads` > 0:
  threads per op (`--tensorflow_intra_op_parallelism`); `inter_threads` > 0: ops run
  at a time (`--tensorflow_inter_op_parallelism`); 0: TensorFlow's default."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (the exported graph's ops)
  graph = tf.Graph()
  config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                    inter_op_parallelism_threads=inter_threads)
  session = tf.compat.v1.Session(graph=graph, config=config)
  with graph.as_default():
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
  signature = meta.signature_def[signature_name]
  feed = signature.inputs[input_name].name
  fetch = signature.outputs[output_name].name
  return lambda value: session.run(fetch, feed_dict={feed: value})


def matmul_peak(dtype: str = "float32", size: int = 2048, seconds: float = 3.0) -> float:
  """Best achieved FLOP/s of a square matmul in `dtype` on this machine."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  a = tf.random.normal((size, size), dtype=tf.float32)
  a = tf.cast(a, dtype)
  b = tf.cast(tf.random.normal((size, size)), dtype)

  @tf.function
  def run(a, b):
    return tf.reduce_sum(tf.cast(tf.matmul(a, b), tf.float32))

  run(a, b).numpy()  # warm up
  best, deadline = 0.0, time.time() + seconds
  while time.time() < deadline:
    start = time.perf_counter()
    run(a, b).numpy()
    best = max(best, 2 * size ** 3 / (time.perf_counter() - start))
  return best


def machine() -> str:
  """CPU model, cores and TensorFlow version: the header line of every benchmark."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  return f"{cpu_model()}, {os.cpu_count()} cores, TensorFlow {tf.__version__}"


def print_table(rows, columns):
  widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)]
  line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
  print(line(columns))
  for row in rows:
    print(line(row))


class IdTokenizer:
  """Stands in for the vocabulary: the benchmark feeds ids (translate_ids)."""

  def tokenize(self, strings):  # pragma: no cover - serving_default is not timed
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.strings.to_number(tf.strings.split(strings), tf.int32)

  def detokenize(self, ids):  # pragma: no cover
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.strings.reduce_join(tf.strings.as_string(ids), axis=-1, separator=" ")

  # One vocabulary for both sides, as the package's tokenizers say (the export's
  # signatures read .source and .target).
  @property
  def source(self):
    return self

  @property
  def target(self):
    return self
