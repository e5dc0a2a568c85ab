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

Train: empty pairs and pairs longer than max_length are dropped and counted; the
rest are batched by `plan.BatchPlan`: the whole corpus shuffled by (seed, epoch), one
bucket per step for all replicas and micro-batches, any step reachable at once
(resume). Eval: never dropped, shuffled or repeated: every pair
appears exactly once; empty sides become just EOS; pairs longer than max_length are
kept in extra buckets (up to the longest pair; such a batch has at least one row even
if it then exceeds the budget), and in static mode the last batch of each bucket is
padded with all-PAD rows (zero loss weight) instead of being dropped.

Elements: {"inputs": int32 [B, S], "targets": int32 [B, T]}, ids + EOS, PAD 0.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, List, Optional

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.configs import DataConfig
from t2t_keras.data import cache, plan, sources
from t2t_keras.data import tokenizer as tokenizer_lib


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


def load_split(config: DataConfig, split: str, tokenizer
               ) -> Optional[cache.TokenizedSplit]:
  """A split as ids: generated (synthetic) or from the tokenized cache (text)."""
  source = sources.data_source(config)
  if not source.is_text:
    src, tgt, lengths = source.examples(split)
    return cache.TokenizedSplit(
        path=None, lengths=np.stack([lengths, lengths], axis=1).astype(np.int32),
        invalid_utf8=0, source=src, target=tgt)
  return cache.tokenized_split(config, split, tokenizer,
                               tokenizer_lib.tokenizer_digest(tokenizer))


_CHUNK_ROWS = 64  # Rows of similar length padded together before unbatching.


def _examples(split: cache.TokenizedSplit, input_context=None) -> tf.data.Dataset:
  """Pairs of a split, in corpus order, as {"inputs", "targets"} id vectors ending
  with EOS.

  tf.data's cost is per function call, so everything per pair is vectorized over
  batches of the split: sharding, EOS, and padding to dense rows (sorted by length, in
  chunks of similar length, so rows carry little padding). Unbatching dense rows calls
  no function. Rows may end with PAD beyond their EOS; `_trim` cuts batches to size
  (ids are never PAD inside a sequence).

  Args:
    split: the tokenized split.
    input_context: keep only this input pipeline's pairs (pair index modulo the
      number of pipelines, so shards are disjoint and balanced).
  """
  num_shards, shard = 1, 0
  if input_context is not None:
    num_shards, shard = (input_context.num_input_pipelines,
                         input_context.input_pipeline_id)

  def prepare(index, pair):
    src, tgt = pair
    src_len, tgt_len = src.row_lengths(), tgt.row_lengths()
    rows = index * cache.BATCH_ROWS + tf.range(tf.size(src_len, tf.int64))
    keep = tf.equal(rows % num_shards, shard)
    order = tf.argsort(tf.boolean_mask(tf.maximum(src_len, tgt_len), keep))
    eos = tf.fill([tf.size(order), 1], EOS_ID)
    src, tgt = (tf.concat([tf.gather(tf.ragged.boolean_mask(tf.cast(x, tf.int32), keep),
                                     order), eos], axis=1) for x in (src, tgt))
    return src, tgt

  def chunks(src, tgt):
    starts = tf.range(0, src.nrows(), _CHUNK_ROWS)
    return tf.data.Dataset.from_tensor_slices(starts).map(lambda i: {
        "inputs": src[i:i + _CHUNK_ROWS].to_tensor(PAD_ID),
        "targets": tgt[i:i + _CHUNK_ROWS].to_tensor(PAD_ID)})

  ds = split.dataset().enumerate().map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.flat_map(chunks).unbatch()


def _row_lengths(ids: tf.Tensor) -> tf.Tensor:
  return tf.math.count_nonzero(tf.not_equal(ids, PAD_ID), axis=-1, dtype=tf.int32)


def _length(example: dict) -> tf.Tensor:
  return tf.maximum(_row_lengths(example["inputs"]), _row_lengths(example["targets"]))


def _trim(batch: dict, lengths: List[int], static: bool) -> dict:
  """Cuts a padded batch to its longest sequence per side, or (static) both sides
  to the bucket's length."""
  if static:
    longest = tf.reduce_max(_length(batch))
    bucket = tf.searchsorted(tf.constant(lengths, tf.int32), longest[None])[0]
    width = tf.gather(lengths, bucket)
    return {k: tf.pad(v[:, :width], [[0, 0], [0, width - tf.minimum(
        width, tf.shape(v)[1])]]) for k, v in batch.items()}
  return {k: v[:, :tf.reduce_max(_row_lengths(v))] for k, v in batch.items()}


