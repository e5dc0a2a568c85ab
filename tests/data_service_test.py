"""The training and eval datasets are pure TensorFlow graphs: tf.data service runs them,
and `train --data_service` trains on what it serves exactly as without it.

Cloud TPU pods and tf.data service ship the dataset graph to another host's CPU, where
no Python of the pipeline runs: a worker started in a separate process by
`t2t_keras.tools.data_service` (which imports none of t2t_keras.data) must deserialize
and run the graph, and give the batches the client process makes.
"""

import dataclasses
import inspect
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import DataConfig
from t2t_keras.data.batching import dev_batches, pipeline, service as service_lib
from tests import inprocess
from tests.conftest import REPO_ROOT

WORDS = "the a house cat dog runs sleeps under over small big green Haus Katze".split()



@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("corpus"))
  rng = np.random.default_rng(0)
  src = [" ".join(rng.choice(WORDS, size=rng.integers(1, 14))) for _ in range(300)]
  src += [" ".join(WORDS * 3)]  # one pair longer than max_length
  paths = [os.path.join(folder, name) for name in ("train.src", "train.tgt")]
  for path, lines in zip(paths, (src, [s.upper() for s in src])):
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
  config = DataConfig(source="files", train_src=paths[0], train_tgt=paths[1],
                      dev_src=paths[0], dev_tgt=paths[1], vocab_size=80,
                      data_dir=os.path.join(folder, "data"), max_length=24, batch_size=96)
  return config, pipeline.make_datasets(config)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
  """A dispatcher in this process and one worker in another process, started by the
  tool users start theirs with. Its output goes to files (a pipe nobody reads would
  fill and block it), read until its first line with a deadline."""
  dispatcher = tf.data.experimental.service.DispatchServer(
      tf.data.experimental.service.DispatcherConfig(port=0))
  address = dispatcher.target.split("://")[1]
  logs = tmp_path_factory.mktemp("data_service_worker")
  with open(logs / "stdout", "w", encoding="utf-8") as out, \
      open(logs / "stderr", "w", encoding="utf-8") as err:
    worker = subprocess.Popen(
        [sys.executable, "-m", "t2t_keras.tools.data_service", "--worker",
         f"--dispatcher_address={address}", "--host=127.0.0.1"],
        stdout=out, stderr=err, text=True, cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT))
  try:
    deadline = time.monotonic() + 300
    while "\n" not in (logs / "stdout").read_text(encoding="utf-8"):
      if worker.poll() is not None or time.monotonic() > deadline:
        pytest.fail("the data service worker did not start (exit code "
                    f"{worker.poll()}): " + (logs / "stderr").read_text()[-3000:])
      time.sleep(0.1)
    line = (logs / "stdout").read_text(encoding="utf-8").splitlines()[0]
    assert line.startswith("worker at 127.0.0.1:"), line + (logs / "stderr").read_text()
    yield dispatcher
  finally:
    worker.kill()
    worker.wait()


def _batches(dataset):
  return [{k: v.tolist() for k, v in b.items()} for b in dataset.as_numpy_iterator()]


def _through_service(dataset, dispatcher, name):
  return dataset.apply(tf.data.experimental.service.distribute(
      processing_mode=tf.data.experimental.service.ShardingPolicy.OFF,
      service=dispatcher.target, job_name=name))


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True, "packed"])
def test_training_batches_come_from_a_worker_without_python(corpus, service, static):
  config, data = corpus
  config = dataclasses.replace(config, static_shapes=bool(static),
                               packed_length=24 if static == "packed" else 0)
  train = pipeline.TrainData(config, data.train_fn.split)
  ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                   num_replicas_in_sync=2)
  kwargs = dict(input_context=ctx, start_step=5, accum_steps=2)
  if static is True:
    kwargs.update(bucket=train.plan(4).bucket_of_step(5))
  local = _batches(train(**kwargs).take(12))
  remote = _batches(_through_service(train(**kwargs).take(12), service, f"train{static}"))
  assert len(local) == 12 and remote == local


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_eval_batches_come_from_a_worker_without_python(corpus, service, static):
  config, data = corpus
  evaluation = dev_batches.EvalData(dataclasses.replace(config, static_shapes=static),
                                    data.eval_fn.split)
  # Static: the per-bucket dataset the trainer reads, of the bucket with most pairs.
  bucket = int(np.argmax(evaluation.pairs)) if static else None
  local = _batches(evaluation(bucket=bucket))
  remote = _batches(_through_service(evaluation(bucket=bucket), service, f"eval{static}"))
  assert sum(len(b["inputs"]) for b in local) >= (evaluation.pairs.max() if static else 300)
  assert sorted(map(str, remote)) == sorted(map(str, local))


