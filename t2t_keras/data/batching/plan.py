"""The batch plan: which pairs make up each training step, as TensorFlow ops of
(seed, epoch, position).

Why a plan instead of a tf.data shuffle-and-bucket chain:
- Resume in constant time. A restart at step s finds the epoch of s by division and
  computes the pairs of step s directly; replaying a stateful pipeline to step s took
  time proportional to s (docs/benchmarks.md, "Resume time").
- One bucket per global step. Each step (unit) is `group` batches of one bucket, where
  group = input pipelines x replicas per pipeline x accumulated micro-batches: every
  replica, on every host, and every micro-batch of a step gets the same shape, which
  TPUs need (XLA compiles per shape). Every host computes the same unit order from the
  seed and no coordination is needed.
- The whole corpus is shuffled, not a window of it: a corpus made by concatenating
  domains (Europarl, Common Crawl, News Commentary) is mixed from the first step.
- No Python in the dataset graph. Everything per step is a TensorFlow op
  (`tf.random.experimental.index_shuffle`, a stateless permutation evaluated at any
  position without materializing it; stateless seeds folded from (seed, epoch, ...)),
  so a Cloud TPU host or a tf.data service worker runs the input without the client.
  The host side computes only small tables at construction (counts per bucket).

Pools. The kept pairs (no empty side, at most max_length ids with EOS) are counted per
bucket. A bucket too rare to fill one unit (`group` batches of its rows = batch_size //
its length, as in t2t) is merged into the next wider bucket: its pairs are padded to the
wider length rather than repeated to fill a unit (a run of rare long pairs is not
trained on several times an epoch). If the widest pool is still too small, the one
below joins it. A pool is named by its widest bucket.

Shares and hosts. A pool's pairs, in (length, corpus) order, are dealt into `group`
shares (ranks g, g + group, ...: a balanced interleave, so each share mixes all
domains), one per batch slot of a step: the batch in slot g of every unit comes from a
permutation of share g, seeded by (seed, epoch, pool, g). An epoch of a pool has
ceil(pairs / (group x rows)) units, enough for every share, and a share's last unit is
completed with pairs from the start of its permutation (fewer than one unit's worth
per pool). So every kept pair is trained on once per epoch, and at most `group x rows`
pairs per pool twice. Input pipeline h of P feeds slots h x group / P onwards and holds
only those shares (`pipeline.TrainData` reads just those ids): a host holds 1 / P of
the corpus, and the pairs of a step do not depend on P, nor on how a pipeline's
batches are split among its replicas and micro-batches: 2 workers train on the batches
of one process with 2 replicas, and of 1 replica accumulating 2 micro-batches.

Several corpora (corpora.py). The pairs are numbered corpus after corpus, and each
pair of corpus c stands for m_c copies (its multiplicity): in a length's block of
ranks, each corpus's pairs of that length come m_c times over (copy j of its t-th pair
at j x a_c + t, a_c its pairs of the length), so the copies are dealt to the shares like
any pair, an epoch trains each m_c times, and everything above counts copies (pool
sizes, units, shares). A pipeline holds each pair's ids once and a table from its
copies' positions to those rows (`share_loader`). With one corpus (m = 1) the ranks,
and so the batches, are those of a plan without corpora.

Order. The units are shuffled, in runs of up to `run` consecutive units of one pool
(run > 1 with static shapes and several steps per compiled call: one loop, one shape;
a pool's last run may be shorter, and the trainer's call then runs fewer steps). The
number of units per epoch depends only on the counts, so step s lies in epoch
s // units_per_epoch, and its unit is found from one permutation of the epoch's runs
(thousands of elements, computed once per epoch by the dataset).
"""

from __future__ import annotations

import collections
import functools
import threading
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from t2t_keras.data.tokens import alignments
from t2t_keras.training import distribute

EPOCHS_KEPT = 8  # epochs of the unit order the host keeps (bucket_of_step)


def stateless_seed(seed: int, *keys) -> tf.Tensor:
  """A stateless seed [2] for (seed, *keys): each key folded in."""
  out = tf.constant([seed, 0], tf.int64)
  for key in keys:
    out = tf.cast(tf.random.experimental.stateless_fold_in(out, tf.cast(key, tf.int64)),
                  tf.int64)
  return out


