"""Translates text with a trained model: `python -m t2t_keras.decode --model_dir=...
--input_file=... --output_file=...` (stdin / stdout when not given).

One sentence per line in, one translation per line out, in input order. Batches are
sorted by length internally; a progress line with sentences/s goes to stderr. With
`--return_beams` every beam is written as `score<TAB>translation`, beams of one input
on consecutive lines, inputs separated by an empty line. With `--reference_file`,
sacreBLEU (cased and uncased) and chrF of the output are printed at the end.
The input is read `--decode_buffer_lines` lines at a time, and each window's
translations are appended to the output as soon as it is done; run again after an
interruption, the command continues after the last complete window of a local
`--output_file` (`--nodecode_resume` starts over), and `--num_shards=N --shard_index=k`
decodes the k-th of N contiguous ranges of the input (`inference/bulk.py`).
Beam search runs in graph mode, where a sentence leaves the batch once its result is
final; greedy search and sampling use XLA (`translate.translate` pads batches so that
it compiles once per source-width bucket) from `AUTO_XLA_SENTENCES` input sentences on,
where its faster steps repay the compilation; `--decode_jit_compile` /
`--nodecode_jit_compile` (on the command line or in a recipe) choose either way for
any input. `--constrain_trees`
(parsing models) lets the beam search write only valid trees over the input's words
(`parsing.constraint.TreeConstraint`). `--target_prefix_file` (one prefix per input
line, empty lines free) makes each translation start with its prefix and continues
the search from there (interactive translation, terminology), as CTranslate2's
`target_prefix`.

Sampling (back-translation): `--sampling_topk=K` (0 = the whole vocabulary) and/or
`--sampling_topp=P` draw from the model's distribution at `--sampling_temperature`
instead of beam search; `--seed` and the input's line number decide each sample, so
a run is reproducible and does not depend on batching. `--num_samples=N` writes N
samples per input in the `--return_beams` layout (score = the sample's log
probability).

`--model_dir=A,B[,C]` decodes with an ensemble (average of the models' log
probabilities; the models must share a vocabulary). `--output_alignments=FILE` writes,
for every output line, its word alignment to the source in Pharaoh format (`i-j`,
0-based source and target word indices) from the encoder-decoder attention of
`--alignment_layer` (default the last), heads averaged or `--alignment_head`; for a
model trained with `--train_alignments`, from its guided head unless those are given.

Paper settings: beam 4, alpha 0.6, input length + 50, average of the last 5 (base)
or 20 (big) checkpoints: `--beam_size=4 --alpha=0.6 --extra_decode_length=50
--average_last_n=5` (the recipes set them). A model directory records the decoding
flags its training run was given (its recipe's): decode uses them where not given
them (`flags.use_recipe`), and its first line says which came from where.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags
from t2t_keras import metrics, outputs
from t2t_keras.configs import DecodeConfig, flag_name
from t2t_keras.inference import bulk
from t2t_keras.trained import modeldir

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_string("input_file", None, "Source sentences, one per line (default stdin).")
t2t_flags.define_output_file("Where translations go (default stdout).")
flags.declare_key_flag("output_file")  # listed under this command's --help
flags.DEFINE_string("reference_file", None, "Reference translations: print BLEU and chrF.")
t2t_flags.define_settings(DecodeConfig, t2t_flags.decoding_fields("decode"))  # + its own
flags.DEFINE_string("target_prefix_file", None,
                    "Target prefixes, line-aligned with the input (an empty line decodes "
                    "freely): each translation starts with its line's prefix and the "
                    "search continues from there.")
flags.DEFINE_string("output_alignments", None,
                    "Write word alignments (Pharaoh 'i-j', 0-based source-target word "
                    "indices) to this file, one line per output line.")
flags.DEFINE_integer("alignment_layer", -1,
                     "Decoder layer whose encoder-decoder attention aligns (-1 = last).")
flags.DEFINE_integer("alignment_head", -1,
                     "Attention head that aligns; -1 = the average of all heads. "
                     "Neither flag given: a model trained with --train_alignments "
                     "aligns with its guided head (--guided_alignment_layer/_head).")
# Bulk translation (inference/bulk.py): windows, resume, shards. A window of 10,000
# lines is 300 batches of 32: sorted as well as a whole file and as fast, and its memory
# is small beside the model's (docs/benchmarks.md, "Bulk translation").
flags.DEFINE_integer("decode_buffer_lines", 10000,
                     "Lines read, sorted by length and decoded at a time (a window); each "
                     "window's translations are written as soon as it is done. Bounds the "
                     "memory; 1 for interactive use.")
flags.DEFINE_boolean("decode_resume", True,
                     "An interrupted decode to a local --output_file continues after its "
                     "last complete window when run again (state in .<name>.resume.json "
                     "beside it); --nodecode_resume starts the output over.")
flags.DEFINE_integer("num_shards", 1,
                     "Split the input into this many contiguous ranges of lines (one per "
                     "host); `cat` of the shards' outputs in order is the whole output.")
flags.DEFINE_integer("shard_index", 0, "The range this run decodes, 0..--num_shards-1.")


def config_from_flags() -> DecodeConfig:
  """The DecodeConfig of the decoding and sampling flags, validated."""
  try:
    return t2t_flags.decode_config().validate()
  except ValueError as error:
    raise flags.ValidationError(str(error)) from None


def xla_given(recipe=None) -> Optional[bool]:
  """--decode_jit_compile when given (command line, recipe or the model directory's
  recipe, `flags.RecipeUse`); None: the Translator's choice (`translator.choose_xla`)."""
  given = FLAGS["decode_jit_compile"].present or (
      recipe is not None and "decode_jit_compile" in recipe.applied)
  return FLAGS.decode_jit_compile if given else None


