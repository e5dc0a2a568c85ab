"""Translation metrics with sacreBLEU: BLEU (cased and uncased) and chrF, with the
signatures that make the numbers comparable across papers."""

from __future__ import annotations

from typing import Dict, List, Sequence

import sacrebleu


def bleu_report(hypotheses: Sequence[str], references: List[Sequence[str]]) -> Dict:
  """Corpus BLEU (cased, uncased) and chrF of hypotheses against reference sets.

  Args:
    hypotheses: one string per segment.
    references: one or more reference sets, each with one string per segment.

  Returns:
    {"bleu", "bleu_uncased", "chrf"} scores and their "*_signature" strings.
  """
  hypotheses = list(hypotheses)
  references = [list(r) for r in references]
  for refs in references:
    if len(refs) != len(hypotheses):
      raise ValueError(f"{len(hypotheses)} hypotheses but a reference set of {len(refs)}")
  cased = sacrebleu.metrics.BLEU()
  uncased = sacrebleu.metrics.BLEU(lowercase=True)
  chrf = sacrebleu.metrics.CHRF()
  return {
      "bleu": cased.corpus_score(hypotheses, references).score,
      "bleu_signature": str(cased.get_signature()),
      "bleu_uncased": uncased.corpus_score(hypotheses, references).score,
      "bleu_uncased_signature": str(uncased.get_signature()),
      "chrf": chrf.corpus_score(hypotheses, references).score,
      "chrf_signature": str(chrf.get_signature()),
  }


def format_report(report: Dict) -> str:
  return (f"BLEU {report['bleu']:.2f} ({report['bleu_signature']})\n"
          f"BLEU uncased {report['bleu_uncased']:.2f} ({report['bleu_uncased_signature']})\n"
          f"chrF {report['chrf']:.2f} ({report['chrf_signature']})")
