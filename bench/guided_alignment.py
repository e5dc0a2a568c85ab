"""Alignment error rate with and without guided alignment, on held-out Multi30k pairs.

The references are eflomal's (Östling and Tiedemann 2016; `pip install eflomal`)
alignments of Multi30k train + test2016 together, run once in each direction on
lowercased whitespace-separated words and symmetrised with grow-diag-final-and. The
training pairs' alignments train the guided model (--train_alignments); the first
--held_out test2016 pairs, never trained on, are the test set. The same small model,
seed and steps are trained twice (flags/small_cpu.cfg without and with
--train_alignments); each model then aligns the held-out pairs' reference
translations as `decode --output_alignments` aligns its outputs (teacher-forced
attention, `scoring.align`; the guided model's guided head, the other's heads
averaged, and, for comparison, the unguided model's same layer and head as the
guided one; and the diagonal, no model at all). AER against the references:
1 - 2|A & S| / (|A| + |S|), all links sure.

    python bench/guided_alignment.py [--steps=600] [--held_out=500] \\
        [--data=../shared/data/multi30k] [--work_dir=/tmp/guided_alignment_bench]

Results: docs/benchmarks.md.
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bench.common import machine, print_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_integer("steps", 600, "Training steps of each model.")
flags.DEFINE_integer("held_out", 500, "test2016 pairs scored (the first N).")
flags.DEFINE_string("data", os.path.join(os.path.dirname(ROOT), "shared", "data",
                                         "multi30k"),
                    "Folder with Multi30k's train, valid and test2016 .en/.de files.")
flags.DEFINE_string("work_dir", "/tmp/guided_alignment_bench",
                    "References, vocabulary, caches and models.")
FLAGS = flags.FLAGS

NEIGHBOURS = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]


def grow_diag_final_and(forward, reverse):
  """Koehn et al.'s symmetrisation of two directional alignments (sets of (i, j))."""
  union, links = forward | reverse, forward & reverse
  sources, targets = {i for i, _ in links}, {j for _, j in links}
  grown = True
  while grown:
    grown = False
    for i, j in sorted(links):
      for di, dj in NEIGHBOURS:
        p = (i + di, j + dj)
        if p in union and p not in links and (p[0] not in sources or p[1] not in targets):
          links.add(p)
          sources.add(p[0])
          targets.add(p[1])
          grown = True
  for i, j in sorted(forward) + sorted(reverse):  # final-and
    if (i, j) not in links and i not in sources and j not in targets:
      links.add((i, j))
      sources.add(i)
      targets.add(j)
  return sorted(links)


def read_links(line):
  return {tuple(int(x) for x in token.split("-")) for token in line.split()}


def references(work: str):
  """eflomal over train + test2016, symmetrised: work/{train,test}.align."""
  train_out, test_out = f"{work}/train.align", f"{work}/test.align"
  if os.path.exists(test_out):
    return train_out, test_out
  sides = {}
  for lang in ("en", "de"):
    lines = []
    for split in ("train", "test2016"):
      with open(f"{FLAGS.data}/{split}.{lang}", encoding="utf-8") as f:
        lines += [line.rstrip("\n").lower() for line in f]
    sides[lang] = lines
    with open(f"{work}/all.{lang}", "w", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in lines)
  aligner = os.path.join(os.path.dirname(sys.executable), "eflomal-align")  # the venv's
  aligner = aligner if os.path.exists(aligner) else "eflomal-align"
  subprocess.run([aligner, "-s", f"{work}/all.en", "-t", f"{work}/all.de", "-f",
                  f"{work}/fwd", "-r", f"{work}/rev", "--overwrite"], check=True)
  with open(f"{work}/fwd") as f, open(f"{work}/rev") as r:
    merged = [grow_diag_final_and(read_links(a), read_links(b)) for a, b in zip(f, r)]
  with open(f"{FLAGS.data}/train.en", encoding="utf-8") as f:
    train = sum(1 for _ in f)
  for path, part in ((train_out, merged[:train]), (test_out, merged[train:])):
    with open(path, "w") as f:
      f.writelines(" ".join(f"{i}-{j}" for i, j in links) + "\n" for links in part)
  return train_out, test_out