def check_alignment_flags(model_config) -> None:
  """--alignment_layer / --alignment_head against the model, before any work."""
  layers, heads = model_config.decoder_layers, model_config.num_heads
  layer, head = FLAGS.alignment_layer, FLAGS.alignment_head
  if not -layers <= layer < layers:
    raise flags.ValidationError(f"--alignment_layer={layer} but the model has {layers} "
                                f"decoder layers: use 0..{layers - 1} or -1 (the last).")
  if not -1 <= head < heads:
    raise flags.ValidationError(f"--alignment_head={head} but the model has {heads} "
                                f"heads: use 0..{heads - 1} or -1 (their average).")


def alignment_attention(guided) -> tuple:
  """(decoder layer, head) --output_alignments reads: the flags' when either is typed;
  else `guided`, the head one model trained with guided alignment (--train_alignments)
  was trained to align with (`translator.guided_attention`); else the flags' defaults
  (last layer, heads averaged)."""
  layer, head = FLAGS.alignment_layer, FLAGS.alignment_head
  if FLAGS["alignment_layer"].present or FLAGS["alignment_head"].present or guided is None:
    return layer, head
  print(f"alignments from the guided head (decoder layer {guided[0]}, head "
        f"{guided[1]}) the model was trained with (--train_alignments)",
        file=sys.stderr, flush=True)
  return guided


def job_arguments() -> dict:
  """The arguments of the run's `bulk.Job`: the input read in windows of
  --decode_buffer_lines (this shard's lines), with the files line-aligned with it
  (--reference_file, --target_prefix_file), the outputs, and whether to resume."""
  outputs.check_paths({"--output_file": FLAGS.output_file,
                       "--output_alignments": FLAGS.output_alignments},
                      {"--input_file": FLAGS.input_file,
                       "--reference_file": FLAGS.reference_file,
                       "--target_prefix_file": FLAGS.target_prefix_file})
  return dict(input_file=FLAGS.input_file,
              aligned={f"--{flag}": FLAGS[flag].value
                       for flag in ("reference_file", "target_prefix_file")},
              output_file=FLAGS.output_file, output_alignments=FLAGS.output_alignments,
              buffer_lines=FLAGS.decode_buffer_lines, num_shards=FLAGS.num_shards,
              shard_index=FLAGS.shard_index, resume=FLAGS.decode_resume)


def output_settings(decode_config: DecodeConfig, model_dirs, weights, attention) -> dict:
  """What decides the output's bytes, by flag: a resumed run must have the same."""
  settings = {f"--{flag_name(field)}": getattr(decode_config, field.name)
              for field in dataclasses.fields(decode_config)
              # batches at a time, devices: the same output; XLA: resolved after the
              # model loads
              if field.name not in ("parallel_batches", "devices", "jit_compile")}

  def path(given):  # a relative path and its absolute form are the same
    return given and outputs.normalized(given)

  settings.update({"--model_dir": [path(d) for d in model_dirs], "--average_last_n":
                   weights.average_last_n, "--checkpoint_path": path(weights.checkpoint_path),
                   "--dtype": weights.dtype, "alignment (layer, head)": list(attention)})
  return settings


def run() -> None:
  # The choices above (XLA or graph mode, batches at a time) are `inference.Translator`'s
  # (inference/translator.py), so that the Python API decodes as fast as this command.
  # The model's modules (Keras among them) load once the flags are checked.
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras.inference import translator as translator_lib

  tf.get_logger().setLevel("WARNING")
  # Every flag is checked before any work: the model's shape, the outputs, the inputs.
  model_dirs = t2t_flags.model_dirs()
  recipe = t2t_flags.use_recipe(model_dirs[0])  # before the flags are read
  decode_config = config_from_flags()
  model_config = modeldir.load_model_config(model_dirs[0])
  data_config = modeldir.data_config_of(model_dirs[0])
  for warning in t2t_flags.check_inference_flags(
      sys.argv, model_config, "decode", reads=("output_file",),
      requested_vocab_size=data_config.vocab_size):
    logging.warning(warning)
  if FLAGS.output_alignments:
    check_alignment_flags(model_config)
  decode_config = translator_lib.with_language(decode_config, data_config)
  job = bulk.Job(**job_arguments())  # its outputs are opened by bulk.decode
  weights = t2t_flags.weights_config(sys.argv)
  attention = (alignment_attention(translator_lib.guided_attention(model_dirs))
               if FLAGS.output_alignments else (-1, -1))
  job.check_settings(output_settings(decode_config, model_dirs, weights, attention))
  translator = translator_lib.Translator.load(
      model_dirs, decode_config, weights, sentences=job.sentences_for_choices(),
      xla=xla_given(recipe), alignments=bool(FLAGS.output_alignments))
  job.check_settings({"--decode_jit_compile": translator.decode_config.jit_compile,
                      "checkpoints": [[outputs.normalized(c) for c in m.checkpoints]
                                      for m in translator.loaded]})
  origin = recipe.describe(t2t_flags.decoding_flags("decode"))
  print(translator.describe(job.count_text()) + (f"; {origin}" if origin else ""),
        file=sys.stderr, flush=True)
  multiple = decode_config.return_beams or decode_config.num_samples > 1
  results = bulk.decode(job, translator, multiple, attention)
  note = translator.truncation_note(results.cut, results.count)
  if note:
    print(note, file=sys.stderr, flush=True)
  if FLAGS.reference_file:
    report = metrics.bleu_report(results.best, [results.references])
    print(metrics.format_report(report), file=sys.stderr, flush=True)

command = console.Command(run)
main, console_main = command.main, command.console_main  # console_main: python -m
console_script_main = command.console_script_main  # t2t-decode

if __name__ == "__main__":
  console_main()
