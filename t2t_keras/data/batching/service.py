"""Training input served by tf.data service: the batch plan's pipelines on other hosts.

An input-bound run (a TPU pod whose hosts' CPUs cannot keep up with the chips) moves
its input pipelines to CPU machines: each host's training dataset is sent, as a graph,
to a tf.data service worker, which runs it and streams the batches back. `ServedTrainData`
wraps a `pipeline.TrainData` so that the trainer reads it as it reads the local one.

What stays guaranteed, and why this way:
- The same batches as without the service, in the same order (so one bucket per step
  on every replica, and bitwise the same training with --deterministic). The dataset is
  the local one, unchanged, processed with ShardingPolicy.OFF by ONE worker: that worker
  runs the whole graph, in order. Dynamic or data sharding would split it among workers
  who answer in whatever order they finish, and coordinated reads
  (consumer_index/num_consumers) hand out rounds from each worker's own copy of the
  stream, so with several workers a round would repeat another's steps; both would
  break the step -> batch map the plan defines. Hence one worker per dispatcher (two
  would each send every batch); more CPU hosts are more dispatcher+worker pairs, and
  input pipeline i reads from pair i mod their number.
- One consumer per job: each input pipeline (one per host) already makes its own share
  of every step (`TrainData` with its input context), so there is nothing to share.
  The job is anonymous: tf.data service makes a new one for each iterator, which
  starts at the step the iterator was made for. A resumed run (or a new bucket's
  iterator with static shapes) never attaches to a job an earlier run left half-read,
  as a named job would.

The worker needs no Python of this project, but reads the tokenized caches itself, at
the path the trainer uses (so --data_dir must be shared storage, e.g. gs://). Dev
evaluation stays local: one small pass every --eval_every steps.
"""

from __future__ import annotations

import socket
from typing import List, Optional

import tensorflow as tf

from t2t_keras.configs import DATA_SERVICE_ADDRESS
from t2t_keras.errors import UserError

START_HINT = ("start a dispatcher and one worker with `python -m "
              "t2t_keras.tools.data_service --dispatcher --worker --port=PORT` on a "
              "machine the trainer reaches (docs/training.md, tf.data service)")


class ServiceError(UserError, ConnectionError):
  """A tf.data service dispatcher the trainer cannot reach; the message says what to do."""


def addresses(value: str) -> List[str]:
  """The dispatchers of a --data_service value (checked by `TrainConfig.validate`),
  each as grpc://HOST:PORT."""
  return ["grpc://{}:{}".format(*DATA_SERVICE_ADDRESS.match(part.strip()).groups()[1:])
          for part in value.split(",")]


def check_reachable(dispatchers: List[str], timeout: float = 10.0) -> None:
  """Raises ServiceError unless every dispatcher accepts a connection.

  Without this check the first batch would wait forever: tf.data service clients
  retry an absent dispatcher without end.
  """
  for address in dispatchers:
    host, port = address.removeprefix("grpc://").rsplit(":", 1)
    try:
      socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
      raise ServiceError(
          f"--data_service: no tf.data service dispatcher answers at {address} "
          f"({error}); {START_HINT}, or drop --data_service to read the input "
          "here.") from None


def distribute(dataset: tf.data.Dataset, address: str) -> tf.data.Dataset:
  """`dataset`, run by the worker of the dispatcher at `address` (see module docstring:
  ShardingPolicy.OFF and an anonymous job keep its order and start)."""
  return dataset.apply(tf.data.experimental.service.distribute(
      processing_mode=tf.data.experimental.service.ShardingPolicy.OFF, service=address))


class ServedTrainData:
  """A `pipeline.TrainData` whose datasets come through tf.data service.

  The trainer sees the TrainData's interface (its plan, bucket shapes, static_shapes)
  and calls it as it calls the TrainData; input pipeline i of a run reads from
  dispatcher i mod len(dispatchers).

  Args:
    train_data: the local TrainData (the worker runs the graphs it builds).
    dispatchers: addresses from `addresses`.
  """

  def __init__(self, train_data, dispatchers: List[str]):
    self.train_data = train_data
    self.dispatchers = list(dispatchers)

  def __getattr__(self, name):  # plan, bucket_shape, static_shapes, config, ...
    if name == "train_data":  # not set yet (copy, pickle): no recursion
      raise AttributeError(name)
    return getattr(self.train_data, name)

  # The explicit start_step tells the trainer that this function seeks (Trainer._resuming).
  def __call__(self, input_context: Optional[tf.distribute.InputContext] = None,
               start_step: int = 0, **kwargs) -> tf.data.Dataset:
    pipeline = input_context.input_pipeline_id if input_context is not None else 0
    dataset = self.train_data(input_context, start_step=start_step, **kwargs)
    return distribute(dataset, self.dispatchers[pipeline % len(self.dispatchers)])
