"""Agreement across workers whatever their number of devices (training/distribute.py).

A worker of a multi-worker run may hold several devices (8 GPUs, a TPU host's cores);
every value the workers agree on must be the same for any count. TensorFlow's public
MultiWorkerMirroredStrategy gives a CPU worker one device, so the test builds the
strategy over the 2 logical CPUs of this process (conftest splits the CPU) with
TensorFlow's own constructor for local devices: one worker whose replicas are numbered
as a worker's are in a cluster. tests/multi_worker_test.py runs two workers for real.
"""

import os
import time
import types
from unittest import mock

import pytest
import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy

from t2t_keras.errors import ModelDirError
from t2t_keras.training import distribute, init_from


@pytest.fixture(scope="module")
def two_device_worker():
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  assert len(devices) == 2, "conftest splits the CPU into 2 logical devices"
  strategy = collective_all_reduce_strategy.CollectiveAllReduceStrategy._from_local_devices(  # pylint: disable=protected-access
      devices)
  assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
  assert strategy.num_replicas_in_sync == 2
  return distribute.Agreement(strategy)


def test_the_chiefs_number_is_itself_on_a_worker_of_two_devices(two_device_worker):
  """chief_number summed the chief's value over every replica: 14 for 7 on a worker of
  2 devices (ckpt-14 asked for instead of ckpt-7, -2 for the "none found" code -1)."""
  assert two_device_worker.multi_worker and two_device_worker.chief
  for value in (7, -1, 0, 123456):
    assert two_device_worker.chief_number(value) == value
  assert two_device_worker(any_worker=[True, False], chief_decides=[True, False]) == [
      True, False, True, False]
  assert two_device_worker.barrier(failed=False) is False
  assert two_device_worker.barrier(failed=True) is True


def test_init_from_names_the_chiefs_checkpoint_on_a_worker_of_two_devices(
    two_device_worker, tmp_path):
  (tmp_path / "ckpt-7.index").write_text("")
  (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n'
                                       'all_model_checkpoint_paths: "ckpt-7"\n')
  assert init_from.agreed_checkpoint(str(tmp_path), two_device_worker) == str(
      tmp_path / "ckpt-7")
  # The chief finds nothing: its "none" code (-1) reaches the workers as -1 (-2 before),
  # and the chief says what is missing.
  with pytest.raises(ModelDirError, match="no such model directory or checkpoint"):
    init_from.agreed_checkpoint(str(tmp_path / "none"), two_device_worker)


def test_tpu_strategy_passes_name_zone_and_project_to_the_resolver(monkeypatch):
  """A host outside the TPU's zone or project (a GCE VM driving a TPU node) must be
  able to name them: the resolver gets exactly what the flags say."""
  from t2t_keras.configs import TrainConfig  # pylint: disable=import-outside-toplevel
  seen = {}

  class Resolved(Exception):
    pass

  def resolver(**kwargs):
    seen.update(kwargs)
    raise Resolved()

  monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", resolver)
  config = TrainConfig(strategy="tpu", tpu="big-pod", tpu_zone="europe-west4-a",
                       gcp_project="my-project")
  with pytest.raises(Resolved):
    distribute.create_strategy(config)
  assert seen == {"tpu": "big-pod", "zone": "europe-west4-a", "project": "my-project"}


