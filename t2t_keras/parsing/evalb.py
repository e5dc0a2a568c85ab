"""Labeled bracketing precision, recall and F1 as EVALB computes them with COLLINS.prm.

EVALB (Sekine and Collins 1997) is the scorer of every published Penn Treebank
number, the paper's 91.3 F1 included. Its standard parameter file, COLLINS.prm, says:
  LABELED 1           a constituent must match in span AND label;
  DELETE_LABEL TOP    the root bracket TOP is not counted;
  DELETE_LABEL -NONE- empty elements are removed (and brackets over nothing else);
  DELETE_LABEL , : `` '' .
                      punctuation words are removed before spans are computed, so a
                      bracket that does or does not include a final "." is the same
                      bracket, and a bracket over punctuation only is not counted;
  DELETE_LABEL_FOR_LENGTH -NONE-
                      the sentence length (for the "<= 40 words" figures) counts
                      every word but empty elements;
  EQ_LABEL ADVP PRT   ADVP and PRT are the same label.
Function tags and indices are cut from labels (`NP-SBJ-1` -> `NP`), preterminals are
words, not constituents, and brackets are matched as multisets: a gold (NP (NP x))
holds two NP brackets over x, and a hypothesis with one of them matches one.
Recall = matched / gold brackets, precision = matched / hypothesis brackets, summed
over the corpus; F1 = 2PR / (P + R).

Why not a package: PYEVALB 0.1.3 (PyPI) matches brackets as a set (duplicates
collapse), removes no punctuation, has no ADVP/PRT equivalence and counts the root;
nltk reads trees but has no EVALB scorer. This module follows evalb.c, with one
deliberate difference: which words are punctuation is decided by the GOLD tags and
applied to both trees. evalb.c uses each tree's own tags, so a hypothesis that tags a
"." as NN has another number of words than the gold and the whole sentence is
skipped as an error. Here the hypothesis's tags come from the model and are never
scored for brackets (as the seq2seq parsing literature evaluates), so no sentence is
skipped and the words always align. Tagging accuracy is reported on the side (over
the gold's non-punctuation words, as EVALB).

Pure Python (no TensorFlow).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from t2t_keras import parsing
from t2t_keras.parsing import Tree

Bracket = Tuple[str, int, int]  # (label, start, end): words [start, end) after deletion


@dataclasses.dataclass(frozen=True)
class EvalbParams:
  """EVALB's parameter file; the defaults are COLLINS.prm."""

  delete_labels: FrozenSet[str] = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
  delete_labels_for_length: FrozenSet[str] = frozenset({"-NONE-"})
  equivalent_labels: Tuple[Tuple[str, str], ...] = (("ADVP", "PRT"),)
  cutoff_length: int = 40

  def canonical(self, label: str) -> str:
    """One representative per class of equivalent labels (PRT -> ADVP)."""
    for first, second in self.equivalent_labels:
      if label == second:
        return first
    return label


COLLINS = EvalbParams()


def evalb_label(label: str) -> str:
  """EVALB's modify_label: cut at the first '-' or '=' (NP-SBJ=2 -> NP)."""
  return re.split(r"[-=]", label, maxsplit=1)[0]


def brackets(tree: Tree, deleted: Sequence[bool],
             params: EvalbParams = COLLINS) -> "collections.Counter[Bracket]":
  """The multiset of scored brackets of a tree.

  Args:
    tree: a tree whose leaves align with `deleted`.
    deleted: per word, whether it is removed before spans are computed (punctuation
      and empty elements, by the gold tags).
    params: the parameter file.

  Returns:
    Counter of (canonical label, start, end) over the remaining words; brackets of
    deleted labels (TOP) and brackets over no remaining word are not included.
  """
  out: "collections.Counter[Bracket]" = collections.Counter()
  position = [0, 0]  # [words seen, words kept]

  def walk(node: Tree):
    if node.is_preterminal:
      if not deleted[position[0]]:
        position[1] += 1
      position[0] += 1
      return
    start = position[1]
    for child in node.children:
      walk(child)
    label = evalb_label(node.label)
    if position[1] > start and label not in params.delete_labels:
      out[(params.canonical(label), start, position[1])] += 1

  walk(tree)
  return out


