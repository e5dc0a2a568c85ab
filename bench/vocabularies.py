"""One shared vocabulary against --separate_vocabularies, on Multi30k EN-DE.

The same small model, seed and steps (flags/small_cpu.cfg) are trained twice: with the
recipe's one joint BPE vocabulary of --shared_size pieces and --shared_embeddings, and
with two BPE vocabularies of --side_size pieces each (the same total budget) and
--shared_decoder_embeddings, so the two models also hold the same number of embedding
weights (8000 x 256 = 2 x 4000 x 256). Each prints its dev loss and dev BLEU (the
training's own evaluation: the first --eval_bleu_sentences validation pairs, beam 4)
at the last step; the bench adds the vocabularies' sizes and the pieces per sentence
of the 1,014 validation pairs on each side.

    python bench/vocabularies.py [--steps=600] [--shared_size=8000] [--side_size=4000] \\
        [--data=../shared/data/multi30k] [--work_dir=/tmp/vocabularies_bench]

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import machine, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_integer("steps", 600, "Training steps of each model.")
flags.DEFINE_integer("shared_size", 8000, "Pieces of the shared vocabulary.")
flags.DEFINE_integer("side_size", 4000, "Pieces of each separate vocabulary.")
flags.DEFINE_integer("bleu_sentences", 500, "Validation pairs the dev BLEU decodes.")
flags.DEFINE_string("data", os.path.join(os.path.dirname(ROOT), "shared", "data",
                                         "multi30k"),
                    "Folder with Multi30k's train and valid .en/.de files.")
flags.DEFINE_string("work_dir", "/tmp/vocabularies_bench", "Vocabularies, caches, models.")
flags.DEFINE_list("configs", ["shared", "separate"], "Which models to train.")
FLAGS = flags.FLAGS


def model_flags(name: str):
  if name == "shared":
    return [f"--vocab_size={FLAGS.shared_size}"]
  return ["--separate_vocabularies", "--noshared_embeddings", "--shared_decoder_embeddings",
          f"--vocab_size={FLAGS.side_size}", f"--target_vocab_size={FLAGS.side_size}"]


def train(work: str, name: str) -> str:
  """Trains one model (skipped when its log already ends); returns the log's text."""
  log_path = f"{work}/{name}.log"
  if not os.path.exists(f"{work}/{name}/checkpoint"):
    command = [sys.executable, "-m", "t2t_keras.train", "--flagfile=flags/small_cpu.cfg",
               f"--model_dir={work}/{name}", f"--data_dir={work}/data",
               f"--train_src={FLAGS.data}/train.en", f"--train_tgt={FLAGS.data}/train.de",
               f"--dev_src={FLAGS.data}/valid.en", f"--dev_tgt={FLAGS.data}/valid.de",
               f"--train_steps={FLAGS.steps}", "--train_minutes=0",
               f"--eval_every={FLAGS.steps}",
               f"--eval_bleu_sentences={FLAGS.bleu_sentences}",
               "--seed=1"] + model_flags(name)
    print(" ".join(command[1:]), flush=True)
    with open(log_path, "w") as log:
      subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
  with open(log_path, encoding="utf-8") as f:
    return f.read()


def last_eval(log: str):
  """(dev loss, dev BLEU) of the last evaluation the training log prints."""
  losses = re.findall(r"eval at step \d+: loss ([0-9.]+)", log)
  bleus = re.findall(r"eval at step \d+: .*\| bleu ([0-9.]+)", log)
  return (losses[-1] if losses else "?"), (bleus[-1] if bleus else "?")


def pieces(model_dir: str):
  """Vocabulary sizes and mean pieces per validation sentence, source and target."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.inference import loading
  tokenizer = loading.load(model_dir).tokenizer
  out = []
  for side, lang in ((tokenizer.source, "en"), (tokenizer.target, "de")):
    with open(f"{FLAGS.data}/valid.{lang}", encoding="utf-8") as f:
      lines = [line.rstrip("\n") for line in f]
    ids = side.tokenize(lines)
    out += [side.vocab_size, f"{int(ids.row_lengths().numpy().sum()) / len(lines):.3f}"]
  return out


def main(argv):
  del argv
  work = FLAGS.work_dir
  os.makedirs(work, exist_ok=True)
  rows = []
  for name in FLAGS.configs:
    loss, bleu = last_eval(train(work, name))
    source_size, source_pieces, target_size, target_pieces = pieces(f"{work}/{name}")
    # Per target piece, a vocabulary of shorter pieces scores lower for the same model
    # quality; per sentence (pieces + EOS) the two compare.
    per_sentence = f"{float(loss) * (float(target_pieces) + 1):.2f}" if loss != "?" else "?"
    rows.append([name, source_size, target_size, source_pieces, target_pieces, loss,
                 per_sentence, bleu])
  print(machine())
  print(f"Multi30k EN-DE, flags/small_cpu.cfg, seed 1, {FLAGS.steps} steps each; "
        f"pieces per sentence over the validation set, BLEU on its first "
        f"{FLAGS.bleu_sentences} pairs")
  print_table(rows, ["vocabulary", "source V", "target V", "source pieces",
                     "target pieces", f"dev loss @ {FLAGS.steps}", "per sentence",
                     "dev BLEU"])


if __name__ == "__main__":
  app.run(main)
