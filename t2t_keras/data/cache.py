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
{build-<id>/{data/ (tf.data.Dataset.save: (batch index, pairs) in NUM_SHARDS contiguous
shards), lengths.npy (token counts per pair)}, stats.json}.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys
import time
import uuid
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras import parsing
from t2t_keras.configs import DataConfig
from t2t_keras.data import sources

CACHE_VERSION = 2  # 2: contiguous shards, read in a shuffled interleave for training
VALIDATION_VERSION = 1  # the stored result of validating raw files (unchanged by v2)
# The cache is cut into this many contiguous shards (fewer for small corpora). Training
# reads all of them at once, one batch of each in turn, in a seeded order, so the
# example shuffle buffer mixes the whole corpus, not a window of it.
NUM_SHARDS = 64
_HEAD_TAIL_BYTES = 1 << 20
BATCH_ROWS = 1024  # Pairs per cached element.
_PROGRESS_EVERY = 100_000


def digest(obj) -> str:
  """Stable hex digest of a JSON-serializable object."""
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def file_fingerprint(path: str, with_mtime: bool = True) -> dict:
  """Cheap content identity of a file: size, head and tail bytes (and mtime)."""
  sources.check_file_exists(path)
  stat = tf.io.gfile.stat(path)
  size = stat.length
  sha = hashlib.sha256()
  with sources.open_binary(path) as f:
    sha.update(f.read(_HEAD_TAIL_BYTES))
    if size > _HEAD_TAIL_BYTES:
      f.seek(max(_HEAD_TAIL_BYTES, size - _HEAD_TAIL_BYTES))
      sha.update(f.read())
  fingerprint = {"size": size, "sha256_head_tail": sha.hexdigest()}
  if with_mtime:
    fingerprint["mtime_ns"] = stat.mtime_nsec
  return fingerprint


def source_fingerprint(config: DataConfig, split: str, with_mtime: bool = True,
                       shared_vocab: bool = False) -> Optional[dict]:
  """What determines the text of a split; None when the split is not configured.

  Args:
    config: data configuration.
    split: "train" or "dev".
    with_mtime: include file modification times (caches: yes; vocabulary name: no).
    shared_vocab: identify the language pair regardless of direction (a shared
      vocabulary is the same for EN->DE and DE->EN).
  """
  if config.source == "files":
    paths = sources.split_files(config, split)
    if paths is None:
      return None
    fps = [file_fingerprint(p, with_mtime) for p in paths]
    return {"files": sorted(fps, key=json.dumps) if shared_vocab else fps}
  if config.source == "parsing":
    path = sources.treebank_file(config, split)
    if path is None:
      return None
    # The linearization version: a new target format must not reuse old caches.
    return {"treebank": file_fingerprint(path, with_mtime),
            "linearization": parsing.LINEARIZATION_VERSION}
  if config.source == "tfds":
    fp = sources.tfds_fingerprint(config, split)
    if shared_vocab:
      fp["src"], fp["tgt"] = sorted((fp["src"], fp["tgt"]))
    return fp
  raise ValueError(f"source={config.source!r} has no text to fingerprint")


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
  key = digest({"v": VALIDATION_VERSION, "fp": source_fingerprint(config, split),
                "skip": config.skip_invalid_utf8})
  directory = _cache_dir(config)
  path = directory and os.path.join(directory, f"validation-{key}.json")
  if path and tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  start = time.time()
  src, tgt = sources.validate_parallel_files(*paths, config.skip_invalid_utf8)
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
  """Every pair of a split as ids (no EOS), in batches, plus their token counts.

  Elements are batches, not pairs, because tf.data's cost is per element: reading,
  filtering and appending EOS to 1024 pairs at once is far cheaper than one by one.

  Attributes:
    path: the cache entry directory (None for in-memory synthetic data).
    lengths: int32 [N, 2] (source, target) token counts per pair, without EOS.
    invalid_utf8: pairs skipped because a side was not valid UTF-8.
    make_dataset: `make_dataset(shuffle_seed)` returns a fresh dataset of
      (source_ids, target_ids) int32 RaggedTensors [b, None] with b <= BATCH_ROWS: in
      corpus order for None, else in a corpus-wide order derived from the seed (see
      `load_shards`).
  """

  path: Optional[str]
  lengths: np.ndarray
  invalid_utf8: int
  make_dataset: Callable[[Optional[int]], tf.data.Dataset]

  def dataset(self, shuffle_seed: Optional[int] = None) -> tf.data.Dataset:
    return self.make_dataset(shuffle_seed)


