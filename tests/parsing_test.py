"""Constituency parsing (paper section 6.3): trees, linearization, repair, EVALB scoring,
the parsing data source and a few training steps of the sample recipe."""

import os
import random
import re
import subprocess
import sys

import pytest

from t2t_keras import parsing
from t2t_keras.parsing import evalb
from t2t_keras.configs import DataConfig
from t2t_keras.data import DataError, make_datasets
from t2t_keras.parsing import Tree, TreeError
from tests import inprocess
from tests.conftest import REPO_ROOT, SessionModel

SPLITS = ("train", "dev", "test")
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture
def ptb(shared_data):
  """{split: (path, raw text)} of ../shared/data/ptb_wsj_sample, or skip."""
  directory = os.path.join(shared_data, "ptb_wsj_sample")
  if not os.path.isdir(directory):
    pytest.skip(f"Penn Treebank sample not found at {directory}")
  out = {}
  for split in SPLITS:
    path = os.path.join(directory, f"{split}.mrg")
    with open(path, encoding="utf-8") as f:
      out[split] = (path, f.read())
  return out


def tree(text):
  """The one tree of a string."""
  (_, only), = parsing.parse_trees(text)
  return only


# ---------------------------------------------------------------- reading, cleaning


@pytest.mark.slow
def test_round_trip_on_every_sample_tree(ptb):
  counts = {"train": 3177, "dev": 392, "test": 345}
  for split, (path, text) in ptb.items():
    trees = parsing.parse_trees(text, path)
    assert len(trees) == counts[split]
    for line, raw in trees:
      cleaned = parsing.clean(raw, f"{path}:{line}")
      source, target = parsing.example(cleaned)
      words = source.split()
      rebuilt = parsing.rebuild(target, words)
      assert rebuilt.tree == cleaned, f"{path}:{line}"
      assert not rebuilt.repaired, (f"{path}:{line}", rebuilt.problems)
      # The "words" linearization round-trips too (words such as "." or "$" that
      # spell a tag are read as the word of the tag before them).
      source_w, target_w = parsing.example(cleaned, "words")
      assert source_w == source
      copied = parsing.rebuild(target_w, words, "words")
      assert copied.tree == cleaned and not copied.repaired, f"{path}:{line}"
      # Cleaning kept every real word, in order, and left no empty element or tag.
      assert words == [w for w, t in zip(raw.words(), raw.tags()) if t != "-NONE-"]
      assert len(target.split()) == len(words) + 2 * (len(re.findall(r"\(", target)))
      labels = re.findall(r"\((\S+)", target)
      assert not [label for label in labels if re.search(r"[-=]", label)], labels
      assert "-NONE-" not in target.split()


def test_parse_reads_one_or_many_lines_and_names_lines():
  text = "( (S (NP (NN a))\n  (VP (VBZ b))) )\n\n( (NP (NN c)) )\n"
  trees = parsing.parse_trees(text, "x.mrg")
  assert [line for line, _ in trees] == [1, 4]
  assert str(trees[0][1]) == "( (S (NP (NN a)) (VP (VBZ b))))"
  assert str(trees[1][1]) == "( (NP (NN c)))"


@pytest.mark.parametrize("text,message", [
    ("( (S (NP (NN a)) )\n(S (NN b)))) ", r"x\.mrg:2: '\)' closes no bracket"),
    ("(S (NN a))\n( (S (NP (NN b))\n", r"x\.mrg:2: the tree starting here is not closed"),
    ("(S (NN a))\nhello (S (NN b))", r"x\.mrg:2: 'hello' is outside any bracket"),
    ("(S (NN a))\n\n(S (NN a b))", r"x\.mrg:3: \(NN \.\.\.\) mixes words"),
    ("(S (NN a) (NP))", r"x\.mrg:1: empty bracket \(NP\)"),
    ("(S (NN a) ((NN b)))", r"x\.mrg:1: a bracket without a label"),
])
def test_malformed_trees_name_file_and_line(text, message):
  with pytest.raises(TreeError, match=message):
    parsing.parse_trees(text, "x.mrg")


