"""On-disk caches in data_dir, so a second run neither re-validates nor re-tokenizes.

Tokenizing 4.5M WMT pairs costs minutes; re-reading saved int32 ids costs seconds.
Each cache entry is keyed by a digest of what determines its content (file size,
mtime and head/tail bytes, or the TFDS name/version/split; the vocabulary's bytes), so
editing data or rebuilding the vocabulary invalidates it, and nothing stale is reused.
max_length is deliberately NOT part of the key: the cache holds every pair, and
filtering happens on load, so trying another max_length does not re-tokenize.
A build writes its own subdirectory and then, last, a small stats.json naming it: an
interrupted build is never trusted by a later run, and two workers building at once
cannot corrupt each other. (Directory renames would be neater, but are not atomic, or
not supported, on every tf.io.gfile filesystem such as gs://.)

Layout: data_dir/cache/validation-<key>.json and data_dir/cache/<split>-<key>/
{build-<id>/{len-<L>.source.bin, len-<L>.target.bin, len-<L>.lengths.bin (for each
padded length L, the longer side's ids + EOS: the ids of its pairs, concatenated in
corpus order, and their [pairs, 2] token counts, all flat little-endian int32),
lengths.npy (int32 [pairs, 2] token counts in corpus order)}, stats.json}. Grouping by
length lets the training input of one bucket read only its own files, with TensorFlow
ops (`TokenizedSplit.read`), wherever the dataset graph runs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import sys
import time
import uuid
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras import language_tags
from t2t_keras.configs import DataConfig
from t2t_keras.data.sources import sources
from t2t_keras.data.fetch import leftovers

CACHE_VERSION = 4  # 4: files per padded length, read by TF ops (3: one flat file a side)
VALIDATION_VERSION = 1  # the stored result of validating raw files (unchanged since)
BATCH_ROWS = 1024  # Pairs per cached element.
_PROGRESS_EVERY = 100_000


def digest(obj) -> str:
  """Stable hex digest of a JSON-serializable object."""
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _cache_dir(config: DataConfig) -> Optional[str]:
  return os.path.join(config.data_dir, "cache") if config.data_dir else None


def validated_files(config: DataConfig, split: str) -> Optional[dict]:
  """The source's check of a split's raw files (`Source.check_files`), run once per
  content: later calls reuse the stored result.

  Returns:
    {"num_lines": int, "invalid_pairs": int}, or None when the source reads no raw
    files (`scanned_before_reading`) or the split is unset.

  Raises:
    sources.DataError: missing files, different line counts, invalid UTF-8.
  """
  source = sources.data_source(config)
  if not source.scanned_before_reading or not source.has_split(split):
    return None
  key = digest({"v": VALIDATION_VERSION, "fp": source.fingerprint(split),
                "skip": config.skip_invalid_utf8})
  directory = _cache_dir(config)
  path = directory and os.path.join(directory, f"validation-{key}.json")
  if path and tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  result = source.check_files(split)
  if path:
    tf.io.gfile.makedirs(directory)
    _write_json_atomic(path, result)
  return result


def _write_json_atomic(path: str, obj):
  tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"  # pids repeat across containers
  with tf.io.gfile.GFile(tmp, "w") as f:
    json.dump(obj, f)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def padded_lengths(lengths: np.ndarray) -> np.ndarray:
  """int [N] the length of each pair in a batch: its longer side's ids + EOS."""
  return np.asarray(lengths).reshape([-1, 2]).max(axis=1) + 1


def _file(build: str, length: int, what: str) -> str:
  return os.path.join(build, f"len-{length:04d}.{what}.bin")


