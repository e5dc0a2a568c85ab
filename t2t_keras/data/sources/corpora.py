"""Several training corpora, mixed by weights (--train_weights, --train_weights_by).

A user with Europarl, Common Crawl and News Commentary, or a large out-of-domain corpus
and a small in-domain one, wants each to count for a chosen part of training. Each
corpus c gets an integer multiplicity m_c: every one of its kept pairs is trained on
m_c times an epoch. The batch plan (plan.py) puts those copies into its rank space, so
its machinery is unchanged: shares dealt by rank, one bucket per step, the same
batches on any number of hosts, resume in constant time, static shapes. Nothing is
drawn with replacement; a corpus's pairs are all seen, m_c times each, every epoch.

Why integers, and how they are chosen. The plan deals pairs, not probabilities, so a
share must be a whole number of copies. With weights w_c and kept pairs N_c:
  * by size (default, --train_weights_by=size): corpus c's share of an epoch is
    w_c N_c / sum(w N), so m_c is proportional to w_c (weights 1,3: the second corpus's
    pairs are seen three times as often);
  * by weight (--train_weights_by=weight): its share is w_c / sum(w) whatever its size,
    so m_c is proportional to w_c / N_c.
The proportions are scaled so that the smallest is k (k = 1, 2, ...) and rounded; the
first k whose achieved shares are all within TOLERANCE (relative) of the requested
ones is taken. An epoch then holds sum(m N) pairs, so k is also bounded by
MAX_EPOCH_PAIRS; when no k within it comes within REFUSE of every share, the weights
are refused with what to change. Memory: the copies are never materialised. An input
pipeline holds each of its pairs' ids once, plus one int64 a copy (the plan's rank ->
row table, see `plan.BatchPlan.share_loader`), so an epoch of 10^8 copies costs 800 MB
of tables at most (divided among hosts): MAX_EPOCH_PAIRS bounds it.

The corpora are tokenized and cached one by one (cache.tokenized_split on a
one-corpus config each, keyed by its own content), so adding a corpus or changing the
weights re-tokenizes nothing; `CorpusSplits` puts them side by side as one split.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from t2t_keras.configs import split_list
from t2t_keras.errors import ConfigError

TOLERANCE = 0.05  # relative error of a share that needs no larger multiplicities
REFUSE = 0.10  # relative error of a share that refuses the weights
MAX_EPOCH_PAIRS = 100_000_000  # copies an epoch may hold (one int64 of table each)
WEIGHTS_BY = ("size", "weight")


def weight_problems(weights: Optional[str], corpora: int, names: str) -> List[str]:
  """What is wrong with --train_weights for `corpora` corpora (named by `names`, the
  flags that list them), as `Source.problems` reports it."""
  if not weights:
    return []
  parts = split_list(weights)
  values = []
  for part in parts:
    try:
      values.append(float(part))
    except ValueError:
      return [f"--train_weights={weights}: {part!r} is not a number; give one positive "
              "number per corpus, comma-separated (e.g. 1,3)"]
  problems = []
  if len(values) != corpora:
    problems.append(f"--train_weights={weights} gives {len(values)} weights for "
                    f"{corpora} training corpora ({names}): give one per corpus, in "
                    "the same order")
  bad = [v for v in values if not (v > 0 and np.isfinite(v))]
  if bad:
    problems.append(f"--train_weights={weights}: every weight must be a positive "
                    f"number (got {bad[0]:g}); leave a corpus out instead of weighting "
                    "it 0")
  return problems


def parse_weights(weights: Optional[str], corpora: int) -> List[float]:
  """The weights of a validated --train_weights, or 1 for each corpus."""
  return [float(w) for w in split_list(weights)] or [1.0] * corpora


@dataclasses.dataclass(frozen=True)
class Mixture:
  """How many times an epoch each corpus's pairs are trained on (see module docstring).

  Attributes:
    names: the corpora, as the flags name them.
    kept: kept pairs per corpus (not empty, within max_length).
    weights: --train_weights (1 each when unset).
    by: "size" or "weight" (--train_weights_by).
    multiplicity: m_c, copies of each pair an epoch.
  """

  names: Tuple[str, ...]
  kept: Tuple[int, ...]
  weights: Tuple[float, ...]
  by: str
  multiplicity: Tuple[int, ...]

  @property
  def requested(self) -> np.ndarray:
    """The share of an epoch's pairs each corpus asked for."""
    kept, weights = np.asarray(self.kept, float), np.asarray(self.weights)
    wanted = weights * kept if self.by == "size" else weights
    return wanted / wanted.sum()

  @property
  def achieved(self) -> np.ndarray:
    """The share of an epoch's pairs each corpus gets."""
    copies = np.asarray(self.multiplicity) * np.asarray(self.kept)
    return copies / copies.sum()

  @property
  def epoch_pairs(self) -> int:
    return int(np.dot(self.multiplicity, self.kept))

  def error(self) -> float:
    """The largest relative difference of an achieved share from its request."""
    return float(np.max(np.abs(self.achieved / self.requested - 1)))

  def summary(self) -> List[str]:
    """One log line per corpus: pairs, multiplicity, requested and achieved share."""
    lines = []
    for c, name in enumerate(self.names):
      lines.append(
          f"Corpus {c + 1}/{len(self.names)} {name}: {self.kept[c]} pairs kept, weight "
          f"{self.weights[c]:g} (by {self.by}), x{self.multiplicity[c]} an epoch = "
          f"{self.kept[c] * self.multiplicity[c]} of {self.epoch_pairs} pairs; share "
          f"requested {100 * self.requested[c]:.1f}%, achieved "
          f"{100 * self.achieved[c]:.1f}%")
    return lines


