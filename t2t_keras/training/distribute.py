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
    raise RuntimeError(
        f"--num_logical_devices={num_devices}: TensorFlow was already initialised with "
        f"{len(tf.config.list_logical_devices('CPU'))} CPU device(s); split the CPU "
        "before any TensorFlow op runs.") from error


def create_strategy(config: TrainConfig) -> tf.distribute.Strategy:
  """Creates the strategy; raises ValueError with what to do when it cannot."""
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
      raise ValueError("--strategy=multi_worker_mirrored needs the TF_CONFIG environment "
                       "variable (cluster hosts and this worker's index); see BUILD.md.")
    json.loads(os.environ["TF_CONFIG"])  # a clear JSON error beats a hang later
    return tf.distribute.MultiWorkerMirroredStrategy()
  if config.strategy == "tpu":
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=config.tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  raise ValueError(f"--strategy={config.strategy!r}: expected default, mirrored, "
                   "multi_worker_mirrored or tpu")
