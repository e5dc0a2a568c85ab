"""Tests of t2t_keras.data.batching.pipeline: buckets, token budgets, exactly-once, shards,
cache."""

import collections
import dataclasses
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.configs import DataConfig
from t2t_keras.data.tokens import cache
from t2t_keras.data.sources import sources
from t2t_keras.data.batching import dev_batches, pipeline
from t2t_keras.data.sources.sources import DataError

WORDS = "the a house cat dog runs sleeps under over small big green Haus Katze grün".split()
NUM_NORMAL, NUM_EMPTY, NUM_LONG = 400, 3, 2


def _write_corpus(folder, seed=0):
  rng = np.random.default_rng(seed)
  src, tgt = [], []
  for _ in range(NUM_NORMAL):
    words = list(rng.choice(WORDS, size=rng.integers(1, 12)))
    src.append(" ".join(words))
    tgt.append(" ".join(reversed(words)))
  src += ["", "the cat", ""]  # NUM_EMPTY pairs with an empty side.
  tgt += ["die Katze", "", ""]
  src += [" ".join(WORDS * 4)] * NUM_LONG  # Longer than max_length=32 tokens.
  tgt += ["kurz"] * NUM_LONG
  paths = []
  for name, lines in (("src.txt", src), ("tgt.txt", tgt)):
    paths.append(os.path.join(folder, name))
    with open(paths[-1], "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
  return paths, list(zip(src, tgt))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("corpus"))
  (src, tgt), pairs = _write_corpus(folder)
  config = DataConfig(source="files", train_src=src, train_tgt=tgt, dev_src=src,
                      dev_tgt=tgt, data_dir=os.path.join(folder, "data"),
                      vocab_size=100, max_length=32, batch_size=96)
  return config, pairs, pipeline.make_datasets(config)


def _rows(batch, tokenizer):
  """(source, target) texts of the non-padding rows of a batch."""
  real = batch["inputs"][:, 0] != PAD_ID
  return list(zip(tokenizer.detokenize(batch["inputs"][real]).numpy(),
                  tokenizer.detokenize(batch["targets"][real]).numpy()))


def _kept(pairs):
  return [(s.encode(), t.encode()) for s, t in pairs
          if s and t and len(s.split()) < 20]


def test_bucket_boundaries_follow_t2t():
  lengths = pipeline.bucket_boundaries(8, 256, 1.1)
  assert lengths[:4] == [8, 9, 10, 11] and lengths[-1] == 256
  for prev, cur in zip(lengths[:-2], lengths[1:-1]):
    assert cur == max(prev + 1, int(prev * 1.1))
  assert lengths[-2] < 256 <= max(lengths[-2] + 1, int(lengths[-2] * 1.1))
  assert pipeline.bucket_boundaries(8, 8) == [8]
  assert pipeline.bucket_batch_sizes([8, 100], 4096) == [512, 40]
  with pytest.raises(ValueError):
    pipeline.bucket_boundaries(8, 64, 1.0)


