"""Constituency trees for the paper's parsing task (section 6.3): read, clean, linearize,
rebuild and repair.

The Transformer parses as it translates (Vinyals et al. 2015, "Grammar as a foreign
language"): the source is the sentence, the target a linearized tree, and a tree is
rebuilt from the decoder's output plus the input words.

Cleaning (`clean`), as EVALB and the parsing literature preprocess the Penn Treebank:
  * empty elements (`(-NONE- *T*-1)`) are removed, and so are constituents left with
    no words (`(NP-SBJ (-NONE- *))`);
  * function tags and indices are stripped: `NP-SBJ-1`, `PP-LOC=2` -> `NP`, `PP`
    (labels that start with "-", such as the POS tags `-LRB-`, `-RRB-`, stay whole);
  * the unlabeled root of `( (S ...) )` (or a `TOP`/`ROOT` root) is removed when it
    wraps a single phrase; otherwise (several children, or a lone word) it is kept
    and labeled `TOP`, which EVALB never scores.
Unary chains such as `(NP (NP ...))` are kept: EVALB scores both brackets.

Linearization (`linearize`), tokens separated by single spaces:
    (S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))
 -> (S (NP NNP NNP ) (VP VBZ (NP NNP ) ) . )
  * Each word is replaced by its POS tag, not by a bare placeholder (Vinyals et al.
    used "XX"): the output is then a complete tree with tags, so tagging accuracy can
    be measured and the result read by any treebank tool. The tags cost no length
    (one token per word either way), and EVALB never scores them (only brackets).
  * A closing bracket is a bare `)`, not `)NP`: the label is already on the opening
    token, a bare `)` adds one symbol instead of one per label, and the only way an
    output can be invalid is then a count (unbalanced brackets, too few or too many
    leaves), never a mismatched label that would need an arbitrary rule.
  * Opening tokens carry their label (`(NP`): a few dozen frequent, space-separated
    symbols. The parsing vocabulary lets SentencePiece merge "(" with letters
    (t2t_keras.data.tokens.tokenizer), so each tree token is one piece (measured on the
    sample: 1.0002 pieces per token with a 3k vocabulary, against 1.31 when "(" and
    "NP" must stay apart); a rare token split into pieces is joined again on output.
The source is the words joined by single spaces; words never contain spaces.

Two linearizations (DataConfig.parsing_linearization, --parsing_linearization):
  * "tags" (above, Vinyals et al.'s with tags for words): the decoder must count
    words to know where it is in the sentence, and free-running it loses count.
  * "words": each word, copied from the input, followed by its tag:
        (S (NP Ms. NNP Haag NNP ) (VP plays VBZ (NP Elianti NNP ) ) . . )
    The decoder then sees in its own output which word it is at, and it writes a
    tag right after reading the word it tags (written before the word, tags were
    right for only 68% of dev words after 2,000 steps: the decoder had to find the
    word by attention first). Tree-constrained decoding lets the search write only
    the input's next word (its pieces, in order) where a word may come, so no word
    is skipped or repeated. Longer targets (one more token per word, in pieces).
  Rebuilding reads the tokens that are not brackets in pairs, word then tag; a word
  left without its tag (a bracket follows) gets the placeholder tag `XX`. The words
  of the rebuilt tree are always the input's (a word written wrong is ignored).

Rebuilding (`rebuild`) reads the output left to right (brackets split tokens even
without spaces: "NN)" is "NN" then ")"; a labeled ")NP" is read as ")") and repairs it
deterministically, listing each repair (`Rebuilt.problems`; empty when the output was
a valid tree for the words):
  * a `)` with nothing open is dropped; brackets still open at the end are closed;
  * a constituent with no leaf (`(NP )`) and a bare `(` are dropped;
  * more leaves than words: the last extra leaves are dropped (and constituents left
    empty with them); fewer: the missing words are appended to the root with the
    placeholder tag `XX`;
  * several top-level items (e.g. words after the root was closed) are wrapped in a
    `TOP` root, as is a tree that is a bare word.
Words are then attached to the leaves in order.

Pure Python (no TensorFlow), so `python -m t2t_keras.evaluate` starts quickly.
"""

from __future__ import annotations

import dataclasses
import re
from typing import List, Optional, Sequence, Tuple, Union

from t2t_keras.errors import TreeError

