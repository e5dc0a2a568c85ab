"""Agreement across workers whatever their number of devices (training/distribute.py).

A worker of a multi-worker run may hold several devices (8 GPUs, a TPU host's cores);
every value the workers agree on must be the same for any count. TensorFlow's public
MultiWorkerMirroredStrategy gives a CPU worker one device, so the test builds the
strategy over the 2 logical CPUs of this process (conftest splits the CPU) with
TensorFlow's own constructor for local devices: one worker whose replicas are numbered
as a worker's are in a cluster. tests/multi_worker_test.py runs two workers for real.
"""

import time
import types

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
  from t2t_keras.data import pipeline
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
