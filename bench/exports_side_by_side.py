"""SavedModels side by side, as TF Serving runs them, one request to each in turn.

    python bench/exports_side_by_side.py --exports=before/123,after/456 \
        --ct2_model=ct2_dir --spm=model_dir/vocab.model --src=test2016.en

For comparing exports of the same model made by two checkouts of this project (or with
two settings): each export is loaded as tensorflow_model_server loads it (the TF1
session loader, `serving_default` fed and fetched by name), and CTranslate2 runs the
same weights (`python -m t2t_keras.export --format=ctranslate2`; beam --beam_size,
length penalty --alpha, its tokens from --spm). A host's speed drifts by tens of
percent within minutes; sending each request to every engine in turn makes them see the
same drift, which runs of `bench/decode_real.py` one after another do not.

- Latency: the first --latency_lines lines, one sentence per request, --rounds times;
  p50 and mean per engine, and p50 over CTranslate2's.
- Throughput (--batch_size > 0): passes over the first --lines lines in requests of
  --batch_size lines (file order), the engines taking turns pass by pass.
- Equality: each export's translations and scores of those lines against the first
  export's (lines equal, largest score difference).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from bench import common  # noqa: E402  pylint: disable=wrong-import-position

flags.DEFINE_list("exports", None, "SavedModel version directories.", required=True)
flags.DEFINE_string("src", None, "Source sentences, one per line.", required=True)
flags.DEFINE_string("ct2_model", None, "A CTranslate2 model of the same weights.")
flags.DEFINE_string("spm", None, "--ct2_model: the model's sentencepiece .model file.")
flags.DEFINE_integer("beam_size", 4, "--ct2_model: beam size (the exports carry theirs).")
flags.DEFINE_float("alpha", 0.0, "--ct2_model: length penalty (the exports carry theirs).")
flags.DEFINE_integer("latency_lines", 100, "One-sentence requests per round.")
flags.DEFINE_integer("rounds", 2, "Latency rounds.")
flags.DEFINE_integer("batch_size", 32, "Lines per request of the throughput passes "
                     "(0: none).")
flags.DEFINE_integer("lines", 1000, "Lines of the throughput passes.")
flags.DEFINE_integer("passes", 2, "Throughput passes per engine.")
FLAGS = flags.FLAGS


def load_export(path: str):
  """A function (lines) -> (translations, scores) of `serving_default` in a TF1
  session."""
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  import tensorflow_text  # noqa: F401  (the exported graph's ops)
  graph = tf.Graph()
  session = tf.compat.v1.Session(graph=graph)
  with graph.as_default():
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
  signature = meta.signature_def["serving_default"]
  feed = signature.inputs["inputs"].name
  fetches = [signature.outputs["outputs"].name, signature.outputs["scores"].name]
  return lambda lines: session.run(fetches, {feed: np.array(lines, object)})


def load_ct2():
  """CTranslate2 as a function (lines) -> translations."""
  # pylint: disable=import-outside-toplevel
  import ctranslate2
  import sentencepiece
  spm = sentencepiece.SentencePieceProcessor(model_file=FLAGS.spm)
  translator = ctranslate2.Translator(FLAGS.ct2_model, device="cpu",
                                      intra_threads=os.cpu_count())
  return lambda lines: [spm.decode_pieces(r.hypotheses[0]) for r in translator.translate_batch(
      [spm.encode(line, out_type=str) for line in lines], beam_size=FLAGS.beam_size,
      length_penalty=FLAGS.alpha, max_decoding_length=256)]


def main(argv):
  del argv
  if FLAGS.ct2_model and not FLAGS.spm:
    raise app.UsageError("--ct2_model needs --spm, the model's sentencepiece .model file")
  with open(FLAGS.src, encoding="utf-8") as f:
    sources = [line.rstrip("\n") for line in f]
  engines = {path: load_export(path) for path in FLAGS.exports}
  if FLAGS.ct2_model:
    engines["ctranslate2"] = load_ct2()
  print(f"{common.machine()}; {FLAGS.src}: {len(sources)} lines")
  lines = sources[:FLAGS.latency_lines]
  for run in engines.values():  # warm-up: a first request of each size optimizes the graph
    for line in lines[:20]:
      run([line])
  times = {name: [] for name in engines}
  for _ in range(FLAGS.rounds):
    for line in lines:
      for name, run in engines.items():
        start = time.perf_counter()
        run([line])
        times[name].append(time.perf_counter() - start)
  peer = statistics.median(times["ctranslate2"]) if FLAGS.ct2_model else None
  print(f"one sentence per request, {len(lines)} lines x {FLAGS.rounds}, engines in turn:")
  for name, seconds in times.items():
    p50 = statistics.median(seconds)
    ratio = f" ({p50 / peer:.2f}x CTranslate2)" if peer else ""
    print(f"  {name}: p50 {1e3 * p50:.1f} ms{ratio}, mean {1e3 * statistics.mean(seconds):.1f} ms")
  if FLAGS.batch_size <= 0:
    return
  lines = sources[:FLAGS.lines]
  requests = [lines[i:i + FLAGS.batch_size] for i in range(0, len(lines), FLAGS.batch_size)]
  outputs = {name: [engines[name](r) for r in requests] for name in FLAGS.exports}
  rates = {name: [] for name in engines}
  for _ in range(FLAGS.passes):
    for name, run in engines.items():
      start = time.perf_counter()
      for request in requests:
        run(request)
      rates[name].append(len(lines) / (time.perf_counter() - start))
  print(f"requests of {FLAGS.batch_size} lines, {len(lines)} lines a pass, engines in turn:")
  for name, rate in rates.items():
    print(f"  {name}: " + ", ".join(f"{r:.1f}" for r in rate) + " sentences/s")
  first = FLAGS.exports[0]
  texts = {name: np.concatenate([o[0] for o in out]) for name, out in outputs.items()}
  scores = {name: np.concatenate([o[1].reshape(len(o[1]), -1)[:, 0] for o in out])
            for name, out in outputs.items()}
  for name in FLAGS.exports[1:]:
    same = int((texts[name] == texts[first]).sum())
    print(f"  {name} against {first}: {same} of {len(lines)} translations equal, scores "
          f"within {np.abs(scores[name] - scores[first]).max():.2g}")


if __name__ == "__main__":
  app.run(main)
