"""Throughput and peak memory of bulk translation: the decode command against the Beam
pipeline on the DirectRunner (tools/beam_translate.py), same model, same settings.

Builds the tests' tiny random-weight Transformer (hidden 16, 2+2 layers, SentencePiece
vocabulary of 120 over made-up words: tests/conftest.py) and its SavedModel export with
the decoding settings below, writes inputs of N made-up lines of 3-11 words, then for
each size runs, each in a fresh process, the decode command and the Beam pipeline,
alternating, and prints lines/s (wall time of the process, TensorFlow's start and the
model's load included) and the process's peak resident memory (ru_maxrss from wait4).
Beam's DirectRunner runs the pipeline in its own process, so its peak is the
pipeline's. Run it with the beam extra installed (a venv of `pip install -e
".[tensorflow,beam]"`):

  python bench/beam_translate.py [--sizes=2000,20000,200000] [--rounds=1]
"""

import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

flags.DEFINE_list("sizes", ["2000", "20000", "200000"], "Input lines per run.")
flags.DEFINE_integer("rounds", 1, "Runs of each command per size (alternating).")
flags.DEFINE_integer("beam_size", 4, "Beam size (graph mode in both).")
flags.DEFINE_integer("extra_decode_length", 2, "Output length limit: source + this.")
flags.DEFINE_boolean("beam_first", False, "Run the pipeline before the command in each "
                     "round (a load that falls or rises then favours the other).")
flags.DEFINE_string("work_dir", None, "Where the model, inputs and outputs go (default "
                    "a temporary directory).")
FLAGS = flags.FLAGS

MAX_INPUT_LENGTH = 256


def build(work):
  """The model directory and its export (version 1), built once."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.configs import DecodeConfig
  from t2t_keras.export import ExportSettings
  from t2t_keras.export.saved_model import export_from_settings
  from tests.conftest import build_tiny_model_dir
  model, export = os.path.join(work, "model"), os.path.join(work, "export")
  if not os.path.exists(os.path.join(export, "1")):
    os.makedirs(model, exist_ok=True)
    build_tiny_model_dir(model)
    export_from_settings(ExportSettings(model, export, DecodeConfig(
        beam_size=FLAGS.beam_size, extra_decode_length=FLAGS.extra_decode_length,
        max_input_length=MAX_INPUT_LENGTH), version=1))
  return model, export


def write_input(path, lines, seed=0):
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  words = ("a the man woman dog cat runs sits on in park street red blue small big "
           "plays with ball . , ein der Mann Frau Hund läuft spielt über Fußball").split()
  with open(path, "w", encoding="utf-8") as f:
    for _ in range(lines):
      f.write(" ".join(rng.choice(words, rng.integers(3, 12))) + "\n")


def measure(command, env):
  """(wall seconds, peak resident MB) of one process."""
  start = time.time()
  process = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
  stderr = process.stderr.read()
  _, status, usage = os.wait4(process.pid, 0)
  process.returncode = os.waitstatus_to_exitcode(status)
  if process.returncode:
    raise RuntimeError(f"{command} failed:\n{stderr.decode()[-3000:]}")
  return time.time() - start, usage.ru_maxrss / 1024


def main(argv):
  del argv
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="beam_bench_")
  model, export = build(work)
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  print(f"work dir {work}; beam {FLAGS.beam_size}, extra length "
        f"{FLAGS.extra_decode_length}, max_input_length {MAX_INPUT_LENGTH}")
  print("| lines | command | lines/s (wall) | peak memory |\n|---|---|---|---|")
  for size in map(int, FLAGS.sizes):
    source_dir = os.path.join(work, f"in{size}")
    os.makedirs(source_dir, exist_ok=True)
    source = os.path.join(source_dir, "input.txt")
    if not os.path.exists(source):
      write_input(source, size)
    commands = {
        "decode": [sys.executable, "-m", "t2t_keras.decode", f"--model_dir={model}",
                   f"--input_file={source}", f"--output_file={work}/decode{size}.txt",
                   f"--beam_size={FLAGS.beam_size}",
                   f"--extra_decode_length={FLAGS.extra_decode_length}",
                   f"--max_input_length={MAX_INPUT_LENGTH}", "--nodecode_resume"],
        "beam DirectRunner": [
            sys.executable, "-m", "t2t_keras.tools.beam_translate", f"--saved_model={export}",
            f"--input={source}", f"--output_dir={work}/beam{size}"],
    }
    order = list(commands.items())
    if FLAGS.beam_first:
      order.reverse()
    for _ in range(FLAGS.rounds):
      for name, command in order:
        seconds, peak = measure(command, env)
        print(f"| {size:,} | {name} | {size / seconds:,.0f} ({seconds:.1f} s) | "
              f"{peak:,.0f} MB |", flush=True)
    with open(f"{work}/decode{size}.txt", "rb") as a, \
        open(f"{work}/beam{size}/input.txt", "rb") as b:
      x, y = a.read().split(b"\n"), b.read().split(b"\n")
    same = sum(p == q for p, q in zip(x, y))
    print(f"|   | {size:,} lines: the pipeline's output == decode's on {same - 1} of "
          f"{len(x) - 1} lines | | |", flush=True)


if __name__ == "__main__":
  app.run(main)
