"""Tests of t2t_keras.data.plan: the host-side batch plan."""

import collections

import numpy as np
import pytest

from t2t_keras.data import pipeline, plan

BOUNDARIES = pipeline.bucket_boundaries(8, 32)


def _lengths(n=2000, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, 40, size=[n, 2])  # some empty, some too long
  return lengths


@pytest.mark.parametrize("group", [1, 2, 8])
def test_each_step_is_one_bucket_and_an_epoch_covers_every_kept_pair(group):
  lengths = _lengths()
  batch_plan = plan.BatchPlan(lengths, BOUNDARIES, batch_size=128, group=group, seed=1)
  padded = lengths.max(axis=1) + 1
  kept = np.flatnonzero((lengths.min(axis=1) > 0) & (padded <= 32))
  seen = collections.Counter()
  for step in range(batch_plan.units_per_epoch):
    bucket, pairs = batch_plan.unit(step)
    rows = 128 // BOUNDARIES[bucket]
    assert pairs.shape == (group, rows)
    # every pair of the step fits the bucket and not the one below
    assert (padded[pairs] <= BOUNDARIES[bucket]).all()
    assert bucket == 0 or (padded[pairs] > BOUNDARIES[bucket - 1]).all()
    seen.update(pairs.ravel().tolist())
  assert set(seen) == set(kept.tolist())
  extra = sum(seen.values()) - len(kept)
  assert extra < group * sum(128 // n for n in BOUNDARIES)  # only last units are filled


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


def test_runs_share_a_bucket_and_per_bucket_steps_index_the_plan():
  """With run=5 (5 steps per compiled call), the steps a run covers share a bucket,
  runs are at most 5 long, and a bucket's steps are not padded to whole runs; the k-th
  step of a bucket (what a per-bucket dataset reads) is found both ways."""
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
  for bucket in set(buckets):
    mine = [s for s in steps if buckets[s] == bucket]
    assert [batch_plan.bucket_step(bucket, k) for k in range(len(mine))] == mine
    for k, step in enumerate(mine):
      assert batch_plan.bucket_steps_before(bucket, step) == k


def test_threads_that_need_the_same_epoch_compute_it_once(monkeypatch):
  """tf.data map threads asking for one epoch at once share one computation (an
  epoch of a WMT-size corpus is seconds of work), and get the same plan."""
  import threading
  import time
  batch_plan = plan.BatchPlan(_lengths(), BOUNDARIES, 128, 2, seed=1)
  made = []
  make = plan.BatchPlan._make_epoch

  def slow_make(self, number):
    made.append(number)
    time.sleep(0.2)  # every thread arrives while the first is still computing
    return make(self, number)

  monkeypatch.setattr(plan.BatchPlan, "_make_epoch", slow_make)
  got = [None] * 8
  start = threading.Barrier(len(got))

  def ask(i):
    start.wait()
    got[i] = batch_plan.epoch(3)

  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(got))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert made == [3]
  assert all(epoch is got[0] for epoch in got)
  batch_plan.epoch(4)  # another epoch is computed, not served from epoch 3
  assert made == [3, 4]