LINEARIZATION_VERSION = 1  # part of the data cache key: bump when the format changes
LINEARIZATIONS = ("tags", "words")
NONE_TAG = "-NONE-"
ROOT_LABELS = ("", "TOP", "ROOT")
TOP = "TOP"
PLACEHOLDER_TAG = "XX"
CLOSE = ")"
# The 45 part-of-speech tags of the Penn Treebank (all 45 occur in the WSJ sample): the
# leaves of a linearized tree (`token_kind`).
PTB_TAGS = frozenset(
    "# $ '' , -LRB- -RRB- . : CC CD DT EX FW IN JJ JJR JJS LS MD NN NNP NNPS NNS PDT POS "
    "PRP PRP$ RB RBR RBS RP SYM TO UH VB VBD VBG VBN VBP VBZ WDT WP WP$ WRB ``".split())
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
# Output tokens: "(LABEL", ")" (a label glued to it, as in ")NP", is ignored), or a tag;
# brackets split tokens even without a space ("NN)" is "NN" then ")").
_OUTPUT_TOKEN = re.compile(r"\([^\s()]*|\)[^\s()]*|[^\s()]+")


@dataclasses.dataclass
class Tree:
  """A constituent: a label and its children.

  A preterminal has its POS tag as label and exactly one child, the word (a str);
  every other node has Tree children only.
  """

  label: str
  children: List[Union["Tree", str]]

  @property
  def is_preterminal(self) -> bool:
    return len(self.children) == 1 and isinstance(self.children[0], str)

  def leaves(self) -> List["Tree"]:
    """The preterminals, left to right."""
    if self.is_preterminal:
      return [self]
    return [leaf for child in self.children for leaf in child.leaves()]

  def words(self) -> List[str]:
    return [leaf.children[0] for leaf in self.leaves()]

  def tags(self) -> List[str]:
    return [leaf.label for leaf in self.leaves()]

  def __str__(self) -> str:
    """Penn Treebank brackets on one line: `(S (NP (NNP John)) (VP (VBZ runs)))`."""
    if self.is_preterminal:
      return f"({self.label} {self.children[0]})"
    return f"({self.label} {' '.join(str(child) for child in self.children)})"


# ------------------------------------------------------------------------- reading


