"""The CTranslate2 peer of bench/decode_speed.py (decode workload only).

Measures CTranslate2's beam search on this machine, on the workload of
bench/decode_speed.py and of bench/peers/opennmt_tf_bench.py --mode=decode, so that the
peer's figures are taken on the same day as ours: this workplace's hosts vary (the float32
matmul peak has ranged from ~120 to ~320 GFLOP/s on 2 cores), so only figures measured
minutes apart compare.

Model: Transformer base, 6+6 layers, d_model 512, d_ff 2048, 8 heads, ReLU, post-norm,
sinusoidal positions, no bias in the attention projections and the output layer, one
shared 32,000 vocabulary for the source and target embeddings and the output softmax
weights, random weights, float32. It is built as the OpenNMT-tf peer builds it
(`opennmt.models.Transformer` with `EmbeddingsSharingLevel.ALL` and OpenNMT-tf's random
initializers, TensorFlow seed 0) and converted in memory with
`ctranslate2.converters.OpenNMTTFConverter` (no quantization) into a cache directory,
once, in a child process (--convert_only), so the timed process never imports
TensorFlow. The converter stores the tied embedding / output matrix once (aliases).

Workload: 64 source sentences of 20 tokens (19 random ids in [4, 32000) + </s>, drawn
as the other two scripts draw them; CTranslate2 adds no </s> of its own, as the
converted OpenNMT-tf source inputter does not), `translate_batch` over all 64 with
`max_batch_size=32` (2 batches of 32), `beam_size=4`, `length_penalty=0.6`,
`max_decoding_length=70`, one hypothesis, `compute_type="float32"`, `inter_threads=1`,
`intra_threads=2` (--threads). One warm-up pass over the 64 sentences, then `--repeats`
timed passes; prints the best pass's sentences/s and target tokens/s (tokens of the best
hypothesis, </s> excluded).

Hypotheses run to 70 tokens, as in the other two scripts (random weights almost never
pick </s>): with --min_decoding_length=-1 (the default), the warm-up pass decodes with
CTranslate2's default `min_decoding_length=1`, and only if one of its best hypotheses
ends before 70 tokens are the timed passes run with `min_decoding_length=70` (which
masks </s> until step 70; the line printed says which was used). Pass 1 (never force)
or 70 (always force) to choose.

Differences from the other two scripts, none of which changes the matmul work when all
hypotheses run to 70 tokens: CTranslate2's length penalty divides the log-probability by
length ** 0.6 (not GNMT's ((5 + length) / 6) ** 0.6), which only reranks hypotheses of
different lengths; its beam search replaces a beam that picks </s> with one of 2 x beam
top-k candidates and, with a length penalty set, ends an example once beam_size
hypotheses have finished; and it runs the first step on the unexpanded batch (the 4 beams
of a sentence are identical there).

Needs the OpenNMT-tf peer's environment plus CTranslate2 (3.24 converts OpenNMT-tf
2.32 / TensorFlow 2.13 models):

    python3 -m venv /tmp/onmtvenv && /tmp/onmtvenv/bin/pip install \\
        "tensorflow==2.13.*" "opennmt-tf==2.32.*" "ctranslate2==3.24.*"
    # One-time conversion into /tmp/ct2_random_6l_512d_2048f_8h_32000v (the benchmark
    # also converts by itself when --model_dir is missing):
    /tmp/onmtvenv/bin/python bench/peers/ctranslate2_decode.py --convert_only
    # Full-size benchmark:
    /tmp/onmtvenv/bin/python bench/peers/ctranslate2_decode.py [--repeats=3] \\
        [--threads=2] [--inter_threads=1] [--model_dir=DIR]

--d_model, --ffn, --heads, --layers, --vocab_size shrink the model for smoke tests (the
default --model_dir is named after them), e.g.

    nice -n 19 /tmp/onmtvenv/bin/python bench/peers/ctranslate2_decode.py --d_model=32 \\
        --ffn=64 --heads=2 --layers=1 --vocab_size=100 --repeats=1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

END_OF_SENTENCE_ID = 2  # OpenNMT-tf's </s>; the vocabulary is <blank>, <s>, </s>, ...


def parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add = parser.add_argument
  add("--repeats", type=int, default=3, help="Timed passes (the best is reported).")
  add("--threads", type=int, default=2, help="CTranslate2 intra_threads.")
  add("--inter_threads", type=int, default=1, help="CTranslate2 inter_threads.")
  add("--model_dir", default="",
      help="Converted CTranslate2 model; converted here when missing. Default: "
           "/tmp/ct2_random_{layers}l_{d_model}d_{ffn}f_{heads}h_{vocab_size}v.")
  add("--convert_only", action="store_true",
      help="Convert into --model_dir (if missing) and exit; needs TensorFlow/OpenNMT-tf.")
  # Workload.
  add("--sentences", type=int, default=64, help="Source sentences.")
  add("--source_length", type=int, default=20, help="Source tokens, </s> included.")
  add("--decode_batch", type=int, default=32, help="max_batch_size (examples).")
  add("--beam_size", type=int, default=4)
  add("--alpha", type=float, default=0.6, help="CTranslate2's length_penalty.")
  add("--max_decode_length", type=int, default=70, help="max_decoding_length.")
  add("--min_decoding_length", type=int, default=-1,
      help="-1: 1, or --max_decode_length if the warm-up pass ends a hypothesis early.")
  # Model (Transformer base by default; shrink for smoke tests).
  add("--vocab_size", type=int, default=32000)
  add("--d_model", type=int, default=512)
  add("--ffn", type=int, default=2048)
  add("--heads", type=int, default=8)
  add("--layers", type=int, default=6, help="Encoder and decoder layers each.")
  args = parser.parse_args()
  if not args.model_dir:
    args.model_dir = (f"/tmp/ct2_random_{args.layers}l_{args.d_model}d_{args.ffn}f_"
                      f"{args.heads}h_{args.vocab_size}v")
  return args


def convert(args) -> None:
  """Builds the random-weight OpenNMT-tf Transformer and converts it to args.model_dir."""
  # pylint: disable=import-outside-toplevel
  import warnings
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  # OpenNMT-tf imports TensorFlow Addons, which warns at import that it is end-of-life.
  warnings.filterwarnings("ignore", category=UserWarning, module="tensorflow_addons")
  import ctranslate2
  import opennmt
  import tensorflow as tf

  tf.get_logger().setLevel("ERROR")
  tf.random.set_seed(0)
  with tempfile.TemporaryDirectory() as directory:
    # As the OpenNMT-tf peer: size - 1 lines (<blank>, <s>, </s>, w3, ...), to which
    # OpenNMT-tf (and the converter) append <unk> as id size - 1.
    vocabulary = os.path.join(directory, "vocab.txt")
    words = [opennmt.constants.PADDING_TOKEN, opennmt.constants.START_OF_SENTENCE_TOKEN,
             opennmt.constants.END_OF_SENTENCE_TOKEN]
    words += [f"w{i}" for i in range(len(words), args.vocab_size - 1)]
    with open(vocabulary, "w", encoding="utf-8") as f:
      f.write("\n".join(words) + "\n")
    model = opennmt.models.Transformer(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size=args.d_model),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size=args.d_model),
        num_layers=args.layers,
        num_units=args.d_model,
        num_heads=args.heads,
        ffn_inner_dim=args.ffn,
        mha_bias=False,
        pre_norm=False,
        output_layer_bias=False,
        share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL)
    model.initialize({"source_vocabulary": vocabulary, "target_vocabulary": vocabulary})
    model.create_variables()  # Random weights.
    assert model.labels_inputter.vocabulary_size == args.vocab_size
    # Convert next to the destination, then rename: no half-written model on failure.
    parent = os.path.dirname(os.path.abspath(args.model_dir))
    staging = tempfile.mkdtemp(dir=parent, prefix=".ct2_convert_")
    try:
      ctranslate2.converters.OpenNMTTFConverter(model).convert(staging, force=True)
      os.rename(staging, args.model_dir)
    finally:
      shutil.rmtree(staging, ignore_errors=True)
  print(f"converted a random-weight OpenNMT-tf {opennmt.__version__} Transformer "
        f"(TensorFlow {tf.__version__}) with CTranslate2 {ctranslate2.__version__} "
        f"into {args.model_dir}", flush=True)


def load_vocabulary(model_dir: str) -> list[str]:
  """The target vocabulary saved with the model (shared with the source)."""
  for name in ("shared_vocabulary", "target_vocabulary"):
    for extension, read in ((".json", json.load),
                            (".txt", lambda f: f.read().splitlines())):
      path = os.path.join(model_dir, name + extension)
      if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
          return read(f)
  raise FileNotFoundError(f"no vocabulary in {model_dir}")


def translate(translator, sources: list[list[str]], args, min_length: int):
  """One pass over all sentences; returns the best hypotheses' lengths (</s> excluded)."""
  results = translator.translate_batch(
      sources,
      max_batch_size=args.decode_batch,
      batch_type="examples",
      beam_size=args.beam_size,
      num_hypotheses=1,
      length_penalty=args.alpha,
      max_decoding_length=args.max_decode_length,
      min_decoding_length=min_length)
  return [len(result.hypotheses[0]) for result in results]