@dataclasses.dataclass(frozen=True)
class SentenceScore:
  """One sentence's counts, as a line of EVALB's table.

  Attributes:
    length: words but empty elements (EVALB's "Len.", for the cut-off).
    gold / test / matched: scored brackets of the gold tree, of the hypothesis, and
      matched between them.
    words: words scored for tagging (not deleted).
    correct_tags: of those, words the hypothesis tags as the gold does.
  """

  length: int
  gold: int
  test: int
  matched: int
  words: int
  correct_tags: int

  @property
  def complete_match(self) -> bool:
    return self.gold == self.test == self.matched


def score_sentence(gold: Tree, test: Tree, params: EvalbParams = COLLINS) -> SentenceScore:
  """EVALB's counts for one hypothesis against its gold tree.

  Raises:
    ValueError: the trees do not have the same words (naming the first difference).
  """
  gold_words, test_words = gold.words(), test.words()
  if gold_words != test_words:
    if len(gold_words) != len(test_words):
      raise ValueError(f"the gold tree has {len(gold_words)} words but the hypothesis "
                       f"{len(test_words)}")
    i = next(i for i, (a, b) in enumerate(zip(gold_words, test_words)) if a != b)
    raise ValueError(f"word {i + 1} differs: gold {gold_words[i]!r}, hypothesis "
                     f"{test_words[i]!r}")
  gold_tags, test_tags = gold.tags(), test.tags()
  deleted = [tag in params.delete_labels for tag in gold_tags]
  gold_brackets = brackets(gold, deleted, params)
  test_brackets = brackets(test, deleted, params)
  matched = sum((gold_brackets & test_brackets).values())
  kept = [i for i, d in enumerate(deleted) if not d]
  return SentenceScore(
      length=sum(tag not in params.delete_labels_for_length for tag in gold_tags),
      gold=sum(gold_brackets.values()), test=sum(test_brackets.values()),
      matched=matched, words=len(kept),
      correct_tags=sum(params.canonical(gold_tags[i]) == params.canonical(test_tags[i])
                       for i in kept))


@dataclasses.dataclass(frozen=True)
class CorpusScore:
  """EVALB's summary of a set of sentences (percentages 0-100)."""

  sentences: int
  gold: int
  test: int
  matched: int
  complete: int
  words: int
  correct_tags: int

  @classmethod
  def of(cls, scores: Iterable[SentenceScore]) -> "CorpusScore":
    scores = list(scores)
    return cls(sentences=len(scores), gold=sum(s.gold for s in scores),
               test=sum(s.test for s in scores), matched=sum(s.matched for s in scores),
               complete=sum(s.complete_match for s in scores),
               words=sum(s.words for s in scores),
               correct_tags=sum(s.correct_tags for s in scores))

  @property
  def recall(self) -> float:
    return 100.0 * self.matched / self.gold if self.gold else 0.0

  @property
  def precision(self) -> float:
    return 100.0 * self.matched / self.test if self.test else 0.0

  @property
  def f1(self) -> float:
    p, r = self.precision, self.recall
    return 2 * p * r / (p + r) if p + r else 0.0

  @property
  def complete_match(self) -> float:
    return 100.0 * self.complete / self.sentences if self.sentences else 0.0

  @property
  def tagging_accuracy(self) -> float:
    return 100.0 * self.correct_tags / self.words if self.words else 0.0


@dataclasses.dataclass(frozen=True)
class ParsingReport:
  """Scores of linearized hypotheses against gold trees.

  Attributes:
    all: every sentence.
    short: sentences of at most params.cutoff_length words (EVALB's "len<=40").
    cutoff_length: that cut-off.
    repaired: how many hypotheses needed a repair to become a tree for their words.
    repaired_lines: their 1-based line numbers.
    problems: repair descriptions -> how many hypotheses needed each kind.
    trees: the rebuilt (and repaired) hypothesis trees, in order.
    linearization: how the hypotheses were read ("tags" or "words").
  """

  all: CorpusScore
  short: CorpusScore
  cutoff_length: int
  repaired: int
  repaired_lines: Tuple[int, ...]
  problems: Dict[str, int]
  trees: Tuple[Tree, ...] = ()
  linearization: str = "tags"