def group_by_length(source: np.ndarray, target: np.ndarray, lengths: np.ndarray):
  """Flat ids of pairs in corpus order -> {padded length: (source ids, target ids,
  lengths [n, 2])}, each group's pairs in corpus order."""
  lengths = np.asarray(lengths).reshape([-1, 2])
  starts = np.cumsum(lengths, axis=0, dtype=np.int64) - lengths
  padded = padded_lengths(lengths)
  groups = {}
  for length in np.unique(padded).tolist():
    pairs = np.flatnonzero(padded == length)
    flat = []
    for side, ids in enumerate((source, target)):
      n = lengths[pairs, side].astype(np.int64)
      first = np.cumsum(n) - n  # where each pair's ids start in the group
      flat.append(np.asarray(ids[np.repeat(starts[pairs, side] - first, n)
                                 + np.arange(int(n.sum()))], dtype="<i4"))
    groups[length] = (flat[0], flat[1], lengths[pairs].astype("<i4"))
  return groups


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """Every pair of a split as ids (no EOS), grouped by padded length.

  The host side keeps only the lengths (8 bytes a pair): batch plans and statistics
  need nothing else. The ids are read by TensorFlow ops (`read`), inside the dataset
  graph, so that the graph runs where no Python does (a Cloud TPU host, a tf.data
  service worker); grouping by length lets a dataset of some buckets read only the
  files of their lengths.

  Attributes:
    path: the cache build directory holding the files (None for in-memory data).
    lengths: int32 [N, 2] (source, target) token counts per pair, in corpus order.
    invalid_utf8: pairs skipped because a side was not valid UTF-8.
    groups: in-memory data (synthetic): {padded length: (source ids, target ids,
      lengths)} as `group_by_length` makes them; None when `path` holds them.
    alignments: --train_alignments mapped to pieces (`alignments.attach`): {padded
      length: (flat int32 (source piece, target piece) links, int32 links per pair)},
      each length's pairs in corpus order as the id files hold them; None without.
  """

  path: Optional[str]
  lengths: np.ndarray
  invalid_utf8: int
  groups: Optional[dict] = None
  alignments: Optional[dict] = None

  @property
  def corpus_sizes(self) -> Tuple[int, ...]:
    """Pairs of each corpus (one here; several: `corpora.CorpusSplits`)."""
    return (len(self.lengths),)

  @functools.cached_property
  def present(self) -> List[int]:
    """The padded lengths that occur, ascending (one group of files each)."""
    return np.unique(padded_lengths(self.lengths)).tolist() if len(self.lengths) else []

  def read(self, lengths: Sequence[int]) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """TensorFlow ops reading the pairs of the given padded `lengths` (ascending).

    Returns:
      (source ids, target ids) int32 flat, and int32 [n, 2] token counts, of the
      pairs, length after length, each length's pairs in corpus order.
    """
    wanted = [n for n in lengths if n in set(self.present)]
    parts = []
    for n in wanted:
      if self.groups is not None:
        parts.append([tf.constant(a) for a in self.groups[n]])
      else:
        parts.append([tf.io.decode_raw(tf.io.read_file(_file(self.path, n, what)),
                                       tf.int32, little_endian=True)
                      for what in ("source", "target", "lengths")])
    if not parts:
      return tf.zeros([0], tf.int32), tf.zeros([0], tf.int32), tf.zeros([0, 2], tf.int32)
    src, tgt, counts = (tf.concat([p[i] for p in parts], 0) for i in range(3))
    return src, tgt, tf.reshape(counts, [-1, 2])

  def group_arrays(self, length: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host-side numpy (source ids, target ids, [n, 2] token counts) of the pairs of
    one padded length, in corpus order (what `read` gives for that length)."""
    if self.groups is not None:
      return self.groups[length]
    counts = _read_ids(_file(self.path, length, "lengths"), -1).reshape([-1, 2])
    total = counts.sum(axis=0, dtype=np.int64)
    return (_read_ids(_file(self.path, length, "source"), int(total[0])),
            _read_ids(_file(self.path, length, "target"), int(total[1])), counts)

  def reader(self, lengths: Sequence[int]) -> Callable[[tf.Tensor], Tuple[tf.Tensor, ...]]:
    """As `read`, one length at a time by its index in `lengths` (present ones, a
    tensor index): a loop over thousands of lengths is one small graph, where `read`
    of each would add its ops per length. Call it where the ops are to be made."""
    if self.groups is not None:
      groups = [self.groups[n] for n in lengths]
      flat = [tf.constant(np.concatenate([g[k].reshape([-1]) for g in groups]))
              for k in range(3)]
      bounds = [tf.constant(np.cumsum([0] + [g[k].size for g in groups]), tf.int64)
                for k in range(3)]

      def read_one(i):
        return tuple(flat[k][bounds[k][i]:bounds[k][i + 1]] for k in range(3))
    else:
      names = tf.constant([[_file(self.path, n, what) for what in
                            ("source", "target", "lengths")] for n in lengths])

      def read_one(i):
        return tuple(tf.io.decode_raw(tf.io.read_file(names[i, k]), tf.int32,
                                      little_endian=True) for k in range(3))

    def read_at(i):
      src, tgt, counts = read_one(i)
      return src, tgt, tf.reshape(counts, [-1, 2])
    return read_at


def _progress(ds: tf.data.Dataset, what: str) -> tf.data.Dataset:
  """Logs pairs tokenized and the rate every ~_PROGRESS_EVERY pairs (in-graph)."""
  start = time.time()
  every = _PROGRESS_EVERY // BATCH_ROWS

  def log(index, batch):
    def emit():
      pairs = index * BATCH_ROWS
      tf.print("Tokenizing", what + ":", pairs, "pairs,",
               tf.cast(tf.cast(pairs, tf.float64) / (tf.timestamp() - start), tf.int64),
               "pairs/s", output_stream=sys.stderr)
      return tf.constant(0)
    done = tf.cond(index % every == 0, emit, lambda: tf.constant(0))
    with tf.control_dependencies([done]):
      return tf.nest.map_structure(tf.identity, batch)

  return ds.enumerate(start=1).map(log)


def tokenize_pairs(text: tf.data.Dataset, tokenizer, what: Optional[str] = "pairs",
                   source_tag: Optional[int] = None) -> tf.data.Dataset:
  """(source, target) strings -> batches of ragged ids, tokenized in parallel.

  Progress is logged as "Tokenizing <what>: ..." unless `what` is None. `source_tag`:
  an id put before every source (a target-language tag, language_tags.py).
  """
  def tokenize(src, tgt):
    src_ids = tokenizer.source.tokenize(src)
    if source_tag is not None:
      tags = tf.fill([src_ids.nrows(), 1], tf.constant(source_tag, src_ids.dtype))
      src_ids = tf.concat([tf.RaggedTensor.from_tensor(tags), src_ids], axis=1)
    return src_ids, tokenizer.target.tokenize(tgt)  # each side's own vocabulary

  ds = text.batch(BATCH_ROWS).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
  return ds if what is None else _progress(ds, what)


def tokenized_split(config: DataConfig, split: str, tokenizer,
                    tokenizer_key: str) -> Optional[TokenizedSplit]:
  """Loads a split's tokenized cache, building it first if needed.

  Args:
    config: data configuration ("files", "tfds" or "parsing"; needs data_dir).
    split: "train" or "dev".
    tokenizer: a tokenizer module (see tokenizer.py).
    tokenizer_key: identifies the vocabulary (tokenizer.tokenizer_digest).

  Returns:
    The TokenizedSplit, or None when the split is not configured.
  """
  source = sources.data_source(config)
  if not source.has_split(split):
    return None
  checked = validated_files(config, split)  # raw files, before they are read
  invalid = checked["invalid_pairs"] if checked else 0
  directory = _cache_dir(config)
  if directory is None:
    raise sources.DataError(f"source={config.source!r} needs --data_dir for the "
                            "tokenized cache.")
  key = digest({"v": CACHE_VERSION, "fp": source.fingerprint(split),
                "vocab": tokenizer_key, "skip": config.skip_invalid_utf8})
  path = os.path.join(directory, f"{split}-{key}")
  stats_file = os.path.join(path, "stats.json")
  if tf.io.gfile.exists(stats_file):
    logging.info("Reusing tokenized %s data %s", split, path)
  else:
    _build(config, split, tokenizer, path, invalid)
  with tf.io.gfile.GFile(stats_file) as f:
    stats = json.load(f)
  build = os.path.join(path, stats["build"])
  with tf.io.gfile.GFile(os.path.join(build, "lengths.npy"), "rb") as f:
    lengths = np.load(io.BytesIO(f.read()))
  return TokenizedSplit(path=build, lengths=lengths, invalid_utf8=stats["invalid_utf8"])


def _build(config: DataConfig, split: str, tokenizer, path: str, invalid: int):
  """Tokenizes a split into a new build directory of `path`, then commits it."""
  leftovers.sweep(abandoned_candidates(os.path.dirname(path)), "tokenized-cache build")
  text = sources.data_source(config).text_pairs(split)
  language = language_tags.split_language(config, split)
  tag = tokenizer.tag_id(language) if language else None
  name = f"build-{uuid.uuid4().hex[:12]}"
  build = os.path.join(path, name)
  start = time.time()
  logging.info("Tokenizing the %s split into %s", split, build)
  tf.io.gfile.makedirs(build)
  flat = tokenize_pairs(text, tokenizer, split, source_tag=tag).map(
      lambda s, t: (s.flat_values, t.flat_values,
                    tf.stack([s.row_lengths(), t.row_lengths()], axis=1)))
  lengths = _write_ids(flat, build)
  _group_files(build, lengths)
  buffer = io.BytesIO()
  np.save(buffer, lengths)
  with tf.io.gfile.GFile(os.path.join(build, "lengths.npy"), "wb") as f:
    f.write(buffer.getvalue())
  seconds = time.time() - start
  logging.info("Tokenized %d %s pairs in %.1fs (%.0f pairs/s)", len(lengths), split,
               seconds, len(lengths) / max(seconds, 1e-9))
  _write_json_atomic(os.path.join(path, "stats.json"),  # The commit.
                     {"build": name, "pairs": int(len(lengths)), "invalid_utf8": invalid})


def abandoned_candidates(directory: str) -> List[str]:
  """What a killed build may have left in the cache directory (data_dir/cache), of
  every key: build directories that never finished (no lengths.npy, which a build
  writes last before its commit) and temporary json files. `leftovers.sweep` removes
  those untouched long enough that no live build can own them.

  A finished build is never a candidate, committed or not: one that lost the race to
  commit (two workers building at once) may be what the other worker trains from.
  """
  builds = [build for build in tf.io.gfile.glob(os.path.join(directory, "*", "build-*"))
            if not tf.io.gfile.exists(os.path.join(build, "lengths.npy"))]
  return builds + tf.io.gfile.glob(os.path.join(directory, "*", "stats.json.tmp-*")) + (
      tf.io.gfile.glob(os.path.join(directory, "*.json.tmp-*")))


def _write_ids(flat: tf.data.Dataset, build: str) -> np.ndarray:
  """Streams (source ids, target ids, lengths) batches into source.bin and target.bin
  (flat little-endian int32) and returns the lengths, int32 [N, 2]."""
  lengths = []
  with tf.io.gfile.GFile(os.path.join(build, "source.bin"), "wb") as src_file, \
      tf.io.gfile.GFile(os.path.join(build, "target.bin"), "wb") as tgt_file:
    for src, tgt, counts in flat.as_numpy_iterator():
      src_file.write(src.astype("<i4").tobytes())
      tgt_file.write(tgt.astype("<i4").tobytes())
      lengths.append(counts)
  return (np.concatenate(lengths) if lengths else np.zeros([0, 2])).astype(np.int32)


def _read_ids(path: str, count: int) -> np.ndarray:
  """A flat int32 array written by `_write_ids`: memory-mapped from a local disk, read
  into memory from other file systems (gs://)."""
  if count == 0:
    return np.zeros([0], np.int32)
  if count < 0:  # the whole file
    count = tf.io.gfile.stat(path).length // 4
  if "://" not in path:
    return np.memmap(path, dtype="<i4", mode="r", shape=(count,))
  with tf.io.gfile.GFile(path, "rb") as f:
    return np.frombuffer(f.read(), dtype="<i4")


def _group_files(build: str, lengths: np.ndarray):
  """Rewrites the flat source.bin/target.bin as one set of files per padded length
  (len-<L>.{source,target,lengths}.bin, flat little-endian int32), then deletes them."""
  totals = lengths.sum(axis=0, dtype=np.int64) if len(lengths) else [0, 0]
  flat = [os.path.join(build, f"{side}.bin") for side in ("source", "target")]
  groups = group_by_length(_read_ids(flat[0], int(totals[0])),
                           _read_ids(flat[1], int(totals[1])), lengths)
  for length, arrays in groups.items():
    for what, array in zip(("source", "target", "lengths"), arrays):
      with tf.io.gfile.GFile(_file(build, length, what), "wb") as f:
        f.write(array.astype("<i4").tobytes())
  del groups
  for path in flat:
    tf.io.gfile.remove(path)
