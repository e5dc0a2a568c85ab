"""Decoding speed on a trained model and real sentences, beside CTranslate2, same host.

  .venv/bin/python bench/decode_real.py --model_dir=/tmp/m30k \
      --src=../shared/data/multi30k/test2016.en --ref=../shared/data/multi30k/test2016.de

What users meet, unlike bench/decode_speed.py's forced-length loop on random weights:
a trained model ends its sentences, so finished sentences, the early stop and the
cache's size decide the speed. Every engine runs the same search: beam --beam_size,
plain log probabilities (--alpha=0; CTranslate2 length_penalty 0), never an empty
output (--min_decode_length=1; CTranslate2's beam search never returns one),
batches of --batch_size sentences in length order (CTranslate2 sorts by length
itself). Engines:

  graph         the decode CLI in graph mode (`translate.translate`; its beam search default)
  XLA           the decode CLI with --decode_jit_compile
  export        the SavedModel as TF Serving runs it (TF1 session, tensors by name)
  export XLA    the same, exported with --export_jit_compile
  ct2 float32   CTranslate2 on the same weights (`t2t-export --format=ctranslate2`)
  ct2 int8      the same, int8 weights (--int8)

Each engine first decodes the whole input untimed (every XLA bucket compiles then),
then the engines take turns for --passes timed passes; the best pass counts. Printed
per engine: sentences/s, target tokens/s (SentencePiece pieces, EOS excluded), mean
longest output per batch (the fewest steps a batch can take), sacreBLEU and the
hypotheses' length over the references' (does the model end its sentences?), outputs
identical to CTranslate2 float32, and the ratio to CTranslate2 float32.

--parallel_batches=N decodes N batches at a time in every engine, each batch's ops on
cores / N threads: the decode CLI's --decode_parallel_batches; the export engines'
client sends N requests at once to a session configured as `tensorflow_model_server
--tensorflow_intra_op_parallelism=<cores / N>` runs it; CTranslate2 with
inter_threads=N, intra_threads=cores / N (its setting for throughput). 1 (default):
one batch at a time on all cores everywhere (CTranslate2's default threads).

--serving_intra_threads / --serving_inter_threads set the export engines' session as
tensorflow_model_server's --tensorflow_intra_op_parallelism /
--tensorflow_inter_op_parallelism set the server's; run the bench with
TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1 in its environment to measure oneDNN's setting for
weights that never change (every engine then runs with it).

--exact_length=N holds every engine to exactly N output pieces per sentence (the
length limit too), for a model that does not end its sentences, such as one with
untrained weights at a size not trained here: the same work for every engine, the
translations meaningless.

--latency_requests=N then measures latency as a server sees it: one sentence per
request, the first N lines in file order, through the export engines (the SavedModel
in a TF1 session, as TF Serving runs it) and CTranslate2's `translate_batch` of one
sentence; every request is made once untimed (every XLA shape compiles), then the
engines take turns, one request each. Printed per engine: p50, p90 and p99 in ms, the
mean output length, and the p50 and p99 ratios to CTranslate2 float32.
"""

import atexit
import concurrent.futures
import dataclasses
import os
import shutil
import subprocess
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
flags.DEFINE_integer("lines", 0, "Use the first N lines only (0: all).")
flags.DEFINE_integer("average_last_n", 0, "Average the last N checkpoints first.")
flags.DEFINE_integer("beam_size", 4, "Beam size for every engine.")
flags.DEFINE_integer("batch_size", 32, "Sentences per batch for every engine.")
flags.DEFINE_float("alpha", 0.0, "Length penalty for every engine (CTranslate2's "
                  "length_penalty); 0 ranks by plain log probability, as CTranslate2's "
                  "early exit needs; the recipe decodes with 0.6.")
flags.DEFINE_integer("exact_length", 0, "If > 0: every output exactly this many pieces "
                     "(see the docstring).")
flags.DEFINE_integer("min_decode_length", 1, "t2t_keras' minimum output length; 1 never "
                     "returns an empty output, as CTranslate2's beam search.")
