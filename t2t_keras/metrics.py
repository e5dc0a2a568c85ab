"""Corpus BLEU and chrF with sacreBLEU, shared by evaluate, decode and training.

Scores are sacreBLEU's on detokenized text, so they compare with published numbers
only together with their signature (tokenizer, casing, smoothing, sacreBLEU version);
every score here carries its signature. The paper's tokenized BLEU (multi-bleu.perl on
its own tokenization) is a different number, typically higher.

Kept free of TensorFlow so `python -m t2t_keras.evaluate` starts in a second.
"""

from __future__ import annotations

from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF

REPORT_KEYS = ("bleu", "bleu_uncased", "chrf")


def bleu_report(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
                lowercase_chrf: bool = False) -> dict:
  """Corpus BLEU (cased and uncased) and chrF of line-aligned hypotheses.

  Args:
    hypotheses: one detokenized translation per segment.
    references: one or more reference streams, each line-aligned with `hypotheses`
      (`[refs]` for a single reference).
    lowercase_chrf: compute chrF case-insensitively too (BLEU always comes both ways).

  Returns:
    A dict with the scores `bleu`, `bleu_uncased`, `chrf` (floats, 0-100), their
    signatures `bleu_signature`, `bleu_uncased_signature`, `chrf_signature`,
    sacreBLEU's one-line summaries `bleu_details`, `bleu_uncased_details`,
    `chrf_details` (n-gram precisions, brevity penalty, lengths), and `length_ratio`,
    the hypotheses' length over the references' (BLEU's tokens).

  Raises:
    ValueError: no hypotheses or references, or a reference stream of another length.
  """
  hypotheses = list(hypotheses)
  references = [list(stream) for stream in references]
  if not hypotheses:
    raise ValueError("no hypotheses to score.")
  if not references:
    raise ValueError("no references to score against.")
  for i, stream in enumerate(references):
    if len(stream) != len(hypotheses):
      raise ValueError(f"reference stream {i} has {len(stream)} segments but there are "
                       f"{len(hypotheses)} hypotheses: they must be line-aligned.")
  report = {}
  for key, metric in (("bleu", BLEU()), ("bleu_uncased", BLEU(lowercase=True)),
                      ("chrf", CHRF(lowercase=lowercase_chrf))):
    score = metric.corpus_score(hypotheses, references)
    report[key] = float(score.score)
    report[f"{key}_signature"] = str(metric.get_signature())
    report[f"{key}_details"] = score.format(width=2)
    if key == "bleu":  # hypothesis / reference length (sacreBLEU's tokens)
      report["length_ratio"] = float(score.sys_len / max(score.ref_len, 1))
  return report


def format_report(report: dict, details: bool = False) -> str:
  """The report of `bleu_report` as one line per score, each with its signature.

  Args:
    report: from `bleu_report`.
    details: also print sacreBLEU's summaries (n-gram precisions, brevity penalty).
  """
  lines = [f"BLEU {report['bleu']:.2f} ({report['bleu_signature']})",
           f"BLEU uncased {report['bleu_uncased']:.2f} ({report['bleu_uncased_signature']})",
           f"chrF {report['chrf']:.2f} ({report['chrf_signature']})"]
  if details:
    labels = {"bleu": "cased", "bleu_uncased": "uncased", "chrf": "chrF"}
    lines += [f"  {labels[key]}: {report[f'{key}_details']}" for key in REPORT_KEYS]
  return "\n".join(lines)
