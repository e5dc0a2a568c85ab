r"""Translates files on many machines with Apache Beam: RunInference over the exported
SavedModel (the model TF Serving runs), one output file per input file.

  pip install -e ".[beam]"
  python -m t2t_keras.export --model_dir=M --export_dir=exported
  python -m t2t_keras.tools.beam_translate --saved_model=exported \
      --input='corpus/*.txt' --output_dir=translated [Beam pipeline options]

For each input file, `--output_dir/<its name>` holds its translations line for line,
in order (the best translation of each line, as `python -m t2t_keras.decode` writes
them). The DirectRunner (this machine) by default; any Beam runner with `--runner`
and its options, e.g. Dataflow: `--runner=DataflowRunner --project=P --region=R
--temp_location=gs://B/tmp --setup_file=./setup.py` (docs/decoding.md).

`--saved_model` is a version directory or TF Serving's base directory (its highest
version). The decoding settings are the export's (beam size, alpha, lengths): export
with the flags you would give the decode command. Lines the decode command refuses or
cuts are handled as the export does and counted: invalid UTF-8 bytes become U+FFFD
(`--invalid_utf8=fail` stops instead, naming the file and line, as decode does), lines
longer than `--max_input_length` subwords are cut to it, lines longer than the
export's `--max_string_bytes` are cut to it first (the export refuses longer strings).
The counts are printed at the end (Beam metrics counters, also in the runner's UI).

Memory: a file is read forward by one worker and its lines spread over the workers;
translations are written in chunks of `--chunk_lines` lines, each sorted in one
worker, then concatenated per file in order (streamed), so no worker holds a whole
file. (The DirectRunner keeps each step's output in memory: it suits files of up to a
few million lines; larger jobs belong on a distributed runner.)

After `pip install`, `t2t-beam-translate` is this tool (same flags).
"""

from __future__ import annotations

import sys
import time

from absl import app
from absl import flags

from t2t_keras import console
from t2t_keras.errors import InputError

flags.DEFINE_string("saved_model", None,
                    "The SavedModel: `python -m t2t_keras.export`'s --export_dir (its "
                    "highest version) or one version directory; local or gs://.")
flags.DEFINE_string("input", None,
                    "Input files: a path or pattern (corpus/*.txt, gs://bucket/part-*), "
                    "several comma-separated; one sentence per line.")
flags.DEFINE_string("output_dir", None,
                    "Where each input's translations go, under the input's file name.")
flags.DEFINE_integer("max_batch_size", 0,
                     "Most lines per model call (RunInference's batches); 0: the largest "
                     "the export's request limits allow (rows, and rows x "
                     "max_input_length <= its max_request_tokens).", lower_bound=0)
flags.DEFINE_integer("chunk_lines", 10000,
                     "Lines per ordered chunk of an output: the most one worker holds "
                     "while it sorts them.", lower_bound=1)
flags.DEFINE_enum("invalid_utf8", "replace", ["replace", "fail"],
                  "A line that is not UTF-8: replace its invalid bytes with U+FFFD and "
                  "translate it (as the SavedModel does), or fail the pipeline naming "
                  "the file and line (as the decode command does).")
FLAGS = flags.FLAGS


def parse_flags(argv):
  """This tool's flags; the other arguments are Beam's pipeline options (checked in
  main: Beam would drop an unknown one with a warning)."""
  return FLAGS(argv, known_only=True)


def main(argv):
  for name in ("saved_model", "input", "output_dir"):
    if not getattr(FLAGS, name):
      raise app.UsageError(f"--{name} is required (--help).")
  try:
    from t2t_keras.inference import beam_pipeline  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    if not (error.name or "").startswith("apache_beam"):
      raise
    sys.exit('error: beam_translate needs Apache Beam: pip install -e ".[beam]" (or '
             "pip install 't2t_keras[beam]')")
  try:
    options = beam_pipeline.pipeline_options(argv[1:])
    export = beam_pipeline.read_export(beam_pipeline.resolve_export(FLAGS.saved_model))
    paths = beam_pipeline.check_inputs(FLAGS.input, FLAGS.output_dir)
    largest = export.largest_batch
    if FLAGS.max_batch_size > largest:
      raise InputError(f"--max_batch_size={FLAGS.max_batch_size}: the export takes at most "
                       f"{largest} lines per request (its --max_request_rows "
                       f"{export.max_rows}, --max_request_tokens {export.max_tokens} / "
                       f"--max_input_length {export.max_input_length}); give at most that "
                       "or 0.")
  except InputError as error:
    sys.exit(f"error: {error}")
  batch = FLAGS.max_batch_size or largest
  runner = beam_pipeline.runner_name(options)
  print(f"translating {len(paths)} file(s) with {export.path} on {runner} (batches of up "
        f"to {batch} lines) into {FLAGS.output_dir}", file=sys.stderr, flush=True)
  start = time.time()
  try:
    values, state = beam_pipeline.run(paths, export, FLAGS.output_dir, options,
                                      max_batch_size=batch, chunk_lines=FLAGS.chunk_lines,
                                      invalid_utf8=FLAGS.invalid_utf8)
  except Exception as error:  # pylint: disable=broad-except  (whatever the runner raises)
    # Runners wrap a step's exception in their own, with the step's traceback: the
    # user's error (a DataError) is its last line.
    lines = [line for line in str(error).splitlines() if line.strip()]
    reason = next((line for line in reversed(lines) if "Error: " in line), lines[-1:])
    sys.exit(f"error: the pipeline failed: {reason}")
  seconds = time.time() - start
  rate = values["translated_lines"] / max(seconds, 1e-9)
  print(f"pipeline {state} in {seconds:.1f} s ({rate:.1f} lines/s); counters:\n"
        f"{beam_pipeline.describe_counters(values)}", file=sys.stderr, flush=True)


def console_main():
  """The `t2t-beam-translate` command (setup.py) and `python tools/beam_translate.py`."""
  console.own_help(__name__)
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  console_main()
