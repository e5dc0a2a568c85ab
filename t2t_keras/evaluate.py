"""Scores translations: `python -m t2t_keras.evaluate --hypotheses=hyp.txt
--references=ref.txt [--references=ref2.txt] [--lowercase]`, or parses:
`python -m t2t_keras.evaluate --task=parsing --hypotheses=hyp.txt
--references=test.mrg [--sources=test.words]`.

Translation prints sacreBLEU (cased and uncased) and chrF, each with its signature,
then sacreBLEU's summaries (n-gram precisions, brevity penalty, lengths). Files are
line-aligned UTF-8 text, one detokenized segment per line (sacreBLEU tokenizes);
several --references files score against multiple references.

Parsing prints labeled bracketing F1, recall and precision as EVALB computes them with
COLLINS.prm (t2t_keras.parsing.evalb), for all sentences and those of <= 40 words, and how many
hypotheses had to be repaired into a tree. --hypotheses holds the decoder's linearized
trees, one per line (`(S (NP NNP ) (VP VBZ ) . )`, as t2t_keras.decode writes them);
--references is ONE treebank file of bracketed trees (.mrg, one tree per line or
spanning lines, cleaned here as for training: -NONE-, function tags and the empty root
removed), the same file the sources were taken from, so no separately prepared gold
file can drift out of step. The words that rebuild each hypothesis are those of its
reference tree, or of --sources (the decoder's input, one sentence per line), which
must then be the same words. --output_trees writes the rebuilt trees (Penn Treebank
brackets) for other tools. Trees from another parser can be scored by linearizing them
first (tools/linearize_trees.py).

A thin entry point over t2t_keras.metrics.bleu_report and t2t_keras.parsing.evalb. It does not
import TensorFlow (only for gs:// and other remote paths), so it starts in about a
second.
"""

from __future__ import annotations


from t2t_keras import console

console.quiet_tensorflow(import_now=False)  # TensorFlow only for remote paths

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from t2t_keras import metrics, parsing  # noqa: E402
from t2t_keras.errors import InputError  # noqa: E402
from t2t_keras.parsing import evalb  # noqa: E402
from t2t_keras.textio import read_bytes, read_lines  # noqa: E402

flags.DEFINE_string("hypotheses", None, "System output, one segment per line (UTF-8).")
flags.DEFINE_multi_string("references", None,
                          "Reference file, line-aligned with --hypotheses; repeat the flag "
                          "for multiple references.")
flags.DEFINE_boolean("lowercase", False,
                     "Score chrF case-insensitively too (BLEU is always printed both cased "
                     "and uncased).")
flags.DEFINE_enum("task", "translation", ["translation", "parsing"],
                  "What is scored: translation (BLEU and chrF) or parsing (EVALB "
                  "labeled bracketing F1 of linearized trees against a .mrg file).")
flags.DEFINE_string("sources", None,
                    "Parsing only: the decoded sentences, one per line (words separated "
                    "by spaces), line-aligned with --hypotheses; default: the words of "
                    "the --references trees.")
flags.DEFINE_enum("linearization", "auto", ["auto", "tags", "words"],
                  "--task=parsing: how the hypotheses are linearized (the model's "
                  "--parsing_linearization); auto: words when every other leaf token is "
                  "not a POS tag.")
flags.DEFINE_string("output_trees", None,
                    "Parsing only: also write the rebuilt (and repaired) hypothesis trees "
                    "here, one Penn Treebank bracketing per line, e.g. for evalb.")
FLAGS = flags.FLAGS


def read_inputs(hypotheses_path: str, reference_paths: list) -> tuple:
  """Hypotheses and reference streams, checked to be non-empty and line-aligned."""
  hypotheses = read_lines(hypotheses_path, "--hypotheses", InputError)
  if not hypotheses:
    raise InputError(f"--hypotheses {hypotheses_path} is empty: nothing to score.")
  references = []
  for path in reference_paths:
    stream = read_lines(path, "--references", InputError)
    if len(stream) != len(hypotheses):
      raise InputError(f"--references {path} has {len(stream)} lines but --hypotheses "
                       f"{hypotheses_path} has {len(hypotheses)}: they must be line-aligned "
                       "(one segment per line, same order).")
    references.append(stream)
  return hypotheses, references