def _op_types(dataset):
  graph = tf.compat.v1.GraphDef()
  graph.ParseFromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
  ops = {node.op for node in graph.node}
  for function in graph.library.function:
    ops |= {node.op for node in function.node_def}
  return ops


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_dataset_graphs_hold_no_python_calls(corpus, static):
  config, data = corpus
  config = dataclasses.replace(config, static_shapes=static)
  train = pipeline.TrainData(config, data.train_fn.split)
  datasets = [train(), pipeline.eval_dataset(config, split=pipeline.load_split(
      config, "dev", data.tokenizer))]
  if static:
    datasets.append(train(bucket=train.plan(1).bucket_of_step(0)))
    evaluation = dev_batches.EvalData(config, data.eval_fn.split)
    datasets.append(evaluation(bucket=evaluation.buckets()[0]))
  for dataset in datasets:
    ops = _op_types(dataset)
    assert "MapDataset" in ops or "ParallelMapDatasetV2" in ops  # the walk sees functions
    assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}, ops


def _losses(stdout):
  return [line.split("| loss ")[1].split(" ")[0] for line in stdout.splitlines()
          if line.startswith("step ") and "| loss " in line]


def _train(model_dir, *flags):
  result = inprocess.run(
      "train", "--flagfile=flags/tiny.cfg", f"--model_dir={model_dir}",
      "--synthetic_train_size=2000", "--eval_steps=1", "--deterministic",
      "--log_every=1", "--save_checkpoint_steps=100", "--eval_every=100",
      "--show_examples=0", *flags)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  return result


def _weights(model_dir):
  """The latest checkpoint's variables: the weights (as the optimizer tracks them), Adam's
  moments and the step, not the count of saves."""
  reader = tf.train.load_checkpoint(str(model_dir))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if name.endswith("VARIABLE_VALUE") and not name.startswith("save_counter")}


@pytest.mark.slow
def test_training_through_the_service_equals_training_without_it(service, tmp_path):
  """--data_service: the same batches, so bitwise the same losses and weights, for a run
  through the service stopped at step 3 and resumed there (a new job that starts at
  step 3) as for an uninterrupted run without it."""
  served = f"--data_service={service.target}"
  local = _losses(_train(tmp_path / "local", "--train_steps=6").stdout)
  first = _train(tmp_path / "served", "--train_steps=3", served)
  assert f"training input from tf.data service: {service.target}" in first.stdout
  resumed = _train(tmp_path / "served", "--train_steps=6", served)
  assert "at step 3" in resumed.stdout
  assert len(local) == 6 and _losses(first.stdout) + _losses(resumed.stdout) == local
  expected, weights = _weights(tmp_path / "local"), _weights(tmp_path / "served")
  assert weights.keys() == expected.keys() and len(expected) > 10
  for name, value in expected.items():
    np.testing.assert_array_equal(weights[name], value, err_msg=name)

def test_served_training_data_is_read_as_the_local_one():
  """The trainer reads a ServedTrainData as a TrainData (it seeks, and with static shapes
  makes one dataset per bucket from the plan), and input pipeline i reads from the
  i-th dispatcher: the graph it gets is the service's reader of that dispatcher."""
  config = DataConfig(source="synthetic", synthetic_train_size=200, synthetic_eval_size=8,
                      vocab_size=20, max_length=16, batch_size=64, static_shapes=True)
  train = pipeline.TrainData(config, pipeline.load_split(config, "train", None))
  dispatchers = [tf.data.experimental.service.DispatchServer(
      tf.data.experimental.service.DispatcherConfig(port=0)) for _ in range(2)]
  served = service_lib.ServedTrainData(train, [d.target for d in dispatchers])
  assert "start_step" in inspect.signature(served).parameters  # Trainer._resuming
  assert served.static_shapes and served.plan(2) is train.plan(2)
  assert served.bucket_shape(1) == train.bucket_shape(1)
  ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                   num_replicas_in_sync=2)
  bucket = train.plan(2).bucket_of_step(3)
  dataset = served(ctx, start_step=3, bucket=bucket)
  assert any(op.startswith("DataServiceDataset") for op in _op_types(dataset))
  graph = dataset._as_serialized_graph().numpy()  # pylint: disable=protected-access
  address = dispatchers[1].target.split("://")[1].encode()
  assert address in graph and dispatchers[0].target.split("://")[1].encode() not in graph
  assert dataset.element_spec == train(ctx, start_step=3, bucket=bucket).element_spec


def test_bad_or_absent_dispatchers_are_refused_with_what_to_do(tmp_path):
  bad = inprocess.run("train", "--flagfile=flags/tiny.cfg", f"--model_dir={tmp_path}",
                      "--data_service=dispatcher")
  assert bad.returncode != 0
  assert "--data_service=dispatcher must be grpc://HOST:PORT" in bad.stderr
  assert "t2t_keras.tools.data_service --dispatcher --worker" in bad.stderr
  # A port nobody listens on: held bound (not listening, so connections are refused)
  # while the command runs, so that no other process can take it meanwhile.
  with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    absent = inprocess.run("train", "--flagfile=flags/tiny.cfg", f"--model_dir={tmp_path}",
                           f"--data_service=grpc://127.0.0.1:{port},localhost:{port}")
  assert absent.returncode == 1, absent.stderr[-2000:]
  assert (f"--data_service: no tf.data service dispatcher answers at "
          f"grpc://127.0.0.1:{port}") in absent.stderr
  assert "or drop --data_service" in absent.stderr and "Traceback" not in absent.stderr
