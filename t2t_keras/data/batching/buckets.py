"""What the training and the dev batches share (`pipeline`, `dev_batches`): the
buckets' padded lengths and pairs per batch, a split's counts, the EOS each row ends
with, and `loaded`, tensors built where the dataset graph runs.

Both pipelines import it, so neither imports the other for these (`pipeline` builds
`dev_batches.EvalData`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List

import numpy as np
import tensorflow as tf

from t2t_keras import EOS_ID
from t2t_keras.data.tokens import cache


def bucket_boundaries(min_length: int = 8, max_length: int = 256,
                      growth: float = 1.1) -> List[int]:
  """Padded lengths of the buckets: t2t's geometric boundaries, then max_length.

  Args:
    min_length: first boundary.
    max_length: last boundary (longest pair kept).
    growth: factor between boundaries (> 1).

  Returns:
    Strictly increasing lengths ending with max_length.
  """
  if growth <= 1.0 or min_length < 1 or max_length < 1:
    raise ValueError(f"bucket growth={growth} must be > 1 and min_length={min_length}, "
                     f"max_length={max_length} positive")
  boundaries, x = [], min_length
  while x < max_length:
    boundaries.append(x)
    x = max(x + 1, int(x * growth))
  return boundaries + [max_length]


def bucket_batch_sizes(boundaries: List[int], batch_size: int) -> List[int]:
  """Pairs per batch of each bucket: batch_size // L (at least 1)."""
  return [max(1, batch_size // length) for length in boundaries]


@dataclasses.dataclass(frozen=True)
class SplitStats:
  """What a split contained and what the pipeline does with it (counts of pairs)."""

  pairs: int
  invalid_utf8: int
  empty: int
  too_long: int
  longest: int  # tokens + EOS of the longer side of the longest pair

  @property
  def kept_for_training(self) -> int:
    return self.pairs - self.empty - self.too_long

  def summary(self, split: str, max_length: int) -> str:
    return (f"{split}: {self.pairs} pairs, {self.invalid_utf8} skipped for invalid "
            f"UTF-8, {self.empty} with an empty side, {self.too_long} longer than "
            f"max_length={max_length} (longest {self.longest})")


def split_stats(split: cache.TokenizedSplit, max_length: int) -> SplitStats:
  lengths = split.lengths
  empty = (lengths.min(axis=1) == 0) if len(lengths) else np.zeros([0], bool)
  too_long = ~empty & (lengths.max(axis=1) + 1 > max_length) if len(lengths) else empty
  return SplitStats(pairs=len(lengths), invalid_utf8=split.invalid_utf8,
                    empty=int(empty.sum()), too_long=int(too_long.sum()),
                    longest=int(lengths.max()) + 1 if len(lengths) else 0)


def loaded(load: Callable[[], tuple], inner: Callable[..., tf.data.Dataset]
            ) -> tf.data.Dataset:
  """`inner(*tensors)`, where `load()` builds the tensors: TF ops run once per
  iterator, wherever the dataset graph runs (no Python there)."""
  # Ragged tensors pass as (values, row_splits): plain tensors, shared, not re-encoded.
  def components():
    return tuple((r.values, r.row_splits) if isinstance(r, tf.RaggedTensor) else (r,)
                 for r in load())

  def unpack(*parts):
    return inner(*(tf.RaggedTensor.from_row_splits(*p, validate=False) if len(p) == 2
                   else p[0] for p in parts))

  # Without autograph (its conversion of these functions took about a second at every
  # start): they use no tensor-dependent Python control flow, and the datasets `inner`
  # builds inherit the setting.
  plain = tf.autograph.experimental.do_not_convert
  return tf.data.Dataset.from_tensors(0).map(plain(lambda _: components())).flat_map(
      plain(unpack))


def ragged_with_eos(ragged: tf.RaggedTensor) -> tf.RaggedTensor:
  """Each row of a batch of ids with EOS appended (`scoring.with_eos` does one list)."""
  return tf.concat([ragged, tf.fill([ragged.nrows(), 1], EOS_ID)], axis=1)