def decode_utf8(data: bytes, name: str) -> str:
  """Bytes of a treebank file as text; TreeError naming the line if not UTF-8."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as error:
    line = data.count(b"\n", 0, error.start) + 1
    raise TreeError(f"{name}:{line}: invalid UTF-8 ({error.reason}); convert the file "
                    "to UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None


def parse_trees(text: str, name: str = "<trees>") -> List[Tuple[int, Tree]]:
  """Every bracketed tree of a text, with the line where it starts.

  Trees may take one line each (as in data/ptb_wsj_sample) or span several
  lines (the Penn Treebank's own .mrg files); a tree starts at a top-level "(".

  Args:
    text: the treebank text.
    name: what to call it in error messages (the file path).

  Returns:
    (1-based line, Tree) pairs in file order, trees as written (not cleaned).

  Raises:
    TreeError: unbalanced brackets, text outside brackets, a node that is neither a
      preterminal `(TAG word)` nor a phrase of nodes; the message names the line.
  """
  trees = []
  stack: List[Tuple[str, list, int]] = []  # (label, children, line of "(")
  line, scanned = 1, 0
  expect_label = False
  for match in _TOKEN.finditer(text):
    line += text.count("\n", scanned, match.start())
    scanned = match.start()
    token = match.group()
    if expect_label:
      expect_label = False
      if token not in ("(", ")"):
        stack[-1] = (token, stack[-1][1], stack[-1][2])
        continue
    if token == "(":
      stack.append(("", [], line))
      expect_label = True
    elif token == ")":
      if not stack:
        raise TreeError(f"{name}:{line}: ')' closes no bracket (unbalanced brackets).")
      label, children, start = stack.pop()
      node = _make_node(label, children, f"{name}:{start}", root=not stack)
      if stack:
        stack[-1][1].append(node)
      else:
        trees.append((start, node))
    elif not stack:
      raise TreeError(f"{name}:{line}: {token!r} is outside any bracket; a tree file "
                      "holds bracketed trees such as ( (S (NP (NNP John)) ...) ).")
    else:
      stack[-1][1].append(token)
  if stack:
    raise TreeError(f"{name}:{stack[0][2]}: the tree starting here is not closed "
                    f"({len(stack)} bracket(s) still open at the end of the file).")
  return trees


def _make_node(label: str, children: list, where: str, root: bool) -> Tree:
  words = [c for c in children if isinstance(c, str)]
  if not children:
    raise TreeError(f"{where}: empty bracket ({label}) with neither a word nor "
                    "constituents.")
  if words and len(children) > 1:
    raise TreeError(f"{where}: ({label} ...) mixes words {words[:3]} with other "
                    "children; a word must be alone under its POS tag, as in (NN dog).")
  if not label and not root:
    raise TreeError(f"{where}: a bracket without a label inside a tree (only the root "
                    "may be unlabeled).")
  return Tree(label, children)


# ------------------------------------------------------------------------ cleaning


def strip_label(label: str) -> str:
  """`NP-SBJ-1` -> `NP`, `PP=2` -> `PP`; labels starting with "-" (-LRB-) stay."""
  if label.startswith("-"):
    return label
  return re.split(r"[-=]", label, maxsplit=1)[0]


def clean(tree: Tree, where: str = "<tree>") -> Tree:
  """The tree without empty elements, function tags, indices or an empty root.

  Args:
    tree: as read by `parse_trees`.
    where: file:line for the error message.

  Returns:
    A new Tree (see the module docstring for the rules).

  Raises:
    TreeError: nothing but empty elements.
  """
  cleaned = _clean(tree)
  if cleaned is None:
    raise TreeError(f"{where}: the tree has no words besides empty elements (-NONE-).")
  if tree.label in ROOT_LABELS:
    if len(cleaned.children) == 1 and not cleaned.is_preterminal and not (
        cleaned.children[0].is_preterminal):
      return cleaned.children[0]
    return Tree(TOP, cleaned.children)
  if cleaned.is_preterminal:
    return Tree(TOP, [cleaned])
  return cleaned


def _clean(node: Tree) -> Optional[Tree]:
  if node.is_preterminal:
    return None if node.label == NONE_TAG else Tree(node.label, list(node.children))
  children = [c for c in (_clean(child) for child in node.children) if c is not None]
  return Tree(strip_label(node.label), children) if children else None


# ------------------------------------------------------------------- linearization


def _check_linearization(linearization: str):
  if linearization not in LINEARIZATIONS:
    raise ValueError(f"linearization {linearization!r}: use one of {LINEARIZATIONS}")


def linearize(tree: Tree, linearization: str = "tags") -> str:
  """The target sequence (see module docstring): "tags" `(S (NP NNP NNP ) . )`,
  "words" `(S (NP Ms. NNP Haag NNP ) . . )`."""
  _check_linearization(linearization)
  tokens: List[str] = []

  def walk(node):
    if node.is_preterminal:
      if linearization == "words":
        tokens.append(node.children[0])
      tokens.append(node.label)
      return
    tokens.append("(" + node.label)
    for child in node.children:
      walk(child)
    tokens.append(CLOSE)

  walk(tree)
  return " ".join(tokens)


def example(tree: Tree, linearization: str = "tags") -> Tuple[str, str]:
  """(source, target) strings of a cleaned tree: the words, the linearized tree."""
  return " ".join(tree.words()), linearize(tree, linearization)


def read_examples(text: str, name: str,
                  linearization: str = "tags") -> List[Tuple[str, str]]:
  """(source, target) pairs of every tree of a treebank text, cleaned."""
  return [example(clean(tree, f"{name}:{line}"), linearization)
          for line, tree in parse_trees(text, name)]


def detect_linearization(outputs: Sequence[str]) -> str:
  """Which linearization decoder outputs are in: "words" when many of the tokens that
  are not brackets are not POS tags (every other one is a word), else "tags"."""
  leaves = [token for line in outputs for token in _OUTPUT_TOKEN.findall(line)
            if token[0] not in "()"]
  words = sum(token not in PTB_TAGS for token in leaves)
  return "words" if leaves and words >= 0.25 * len(leaves) else "tags"


# ---------------------------------------------------------------- rebuild / repair


@dataclasses.dataclass(frozen=True)
class Rebuilt:
  """A tree rebuilt from a linearized output.

  Attributes:
    tree: a valid tree whose words are the input words, in order.
    problems: the repairs made, e.g. ("closed 2 open brackets",); empty when the
      output was already a valid tree for these words.
  """

  tree: Tree
  problems: Tuple[str, ...] = ()

  @property
  def repaired(self) -> bool:
    return bool(self.problems)


def rebuild(target: str, words: Sequence[str], linearization: str = "tags") -> Rebuilt:
  """A tree from a linearized output and the input words, repaired if needed.

  Args:
    target: the decoder's output, e.g. "(S (NP NNP ) (VP VBZ ) )".
    words: the input words (the source split on whitespace).
    linearization: "tags" or "words" (then tokens that are not brackets come in
      pairs, word then tag; the word is skipped: the tree gets the input's words).

  Returns:
    A Rebuilt (tree and the repairs made). Deterministic: the same output and words
    always give the same tree.
  """
  if not words:
    raise ValueError("rebuild needs at least one word.")
  problems: List[str] = []
  counts = {"stray": 0, "empty": 0, "bare": 0, "untagged": 0}
  forest: List[Tree] = []  # finished top-level items
  stack: List[Tree] = []  # open constituents; leaves are Tree(tag, [""]) until the end

  def attach(node):
    (stack[-1].children if stack else forest).append(node)

  def close():
    node = stack.pop()
    if node.children:
      attach(node)
    else:
      counts["empty"] += 1

  _check_linearization(linearization)
  copy_words = linearization == "words"
  pending_word = False  # "words": a word was read, its tag comes next
  for token in _OUTPUT_TOKEN.findall(target):
    is_bracket = token.startswith(("(", CLOSE))
    if copy_words and not is_bracket and not pending_word:
      pending_word = True  # a word: skipped, its tag follows
      continue
    if pending_word and is_bracket:
      counts["untagged"] += 1
      attach(Tree(PLACEHOLDER_TAG, [""]))
    pending_word = False
    if token.startswith(CLOSE):
      if stack:
        close()
      else:
        counts["stray"] += 1
    elif token.startswith("("):
      if len(token) == 1:
        counts["bare"] += 1
      else:
        stack.append(Tree(token[1:], []))
    else:
      attach(Tree(token, [""]))
  if pending_word:
    counts["untagged"] += 1
    attach(Tree(PLACEHOLDER_TAG, [""]))
  if stack:
    problems.append(f"closed {len(stack)} open bracket(s)")
    while stack:
      close()
  for key, what in (("stray", "dropped {} ')' closing nothing"),
                    ("bare", "dropped {} '(' without a label"),
                    ("empty", "dropped {} constituent(s) without leaves"),
                    ("untagged", f"tagged {{}} word(s) without a tag {PLACEHOLDER_TAG}")):
    if counts[key]:
      problems.append(what.format(counts[key]))

  leaves = sum(len(item.leaves()) for item in forest)
  if leaves > len(words):
    problems.append(f"dropped {leaves - len(words)} leaves beyond the {len(words)} words")
    forest = _keep_leaves(forest, len(words))
  if len(forest) != 1 or forest[0].is_preterminal:
    if len(forest) > 1:
      problems.append(f"wrapped {len(forest)} top-level items in {TOP}")
    elif forest and forest[0].is_preterminal:
      problems.append(f"wrapped a bare leaf in {TOP}")
    forest = [Tree(TOP, forest)]
  root = forest[0]
  if leaves < len(words):
    missing = len(words) - leaves
    problems.append(f"appended {missing} missing word(s) to the root")
    root.children.extend(Tree(PLACEHOLDER_TAG, [""]) for _ in range(missing))
  for leaf, word in zip(root.leaves(), words):
    leaf.children[0] = word
  return Rebuilt(root, tuple(problems))


def _keep_leaves(forest: List[Tree], n: int) -> List[Tree]:
  """The forest cut after its first n leaves (constituents left empty removed)."""
  budget = [n]

  def cut(node):
    if node.is_preterminal:
      if budget[0] == 0:
        return None
      budget[0] -= 1
      return node
    children = [c for c in (cut(child) for child in node.children) if c is not None]
    return Tree(node.label, children) if children else None

  return [t for t in (cut(item) for item in forest) if t is not None]


def token_kind(token: str) -> Optional[str]:
  """What a whole output token is in a linearized tree: "open" (`(NP`), "close" (`)`),
  "leaf" (a Penn Treebank POS tag), or None (anything else, e.g. a word).

  Used by tree-constrained decoding (`t2t_keras.parsing.constraint.TreeConstraint`).
  """
  if token == CLOSE:
    return "close"
  if len(token) > 1 and token[0] == "(" and not re.search(r"[\s()]", token[1:]):
    return "open"
  if token in PTB_TAGS:
    return "leaf"
  return None
