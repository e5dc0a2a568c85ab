"""The batch plan: which pairs make up each training step, derived from (seed, step).

Why a plan on the host instead of a tf.data shuffle-and-bucket chain:
- Resume in constant time. A restart at step s computes the epoch of s (one
  permutation of the corpus, about a second for millions of pairs) and reads the
  pairs of step s directly (`cache.TokenizedSplit.gather`). Replaying a stateful
  pipeline to step s took time proportional to s (14 minutes at 100k batches).
- One bucket per global step. Each step (unit) is `group` batches of one bucket, where
  group = replicas in sync x accumulated micro-batches: every replica, on every
  worker, and every micro-batch of a step gets the same shape, which TPUs need (XLA
  compiles per shape). Every worker computes the same plan from the seed and takes
  its own batches of each unit, so no coordination is needed and the pairs of an
  epoch are partitioned across workers.
- The whole corpus is shuffled, not a window of it: a corpus made by concatenating
  domains (Europarl, Common Crawl, News Commentary) is mixed from the first step.

An epoch: the kept pairs (no empty side, at most max_length ids with EOS) are put in a
random order (seed, epoch), stably grouped by bucket, and each bucket is cut into
units of `group` batches of `rows` pairs (batch_size // bucket length, as in t2t).
A bucket's last unit is completed with pairs from the start of the same bucket, so
every kept pair is trained on at least once per epoch and at most a unit's worth
of pairs per bucket is seen twice (no pair is ever dropped, however small the corpus).
Then the units are shuffled, in runs of up to `run` consecutive units of one bucket (run
> 1 with static shapes and several steps per compiled call: one loop, one shape; a
bucket's last run may be shorter, and the trainer's call then runs fewer steps). The
number of units per epoch depends only on the bucket
counts, so step s lies in epoch s // units_per_epoch.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import List, Tuple

import numpy as np


EPOCHS_KEPT = 8  # epochs of the plan kept in memory (BatchPlan.epoch)


@dataclasses.dataclass(frozen=True)
class Epoch:
  """One epoch's units: unit u is `pairs[offsets[u]:offsets[u + 1]]`, `bucket[u]`."""

  pairs: np.ndarray  # pair indices, unit after unit
  offsets: np.ndarray  # [units + 1]
  bucket: np.ndarray  # [units]
  run_end: np.ndarray  # [units]: the unit after the last one of each unit's run


