"""Tests of t2t_keras.data.batching.plan: the batch plan (TensorFlow ops of seed and step)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.data.batching import pipeline, plan

BOUNDARIES = pipeline.bucket_boundaries(8, 32)


def _lengths(n=2000, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, 40, size=[n, 2])  # some empty, some too long
  return lengths


@pytest.mark.parametrize("group,pipelines", [(1, 1), (2, 1), (8, 1), (8, 2)])
def test_each_step_is_one_bucket_and_an_epoch_covers_every_kept_pair(group, pipelines):
  lengths = _lengths()
  batch_plan = plan.BatchPlan(lengths, BOUNDARIES, batch_size=128, group=group, seed=1)
  padded = lengths.max(axis=1) + 1
  kept = np.flatnonzero((lengths.min(axis=1) > 0) & (padded <= 32))
  seen = collections.Counter()
  for step in range(batch_plan.units_per_epoch):
    bucket, pairs = batch_plan.unit(step, pipelines)
    rows = 128 // BOUNDARIES[bucket]
    assert pairs.shape == (group, rows)
    # every pair of the step fits the bucket and not the pool below (rarer buckets
    # between the two are merged into this one)
    pool = batch_plan.pool_of_bucket(bucket)
    shortest, longest = batch_plan.pool_lengths(pool)
    assert longest == BOUNDARIES[bucket] and (padded[pairs] <= longest).all()
    assert (padded[pairs] > shortest).all()
    seen.update(pairs.ravel().tolist())
  assert set(seen) == set(kept.tolist())
  extra = sum(seen.values()) - len(kept)
  assert extra < group * sum(128 // n for n in BOUNDARIES)  # only last units are filled


def test_rare_buckets_are_merged_into_wider_ones_not_repeated():
  """A bucket with fewer pairs than one unit holds (in the middle, and the widest)
  joins the next wider pool: its pairs are trained on once an epoch, padded wider."""
  lengths = np.concatenate([np.full([600, 2], 5), np.full([3, 2], 12),  # rare middle
                            np.full([400, 2], 20), np.full([2, 2], 30)])  # rare widest
  batch_plan = plan.BatchPlan(lengths, BOUNDARIES, batch_size=128, group=2, seed=1)
  padded = lengths.max(axis=1) + 1
  buckets = np.searchsorted(BOUNDARIES, padded)
  assert set(batch_plan.pool_bucket) == {buckets[0], buckets[-1]}
  seen = collections.Counter()
  for step in range(batch_plan.units_per_epoch):
    bucket, pairs = batch_plan.unit(step)
    seen.update(pairs.ravel().tolist())
    if (padded[pairs] == 13).any():
      assert bucket == buckets[-1]  # the rare middle pairs ride with the long ones
  assert set(seen) == set(range(len(lengths)))
  for rare in (600, 601, 602, 1003, 1004):
    assert seen[rare] == 1  # not repeated to fill a unit of its own


def test_same_seed_same_plan_epochs_and_seeds_differ():
  lengths = _lengths()
  a = plan.BatchPlan(lengths, BOUNDARIES, 128, 2, seed=1)
  b = plan.BatchPlan(lengths, BOUNDARIES, 128, 2, seed=1)
  c = plan.BatchPlan(lengths, BOUNDARIES, 128, 2, seed=2)
  units = a.units_per_epoch

  def steps(p, first):
    return [p.unit(s)[1].tolist() for s in range(first, first + 5)]

  assert steps(a, 0) == steps(b, 0)  # every worker computes the same plan
  assert steps(a, 0) != steps(c, 0)
  assert steps(a, 0) != steps(a, units)  # the next epoch is another order
  assert steps(a, 3 * units + 2) == steps(b, 3 * units + 2)  # random access


def test_tiny_corpus_still_fills_whole_steps():
  """Fewer pairs than one step holds: repeated to fill it, never dropped or empty."""
  lengths = np.array([[3, 4], [5, 2], [0, 3]])
  batch_plan = plan.BatchPlan(lengths, BOUNDARIES, batch_size=64, group=4, seed=1)
  assert batch_plan.units_per_epoch == 1
  bucket, pairs = batch_plan.unit(0)
  assert bucket == 0 and pairs.shape == (4, 8)
  assert set(pairs.ravel().tolist()) == {0, 1}


def test_runs_share_a_bucket_and_an_epoch_trains_each_unit_once():
  """With run=5 (5 steps per compiled call), the steps a run covers share a bucket,
  runs are at most 5 long, a bucket's steps are not padded to whole runs, and each
  epoch trains every unit of every pool once."""
  lengths = _lengths()
  batch_plan = plan.BatchPlan(lengths, BOUNDARIES, 128, group=2, seed=3, run=5)
  assert batch_plan.units_per_epoch == plan.BatchPlan(
      lengths, BOUNDARIES, 128, group=2, seed=3).units_per_epoch
  units = batch_plan.units_per_epoch
  steps = range(2 * units + 7)  # into the third epoch
  buckets = [batch_plan.bucket_of_step(s) for s in steps]
  step, short_runs = 0, 0
  while step < 2 * units:
    left = batch_plan.steps_left_in_run(step)
    assert 1 <= left <= 5 and len(set(buckets[step:step + left])) == 1
    assert step % units + left <= units  # a run never crosses into the next epoch
    short_runs += left < 5
    step += left
  assert short_runs >= 2  # some buckets end with a shorter run instead of repeats
  assert len(set(buckets)) > 3
  for epoch in range(2):
    pool, k, _ = (t.numpy() for t in batch_plan.epoch_order(epoch))
    assert sorted(zip(pool.tolist(), k.tolist())) == [
        (p, i) for p, n in enumerate(batch_plan.units_per_pool) for i in range(n)]


def test_order_is_tensorflow_ops_of_seed_and_epoch():
  """The plan's ops in a tf.function (as in the dataset graph) give the host's plan."""
  batch_plan = plan.BatchPlan(_lengths(), BOUNDARIES, 128, 2, seed=1)
  traced = tf.function(batch_plan.epoch_order)
  for epoch in (0, 5, 10**7):
    host = [batch_plan.bucket_of_step(epoch * batch_plan.units_per_epoch + u)
            for u in range(batch_plan.units_per_epoch)]
    pool = traced(tf.constant(epoch, tf.int64))[0].numpy()
    assert [batch_plan.pool_bucket[p] for p in pool] == host