def test_clean_strips_empty_elements_function_tags_indices_and_root():
  raw = tree("( (S (NP-SBJ-1 (-NONE- *)) (VP (VBD said) (SBAR (-NONE- 0) (S-TPC=2 "
             "(NP-SBJ (PRP it)) (VP (VBZ is) (ADJP-PRD (JJ good)))))) (. .)) )")
  assert str(parsing.clean(raw)) == (
      "(S (VP (VBD said) (SBAR (S (NP (PRP it)) (VP (VBZ is) (ADJP (JJ good)))))) (. .))")
  # POS tags starting with "-" stay whole; words are untouched.
  brackets = parsing.clean(tree("( (NP (-LRB- -LRB-) (NN x-ray) (-RRB- -RRB-)) )"))
  assert str(brackets) == "(NP (-LRB- -LRB-) (NN x-ray) (-RRB- -RRB-))"
  assert parsing.linearize(brackets) == "(NP -LRB- NN -RRB- )"
  # A root over several children, or over a lone word, stays, labeled TOP.
  assert str(parsing.clean(tree("( (NP (NN a)) (. .) )"))) == "(TOP (NP (NN a)) (. .))"
  assert str(parsing.clean(tree("( (UH hello) )"))) == "(TOP (UH hello))"
  assert str(parsing.clean(tree("(TOP (S (NN a)))"))) == "(S (NN a))"
  # Unary chains are kept (EVALB scores both brackets).
  assert str(parsing.clean(tree("( (NP (NP-SBJ (NN a))) )"))) == "(NP (NP (NN a)))"
  with pytest.raises(TreeError, match="x:3: the tree has no words besides empty"):
    parsing.clean(tree("( (S (NP (-NONE- *))) )"), "x:3")


def test_linearize_example():
  cleaned = parsing.clean(tree("( (S (NP-SBJ (NNP Ms.) (NNP Haag)) (VP (VBZ plays) "
                               "(NP (NNP Elianti))) (. .)) )"))
  assert parsing.example(cleaned) == (
      "Ms. Haag plays Elianti .", "(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )")


def test_words_linearization_writes_each_word_after_its_tag():
  cleaned = parsing.clean(tree("( (S (NP-SBJ (NNP Ms.) (NNP Haag)) (VP (VBZ plays) "
                               "(NP (NNP Elianti))) (. .)) )"))
  target = "(S (NP Ms. NNP Haag NNP ) (VP plays VBZ (NP Elianti NNP ) ) . . )"
  assert parsing.example(cleaned, "words") == ("Ms. Haag plays Elianti .", target)
  assert parsing.detect_linearization([target]) == "words"
  assert parsing.detect_linearization([GOLD]) == "tags"
  # A word written wrong does not matter (the input's words are attached); a leaf
  # left out is repaired as in "tags" (the missing word appended to the root); a
  # word without its tag gets the placeholder tag.
  assert not parsing.rebuild(target.replace("plays", "PLAYS"), WORDS, "words").repaired
  short = parsing.rebuild(target.replace(" Haag NNP", ""), WORDS, "words")
  assert short.tree.words() == WORDS and short.problems == (
      "appended 1 missing word(s) to the root",)
  untagged = parsing.rebuild(target.replace(" VBZ", ""), WORDS, "words")
  assert untagged.tree.tags() == ["NNP", "NNP", "XX", "NNP", "."]
  assert untagged.problems == ("tagged 1 word(s) without a tag XX",)
  with pytest.raises(ValueError, match="linearization 'xml'"):
    parsing.linearize(cleaned, "xml")


# -------------------------------------------------------------------------- repair

WORDS = "Ms. Haag plays Elianti .".split()
GOLD = "(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )"


def test_every_truncation_is_repaired_into_a_tree_of_the_words():
  tokens = GOLD.split()
  for cut in range(len(tokens)):
    rebuilt = parsing.rebuild(" ".join(tokens[:cut]), WORDS)
    assert rebuilt.repaired, cut
    assert rebuilt.tree.words() == WORDS, cut
    assert parsing.rebuild(parsing.linearize(rebuilt.tree), WORDS).problems == ()
  assert not parsing.rebuild(GOLD, WORDS).repaired


def test_truncated_output_closes_brackets_and_appends_missing_words():
  rebuilt = parsing.rebuild("(S (NP NNP NNP ) (VP VBZ", WORDS)
  assert str(rebuilt.tree) == ("(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays)) "
                               "(XX Elianti) (XX .))")
  assert rebuilt.problems == ("closed 2 open bracket(s)",
                              "appended 2 missing word(s) to the root")