flags.DEFINE_integer("passes", 2, "Timed passes per engine, taken in turns.")
flags.DEFINE_list("engines", ["graph", "XLA", "export", "export XLA", "ct2 float32"],
                  "Engines to run (see the module docstring).")
flags.DEFINE_boolean("int8", False, "Also CTranslate2 int8.")
flags.DEFINE_integer("threads", 0, "CTranslate2 intra_threads (0: its default).")
flags.DEFINE_integer("parallel_batches", 1, "Batches decoded at a time by every engine "
                     "(see the module docstring); latency needs 1.")
flags.DEFINE_integer("export_xla_max_rows", None, "The export XLA engine's "
                     "--export_xla_max_rows (default: the export command's; 0: every "
                     "request by XLA).")
flags.DEFINE_integer("serving_intra_threads", 0, "The export engines' session: threads "
                     "per op, as tensorflow_model_server's "
                     "--tensorflow_intra_op_parallelism (0: TensorFlow's default; "
                     "--parallel_batches sets cores / N).")
flags.DEFINE_integer("serving_inter_threads", 0, "The export engines' session: ops run "
                     "at a time, as --tensorflow_inter_op_parallelism (0: TensorFlow's "
                     "default).")
flags.DEFINE_integer("latency_requests", 0, "Also time this many one-sentence requests "
                     "(the first lines in file order) through the export engines and "
                     "CTranslate2 (0: no latency run).")
FLAGS = flags.FLAGS

