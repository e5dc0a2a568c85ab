"""The anchor for the parsing task: a treebank PCFG read off the same training trees.

  python bench/parsing_pcfg.py --split=test [--markov_horizontal=2 --parent_annotation]

Reads ../shared/data/ptb_wsj_sample/train.mrg, cleans the trees as the Transformer's
training does (t2t_keras.parsing.clean), and estimates by relative frequency:
  * a grammar of every phrase rule in the trees, binarized to the right
    (`NP -> DT JJ NN` becomes `NP -> DT NP|<JJ NN>`, `NP|<JJ NN> -> JJ NN`): with
    --markov_horizontal=0 (the default) the intermediate symbols keep every remaining
    child, so the grammar is exactly the treebank's n-ary grammar ("vanilla treebank
    PCFG", Charniak 1996; Klein & Manning 2003 report 72.6 F1 for it on the full WSJ);
    with h > 0 only the next h children (horizontal Markovization);
  * --parent_annotation: each phrase label also carries its parent's (`NP^S`), the
    vertical Markovization of order 2 (Johnson 1998);
  * unary rules (`S -> VP`, `NP -> NNP`) and their chains, closed once per cell;
  * a lexicon P(word | tag) from the counts; words seen fewer than twice also use the
    tag distribution of rare training words of the same shape (capitalization, digits,
    hyphen, suffix), and unknown words use it alone.
Then every sentence of the split is parsed by Viterbi CKY (numpy, log space, all
spans of one length at once), and scored with the project's EVALB
(t2t_keras.parsing.evalb, COLLINS.prm), exactly as `python -m t2t_keras.evaluate
--task=parsing` scores the Transformer: F1, recall, precision, tagging accuracy.
Pure Python and numpy: no TensorFlow.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import sys
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.common import cpu_model  # noqa: E402  (no TensorFlow)
from t2t_keras import parsing  # noqa: E402
from t2t_keras.parsing import Tree, evalb  # noqa: E402

NEG = -1e30
_SUFFIXES = ("ing", "ed", "es", "s", "ly", "ion", "er", "est", "al", "ity", "y", "ic",
             "ous", "ive", "ble", "ent", "ant", "ist", "ism", "en", "ize", "ful", "less")


def signature(word: str, first: bool) -> str:
  """A word's shape, for words too rare to have counts of their own."""
  parts = []
  if any(c.isdigit() for c in word):
    parts.append("num")
  if word[:1].isupper():
    parts.append("Cap" if not word.isupper() or len(word) == 1 else "CAPS")
    if first:
      parts.append("first")
  elif word.islower():
    parts.append("low")
  if "-" in word:
    parts.append("hyph")
  lower = word.lower()
  parts.append(next((s for s in _SUFFIXES if lower.endswith(s) and len(lower) > len(s) + 2),
                    ""))
  return "UNK-" + "-".join(parts)


# --------------------------------------------------------------------------- grammar


def _label(node: Tree, parent: str, parent_annotation: bool) -> str:
  if node.is_preterminal or not parent_annotation:
    return node.label
  return f"{node.label}^{parent}"


def rules_of(tree: Tree, h: int, parent_annotation: bool, root: str = "ROOT"):
  """(lhs, rhs tuple) of every rule of the binarized tree, and its (tag, word, first)."""
  rules, lexical = [], []

  def walk(node: Tree, parent: str) -> str:
    label = _label(node, parent, parent_annotation)
    if node.is_preterminal:
      lexical.append((node.label, node.children[0], not lexical))
      return label
    children = [walk(child, node.label) for child in node.children]
    binarize(label, children)
    return label

  def binarize(label: str, children: List[str]):
    if len(children) <= 2:
      rules.append((label, tuple(children)))
      return
    base = label
    current = label
    for i in range(len(children) - 2):
      rest = children[i + 1:]
      kept = rest if h <= 0 else rest[:h]
      intermediate = f"{base.split('^')[0]}|<{' '.join(kept)}>"
      if parent_annotation and "^" in base:
        intermediate += "^" + base.split("^", 1)[1]
      rules.append((current, (children[i], intermediate)))
      current = intermediate
    rules.append((current, tuple(children[-2:])))

  top = walk(tree, root)
  rules.append((root, (top,)))
  return rules, lexical


