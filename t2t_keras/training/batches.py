"""Where the train loop's batches come from (`TrainBatches`): one iterator of all
batches, or one per static-shape bucket, from the resumed step on.

The trainer's host loop asks it for the iterator of a step, the bucket whose program
runs it and how many steps may share a call; `release` drops the iterators when the
loop is done.
"""

from __future__ import annotations

import logging as logging_lib
import threading
from typing import Callable

import tensorflow as tf

from t2t_keras import console


class TrainBatches:
  """Where the train loop's batches come from, from the resumed step on.

  A TrainData (the data package's) in static mode gives one distributed iterator per
  bucket, created when its bucket first comes up: each has a fully static shape, so
  the compiled loop is traced (and XLA compiles) once per bucket. The plan keeps a
  bucket for runs of min(--steps_per_loop, --static_run_steps) steps and a call stops
  at the end of its run, so a TPU loop runs on one shape. Otherwise, and with packed
  rows (--packed_length: every batch [R, L] whatever its bucket, so one program), one
  iterator of all batches (see Trainer._resuming).
  """

  def __init__(self, trainer, dataset_fn, step: int,
               progress: Callable[[str], None] = print):
    cfg = trainer.config
    self.progress = progress
    self.strategy = trainer.strategy
    self.dataset_fn = dataset_fn
    self.per_bucket = (bool(getattr(dataset_fn, "static_shapes", False))
                       and hasattr(dataset_fn, "plan")
                       and not getattr(dataset_fn, "packed_length", 0))
    if self.per_bucket:
      self.accum_steps = cfg.accum_steps
      self.run = min(cfg.steps_per_loop, cfg.static_run_steps)
      self.plan = dataset_fn.plan(self.strategy.num_replicas_in_sync * cfg.accum_steps,
                                  self.run)
      self.iterators = {}
      ByDesignRetracing.install()
    else:
      self.single = iter(self.strategy.distribute_datasets_from_function(
          trainer._resuming(dataset_fn, step)))  # pylint: disable=protected-access
      if getattr(dataset_fn, "packed_length", 0):
        rows, length = dataset_fn.bucket_shape(0)
        pairs = dataset_fn.plan(self.strategy.num_replicas_in_sync * cfg.accum_steps).strata
        progress(f"packed rows: every batch [{rows}, {length}], up to {pairs} pairs of "
                 "mixed lengths (--packed_length): one training program for all lengths")

  def release(self) -> None:
    """Drops the iterators once the loop is done: their background threads (prefetch,
    tf.data's autotuning) would run on while the process evaluates, decodes examples
    or exports, and in a process that trains several times (a notebook, the tests)
    they pile up. `buckets_used` keeps which buckets came up.

    They are dropped on a thread of their own: deleting a tf.data iterator waits for
    its autotuning thread, which may sleep for up to its optimization period before
    it sees the cancellation. On 2 devices, or with static shapes, that held the end
    of training for 2-20 s (TensorFlow 2.21, docs/benchmarks.md). The thread is not a
    daemon: Python waits for it before the process exits (a command's own exit does
    not: it only frees memory, `console.exit_without_teardown`)."""
    if self.per_bucket:
      self.buckets_used = sorted(self.iterators)
      dropped, self.iterators = list(self.iterators.values()), {}
    else:
      dropped, self.single = [self.single], None
    threading.Thread(target=dropped.clear, name=console.FREES_MEMORY_ONLY).start()

  def bucket_of_step(self, step: int):
    """The bucket (static shapes) whose program runs `step`; None: the one program."""
    return self.plan.bucket_of_step(step) if self.per_bucket else None

  def steps_left_in_run(self, step: int) -> int:
    """Steps from `step` that are sure to share its iterator."""
    return self.plan.steps_left_in_run(step) if self.per_bucket else 1 << 62

  def iterator(self, step: int):
    if not self.per_bucket:
      return self.single
    bucket = self.plan.bucket_of_step(step)
    if bucket not in self.iterators:  # its earlier steps, if any, are all behind us
      def dataset_fn(ctx, bucket=bucket, step=step):
        return self.dataset_fn(ctx, start_step=step, accum_steps=self.accum_steps,
                               bucket=bucket, steps_per_run=self.run)
      self.iterators[bucket] = iter(
          self.strategy.distribute_datasets_from_function(dataset_fn))
      rows, length = self.dataset_fn.bucket_shape(bucket)
      self.progress(f"static shapes: bucket [{rows}, {length}] first used at step {step} "
                    f"(program {len(self.iterators)} of {len(self.plan.pool_bucket)}: "
                    "the train loop is traced and compiled once per bucket)")
    return self.iterators[bucket]


class ByDesignRetracing(logging_lib.Filter):
  """Drops TensorFlow's "triggered tf.function retracing" warning."""

  @classmethod
  def install(cls) -> None:
    """One trace per bucket is the design with static shapes, not a mistake to warn
    about."""
    if not any(isinstance(f, cls) for f in tf.get_logger().filters):
      tf.get_logger().addFilter(cls())

  def filter(self, record: logging_lib.LogRecord) -> bool:
    return "triggered tf.function retracing" not in record.getMessage()