def test_a_worker_that_waits_too_long_stops_with_one_line(two_device_worker, monkeypatch):
  """A peer alive but stuck left the others waiting in a collective forever: the watch
  aborts this process's collectives once a call has waited --peer_timeout_minutes, and
  the error that TensorFlow then raises becomes one line with the step, the last
  checkpoint and the command. Disarmed in time, the watch does nothing. (The abort is
  replaced: a real one would fail every later collective of this test process;
  multi_worker_test loses a real worker.)"""
  # The watch's clock is the test's: it moves only when the test says, so a busy host
  # that delays this thread cannot make a call "wait too long" (real sleeps below
  # only give the watch's thread the time to act, and an abort needs the clock).
  clock = [0.0]
  monkeypatch.setattr(distribute, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
  agreement = distribute.Agreement(two_device_worker.strategy, timeout_seconds=0.3)
  aborted = []
  monkeypatch.setattr(agreement._watch, "abort", lambda: aborted.append(clock[0]))  # pylint: disable=protected-access
  for _ in range(3):  # calls that end in time
    with agreement.collective():
      clock[0] += 0.2
  clock[0] += 100  # disarmed: no call is waiting
  time.sleep(0.5)
  assert not aborted
  start = clock[0]
  with pytest.raises(distribute.WorkerLostError) as caught:
    with agreement.collective():
      clock[0] += 0.29  # not yet
      time.sleep(0.5)
      assert not aborted
      clock[0] += 0.02  # past the timeout: the watch aborts at its next look
      deadline = time.monotonic() + 60
      while not aborted and time.monotonic() < deadline:
        time.sleep(0.01)
      # What the blocked collective raises once aborted.
      raise tf.errors.DeadlineExceededError(
          None, None, f"{distribute.PeerWatch.MESSAGE} in 0.3 s [[{{node CollectiveReduceV2}}]]")
  assert aborted == [pytest.approx(start + 0.31)]
  error = caught.value.at(13, "/runs/mw/ckpt-10")
  error.command = "python -m t2t_keras.train --model_dir=/runs/mw"
  assert str(error) == (
      "lost another worker after step 13: no answer in 0.3 s (--peer_timeout_minutes): "
      "it is stuck, or busy alone for longer than that; this worker stopped too. The last "
      "checkpoint is /runs/mw/ckpt-10 (step 10). Relaunch every worker, each with its "
      "TF_CONFIG, to resume: python -m t2t_keras.train --model_dir=/runs/mw")
  # Errors that are not a collective's pass unchanged.
  with pytest.raises(tf.errors.InvalidArgumentError):
    with agreement.collective():
      raise tf.errors.InvalidArgumentError(None, None, "a model's bug")


def test_the_first_call_of_each_program_is_not_bounded_by_the_watch(two_device_worker,
                                                                       monkeypatch,
                                                                       tmp_path):
  """Each worker traces (and with XLA compiles) a program in its first call, and one
  worker may take minutes longer than another: a --peer_timeout_minutes shorter than
  that stopped healthy runs with "no answer" (a loaded host, a pod slice compiling the
  big model). Here no trace runs while the watch is armed (the model's Python runs
  only when a program is traced): the first call of each bucket's train loop and the
  first evaluation go unwatched, and every later call is watched. The watch's clock is
  the test's and stands still, so a busy host cannot make a watched call too long."""
  # pylint: disable=import-outside-toplevel
  import dataclasses

  import keras

  from t2t_keras.configs import DataConfig, TrainConfig
  from t2t_keras.data.batching import pipeline
  from t2t_keras.training.trainer import Trainer
  from tests.trainer_test import MODEL
  data = pipeline.make_datasets(DataConfig(
      source="synthetic", synthetic_max_length=20, synthetic_vocab_size=16,
      synthetic_train_size=400, synthetic_eval_size=20, max_length=24, batch_size=128,
      static_shapes=True, bucket_growth=3.0))
  config = TrainConfig(model_dir=str(tmp_path / "m"), train_steps=8, log_every=4,
                       eval_every=4, eval_steps=2, save_checkpoint_steps=100,
                       peer_timeout_minutes=1 / 60)
  keras.utils.set_random_seed(0)
  trainer = Trainer(dataclasses.replace(MODEL, vocab_size=data.vocab_size), config,
                    two_device_worker.strategy)
  monkeypatch.setattr(distribute, "time", types.SimpleNamespace(monotonic=lambda: 0.0))
  watch = trainer.agreement._watch  # pylint: disable=protected-access
  armed, aborted, traced_armed = [], [], []
  arm = watch.arm
  monkeypatch.setattr(watch, "arm", lambda: (armed.append(1), arm()))
  monkeypatch.setattr(watch, "abort", lambda: aborted.append(1))
  call = trainer.model.call

  def traced(*args, **kwargs):  # runs at each trace of a program that calls the model
    traced_armed.append(watch._deadline is not None)  # pylint: disable=protected-access
    return call(*args, **kwargs)
  monkeypatch.setattr(trainer.model, "call", traced)
  buckets = {data.train_fn.plan(2, 1).bucket_of_step(s) for s in range(8)}
  assert len(buckets) >= 2
  result = trainer.train(data.train_fn, eval_dataset_fn=data.eval_fn,
                         progress=lambda line: None)
  assert result.steps == 8 and not aborted
  # Each bucket's train program and the eval program traced, none while watched.
  assert len(traced_armed) >= len(buckets) + 1 and not any(traced_armed), traced_armed
  assert trainer.host_calls == 8 and len(armed) > 0
  # Watched: every train call but each bucket's first; evaluations after the first
  # (per dev bucket); agreements after their first.
  assert trainer.host_calls - len(buckets) <= len(armed)


def _built_multi_worker(monkeypatch, collective, gpus):
  """create_strategy for a worker of a one-worker TF_CONFIG on a host listing `gpus`
  GPUs (a stand-in for `tf.config.list_physical_devices`): the strategy is TensorFlow's,
  built with the options create_strategy passed, over this process's CPU (a real
  cluster strategy can only start with the process: TensorFlow is initialised here)."""
  from t2t_keras.configs import TrainConfig  # pylint: disable=import-outside-toplevel
  listed = tf.config.list_physical_devices

  def list_physical_devices(device_type=None):
    if device_type == "GPU":
      return [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
              for i in range(gpus)]
    return listed(device_type)

  def multi_worker_mirrored(cluster_resolver=None, communication_options=None):
    assert cluster_resolver is None and "TF_CONFIG" in os.environ  # TF_CONFIG's
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:1]
    with mock.patch.dict(os.environ):  # a local strategy: TF_CONFIG's cluster not joined
      del os.environ["TF_CONFIG"]
      return collective_all_reduce_strategy.CollectiveAllReduceStrategy._from_local_devices(  # pylint: disable=protected-access
          devices, communication_options=communication_options)

  monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
  monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", multi_worker_mirrored)
  monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["127.0.0.1:2222"]}, '
                     '"task": {"type": "worker", "index": 0}}')
  return distribute.create_strategy(TrainConfig(strategy="multi_worker_mirrored",
                                                collective=collective))