class Grammar:
  """Relative-frequency PCFG over integer symbols, ready for CKY."""

  def __init__(self, trees: Sequence[Tree], h: int, parent_annotation: bool):
    rule_counts: "collections.Counter" = collections.Counter()
    tag_word: "collections.Counter" = collections.Counter()
    word_counts: "collections.Counter" = collections.Counter()
    for tree in trees:
      rules, lexical = rules_of(tree, h, parent_annotation)
      rule_counts.update(rules)
      for tag, word, first in lexical:
        tag_word[(tag, word, first)] += 1
        word_counts[word] += 1
    self.h, self.parent_annotation = h, parent_annotation
    symbols = sorted({lhs for lhs, _ in rule_counts}
                     | {s for _, rhs in rule_counts for s in rhs}
                     | {tag for tag, _, _ in tag_word})
    self.symbols = symbols
    self.index = {s: i for i, s in enumerate(symbols)}
    n = len(symbols)
    lhs_counts = collections.Counter()
    for (lhs, _), c in rule_counts.items():
      lhs_counts[lhs] += c
    self.rule_log_prob = {rule: math.log(c / lhs_counts[rule[0]])
                          for rule, c in rule_counts.items()}
    binary = [(self.index[l], self.index[r[0]], self.index[r[1]],
               math.log(c / lhs_counts[l])) for (l, r), c in rule_counts.items() if len(r) == 2]
    self.bin_parent = np.array([b[0] for b in binary], np.int32)
    self.bin_left = np.array([b[1] for b in binary], np.int32)
    self.bin_right = np.array([b[2] for b in binary], np.int32)
    self.bin_score = np.array([b[3] for b in binary], np.float64)
    order = np.argsort(self.bin_parent, kind="stable")
    for name in ("bin_parent", "bin_left", "bin_right", "bin_score"):
      setattr(self, name, getattr(self, name)[order])
    self.bin_starts = np.searchsorted(self.bin_parent, np.arange(n))
    self.bin_has = np.zeros(n, bool)
    self.bin_has[self.bin_parent] = True
    # Unary rules and their closure over the symbols that take part in them:
    # closure[a, b] = the best chain A =>+ B (or 0 for A = B), via[a, b] its first step.
    unary_rules = [(self.index[l], self.index[r[0]], math.log(c / lhs_counts[l]))
                   for (l, r), c in rule_counts.items() if len(r) == 1 and l != "ROOT"]
    self.unary_count = len(unary_rules)
    us = sorted({a for a, _, _ in unary_rules} | {b for _, b, _ in unary_rules})
    self.unary_symbols = np.array(us, np.int32)
    local = {s: i for i, s in enumerate(us)}
    u = len(us)
    unary = np.full((u, u), NEG)
    for a, b, score in unary_rules:
      unary[local[a], local[b]] = score
    closure = np.full((u, u), NEG)
    np.fill_diagonal(closure, 0.0)
    via = np.tile(np.arange(u), (u, 1))
    for _ in range(4 if u else 0):  # chains of up to 4 unaries (the treebank's: fewer)
      step = unary[:, :, None] + closure[None, :, :]  # A -> C, C =>* B
      best_c = step.argmax(axis=1)
      best = step.max(axis=1)
      better = best > closure + 1e-12
      closure = np.where(better, best, closure)
      via = np.where(better, best_c, via)
    self.closure, self.via_local = closure, via
    self.local = local
    roots = {self.index[r[0]]: math.log(c / lhs_counts["ROOT"])
             for (l, r), c in rule_counts.items() if l == "ROOT"}
    self.root_score = np.full(n, NEG)
    for i, s in roots.items():
      self.root_score[i] = s
    # Lexicon.
    self.tags = sorted({tag for tag, _, _ in tag_word})
    tag_counts = collections.Counter()
    word_tag = collections.defaultdict(collections.Counter)
    rare_sig = collections.defaultdict(collections.Counter)
    for (tag, word, first), c in tag_word.items():
      tag_counts[tag] += c
      word_tag[word][tag] += c
      if word_counts[word] == 1:
        rare_sig[signature(word, first)][tag] += c
    self.tag_counts, self.word_tag, self.word_counts = tag_counts, word_tag, word_counts
    self.rare_sig = rare_sig
    self.rare_total = sum(sum(c.values()) for c in rare_sig.values())

  def lexical_scores(self, word: str, first: bool) -> np.ndarray:
    """log P(word | tag) for every symbol (NEG for non-tags)."""
    scores = np.full(len(self.symbols), NEG)
    sig = self.rare_sig.get(signature(word, first))
    if sig is None:  # an unseen shape: all rare words
      sig = collections.Counter()
      for counter in self.rare_sig.values():
        sig.update(counter)
    seen = self.word_tag.get(word, {})
    count = self.word_counts.get(word, 0)
    for tag in self.tags:
      # P(shape-class word | tag) from the tag's rare words (add-0.5 smoothing).
      p_unk = (sig.get(tag, 0) + 0.5 * self.tag_counts[tag] / sum(self.tag_counts.values())
               ) / self.tag_counts[tag]
      if count >= 2:
        p = seen.get(tag, 0) / self.tag_counts[tag]
      elif count == 1:
        p = 0.5 * seen.get(tag, 0) / self.tag_counts[tag] + 0.5 * p_unk * 0.1
      else:
        p = p_unk * 0.1
      if p > 0:
        scores[self.index[tag]] = math.log(p)
    return scores


