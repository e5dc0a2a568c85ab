"""Packed rows (--packed_length=L): several training pairs side by side in one row of L
tokens a side, as tensor2tensor's `_packed` problems (its TPU default) and Flax's WMT
example train.

Why: with static shapes (TPU, XLA) an unpacked run compiles one program per length
bucket (21 at max_length 40, 42 at 256) and pads every pair to its bucket. A packed
batch always has the shape [R, L], R = batch_size // L, so a run compiles one program,
and rows that mix short and long pairs leave little padding.

The packed plan (`PackedPlan`). Rows mix lengths, so a step cannot be one bucket's
pairs as in the unpacked plan (plan.py); it is instead one pair from each of q length
strata, which makes every step's lengths fit its rows by construction:
- All kept pairs form one pool, dealt into shares (one per batch slot of a step:
  input pipelines x replicas x micro-batches) exactly as plan.py deals a bucket's
  pool, in rank order (by length, then corpus, copies of weighted corpora included).
  So a share is sorted by length.
- Each share's positions are cut into q strata of U consecutive positions (the last
  one shorter), U = units per epoch. Step k of an epoch takes from stratum j the
  position j U + sigma((k + c_j) mod U): sigma a seeded permutation of the epoch and
  share (`tf.random.experimental.index_shuffle`), c_j a seeded offset per stratum, so
  each stratum's pairs come once an epoch in random order and strata meet at random.
  Positions past the end of a share (fewer than q an epoch) are empty slots.
- Stratum j's pairs are at most b_j tokens (with EOS) on either side, b_j the longest
  of the stratum in any share, known from the counts. A template made once on the host
  puts the q strata into the R rows first-fit-decreasing by b_j; q is the largest
  number whose template fits (sum of b_j <= L in every row). A step's pairs therefore
  always fit their rows: no pair is split, dropped or carried to another step, and
  what a step holds depends only on (seed, epoch, k, share).
So the plan keeps what plan.py gives: any step at once (resume), the batches of a slot
the same for any number of hosts, each pipeline holding only its shares, corpus
weights as copies, every kept pair once an epoch (none twice). The padding left is a
pair's slack under its stratum's bound (strata are narrow: a share of ~q U pairs
sorted by length, cut in q), the shorter side of each pair, and a template's rows not
quite full (docs/benchmarks.md measures it on Multi30k).

Features. Besides "inputs" and "targets" [R, L] (PAD_ID between and after the pairs),
a packed batch carries t2t's names: "inputs_segmentation" / "targets_segmentation",
int32 [R, L], the pair's number in its row from 1 (0 at padding), and "inputs_position"
/ "targets_position", each token's position within its pair (from 0). The model reads
them (model.py): attention stays within a segment (encoder, causal decoder and
encoder-decoder attention), positions restart at each segment, and each segment's
first decoder input is BOS. The loss already counts real tokens only (PAD excluded),
each once.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from t2t_keras import PAD_ID
from t2t_keras.data.batching import plan

SEGMENTS = {"inputs": "inputs_segmentation", "targets": "targets_segmentation"}
POSITIONS = {"inputs": "inputs_position", "targets": "targets_position"}
FEATURES = tuple(SEGMENTS.values()) + tuple(POSITIONS.values())


def rows(batch_size: int, packed_length: int) -> int:
  """R: packed rows per batch (at least 1)."""
  return max(1, batch_size // packed_length)


def first_fit_decreasing(bounds: np.ndarray, num_rows: int, length: int
                         ) -> Optional[np.ndarray]:
  """The row of each item (sizes `bounds`) in `num_rows` rows of `length`, first fit
  by decreasing size; None when one does not fit."""
  free = np.full([num_rows], length, np.int64)
  row_of = np.zeros([len(bounds)], np.int64)
  for j in np.argsort(-np.asarray(bounds), kind="stable"):
    row = int(np.argmax(free >= bounds[j]))
    if free[row] < bounds[j]:
      return None
    free[row] -= bounds[j]
    row_of[j] = row
  return row_of


def _stratum_bounds(per_length: np.ndarray, group: int, strata: int
                    ) -> Tuple[int, np.ndarray]:
  """(U, b): units per epoch and each stratum's longest padded length, for q = `strata`
  strata of shares of the pool that has per_length[n] pairs (copies) of padded length
  n. Counts, not a pair's length each: a weighted corpus may have 10^8 copies."""
  ends = np.cumsum(per_length)  # pairs (copies) of padded length up to n
  pairs = int(ends[-1])
  tiny = pairs < group  # every share is the whole pool (plan.BatchPlan.tiny)
  share = pairs if tiny else -(-pairs // group)  # the largest share
  units = -(-share // strata)
  last = (np.arange(1, strata + 1) * units - 1)  # each stratum's last share position
  rank = last if tiny else group - 1 + group * last  # its largest rank in any share
  return units, np.searchsorted(ends, np.minimum(rank, pairs - 1), side="right")


def template(per_length: np.ndarray, group: int, num_rows: int, length: int
             ) -> Tuple[int, np.ndarray]:
  """(q, row of each stratum): the most strata whose bounds fit the rows (module
  docstring). per_length[n]: the pool's pairs (copies) of padded length n."""
  pairs = int(per_length.sum())
  share = pairs if pairs < group else -(-pairs // group)
  mean = float(np.arange(len(per_length)) @ per_length) / pairs
  # The rows cannot take more than num_rows x length / mean pairs; more strata than a
  # share has pairs would only add empty slots.
  strata = int(min(share, num_rows * length // max(1.0, mean) + 1))
  # A pool smaller than the group of batch slots is whole in every share, which then
  # needs a stratum per pair.
  lowest = pairs if pairs < group else 1
  for q in range(max(strata, 1), lowest - 1, -1):
    row_of = first_fit_decreasing(_stratum_bounds(per_length, group, q)[1], num_rows,
                                  length)
    if row_of is not None:
      return q, row_of
  raise ValueError(f"{pairs} training pairs, fewer than the {group} batches of a "
                   f"step, do not fit one step's {num_rows} packed rows of {length}: use "
                   "more training data, fewer replicas or a larger --batch_size")


class PackedPlan(plan.BatchPlan):
  """The batch plan of packed rows (module docstring): a step is q pairs per batch
  slot, one of each length stratum, that fit its R rows of L tokens by construction.

  Args:
    lengths: int [N, 2] (source, target) token counts of the pairs, without EOS.
    max_length: the longest kept pair, EOS included (--max_length).
    batch_size: tokens per batch (per replica): R = batch_size // packed_length rows.
    packed_length: L.
    group: batch slots per step (plan.BatchPlan).
    options: seed, corpus_sizes and multiplicity, as plan.BatchPlan takes them.
  """

  def __init__(self, lengths: np.ndarray, max_length: int, batch_size: int,
               packed_length: int, group: int, options: dict):
    lengths = np.asarray(lengths).reshape([-1, 2])
    sizes = options.get("corpus_sizes") or [len(lengths)]
    multiplicity = np.asarray(options.get("multiplicity") or [1] * len(sizes), np.int64)
    padded = lengths.max(axis=1) + 1
    keep = (lengths.min(axis=1) > 0) & (padded <= max_length)
    if len(multiplicity) != len(sizes) or sum(sizes) != len(lengths):
      multiplicity, sizes = np.ones([1], np.int64), [len(lengths)]  # BatchPlan refuses
    copies = multiplicity[np.repeat(np.arange(len(sizes)), sizes)]
    per_length = np.bincount(padded[keep], weights=copies[keep],
                             minlength=max_length + 1).astype(np.int64)
    self.num_rows, self.packed_length = rows(batch_size, packed_length), packed_length
    if per_length.sum():
      self.strata, self.row_of_stratum = template(per_length, group, self.num_rows,
                                                  packed_length)
    else:  # no pair left: plan.BatchPlan says so
      self.strata, self.row_of_stratum = 1, np.zeros([1], np.int64)
    # All pairs one pool ("bucket" max_length): strata, not buckets, shape a step.
    super().__init__(lengths, [max_length], batch_size, group, options["seed"],
                     corpus_sizes=options.get("corpus_sizes"),
                     multiplicity=options.get("multiplicity"), rows=[self.strata])
    self.bounds = _stratum_bounds(per_length, group, self.strata)[1] if len(
        self.pool_pairs) else []
    self.order = np.argsort(self.row_of_stratum, kind="stable")  # strata row by row

  def share_positions(self, epoch, pool, k, share) -> tf.Tensor:
    """Positions of the k-th unit's pairs in share `share`, stratum by stratum: int64
    [q], -1 for an empty slot (past the end of the share)."""
    units = tf.constant(self.units_per_pool[0], tf.int64)
    size = tf.gather(tf.constant([self.share_size(0, v) for v in range(self.group)],
                                 tf.int64), share)
    seeds = [plan.stateless_seed(self.seed, epoch, pool + 1, share, key)
             for key in (0, 1)]
    offsets = tf.random.stateless_uniform([self.strata], seeds[1], minval=0,
                                          maxval=units, dtype=tf.int64)
    within = tf.random.experimental.index_shuffle(
        (tf.cast(k, tf.int64) + offsets) % units, seeds[0], units - 1)
    x = tf.range(self.strata, dtype=tf.int64) * units + within
    return tf.where(x < size, x, -1)

  def positions(self, epoch, pool, k, slot, per_step: int, pipelines: int,
                pipeline_id: int) -> tf.Tensor:
    """As plan.BatchPlan.positions, -1 for an empty slot."""
    held = super().positions(epoch, pool, k, slot, per_step, pipelines, pipeline_id)
    return tf.where(held >= 0, held, -1)

  def in_rows(self, positions: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """(positions of the pairs row after row, empty slots left out; int64 [R] pairs
    per row): what `pack` takes, from `positions`' [q] in stratum order."""
    positions = tf.gather(positions, self.order)
    kept = positions >= 0
    row_of = tf.boolean_mask(tf.constant(self.row_of_stratum[self.order], tf.int64), kept)
    per_row = tf.math.bincount(row_of, minlength=self.num_rows, maxlength=self.num_rows,
                               dtype=tf.int64)
    return tf.boolean_mask(positions, kept), per_row

  def unit(self, step: int, pipelines: int = 1) -> Tuple[int, np.ndarray]:
    """(0, corpus pair indices [group, q]) of global step `step`, slot by slot, in
    stratum order, -1 for an empty slot (plan.BatchPlan.unit)."""
    del pipelines  # the same batches for any number of pipelines
    number, u = divmod(step, self.units_per_epoch)
    k = int(self._epoch(number)[1][u])
    batches = []
    for share in range(self.group):
      x = self.share_positions(number, 0, k, share).numpy()
      rank = x if self.tiny(0) else share + self.group * x
      batches.append(np.where(x >= 0, self._kept_order[np.maximum(rank, 0)], -1))
    return 0, np.stack(batches)


def pack(sides: Dict[str, tf.RaggedTensor], per_row, shape: Sequence[int]
         ) -> Dict[str, tf.Tensor]:
  """Packs a batch's pairs into rows: the first per_row[0] pairs into row 0, and so on.

  Args:
    sides: {"inputs": ids, "targets": ids}, int ragged [N, None] with EOS, N =
      sum(per_row), each row's pairs fitting `shape[1]` tokens on each side.
    per_row: int [R] pairs of each row.
    shape: [R, L] of every output.

  Returns:
    {"inputs", "targets", "inputs_segmentation", "targets_segmentation",
     "inputs_position", "targets_position"}: int32 [R, L].
  """
  out = {}
  for key, ids in sides.items():
    lengths = ids.row_lengths()  # [N]
    per_row = tf.cast(per_row, lengths.dtype)
    segment = tf.ragged.range(per_row).flat_values + 1  # [N], from 1 in each row
    features = {key: ids.values,
                SEGMENTS[key]: tf.repeat(segment, lengths),
                POSITIONS[key]: tf.ragged.range(lengths).flat_values}
    for name, values in features.items():
      pairs = tf.RaggedTensor.from_row_lengths(tf.cast(values, tf.int32), lengths,
                                               validate=False)
      packed = tf.RaggedTensor.from_row_lengths(pairs, per_row, validate=False)
      row = packed.merge_dims(1, 2)  # [R, None]: a row's pairs, one after the other
      fits = tf.debugging.assert_less_equal(  # to_tensor would cut a longer row
          row.row_lengths(), tf.cast(shape[1], lengths.dtype),
          message=f"packed {key} longer than the row (a bug: see packing.py)")
      with tf.control_dependencies([fits]):
        out[name] = tf.ensure_shape(row.to_tensor(PAD_ID, shape=shape), shape)
  return out