CT2 = "ct2 float32"


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  import ctranslate2
  import numpy as np
  import sentencepiece

  from t2t_keras.trained import modeldir
  from t2t_keras import metrics
  from t2t_keras.inference import decoding, loading, translate
  from t2t_keras.configs import DecodeConfig, WeightsConfig
  from t2t_keras.export import ExportSettings
  from t2t_keras.export import ctranslate2 as ct2_export
  from t2t_keras.export import saved_model

  cores = len(os.sched_getaffinity(0))
  threads = max(1, cores // FLAGS.parallel_batches)
  if FLAGS.parallel_batches > 1:
    if FLAGS.latency_requests:
      raise app.UsageError("--latency_requests times one request at a time: use "
                           "--parallel_batches=1")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.config.threading.set_intra_op_parallelism_threads(threads)
  with open(FLAGS.src, encoding="utf-8") as f:
    sources = [line.rstrip("\n") for line in f]
  with open(FLAGS.ref, encoding="utf-8") as f:
    references = [line.rstrip("\n") for line in f]
  if FLAGS.lines:
    sources, references = sources[:FLAGS.lines], references[:FLAGS.lines]
  loaded = loading.load(FLAGS.model_dir, average_last_n=FLAGS.average_last_n,
                        dtype="float32")
  spm = sentencepiece.SentencePieceProcessor(model_file=modeldir.vocab_path(FLAGS.model_dir))
  if FLAGS.parallel_batches > 1:  # the peak of all cores, from another process
    peak = float(subprocess.run(
        [sys.executable, "-c", "from bench import common; print(common.matmul_peak())"],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.split()[-1])
  else:
    peak = common.matmul_peak()
  lengths = (f"every output {FLAGS.exact_length} pieces" if FLAGS.exact_length
             else f"min length {FLAGS.min_decode_length}")
  print(f"{common.machine()}; matmul peak {peak / 1e9:.1f} GFLOP/s; CTranslate2 "
        f"{ctranslate2.__version__}; {FLAGS.src}: {len(sources)} sentences; beam "
        f"{FLAGS.beam_size}, batch {FLAGS.batch_size}, alpha {FLAGS.alpha}, "
        f"{lengths}; {FLAGS.parallel_batches} batch(es) at a time, "
        f"{threads if FLAGS.parallel_batches > 1 else 'all'} threads per op; export "
        f"session intra/inter threads {FLAGS.serving_intra_threads}/"
        f"{FLAGS.serving_inter_threads} (0: default); TF_ONEDNN_ASSUME_FROZEN_WEIGHTS="
        f"{os.environ.get('TF_ONEDNN_ASSUME_FROZEN_WEIGHTS', 'unset')}", flush=True)
  exact = FLAGS.exact_length or None
  base = DecodeConfig(beam_size=FLAGS.beam_size, alpha=FLAGS.alpha, extra_decode_length=50,
                      batch_size=FLAGS.batch_size,
                      min_decode_length=exact or FLAGS.min_decode_length,
                      decode_length=exact, parallel_batches=FLAGS.parallel_batches)
  ct2_lengths = ({"min_decoding_length": exact, "max_decoding_length": exact} if exact
                 else {"max_decoding_length": 256})
  tmp = tempfile.mkdtemp(prefix="decode_real_")
  # The exports and CTranslate2 models (about 160 MB for the Multi30k model) go when the
  # bench ends, however it ends.
  atexit.register(shutil.rmtree, tmp, True)
  engines = {}

  def t2t_engine(jit):
    config = dataclasses.replace(base, jit_compile=jit)
    decode_fn = decoding.make_decode_fn(loaded.model, config)
    return lambda: [t.texts[0] for t in translate.translate(
        decode_fn, loaded.tokenizer, sources, config, progress=False)]

  exported = {}

  def export_engine(jit):
    rows = {} if FLAGS.export_xla_max_rows is None else {
        "xla_max_rows": FLAGS.export_xla_max_rows}
    path = saved_model.export_from_settings(ExportSettings(
        FLAGS.model_dir, os.path.join(tmp, f"sm{int(jit)}"), base,
        WeightsConfig(average_last_n=FLAGS.average_last_n), jit_compile=jit, **rows))
    run = common.session_signature(
        path, "serving_default", "inputs", "outputs",
        threads=FLAGS.serving_intra_threads or (
            threads if FLAGS.parallel_batches > 1 else 0),
        inter_threads=FLAGS.serving_inter_threads)
    exported["export XLA" if jit else "export"] = run
    # As a client batches: length-sorted batches of batch_size sentences.
    order = sorted(range(len(sources)), key=lambda i: len(sources[i].split()))

    def decode():
      out = [None] * len(sources)

      def request(begin):
        chunk = order[begin:begin + FLAGS.batch_size]
        texts = run(np.array([sources[i] for i in chunk], dtype=object))
        for i, text in zip(chunk, texts):
          out[i] = text.decode("utf-8")
      # N client threads, each with one request in flight.
      with concurrent.futures.ThreadPoolExecutor(FLAGS.parallel_batches) as pool:
        list(pool.map(request, range(0, len(order), FLAGS.batch_size)))
      return out
    return decode

  def ct2_engine(quantization):
    path = os.path.join(tmp, f"ct2_{quantization}")
    ct2_export.export(loaded.model, loaded.model_config, loaded.tokenizer, path,
                      quantization=quantization)
    if FLAGS.parallel_batches > 1:
      translator = ctranslate2.Translator(path, device="cpu",
                                          inter_threads=FLAGS.parallel_batches,
                                          intra_threads=FLAGS.threads or threads)
    else:
      translator = ctranslate2.Translator(path, device="cpu", intra_threads=FLAGS.threads)
    tokens = [spm.encode(s, out_type=str) for s in sources]
    exported[f"ct2 {quantization}"] = lambda line: [
        spm.decode_pieces(r.hypotheses[0]) for r in translator.translate_batch(
            [spm.encode(line[0], out_type=str)], beam_size=FLAGS.beam_size,
            length_penalty=FLAGS.alpha, **ct2_lengths)]
    return lambda: [spm.decode_pieces(r.hypotheses[0]) for r in translator.translate_batch(
        tokens, max_batch_size=FLAGS.batch_size, beam_size=FLAGS.beam_size,
        length_penalty=FLAGS.alpha, **ct2_lengths)]

  makers = {"graph": lambda: t2t_engine(False), "XLA": lambda: t2t_engine(True),
            "export": lambda: export_engine(False), "export XLA": lambda: export_engine(True),
            CT2: lambda: ct2_engine("float32"), "ct2 int8": lambda: ct2_engine("int8")}
  names = list(FLAGS.engines) + (["ct2 int8"] if FLAGS.int8 else [])
  if CT2 not in names:
    names.append(CT2)
  outputs, best = {}, {}
  for name in names:
    if name not in makers:
      raise app.UsageError(f"--engines: unknown engine {name!r} (one of {sorted(makers)})")
    engines[name] = makers[name]()
    start = time.perf_counter()
    outputs[name] = engines[name]()  # warm-up: traces and compiles every bucket
    print(f"warm-up {name}: {time.perf_counter() - start:.1f} s", flush=True)
  for turn in range(FLAGS.passes):
    for name in names:
      start = time.perf_counter()
      outputs[name] = engines[name]()
      seconds = time.perf_counter() - start
      best[name] = min(best.get(name, seconds), seconds)
      print(f"pass {turn + 1} {name}: {seconds:.2f} s", flush=True)

  # A sorted batch's steps are at least its longest output (EOS included).
  order = sorted(range(len(sources)), key=lambda i: len(spm.encode(sources[i])))
  rows = []
  for name in names:
    pieces = [len(spm.encode(text)) for text in outputs[name]]
    longest = [max(pieces[i] for i in order[b:b + FLAGS.batch_size]) + 1
               for b in range(0, len(order), FLAGS.batch_size)]
    same = sum(a == b for a, b in zip(outputs[name], outputs[CT2]))
    report = metrics.bleu_report(outputs[name], [references])
    seconds = best[name]
    rows.append((name, f"{seconds:.2f}", f"{len(sources) / seconds:.1f}",
                 f"{sum(pieces) / seconds:.0f}", f"{np.mean(longest):.1f}",
                 f"{report['bleu']:.2f}", f"{report['length_ratio']:.3f}",
                 f"{same / len(sources):.1%}", f"{best[CT2] / seconds:.2f}x"))
  print()
  common.print_table(rows, ["engine", "seconds", "sentences/s", "target tok/s",
                            "longest/batch", "sacreBLEU", "hyp/ref length", "same as ct2",
                            "vs ct2 float32"])
  if FLAGS.latency_requests:
    latency(exported, sources[:FLAGS.latency_requests], spm)


def latency(engines, lines, spm):
  """p50/p90/p99 of one-sentence requests, engines taking turns (see the docstring)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  names = [n for n in engines if n != CT2] + [CT2]
  requests = [np.array([line], dtype=object) for line in lines]
  for name in names:  # untimed: every shape of every request compiles or warms up
    for request in requests:
      engines[name](request)
  times = {name: [] for name in names}
  pieces = {name: [] for name in names}
  for request in requests:
    for name in names:
      start = time.perf_counter()
      out = engines[name](request)[0]
      times[name].append((time.perf_counter() - start) * 1000)
      text = out.decode("utf-8") if isinstance(out, bytes) else out
      pieces[name].append(len(spm.encode(text)))
  print(f"\nlatency: {len(lines)} requests of one sentence (first lines in file order)")
  p50, p99 = (np.percentile(times[CT2], q) for q in (50, 99))
  rows = []
  for name in names:
    values = [np.percentile(times[name], q) for q in (50, 90, 99)]
    rows.append((name, *(f"{v:.1f}" for v in values), f"{np.mean(pieces[name]):.1f}",
                 f"{values[0] / p50:.2f}", f"{values[2] / p99:.2f}"))
  common.print_table(rows, ["engine", "p50 ms", "p90 ms", "p99 ms", "mean pieces",
                            "p50 / ct2", "p99 / ct2"])


if __name__ == "__main__":
  flags.mark_flags_as_required(["model_dir", "src", "ref"])
  app.run(main)