def _bucket(ds: tf.data.Dataset, lengths: List[int], batch_size: int, static: bool
            ) -> tf.data.Dataset:
  """Groups dev examples into the buckets of padded `lengths` (see module docstring)."""
  sizes = bucket_batch_sizes(lengths, batch_size)
  ds = ds.bucket_by_sequence_length(
      _length, bucket_boundaries=[n + 1 for n in lengths],
      bucket_batch_sizes=sizes + [1],  # Last bucket stays empty.
      padding_values={"inputs": PAD_ID, "targets": PAD_ID})
  return ds.map(lambda batch: _trim(batch, lengths, static),
                num_parallel_calls=tf.data.AUTOTUNE)


def _pad(ids: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
  """Flat ids of rows of `lengths` -> int32 [rows, width]: ids, EOS, then PAD."""
  rows = np.zeros([len(lengths), width], np.int32)
  rows[np.arange(width)[None, :] < lengths[:, None]] = ids  # row-major: row by row
  rows[np.arange(len(lengths)), lengths] = EOS_ID
  return rows


def _check_budget(config: DataConfig):
  if config.batch_size < config.max_length:
    raise ValueError(f"batch_size={config.batch_size} tokens cannot hold one pair of "
                     f"max_length={config.max_length}; raise --batch_size or lower "
                     "--max_length")


class TrainData:
  """The training split as the trainer reads it: batches of any step, at once.

  The pairs of every step come from a `plan.BatchPlan` (seeded, whole-corpus shuffle,
  one bucket per step) and are read by index, so starting at any step costs the same.
  Plans are shared by all datasets of one TrainData (per-bucket datasets of every
  input pipeline read the same plan).

  Args:
    config: data configuration; batch_size is the per-replica token budget.
    split: the tokenized training split.
  """

  def __init__(self, config: DataConfig, split: cache.TokenizedSplit):
    _check_budget(config)
    self.config = config
    self.split = split
    self.static_shapes = config.static_shapes
    self.lengths = bucket_boundaries(config.bucket_min, config.max_length,
                                     config.bucket_growth)
    self._plans = {}
    self._lock = threading.Lock()

  def plan(self, group: int, steps_per_run: int = 1) -> plan.BatchPlan:
    """The plan for `group` batches per step (replicas in sync x micro-batches)."""
    with self._lock:
      key = (group, steps_per_run)
      if key not in self._plans:
        self._plans[key] = plan.BatchPlan(self.split.lengths, self.lengths,
                                          self.config.batch_size, group=group,
                                          seed=self.config.seed, run=steps_per_run)
      return self._plans[key]

  def bucket_shape(self, bucket: int) -> List[int]:
    """[rows, length] of every batch of `bucket` with static shapes."""
    length = self.lengths[bucket]
    return [max(1, self.config.batch_size // length), length]

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
      bucket: only the steps that use this bucket (static shapes): then every batch
        has the fully static shape `bucket_shape(bucket)`, so a compiled step (and a
        TPU loop) sees one shape, known when it is traced.
      steps_per_run: the plan's `run` (see plan.BatchPlan).
      repeat: False gives one epoch (each kept pair at least once; see plan.py).

    Returns:
      Dataset of {"inputs": [B, S], "targets": [B, T]} int32: per step, one batch per
      micro-batch and replica this pipeline feeds (micro-batch-major). With static
      shapes, B and S = T are the bucket's rows and length.
    """
    accum_steps = accum_steps or self.config.accum_steps
    pipelines, pipeline_id, replicas = 1, 0, 1
    if input_context is not None:
      pipelines = max(input_context.num_input_pipelines, 1)
      pipeline_id = input_context.input_pipeline_id
      replicas = max(input_context.num_replicas_in_sync // pipelines, 1)
    per_step = replicas * accum_steps  # batches this pipeline yields per step
    batch_plan = self.plan(per_step * pipelines, steps_per_run)
    static, lengths, split = self.static_shapes, self.lengths, self.split
    if bucket is not None and not static:
      raise ValueError("per-bucket datasets need static_shapes")

    def read(element):
      k, slot = divmod(int(element), per_step)
      step = k if bucket is None else batch_plan.bucket_step(bucket, k)
      unit_bucket, pairs = batch_plan.unit(step)
      src, tgt, counts = split.gather(pairs[pipeline_id * per_step + slot])
      if static:
        widths = (lengths[unit_bucket],) * 2
      else:
        widths = counts.max(axis=0) + 1
      return (_pad(src, counts[:, 0], widths[0]), _pad(tgt, counts[:, 1], widths[1]))

    shape = self.bucket_shape(bucket) if bucket is not None else [None, None]

    def batch(element):
      inputs, targets = tf.numpy_function(read, [element], [tf.int32, tf.int32],
                                          stateful=False)
      inputs.set_shape(shape)
      targets.set_shape(shape)
      return {"inputs": inputs, "targets": targets}

    if bucket is None:
      first = start_step
      steps = batch_plan.units_per_epoch
    else:
      first = batch_plan.bucket_steps_before(bucket, start_step)
      steps = int(batch_plan.units_per_bucket[bucket])
    end = (steps if not repeat else np.iinfo(np.int64).max // per_step) * per_step
    ds = tf.data.Dataset.range(first * per_step, end)
    if bucket is None:
      ds = ds.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
      return ds.prefetch(tf.data.AUTOTUNE)
    # One of many per-bucket datasets: read ahead one step's batches, not dozens (a
    # rare bucket's next steps may lie epochs ahead; see plan.EPOCHS_KEPT).
    ds = ds.map(batch, num_parallel_calls=per_step, deterministic=True)
    return ds.prefetch(per_step)


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
  """One pass over the dev split: every pair exactly once (see module docstring).

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
  stats = split_stats(split, config.max_length)
  lengths = bucket_boundaries(config.bucket_min, max(config.max_length, stats.longest),
                              config.bucket_growth)
  ds = _examples(split, input_context)
  ds = _bucket(ds, lengths, config.batch_size, config.static_shapes)
  if config.static_shapes:
    batch_size = config.batch_size

    def pad_rows(batch):
      rows = tf.maximum(1, batch_size // tf.shape(batch["inputs"])[1])
      return {k: tf.pad(v, [[0, rows - tf.shape(v)[0]], [0, 0]])
              for k, v in batch.items()}

    ds = ds.map(pad_rows)
  return ds.prefetch(tf.data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class Datasets:
  """Everything a trainer needs from the data package.

  Attributes:
    tokenizer: in-graph tokenizer module (tokenize, detokenize, vocab_size); also
      the one to export with the model.
    vocab_size: ids in the vocabulary (ModelConfig.vocab_size).
    train_fn: a TrainData: `train_fn(input_context=None, start_step=0, ...)` is the
      infinite training dataset from `start_step` on.
    eval_fn: input_context (or None) -> one-pass dev dataset; None without dev data.
    train_stats / eval_stats: counts of the splits (eval_stats None without dev).
  """

  tokenizer: tf.Module
  vocab_size: int
  train_fn: TrainData
  eval_fn: Optional[Callable[[Optional[tf.distribute.InputContext]], tf.data.Dataset]]
  train_stats: SplitStats
  eval_stats: Optional[SplitStats]


def make_datasets(config: DataConfig) -> Datasets:
  """Validates data, loads or builds vocabulary and caches, logs counts.

  Everything that can fail on bad data fails here, before a model is built.

  Raises:
    sources.DataError: missing/misaligned/invalid files, or no training pair left.
  """
  sources.data_source(config)  # an unknown kind fails here, naming the ones there are
  _check_budget(config)
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
  eval_stats = eval_fn = None
  if dev is not None:
    eval_stats = split_stats(dev, config.max_length)
    logging.info("Data %s; all kept for evaluation",
                 eval_stats.summary("dev", config.max_length))
    if eval_stats.pairs == 0:
      raise sources.DataError("The dev split is empty; fix it or leave it unset.")
    eval_fn = lambda ctx=None: eval_dataset(config, input_context=ctx, split=dev)  # noqa: E731
  return Datasets(
      tokenizer=tokenizer, vocab_size=tokenizer.vocab_size,
      train_fn=TrainData(config, train),
      eval_fn=eval_fn, train_stats=train_stats, eval_stats=eval_stats)