def test_unbalanced_and_overlong_outputs_are_repaired_deterministically():
  # A ')' closing nothing is dropped; words after the root closed are wrapped in TOP.
  rebuilt = parsing.rebuild("(S (NP NNP NNP ) ) ) (VP VBZ NNP ) .", WORDS)
  assert str(rebuilt.tree) == ("(TOP (S (NP (NNP Ms.) (NNP Haag))) (VP (VBZ plays) "
                               "(NNP Elianti)) (. .))")
  assert rebuilt.problems == ("dropped 1 ')' closing nothing",
                              "wrapped 3 top-level items in TOP")
  # Too many leaves: the extra ones are dropped, with constituents left empty.
  rebuilt = parsing.rebuild("(S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . (NP DT NN ) )", WORDS)
  assert str(rebuilt.tree) == ("(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP "
                               "(NNP Elianti))) (. .))")
  assert rebuilt.problems == ("dropped 2 leaves beyond the 5 words",)
  # Empty constituents and a bare "(" are dropped; a labeled ")NP" closes too, and a
  # bracket glued to a tag ("NNP)") is a bracket.
  rebuilt = parsing.rebuild("(S ( (NP NNP NNP )NP (ADJP ) (VP VBZ (NP NNP) ) . )", WORDS)
  assert str(rebuilt.tree) == str(parsing.rebuild(GOLD, WORDS).tree)
  assert rebuilt.problems == ("dropped 1 '(' without a label",
                              "dropped 1 constituent(s) without leaves")
  # Nothing usable: every word under TOP with the placeholder tag.
  rebuilt = parsing.rebuild("", ["a", "b"])
  assert str(rebuilt.tree) == "(TOP (XX a) (XX b))"
  assert rebuilt.repaired
  rebuilt = parsing.rebuild("NN", ["a"])
  assert str(rebuilt.tree) == "(TOP (NN a))" and rebuilt.problems == (
      "wrapped a bare leaf in TOP",)


def test_random_outputs_always_become_valid_trees_of_the_words():
  rng = random.Random(0)
  pieces = ["(S", "(NP", "(VP", ")", ")", ")", "NN", "DT", ".", "(", "()", "NN)", ")VP",
            "(NP(VP", "-LRB-"]
  for _ in range(500):
    words = [f"w{i}" for i in range(rng.randint(1, 8))]
    output = rng.choice(["", " "]).join(rng.choice(pieces)
                                        for _ in range(rng.randint(0, 25)))
    for linearization in parsing.LINEARIZATIONS:
      rebuilt = parsing.rebuild(output, words, linearization)
      assert rebuilt.tree.words() == words, output
      assert tree(str(rebuilt.tree)) == rebuilt.tree, output
      again = parsing.rebuild(parsing.linearize(rebuilt.tree, linearization), words,
                              linearization)
      assert again.tree == rebuilt.tree and not again.repaired, output


# ---------------------------------------------------------------------------- EVALB

# The dog saw a cat with a telescope . : 8 words, 9 with the "." (deleted).
GOLD_TREE = ("(S (NP (DT The) (NN dog)) (VP (VBD saw) (NP (DT a) (NN cat)) (PP (IN with) "
             "(NP (DT a) (NN telescope)))) (. .))")


def score(gold, test):
  return evalb.score_sentence(tree(gold), tree(test))


def test_evalb_two_bracket_difference_by_hand():
  # Gold brackets: S(0,8) NP(0,2) VP(2,8) NP(3,5) PP(5,8) NP(6,8) = 6. The hypothesis
  # drops the subject NP and labels the PP as ADVP: S VP NP(3,5) ADVP(5,8) NP(6,8) = 5,
  # of which 4 match.
  test = ("(S (DT The) (NN dog) (VP (VBD saw) (NP (DT a) (NN cat)) (ADVP (IN with) "
          "(NP (DT a) (NN telescope)))) (. .))")
  s = score(GOLD_TREE, test)
  assert (s.gold, s.test, s.matched, s.length, s.words) == (6, 5, 4, 9, 8)
  corpus = evalb.CorpusScore.of([s])
  assert corpus.recall == pytest.approx(100 * 4 / 6)
  assert corpus.precision == pytest.approx(80.0)
  assert corpus.f1 == pytest.approx(2 * 80.0 * (400 / 6) / (80.0 + 400 / 6))
  assert round(corpus.f1, 2) == 72.73 and not s.complete_match
  # PP attachment to the object NP: one extra bracket NP(3,8), nothing missing.
  attached = ("(S (NP (DT The) (NN dog)) (VP (VBD saw) (NP (NP (DT a) (NN cat)) (PP "
              "(IN with) (NP (DT a) (NN telescope))))) (. .))")
  s = score(GOLD_TREE, attached)
  assert (s.gold, s.test, s.matched) == (6, 7, 6)


