"""The tf.distribute strategy named by --strategy, created before anything else.

default: the current device (CPU or one GPU). mirrored: all local GPUs, or the CPU split
into --num_logical_devices devices (how tests compare 1 and 2 replicas).
multi_worker_mirrored: the hosts in TF_CONFIG. tpu: a Cloud TPU by name or address.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from t2t_keras.configs import TrainConfig
from t2t_keras.errors import UserError


class StrategyError(UserError, ValueError):
  """A --strategy that cannot be created here; the message says what to do."""


def split_cpu(num_devices: int) -> None:
  """Splits the first CPU into `num_devices` logical devices (before TF initialises)."""
  cpus = tf.config.list_physical_devices("CPU")
  current = tf.config.get_logical_device_configuration(cpus[0])
  if current and len(current) == num_devices:
    return
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)
  except RuntimeError as error:
    raise StrategyError(
        f"--num_logical_devices={num_devices}: TensorFlow was already initialised with "
        f"{len(tf.config.list_logical_devices('CPU'))} CPU device(s); split the CPU "
        "before any TensorFlow op runs.") from error


def create_strategy(config: TrainConfig) -> tf.distribute.Strategy:
  """Creates the strategy; raises StrategyError with what to do when it cannot.

  Raises:
    ConfigError: the settings do not go together (`TrainConfig.validate`).
    StrategyError: the strategy cannot be made here (no TF_CONFIG, ...).
  """
  config.validate()
  if config.num_logical_devices > 1:
    split_cpu(config.num_logical_devices)
  if config.strategy == "default":
    return tf.distribute.get_strategy()
  if config.strategy == "mirrored":
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
      return tf.distribute.MirroredStrategy()
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(
        devices=cpus, cross_device_ops=tf.distribute.ReductionToOneDevice())
  if config.strategy == "multi_worker_mirrored":
    if "TF_CONFIG" not in os.environ:
      raise StrategyError("--strategy=multi_worker_mirrored needs the TF_CONFIG "
                          "environment variable (cluster hosts and this worker's index); "
                          "see BUILD.md.")
    try:  # a clear JSON error beats a hang later
      json.loads(os.environ["TF_CONFIG"])
    except json.JSONDecodeError as error:
      raise StrategyError(f"TF_CONFIG is not valid JSON ({error}): see BUILD.md for its "
                          "form.") from None
    return tf.distribute.MultiWorkerMirroredStrategy()
  if config.strategy == "tpu":
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=config.tpu, zone=config.tpu_zone, project=config.gcp_project)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  raise AssertionError(f"--strategy={config.strategy!r}")  # TrainConfig.validate refuses it


def chief_and_worker_id(strategy: tf.distribute.Strategy):
  """(is this process the chief, its worker index): (True, 0) outside multi-worker runs.

  The chief is the "chief" task if TF_CONFIG names one, else worker 0.
  """
  resolver = getattr(strategy.extended, "_cluster_resolver", None) or getattr(
      strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return True, 0
  task_type, task_id = resolver.task_type, resolver.task_id or 0
  has_chief = "chief" in resolver.cluster_spec().as_dict()
  chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)
  return chief, task_id if task_type == "worker" else 0


class Agreement:
  """Decisions that every worker of a multi-worker run shares, through one collective.

  A worker that left the training loop alone would leave the others waiting forever in
  the next all-reduce, so whatever ends or changes the loop is agreed: a flag in
  `any_worker` (a stop signal) is true everywhere if it is true on some worker; a flag
  in `chief_decides` (its clock, its dev score) is the chief's. Every worker must make
  the same calls in the same order. Outside multi-worker runs the flags are returned
  as they are and nothing is communicated.
  """

  def __init__(self, strategy: tf.distribute.Strategy):
    self.strategy = strategy
    self.chief, self.worker_id = chief_and_worker_id(strategy)
    self.multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    self._sum = None

  def __call__(self, any_worker=(), chief_decides=()) -> list:
    flags = [bool(v) for v in any_worker] + [bool(v) for v in chief_decides]
    if not self.multi_worker:
      return flags
    mine = [float(v) for v in any_worker] + [
        float(v) if self.chief else 0.0 for v in chief_decides]
    return [bool(v > 0) for v in self._total(mine)]

  def _total(self, values) -> list:
    """The sums over all workers of each worker's `values` (one collective)."""
    if self._sum is None:
      strategy = self.strategy

      # One replica per worker contributes, so that a worker's value counts once
      # whatever its number of devices (8 GPUs would make the chief's step 8 times
      # itself). Replicas are numbered worker by worker: the first local one is at a
      # multiple of the local count.
      local = len(strategy.extended.worker_devices)

      def total(values):  # reduced as the train loop reduces its sums: over all workers
        def contribution():
          replica = tf.distribute.get_replica_context().replica_id_in_sync_group
          first = tf.equal(tf.math.floormod(replica, local), 0)
          return tf.where(first, values, tf.zeros_like(values))
        per_replica = strategy.run(contribution)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
      self._sum = tf.function(total)
    return list(self._sum(tf.constant(values, tf.float32)).numpy())

  def chief_number(self, value: int) -> int:
    """The chief's `value` (a whole number, |value| < 2**24), on every worker."""
    if not self.multi_worker:
      return int(value)
    return int(round(float(self._total([float(value) if self.chief else 0.0])[0])))

  def barrier(self, failed: bool = False) -> bool:
    """Returns once every worker has called it (e.g. after the chief wrote the data);
    returns whether some worker called it with `failed`."""
    return self(any_worker=[failed])[0]