def _problem_kind(problem: str) -> str:
  return re.sub(r"\d+", "N", problem)


def score_linearized(hypotheses: Sequence[str], gold: Sequence[Tree],
                     words: Optional[Sequence[Sequence[str]]] = None,
                     params: EvalbParams = COLLINS,
                     linearization: str = "auto") -> ParsingReport:
  """Rebuilds (and repairs) each linearized hypothesis, then scores it like EVALB.

  Args:
    hypotheses: decoder outputs, one per gold tree (see parsing.linearize).
    gold: cleaned gold trees (parsing.clean).
    words: the input words of each sentence; default: the gold trees' words.
    params: EVALB parameters (COLLINS.prm).
    linearization: "tags", "words" or "auto" (`parsing.detect_linearization` of the
      hypotheses).

  Returns:
    A ParsingReport (its `linearization` says which was read).

  Raises:
    ValueError: counts differ, or a sentence's words differ from its gold tree's.
  """
  if len(hypotheses) != len(gold):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(gold)} gold trees")
  if words is not None and len(words) != len(gold):
    raise ValueError(f"{len(words)} source sentences for {len(gold)} gold trees")
  if linearization == "auto":
    linearization = parsing.detect_linearization(hypotheses)
  scores: List[SentenceScore] = []
  trees: List[Tree] = []
  repaired: List[int] = []
  problems: "collections.Counter[str]" = collections.Counter()
  for i, (hypothesis, tree) in enumerate(zip(hypotheses, gold)):
    sentence = list(words[i]) if words is not None else tree.words()
    rebuilt = parsing.rebuild(hypothesis, sentence, linearization)
    trees.append(rebuilt.tree)
    if rebuilt.repaired:
      repaired.append(i + 1)
      problems.update({_problem_kind(p) for p in rebuilt.problems})
    try:
      scores.append(score_sentence(tree, rebuilt.tree, params))
    except ValueError as error:
      raise ValueError(f"sentence {i + 1}: {error}") from None
  return ParsingReport(
      all=CorpusScore.of(scores),
      short=CorpusScore.of(s for s in scores if s.length <= params.cutoff_length),
      cutoff_length=params.cutoff_length, repaired=len(repaired),
      repaired_lines=tuple(repaired), problems=dict(problems), trees=tuple(trees),
      linearization=linearization)


def format_report(report: ParsingReport) -> str:
  """The report as EVALB-like lines; the first three are the headline numbers."""
  def block(score: CorpusScore) -> List[str]:
    return [f"  bracketing recall {score.recall:.2f}, precision {score.precision:.2f}, "
            f"F1 {score.f1:.2f} ({score.matched} matched of {score.gold} gold and "
            f"{score.test} hypothesis brackets)",
            f"  complete match {score.complete_match:.2f}%, tagging accuracy "
            f"{score.tagging_accuracy:.2f}% (not scored in F1)"]

  total = report.all.sentences
  lines = [f"F1 {report.all.f1:.2f} (labeled bracketing, EVALB COLLINS.prm: punctuation "
           "ignored, ADVP=PRT, TOP and preterminals not counted)",
           f"sentences: {total}, all scored",
           f"repaired: {report.repaired} of {total} hypotheses "
           f"({100.0 * report.repaired / max(total, 1):.1f}%) were not a valid tree for "
           "their words"]
  lines += [f"  {kind}: {count}" for kind, count in sorted(report.problems.items())]
  lines += [f"outputs read as the {report.linearization!r} linearization"]
  lines += ["all sentences:"] + block(report.all)
  lines += [f"sentences of <= {report.cutoff_length} words: {report.short.sentences}"]
  lines += block(report.short)
  return "\n".join(lines)
