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
{build-<id>/{source.bin, target.bin (the ids of all pairs of a side, concatenated in
corpus order, little-endian int32), lengths.npy (int32 [pairs, 2] token counts)},
stats.json}. Offsets follow from the lengths, so any pair is read in constant time.
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
from typing import Optional, Tuple

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras.configs import DataConfig
from t2t_keras.data import sources, textfiles

CACHE_VERSION = 3  # 3: flat id arrays with random access (2: tf.data shards)
VALIDATION_VERSION = 1  # the stored result of validating raw files (unchanged since)
BATCH_ROWS = 1024  # Pairs per cached element.
_PROGRESS_EVERY = 100_000


def digest(obj) -> str:
  """Stable hex digest of a JSON-serializable object."""
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _cache_dir(config: DataConfig) -> Optional[str]:
  return os.path.join(config.data_dir, "cache") if config.data_dir else None


def validated_files(config: DataConfig, split: str) -> Optional[dict]:
  """Validates a split's parallel files once; later calls reuse the stored result.

  Returns:
    {"num_lines": int, "invalid_pairs": int} or None when the split has no files.

  Raises:
    sources.DataError: missing files, different line counts, invalid UTF-8.
  """
  paths = sources.split_files(config, split)
  if paths is None:
    return None
  key = digest({"v": VALIDATION_VERSION, "fp": sources.FileSource(config).fingerprint(split),
                "skip": config.skip_invalid_utf8})
  directory = _cache_dir(config)
  path = directory and os.path.join(directory, f"validation-{key}.json")
  if path and tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  start = time.time()
  src, tgt = textfiles.validate_parallel_files(*paths, config.skip_invalid_utf8)
  invalid = sorted(set(src.invalid_lines) | set(tgt.invalid_lines))
  for scan in (src, tgt):
    if scan.invalid_lines:
      logging.warning("%s: %d lines of invalid UTF-8 will be skipped (first: line %d)",
                      scan.path, len(scan.invalid_lines), scan.invalid_lines[0])
  result = {"num_lines": src.num_lines, "invalid_pairs": len(invalid)}
  logging.info("Validated %s and %s: %d lines each in %.1fs", *paths, src.num_lines,
               time.time() - start)
  if path:
    tf.io.gfile.makedirs(directory)
    _write_json_atomic(path, result)
  return result