# ------------------------------------------------------------------------------ CKY


def tree_log_prob(grammar: Grammar, tree: Tree) -> float:
  """log P(tree) under the grammar, rule by rule (NEG-ish if a rule is unknown)."""
  g = grammar
  rules, lexical = rules_of(tree, g.h, g.parent_annotation)
  total = 0.0
  for lhs, rhs in rules:
    total += g.rule_log_prob.get((lhs, rhs), NEG)
  for tag, word, first in lexical:
    total += g.lexical_scores(word, first)[g.index[tag]] if tag in g.index else NEG
  return total


def parse(grammar: Grammar, words: Sequence[str]) -> Tree:
  """The Viterbi tree of the sentence (debinarized, labels without annotations)."""
  return parse_with_score(grammar, words)[0]


def parse_with_score(grammar: Grammar, words: Sequence[str]) -> Tuple[Tree, float]:
  """The Viterbi tree and its log probability (the chart's best root score)."""
  n, g = len(words), grammar
  size = len(g.symbols)
  # chart[i, j]: best score of each symbol over words i..j-1, after unary closure.
  chart = np.full((n + 1, n + 1, size), NEG)
  binary = np.full((n + 1, n + 1, size), NEG)  # before the unary closure
  back_split = np.zeros((n + 1, n + 1, size), np.int32)
  back_rule = np.zeros((n + 1, n + 1, size), np.int32)
  back_unary = np.zeros((n + 1, n + 1, size), np.int32)

  us = g.unary_symbols
  identity = np.arange(size, dtype=np.int32)

  def close(i, j, scores):
    chart[i, j] = scores
    back_unary[i, j] = identity
    if len(us):
      total = g.closure + scores[us][None, :]  # A =>* B, B's score
      best_b = total.argmax(axis=1)
      chart[i, j, us] = total[np.arange(len(us)), best_b]
      back_unary[i, j, us] = us[best_b]

  for i, word in enumerate(words):
    binary[i, i + 1] = g.lexical_scores(word, i == 0)
    close(i, i + 1, binary[i, i + 1])
  rule_ids = np.arange(len(g.bin_parent))
  for length in range(2, n + 1):
    starts = np.arange(n - length + 1)
    splits = np.arange(1, length)
    left = chart[starts[:, None], starts[:, None] + splits[None, :]]  # (S, K, N)
    right = chart[starts[:, None] + splits[None, :], starts[:, None] + length]
    cand = (left[:, :, g.bin_left] + right[:, :, g.bin_right]
            + g.bin_score[None, None, :])  # (S, K, R)
    best_split = cand.argmax(axis=1)  # (S, R)
    best = np.take_along_axis(cand, best_split[:, None, :], axis=1)[:, 0, :]  # (S, R)
    # Per parent: the best rule (rules are sorted by parent).
    for s, start in enumerate(starts):
      scores = np.full(size, NEG)
      row = best[s]
      maxima = np.maximum.reduceat(row, g.bin_starts[g.bin_has])
      parents = np.nonzero(g.bin_has)[0]
      scores[parents] = maxima
      # argmax rule per parent
      is_max = row >= np.repeat(maxima, np.diff(np.append(g.bin_starts[g.bin_has],
                                                          len(row))))
      first = np.full(size, -1)
      hits = rule_ids[is_max]
      first[g.bin_parent[hits][::-1]] = hits[::-1]
      j = start + length
      binary[start, j] = scores
      back_rule[start, j] = np.maximum(first, 0)
      back_split[start, j] = start + 1 + best_split[s][np.maximum(first, 0)]
      close(start, j, scores)
  root_scores = chart[0, n] + g.root_score
  top = int(root_scores.argmax())

  def build(i, j, symbol, after_unary=True) -> List[Tree]:
    if after_unary:
      below = int(back_unary[i, j, symbol])
      if below != symbol:
        chain = [symbol]
        while chain[-1] != below:
          step = g.via_local[g.local[chain[-1]], g.local[below]]
          chain.append(int(us[step]))
        nodes = build(i, j, below, after_unary=False)
        for label in reversed(chain[:-1]):
          nodes = [Tree(g.symbols[label], nodes)]
        return nodes
    label = g.symbols[symbol]
    if j == i + 1:
      return [Tree(label, [words[i]])]
    rule = int(back_rule[i, j, symbol])
    k = int(back_split[i, j, symbol])
    children = (build(i, k, int(g.bin_left[rule])) + build(k, j, int(g.bin_right[rule])))
    return [Tree(label, children)]

  nodes = build(0, n, top)
  return debinarize(nodes[0]), float(root_scores[top])