def mixture(names: Sequence[str], kept: Sequence[int], weights: Sequence[float],
            by: str = "size", max_epoch_pairs: int = MAX_EPOCH_PAIRS) -> Mixture:
  """The smallest multiplicities that give every corpus its share within TOLERANCE.

  Raises:
    ConfigError: a corpus has no pair left, or no multiplicities within
      `max_epoch_pairs` come within REFUSE of every requested share.
  """
  if by not in WEIGHTS_BY:
    raise ConfigError(f"--train_weights_by={by!r} must be one of {WEIGHTS_BY}")
  empty = [name for name, n in zip(names, kept) if n == 0]
  if empty and len(names) > 1:
    raise ConfigError(f"training corpus {empty[0]} has no pair left after filtering "
                      "(empty sides, --max_length): drop it from --train_src/--train_tgt "
                      "(and its --train_weights) or raise --max_length")
  kept_arr, weights_arr = np.asarray(kept, np.int64), np.asarray(weights, float)
  base = weights_arr if by == "size" else weights_arr / np.maximum(kept_arr, 1)
  base = base / base.min()
  make = functools.partial(Mixture, tuple(names), tuple(int(n) for n in kept),
                           tuple(float(w) for w in weights), by)
  best = None
  for k in range(1, 1001):
    candidate = make(tuple(int(m) for m in np.maximum(1, np.round(base * k))))
    if candidate.epoch_pairs > max_epoch_pairs and best is not None:
      break
    if best is None or candidate.error() < best.error():
      best = candidate
    if best.error() <= TOLERANCE:
      break
  if best.error() > REFUSE or best.epoch_pairs > max_epoch_pairs:
    shares = ", ".join(f"{n} {100 * r:.1f}% -> {100 * a:.1f}%" for n, r, a in zip(
        names, best.requested, best.achieved))
    other = "weight" if by == "size" else "size"
    raise ConfigError(
        f"--train_weights={','.join(f'{w:g}' for w in weights)} "
        f"(--train_weights_by={by}) needs multiplicities {list(best.multiplicity)}: an "
        f"epoch of {best.epoch_pairs} pairs (at most {max_epoch_pairs}), shares "
        f"requested -> achieved {shares}. Choose weights in simpler ratios, or "
        f"--train_weights_by={other}.")
  return best


class CorpusSplits:
  """Several tokenized corpora as one split (`cache.TokenizedSplit`'s interface):
  pairs numbered corpus after corpus, each in its own order, and read length by
  length, each length's pairs corpus after corpus (so in pair order, as the plan
  expects).

  Args:
    parts: the corpora's `cache.TokenizedSplit`s.
    names: one name each, for logs and messages.
  """

  def __init__(self, parts: Sequence, names: Sequence[str]):
    self.parts, self.names = tuple(parts), tuple(names)
    self.lengths = np.concatenate([p.lengths.reshape([-1, 2]) for p in parts]).astype(
        np.int32)
    self.invalid_utf8 = sum(p.invalid_utf8 for p in parts)
    self.path = " and ".join(str(p.path) for p in parts)  # for messages
    self.corpus_sizes = tuple(len(p.lengths) for p in parts)

  @functools.cached_property
  def present(self) -> List[int]:
    return sorted(set().union(*(p.present for p in self.parts)))

  def read(self, lengths: Sequence[int]) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """As `TokenizedSplit.read`: for each length, every corpus's pairs of it."""
    parts = [p.read([n]) for n in lengths if n in set(self.present)
             for p in self.parts if n in set(p.present)]
    if not parts:
      return tf.zeros([0], tf.int32), tf.zeros([0], tf.int32), tf.zeros([0, 2], tf.int32)
    return tuple(tf.concat([p[i] for p in parts], 0) for i in range(3))

  def reader(self, lengths: Sequence[int]) -> Callable[[tf.Tensor], Tuple[tf.Tensor, ...]]:
    """As `TokenizedSplit.reader`: every corpus's pairs of the length at an index."""
    readers = []
    for part in self.parts:
      own = [n for n in lengths if n in set(part.present)]
      if own:
        index = tf.constant([own.index(n) if n in own else -1 for n in lengths])
        readers.append((part.reader(own), index))

    def read_at(i):
      def empty():
        return tf.zeros([0], tf.int32), tf.zeros([0], tf.int32), tf.zeros([0, 2], tf.int32)
      got = [tf.cond(index[i] >= 0, lambda r=read, j=index[i]: r(tf.maximum(j, 0)), empty)
             for read, index in readers]
      return tuple(tf.concat([g[k] for g in got], 0) for k in range(3))
    return read_at