def _write_json_atomic(path: str, obj):
  tmp = f"{path}.tmp{os.getpid()}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    json.dump(obj, f)
  tf.io.gfile.rename(tmp, path, overwrite=True)


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """Every pair of a split as ids (no EOS), with random access by pair index.

  The ids of each side are one flat array (the pairs' ids concatenated in corpus
  order), memory-mapped from the cache when it is on a local disk (a corpus of
  millions of pairs then takes no process memory; from gs:// it is read into memory)
  and any pair is read in constant time: training
  reads the batches a step needs wherever they are (see `data.plan`).

  Attributes:
    path: the cache entry directory (None for in-memory synthetic data).
    lengths: int32 [N, 2] (source, target) token counts per pair, without EOS.
    invalid_utf8: pairs skipped because a side was not valid UTF-8.
    source: int32 [sum of source lengths] the source ids of all pairs.
    target: int32 [sum of target lengths] the target ids of all pairs.
  """

  path: Optional[str]
  lengths: np.ndarray
  invalid_utf8: int
  source: np.ndarray
  target: np.ndarray

  @functools.cached_property
  def _starts(self) -> np.ndarray:
    """int64 [N, 2] offset of each pair's ids in `source` / `target`."""
    ends = np.cumsum(self.lengths, axis=0, dtype=np.int64)
    return ends - self.lengths

  def gather(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pairs at `indices`: (source ids, target ids, lengths [n, 2]), ids flat."""
    lengths = self.lengths[indices]
    starts = self._starts[indices]
    flat = []
    for side, ids in enumerate((self.source, self.target)):
      n = lengths[:, side].astype(np.int64)
      first = np.cumsum(n) - n  # where each pair's ids start in the output
      flat.append(np.asarray(ids[np.repeat(starts[:, side] - first, n)
                                 + np.arange(int(n.sum()))]))
    return flat[0], flat[1], lengths

  def dataset(self) -> tf.data.Dataset:
    """All pairs in corpus order, as batches of (source_ids, target_ids) int32
    RaggedTensors [b, None], b <= BATCH_ROWS (tf.data's cost is per element, so
    filtering and appending EOS are cheaper on 1,024 pairs at once)."""
    size = len(self.lengths)

    def read(batch):
      src, tgt, lengths = self.gather(np.arange(batch * BATCH_ROWS,
                                                min((batch + 1) * BATCH_ROWS, size)))
      return src, tgt, lengths

    def to_ragged(batch):
      src, tgt, lengths = tf.numpy_function(read, [batch], [tf.int32, tf.int32, tf.int32],
                                            stateful=False)
      lengths = tf.reshape(lengths, [-1, 2])
      return (tf.RaggedTensor.from_row_lengths(tf.reshape(src, [-1]), lengths[:, 0]),
              tf.RaggedTensor.from_row_lengths(tf.reshape(tgt, [-1]), lengths[:, 1]))

    return tf.data.Dataset.range(-(-size // BATCH_ROWS)).map(to_ragged)


def _read_ids(path: str, count: int) -> np.ndarray:
  """A flat int32 array written by `_build`: memory-mapped from a local disk, read
  into memory from other file systems (gs://)."""
  if count == 0:
    return np.zeros([0], np.int32)
  size = tf.io.gfile.stat(path).length if tf.io.gfile.exists(path) else -1
  if size != 4 * count:
    raise sources.DataError(
        f"{path} holds {size} bytes where the cache's lengths.npy needs {4 * count}: the "
        f"cache entry is damaged. Delete {os.path.dirname(os.path.dirname(path))} and "
        "rerun to tokenize again.")
  if "://" not in path:
    return np.memmap(path, dtype="<i4", mode="r", shape=(count,))
  with tf.io.gfile.GFile(path, "rb") as f:
    return np.frombuffer(f.read(), dtype="<i4")


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


def tokenize_pairs(text: tf.data.Dataset, tokenizer, what: Optional[str] = "pairs"
                   ) -> tf.data.Dataset:
  """(source, target) strings -> batches of ragged ids, tokenized in parallel.

  Progress is logged as "Tokenizing <what>: ..." unless `what` is None.
  """
  def tokenize(src, tgt):
    return tokenizer.tokenize(src), tokenizer.tokenize(tgt)

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
  invalid = 0
  if source.scanned_before_reading:
    invalid = validated_files(config, split)["invalid_pairs"]
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
  totals = lengths.sum(axis=0, dtype=np.int64) if len(lengths) else [0, 0]
  return TokenizedSplit(path=path, lengths=lengths, invalid_utf8=stats["invalid_utf8"],
                        source=_read_ids(os.path.join(build, "source.bin"), int(totals[0])),
                        target=_read_ids(os.path.join(build, "target.bin"), int(totals[1])))


def _build(config: DataConfig, split: str, tokenizer, path: str, invalid: int):
  """Tokenizes a split into a new build directory of `path`, then commits it."""
  text = sources.data_source(config).text_pairs(split)
  name = f"build-{uuid.uuid4().hex[:12]}"
  build = os.path.join(path, name)
  start = time.time()
  logging.info("Tokenizing the %s split into %s", split, build)
  tf.io.gfile.makedirs(build)
  flat = tokenize_pairs(text, tokenizer, split).map(
      lambda s, t: (s.flat_values, t.flat_values,
                    tf.stack([s.row_lengths(), t.row_lengths()], axis=1)))
  lengths = _write_ids(flat, build)
  buffer = io.BytesIO()
  np.save(buffer, lengths)
  with tf.io.gfile.GFile(os.path.join(build, "lengths.npy"), "wb") as f:
    f.write(buffer.getvalue())
  seconds = time.time() - start
  logging.info("Tokenized %d %s pairs in %.1fs (%.0f pairs/s)", len(lengths), split,
               seconds, len(lengths) / max(seconds, 1e-9))
  _write_json_atomic(os.path.join(path, "stats.json"),  # The commit.
                     {"build": name, "pairs": int(len(lengths)), "invalid_utf8": invalid})


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
