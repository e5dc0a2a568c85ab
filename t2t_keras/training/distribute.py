"""The tf.distribute strategy named by --strategy, created before anything else.

default: the current device (CPU or one GPU). mirrored: all local GPUs, or the CPU split
into --num_logical_devices devices (how tests compare 1 and 2 replicas).
multi_worker_mirrored: the hosts in TF_CONFIG. tpu: a Cloud TPU by name or address.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from typing import Optional

import tensorflow as tf

from t2t_keras.configs import TrainConfig
from t2t_keras.errors import TrainingError, UserError


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


# The client process's CPU once a remote master is connected (connect_to_cluster names
# the local process's job "localhost").
CLIENT_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def remote_master() -> bool:
  """Whether this process drives a remote master (a pod slice's --tpu=NAME).

  `tf.config.experimental_connect_to_cluster` with a remote master joins the cluster
  as the job "localhost" and makes the master's CPU the default device of every op
  this process runs next. A TPU VM's own TPU (--tpu=local) and multi-worker runs
  (each worker is a task of the cluster itself) have none.
  """
  from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
  server_def = context.get_server_def()
  return server_def is not None and server_def.job_name == "localhost"


def client_cpu() -> str:
  """This process's CPU as a device name, the client's under a remote master."""
  return CLIENT_CPU if remote_master() else "/device:CPU:0"


def on_client():
  """A scope for work that must run in this process: under a remote master, its CPU.

  The TPU hosts of a pod slice run TensorFlow alone (tensorflow-text's SentencePiece
  ops are not registered there), so the tokenizer and the tokenized cache (a tf.data
  pipeline: a dataset made inside the scope runs on its device) are made in the
  client, and dev BLEU decodes a copy of the weights there (`client_cpu`,
  `evaluator.DecodingWeights`). The input pipelines that
  `strategy.distribute_datasets_from_function` places on the hosts read the cache
  with core ops only. Without a remote master nothing changes.
  """
  return tf.device(CLIENT_CPU) if remote_master() else contextlib.nullcontext()


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
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=collective_implementation(config.collective)))
  if config.strategy == "tpu":
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=config.tpu, zone=config.tpu_zone, project=config.gcp_project)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  raise AssertionError(f"--strategy={config.strategy!r}")  # TrainConfig.validate refuses it


def collective_implementation(collective: str):
  """The all-reduce of a multi-worker run, from --collective.

  TensorFlow's MultiWorkerMirroredStrategy all-reduces with its own ring over gRPC
  unless NCCL is asked for (`CommunicationOptions`, AUTO picks RING): on GPU workers
  NCCL moves the gradients between the GPUs themselves. "auto" asks for NCCL where this
  host lists a GPU (every worker of a cluster runs the same command on the same kind
  of host).

  Raises:
    StrategyError: --collective=nccl on a host without GPUs (TensorFlow only logs a
      warning there, and the first all-reduce fails).
  """
  implementations = tf.distribute.experimental.CommunicationImplementation
  gpus = tf.config.list_physical_devices("GPU")
  if collective == "nccl" and not gpus:
    raise StrategyError("--collective=nccl all-reduces between GPUs, and this host has "
                        "none: use --collective=ring (or auto) on workers without GPUs.")
  if collective == "nccl" or (collective == "auto" and gpus):
    return implementations.NCCL
  return implementations.RING


# The strategies of a Cloud TPU: one client process drives every host of the slice.
TPU_STRATEGIES = (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)

# What TensorFlow raises when a call cannot complete because another task (a worker of
# a multi-worker run, a host of a TPU slice) is gone or does not answer: a peer's
# connection failed, the coordination service declared a task dead, a collective was
# aborted, the TPU runtime was restarted under the client.
LOST_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                    tf.errors.AbortedError, tf.errors.CancelledError)


def _resolver(strategy: tf.distribute.Strategy):
  return getattr(strategy.extended, "_cluster_resolver", None) or getattr(
      strategy, "cluster_resolver", None)


def chief_and_worker_id(strategy: tf.distribute.Strategy):
  """(is this process the chief, its worker index): (True, 0) outside multi-worker runs.

  The chief is the "chief" task if TF_CONFIG names one, else worker 0. A TPU's one
  client process is the chief (its resolver's cluster_spec() would ask the Cloud TPU
  API for the hosts: a network call every time).
  """
  if isinstance(strategy, TPU_STRATEGIES):
    return True, 0
  resolver = _resolver(strategy)
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

  It also owns how a worker waits for the others: every call that does (its own, the
  trainer's steps and dev loss) runs inside `collective`, which turns a lost worker
  into one clear error within a bounded time.

  On a Cloud TPU the one client process decides alone (nothing to agree), and
  `collective` turns a lost TPU host (a preempted Spot TPU, host maintenance, a crash)
  into the same kind of one-line error, `TpuLostError`, with the last checkpoint and
  the command that resumes. TensorFlow's `PreemptionCheckpointHandler` does not do it
  on Cloud TPU VMs (TensorFlow 2.21's distribute/failure_handling/failure_handling.py
  and failure_handling_util.py): its class docstring lists TPUStrategy, but `__init__`
  decides by `failure_handling_util.detect_platform()`, which returns `GCE_TPU` on
  any Compute Engine VM (`on_gcp()`: the metadata server answers) that lists TPU
  devices; for `GCE_TPU` (and `GCE_CPU`) `__init__` only logs "PreemptionCheckpointHandler
  does not support usage with TPU or CPU device on GCP.", `run` calls the step
  function unchanged and `save_checkpoint_if_preempted` returns without checking
  anything. Only `INTERNAL_TPU` (Google's own Borg clusters, off GCP) gets the TPU
  path (`_initialize_for_tpu_strategy`, `_run_for_tpu`, the `check_preemption` op).

  Args:
    strategy: the run's strategy.
    timeout_seconds: the longest one collective call (`collective`) may wait for the
      other workers; 0 = forever (`PeerWatch`).
  """

  def __init__(self, strategy: tf.distribute.Strategy, timeout_seconds: float = 0.0):
    self.strategy = strategy
    self.chief, self.worker_id = chief_and_worker_id(strategy)
    self.multi_worker = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    self.tpu = isinstance(strategy, TPU_STRATEGIES)
    self._sum = None
    self._watch = PeerWatch(timeout_seconds) if self.multi_worker else None

  @contextlib.contextmanager
  def collective(self, bounded: bool = True):
    """Around a call that waits for the other workers (a train step, an agreement):
    a lost worker becomes a `WorkerLostError` naming it, within the timeout.

    `bounded=False` for the first call of a program (a train loop per bucket, the first
    evaluation): each worker traces, and with XLA compiles, before it joins, and one
    worker may take minutes longer than another, so the watch would stop a healthy run
    of a timeout shorter than the slowest compile. A dead worker still ends such a
    call within seconds (TensorFlow notices); only a stuck one is not bounded there.

    The errors caught are those TensorFlow raises when a collective cannot complete
    (a peer's connection failed, the coordination service declared a task dead, the
    watch aborted the collectives); other errors (a model's bug) pass unchanged. On a
    TPU the same errors of a host call (a host of the slice gone) become a
    `TpuLostError`; nothing is watched there (the client waits on the TPU runtime,
    which fails the call when a host goes).
    """
    if not (self.multi_worker or self.tpu):
      yield
      return
    if bounded and self._watch is not None:
      self._watch.arm()
    try:
      yield
    except LOST_PEER_ERRORS as error:
      if self.tpu:
        raise TpuLostError(*_tpu_who_and_why(error)) from error
      raise WorkerLostError(*self._who_and_why(error)) from error
    finally:
      if self._watch is not None:
        self._watch.disarm()

  def _who_and_why(self, error: tf.errors.OpError):
    """(the lost worker, what happened) from TensorFlow's error message."""
    resolver = _resolver(self.strategy)
    spec = resolver.cluster_spec() if resolver else tf.train.ClusterSpec({})
    mine = (resolver.task_type, int(resolver.task_id or 0)) if resolver else None
    others = [(job, task) for job in spec.jobs for task in spec.task_indices(job)
              if (job, task) != mine]
    # TensorFlow names the task whose connection failed; a stuck one is not named,
    # which leaves no doubt only when there is a single other worker.
    named = [(job, int(task)) for job, task in
             re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", error.message)]
    named = [peer for peer in named if peer in others]
    peer = named[0] if named else (others[0] if len(others) == 1 else None)
    if peer:
      who = f"{peer[0]} {peer[1]} ({spec.task_address(*peer)})"
    elif others:
      who = "one of " + ", ".join(f"{job} {task}" for job, task in others)
    else:
      who = "another worker"
    if PeerWatch.MESSAGE in error.message:
      why = (f"no answer in {self._watch.timeout:g} s (--peer_timeout_minutes): it is "
             "stuck, or busy alone for longer than that")
    elif re.search(r"[Cc]onnection reset|[Ss]ocket closed|[Ff]ailed to connect|crashed",
                   error.message):
      why = "its process ended (its connection was reset or it stopped sending heartbeats)"
    else:
      why = f"the collective failed ({type(error).__name__})"
    return who, why

  def __call__(self, any_worker=(), chief_decides=()) -> list:
    flags = [bool(v) for v in any_worker] + [bool(v) for v in chief_decides]
    if not self.multi_worker:
      return flags
    mine = [float(v) for v in any_worker] + [
        float(v) if self.chief else 0.0 for v in chief_decides]
    return [bool(v > 0) for v in self._total(mine)]

  def _total(self, values) -> list:
    """The sums over all workers of each worker's `values` (one collective)."""
    traced = self._sum is not None
    if not traced:
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
      self._sum = tf.function(total, autograph=False)
    with self.collective(bounded=traced):
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


class WorkerLostError(TrainingError):
  """A worker of a multi-worker run died or stopped answering, so the others stop.

  One line says which worker, at which step, the last checkpoint and the command that
  resumes from it: the trainer adds the step and the checkpoint (`at`), the entry point
  the command (`command`), each knowing its part.
  """

  def __init__(self, lost: str, why: str):
    super().__init__(lost, why)
    self.lost, self.why = lost, why
    self.step: Optional[int] = None
    self.checkpoint: Optional[str] = None
    self.command: Optional[str] = None

  def at(self, step: int, checkpoint: Optional[str]) -> "WorkerLostError":
    self.step, self.checkpoint = step, checkpoint
    return self

  def _parts(self):
    """(where: " after step N", saved: the last checkpoint's sentence, how: ": CMD"),
    each empty where not known."""
    where, saved = "", ""
    if self.step is not None:  # in the training loop
      where = f" after step {self.step}"
      saved = (f" The last checkpoint is {self.checkpoint} (step "
               f"{self.checkpoint.rsplit('-', 1)[-1]})." if self.checkpoint else
               " There is no checkpoint yet.")
    return where, saved, f": {self.command}" if self.command else ""

  def __str__(self) -> str:
    where, saved, how = self._parts()
    return (f"lost {self.lost}{where}: {self.why}; this worker stopped too.{saved} "
            f"Relaunch every worker, each with its TF_CONFIG, to resume{how}")


class TpuLostError(WorkerLostError):
  """A host of the Cloud TPU (or the whole TPU) was lost during training: preempted
  (Spot, preemptible), taken for maintenance, or crashed. One line says when, the last
  checkpoint and the command that resumes from it, as `WorkerLostError` does for a
  multi-worker run (the trainer and the entry point fill them in the same way)."""

  def __str__(self) -> str:
    where, saved, how = self._parts()
    return (f"lost {self.lost}{where}: {self.why}; training stopped.{saved} Once the TPU "
            "is READY again (`gcloud compute tpus tpu-vm describe NAME --zone=ZONE`; a "
            f"preempted Spot TPU must be recreated), run the same command to resume{how}")


def _tpu_who_and_why(error: tf.errors.OpError):
  """(the lost TPU host, what happened) from TensorFlow's error message."""
  # The TPU's hosts are the tasks of job "worker"; the client names the one whose
  # connection failed, when it knows it.
  hosts = sorted({int(task) for task in
                  re.findall(r"/job:worker/replica:\d+/task:(\d+)", error.message)})
  if len(hosts) == 1:
    who = f"TPU host {hosts[0]}"
  elif hosts:
    who = "TPU hosts " + ", ".join(map(str, hosts))
  else:
    who = "the TPU"
  lines = error.message.strip().splitlines()
  first = lines[0] if lines else ""
  if len(first) > 160:
    first = first[:157] + "..."
  why = ("it stopped answering (preempted, under maintenance, or crashed): "
         f"{type(error).__name__}" + (f" ({first})" if first else ""))
  return who, why


class PeerWatch:
  """Bounds how long a worker waits in a collective for the other workers.

  A collective returns once every worker has joined it. A worker whose process ends is
  noticed by TensorFlow within seconds: its connections are reset, or the coordination
  service that MultiWorkerMirroredStrategy starts stops receiving its heartbeats, and
  the collectives fail. A worker that is alive but stuck (a hung filesystem write, a
  deadlock) keeps its connections and heartbeats, and the others would wait forever.
  While armed, the watch aborts this process's collectives once `timeout` seconds
  have passed, as TensorFlow's own peer health check does
  (`abort_collective_ops`); the blocked call then raises.

  TensorFlow's per-collective `CommunicationOptions(timeout_seconds=...)` would do the
  same, but it starts a thread per collective that lives for the whole timeout (its
  documentation reserves it for debugging): at a few collectives per step and a
  timeout of minutes, thousands of sleeping threads. The watch is one thread per
  process, armed around each call that waits (a host call of steps, an agreement, a
  dev batch).
  """

  MESSAGE = "t2t_keras: no answer from the other workers"

  def __init__(self, timeout_seconds: float):
    self.timeout = timeout_seconds
    self._deadline = None
    self._condition = threading.Condition()
    self._thread = None

  def arm(self) -> None:
    if self.timeout <= 0:
      return
    with self._condition:
      self._deadline = time.monotonic() + self.timeout
      if self._thread is None:  # daemon: never keeps a finished process alive
        self._thread = threading.Thread(target=self._watch, name="PeerWatch", daemon=True)
        self._thread.start()
      self._condition.notify()

  def disarm(self) -> None:
    with self._condition:
      self._deadline = None

  def _watch(self) -> None:
    with self._condition:
      while True:
        if self._deadline is None:
          self._condition.wait()
          continue
        left = self._deadline - time.monotonic()
        if left > 0:
          self._condition.wait(left)
          continue
        self._deadline = None
        self.abort()

  def abort(self) -> None:
    """Makes the collectives of this process fail (tests replace it)."""
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
    context.context().abort_collective_ops(
        tf.errors.DEADLINE_EXCEEDED, f"{self.MESSAGE} in {self.timeout:g} s")
