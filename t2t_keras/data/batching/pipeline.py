"""tf.data pipelines: filter, bucket by length, batch by a token budget, shard.

Why a token budget: sentence lengths vary from 3 to 250 subwords, so a fixed number
of sentences per batch would either waste most of a batch on padding or overflow
memory on long sentences. As in tensor2tensor, pairs are grouped into length buckets
whose boundaries start at 8 and grow by 10% (b' = max(b + 1, int(b * 1.1))) up to
max_length, and a bucket of padded length L holds batch_size // L pairs, so every
batch carries at most batch_size tokens per side. batch_size is per replica.

Bucket i holds pairs whose length (tokens + EOS, the longer side) is <= L_i. Dynamic
mode pads each batch to its longest sequence (per side). Static mode (TPU/XLA) pads
both sides to L_i with exactly batch_size // L_i rows, so a compiled step sees one
shape per bucket.

Every dataset here is a TensorFlow graph and nothing else (no py_function): Cloud TPU
pod hosts and tf.data service workers run it without the client's Python
(tests/data_service_test.py). Its first op reads the ids it needs from the cache files
(`cache.TokenizedSplit.read`, tf.io ops; gs:// works) into memory, once per iterator.

Train: empty pairs and pairs longer than max_length are dropped and counted; the
rest are batched by `plan.BatchPlan`: the whole corpus shuffled by (seed, epoch), one
bucket per step for all replicas, hosts and micro-batches, rare buckets merged into
wider ones, any step reachable at once (resume); each input pipeline holds only its
share of the pairs. Eval (`dev_batches`): never dropped, shuffled or repeated: every
pair appears exactly once, in the training buckets plus extra ones for pairs longer
than max_length; in static mode one dataset per bucket, padded with all-PAD rows and
batches (zero loss weight) so that every replica of a step gets the bucket's shape.

Elements: {"inputs": int32 [B, S], "targets": int32 [B, T]}, ids + EOS, PAD 0; with
--train_alignments, training batches also carry "alignment": float32 [B, T, S], 1 at
each (target piece, source piece) link of the pair (alignments.py).
With --packed_length=L, training batches are [R, L] rows of several pairs each, with
segment ids and positions, from the packed plan (packing.py), whose rows mix lengths.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras import PAD_ID
from t2t_keras.configs import DataConfig
from t2t_keras.data.tokens import alignments, cache
from t2t_keras.data.sources import corpora, sources
from t2t_keras.data.batching import dev_batches, packing, plan
# bucket_batch_sizes as well: the buckets' geometry is read as `pipeline.X` (tests, bench).
from t2t_keras.data.batching.buckets import (SplitStats, bucket_batch_sizes,  # noqa: F401
                                             bucket_boundaries, loaded, ragged_with_eos,
                                             split_stats)
from t2t_keras.data.tokens import tokenizer as tokenizer_lib


def load_split(config: DataConfig, split: str, tokenizer
               ) -> Optional[cache.TokenizedSplit]:
  """A split as ids: generated (synthetic) or from the tokenized cache (text); a split