def measure_decode(args):
  """Prints and returns the best seconds per pass of the beam search workload."""
  import ctranslate2  # pylint: disable=import-outside-toplevel

  vocabulary = load_vocabulary(args.model_dir)
  if len(vocabulary) != args.vocab_size:
    sys.exit(f"{args.model_dir} has a {len(vocabulary)}-token vocabulary, not "
             f"--vocab_size={args.vocab_size}; pass another --model_dir")
  translator = ctranslate2.Translator(
      args.model_dir, device="cpu", compute_type="float32",
      inter_threads=args.inter_threads, intra_threads=args.threads)

  # 19 random ids + </s>, as the other scripts draw them, as tokens of the vocabulary.
  rng = np.random.default_rng(0)
  ids = rng.integers(4, args.vocab_size, (args.sentences, args.source_length))
  ids[:, -1] = END_OF_SENTENCE_ID
  sources = [[vocabulary[i] for i in row] for row in ids]

  min_length = 1 if args.min_decoding_length < 0 else args.min_decoding_length
  lengths = translate(translator, sources, args, min_length)  # Warm-up pass.
  forced = ""
  if args.min_decoding_length < 0 and min(lengths) < args.max_decode_length:
    min_length = args.max_decode_length
    forced = (f"; the warm-up pass ended {sum(n < args.max_decode_length for n in lengths)}"
              f" hypotheses early (shortest {min(lengths)}), so </s> was masked")
  best, tokens = float("inf"), 0
  for _ in range(args.repeats):
    start = time.perf_counter()
    tokens = sum(translate(translator, sources, args, min_length))
    best = min(best, time.perf_counter() - start)
  print(f"decode float32 (CTranslate2): {args.sentences / best:.2f} sentences/s, "
        f"{tokens / best:,.0f} target tokens/s ({best:.2f} s per pass; {tokens} tokens "
        f"generated, at most {args.sentences * args.max_decode_length}; "
        f"min_decoding_length {min_length}{forced})", flush=True)
  return best


def main():
  args = parse_args()
  if args.convert_only:
    if os.path.exists(args.model_dir):
      print(f"{args.model_dir} exists; not converting")
    else:
      convert(args)
    return
  if not os.path.exists(args.model_dir):
    # A child process, so that this one never loads TensorFlow next to CTranslate2.
    subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:],
                    "--convert_only"], check=True)
  import ctranslate2  # pylint: disable=import-outside-toplevel
  print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"CTranslate2 {ctranslate2.__version__}, inter_threads {args.inter_threads}, "
        f"intra_threads {args.threads}")
  print(f"model: {args.model_dir}: {args.layers}+{args.layers} layers, d_model "
        f"{args.d_model}, ffn {args.ffn}, {args.heads} heads, vocab {args.vocab_size}, "
        f"post-norm, no attention/output bias, random weights", flush=True)
  print(f"workload: {args.sentences} sentences x {args.source_length} tokens, "
        f"max_batch_size {args.decode_batch}, beam {args.beam_size}, length_penalty "
        f"{args.alpha}, max_decoding_length {args.max_decode_length}", flush=True)
  measure_decode(args)


if __name__ == "__main__":
  main()
