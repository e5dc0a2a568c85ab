"""Latency of one request: an exported Transformer base as TF Serving runs it, beside
CTranslate2 running the same weights.

Transformer base (6+6 layers, d_model 512, d_ff 2048, 8 heads), shared 32,000
vocabulary, random weights (seed 0), beam 4, alpha 0.6, output limit source + 50. One
sentence of 20 tokens (19 random ids + EOS) per request, `--requests` times:

- t2t_keras: `serving_default` of the exported SavedModel (strings in, translations
  out), loaded as tensorflow_model_server loads it: the TF1 session loader, the
  signature's tensors fed and fetched by name, no XLA.
- t2t_keras XLA: the same, exported with `--export_jit_compile` (beam search compiled
  by XLA; tensorflow_model_server needs `--xla_cpu_compilation_enabled=true`).
- CTranslate2: the same weights exported with `t2t_keras.export --format=ctranslate2`
  (float32), `translate_batch` of the same tokens, beam 4, length_penalty 0.6,
  max_decoding_length 70, `intra_threads` = the cores.

The engines run alternately, one request each, so that both see the same machine state.
Prints the CPU model, then for each `p50 <ms> ms, p99 <ms> ms` and the mean output
length (random weights rarely choose EOS, so outputs run to the limit: the figures are
the cost of a 70-token output). Needs `pip install -e ".[ctranslate2]"`.

    python bench/serving_latency.py [--requests=100] [--engines=graph,xla,ctranslate2]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import cpu_model, machine, session_signature  # noqa: E402

ENGINES = ("graph", "xla", "ctranslate2")
flags.DEFINE_list("engines", list(ENGINES), "graph (the default export), xla "
                  "(--export_jit_compile), ctranslate2 (the same weights).")
flags.DEFINE_integer("requests", 100, "Timed requests per engine (after 3 warm-ups).")
flags.DEFINE_integer("length", 20, "Source tokens (EOS included).")
flags.DEFINE_integer("vocab_size", 32000, "Shared vocabulary size.")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_float("alpha", 0.6, "Length penalty (GNMT for t2t_keras; CTranslate2's own).")
flags.DEFINE_integer("extra_decode_length", 50, "Output limit = source length + this.")
flags.DEFINE_integer("hidden_size", 512, "d_model (smaller for smoke runs).")
flags.DEFINE_integer("filter_size", 2048, "d_ff.")
flags.DEFINE_integer("num_heads", 8, "Heads.")
flags.DEFINE_integer("num_hidden_layers", 6, "Layers per stack.")
FLAGS = flags.FLAGS


def percentile(values, q: float) -> float:
  ordered = sorted(values)
  return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  import ctranslate2
  import keras
  import numpy as np

  from t2t_keras.export import ctranslate2 as ct2_export
  from t2t_keras.export import saved_model
  from t2t_keras.configs import DecodeConfig, ModelConfig
  from t2t_keras.data.tokens.tokenizer import IntegerTokenizer
  from t2t_keras.model import create_model

  for engine in FLAGS.engines:
    if engine not in ENGINES:
      raise app.UsageError(f"--engines: unknown engine {engine!r}; use {', '.join(ENGINES)}.")
  threads = os.cpu_count() or 1
  print(f"machine: {machine()}; CPU: {cpu_model()}; CTranslate2 {ctranslate2.__version__}")
  keras.utils.set_random_seed(0)
  config = ModelConfig(vocab_size=FLAGS.vocab_size, hidden_size=FLAGS.hidden_size,
                       filter_size=FLAGS.filter_size, num_heads=FLAGS.num_heads,
                       num_hidden_layers=FLAGS.num_hidden_layers)
  model = create_model(config)
  tokenizer = IntegerTokenizer(FLAGS.vocab_size)
  decode_config = DecodeConfig(beam_size=FLAGS.beam_size, alpha=FLAGS.alpha,
                               extra_decode_length=FLAGS.extra_decode_length)
  rng = np.random.default_rng(0)
  words = [str(i) for i in rng.integers(4, FLAGS.vocab_size, FLAGS.length - 1)]
  sentence = " ".join(words)
  with tempfile.TemporaryDirectory() as tmp:
    def t2t_engine(jit_compile):
      translator = saved_model.Translator(model, tokenizer, decode_config,
                                          jit_compile=jit_compile)
      path = saved_model.export(translator, os.path.join(tmp, f"export_{jit_compile}"), version=1)
      serve = session_signature(path, "serving_default", "inputs", "outputs")

      def t2t_request():
        out = serve(np.array([sentence.encode()]))
        return len(out[0].split())
      return t2t_request

    ct2_dir = ct2_export.export(model, config, tokenizer, os.path.join(tmp, "ct2"))
    ct2 = ctranslate2.Translator(ct2_dir, device="cpu", compute_type="float32",
                                 inter_threads=1, intra_threads=threads)

    def ct2_request():
      result = ct2.translate_batch([words + ["</s>"]], beam_size=FLAGS.beam_size,
                                   length_penalty=FLAGS.alpha,
                                   max_decoding_length=FLAGS.length
                                   + FLAGS.extra_decode_length)
      return len(result[0].hypotheses[0])

    names = {"graph": "t2t_keras SavedModel (session, serving_default)",
             "xla": "t2t_keras SavedModel, --export_jit_compile (session, serving_default)",
             "ctranslate2": "CTranslate2 float32 translate_batch"}
    engines = {names[e]: (ct2_request if e == "ctranslate2" else t2t_engine(e == "xla"))
               for e in FLAGS.engines}
    first = {}
    for name, request in engines.items():
      start = time.perf_counter()
      request()  # the XLA export compiles its beam search for this shape here
      first[name] = (time.perf_counter() - start) * 1000
      for _ in range(2):
        request()
    times = {name: [] for name in engines}
    lengths = {name: [] for name in engines}
    for _ in range(FLAGS.requests):  # alternating, one request each
      for name, request in engines.items():
        start = time.perf_counter()
        lengths[name].append(request())
        times[name].append((time.perf_counter() - start) * 1000)
    for name in engines:
      print(f"{name}: p50 {percentile(times[name], 50):.1f} ms, p99 "
            f"{percentile(times[name], 99):.1f} ms (mean output {np.mean(lengths[name]):.1f} "
            f"tokens, {FLAGS.requests} requests; the first request took "
            f"{first[name]:,.0f} ms)")
    if "ctranslate2" in FLAGS.engines:
      reference = percentile(times[names["ctranslate2"]], 50)
      for engine in FLAGS.engines:
        if engine != "ctranslate2":
          ratio = percentile(times[names[engine]], 50) / reference
          print(f"p50 ratio t2t_keras {engine} / CTranslate2: {ratio:.2f}")


if __name__ == "__main__":
  app.run(main)
