"""The OpenNMT-tf peer of bench/train_throughput.py and bench/decode_speed.py.

Measures OpenNMT-tf 2.32 (TensorFlow 2.13) on this machine, on the same workloads as
the t2t_keras benchmarks, so that the peer's figures are taken on the same day as ours:
this workplace's hosts vary (the float32 matmul peak has ranged from ~120 to ~320
GFLOP/s on 2 cores), so only figures measured minutes apart compare.

Model (both modes): `opennmt.models.Transformer`, Transformer base: 6+6 layers,
d_model 512, d_ff 2048, 8 heads, dropout 0.1 (also on the attention weights and after
the FFN's ReLU), sinusoidal positions, one shared 32,000 vocabulary for the source and
target embeddings and the output softmax weights (`EmbeddingsSharingLevel.ALL`), float32.
By default the layout matches t2t_keras: post-norm, no bias in the attention projections
and the output layer (OpenNMT-tf's own defaults are pre-norm with biases; see
--pre_norm, --mha_bias, --output_bias; none changes the matmul work).

train: each step is 64 sentence pairs x 32 tokens on each side, random ids in [4, 32000),
  every length 32 (the decoder reads <s> + the first 31 target ids and predicts all 32),
  label smoothing 0.1, Adam(0.9, 0.98, 1e-9); one `tf.function` step (`--xla`:
  jit_compile=True) calling the public `model.train` (forward, loss, gradients, update).
  2 warm-up steps, then `--repeats` timed runs of `--steps` steps. Prints the median
  s/step, target tokens/s = 64 * 32 / (s/step), the measured float32 matmul peak (best of
  a 2048 x 2048 `tf.matmul` in a `tf.function` over ~3 s) and the ratio of the step's
  matmul FLOP/s to it, counting FLOPs as bench/train_throughput.py does.
decode: the same model with fresh random weights; 64 source sentences of 20 ids (19
  random ids + </s>, length 20 as the encoder sees it), batch 32, beam 4, GNMT length
  penalty alpha 0.6 (`length_penalty=0.6`), at most 70 decoding steps (random weights
  almost never pick </s>, so hypotheses run to 70 tokens). The model call (encoder +
  `dynamic_decode` beam search) is a `tf.function`; one warm-up batch, then `--repeats`
  passes over the 64 sentences (2 batches). Prints the best pass's sentences/s and target
  tokens/s (tokens of the best beam, </s> excluded).

Needs OpenNMT-tf, which pins another TensorFlow than t2t_keras; use its own environment:

    python3 -m venv /tmp/onmtvenv && /tmp/onmtvenv/bin/pip install \\
        "tensorflow==2.13.*" "opennmt-tf==2.32.*"
    /tmp/onmtvenv/bin/python bench/peers/opennmt_tf_bench.py [--mode=train,decode] \\
        [--steps=5] [--repeats=3] [--threads=N] [--xla]

--d_model, --ffn, --heads, --layers, --vocab_size (and --peak_size, --peak_seconds)
shrink the work for smoke tests, e.g.

    nice -n 19 /tmp/onmtvenv/bin/python bench/peers/opennmt_tf_bench.py --d_model=32 \\
        --ffn=64 --layers=1 --vocab_size=100 --steps=2 --repeats=1 --peak_size=256
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# OpenNMT-tf imports TensorFlow Addons, which warns at import that it is end-of-life.
warnings.filterwarnings("ignore", category=UserWarning, module="tensorflow_addons")

import numpy as np  # noqa: E402
import opennmt  # noqa: E402
import tensorflow as tf  # noqa: E402


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add = parser.add_argument
  add("--mode", default="train,decode", help="Comma-separated: train and/or decode.")
  add("--steps", type=int, default=5, help="Train steps per timed run.")
  add("--repeats", type=int, default=3,
      help="Timed runs (train: median reported) or passes (decode: best reported).")
  add("--threads", type=int, default=0,
      help="TensorFlow intra- and inter-op threads; 0 = TensorFlow's default.")
  add("--xla", action="store_true", help="Train: compile the step with jit_compile=True.")
  add("--peak_size", type=int, default=2048, help="Matmul peak: square matrix size.")
  add("--peak_seconds", type=float, default=3.0, help="Matmul peak: seconds to run.")
  # Workload.
  add("--batch", type=int, default=64, help="Train: sentence pairs per step.")
  add("--length", type=int, default=32, help="Train: tokens per sentence on each side.")
  add("--sentences", type=int, default=64, help="Decode: source sentences.")
  add("--source_length", type=int, default=20, help="Decode: source ids, </s> included.")
  add("--decode_batch", type=int, default=32, help="Decode: sentences per batch.")
  add("--beam_size", type=int, default=4)
  add("--alpha", type=float, default=0.6, help="Decode: GNMT length penalty.")
  add("--max_decode_length", type=int, default=70, help="Decode: maximum output steps.")
  # Model (Transformer base by default; shrink for smoke tests).
  add("--vocab_size", type=int, default=32000)
  add("--d_model", type=int, default=512)
  add("--ffn", type=int, default=2048)
  add("--heads", type=int, default=8)
  add("--layers", type=int, default=6, help="Encoder and decoder layers each.")
  add("--dropout", type=float, default=0.1, help="Dropout on sublayer outputs.")
  add("--attention_dropout", type=float, default=0.1)
  add("--ffn_dropout", type=float, default=0.1)
  add("--pre_norm", action="store_true", help="OpenNMT-tf's default; t2t_keras: post.")
  add("--mha_bias", action="store_true", help="Bias in the attention projections.")
  add("--output_bias", action="store_true", help="Bias in the output layer.")
  args = parser.parse_args()
  args.mode = [m for m in args.mode.split(",") if m]
  if not set(args.mode) <= {"train", "decode"}:
    parser.error(f"--mode takes train and/or decode, got {args.mode}")
  return args


def matmul_peak(size: int = 2048, seconds: float = 3.0) -> float:
  """Best achieved FLOP/s of a float32 square matmul on this machine."""
  a, b = tf.random.normal((size, size)), tf.random.normal((size, size))

  @tf.function
  def run(a, b):
    return tf.reduce_sum(tf.matmul(a, b))

  run(a, b).numpy()  # Trace and warm up.
  best, deadline = 0.0, time.time() + seconds
  while time.time() < deadline:
    start = time.perf_counter()
    run(a, b).numpy()
    best = max(best, 2 * size ** 3 / (time.perf_counter() - start))
  return best


def train_flops(args) -> float:
  """Matmul FLOPs of one train step, counted as bench/train_throughput.py counts them."""
  d, f, layers, s, v = args.d_model, args.ffn, args.layers, args.length, args.vocab_size
  per_token = (layers * (4 * d * d + 2 * d * f)  # Encoder: Q, K, V, output; FFN.
               + layers * (8 * d * d + 2 * d * f)  # Decoder: self + cross attention; FFN.
               + d * v  # Output layer.
               + layers * 6 * s * d)  # Scores and context: encoder, decoder, cross.
  # 2 FLOPs per multiply-add, x3 for forward + backward.
  return 6 * per_token * args.batch * args.length


def write_vocabulary(directory: str, size: int) -> str:
  """Writes a vocabulary file of which OpenNMT-tf makes a `size`-entry vocabulary.

  OpenNMT-tf reserves ids 0, 1, 2 for <blank>, <s>, </s> (the first three lines) and
  appends one out-of-vocabulary bucket (<unk>, id size - 1) after the file's lines.
  """
  path = os.path.join(directory, "vocab.txt")
  words = [opennmt.constants.PADDING_TOKEN, opennmt.constants.START_OF_SENTENCE_TOKEN,
           opennmt.constants.END_OF_SENTENCE_TOKEN]
  words += [f"w{i}" for i in range(len(words), size - 1)]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(words) + "\n")
  return path


def create_model(args, vocabulary: str, params: dict):
  """A Transformer with one shared vocabulary, embeddings and output weights."""
  model = opennmt.models.Transformer(
      source_inputter=opennmt.inputters.WordEmbedder(embedding_size=args.d_model),
      target_inputter=opennmt.inputters.WordEmbedder(embedding_size=args.d_model),
      num_layers=args.layers,
      num_units=args.d_model,
      num_heads=args.heads,
      ffn_inner_dim=args.ffn,
      dropout=args.dropout,
      attention_dropout=args.attention_dropout,
      ffn_dropout=args.ffn_dropout,
      mha_bias=args.mha_bias,
      pre_norm=args.pre_norm,
      output_layer_bias=args.output_bias,
      share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL)
  model.initialize({"source_vocabulary": vocabulary, "target_vocabulary": vocabulary},
                   params=params)
  assert model.labels_inputter.vocabulary_size == args.vocab_size, (
      model.labels_inputter.vocabulary_size)
  return model


def measure_train(args, vocabulary: str, peak: float):
  """Prints and returns the median s/step of the train workload."""
  # average_loss_in_time: the loss is per target token (OpenNMT-tf's Transformer default).
  model = create_model(args, vocabulary,
                       {"label_smoothing": 0.1, "average_loss_in_time": True})
  optimizer = opennmt.optimizers.make_optimizer(
      "Adam", 1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
  model.create_variables(optimizer=optimizer)

  rng = np.random.default_rng(0)
  batch, length = args.batch, args.length
  sources = rng.integers(4, args.vocab_size, (batch, length)).astype(np.int32)
  targets = rng.integers(4, args.vocab_size, (batch, length)).astype(np.int32)
  lengths = tf.fill([batch], length)
  features = {"ids": tf.constant(sources), "length": lengths}
  # Teacher forcing as OpenNMT-tf's target inputter prepares it: the decoder reads <s>
  # and the first length - 1 ids and predicts all `length` ids (no </s>, as ours).
  bos = np.full((batch, 1), opennmt.constants.START_OF_SENTENCE_ID, np.int32)
  labels = {"ids": tf.constant(np.concatenate([bos, targets[:, :-1]], axis=1)),
            "ids_out": tf.constant(targets), "length": lengths}

  @tf.function(jit_compile=args.xla or None)
  def train_step():
    return model.train(features, labels, optimizer)

  for _ in range(2):  # Warm-up steps; the first traces (and compiles).
    float(train_step())
  runs = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    for _ in range(args.steps):
      loss = train_step()
    loss = float(loss)  # Waits for the last step.
    runs.append((time.perf_counter() - start) / args.steps)
  seconds = statistics.median(runs)
  name = f"float32{'+xla' if args.xla else ''}"
  print(f"train {name} s/step per run: " + " ".join(f"{r:.2f}" for r in runs))
  print(f"train {name} (OpenNMT-tf): {seconds:.2f} s/step, "
        f"{batch * length / seconds:,.0f} target tokens/s, "
        f"{train_flops(args) / seconds / 1e9:.1f} GFLOP/s, "
        f"ratio to peak {train_flops(args) / seconds / peak:.2f}, "
        f"last loss {loss:.3f} (finite: {np.isfinite(loss)})", flush=True)
  return seconds


def measure_decode(args, vocabulary: str):
  """Prints and returns the best sentences/s of the beam search workload."""
  model = create_model(args, vocabulary, {
      "beam_width": args.beam_size,
      "length_penalty": args.alpha,
      "maximum_decoding_length": args.max_decode_length,
  })
  model.create_variables()  # Fresh random weights.

  # Sources as the model sees them: 19 random ids + </s>, length 20 (OpenNMT-tf adds
  # no </s> to sources unless told to, so it is part of the ids here, as in ours).
  rng = np.random.default_rng(0)
  sources = rng.integers(4, args.vocab_size,
                         (args.sentences, args.source_length)).astype(np.int32)
  sources[:, -1] = opennmt.constants.END_OF_SENTENCE_ID
  batches = [tf.constant(sources[i:i + args.decode_batch])
             for i in range(0, args.sentences, args.decode_batch)]

  @tf.function
  def translate(ids):
    length = tf.fill([tf.shape(ids)[0]], tf.shape(ids)[1])
    _, predictions = model({"ids": ids, "length": length}, training=False)
    # Best beam only (num_hypotheses defaults to 1); lengths exclude </s>.
    return predictions["length"][:, 0], tf.shape(predictions["tokens"])[-1]

  translate(batches[0])[0].numpy()  # Trace and warm up.
  best, tokens, steps = float("inf"), 0, 0
  for _ in range(args.repeats):
    start, tokens, steps = time.perf_counter(), 0, 0
    for ids in batches:
      lengths, time_steps = translate(ids)
      tokens += int(np.sum(lengths.numpy()))
      steps = max(steps, int(time_steps))
    best = min(best, time.perf_counter() - start)
  print(f"decode float32 (OpenNMT-tf): {args.sentences / best:.2f} sentences/s, "
        f"{tokens / best:,.0f} target tokens/s ({best:.2f} s per pass; {tokens} tokens "
        f"generated, at most {args.sentences * args.max_decode_length}; "
        f"{steps} decoding steps)", flush=True)
  return best


def main():
  args = parse_args()
  if args.threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
  tf.get_logger().setLevel("ERROR")
  tf.random.set_seed(0)
  print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"TensorFlow {tf.__version__}, OpenNMT-tf {opennmt.__version__}, "
        f"threads {args.threads or 'default'}")
  print(f"model: {args.layers}+{args.layers} layers, d_model {args.d_model}, "
        f"ffn {args.ffn}, {args.heads} heads, vocab {args.vocab_size}, dropout "
        f"{args.dropout}/{args.attention_dropout}/{args.ffn_dropout} "
        f"(output/attention/ffn), {'pre' if args.pre_norm else 'post'}-norm, "
        f"mha_bias {args.mha_bias}, output_bias {args.output_bias}", flush=True)
  with tempfile.TemporaryDirectory() as directory:
    vocabulary = write_vocabulary(directory, args.vocab_size)
    if "train" in args.mode:
      peak = matmul_peak(args.peak_size, args.peak_seconds)
      print(f"measured float32 matmul peak: {peak / 1e9:.1f} GFLOP/s", flush=True)
      measure_train(args, vocabulary, peak)
    if "decode" in args.mode:
      measure_decode(args, vocabulary)


if __name__ == "__main__":
  main()