def test_gpu_workers_all_reduce_with_nccl(monkeypatch):
  """TensorFlow all-reduces a multi-worker run with its gRPC ring unless NCCL is asked
  for: GPU workers (--collective=auto, the default) ask for it; CPU workers ring."""
  implementation = tf.distribute.experimental.CommunicationImplementation
  for collective, gpus, expected in (("auto", 8, implementation.NCCL),
                                     ("auto", 0, implementation.RING),
                                     ("nccl", 1, implementation.NCCL),
                                     ("ring", 8, implementation.RING)):
    strategy = _built_multi_worker(monkeypatch, collective, gpus)
    assert isinstance(strategy, collective_all_reduce_strategy.CollectiveAllReduceStrategy)
    options = strategy.extended._communication_options  # pylint: disable=protected-access
    assert options.implementation == expected, (collective, gpus)


def test_nccl_on_a_host_without_gpus_names_the_flag(monkeypatch):
  with pytest.raises(distribute.StrategyError, match="--collective=nccl .* this host has "
                     "none: use --collective=ring"):
    _built_multi_worker(monkeypatch, "nccl", gpus=0)


def test_a_non_chief_saves_on_its_local_disk_never_under_the_model_dir(
    two_device_worker, monkeypatch, tmp_path):
  """Every worker takes part in each save and only the chief's files are kept: a
  non-chief wrote its full copy to <model_dir>/.worker-N and deleted it, an upload of
  the whole checkpoint per worker per save on gs://. Here worker 1 (this process made a
  non-chief) saves under a local temporary directory, emptied after each save and
  removed when training ends, and writes nothing under a remote model_dir (ram://)."""
  # pylint: disable=import-outside-toplevel
  import keras

  from t2t_keras.trained import modeldir
  from t2t_keras.configs import TrainConfig
  from t2t_keras.training.trainer import Trainer
  from tests.trainer_test import MODEL, make_dataset_fn
  local_tmp = tmp_path / "local_tmp"
  local_tmp.mkdir()
  monkeypatch.setattr("tempfile.tempdir", str(local_tmp))
  monkeypatch.setattr(distribute, "chief_and_worker_id", lambda strategy: (False, 1))
  model_dir = "ram://non_chief_test/model"
  scratch, saved = [], []
  made, discard = modeldir.worker_scratch_dir, modeldir.discard_worker_dir

  def worker_scratch_dir(worker_id):
    scratch.append(made(worker_id))
    return scratch[-1]

  def discard_worker_dir(directory):
    assert directory == scratch[-1]
    saved.append(sorted(os.listdir(directory)))
    assert not tf.io.gfile.exists(model_dir), tf.io.gfile.listdir(model_dir)
    discard(directory)
    assert os.listdir(directory) == []

  monkeypatch.setattr(modeldir, "worker_scratch_dir", worker_scratch_dir)
  monkeypatch.setattr(modeldir, "discard_worker_dir", discard_worker_dir)
  keras.utils.set_random_seed(0)
  trainer = Trainer(MODEL, TrainConfig(model_dir=model_dir, train_steps=4, log_every=2,
                                       eval_every=100, save_checkpoint_steps=2),
                    two_device_worker.strategy)
  assert not trainer.chief and trainer.worker_id == 1
  result = trainer.train(make_dataset_fn(), progress=lambda line: None)
  assert result.steps == 4
  assert len(scratch) == 1 and scratch[0].startswith(str(local_tmp))
  # Two saves (steps 2 and 4), each a whole checkpoint in the scratch directory.
  assert len(saved) == 2 and all(any(n.startswith("ckpt-") and n.endswith(".index")
                                     for n in names) for names in saved), saved
  assert not tf.io.gfile.exists(model_dir)
  assert os.listdir(local_tmp) == []  # the scratch directory is gone with training