of several corpora (`Source.corpora`) caches each on its own and puts them side by
side (`corpora.CorpusSplits`)."""
  source = sources.data_source(config)
  if not source.is_text:
    src, tgt, lengths = source.examples(split)
    lengths = np.stack([lengths, lengths], axis=1).astype(np.int32)
    return cache.TokenizedSplit(path=None, lengths=lengths, invalid_utf8=0,
                                groups=cache.group_by_length(src, tgt, lengths))
  key = tokenizer_lib.tokenizer_digest(tokenizer)
  parts = source.corpora(split) if source.has_split(split) else []
  if len(parts) < 2:
    tokenized = cache.tokenized_split(config, split, tokenizer, key)
    if split != "train":
      return tokenized
    return alignments.load_links(config, tokenized, tokenizer)  # --train_alignments
  return corpora.CorpusSplits(
      [cache.tokenized_split(part, split, tokenizer, key) for _, part in parts],
      [name for name, _ in parts])


def unit_slots(per_step: int) -> Callable[..., tf.data.Dataset]:
  """(epoch, pool, k) -> the unit's `per_step` batches this pipeline makes, as
  (epoch, pool, k, slot) elements."""
  def slots(epoch, pool, k):
    return tf.data.Dataset.from_tensor_slices(
        (tf.fill([per_step], epoch), tf.fill([per_step], pool), tf.fill([per_step], k),
         tf.range(per_step, dtype=tf.int64)))
  return slots


class TrainData:
  """The training split as the trainer reads it: batches of any step, at once.

  The pairs of every step come from a `plan.BatchPlan` (seeded, whole-corpus shuffle,
  one bucket per step, rare buckets merged into wider ones; with --packed_length a
  `packing.PackedPlan`, whose steps mix lengths) and are read by position,
  so starting at any step costs the same. The dataset is a TensorFlow graph only: its
  first op reads this pipeline's share of the ids (of the buckets it serves) from the
  cache files (or constants, for synthetic data) into memory, once per iterator; each
  batch is then gathered from them by `plan` ops. Plans (small host-side tables) are
  shared by all datasets of one TrainData.

  Several corpora (`corpora.CorpusSplits`) are mixed by --train_weights: `mixture`
  says how many times an epoch each corpus's pairs are trained on (None: one corpus).

  Args:
    config: data configuration; batch_size is the per-replica token budget.
    split: the tokenized training split.

  Raises:
    ConfigError: weights that no multiplicities within bounds can give
      (`corpora.mixture`).
  """

  def __init__(self, config: DataConfig, split: cache.TokenizedSplit):
    config.validate()
    self.config = config
    self.split = split
    self.static_shapes = config.static_shapes
    self.packed_length = config.packed_length  # 0: unpacked
    self.lengths = bucket_boundaries(config.bucket_min, config.max_length,
                                     config.bucket_growth)
    self.mixture = None
    sizes = split.corpus_sizes
    if len(sizes) > 1:
      lengths = split.lengths
      keep = (lengths.min(axis=1) > 0) & (lengths.max(axis=1) + 1 <= config.max_length)
      kept = np.bincount(np.repeat(np.arange(len(sizes)), sizes)[keep],
                         minlength=len(sizes))
      self.mixture = corpora.mixture(
          split.names, kept.tolist(), corpora.parse_weights(config.train_weights,
                                                            len(sizes)),
          config.train_weights_by)
    self._plans = {}
    self._lock = threading.Lock()

  def plan(self, group: int, steps_per_run: int = 1) -> plan.BatchPlan:
    """The plan for `group` batches per step (input pipelines x replicas per pipeline
    x micro-batches)."""
    with self._lock:
      key = (group, steps_per_run)
      if key not in self._plans:
        options = dict(seed=self.config.seed, corpus_sizes=self.split.corpus_sizes,
                       multiplicity=self.mixture and self.mixture.multiplicity)
        if self.packed_length:  # one shape: no runs of a bucket
          self._plans[key] = packing.PackedPlan(
              self.split.lengths, self.config.max_length, self.config.batch_size,
              self.packed_length, group, options)
        else:
          self._plans[key] = plan.BatchPlan(
              self.split.lengths, self.lengths, self.config.batch_size, group=group,
              run=steps_per_run, **options)
      return self._plans[key]

  def bucket_shape(self, bucket: int) -> List[int]:
    """[rows, length] of every batch of `bucket` with static shapes (of every batch
    when packing)."""
    if self.packed_length:
      return [packing.rows(self.config.batch_size, self.packed_length), self.packed_length]
    length = self.lengths[bucket]
    return [max(1, self.config.batch_size // length), length]

  def _check_bucket(self, bucket: Optional[int]) -> None:
    if bucket is not None and not self.static_shapes:
      raise ValueError("per-bucket datasets need static_shapes")
    if bucket is not None and self.packed_length:
      raise ValueError("packed batches have one shape for every bucket: read them "
                       "with bucket=None")

  def __call__(self, input_context: Optional[tf.distribute.InputContext] = None,
               start_step: int = 0, accum_steps: Optional[int] = None,
               bucket: Optional[int] = None, steps_per_run: int = 1,
               repeat: bool = True) -> tf.data.Dataset:
    """Batches from `start_step` on.

    Args:
      input_context: from `distribute_datasets_from_function`: this pipeline's share
        of every step (the batches of its replicas). The batch size is NOT divided
        (it is already per replica).
      start_step: the first global step to produce batches for (resume).
      accum_steps: micro-batches per replica per step (default config.accum_steps).
      bucket: only the steps that use this bucket (static shapes; a pool's bucket,
        `plan.bucket_of_step`): then every batch has the fully static shape
        `bucket_shape(bucket)`, so a compiled step (and a TPU loop) sees one shape,
        known when it is traced, and the dataset holds only that pool's pairs.
      steps_per_run: the plan's `run` (see plan.BatchPlan).
      repeat: False gives the rest of start_step's epoch (from step 0: each kept pair
        at least once; see plan.py).

    Returns:
      Dataset of {"inputs": [B, S], "targets": [B, T]} int32 (with --train_alignments
      also "alignment" float32 [B, T, S]): per step, one batch per
      micro-batch and replica this pipeline feeds (micro-batch-major). With static
      shapes, B and S = T are the bucket's rows and length. With --packed_length every
      batch is [R, L] with segment ids and positions besides (packing.py), whatever
      the bucket, so `bucket` must be None: one dataset, one shape.
    """
    accum_steps = accum_steps or self.config.accum_steps
    pipelines, pipeline_id, replicas = 1, 0, 1
    if input_context is not None:
      pipelines = max(input_context.num_input_pipelines, 1)
      pipeline_id = input_context.input_pipeline_id
      replicas = max(input_context.num_replicas_in_sync // pipelines, 1)
    per_step = replicas * accum_steps  # batches this pipeline yields per step
    batch_plan = self.plan(per_step * pipelines, steps_per_run)
    self._check_bucket(bucket)
    pools = (range(len(batch_plan.pool_bucket)) if bucket is None
             else [batch_plan.pool_of_bucket(bucket)])
    shares = [batch_plan.share(p, pipelines, pipeline_id) for p in pools]
    if min(shares) == 0:
      raise sources.DataError(
          f"{batch_plan.pool_pairs[pools[shares.index(0)]]} training pairs cannot feed "
          f"{pipelines} input pipelines; use more training data.")
    load = batch_plan.share_loader(self.split, pools, pipelines, pipeline_id)
    # Where each pool's share starts in what `load` holds.
    starts = np.zeros([len(batch_plan.pool_bucket)], np.int64)
    starts[list(pools)] = np.cumsum(shares) - shares
    first_epoch, first_unit = divmod(start_step, batch_plan.units_per_epoch)
    last_epoch = first_epoch + 1 if not repeat else np.iinfo(np.int64).max
    only = -1 if bucket is None else pools[0]
    static, widths = self.static_shapes, tf.constant(self.lengths, tf.int64)
    shape = self.bucket_shape(bucket) if bucket is not None else [None, None]
    packed_shape = self.bucket_shape(0) if self.packed_length else None

    def units(epoch):  # this epoch's (epoch, pool, k) from start_step on
      pool, k, _ = batch_plan.epoch_order(epoch)
      take = tf.range(tf.size(pool, tf.int64)) >= tf.where(
          epoch == first_epoch, tf.constant(first_unit, tf.int64), 0)
      if only >= 0:
        take &= tf.equal(pool, only)
      pool, k = tf.boolean_mask(pool, take), tf.boolean_mask(k, take)
      return tf.data.Dataset.from_tensor_slices((tf.fill(tf.shape(pool), epoch), pool, k))

    slots = unit_slots(per_step)

    def batches(src, tgt, *rest):  # rest: [links,] table: held copy -> row of src, tgt
      links, table = rest if len(rest) == 2 else (None, rest[0])

      def batch(epoch, pool, k, slot):
        positions = batch_plan.positions(epoch, pool, k, slot, per_step, pipelines, pipeline_id)
        if packed_shape:
          positions, per_row = batch_plan.in_rows(positions)
        rows = tf.gather(table, tf.gather(starts, pool) + positions)
        if packed_shape:
          return packing.pack({"inputs": ragged_with_eos(tf.gather(src, rows)),
                               "targets": ragged_with_eos(tf.gather(tgt, rows))},
                              per_row, packed_shape)
        out = {}
        for key, ids in (("inputs", src), ("targets", tgt)):
          padded = ragged_with_eos(tf.gather(ids, rows))
          if static:
            width = tf.gather(widths, tf.gather(batch_plan.pool_bucket, pool))
            out[key] = padded.to_tensor(PAD_ID, shape=tf.stack([tf.size(rows, tf.int64), width]))
          else:
            out[key] = padded.to_tensor(PAD_ID)
          out[key] = tf.ensure_shape(out[key], shape)
        if links is not None:  # --train_alignments: [B, T, S] links of the pieces
          out["alignment"] = alignments.batch_matrix(tf.gather(links, rows), out, shape)
        return out

      ds = tf.data.Dataset.range(first_epoch, last_epoch).flat_map(units).flat_map(slots)
      # One of many per-bucket datasets reads ahead one step's batches, not dozens.
      parallel = tf.data.AUTOTUNE if bucket is None else per_step
      return ds.map(batch, num_parallel_calls=parallel, deterministic=True)

    ds = loaded(load, batches)
    if bucket is None:
      return ds.prefetch(tf.data.AUTOTUNE)
    # A bucket's dataset has nothing to tune (its parallelism and buffer are fixed
    # above), and an autotuning thread per bucket iterator costs a thread each and
    # delays the iterator's deletion (training.batches.TrainBatches.release).
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.prefetch(per_step).with_options(options)


def train_dataset(config: DataConfig, tokenizer=None,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  split: Optional[cache.TokenizedSplit] = None, **kwargs
                  ) -> tf.data.Dataset:
  """Token-budget batches of the training split (see TrainData; kwargs go to its
  call). `tokenizer` is needed unless `split` is given or the source is synthetic."""
  split = split or load_split(config, "train", tokenizer)
  return TrainData(config, split)(input_context, **kwargs)


def eval_dataset(config: DataConfig, tokenizer=None,
                 input_context: Optional[tf.distribute.InputContext] = None,
                 split: Optional[cache.TokenizedSplit] = None
                 ) -> Optional[tf.data.Dataset]:
  """One pass over the dev split: every pair exactly once (`dev_batches.EvalData`).

  Args:
    config: data configuration.
    tokenizer: the tokenizer (unless `split` is given or source is synthetic).
    input_context: optional sharding, as in train_dataset.
    split: preloaded dev split.

  Returns:
    Finite dataset of {"inputs": [B, S], "targets": [B, T]}, or None without dev data.
  """
  split = split or load_split(config, "dev", tokenizer)
  if split is None:
    return None
  return dev_batches.EvalData(config, split)(input_context)


@dataclasses.dataclass(frozen=True)
class Datasets:
  """Everything a trainer needs from the data package.

  Attributes:
    tokenizer: in-graph tokenizer module (tokenize, detokenize, vocab_size); also
      the one to export with the model.
    vocab_size: ids in the (source) vocabulary (ModelConfig.vocab_size).
    target_vocab_size: ids in the target's own vocabulary (--separate_vocabularies;
      ModelConfig.target_vocab_size), else 0.
    train_fn: a TrainData: `train_fn(input_context=None, start_step=0, ...)` is the
      infinite training dataset from `start_step` on.
    eval_fn: a `dev_batches.EvalData`: `eval_fn(input_context=None)` is the one-pass
      dev dataset (static shapes: also one dataset per bucket); None without dev data.
    train_stats / eval_stats: counts of the splits (eval_stats None without dev).
  """

  tokenizer: tf.Module
  vocab_size: int
  train_fn: TrainData
  eval_fn: Optional[Callable[..., tf.data.Dataset]]
  train_stats: SplitStats
  eval_stats: Optional[SplitStats]
  target_vocab_size: int = 0


def make_datasets(config: DataConfig) -> Datasets:
  """Validates data, loads or builds vocabulary and caches, logs counts.

  Everything that can fail on bad data fails here, before a model is built.

  Raises:
    ConfigError: settings that do not go together (`DataConfig.validate`).
    sources.DataError: a source's bad settings, missing/misaligned/invalid files, or
      no training pair left.
  """
  config.validate()
  sources.data_source(config).validate()  # an unknown kind or its bad settings
  tokenizer = tokenizer_lib.load_or_build_tokenizer(config)
  train = load_split(config, "train", tokenizer)
  dev = load_split(config, "dev", tokenizer)
  train_stats = split_stats(train, config.max_length)
  logging.info("Data %s; %d training pairs kept", train_stats.summary(
      "train", config.max_length), train_stats.kept_for_training)
  if train_stats.kept_for_training == 0:
    raise sources.DataError(
        f"No training pairs left: {train_stats.summary('train', config.max_length)}. "
        "Check the training files, or raise --max_length.")
  train_fn = TrainData(config, train)
  for line in train_fn.mixture.summary() if train_fn.mixture else []:
    logging.info("%s", line)
  eval_stats = eval_fn = None
  if dev is not None:
    eval_stats = split_stats(dev, config.max_length)
    logging.info("Data %s; all kept for evaluation",
                 eval_stats.summary("dev", config.max_length))
    if eval_stats.pairs == 0:
      raise sources.DataError("The dev split is empty; fix it or leave it unset.")
    eval_fn = dev_batches.EvalData(config, dev)
  return Datasets(
      tokenizer=tokenizer, vocab_size=tokenizer.vocab_size,
      train_fn=train_fn,
      eval_fn=eval_fn, train_stats=train_stats, eval_stats=eval_stats,
      target_vocab_size=getattr(tokenizer, "target_vocab_size", 0))