def test_evalb_ignores_punctuation_top_function_tags_and_tags():
  perfect = score(GOLD_TREE, GOLD_TREE)
  assert (perfect.gold, perfect.test, perfect.matched) == (6, 6, 6)
  assert perfect.complete_match and perfect.correct_tags == 8
  # The "." inside the VP, a bracket over a comma only, a TOP root, function tags in the
  # gold: the same six brackets.
  variants = [
      GOLD_TREE.replace("(NN telescope)))) (. .))", "(NN telescope))) (. .)))"),
      GOLD_TREE.replace("(VBD saw)", "(VBD saw) (PRN (, ,))").replace(
          "saw a", "saw , a"),
      f"(TOP {GOLD_TREE})",
  ]
  for variant in variants[:1] + variants[2:]:
    s = score(GOLD_TREE, variant)
    assert (s.gold, s.test, s.matched) == (6, 6, 6), variant
  with_comma = GOLD_TREE.replace("(VBD saw)", "(VBD saw) (, ,)")
  s = score(with_comma, variants[1])
  assert (s.gold, s.test, s.matched) == (6, 6, 6)
  s = score(GOLD_TREE.replace("(S (NP", "(S (NP-SBJ-1").replace("(PP", "(PP-CLR=2"),
            GOLD_TREE)
  assert (s.gold, s.test, s.matched) == (6, 6, 6)
  # POS tags do not change bracket scores, only tagging accuracy (punctuation excluded).
  retagged = re.sub(r"\((DT|NN|VBD|IN) ", "(XX ", GOLD_TREE)
  s = score(GOLD_TREE, retagged)
  assert (s.gold, s.test, s.matched, s.words, s.correct_tags) == (6, 6, 6, 8, 0)


def test_evalb_advp_equals_prt_and_brackets_are_a_multiset():
  gold = "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))) (. .))"
  for label, matched in (("ADVP", 4), ("PRT", 4), ("NP", 3)):  # S NP VP PRT
    s = score(gold, gold.replace("(PRT", f"({label}"))
    assert (s.gold, s.test, s.matched) == (4, 4, matched), label
  double = "(S (NP (NP (DT the) (NN man))) (VP (VBD left)))"
  single = "(S (NP (DT the) (NN man)) (VP (VBD left)))"
  s = score(double, single)
  assert (s.gold, s.test, s.matched) == (4, 3, 3)  # recall 3/4, precision 1
  s = score(single, double)
  assert (s.gold, s.test, s.matched) == (3, 4, 3)  # precision 3/4, recall 1


def test_evalb_corpus_sums_brackets_over_sentences():
  small = evalb.SentenceScore(length=3, gold=2, test=2, matched=0, words=3, correct_tags=3)
  large = evalb.SentenceScore(length=50, gold=18, test=18, matched=18, words=48,
                              correct_tags=40)
  corpus = evalb.CorpusScore.of([small, large])
  assert corpus.recall == pytest.approx(90.0) and corpus.precision == pytest.approx(90.0)
  assert corpus.complete_match == pytest.approx(50.0)
  assert corpus.tagging_accuracy == pytest.approx(100 * 43 / 51)


def test_evalb_refuses_different_words():
  with pytest.raises(ValueError, match="word 2 differs: gold 'dog', hypothesis 'cat'"):
    score(GOLD_TREE, GOLD_TREE.replace("dog", "cat"))


def evalb_c(gold: str, test: str, params=evalb.COLLINS):
  """(gold, test, matched) as evalb.c computes them: a line-by-line transliteration of
  its read_line, massage_data and calc_result (brackets by word index, terminals with a
  delete label skipped, zero-width and deleted brackets dropped, labels cut at '-'/'=',
  each gold bracket matched to the first unmatched test bracket of equal span/label)."""
  def read_line(line):
    tokens = re.findall(r"\(|\)|[^\s()]+", line)
    wid, brackets, stack, i = 0, [], [], 0
    while i < len(tokens):
      if tokens[i] == "(":
        label = tokens[i + 1] if tokens[i + 1] not in ("(", ")") else ""
        i += 1 if label == "" else 2
        if i + 1 < len(tokens) and tokens[i] not in ("(", ")") and tokens[i + 1] == ")":
          if label not in params.delete_labels:
            wid += 1
          i += 2
          continue
        brackets.append([label, wid, None])
        stack.append(brackets[-1])
      elif tokens[i] == ")":
        stack.pop()[2] = wid
        i += 1
    kept = []
    for label, start, end in brackets:
      if start == end:
        continue
      label = re.split(r"[-=]", label, maxsplit=1)[0]
      if label not in params.delete_labels:
        kept.append([label, start, end, False])
    return kept

  def same(a, b):
    return a == b or {a, b} in [set(pair) for pair in params.equivalent_labels]

  gold_brackets, test_brackets = read_line(gold), read_line(test)
  matched = 0
  for label, start, end, _ in gold_brackets:
    for other in test_brackets:
      if not other[3] and other[1:3] == [start, end] and same(label, other[0]):
        other[3] = True
        matched += 1
        break
  return len(gold_brackets), len(test_brackets), matched


