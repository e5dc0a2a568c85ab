"""One model, four engines: decode time and sacreBLEU of a test set, same host, same hour.

  .venv/bin/python bench/ctranslate2_compare.py --model_dir=/tmp/m30k \
      --src=../shared/data/multi30k/test2016.en --ref=../shared/data/multi30k/test2016.de

Exports the model (latest checkpoint, or --average_last_n) to CTranslate2 in float32
and int8, then translates --src with t2t_keras in graph mode and with XLA, and with
CTranslate2 float32 and int8 (tokenized with the run's SentencePiece model), all with
beam 4. Every engine ranks beams by plain log-probability (--alpha=0, CTranslate2
length_penalty=0) and never returns an empty translation (--min_decode_length=1, which
CTranslate2's beam search always does), so float32 CTranslate2 should give the same
translations; t2t_keras without the minimum length (tensor2tensor's behaviour) and the
recipe's own setting (alpha 0.6, GNMT penalty) are printed too for reference.
"""

import os
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import common  # noqa: E402

flags.DEFINE_string("model_dir", None, "A trained model directory.")
flags.DEFINE_string("src", None, "Source sentences, one per line.")
flags.DEFINE_string("ref", None, "References, line-aligned with --src.")
flags.DEFINE_integer("average_last_n", 0, "Average the last N checkpoints first.")
flags.DEFINE_integer("beam_size", 4, "Beam size for every engine.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch for every engine.")
flags.DEFINE_integer("threads", 0, "CTranslate2 intra_threads (0: its default).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  import ctranslate2
  import sentencepiece

  from t2t_keras import decoding, loading, metrics, modeldir, translate
  from t2t_keras.export import ctranslate2 as ct2_export
  from t2t_keras.configs import DecodeConfig

  with open(FLAGS.src, encoding="utf-8") as f:
    sources = [line.rstrip("\n") for line in f]
  with open(FLAGS.ref, encoding="utf-8") as f:
    references = [line.rstrip("\n") for line in f]
  loaded = loading.load(FLAGS.model_dir, average_last_n=FLAGS.average_last_n,
                          dtype="float32")
  print(f"{common.machine()}; CTranslate2 {ctranslate2.__version__}; "
        f"{len(sources)} sentences, beam {FLAGS.beam_size}, batch {FLAGS.batch_size}")
  rows = []

  def report(name, hypotheses, seconds):
    bleu = metrics.bleu_report(hypotheses, [references])["bleu"]
    rows.append((name, f"{seconds:.1f}", f"{len(sources) / seconds:.1f}", f"{bleu:.2f}"))
    print(rows[-1], flush=True)
    return hypotheses

  outputs = {}
  reference_name = "t2t_keras graph, alpha 0, min length 1"
  for name, alpha, jit, minimum in ((reference_name, 0.0, False, 1),
                                    ("t2t_keras XLA, alpha 0, min length 1", 0.0, True, 1),
                                    ("t2t_keras graph, alpha 0, min length 0", 0.0, False, 0),
                                    ("t2t_keras graph, alpha 0.6 (recipe)", 0.6, False, 0)):
    config = DecodeConfig(beam_size=FLAGS.beam_size, alpha=alpha, extra_decode_length=50,
                          batch_size=FLAGS.batch_size, jit_compile=jit,
                          min_decode_length=minimum)
    decode_fn = decoding.make_decode_fn(loaded.model, config)
    translate.translate(loaded.model, loaded.tokenizer, sources[:FLAGS.batch_size], config,
                       decode_fn=decode_fn, progress=False)  # trace / compile first
    start = time.perf_counter()
    result = translate.translate(loaded.model, loaded.tokenizer, sources, config,
                                decode_fn=decode_fn, progress=False)
    outputs[name] = report(name, [t.texts[0] for t in result],
                           time.perf_counter() - start)

  spm_path = modeldir.vocab_path(FLAGS.model_dir)
  processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
  tokens = [processor.encode(s, out_type=str) for s in sources]
  with tempfile.TemporaryDirectory() as tmp:
    for quantization in ("float32", "int8"):
      path = os.path.join(tmp, quantization)
      ct2_export.export(loaded.model, loaded.model_config, loaded.tokenizer, path,
                        quantization=quantization)
      translator = ctranslate2.Translator(path, device="cpu",
                                          intra_threads=FLAGS.threads)
      translator.translate_batch(tokens[:FLAGS.batch_size], beam_size=FLAGS.beam_size)
      start = time.perf_counter()
      results = translator.translate_batch(
          tokens, max_batch_size=FLAGS.batch_size, beam_size=FLAGS.beam_size,
          length_penalty=0.0, max_decoding_length=256)
      name = f"CTranslate2 {quantization}, length_penalty 0"
      outputs[name] = report(name, [processor.decode_pieces(r.hypotheses[0])
                                    for r in results], time.perf_counter() - start)
  reference = outputs[reference_name]
  print()
  common.print_table(rows, ["engine", "seconds", "sentences/s", "sacreBLEU"])
  for name, hypotheses in outputs.items():
    same = sum(h == r for h, r in zip(hypotheses, reference))
    empty = sum(not text for text in hypotheses)
    print(f"{name}: {same}/{len(reference)} identical to {reference_name}; "
          f"{empty} empty")


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "src", "ref"])
  app.run(main)