def test_a_lost_tpu_host_ends_in_one_line_with_the_checkpoint_and_the_command(
    monkeypatch, tmp_path):
  """A TPU host that goes (a preempted Spot TPU, maintenance, a crash) fails the
  client's host call with an UnavailableError: the train command printed TensorFlow's
  op error and its stack. It ends as a lost worker does: one line with the step, the
  last checkpoint and the command that resumes, exit code 1. TensorFlow's
  PreemptionCheckpointHandler does nothing on a Cloud TPU VM (its platform check:
  distribute.Agreement's docstring). Here the default strategy stands in for
  TPUStrategy, and the host call of step 7 raises what the TPU client raises."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.training import trainer as trainer_module
  from tests import inprocess
  default = type(tf.distribute.get_strategy())
  monkeypatch.setattr(distribute, "TPU_STRATEGIES", distribute.TPU_STRATEGIES + (default,))
  iterator = trainer_module._Batches.iterator  # pylint: disable=protected-access

  def lost_at_step_6(batches, step):
    if step >= 6:
      raise tf.errors.UnavailableError(
          None, None, "Socket closed\nAdditional GRPC error information from remote target "
          "/job:worker/replica:0/task:3")
    return iterator(batches, step)

  monkeypatch.setattr(trainer_module._Batches, "iterator", lost_at_step_6)  # pylint: disable=protected-access
  model_dir = tmp_path / "tpu"
  args = ["--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}", "--train_steps=8",
          "--save_checkpoint_steps=4", "--log_every=4", "--eval_every=100",
          "--show_examples=0"]
  run = inprocess.run("train", *args)
  assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
  assert "Traceback" not in run.stderr and "UnavailableError:" not in run.stderr
  command = " ".join(run.args)  # this process's command line (train.relaunch_command)
  assert command.endswith(" ".join(args))
  assert (f"lost TPU host 3 after step 6: it stopped answering (preempted, under "
          f"maintenance, or crashed): UnavailableError (Socket closed); training stopped. "
          f"The last checkpoint is {model_dir}/ckpt-4 (step 4). Once the TPU is READY "
          "again (`gcloud compute tpus tpu-vm describe NAME --zone=ZONE`; a preempted "
          f"Spot TPU must be recreated), run the same command to resume: {command}"
          ) in run.stderr, run.stderr[-3000:]
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-4")