def train(work: str, name: str, extra):
  model_dir = f"{work}/{name}"
  if os.path.exists(f"{model_dir}/checkpoint"):
    return model_dir
  command = [sys.executable, "-m", "t2t_keras.train", "--flagfile=flags/small_cpu.cfg",
             f"--model_dir={model_dir}", f"--data_dir={work}/data",
             f"--train_src={FLAGS.data}/train.en", f"--train_tgt={FLAGS.data}/train.de",
             f"--dev_src={FLAGS.data}/valid.en", f"--dev_tgt={FLAGS.data}/valid.de",
             f"--train_steps={FLAGS.steps}", "--train_minutes=0",
             f"--eval_every={FLAGS.steps}", "--eval_bleu_sentences=0", "--seed=1"] + extra
  with open(f"{work}/{name}.log", "w") as log:
    subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
  return model_dir


def aer(hypotheses, references_):
  hits = sum(len(set(h) & set(r)) for h, r in zip(hypotheses, references_))
  total = sum(len(h) + len(r) for h, r in zip(hypotheses, references_))
  return 1.0 - 2.0 * hits / max(total, 1)


def alignments_of(model_dir: str, sources, targets, heads):
  """{(layer, head): word alignments of each pair} as decode --output_alignments makes
  them (head -1: the heads averaged)."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.inference import loading, scoring
  loaded = loading.load(model_dir)
  tokenizer = loaded.tokenizer
  src = [scoring.with_eos(tokenizer.tokenize(s).numpy().tolist()) for s in sources]
  tgt = [scoring.with_eos(tokenizer.target.tokenize(t).numpy().tolist()) for t in targets]
  starts = scoring.word_starts(tokenizer)
  out = {}
  for layer, head in heads:
    forced = scoring.force(loaded.model, src, tgt, attention_layer=layer)
    out[(layer, head)] = [scoring.align(f.attention, s, t, starts, head)
                          for f, s, t in zip(forced, src, tgt)]
  return out


def main(argv):
  del argv
  work = FLAGS.work_dir
  os.makedirs(work, exist_ok=True)
  train_align, test_align = references(work)
  runs = {"unguided": train(work, "unguided", []),
          "guided": train(work, "guided", [f"--train_alignments={train_align}"])}
  texts = {}
  for lang in ("en", "de"):
    with open(f"{FLAGS.data}/test2016.{lang}", encoding="utf-8") as f:
      texts[lang] = [line.rstrip("\n") for _, line in zip(range(FLAGS.held_out), f)]
  with open(test_align) as f:
    gold = [sorted(read_links(line)) for _, line in zip(range(FLAGS.held_out), f)]
  # No model: target word j linked to source word round(j (n - 1) / (m - 1)).
  diagonal = [[(round(j * (len(s.split()) - 1) / max(len(t.split()) - 1, 1)), j)
               for j in range(len(t.split()))] for s, t in zip(texts["en"], texts["de"])]
  rows = [["none", "the diagonal", f"{aer(diagonal, gold):.3f}",
           f"{sum(map(len, diagonal)) / len(diagonal):.1f}"]]
  for name, heads in (("unguided", [(-1, -1), (-1, 0)]), ("guided", [(-1, 0), (-1, -1)])):
    found = alignments_of(runs[name], texts["en"], texts["de"], heads)
    for (layer, head), hyp in found.items():
      what = "heads averaged" if head < 0 else f"head {head}"
      rows.append([name, f"last layer, {what}", f"{aer(hyp, gold):.3f}",
                   f"{sum(map(len, hyp)) / len(hyp):.1f}"])
  print(machine())
  print(f"{FLAGS.held_out} test2016 pairs, {sum(map(len, gold)) / len(gold):.1f} "
        f"reference links a pair; {FLAGS.steps} steps each")
  print_table(rows, ["model", "attention read", "AER", "links a pair"])


if __name__ == "__main__":
  app.run(main)
