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

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags
from t2t_keras import outputs
from t2t_keras.configs import DecodeConfig

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

# Greedy search and sampling (one row per hypothesis) use XLA from this many input
# sentences on, unless --decode_jit_compile says otherwise: each source-width bucket
# compiles once and XLA's steps are faster, so a few hundred sentences repay the
# compilations; the translations are the same (tests/decoding_test.py). Beam search
# stays in graph mode: there a sentence leaves the batch once its result is final,
# which XLA's fixed shapes cannot do, and on real sentences that wins. Figures:
# docs/benchmarks.md, "Measurements behind the decoding code".
AUTO_XLA_SENTENCES = 256


def config_from_flags() -> DecodeConfig:
  """The DecodeConfig of the decoding and sampling flags, validated."""
  try:
    return t2t_flags.decode_config().validate()
  except ValueError as error:
    raise flags.ValidationError(str(error)) from None


def with_language(config: DecodeConfig, data_config) -> DecodeConfig:
  """`config` with its target language resolved against the model's data
  (`language_tags.check_request`: the dev files' language by default)."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras import language_tags
  from t2t_keras.errors import ConfigError
  try:
    language = language_tags.check_request(config.target_language, data_config,
                                           "--target_language")
  except ValueError as error:
    raise ConfigError(str(error)) from None
  return dataclasses.replace(config, target_language=language)


def _xla_chosen(recipe=None) -> bool:
  """Whether --decode_jit_compile was given (command line, recipe or the model
  directory's recorded recipe, `flags.RecipeUse`)."""
  return FLAGS["decode_jit_compile"].present or (
      recipe is not None and "decode_jit_compile" in recipe.applied)


def choose_xla(decode_config: DecodeConfig, sentences: int, recipe=None) -> DecodeConfig:
  """--decode_jit_compile as given (command line, recipe or the model's recorded recipe); when
  not given, XLA for greedy search and sampling of `AUTO_XLA_SENTENCES` sentences or
  more, graph mode for beam search (see AUTO_XLA_SENTENCES)."""
  if _xla_chosen(recipe):
    return decode_config
  return dataclasses.replace(
      decode_config,
      jit_compile=sentences >= AUTO_XLA_SENTENCES and decode_config.beams_per_row == 1)


AUTO_PARALLEL_BATCHES_MAX = 8  # each batch in flight holds its own caches and logits


def choose_parallel_batches(decode_config: DecodeConfig, sentences: int,
                            alignments: bool = False) -> DecodeConfig:
  """--decode_parallel_batches resolved, and TensorFlow's threads per op set to the
  cores / that many; must run before TensorFlow starts its runtime (before the model
  loads). 0: one batch per CPU core (at most AUTO_PARALLEL_BATCHES_MAX) without GPUs,
  and 1 with `alignments` (--output_alignments scores one batch at a time afterwards,
  on the threads set here). Any value is capped at the input's number of batches."""
  # pylint: disable=import-outside-toplevel
  import math
  import os

  import tensorflow as tf
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
      os.cpu_count() or 1)
  workers = decode_config.parallel_batches
  if not workers:
    gpus = tf.config.list_physical_devices("GPU")
    workers = 1 if gpus or alignments else min(cores, AUTO_PARALLEL_BATCHES_MAX)
  workers = max(1, min(workers, math.ceil(sentences / decode_config.batch_size)))
  if workers > 1:
    try:
      tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // workers))
    except RuntimeError:  # the runtime has started (a caller in the same process)
      logging.warning("--decode_parallel_batches=%d: TensorFlow has started, so each "
                      "batch's ops keep their threads", workers)
  return dataclasses.replace(decode_config, parallel_batches=workers)


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


def alignment_attention(model_dirs) -> tuple:
  """(decoder layer, head) --output_alignments reads: the flags' when either is typed;
  else, for one model trained with guided alignment (--train_alignments), the head
  it was trained to align with (the average of the heads aligns worse: the other
  heads were never told to); else the flags' defaults (last layer, heads averaged)."""
  from t2t_keras.trained import modeldir  # pylint: disable=import-outside-toplevel
  layer, head = FLAGS.alignment_layer, FLAGS.alignment_head
  if FLAGS["alignment_layer"].present or FLAGS["alignment_head"].present:
    return layer, head
  guided = modeldir.guided_alignment_of(model_dirs[0]) if len(model_dirs) == 1 else None
  if guided is None:
    return layer, head
  print(f"alignments from the guided head (decoder layer {guided['layer']}, head "
        f"{guided['head']}) the model was trained with (--train_alignments)",
        file=sys.stderr, flush=True)
  return guided["layer"], guided["head"]