def read_parsing_inputs(hypotheses_path: str, references_path: str,
                        sources_path=None) -> tuple:
  """Linearized hypotheses, cleaned reference trees and (optionally) source words.

  Raises:
    InputError: a missing or undecodable file, a malformed reference tree (naming file
      and line), or files that do not hold one entry per sentence.
  """
  hypotheses = read_lines(hypotheses_path, "--hypotheses", InputError)
  data = read_bytes(references_path, "--references", InputError)
  try:
    trees = parsing.parse_trees(parsing.decode_utf8(data, references_path),
                                references_path)
    references = [parsing.clean(tree, f"{references_path}:{line}") for line, tree in trees]
  except parsing.TreeError as error:
    raise InputError(f"--references {error}") from None
  if not references:
    raise InputError(f"--references {references_path} holds no bracketed trees.")
  if len(hypotheses) != len(references):
    raise InputError(f"--hypotheses {hypotheses_path} has {len(hypotheses)} lines but "
                     f"--references {references_path} has {len(references)} trees: give "
                     "one decoded tree per reference tree, in the same order.")
  words = None
  if sources_path:
    words = [line.split() for line in read_lines(sources_path, "--sources", InputError)]
    if len(words) != len(references):
      raise InputError(f"--sources {sources_path} has {len(words)} lines but --references "
                       f"{references_path} has {len(references)} trees.")
    for number, (sentence, (line, _), tree) in enumerate(zip(words, trees, references), 1):
      if sentence != tree.words():
        raise InputError(f"--sources {sources_path} line {number} is not the sentence of "
                         f"the tree at {references_path}:{line}: "
                         f"{_first_difference(sentence, tree.words())}; were they made "
                         "from another file?")
  return hypotheses, references, words


def _first_difference(words: list, expected: list) -> str:
  for i, (word, gold) in enumerate(zip(words, expected)):
    if word != gold:
      return f"word {i + 1} is {word!r}, the tree has {gold!r}"
  return f"{len(words)} words, the tree has {len(expected)}"


def check_usage() -> None:
  # Checked here, not with flags.mark_flags_as_required, whose validator would bind
  # every command that shares the process's flags (tests run several in one).
  missing = [f"--{name}" for name in ("hypotheses", "references") if not FLAGS[name].value]
  if missing:
    verb = "is" if len(missing) == 1 else "are"
    raise app.UsageError(f"{' and '.join(missing)} {verb} required: the system output "
                         "and its reference file(s).")
  if (FLAGS.sources or FLAGS.output_trees) and FLAGS.task != "parsing":
    raise app.UsageError("--sources and --output_trees are for --task=parsing.")


def run() -> None:
  (_evaluate_parsing if FLAGS.task == "parsing" else _evaluate_translation)()


def _evaluate_translation():
  hypotheses, references = read_inputs(FLAGS.hypotheses, FLAGS.references)
  report = metrics.bleu_report(hypotheses, references, lowercase_chrf=FLAGS.lowercase)
  print(metrics.format_report(report, details=True))


def _evaluate_parsing():
  if len(FLAGS.references) != 1:
    raise InputError(f"--task=parsing takes one --references treebank file, got "
                     f"{len(FLAGS.references)}.")
  hypotheses, references, words = read_parsing_inputs(
      FLAGS.hypotheses, FLAGS.references[0], FLAGS.sources)
  report = evalb.score_linearized(hypotheses, references, words,
                                  linearization=FLAGS.linearization)
  print(evalb.format_report(report))
  if FLAGS.output_trees:
    with open(FLAGS.output_trees, "w", encoding="utf-8") as f:
      f.writelines(f"{tree}\n" for tree in report.trees)
    print(f"rebuilt trees: {FLAGS.output_trees}")


command = console.Command(run, check=check_usage, model_dir=None)
main, console_main = command.main, command.console_main  # console_main: python -m
console_script_main = command.console_script_main  # t2t-evaluate

if __name__ == "__main__":
  console_main()