class BatchPlan:
  """Deterministic units of training batches for every step (see module docstring).

  Args:
    lengths: int [N, 2] (source, target) token counts of the pairs, without EOS.
    boundaries: the buckets' padded lengths (`pipeline.bucket_boundaries`), the last
      one max_length.
    batch_size: tokens per batch (per replica).
    group: batches per step, all replicas and micro-batches together.
    seed: the run's seed; the same seed gives the same plan on every worker.
    run: consecutive steps that share a bucket (the steps of one compiled call with
      --steps_per_loop, so that a TPU loop runs on one shape); see `steps_left_in_run`.
  """

  def __init__(self, lengths: np.ndarray, boundaries: List[int], batch_size: int,
               group: int, seed: int, run: int = 1):
    lengths = np.asarray(lengths).reshape([-1, 2])
    padded = lengths.max(axis=1) + 1  # with EOS, the longer side
    keep = (lengths.min(axis=1) > 0) & (padded <= boundaries[-1])
    # The kept pairs; int32 while it fits (an epoch's plan is 4 bytes a pair).
    self.indices = np.flatnonzero(keep).astype(
        np.int32 if len(lengths) < 2**31 else np.int64)
    self.bucket_of = np.searchsorted(np.asarray(boundaries), padded[keep]).astype(
        np.int16)  # bucket i holds lengths <= boundaries[i]
    self.rows = [max(1, batch_size // length) for length in boundaries]
    self.group = group
    self.seed = seed
    counts = np.bincount(self.bucket_of, minlength=len(boundaries))
    per_unit = np.asarray(self.rows) * group
    self.counts = counts
    self.run = run
    self.units_per_bucket = -(-counts // per_unit)
    self.units_per_epoch = int(self.units_per_bucket.sum())
    if self.units_per_epoch == 0:
      raise ValueError("no training pair fits a bucket: every pair is empty or longer "
                       f"than max_length={boundaries[-1]}")
    self._lock = threading.Lock()
    self._epochs = collections.OrderedDict()  # the epochs used last (LRU)
    self._making = {}  # epoch number -> lock held by the thread computing it
    self._positions = {}  # (epoch, bucket) -> the epoch's steps of that bucket

  def epoch(self, number: int) -> Epoch:
    """The units of epoch `number`.

    The EPOCHS_KEPT epochs used last are kept: per-bucket datasets read ahead by
    different amounts, so a rare bucket's next steps may lie several epochs ahead of
    the others'. An epoch is computed outside the shared lock (map threads that need
    another epoch do not wait), once: threads that need the same epoch wait for the
    one computing it.
    """
    with self._lock:
      if number in self._epochs:
        self._epochs.move_to_end(number)
        return self._epochs[number]
      making = self._making.setdefault(number, threading.Lock())
    with making:
      with self._lock:
        if number in self._epochs:  # made by another thread while this one waited
          self._epochs.move_to_end(number)
          return self._epochs[number]
      epoch = self._make_epoch(number)
      with self._lock:
        self._epochs[number] = epoch
        self._making.pop(number, None)
        while len(self._epochs) > EPOCHS_KEPT:
          old, _ = self._epochs.popitem(last=False)
          self._positions = {k: v for k, v in self._positions.items() if k[0] != old}
        return epoch

  def steps_left_in_run(self, step: int) -> int:
    """Steps from `step` on (itself included) that are sure to share its bucket."""
    number, u = divmod(step, self.units_per_epoch)
    return int(self.epoch(number).run_end[u]) - u

  def bucket_of_step(self, step: int) -> int:
    number, u = divmod(step, self.units_per_epoch)
    return int(self.epoch(number).bucket[u])

  def _bucket_positions(self, number: int, bucket: int) -> np.ndarray:
    epoch = self.epoch(number)
    with self._lock:
      key = (number, bucket)
      if key not in self._positions:
        self._positions[key] = np.flatnonzero(epoch.bucket == bucket)
      return self._positions[key]

  def bucket_steps_before(self, bucket: int, step: int) -> int:
    """How many steps before `step` (since step 0) use `bucket`."""
    number, u = divmod(step, self.units_per_epoch)
    positions = self._bucket_positions(number, bucket)
    return number * int(self.units_per_bucket[bucket]) + int(
        np.searchsorted(positions, u))

  def bucket_step(self, bucket: int, k: int) -> int:
    """The global step of the k-th step (from 0) that uses `bucket`."""
    number, i = divmod(k, int(self.units_per_bucket[bucket]))
    return number * self.units_per_epoch + int(self._bucket_positions(number, bucket)[i])

  def _make_epoch(self, number: int) -> Epoch:
    rng = np.random.default_rng([self.seed, number])
    shuffled = rng.permutation(len(self.indices))
    by_bucket = shuffled[np.argsort(self.bucket_of[shuffled], kind="stable")]
    pairs, sizes, buckets = [], [], []
    start = 0
    for b, count in enumerate(self.counts):
      mine = by_bucket[start:start + count]
      start += count
      units = int(self.units_per_bucket[b])
      if units:
        unit_size = self.rows[b] * self.group
        pairs.append(np.resize(mine, units * unit_size))  # repeats from its start
        sizes += [unit_size] * units
        buckets += [b] * units
    # Runs: up to `run` consecutive units of one bucket, shuffled as wholes.
    run_first, run_size, unit = [], [], 0
    for units in self.units_per_bucket.tolist():
      for start in range(0, units, self.run):
        run_first.append(unit + start)
        run_size.append(min(self.run, units - start))
      unit += units
    run_first, run_size = np.asarray(run_first, np.int64), np.asarray(run_size, np.int64)
    shuffled_runs = rng.permutation(len(run_first))
    starts, lengths = run_first[shuffled_runs], run_size[shuffled_runs]
    order = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(
        int(lengths.sum()))
    run_end = np.repeat(np.cumsum(lengths), lengths)
    unit_pairs = np.concatenate(pairs) if pairs else np.zeros([0], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    # Shuffle whole units: reorder the (start, size) segments.
    starts = offsets[:-1][order]
    sizes = np.asarray(sizes)[order]
    index = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes) + np.arange(
        int(sizes.sum()))
    return Epoch(pairs=self.indices[unit_pairs[index]].astype(self.indices.dtype),
                 offsets=np.concatenate([[0], np.cumsum(sizes)]),
                 bucket=np.asarray(buckets)[order], run_end=run_end)

  def unit(self, step: int) -> Tuple[int, np.ndarray]:
    """(bucket, pair indices [group, rows]) of global step `step`."""
    number, u = divmod(step, self.units_per_epoch)
    epoch = self.epoch(number)
    bucket = int(epoch.bucket[u])
    pairs = epoch.pairs[epoch.offsets[u]:epoch.offsets[u + 1]]
    return bucket, pairs.reshape([self.group, self.rows[bucket]])
