"""The scores a command prints (`metrics.format_report`'s lines) and the same scores
recomputed with sacreBLEU from the files, so a test checks the values and not only
that a score's name appears."""

import re

import sacrebleu

_LINE = re.compile(r"^(BLEU|BLEU uncased|chrF) (\d+\.\d\d) \(", re.MULTILINE)


def printed(text):
  """{"BLEU": 12.34, "BLEU uncased": ..., "chrF": ...} of the report lines in `text`
  (each score once: a second report would be ambiguous)."""
  found = _LINE.findall(text)
  scores = dict((name, float(value)) for name, value in found)
  assert len(scores) == len(found) and set(scores) == {"BLEU", "BLEU uncased", "chrF"}, text
  return scores


def recomputed(hypotheses, references):
  """The same three scores from sacreBLEU's defaults (cased and uncased BLEU, chrF)
  over line-aligned lists, rounded as printed (2 decimals)."""
  refs = [list(references)]
  hyps = list(hypotheses)
  assert len(hyps) == len(refs[0])
  scores = {"BLEU": sacrebleu.corpus_bleu(hyps, refs).score,
            "BLEU uncased": sacrebleu.corpus_bleu(hyps, refs, lowercase=True).score,
            "chrF": sacrebleu.corpus_chrf(hyps, refs).score}
  return {name: float(f"{value:.2f}") for name, value in scores.items()}