def load_shards(data: str, num_shards: int, shuffle_seed: Optional[int] = None
                ) -> tf.data.Dataset:
  """Reads a cache written by `_build`: shards in order, or interleaved in a shuffled order.

  With a seed, the shards (contiguous blocks of the corpus) are put in a seeded order
  and read one batch of each in turn: any window of `num_shards` consecutive batches
  holds one batch from every 1/num_shards of the corpus. Deterministic for a seed, so
  every worker of a run sees the same sequence (sharding by position relies on it) and
  a resumed run replays it. As every seeded tf.data op, the order also depends on
  TensorFlow's global seed, which training sets from --seed on every worker. The batch
  order is the same every epoch; the pipeline's example shuffle buffer, which spans
  many batches, reshuffles pairs each epoch.
  """
  if shuffle_seed is None:
    def reader(shards):
      return shards.flat_map(lambda shard: shard)
  else:
    def reader(shards):
      # Sequential interleave: deterministic without a `deterministic` argument.
      return shards.shuffle(num_shards, seed=shuffle_seed,
                            reshuffle_each_iteration=False).interleave(
          lambda shard: shard, cycle_length=num_shards, block_length=1)
  return tf.data.Dataset.load(data, reader_func=reader).map(lambda index, pair: pair)


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


def _lengths(ds: tf.data.Dataset) -> np.ndarray:
  counts = ds.map(lambda s, t: tf.stack([s.row_lengths(), t.row_lengths()], axis=1))
  arrays = [batch for batch in counts.as_numpy_iterator()]
  return (np.concatenate(arrays) if arrays else np.zeros([0, 2])).astype(np.int32)


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
  invalid = 0
  if config.source == "files":
    report = validated_files(config, split)
    if report is None:
      return None
    invalid = report["invalid_pairs"]
  elif config.source == "parsing" and sources.treebank_file(config, split) is None:
    return None
  directory = _cache_dir(config)
  if directory is None:
    raise sources.DataError(f"source={config.source!r} needs --data_dir for the "
                            "tokenized cache.")
  key = digest({"v": CACHE_VERSION, "fp": source_fingerprint(config, split),
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
  data = os.path.join(build, "data")
  shards = stats["shards"]
  return TokenizedSplit(path=path, lengths=lengths, invalid_utf8=stats["invalid_utf8"],
                        make_dataset=lambda seed: load_shards(data, shards, seed))


def _build(config: DataConfig, split: str, tokenizer, path: str, invalid: int):
  """Tokenizes a split into a new build directory of `path`, then commits it."""
  text = sources.text_pairs(config, split)
  name = f"build-{uuid.uuid4().hex[:12]}"
  build = os.path.join(path, name)
  start = time.time()
  logging.info("Tokenizing the %s split into %s", split, build)
  # First in one file, in corpus order (the batch count is unknown while streaming),
  # then cut into contiguous shards, each batch stored with its index.
  single = os.path.join(build, "single")
  tokenize_pairs(text, tokenizer, split).save(
      single, shard_func=lambda *_: tf.constant(0, tf.int64))
  lengths = _lengths(tf.data.Dataset.load(single))
  num_batches = max(-(-len(lengths) // BATCH_ROWS), 1)
  shards = min(NUM_SHARDS, num_batches)
  tf.data.Dataset.load(single).enumerate().save(
      os.path.join(build, "data"),
      shard_func=lambda index, pair: index * shards // num_batches)
  tf.io.gfile.rmtree(single)
  buffer = io.BytesIO()
  np.save(buffer, lengths)
  with tf.io.gfile.GFile(os.path.join(build, "lengths.npy"), "wb") as f:
    f.write(buffer.getvalue())
  seconds = time.time() - start
  logging.info("Tokenized %d %s pairs in %.1fs (%.0f pairs/s)", len(lengths), split,
               seconds, len(lengths) / max(seconds, 1e-9))
  _write_json_atomic(os.path.join(path, "stats.json"),  # The commit.
                     {"build": name, "pairs": int(len(lengths)), "invalid_utf8": invalid,
                      "shards": shards})