def perturb(node: Tree, rng: random.Random) -> Tree:
  """A copy of a tree with random bracket edits (tags and words untouched)."""
  if node.is_preterminal:
    return Tree(node.label, list(node.children))
  children = []
  for child in node.children:
    child = perturb(child, rng)
    if not child.is_preterminal and rng.random() < 0.15:
      children.extend(child.children)  # remove a bracket
    else:
      children.append(child)
  if len(children) > 2 and rng.random() < 0.2:  # add a bracket over a run of children
    i = rng.randrange(len(children) - 1)
    j = rng.randrange(i + 2, len(children) + 1)
    children[i:j] = [Tree(rng.choice(["NP", "VP", "PP", "ADVP"]), children[i:j])]
  label = node.label
  if rng.random() < 0.1:
    label = rng.choice(["NP", "VP", "S", "PRT", "ADVP", "SBAR"])
  return Tree(label, children)


def test_evalb_agrees_with_a_transliteration_of_evalb_c(ptb):
  rng = random.Random(0)
  path, text = ptb["dev"]
  differences = 0
  for line, raw in parsing.parse_trees(text, path):
    gold = parsing.clean(raw)
    test = perturb(gold, rng)
    ours = evalb.score_sentence(gold, test)
    expected = evalb_c(str(gold), str(test))
    assert (ours.gold, ours.test, ours.matched) == expected, f"{path}:{line}"
    differences += ours.matched < max(ours.gold, ours.test)
    # evalb.c on the raw treebank line (a TOP root, -NONE-, function tags) agrees with
    # scoring the cleaned tree: cleaning removes exactly what EVALB ignores.
    raw_line = str(raw).replace("( (", "(TOP (", 1)
    assert evalb_c(raw_line, str(test))[0] == ours.gold, f"{path}:{line}"
  assert differences > 200  # the perturbations did change most trees


def test_self_f1_is_100_and_edits_lower_it(ptb):
  path, text = ptb["test"]
  gold = [parsing.clean(t) for _, t in parsing.parse_trees(text, path)]
  linear = [parsing.linearize(t) for t in gold]
  report = evalb.score_linearized(linear, gold)
  assert report.all.f1 == 100.0 and report.short.f1 == 100.0
  assert report.all.sentences == 345 and report.repaired == 0
  assert 0 < report.short.sentences < 345
  # Without the subject NP of the first sentence: recall drops, precision stays 100.
  first = gold[0]
  assert first.children[0].label == "NP" and len(first.children[0].children) == 2
  edited = parsing.linearize(Tree(first.label, first.children[0].children
                                  + first.children[1:]))
  assert not parsing.rebuild(edited, first.words()).repaired
  report = evalb.score_linearized([edited] + linear[1:], gold)
  assert report.all.precision == 100.0 and report.all.recall < 100.0
  assert report.all.matched == report.all.gold - 1
  # A truncated output is repaired and counted.
  report = evalb.score_linearized(linear[:-1] + [linear[-1][:20]], gold)
  assert report.repaired == 1 and report.repaired_lines == (345,)
  assert report.all.f1 < 100.0
  text_report = evalb.format_report(report)
  assert text_report.splitlines()[2].startswith("repaired: 1 of 345 hypotheses (0.3%)")


# ------------------------------------------------------------------- evaluate CLI


def evaluate(*args, process=False):
  """`python -m t2t_keras.evaluate --task=parsing ARGS`: its main in this process
  (tests/inprocess.py), or with `process` a process as a user starts it."""
  if not process:
    return inprocess.run("evaluate", "--task=parsing", *args)
  return subprocess.run([sys.executable, "-m", "t2t_keras.evaluate", "--task=parsing",
                         *args], capture_output=True, text=True, cwd=REPO_ROOT,
                        timeout=300, check=False)


