r"""Translates a file with a CTranslate2 export of a t2t_keras model.

  python -m t2t_keras.export --model_dir=M --export_dir=ct2 --format=ctranslate2 \
      [--quantization=int8]
  python tools/ct2_translate.py --model=ct2 --input_file=src.txt [--output_file=out.txt]

Tokenizes with the exported `sentencepiece.model` exactly as training did (synthetic
models: whitespace-separated ids; with separate vocabularies the export holds
`source.model`, which tokenizes, and `target.model`, which detokenizes), translates in
batches with beam search, detokenizes, and writes one translation per line, in input
order (stdout by default). CTranslate2's `length_penalty` is not the GNMT penalty of
`--alpha`; the default here, 0, ranks by log-probability as `--alpha=0` does.

Lengths as the project's decoder (`python -m t2t_keras.decode`): sources longer than
`--max_input_length` subwords (EOS included) are cut to it, and each translation may
have at most its source's length + `--extra_decode_length` subwords. Batches hold
sources of one length, so every sentence gets its own limit (CTranslate2 has one per
batch). Sources cut and translations that reached their limit are counted in one line
each on stderr.

Needs only ctranslate2 and sentencepiece for local paths; paths with a scheme (gs://,
...) are read and written through TensorFlow's tf.io.gfile (the model directory is
copied to a local temporary directory first: CTranslate2 opens local files only).

After `pip install`, `t2t-ct2-translate` is this tool (same flags).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
import tempfile
import time

from absl import app
from absl import flags

from t2t_keras import console
from t2t_keras.configs import DecodeConfig  # the inference settings (no TensorFlow)

# The flags of the inference settings this tool reads, with their defaults.
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(DecodeConfig)}

flags.DEFINE_string("model", None, "The CTranslate2 model directory (local or gs://...).")
flags.DEFINE_string("input_file", None, "Sentences, one per line.")
flags.DEFINE_string("output_file", None, "Where to write translations (default stdout).")
flags.DEFINE_integer("beam_size", _DEFAULTS["beam_size"], "Beam size (1: greedy).",
                     lower_bound=1)
flags.DEFINE_float("length_penalty", 0.0, "CTranslate2's length penalty exponent.")
flags.DEFINE_integer("batch_size", _DEFAULTS["batch_size"], "Sentences per batch.",
                     lower_bound=1)
flags.DEFINE_string("compute_type", "default",
                    "CTranslate2 compute type: default (the weights' type), int8, "
                    "float32, ...")
flags.DEFINE_integer("max_input_length", _DEFAULTS["max_input_length"],
                     "Sources longer than this many subwords (EOS included) are cut to it, "
                     "as t2t_keras.decode and the SavedModel export do.", lower_bound=2)
flags.DEFINE_integer("extra_decode_length", _DEFAULTS["extra_decode_length"],
                     "A translation has at most its source's length + this many subwords "
                     "(t2t_keras.decode's --extra_decode_length).", lower_bound=0)
flags.DEFINE_string("target_language", _DEFAULTS["target_language"],
                    "A multilingual model's target language (--target_language_tags at "
                    "training): its tag piece <2xx> starts every source.")
FLAGS = flags.FLAGS


def settings_from_flags() -> DecodeConfig:
  """The inference settings of this tool's flags (--batch_size: sentences per batch)."""
  return DecodeConfig(beam_size=FLAGS.beam_size, batch_size=FLAGS.batch_size,
                      max_input_length=FLAGS.max_input_length,
                      extra_decode_length=FLAGS.extra_decode_length,
                      target_language=FLAGS.target_language)


def _remote(path: str) -> bool:
  return "://" in path and not path.startswith("file://")


def _gfile():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel  (remote paths only)
  return tf.io.gfile


def _open(path: str, mode: str):
  """A text file: Python's open() on local disk, tf.io.gfile for gs:// and the like."""
  if _remote(path):
    return _gfile().GFile(path, mode)
  return open(path, mode, encoding="utf-8")


def _exists(path: str) -> bool:
  return _gfile().exists(path) if _remote(path) else os.path.exists(path)


def _local_model(model: str, local: str) -> str:
  """`model` itself when local; else a copy of its files in `local`."""
  if not _remote(model):
    return model
  gfile = _gfile()
  for name in gfile.listdir(model):
    if not gfile.isdir(os.path.join(model, name)):
      gfile.copy(os.path.join(model, name), os.path.join(local, name), overwrite=True)
  return local


def _batches(lengths, batch_size: int):
  """Batches of indices whose sources have one length, shortest first."""
  order = sorted(range(len(lengths)), key=lambda i: lengths[i])
  for _, group in itertools.groupby(order, key=lambda i: lengths[i]):
    group = list(group)
    for start in range(0, len(group), batch_size):
      yield group[start:start + batch_size]