def debinarize(node: Tree) -> Tree:
  """Splice intermediate `X|<...>` nodes into their parents; drop `^parent` marks."""
  if node.is_preterminal:
    return node
  children: List[Tree] = []
  for child in node.children:
    child = debinarize(child)
    if "|<" in child.label:
      children.extend(child.children)
    else:
      children.append(child)
  return Tree(node.label.split("^")[0], children)


# ------------------------------------------------------------------------------ main


def read(path: str) -> List[Tree]:
  with open(path, "rb") as f:
    text = parsing.decode_utf8(f.read(), path)
  return [parsing.clean(tree, f"{path}:{line}") for line, tree in parsing.parse_trees(text, path)]


def main(argv: Optional[Sequence[str]] = None) -> int:
  here = os.path.dirname(os.path.abspath(__file__))
  default = os.path.normpath(os.path.join(here, "..", "..", "shared", "data", "ptb_wsj_sample"))
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--data_dir", default=default, help="Folder of train/dev/test.mrg.")
  ap.add_argument("--split", default="test", choices=("dev", "test"))
  ap.add_argument("--markov_horizontal", type=int, default=0,
                  help="Children kept in intermediate symbols; 0 = all (vanilla).")
  ap.add_argument("--parent_annotation", action="store_true",
                  help="Phrase labels carry their parent's label (NP^S).")
  ap.add_argument("--limit", type=int, default=0, help="Parse only the first N sentences.")
  ap.add_argument("--output_trees", help="Write the parsed trees here (PTB brackets).")
  args = ap.parse_args(argv)

  start = time.time()
  train = read(os.path.join(args.data_dir, "train.mrg"))
  gold = read(os.path.join(args.data_dir, f"{args.split}.mrg"))
  if args.limit:
    gold = gold[:args.limit]
  grammar = Grammar(train, args.markov_horizontal, args.parent_annotation)
  print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); numpy {np.__version__}")
  print(f"grammar from {len(train)} training trees: {len(grammar.symbols)} symbols, "
        f"{len(grammar.bin_parent)} binary rules, "
        f"{grammar.unary_count} unary rules, {len(grammar.word_tag)} "
        f"words ({time.time() - start:.1f} s); horizontal Markov "
        f"{args.markov_horizontal or 'none (vanilla)'}, parent annotation "
        f"{'on' if args.parent_annotation else 'off'}", flush=True)
  trees, start = [], time.time()
  for n, tree in enumerate(gold, 1):
    trees.append(parse(grammar, tree.words()))
    if n % 25 == 0 or n == len(gold):
      rate = n / (time.time() - start)
      print(f"parsed {n}/{len(gold)} sentences | {rate:.2f} sentences/s | eta "
            f"{(len(gold) - n) / rate:.0f} s", file=sys.stderr, flush=True)
  seconds = time.time() - start
  hypotheses = [parsing.linearize(tree) for tree in trees]
  report = evalb.score_linearized(hypotheses, gold, linearization="tags")
  print(evalb.format_report(report))
  print(f"parsing time: {seconds:.1f} s for {len(gold)} sentences "
        f"({len(gold) / seconds:.2f} sentences/s, one core, numpy)")
  if args.output_trees:
    with open(args.output_trees, "w", encoding="utf-8") as f:
      f.writelines(f"{tree}\n" for tree in trees)
  return 0


if __name__ == "__main__":
  sys.exit(main())