def test_evaluate_cli_scores_linearized_hypotheses(ptb, tmp_path):
  path, text = ptb["dev"]
  pairs = parsing.read_examples(text, path)
  sources, hyps = tmp_path / "dev.words", tmp_path / "dev.hyp"
  sources.write_text("".join(s + "\n" for s, _ in pairs))
  lines = [t for _, t in pairs]
  tokens = lines[3].split()
  lines[3] = " ".join(tokens[:len(tokens) // 2])  # truncated: repaired
  hyps.write_text("".join(t + "\n" for t in lines))
  trees = tmp_path / "dev.trees"
  ok = evaluate(f"--hypotheses={hyps}", f"--references={path}", f"--sources={sources}",
                f"--output_trees={trees}")
  assert ok.returncode == 0, ok.stderr[-2000:]
  rebuilt = [t for _, t in parsing.parse_trees(trees.read_text(), str(trees))]
  assert [t.words() for t in rebuilt] == [s.split() for s, _ in pairs]
  assert [parsing.linearize(t) for t in rebuilt[:3]] == lines[:3]
  assert "XX" in rebuilt[3].tags() and "XX" not in rebuilt[4].tags()
  out = ok.stdout.splitlines()
  report = evalb.score_linearized(lines, [parsing.clean(t) for _, t in
                                          parsing.parse_trees(text, path)])
  assert out[0].startswith(f"F1 {report.all.f1:.2f} (labeled bracketing, EVALB")
  assert 98.0 < report.all.f1 < 100.0
  assert out[1] == "sentences: 392, all scored"
  assert out[2].startswith("repaired: 1 of 392 hypotheses")
  assert "sentences of <= 40 words:" in ok.stdout

  # Errors name the file and line.
  bad = tmp_path / "bad.mrg"
  bad.write_text("( (S (NN a)) )\n( (S (NN b) )\n")
  two = tmp_path / "two.hyp"
  two.write_text("(S NN )\n(S NN )\n")
  result = evaluate(f"--hypotheses={two}", f"--references={bad}")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert f"error: --references {bad}:2: the tree starting here is not closed" in result.stderr
  result = evaluate(f"--hypotheses={hyps}", f"--references={bad.parent / 'none.mrg'}")
  assert result.returncode == 1 and "none.mrg cannot be read" in result.stderr
  result = evaluate(f"--hypotheses={two}", f"--references={path}")
  assert result.returncode == 1
  assert f"--hypotheses {two} has 2 lines but --references {path} has 392 trees" in (
      result.stderr)
  shifted = tmp_path / "shifted.words"
  shifted.write_text("".join(s + "\n" for s, _ in pairs[1:] + pairs[:1]))
  result = evaluate(f"--hypotheses={hyps}", f"--references={path}", f"--sources={shifted}")
  assert result.returncode == 1
  assert f"--sources {shifted} line 1 is not the sentence of the tree at {path}:1" in (
      result.stderr)


# ---------------------------------------------------------------- data and training


@pytest.mark.slow
def test_parsing_source_builds_datasets(ptb, tmp_path):
  train_path, train_text = ptb["train"]
  dev_path, _ = ptb["dev"]
  config = DataConfig(source="parsing", train_src=train_path, dev_src=dev_path,
                      data_dir=str(tmp_path / "data"), vocab_size=1000, max_length=256,
                      batch_size=2048)
  data = make_datasets(config)
  assert data.train_stats.pairs == 3177 and data.eval_stats.pairs == 392
  assert 3100 < data.train_stats.kept_for_training < 3177  # the longest trees dropped
  # Tree tokens are whole SentencePiece pieces (scripts may merge: "(" with "NP").
  pieces = data.tokenizer.tokenize(["(S (NP NNP ) (VP VBZ ) . )"]).to_list()[0]
  assert len(pieces) == 9
  targets = {t for _, t in parsing.read_examples(train_text, train_path)}
  batch = next(iter(data.train_fn(None)))
  texts = data.tokenizer.detokenize(batch["targets"]).numpy()
  assert len(texts) > 1
  assert all(t.decode() in targets for t in texts)
  eval_batch = next(iter(data.eval_fn(None)))
  assert eval_batch["inputs"].shape[0] >= 1

  bad = tmp_path / "bad.mrg"
  bad.write_text("( (S (NN a)) )\n( (S (NN b)) (VP (VBZ c) )\n")
  with pytest.raises(DataError, match=rf"{bad}:2: the tree starting here is not closed"):
    make_datasets(DataConfig(source="parsing", train_src=str(bad),
                             data_dir=str(tmp_path / "bad")))


def is_tree_for(hypothesis, num_words):
  """Whether a decoder output in the "words" linearization (`(S (NP Ms. NNP ) . . )`)
  is already a tree over `num_words` words, decided apart from parsing.rebuild: written
  as Penn Treebank brackets (each word and tag pair a leaf, `(NNP Ms.)`), it must read
  as one tree (parsing.parse_trees: balanced, no empty bracket), not a bare leaf, with
  one leaf per word."""
  brackets, word = [], None
  for token in re.findall(r"\([^\s()]*|\)[^\s()]*|[^\s()]+", hypothesis):
    if token[0] in "()":
      if word is not None or token == "(":  # an untagged word; a bracket without label
        return False
      brackets.append(token if token[0] == "(" else ")")  # ")NP" closes as ")"
    elif word is None:
      word = token
    else:
      brackets.append(f"({token} {word})")
      word = None
  try:
    trees = parsing.parse_trees(" ".join(brackets))
  except TreeError:
    return False
  return (word is None and len(trees) == 1 and not trees[0][1].is_preterminal
          and len(trees[0][1].leaves()) == num_words)


@pytest.mark.slow
def test_parsing_recipe_trains_decodes_and_scores(ptb, tmp_path):
  """A few steps of flags/parsing_ptb_sample.cfg (the "words" linearization, decoding
  constrained to trees), shrunk to a tiny model, through the train, decode, evaluate
  and export entry points (their mains in this process, evaluate once as a process); the
  export loaded as TF Serving loads it."""
  model_dir = tmp_path / "model"
  tiny = ["--hidden_size=16", "--filter_size=32", "--num_heads=2",
          "--num_hidden_layers=1", "--vocab_size=400", "--train_steps=3", "--log_every=1",
          "--eval_every=3", "--eval_steps=2", "--save_checkpoint_steps=3",
          "--show_examples=0", "--batch_size=1024"]
  # The recipe reads data/ptb_wsj_sample (t2t-datagen's); ../shared/data has the same.
  trained = inprocess.run("train", "--flagfile=flags/parsing_ptb_sample.cfg",
                          f"--model_dir={model_dir}", f"--train_src={ptb['train'][0]}",
                          f"--dev_src={ptb['dev'][0]}", *tiny)
  assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
  assert "step 3/3" in trained.stdout and "eval at step 3" in trained.stdout
  assert (model_dir / "vocab.model").exists()

  path, text = ptb["test"]
  pairs = parsing.read_examples(text, path)[:3]
  sources, hyps = tmp_path / "test.words", tmp_path / "test.hyp"
  sources.write_text("".join(s + "\n" for s, _ in pairs))
  decoded = inprocess.run(
      "decode", "--flagfile=flags/parsing_ptb_sample.cfg", f"--model_dir={model_dir}",
      f"--input_file={sources}", f"--output_file={hyps}", "--beam_size=2",
      "--extra_decode_length=5", "--average_last_n=1", "--noconstrain_trees")
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  assert len(hyps.read_text().splitlines()) == 3
  gold = tmp_path / "test3.mrg"
  gold.write_text("".join(line + "\n" for line in text.splitlines()[:3]))
  scored = evaluate(f"--hypotheses={hyps}", f"--references={gold}", f"--sources={sources}",
                    process=True)
  assert scored.returncode == 0, scored.stderr[-2000:]
  assert scored.stdout.splitlines()[1] == "sentences: 3, all scored"
  repaired = int(re.search(r"repaired: (\d+) of 3", scored.stdout).group(1))
  # An untrained model's output, repaired where it is not a tree for its words: as
  # many as are not, counted here independently.
  invalid = [not is_tree_for(h, len(s.split()))
             for h, (s, _) in zip(hyps.read_text().splitlines(), pairs)]
  assert repaired == sum(invalid), (scored.stdout, hyps.read_text())

  # The same untrained model, decoding constrained to trees as the recipe says (even
  # at a tight length): nothing left to repair, each word then its tag.
  decoded = inprocess.run(
      "decode", "--flagfile=flags/parsing_ptb_sample.cfg", f"--model_dir={model_dir}",
      f"--input_file={sources}", f"--output_file={hyps}", "--beam_size=2",
      "--extra_decode_length=5", "--average_last_n=1")
  assert decoded.returncode == 0, decoded.stderr[-3000:]
  scored = evaluate(f"--hypotheses={hyps}", f"--references={gold}", f"--sources={sources}")
  assert scored.returncode == 0, scored.stderr[-2000:]
  assert "repaired: 0 of 3 hypotheses" in scored.stdout, scored.stdout
  assert "outputs read as the 'words' linearization" in scored.stdout
  decoded_trees = hyps.read_text().splitlines()
  for (sentence, _), output in zip(pairs, decoded_trees):
    assert_copies_words(output, sentence.split())
    assert is_tree_for(output, len(sentence.split())), output

  # The recipe's export carries the constraint: a served parser returns valid trees,
  # the same as the decode CLI's (same beam, same length).
  export_dir = tmp_path / "export"
  exported = inprocess.run(
      "export", "--flagfile=flags/parsing_ptb_sample.cfg", f"--model_dir={model_dir}",
      f"--export_dir={export_dir}", "--export_version=1", "--beam_size=2",
      "--extra_decode_length=5", "--average_last_n=1")
  assert exported.returncode == 0, exported.stderr[-3000:]
  served = SessionModel(str(export_dir / "1")).run(
      inputs=[s for s, _ in pairs] + ["Dogs bark ."])
  outputs = [o.decode() for o in served["outputs"]]
  assert outputs[:3] == decoded_trees
  for sentence, output in zip([s for s, _ in pairs] + ["Dogs bark ."], outputs):
    assert_copies_words(output, sentence.split())
    assert not parsing.rebuild(output, sentence.split(), "words").problems, output


def assert_copies_words(output, words):
  """A "words" output: a tree whose leaves are words, each followed by its tag."""
  tokens = [t for t in output.split() if not t.startswith(("(", ")"))]
  assert tokens[0::2] == words, (output, words)
  assert all(tag in parsing.PTB_TAGS for tag in tokens[1::2]), output
  assert len(tokens) == 2 * len(words), output


def test_flagfiles_follow_the_paper_and_fit_the_sample(shared_data):
  from tests.conftest import flagfile_values as parse  # pylint: disable=import-outside-toplevel

  wsj = parse("flags/parsing_wsj.cfg")
  assert (wsj.num_hidden_layers, wsj.hidden_size, wsj.data_source) == (4, 1024, "parsing")
  assert (wsj.beam_size, wsj.alpha, wsj.extra_decode_length) == (21, 0.3, 300)
  assert wsj.vocab_size == 16000
  sample = parse("flags/parsing_ptb_sample.cfg")
  assert sample.data_source == "parsing" and sample.train_src.endswith("train.mrg")
  assert sample.alpha == 0.3 and sample.extra_decode_length == 300
  # data/ is where t2t-datagen writes; ../shared/data holds the same files.
  for path in (sample.train_src, sample.dev_src):
    assert path.startswith("data/ptb_wsj_sample/"), path
    assert os.path.exists(os.path.join(shared_data, os.path.relpath(path, "data")))
  with open(os.path.join(REPO_ROOT, "docs", "parsing.md"), encoding="utf-8") as f:
    section = f.read()
  assert section.startswith("# Constituency parsing\n")
  with open(os.path.join(REPO_ROOT, "BUILD.md"), encoding="utf-8") as f:
    assert "](docs/parsing.md)" in f.read()  # the map links the page
  for command in ("t2t_keras.train --flagfile=flags/parsing_ptb_sample.cfg",
                  "t2t_keras.decode --flagfile=flags/parsing_ptb_sample.cfg",
                  "t2t_keras.evaluate --task=parsing", "tools/linearize_trees.py"):
    assert command in section, command


# ------------------------------------------------------- the treebank-PCFG anchor


def test_pcfg_anchor_finds_the_most_probable_tree(ptb):
  """bench/parsing_pcfg.py: CKY's tree, scored again rule by rule, has the score the
  chart gave it, and no less than the gold tree's (Viterbi is exact); a grammar read
  off one unambiguous tree gives that tree back. Vanilla, Markovized, annotated."""
  from bench import parsing_pcfg  # pylint: disable=import-outside-toplevel
  path, text = ptb["train"]
  golds = [parsing.clean(raw, f"{path}:{line}")
           for line, raw in parsing.parse_trees(text, path)[:40]]
  for h, parent in ((0, False), (2, True), (1, False)):
    grammar = parsing_pcfg.Grammar(golds, h, parent)
    for gold in golds[:8]:
      found, score = parsing_pcfg.parse_with_score(grammar, gold.words())
      assert found.words() == gold.words()
      assert parsing_pcfg.tree_log_prob(grammar, found) == pytest.approx(score, abs=1e-6)
      assert score >= parsing_pcfg.tree_log_prob(grammar, gold) - 1e-6
  small = parsing.clean(tree("( (S (NP (DT The) (JJ big) (NN dog)) (VP (VBD saw) "
                             "(NP (PRP us))) (. .)) )"))
  for h, parent in ((0, False), (2, True), (1, False)):
    grammar = parsing_pcfg.Grammar([small], h, parent)
    assert parsing_pcfg.parse(grammar, small.words()) == small


@pytest.mark.slow
def test_pcfg_anchor_script_scores_with_evalb(ptb):
  """The bench script end to end on three dev sentences: EVALB's report."""
  data_dir = os.path.dirname(ptb["dev"][0])
  run = subprocess.run([sys.executable, "bench/parsing_pcfg.py", "--split=dev", "--limit=3",
                        f"--data_dir={data_dir}"],
                       cwd=REPO_ROOT, capture_output=True, text=True, env=ENV,
                       timeout=600, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert re.search(r"^CPU: .+; numpy", run.stdout, re.M), run.stdout
  f1 = float(re.search(r"^F1 (\d+\.\d+)", run.stdout, re.M).group(1))
  assert 30 < f1 <= 100, run.stdout
  assert "sentences: 3, all scored" in run.stdout
  assert "repaired: 0 of 3" in run.stdout