def write_alignments(model, tokenizer, results, multiple: bool, out,
                     attention: tuple = (-1, -1), progress: bool = True) -> None:
  """--output_alignments: one Pharaoh line per output line (blank lines as well), from
  `attention`'s (decoder layer, head; -1 = heads averaged)."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.inference import scoring
  layer, head = attention
  pairs = [(r.source_ids, ids) for r in results for ids in (r.ids if multiple else r.ids[:1])]
  meter = console.Progress(len(pairs), unit="pairs", verb="aligned") if progress else None
  forced = scoring.force(model, [s for s, _ in pairs], [scoring.with_eos(t) for _, t in pairs],
                         batch_size=FLAGS.decode_batch_size, attention_layer=layer,
                         progress=meter)
  starts = scoring.word_starts(tokenizer)
  lines = iter([scoring.pharaoh(scoring.align(f.attention, s, scoring.with_eos(t), starts,
                                              head)) for f, (s, t) in zip(forced, pairs)])
  for result in results:
    for _ in (result.ids if multiple else result.ids[:1]):
      out.write(next(lines) + "\n")
    if multiple:
      out.write("\n")


def read_inputs():
  """The run's `bulk.Job`: the input read in windows of --decode_buffer_lines (this
  shard's lines), with the files line-aligned with it (--reference_file,
  --target_prefix_file), the outputs, and an interrupted run's state to resume."""
  from t2t_keras.inference import bulk  # pylint: disable=import-outside-toplevel
  outputs.check_paths({"--output_file": FLAGS.output_file,
                       "--output_alignments": FLAGS.output_alignments},
                      {"--input_file": FLAGS.input_file,
                       "--reference_file": FLAGS.reference_file,
                       "--target_prefix_file": FLAGS.target_prefix_file})
  return bulk.Job(FLAGS.input_file, {f"--{flag}": FLAGS[flag].value
                                     for flag in ("reference_file", "target_prefix_file")},
                  FLAGS.output_file, FLAGS.output_alignments, FLAGS.decode_buffer_lines,
                  FLAGS.num_shards, FLAGS.shard_index, FLAGS.decode_resume)


def describe(decode_config: DecodeConfig, sentences: int, loaded, recipe=None) -> str:
  """The line printed before decoding: what decodes (the checkpoints; several: their
  average), how, in which mode, and which settings came from the model directory's
  recipe (`recipe`, a `flags.RecipeUse`)."""
  if decode_config.sampling:
    how = (f"sampling {decode_config.num_samples} per input: top-k "
           f"{decode_config.sampling_topk or 'all'}, top-p {decode_config.sampling_topp:g}, "
           f"temperature {decode_config.sampling_temperature:g}, seed {decode_config.seed}")
  else:
    how = f"beam {decode_config.beam_size}, alpha {decode_config.alpha}"
  how += (f"; {decode_config.parallel_batches} batches at a time"
          if decode_config.parallel_batches > 1 else "")
  used = "; ".join(("the average of " if len(l.checkpoints) > 1 else "")
                   + ", ".join(l.checkpoints) for l in loaded)
  if decode_config.jit_compile:
    mode = "XLA" + ("" if _xla_chosen(recipe) else
                    f" (one row per input from {AUTO_XLA_SENTENCES} sentences on; "
                    "--nodecode_jit_compile for graph mode)")
  else:
    mode = "graph mode" + ("" if _xla_chosen(recipe) else
                           " (beam search drops finished sentences from the batch; "
                           "--decode_jit_compile for XLA)")
  origin = recipe.describe(t2t_flags.decoding_flags("decode")) if recipe else ""
  return (f"decoding {sentences} sentences with {used}"
          f"{' (ensemble)' if len(loaded) > 1 else ''} ({how}, extra length "
          f"{decode_config.extra_decode_length}; {mode})"
          + (f"; {origin}" if origin else ""))


def tree_constraint(decode_config: DecodeConfig, loaded):
  """--constrain_trees: the tree constraint of the (first) model's parser, else None."""
  if not decode_config.constrain_trees:
    return None
  # pylint: disable=import-outside-toplevel
  from t2t_keras.errors import DataError
  from t2t_keras.parsing.constraint import TreeConstraint
  try:
    return TreeConstraint.from_tokenizer(loaded[0].tokenizer,
                                         loaded[0].data_config.parsing_linearization)
  except ValueError as error:
    raise DataError(f"--constrain_trees with --model_dir={FLAGS.model_dir}: "
                    f"{error}") from None


def write_outputs(job, window, results, multiple: bool, model, tokenizer,
                  attention=(-1, -1)) -> None:
  """One window's translations (and --output_alignments), appended to the outputs
  (`bulk.Job.commit`)."""
  import io  # pylint: disable=import-outside-toplevel
  out = io.StringIO()
  for result in results:
    if multiple:
      for text, score in zip(result.texts, result.scores):
        out.write(f"{score:.4f}\t{text}\n")
      out.write("\n")
    else:
      out.write(result.texts[0] + "\n")
  texts = {"output": out.getvalue()}
  if FLAGS.output_alignments:
    texts["alignments"] = io.StringIO()
    write_alignments(model, tokenizer, results, multiple, texts["alignments"], attention,
                     progress=False)
    texts["alignments"] = texts["alignments"].getvalue()
  job.commit(window, texts)


