"""The dev split as evaluation reads it: every pair exactly once, in length buckets.

Evaluation never drops, shuffles or repeats a pair: empty sides become just EOS, and
pairs longer than max_length are kept in extra buckets beyond the training ones (up to
the longest pair; such a batch has at least one row even if it then exceeds the
budget). The buckets are the training buckets (`--min_length_bucket`, `--max_length`,
`--length_bucket_step`) followed by those extra ones.

Dynamic shapes pad each batch to its longest sequence per side; the evaluation step is
traced for relaxed shapes, which graph mode runs at any shape.

Static shapes (TPU/XLA) must give a compiled program one shape, known when it is traced,
on every replica of a step. A dev set breaks that three ways: a step's batches may
straddle two buckets (replicas get different shapes), a bucket's last batch is partly
filled, and a bucket's batches rarely divide among the replicas. So in static mode the
evaluation reads one dataset per bucket (`__call__(bucket=b)`): every batch is
`[batch_size // L, L]` on both sides, the last one filled with all-PAD rows, and the
bucket's batches are made up to whole steps with all-PAD batches. All-PAD targets carry
zero loss weight, so the sums (loss, tokens) are those of dynamic evaluation. The
trainer runs one compiled program per bucket that holds a dev pair
(`Trainer.evaluate`), its number of steps known here (`steps`).

Packed rows (--packed_length=L with static shapes): the dev pairs of at most L tokens
a side are packed into rows of L, first-fit-decreasing by their longer side, batches of
`batch_size // L` rows, as training packs them (packing.py): one program for all of
them (`PACKED`, a bucket of its own), with the loss of each pair alone. A dev pair
longer than L keeps its (extra) bucket. The rows are packed in the dataset graph once
per pass; the host packs the same lengths to know the number of rows (first fit
decreasing depends only on the sorted sizes, so both count the same rows).

Like the training data, each dataset is a TensorFlow graph with no Python call; its
first op reads the bucket's pairs from the cache files (every input pipeline reads the
whole bucket, a dev set being small, and keeps the batches of its replicas).
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import tensorflow as tf

from t2t_keras import PAD_ID
from t2t_keras.configs import DataConfig
from t2t_keras.data.tokens import cache
from t2t_keras.data.batching import buckets, packing

_CHUNK_ROWS = 64  # Rows of similar length padded together before unbatching.
PACKED = -1  # the "bucket" of packed rows (module docstring)


def _examples(split: cache.TokenizedSplit, input_context=None) -> tf.data.Dataset:
  """Every pair of a split, by length, as {"inputs", "targets"} id vectors ending
  with EOS.

  tf.data's cost is per function call, so the pairs are padded to dense rows in chunks
  of similar length (they are read by length), and unbatching dense rows calls no
  function. Rows may end with PAD beyond their EOS; `_trim` cuts batches to size
  (ids are never PAD inside a sequence).

  Args:
    split: the tokenized split.
    input_context: keep only this input pipeline's pairs (every num_input_pipelines-th
      in reading order, so shards are disjoint and balanced).
  """
  num_shards, shard = 1, 0
  if input_context is not None:
    num_shards, shard = (input_context.num_input_pipelines,
                         input_context.input_pipeline_id)

  def load():
    src, tgt, lengths = split.read(split.present)
    mine = tf.range(shard, tf.shape(lengths)[0], num_shards)
    return tuple(
        buckets.ragged_with_eos(
            tf.gather(tf.RaggedTensor.from_row_lengths(x, lengths[:, i]), mine))
        for i, x in enumerate((src, tgt)))

  def chunks(src, tgt):
    starts = tf.range(0, src.nrows(), _CHUNK_ROWS)
    return tf.data.Dataset.from_tensor_slices(starts).map(lambda i: {
        "inputs": src[i:i + _CHUNK_ROWS].to_tensor(PAD_ID),
        "targets": tgt[i:i + _CHUNK_ROWS].to_tensor(PAD_ID)})

  return buckets.loaded(load, chunks).unbatch()


def _row_lengths(ids: tf.Tensor) -> tf.Tensor:
  return tf.math.count_nonzero(tf.not_equal(ids, PAD_ID), axis=-1, dtype=tf.int32)


def _length(example: dict) -> tf.Tensor:
  return tf.maximum(_row_lengths(example["inputs"]), _row_lengths(example["targets"]))


def _trim(batch: dict) -> dict:
  """Cuts a padded batch to its longest sequence per side."""
  return {k: v[:, :tf.reduce_max(_row_lengths(v))] for k, v in batch.items()}


def _dynamic_batches(ds: tf.data.Dataset, lengths: List[int], batch_size: int
                     ) -> tf.data.Dataset:
  """Groups dev examples into the buckets of padded `lengths`, each batch cut to its
  content (dynamic shapes)."""
  sizes = buckets.bucket_batch_sizes(lengths, batch_size)
  ds = ds.bucket_by_sequence_length(
      tf.autograph.experimental.do_not_convert(_length), bucket_boundaries=[n + 1 for n in lengths],
      bucket_batch_sizes=sizes + [1],  # Last bucket stays empty.
      padding_values={"inputs": PAD_ID, "targets": PAD_ID})
  return ds.map(tf.autograph.experimental.do_not_convert(_trim),
                num_parallel_calls=tf.data.AUTOTUNE)


def eval_lengths(config: DataConfig, longest: int) -> List[int]:
  """The evaluation buckets' padded lengths: the training buckets, then (for dev pairs
  longer than max_length, up to `longest`) the geometric boundaries beyond them."""
  lengths = buckets.bucket_boundaries(config.bucket_min, config.max_length,
                                           config.bucket_growth)
  if longest > config.max_length:
    lengths += [n for n in buckets.bucket_boundaries(
        config.bucket_min, longest, config.bucket_growth) if n > config.max_length]
  return lengths


class EvalData:
  """One pass over the dev split (see module docstring).

  Args:
    config: data configuration; batch_size is the per-replica token budget.
    split: the tokenized dev split.
  """

  def __init__(self, config: DataConfig, split: cache.TokenizedSplit):
    self.config, self.split = config, split
    self.static_shapes = config.static_shapes
    longest = buckets.split_stats(split, config.max_length).longest
    self.lengths = eval_lengths(config, longest)
    padded = cache.padded_lengths(split.lengths) if len(split.lengths) else np.zeros([0])
    # Bucket i holds the pairs of padded length in (lengths[i-1], lengths[i]].
    self.pairs = np.bincount(np.searchsorted(self.lengths, padded),
                             minlength=len(self.lengths))
    self.packed_length = config.packed_length if config.static_shapes else 0
    self.packed_rows = 0  # rows the packed pairs fill
    if self.packed_length:
      fits = padded[padded <= self.packed_length]
      row_of = packing.first_fit_decreasing(fits, len(fits), self.packed_length)
      self.packed_rows = int(row_of.max()) + 1 if len(fits) else 0
      # The buckets keep the pairs longer than L only (L need not be a boundary).
      self.pairs = np.bincount(
          np.searchsorted(self.lengths, padded[padded > self.packed_length]),
          minlength=len(self.lengths))

  def buckets(self) -> List[int]:
    """The buckets that hold a dev pair, ascending (PACKED first): one compiled
    program each."""
    return [PACKED] * bool(self.packed_rows) + [
        b for b, n in enumerate(self.pairs.tolist()) if n]

  def bucket_shape(self, bucket: int) -> List[int]:
    """[rows, length] of every batch of `bucket` with static shapes."""
    length = self.packed_length if bucket == PACKED else self.lengths[bucket]
    return [max(1, self.config.batch_size // length), length]

  def steps(self, bucket: int, replicas: int) -> int:
    """Steps of `replicas` batches (one each) that cover `bucket` with static shapes."""
    rows = self.bucket_shape(bucket)[0]
    held = self.packed_rows if bucket == PACKED else int(self.pairs[bucket])
    batches = -(-held // rows)
    return -(-batches // replicas)

  def __call__(self, input_context: Optional[tf.distribute.InputContext] = None,
               bucket: Optional[int] = None) -> tf.data.Dataset:
    """The dev batches of this input pipeline.

    Args:
      input_context: from `distribute_datasets_from_function`: this pipeline's share.
      bucket: static shapes only: just this bucket's steps, every batch of the static
        shape `bucket_shape(bucket)` (the element_spec says so). None: every bucket,
        one after the other (static: each step still one shape on every replica).

    Returns:
      Finite dataset of {"inputs": [B, S], "targets": [B, T]} int32.
    """
    if not self.static_shapes:
      if bucket is not None:
        raise ValueError("per-bucket dev datasets need static_shapes")
      ds = _examples(self.split, input_context)
      return _dynamic_batches(ds, self.lengths, self.config.batch_size).prefetch(
          tf.data.AUTOTUNE)
    if bucket is not None:
      return self._bucket(bucket, input_context)
    parts = [self._bucket(b, input_context) for b in self.buckets()]
    ds = parts[0]
    for part in parts[1:]:
      ds = ds.concatenate(part)
    return ds

  def _bucket(self, bucket: int, input_context) -> tf.data.Dataset:
    pipelines, pipeline_id, replicas = 1, 0, 1
    if input_context is not None:
      pipelines = max(input_context.num_input_pipelines, 1)
      pipeline_id = input_context.input_pipeline_id
      replicas = max(input_context.num_replicas_in_sync // pipelines, 1)
    everyone = pipelines * replicas
    rows, width = self.bucket_shape(bucket)
    steps = self.steps(bucket, everyone)
    # Batch s * everyone + g goes to global replica g at step s; this pipeline feeds
    # replicas [pipeline_id * replicas, ...), in order (distribution takes them so).
    mine = (np.arange(steps)[:, None] * everyone + pipeline_id * replicas
            + np.arange(replicas)[None, :]).reshape([-1])
    if bucket == PACKED:
      return self._packed(mine, rows).prefetch(replicas)
    low = max(self.lengths[bucket - 1] if bucket else 0, self.packed_length)
    files = [n for n in self.split.present if low < n <= width]
    split = self.split

    def load():
      src, tgt, counts = split.read(files)
      return tuple(buckets.ragged_with_eos(tf.RaggedTensor.from_row_lengths(x, counts[:, i]))
                   for i, x in enumerate((src, tgt)))

    def batches(src, tgt):
      pairs = tf.cast(src.nrows(), tf.int64)

      def batch(index):
        positions = index * rows + tf.range(rows, dtype=tf.int64)
        real = positions < pairs  # the rest: all-PAD rows, zero loss weight
        taken = tf.where(real, positions, 0)
        out = {}
        for key, ids in (("inputs", src), ("targets", tgt)):
          dense = tf.gather(ids, taken).to_tensor(PAD_ID, shape=[rows, width])
          out[key] = tf.ensure_shape(tf.where(real[:, None], dense, PAD_ID), [rows, width])
        return out
      return tf.data.Dataset.from_tensor_slices(tf.constant(mine, tf.int64)).map(batch)

    return buckets.loaded(load, batches).prefetch(replicas)

  def _packed(self, mine: np.ndarray, rows: int) -> tf.data.Dataset:
    """The packed rows' batches `mine` (of `rows` rows each; past the last row, all-PAD
    rows of zero loss weight)."""
    length, total = self.packed_length, self.packed_rows
    files = [n for n in self.split.present if n <= length]
    split = self.split

    def load():
      src, tgt, counts = split.read(files)
      return tuple(buckets.ragged_with_eos(tf.RaggedTensor.from_row_lengths(x, counts[:, i]))
                   for i, x in enumerate((src, tgt)))

    def batches(src, tgt):
      pairs, per_row = _first_fit_decreasing(
          tf.maximum(src.row_lengths(), tgt.row_lengths()), total, length)
      packed = packing.pack({"inputs": tf.gather(src, pairs),
                             "targets": tf.gather(tgt, pairs)}, per_row, [total, length])

      def batch(index):
        taken = index * rows + tf.range(rows, dtype=tf.int64)
        real = taken < total
        return {key: tf.ensure_shape(tf.where(real[:, None], tf.gather(
            value, tf.minimum(taken, total - 1)), PAD_ID), [rows, length])
                for key, value in packed.items()}
      return tf.data.Dataset.from_tensor_slices(tf.constant(mine, tf.int64)).map(batch)

    return buckets.loaded(load, batches)


def _first_fit_decreasing(sizes: tf.Tensor, rows: int, length: int):
  """(the items row after row, int64 [rows] items a row): `sizes` (int64 [N], each at
  most `length`) packed first fit by decreasing size into `rows` rows, as
  packing.first_fit_decreasing does on the host (which counted the rows)."""
  sizes = tf.cast(sizes, tf.int64)
  order = tf.argsort(-sizes, stable=True)

  def place(i, free, row_of):
    size = sizes[order[i]]
    row = tf.argmax(tf.cast(free >= size, tf.int32), output_type=tf.int64)
    return (i + 1, tf.tensor_scatter_nd_sub(free, [[row]], [size]),
            row_of.write(i, row))

  _, free, row_of = tf.while_loop(
      lambda i, free, row_of: i < tf.size(sizes), place,
      (tf.constant(0), tf.fill([rows], tf.cast(length, tf.int64)),
       tf.TensorArray(tf.int64, size=tf.size(sizes))))
  row_of = row_of.stack()
  fits = tf.debugging.assert_non_negative(free, message="dev rows overfilled (a bug)")
  with tf.control_dependencies([fits]):
    by_row = tf.argsort(row_of, stable=True)
  return (tf.gather(order, by_row),
          tf.math.bincount(row_of, minlength=rows, maxlength=rows, dtype=tf.int64))