def test_counts_are_logged_and_filtered(corpus, caplog):
  config, _, data = corpus
  stats = data.train_stats
  assert (stats.pairs, stats.empty, stats.too_long) == (
      NUM_NORMAL + NUM_EMPTY + NUM_LONG, NUM_EMPTY, NUM_LONG)
  assert stats.kept_for_training == NUM_NORMAL
  with caplog.at_level(logging.INFO, logger="absl"):
    pipeline.make_datasets(config)
  assert "3 with an empty side, 2 longer than max_length=32" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_no_batch_exceeds_its_token_budget(corpus, static):
  config, _, data = corpus
  config = dataclasses.replace(config, static_shapes=static)
  lengths = pipeline.bucket_boundaries(8, config.max_length)
  expected = {(config.batch_size // n, n) for n in lengths}
  shapes = set()
  for batch in pipeline.train_dataset(config, data.tokenizer).take(60):
    for key in ("inputs", "targets"):
      rows, length = batch[key].shape
      assert rows * length <= config.batch_size
      assert length <= config.max_length
      shapes.add(tuple(batch[key].shape))
    if static:
      assert batch["inputs"].shape == batch["targets"].shape
  if static:
    assert shapes <= expected and len(shapes) > 1
  else:
    assert not shapes <= expected  # Dynamic batches are trimmed to their content.


@pytest.mark.slow
def test_rows_end_with_eos_and_hold_no_bos(corpus):
  _, _, data = corpus
  batch = next(iter(data.train_fn()))
  for key in ("inputs", "targets"):
    ids = batch[key].numpy()
    for row in ids:
      content = row[row != PAD_ID]
      assert content[-1] == EOS_ID and EOS_ID not in content[:-1]
      assert BOS_ID not in content
      assert (row[len(content):] == PAD_ID).all()  # Padding only at the end.


def _assert_epoch(seen, kept, config, group=1):
  """Every kept pair at least once; the rest only completes a bucket's last step."""
  seen, kept = collections.Counter(seen), collections.Counter(kept)
  assert set(seen) == set(kept)
  assert all(seen[pair] >= count for pair, count in kept.items())
  extra = sum(seen.values()) - sum(kept.values())
  lengths = pipeline.bucket_boundaries(8, config.max_length)
  assert extra < group * sum(pipeline.bucket_batch_sizes(lengths, config.batch_size))


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_train_epoch_has_every_kept_pair(corpus, static):
  config, pairs, data = corpus
  config = dataclasses.replace(config, static_shapes=static)
  seen = []
  for batch in pipeline.train_dataset(config, data.tokenizer, repeat=False):
    seen += _rows(batch, data.tokenizer)
  _assert_epoch(seen, _kept(pairs), config)


@pytest.mark.parametrize("static", [False, True])
def test_eval_has_every_pair_exactly_once(corpus, static):
  config, pairs, data = corpus
  config = dataclasses.replace(config, static_shapes=static)
  seen, shapes = [], set()
  for batch in pipeline.eval_dataset(config, data.tokenizer):
    seen += _rows(batch, data.tokenizer)
    shapes.add(tuple(batch["inputs"].shape))
  expected = [(s.encode(), t.encode()) for s, t in pairs]  # Empty and long ones too.
  assert collections.Counter(seen) == collections.Counter(expected)
  if static:  # the training buckets' shapes, and beyond them for the long pairs
    longest = data.eval_stats.longest
    assert longest > config.max_length
    lengths = dev_batches.eval_lengths(config, longest)
    assert set(pipeline.bucket_boundaries(8, config.max_length)) < set(lengths)
    assert shapes <= {(max(1, config.batch_size // n), n) for n in lengths}
    assert any(length > config.max_length for _, length in shapes)


def test_static_eval_buckets_give_every_replica_of_every_host_one_shape_a_step(corpus):
  """Static dev data per bucket on 2 hosts of 2 replicas (a TPU slice): each host
  yields `steps` steps of 2 batches, all of the bucket's shape (all-PAD batches make
  up the last step), and the 4 replicas together get each of the bucket's pairs once."""
  config, pairs, data = corpus
  evaluation = dev_batches.EvalData(  # buckets 8, 16, 32 and beyond: few datasets
      dataclasses.replace(config, static_shapes=True, bucket_growth=2.0),
      data.eval_fn.split)
  seen = []
  for bucket in evaluation.buckets():
    shape = tuple(evaluation.bucket_shape(bucket))
    steps = evaluation.steps(bucket, 4)
    for host in range(2):
      ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=host,
                                       num_replicas_in_sync=4)
      dataset = evaluation(ctx, bucket=bucket)
      assert tuple(dataset.element_spec["targets"].shape) == shape
      batches = list(dataset)
      assert len(batches) == 2 * steps
      assert {tuple(b[k].shape) for b in batches for k in ("inputs", "targets")} == {shape}
      seen += [row for b in batches for row in _rows(b, data.tokenizer)]
  assert collections.Counter(seen) == collections.Counter(
      (s.encode(), t.encode()) for s, t in pairs)


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_two_hosts_cover_an_epoch_and_rare_long_pairs_are_merged_not_repeated(static):
  """2 input pipelines (hosts), each holding its share: together every kept pair once
  an epoch (but a few completing their pool's last unit); the 3 pairs of a rare long
  bucket, and the 2 of the widest bucket, exactly once, padded with a wider pool."""
  rng = np.random.default_rng(0)
  lengths = np.concatenate([rng.integers(2, 9, 500), [18] * 3, [25] * 100, [30] * 2])
  src = np.concatenate([[10 + i] + [4] * (n - 1) for i, n in enumerate(lengths)])
  pairs = np.stack([lengths, lengths], axis=1).astype(np.int32)
  split = cache.TokenizedSplit(path=None, lengths=pairs, invalid_utf8=0,
                               groups=cache.group_by_length(src, src, pairs))
  config = DataConfig(batch_size=96, max_length=32, static_shapes=static)
  data = pipeline.TrainData(config, split)
  seen, width_of = collections.Counter(), {}
  for host in range(2):
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=host,
                                     num_replicas_in_sync=2)
    for batch in data(ctx, repeat=False):
      inputs = batch["inputs"].numpy()
      np.testing.assert_array_equal(inputs, batch["targets"].numpy())
      for row in inputs:
        seen[row[0] - 10] += 1
        width_of[row[0] - 10] = inputs.shape[1]
  assert set(seen) == set(range(len(lengths)))
  rare = list(range(500, 503)) + [603, 604]
  assert all(seen[i] == 1 for i in rare), [seen[i] for i in rare]
  group_rows = 2 * sum(pipeline.bucket_batch_sizes(data.lengths, 96))
  assert sum(seen.values()) - len(lengths) < group_rows
  assert all(width_of[i] > 19 for i in range(500, 503))  # padded with the 26s (or wider)
  if static:
    assert all(width_of[i] == 32 for i in rare)  # the widest pool took the 26s in


@pytest.mark.slow
def test_shards_partition_the_data(corpus):
  config, pairs, data = corpus
  seen = []
  for i in range(2):
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                     num_replicas_in_sync=2)
    shard = []
    for batch in pipeline.train_dataset(config, data.tokenizer, ctx, repeat=False):
      shard += _rows(batch, data.tokenizer)
      assert batch["inputs"].shape[0] * batch["inputs"].shape[1] <= config.batch_size
    assert 0.3 < len(shard) / NUM_NORMAL < 0.7
    seen += shard
  _assert_epoch(seen, _kept(pairs), config, group=2)


@pytest.mark.slow
def test_shuffle_is_seeded(corpus):
  config, _, data = corpus

  def first(seed):
    ds = pipeline.train_dataset(dataclasses.replace(config, seed=seed), data.tokenizer)
    return [b["inputs"].numpy().tolist() for b in ds.take(3)]

  assert first(1) == first(1)
  assert first(1) != first(2)


@pytest.mark.slow
def test_cache_is_reused_and_invalidated(corpus, monkeypatch):
  config, _, data = corpus
  build = cache._build
  calls = []
  monkeypatch.setattr(cache, "_build", lambda *a: calls.append(a[1]) or build(*a))
  monkeypatch.setattr(sources.textfiles, "validate_parallel_files",
                      lambda *a: pytest.fail("files validated twice"))
  again = pipeline.make_datasets(dataclasses.replace(config, max_length=64))
  assert calls == [] and again.train_stats.too_long == 0  # Same cache, new filter.
  assert next(iter(again.train_fn())) is not None
  monkeypatch.undo()
  monkeypatch.setattr(cache, "_build", lambda *a: calls.append(a[1]) or build(*a))
  os.utime(config.train_tgt, ns=(1, 1))  # A touch: same content, same caches.
  pipeline.make_datasets(config)
  assert calls == []
  with open(config.train_tgt, encoding="utf-8") as f:
    text = f.read()
  with open(config.train_tgt, "w", encoding="utf-8") as f:  # Edit the data.
    f.write(text.replace(" ", "  ", 1))
  pipeline.make_datasets(config)
  assert calls == ["train", "dev"]  # Both splits read the edited file.


@pytest.mark.slow
def test_synthetic_pipeline_and_vocab_size():
  config = DataConfig(source="synthetic", synthetic_task="reverse",
                      synthetic_vocab_size=10, batch_size=64, max_length=16,
                      synthetic_train_size=500, synthetic_eval_size=50)
  data = pipeline.make_datasets(config)
  assert data.vocab_size == 14 and data.train_stats.kept_for_training == 500
  batch = next(iter(data.train_fn()))
  src = data.tokenizer.detokenize(batch["inputs"]).numpy()
  tgt = data.tokenizer.detokenize(batch["targets"]).numpy()
  assert all(s.split()[::-1] == t.split() for s, t in zip(src, tgt))
  assert sum(len(_rows(b, data.tokenizer)) for b in data.eval_fn()) == 50


def test_budget_smaller_than_max_length_is_rejected():
  with pytest.raises(ValueError, match="batch_size=16.*max_length=32"):
    pipeline.make_datasets(DataConfig(batch_size=16, max_length=32))


def test_nothing_left_after_filtering_is_a_clear_error():
  config = DataConfig(synthetic_min_length=20, synthetic_max_length=30, max_length=16,
                      batch_size=64, synthetic_train_size=10)
  with pytest.raises(DataError, match="No training pairs left.*raise --max_length"):
    pipeline.make_datasets(config)


def test_unknown_source_is_a_clear_error():
  with pytest.raises(DataError, match="parsing"):
    pipeline.make_datasets(DataConfig(source="parsing"))


@pytest.mark.slow
@pytest.mark.parametrize("pipelines,accum", [(1, 1), (2, 2)])
def test_start_step_equals_skipping_and_reaches_any_step_at_once(pipelines, accum):
  """Resume: starting at step k gives exactly the batches that follow k steps, on every
  input pipeline, and step 10**9 is reached at once (skipping replayed every earlier
  batch)."""
  config = DataConfig(synthetic_train_size=300, batch_size=64, max_length=16)
  data = pipeline.make_datasets(config)
  per_step = accum  # one replica per pipeline
  for pipeline_id in range(pipelines):
    ctx = tf.distribute.InputContext(num_input_pipelines=pipelines,
                                     input_pipeline_id=pipeline_id,
                                     num_replicas_in_sync=pipelines)
    straight = data.train_fn(ctx, accum_steps=accum).skip(7 * per_step).take(9)
    resumed = data.train_fn(ctx, start_step=7, accum_steps=accum).take(9)
    for a, b in zip(straight, resumed, strict=True):
      assert a["inputs"].numpy().tolist() == b["inputs"].numpy().tolist()
      assert a["targets"].numpy().tolist() == b["targets"].numpy().tolist()
  # Step 10**9 (tens of millions of epochs of this corpus) is computed, not replayed:
  # its batch holds the pairs the plan gives for that step, read at once.
  far = 10**9
  batch = next(iter(data.train_fn(start_step=far)))
  _, pairs = data.train_fn.plan(1).unit(far)
  src, _, lengths = sources.data_source(config).examples("train")
  starts = np.cumsum(lengths) - lengths
  want = [src[starts[i]:starts[i] + lengths[i]].tolist() + [EOS_ID] for i in pairs[0]]
  assert [row[row != PAD_ID].tolist() for row in batch["inputs"].numpy()] == want


@pytest.mark.slow
def test_interrupted_cache_build_is_not_trusted(tmp_path, monkeypatch):
  folder = str(tmp_path)
  (src, tgt), pairs = _write_corpus(folder, seed=1)
  config = DataConfig(source="files", train_src=src, train_tgt=tgt, vocab_size=100,
                      data_dir=os.path.join(folder, "data"), max_length=32, batch_size=96)

  def crash(*args):
    raise KeyboardInterrupt("killed while tokenizing")

  monkeypatch.setattr(cache, "_write_ids", crash)
  with pytest.raises(KeyboardInterrupt):
    pipeline.make_datasets(config)
  monkeypatch.undo()
  data = pipeline.make_datasets(config)
  assert data.train_stats.pairs == len(pairs)
  seen = []
  for batch in pipeline.train_dataset(config, data.tokenizer, repeat=False):
    seen += _rows(batch, data.tokenizer)
  _assert_epoch(seen, _kept(pairs), config)


@pytest.mark.slow
def test_shuffle_covers_concatenated_corpora(tmp_path):
  """Two corpora concatenated (as WMT14 is distributed: Europarl, then Common Crawl,
  ...): the first 1,000 training pairs of an epoch come from both, in proportion; the
  epoch holds every pair, and so do 2 workers' shards together, each half of it."""
  n = 15_000  # per corpus: more than the old 10,000-pair buffer and 1,000 pairs after it
  src = [f"alpha {i % 97} x" for i in range(n)] + [f"beta {i % 89} y" for i in range(n)]
  paths = [str(tmp_path / "train.src"), str(tmp_path / "train.tgt")]
  for path in paths:
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(src) + "\n")
  config = DataConfig(source="files", train_src=paths[0], train_tgt=paths[1],
                      data_dir=str(tmp_path / "data"), vocab_size=300, max_length=16,
                      batch_size=1024)
  data = pipeline.make_datasets(config)
  first, seen = [], []
  for batch in pipeline.train_dataset(config, data.tokenizer, repeat=False):
    rows = _rows(batch, data.tokenizer)
    seen += rows
    first += [s for s, _ in rows][:max(0, 1000 - len(first))]
  expected = [(s.encode(), s.encode()) for s in src]
  _assert_epoch(seen, expected, config)
  workers = []
  for i in range(2):  # 2 input pipelines: halves that make up the epoch
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i,
                                     num_replicas_in_sync=2)
    mine = [row for b in pipeline.train_dataset(config, data.tokenizer, ctx, repeat=False)
            for row in _rows(b, data.tokenizer)]
    assert 0.45 < len(mine) / (2 * n) < 0.55
    workers += mine
  _assert_epoch(workers, expected, config, group=2)
  # A whole-corpus shuffle: a binomial share (sd 0.016), loosely bounded. Reading in
  # corpus order gives 1.0 (and a 10,000-pair buffer over it did too).
  share = sum(s.startswith(b"alpha") for s in first) / len(first)
  assert 0.35 < share < 0.65, share
  for seed in (2, 3):  # other seeds, other orders, the same mix
    other = pipeline.train_dataset(dataclasses.replace(config, seed=seed), data.tokenizer)
    rows = [s for b in other.take(20) for s, _ in _rows(b, data.tokenizer)]
    assert 0.3 < sum(s.startswith(b"alpha") for s in rows) / len(rows) < 0.7