def _pools(counts: np.ndarray, unit: np.ndarray) -> List[List[int]]:
  """[widest bucket, pairs] of each pool: rare buckets merged upwards (see above)."""
  nonempty = np.flatnonzero(counts)
  pools, carry = [], 0
  for b in range(int(nonempty[-1]) + 1 if len(nonempty) else 0):
    carry += int(counts[b])
    if carry and (carry >= unit[b] or b == nonempty[-1]):
      pools.append([b, carry])
      carry = 0
  while len(pools) > 1 and pools[-1][1] < unit[pools[-1][0]]:
    pools[-1][1] += pools.pop(-2)[1]
  return pools


class BatchPlan:
  """Deterministic units of training batches for every step (see module docstring).

  Args:
    lengths: int [N, 2] (source, target) token counts of the pairs, without EOS.
    boundaries: the buckets' padded lengths (`pipeline.bucket_boundaries`), the last
      one max_length.
    batch_size: tokens per batch (per replica).
    group: batches per step, all input pipelines, replicas and micro-batches together.
    seed: the run's seed; the same seed gives the same plan on every host.
    run: consecutive steps that share a pool (the steps of one compiled call with
      --steps_per_loop, so that a TPU loop runs on one shape); see `steps_left_in_run`.
    corpus_sizes: pairs of each corpus, whose pairs `lengths` holds corpus after corpus
      (default: one corpus).
    multiplicity: copies of each corpus's pairs an epoch (`corpora.Mixture`; default
      1 each).
    rows: pairs per batch of each bucket (default batch_size // its length, as in t2t;
      packing.PackedPlan's strata with --packed_length).
  """

  def __init__(self, lengths: np.ndarray, boundaries: Sequence[int], batch_size: int,
               group: int, seed: int, run: int = 1,
               corpus_sizes: Optional[Sequence[int]] = None,
               multiplicity: Optional[Sequence[int]] = None,
               rows: Optional[Sequence[int]] = None):
    lengths = np.asarray(lengths).reshape([-1, 2])
    padded = lengths.max(axis=1) + 1 if len(lengths) else np.zeros([0], np.int64)
    keep = (lengths.min(axis=1) > 0) & (padded <= boundaries[-1]) if len(lengths) else (
        padded > 0)
    sizes = list(corpus_sizes or [len(lengths)])
    if sum(sizes) != len(lengths):
      raise ValueError(f"corpus_sizes={sizes} do not add up to the {len(lengths)} pairs")
    self.multiplicity = np.asarray(multiplicity or [1] * len(sizes), np.int64)
    if len(self.multiplicity) != len(sizes) or (self.multiplicity < 1).any():
      raise ValueError(f"multiplicity={list(self.multiplicity)}: one positive integer "
                       f"per corpus of {sizes}")
    self._corpus = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    self.boundaries = list(boundaries)
    self.rows = list(rows or [max(1, batch_size // length) for length in boundaries])
    self.group, self.seed, self.run = group, seed, run
    self.counts = np.bincount(  # kept pairs per bucket, copies counted
        np.searchsorted(self.boundaries, padded[keep]), minlength=len(boundaries),
        weights=self.multiplicity[self._corpus[keep]]).astype(np.int64)
    pools = _pools(self.counts, np.asarray(self.rows) * group)
    if not pools:
      raise ValueError("no training pair fits a bucket: every pair is empty or longer "
                       f"than max_length={boundaries[-1]}")
    self.pool_bucket = [b for b, _ in pools]  # pool -> its (widest) bucket
    self.pool_pairs = [n for _, n in pools]
    self.units_per_pool = [-(-n // (group * self.rows[b])) for b, n in pools]
    self.units_per_epoch = int(sum(self.units_per_pool))
    # Runs: up to `run` consecutive units of one pool, shuffled as wholes.
    runs = [(p, k, min(run, units - k)) for p, units in enumerate(self.units_per_pool)
            for k in range(0, units, run)]
    self._runs = np.asarray(runs, np.int64).reshape([-1, 3])
    self._lengths = lengths  # the caller's array (a view, not a copy)
    self._lock = threading.Lock()
    self._epochs = collections.OrderedDict()  # epoch -> (pool, k, run_end) numpy

  def pool_of_bucket(self, bucket: int) -> int:
    if bucket not in self.pool_bucket:
      raise ValueError(f"bucket {bucket} is no pool of this plan ({self.pool_bucket})")
    return self.pool_bucket.index(bucket)

  def pool_lengths(self, pool: int) -> Tuple[int, int]:
    """(shortest, longest] padded lengths of a pool's pairs."""
    below = self.pool_bucket[pool - 1] if pool else -1
    return (self.boundaries[below] if below >= 0 else 0,
            self.boundaries[self.pool_bucket[pool]])

  def tiny(self, pool: int) -> bool:
    """A pool of fewer pairs than `group` (only a corpus smaller than one step makes
    one): every share is the whole pool, and every pipeline holds it."""
    return self.pool_pairs[pool] < self.group

  def share_size(self, pool: int, share: int) -> int:
    """Pairs of `pool` in share `share` (of `group`): ranks share, share + group, ..."""
    if self.tiny(pool):
      return self.pool_pairs[pool]
    return len(range(share, self.pool_pairs[pool], self.group))

  def share(self, pool: int, pipelines: int, pipeline_id: int) -> int:
    """Pairs of `pool` held by input pipeline `pipeline_id` of `pipelines`: the shares
    of its batch slots."""
    if self.tiny(pool):
      return self.pool_pairs[pool]
    per_step = self.group // pipelines
    return sum(self.share_size(pool, pipeline_id * per_step + j) for j in range(per_step))

  # Graph side: TensorFlow ops, used by the dataset and (eagerly) by the host.

  def epoch_order(self, epoch) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The units of `epoch` in training order: (pool, k, run_end), int64 [units]:
    position u trains the k-th unit of `pool`; its run ends before run_end[u]."""
    runs = tf.constant(self._runs)
    count = tf.shape(runs, out_type=tf.int64)[0]
    order = tf.random.experimental.index_shuffle(
        tf.range(count), stateless_seed(self.seed, epoch, 0), count - 1)  # position -> run
    sizes = tf.gather(runs[:, 2], order)
    ends = tf.cumsum(sizes)
    run_of_unit = tf.repeat(order, sizes)
    offset = tf.range(tf.reduce_sum(sizes)) - tf.repeat(ends - sizes, sizes)
    return (tf.gather(runs[:, 0], run_of_unit),
            tf.gather(runs[:, 1], run_of_unit) + offset, tf.repeat(ends, sizes))

  def share_positions(self, epoch, pool, k, share) -> tf.Tensor:
    """Rows of the k-th unit of `pool` in share `share` (its batch slot of the step):
    int64 [rows] positions x in the share (the pool's pairs of rank share + group x)."""
    rows = tf.gather(tf.constant(self.rows, tf.int64), tf.gather(self.pool_bucket, pool))
    sizes = tf.constant([[self.share_size(p, v) for v in range(self.group)]
                         for p in range(len(self.pool_bucket))], tf.int64)
    size = tf.gather(tf.gather(sizes, pool), share)
    first = tf.cast(k, tf.int64) * rows
    wrapped = (first + tf.range(rows)) % size  # a share's last unit: from its start
    return tf.random.experimental.index_shuffle(
        wrapped, stateless_seed(self.seed, epoch, pool + 1, share), size - 1)

  def positions(self, epoch, pool, k, slot, per_step: int, pipelines: int,
                pipeline_id: int) -> tf.Tensor:
    """Rows of batch `slot` (of `per_step` per pipeline) of the k-th unit of `pool`:
    int64 [rows] positions in what this pipeline holds of the pool (`share_loader`).

    The batch of global slot g = pipeline_id x per_step + slot comes from share g
    whatever the number of pipelines: the pipeline holds, in rank order, the pairs whose
    rank r has (r mod group) // per_step == pipeline_id, so share g's x-th pair (rank
    g + group x) is its (x per_step + slot)-th.
    """
    del pipelines
    share = pipeline_id * per_step + tf.cast(slot, tf.int64)
    x = self.share_positions(epoch, pool, k, share)
    tiny = tf.gather([self.tiny(p) for p in range(len(self.pool_bucket))], pool)
    return tf.where(tiny, x, x * per_step + tf.cast(slot, tf.int64))

  def share_loader(self, split, pools: Sequence[int], pipelines: int,
                   pipeline_id: int) -> Callable[[], Tuple[tf.RaggedTensor, ...]]:
    """TF ops holding input pipeline `pipeline_id`'s share of `pools` (see Hosts):
    (source, target) ragged ids [pairs, None], with --train_alignments each pair's
    ragged flat piece links after them, and the int64 [copies] rows of them in
    the order `positions` indexes (pool after pool); they read only the files of the
    pools' lengths. Each pair's ids are held once, however many copies of it the
    pipeline trains on (several corpora); with one corpus the rows are 0, 1, ...

    Args:
      split: a `cache.TokenizedSplit` (its `reader` ops and `present` lengths).
      pools: ascending pool indices.
      pipelines: input pipelines in all.
      pipeline_id: this one.
    """
    per_corpus = self._kept_per_length_corpus  # [length, corpus]
    kept_per_length = per_corpus.sum(axis=1)
    copies = per_corpus @ self.multiplicity  # ranks per length
    files, offsets, whole = [], [], []  # offsets: ranks of each file's first kept pair
    for p in pools:
      lo, hi = self.pool_lengths(p)
      present = [n for n in split.present if lo < n <= hi]
      files += present
      offsets += (np.cumsum(copies[present]) - copies[present]).tolist()
      whole += [self.tiny(p)] * len(present)  # held by every pipeline
    path, multiplicity = split.path, self.multiplicity.tolist()
    linked = getattr(split, "alignments", None) is not None
    per_step = self.group // pipelines

    def ranked(kept, counts):  # kept pairs of a length -> their copies in rank order
      if all(m == 1 for m in multiplicity):
        return kept
      ends = tf.cumsum(counts)
      return tf.concat([tf.tile(kept[ends[c] - counts[c]:ends[c]], [m])
                        for c, m in enumerate(multiplicity)], axis=0)

    def load():
      # One tf.while_loop over the files, one length an iteration: the graph has the
      # ops of one length whatever their number (unrolled, 256 lengths made a dataset
      # graph that took half a minute to build and start), and the iterations run one
      # after another, so the peak holds one file's ids besides what is kept.
      if not files:
        empty = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int32),
                                                 tf.zeros([0], tf.int64))
        return (empty, empty) + ((empty,) if linked else ()) + (tf.zeros([0], tf.int64),)
      read_at = split.reader(files)
      read_links = linked and alignments.reader(split.alignments, files)
      lengths = tf.constant(files, tf.int64)
      expected = tf.constant(kept_per_length[files], tf.int64)
      counts_of = tf.constant(per_corpus[files], tf.int64)
      first_rank = tf.constant(offsets, tf.int64)
      held_by_all = tf.constant(whole, tf.bool)

      def body(i, held, arrays):
        src, tgt, counts = read_at(i)
        kept = tf.where(tf.reduce_min(counts, axis=1) > 0)[:, 0]
        check = tf.debugging.Assert(
            tf.equal(tf.size(kept, tf.int64), expected[i]),
            [tf.strings.join([
                f"the cache files of {path} for padded length ",
                tf.strings.as_string(lengths[i]), " disagree with its lengths.npy: "
                "delete that directory and rerun to tokenize again"])])
        with tf.control_dependencies([check]):
          kept = ranked(kept, counts_of[i])
          rank = first_rank[i] + tf.range(tf.size(kept, tf.int64))
        mine = tf.boolean_mask(kept, tf.equal(rank % self.group // per_step, pipeline_id)
                               | held_by_all[i])
        rows, table = tf.unique(mine, out_idx=tf.int64)  # in order: 0, 1, ... at m = 1
        values = []
        for side, ids in enumerate((src, tgt)):
          chosen = tf.gather(tf.RaggedTensor.from_row_lengths(ids, counts[:, side]), rows)
          values += [chosen.flat_values, tf.cast(chosen.row_lengths(), tf.int64)]
        if linked:  # --train_alignments: each pair's flat piece links, with its ids
          links, per_pair = read_links(i)
          chosen = tf.gather(tf.RaggedTensor.from_row_lengths(links, 2 * per_pair), rows)
          values += [chosen.flat_values, tf.cast(chosen.row_lengths(), tf.int64)]
        values.append(held + table)
        arrays = [a.write(i, v) for a, v in zip(arrays, values)]
        return i + 1, held + tf.size(rows, tf.int64), arrays

      arrays = [tf.TensorArray(dtype, size=len(files), infer_shape=False,
                               element_shape=tf.TensorShape([None]))
                for dtype in (tf.int32, tf.int64) * (3 if linked else 2) + (tf.int64,)]
      _, _, arrays = tf.while_loop(
          lambda i, held, arrays: i < len(files), body,
          (tf.constant(0), tf.constant(0, tf.int64), arrays), parallel_iterations=1)
      flat = [a.concat() for a in arrays]
      return tuple(tf.RaggedTensor.from_row_lengths(flat[k], flat[k + 1], validate=False)
                   for k in range(0, len(flat) - 1, 2)) + (flat[-1],)

    return load

  # Host side.

  @functools.cached_property
  def _kept_per_length_corpus(self) -> np.ndarray:
    """Pairs with no empty side, per padded length (up to max_length) and corpus."""
    lengths, corpora = self._lengths, len(self.multiplicity)
    keep = lengths.min(axis=1) > 0
    padded = lengths.max(axis=1)[keep] + 1
    rows = max(self.boundaries[-1], int(padded.max()) if len(padded) else 0) + 1
    return np.bincount(padded * corpora + self._corpus[keep], minlength=rows * corpora
                       ).reshape([rows, corpora])[:self.boundaries[-1] + 1]

  @functools.cached_property
  def _kept_order(self) -> np.ndarray:
    """The kept pairs' copies in rank order: by padded length, then corpus order, each
    corpus's pairs of a length m_c times over (for `unit`)."""
    padded = self._lengths.max(axis=1) + 1
    kept = np.flatnonzero((self._lengths.min(axis=1) > 0) & (padded <= self.boundaries[-1]))
    order = kept[np.argsort(padded[kept], kind="stable")]
    if (self.multiplicity == 1).all():
      return order
    key = padded[order] * len(self.multiplicity) + self._corpus[order]
    blocks = np.split(order, np.flatnonzero(np.diff(key)) + 1)
    return np.concatenate([np.tile(b, self.multiplicity[self._corpus[b[0]]])
                           for b in blocks])

  def _epoch(self, number: int) -> Tuple[np.ndarray, ...]:
    with self._lock:
      if number in self._epochs:
        self._epochs.move_to_end(number)
        return self._epochs[number]
    # This process's CPU: under a remote master (a pod slice) "/cpu:0" is the master's,
    # where these eager ops fail ("Seed must have shape [3]": index_shuffle's shape
    # check sees a remote input's shape as unknown), one network round trip each.
    with tf.device(distribute.client_cpu()):
      epoch = tuple(t.numpy() for t in self.epoch_order(tf.constant(number, tf.int64)))
    with self._lock:
      self._epochs[number] = epoch
      while len(self._epochs) > EPOCHS_KEPT:
        self._epochs.popitem(last=False)
    return epoch

  def bucket_of_step(self, step: int) -> int:
    """The bucket (of the pool) every batch of global step `step` is padded to."""
    number, u = divmod(step, self.units_per_epoch)
    return self.pool_bucket[int(self._epoch(number)[0][u])]

  def steps_left_in_run(self, step: int) -> int:
    """Steps from `step` on (itself included) that are sure to share its bucket."""
    number, u = divmod(step, self.units_per_epoch)
    return int(self._epoch(number)[2][u]) - u

  def unit(self, step: int, pipelines: int = 1) -> Tuple[int, np.ndarray]:
    """(bucket, corpus pair indices [group, rows]) of global step `step`, batch slot by
    slot (pipeline 0's slots, then 1's, ...): what the input reads, for tests and tools;
    the same for any number of `pipelines`."""
    number, u = divmod(step, self.units_per_epoch)
    pools, ks, _ = self._epoch(number)
    pool, k = int(pools[u]), int(ks[u])
    start = sum(self.pool_pairs[:pool])
    del pipelines  # the same batches for any number of pipelines
    batches = []
    for share in range(self.group):
      x = self.share_positions(number, pool, k, share).numpy()
      rank = x if self.tiny(pool) else share + self.group * x
      batches.append(self._kept_order[start + rank])
    return self.pool_bucket[pool], np.stack(batches)