def main(argv):
  del argv
  for name in ("model", "input_file"):
    if not getattr(FLAGS, name):
      sys.exit(f"error: --{name} is required")
  try:
    import ctranslate2  # pylint: disable=import-outside-toplevel
  except ImportError:
    sys.exit('error: needs ctranslate2: pip install -e ".[ctranslate2]"')
  if not _exists(os.path.join(FLAGS.model, "model.bin")):
    sys.exit(f"error: {FLAGS.model} has no model.bin: pass the --export_dir of "
             "`python -m t2t_keras.export --format=ctranslate2`")
  try:
    with _open(FLAGS.input_file, "r") as f:
      lines = f.read().split("\n")
  except Exception as error:  # pylint: disable=broad-except  (OSError, UnicodeDecodeError,
    # tf.errors.OpError for remote paths)
    sys.exit(f"error: cannot read --input_file={FLAGS.input_file}: {error}")
  if lines[-1] == "":  # the last line's newline
    lines.pop()
  lines = [line.rstrip("\r") for line in lines]
  settings = settings_from_flags()
  with tempfile.TemporaryDirectory() as local:
    model = _local_model(FLAGS.model, local)
    spm_path = os.path.join(model, "sentencepiece.model")
    if not os.path.exists(spm_path):  # separate vocabularies: the source's tokenizes
      spm_path = os.path.join(model, "source.model")
    target_path = os.path.join(model, "target.model")
    if os.path.exists(spm_path):
      import sentencepiece  # pylint: disable=import-outside-toplevel
      processor = sentencepiece.SentencePieceProcessor(model_file=spm_path)
      target = (sentencepiece.SentencePieceProcessor(model_file=target_path)
                if os.path.exists(target_path) else processor)
      tag = []
      if settings.target_language:
        tag = [f"<2{settings.target_language}>"]
        if processor.piece_to_id(tag[0]) == processor.unk_id():
          sys.exit(f"error: --target_language={settings.target_language}: the model's "
                   f"vocabulary has no piece {tag[0]} (it was trained without that "
                   "target-language tag)")
      encode = lambda line: tag + processor.encode(line, out_type=str)  # noqa: E731
      decode = target.decode_pieces
    else:  # the synthetic tasks: ids as words
      encode = str.split
      decode = " ".join
    translator = ctranslate2.Translator(model, device="cpu",
                                        compute_type=FLAGS.compute_type)
    translations = translate(translator, [encode(line) for line in lines], settings,
                             FLAGS.length_penalty)
  outputs = [decode(tokens) for tokens in translations]
  if FLAGS.output_file:
    try:
      with _open(FLAGS.output_file, "w") as out:
        out.write("".join(line + "\n" for line in outputs))
    except Exception as error:  # pylint: disable=broad-except  (OSError, tf.errors.OpError)
      sys.exit(f"error: cannot write --output_file={FLAGS.output_file}: {error}")
  else:
    sys.stdout.write("".join(line + "\n" for line in outputs))


def translate(translator, sources, settings: DecodeConfig, length_penalty: float):
  """Token lists in, best hypotheses out (input order), with the decoder's limits:
  sources cut to `settings.max_input_length`, each translation at most its source's
  length + `settings.extra_decode_length`, batches of `settings.batch_size`."""
  keep = settings.max_input_length - 1  # CTranslate2 appends EOS (add_source_eos)
  cut = sum(len(tokens) > keep for tokens in sources)
  sources = [tokens[:keep] for tokens in sources]
  if cut:
    print(f"note: {cut} of {len(sources)} input sentences were longer than "
          f"--max_input_length={settings.max_input_length} subwords (EOS included) and were "
          "cut to it; raise --max_input_length to translate them whole.", file=sys.stderr)
  results = [None] * len(sources)
  at_limit, done, start = 0, 0, time.time()
  for batch in _batches([len(s) for s in sources], settings.batch_size):
    limit = len(sources[batch[0]]) + settings.extra_decode_length
    hypotheses = translator.translate_batch(
        [sources[i] for i in batch], beam_size=settings.beam_size,
        length_penalty=length_penalty, max_decoding_length=limit,
        max_input_length=0)  # 0: no cut of CTranslate2's own (ours is above)
    for i, result in zip(batch, hypotheses):
      results[i] = result.hypotheses[0]
      at_limit += len(results[i]) >= limit
    done += len(batch)
    rate = done / max(time.time() - start, 1e-9)
    print(f"{done}/{len(sources)} sentences | {rate:.1f} sentences/s | eta "
          f"{(len(sources) - done) / max(rate, 1e-9):.0f}s", file=sys.stderr)
  if at_limit:
    print(f"note: {at_limit} of {len(sources)} translations reached their length limit "
          f"(source length + --extra_decode_length={settings.extra_decode_length}) and may "
          "be cut; raise --extra_decode_length if they should go on.", file=sys.stderr)
  return results


def console_main():
  """The `t2t-ct2-translate` console script (setup.py) and `python tools/ct2_translate.py`."""
  console.own_help(__name__)
  app.run(main)


if __name__ == "__main__":
  console_main()