@pytest.mark.slow
def test_every_worker_and_replica_of_a_step_gets_the_same_shape():
  """TPU pods: 2 workers (input pipelines) of 2 replicas each, 2 micro-batches: with
  static shapes the 8 batches of every step share one [rows, length], the bucket's,
  and the steps use a small set of shapes; without static shapes they differ."""
  config = DataConfig(synthetic_train_size=3000, synthetic_max_length=20, max_length=24,
                      batch_size=128, bucket_growth=1.5)
  lengths = pipeline.bucket_boundaries(8, 24, 1.5)
  buckets = {(128 // n, n) for n in lengths}

  def shapes_per_step(static, steps=25):
    per_worker = []
    for worker in range(2):
      ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker,
                                       num_replicas_in_sync=4)
      # Each worker (host) builds its own plan from the same seed, as on a pod.
      ds = pipeline.train_dataset(dataclasses.replace(config, static_shapes=static),
                                  split=pipeline.load_split(config, "train", None),
                                  input_context=ctx, accum_steps=2)
      shapes = [(tuple(b["inputs"].shape), tuple(b["targets"].shape))
                for b in ds.take(4 * steps)]
      per_worker.append([shapes[4 * i:4 * i + 4] for i in range(steps)])
    return [a + b for a, b in zip(*per_worker)]

  static = shapes_per_step(True)
  assert all(len(set(step)) == 1 for step in static), static
  programs = {step[0][0] for step in static}
  assert programs <= buckets and len(programs) >= 2
  assert all(src == tgt for step in static for src, tgt in step)
  dynamic = shapes_per_step(False)
  assert any(len(set(step)) > 1 for step in dynamic)




def _grouped_split(longest, pairs_per_length=3):
  """An in-memory split with pairs of every padded length from 2 to `longest`."""
  lengths = np.repeat(np.arange(1, longest), pairs_per_length).astype(np.int32)
  ids = np.concatenate([np.full([n], 5 + n % 7, np.int32) for n in lengths])
  pairs = np.stack([lengths, lengths], axis=1)
  return cache.TokenizedSplit(path=None, lengths=pairs, invalid_utf8=0,
                              groups=cache.group_by_length(ids, ids, pairs))


def test_the_dataset_graph_does_not_grow_with_the_number_of_lengths():
  """The training dataset reads its ids one length after another in a loop: unrolled,
  each padded length added its ops (256 lengths: a graph of about 40,000 ops that took
  half a minute to build and start before the first batch, on every input pipeline
  and every static bucket)."""
  sizes = {}
  for longest in (8, 120):
    config = DataConfig(batch_size=512, max_length=longest + 1)
    data = pipeline.TrainData(config, _grouped_split(longest))
    graph = tf.compat.v1.GraphDef.FromString(
        data(None)._as_serialized_graph().numpy())  # pylint: disable=protected-access
    sizes[longest] = len(graph.node) + sum(len(f.node_def) for f in graph.library.function)
    batch = next(iter(data(None)))
    assert int(tf.reduce_max(tf.reduce_sum(tf.cast(batch["inputs"] > 0, tf.int32), 1))) > 0
  assert sizes[120] < 1.2 * sizes[8], sizes


def test_a_cache_whose_files_disagree_with_its_lengths_is_named(corpus, tmp_path):
  """A cache file changed under the pipeline (a partial copy, a disk error): the first
  batch stops with the directory, the length and what to do."""
  config, _, data = corpus
  build = os.path.dirname(next(
      os.path.join(root, name) for root, _, names in os.walk(config.data_dir)
      for name in names if name.endswith(".lengths.bin")))
  copy = tmp_path / "cache"
  shutil.copytree(build, copy)
  split = dataclasses.replace(data.train_fn.split, path=str(copy))
  name = sorted(n for n in os.listdir(copy) if n.endswith(".lengths.bin"))[2]
  counts = np.fromfile(copy / name, "<i4")
  counts[0] = 0  # a kept pair whose source side is now empty
  counts.tofile(copy / name)
  with pytest.raises(tf.errors.InvalidArgumentError) as error:
    next(iter(pipeline.TrainData(config, split)(None)))
  padded = int(name.split("-")[1].split(".")[0])
  assert (f"the cache files of {copy} for padded length {padded} disagree with its "
          "lengths.npy: delete that directory and rerun to tokenize again"
          ) in error.value.message


def test_bucket_datasets_run_without_autotuning_and_the_dynamic_one_with_it():
  """A bucket's dataset has fixed parallelism and buffers: an autotuning thread there
  tunes nothing and held each iterator's deletion for seconds (the end of training)."""
  config = DataConfig(source="synthetic", synthetic_max_length=10, synthetic_vocab_size=16,
                      synthetic_train_size=200, synthetic_eval_size=10, max_length=12,
                      batch_size=64, static_shapes=True)
  data = pipeline.make_datasets(config)
  bucket = data.train_fn.plan(1).bucket_of_step(0)
  static = data.train_fn(bucket=bucket)
  assert static.options().autotune.enabled is False
  assert next(iter(static))["targets"].shape == data.train_fn.bucket_shape(bucket)
  dynamic = pipeline.make_datasets(dataclasses.replace(config, static_shapes=False))
  assert dynamic.train_fn().options().autotune.enabled is not False