def earlier_translations(job, lines: int, multiple: bool) -> tuple:
  """The best translations of a resumed run's first `lines` lines, read back from
  --output_file, and their --reference_file lines (for BLEU over the whole run)."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.errors import DataError
  from t2t_keras.textio import read_lines
  from t2t_keras.inference import bulk
  written = read_lines(FLAGS.output_file, "--output_file", DataError)
  if multiple:  # blocks of "score<TAB>text" lines, each ended by an empty line
    starts = [0] + [i + 1 for i, line in enumerate(written) if not line]
    written = [written[i].split("\t", 1)[1] for i in starts[:lines]]
  reader = bulk.LineReader(FLAGS.reference_file, "--reference_file")
  reader.skip(job.start)
  references = reader.read(lines)
  reader.close()
  return written[:lines], references


def output_settings(decode_config: DecodeConfig, model_dirs, weights, attention) -> dict:
  """What decides the output's bytes, by flag: a resumed run must have the same."""
  from t2t_keras.configs import flag_name  # pylint: disable=import-outside-toplevel
  settings = {f"--{flag_name(field)}": getattr(decode_config, field.name)
              for field in dataclasses.fields(decode_config)
              # batches at a time: the same output; XLA: resolved after the model loads
              if field.name not in ("parallel_batches", "jit_compile")}

  def path(given):  # a relative path and its absolute form are the same
    return given and outputs.normalized(given)

  settings.update({"--model_dir": [path(d) for d in model_dirs], "--average_last_n":
                   weights.average_last_n, "--checkpoint_path": path(weights.checkpoint_path),
                   "--dtype": weights.dtype, "alignment (layer, head)": list(attention)})
  return settings


def run() -> None:
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from t2t_keras.trained import modeldir
  from t2t_keras.inference import decoding, loading, translate

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
  decode_config = with_language(decode_config, data_config)
  job = read_inputs()  # its outputs are opened by decode_windows
  sentences = job.sentences_for_choices()
  weights = t2t_flags.weights_config(sys.argv)
  decode_config = choose_parallel_batches(decode_config, sentences,
                                          alignments=bool(FLAGS.output_alignments))
  attention = alignment_attention(model_dirs) if FLAGS.output_alignments else (-1, -1)
  job.check_settings(output_settings(decode_config, model_dirs, weights, attention))
  model, loaded = loading.load_ensemble(model_dirs, weights.checkpoint_path,
                                        weights.average_last_n, weights.dtype)
  tokenizer = loaded[0].tokenizer
  decode_config = choose_xla(decode_config, sentences, recipe)
  job.check_settings({"--decode_jit_compile": decode_config.jit_compile,
                      "checkpoints": [[outputs.normalized(c) for c in m.checkpoints]
                                      for m in loaded]})
  print(describe(decode_config, job.count_text(), loaded, recipe), file=sys.stderr,
        flush=True)
  decode_fn = decoding.make_decode_fn(model, decode_config,
                                      tree_constraint(decode_config, loaded))
  results = decode_windows(job, decode_fn, tokenizer, decode_config, model, attention)
  note = translate.truncation_note(results.cut, results.count,
                                   decode_config.max_input_length)
  if note:
    print(note, file=sys.stderr, flush=True)
  if FLAGS.reference_file:
    from t2t_keras import metrics
    report = metrics.bleu_report(results.best, [results.references])
    print(metrics.format_report(report), file=sys.stderr, flush=True)


@dataclasses.dataclass
class Decoded:
  """What `decode_windows` reports: inputs cut to --max_input_length and decoded (this
  run's), and with --reference_file the best translations and references of the whole
  range (a resumed run's earlier ones read back)."""

  cut: int = 0
  count: int = 0
  best: list = dataclasses.field(default_factory=list)
  references: list = dataclasses.field(default_factory=list)


def decode_windows(job, decode_fn, tokenizer, decode_config: DecodeConfig, model,
                   attention) -> Decoded:
  """Decodes `job`'s windows in order, each appended to the outputs when done
  (interrupted: the complete windows stay, and the state to resume them)."""
  from t2t_keras.inference import translate  # pylint: disable=import-outside-toplevel
  multiple = decode_config.return_beams or decode_config.num_samples > 1
  meter = console.Progress(job.lines, done=job.done)
  done = Decoded()
  with job:
    job.open_outputs()
    for window in job.windows():
      results = translate.translate(
          decode_fn, tokenizer, window.sentences, decode_config,
          target_prefixes=window.aligned.get("--target_prefix_file"), progress=meter,
          first_key=window.first)
      write_outputs(job, window, results, multiple, model, tokenizer, attention)
      done.cut += sum(r.truncated for r in results)
      done.count += len(results)
      if FLAGS.reference_file:
        done.best += [r.texts[0] for r in results]
        done.references += window.aligned["--reference_file"]
    job.finish()
  if FLAGS.reference_file and job.done > done.count:  # resumed: read the earlier back
    best, references = earlier_translations(job, job.done - done.count, multiple)
    done.best, done.references = best + done.best, references + done.references
  return done

command = console.Command(run)
main, console_main = command.main, command.console_main  # console_main: python -m
console_script_main = command.console_script_main  # t2t-decode

if __name__ == "__main__":
  console_main()
