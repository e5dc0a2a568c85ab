r"""Translates a file with a CTranslate2 export of a t2t_keras model.

  python -m t2t_keras.export --model_dir=M --export_dir=ct2 --format=ctranslate2 \
      [--quantization=int8]
  python tools/ct2_translate.py --model=ct2 --input_file=src.txt [--output_file=out.txt]

Tokenizes with the exported `sentencepiece.model` exactly as training did (synthetic
models: whitespace-separated ids), translates in batches with beam search, detokenizes,
and writes one translation per line (stdout by default). Needs only ctranslate2 and
sentencepiece, not TensorFlow. CTranslate2's `length_penalty` is not the GNMT penalty
of `--alpha`; the default here, 0, ranks by log-probability as `--alpha=0` does.
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

flags.DEFINE_string("model", None, "The CTranslate2 model directory.")
flags.DEFINE_string("input_file", None, "Sentences, one per line.")
flags.DEFINE_string("output_file", None, "Where to write translations (default stdout).")
flags.DEFINE_integer("beam_size", 4, "Beam size (1: greedy).")
flags.DEFINE_float("length_penalty", 0.0, "CTranslate2's length penalty exponent.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
flags.DEFINE_string("compute_type", "default",
                    "CTranslate2 compute type: default (the weights' type), int8, "
                    "float32, ...")
flags.DEFINE_integer("max_decoding_length", 256, "Longest translation in tokens.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  for name in ("model", "input_file"):
    if not getattr(FLAGS, name):
      sys.exit(f"error: --{name} is required")
  try:
    import ctranslate2  # pylint: disable=import-outside-toplevel
  except ImportError:
    sys.exit('error: needs ctranslate2: pip install -e ".[ctranslate2]"')
  if not os.path.exists(os.path.join(FLAGS.model, "model.bin")):
    sys.exit(f"error: {FLAGS.model} has no model.bin: pass the --export_dir of "
             "`python -m t2t_keras.export --format=ctranslate2`")
  spm_path = os.path.join(FLAGS.model, "sentencepiece.model")
  if os.path.exists(spm_path):
    import sentencepiece  # pylint: disable=import-outside-toplevel
    processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    encode = lambda line: processor.encode(line, out_type=str)  # noqa: E731
    decode = processor.decode_pieces
  else:  # the synthetic tasks: ids as words
    encode = str.split
    decode = " ".join
  try:
    with open(FLAGS.input_file, encoding="utf-8") as f:
      lines = [line.rstrip("\n") for line in f]
  except (OSError, UnicodeDecodeError) as error:
    sys.exit(f"error: cannot read --input_file={FLAGS.input_file}: {error}")
  translator = ctranslate2.Translator(FLAGS.model, device="cpu",
                                      compute_type=FLAGS.compute_type)
  out = open(FLAGS.output_file, "w", encoding="utf-8") if FLAGS.output_file else sys.stdout
  start = time.time()
  try:
    for first in range(0, len(lines), FLAGS.batch_size):
      batch = [encode(line) for line in lines[first:first + FLAGS.batch_size]]
      results = translator.translate_batch(
          batch, beam_size=FLAGS.beam_size, length_penalty=FLAGS.length_penalty,
          max_decoding_length=FLAGS.max_decoding_length)
      for result in results:
        out.write(decode(result.hypotheses[0]) + "\n")
      done = min(first + FLAGS.batch_size, len(lines))
      rate = done / max(time.time() - start, 1e-9)
      print(f"{done}/{len(lines)} sentences | {rate:.1f} sentences/s | eta "
            f"{(len(lines) - done) / max(rate, 1e-9):.0f}s", file=sys.stderr)
  finally:
    if out is not sys.stdout:
      out.close()


if __name__ == "__main__":
  app.run(main)
