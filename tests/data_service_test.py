"""The training and eval datasets are pure TensorFlow graphs: tf.data service runs them.

Cloud TPU pods and tf.data service ship the dataset graph to another host's CPU, where
no Python runs: a worker started in a separate process (which never imports t2t_keras)
must deserialize and run the graph, and give the batches the client process makes.
"""

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import DataConfig
from t2t_keras.data import dev_batches, pipeline

WORDS = "the a house cat dog runs sleeps under over small big green Haus Katze".split()

_WORKER = textwrap.dedent("""
    import sys
    import tensorflow as tf
    assert "t2t_keras" not in sys.modules
    worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=sys.argv[1], worker_address="127.0.0.1:%port%", port=0,
            heartbeat_interval_ms=100))
    print("worker up", flush=True)
    worker.join()
""")


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
def service():
  """A dispatcher in this process and one worker in another process."""
  dispatcher = tf.data.experimental.service.DispatchServer(
      tf.data.experimental.service.DispatcherConfig(port=0))
  address = dispatcher.target.split("://")[1]
  worker = subprocess.Popen([sys.executable, "-c", _WORKER, address],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert worker.stdout.readline().strip() == "worker up"
  yield dispatcher
  worker.kill()
  worker.wait()


def _batches(dataset):
  return [{k: v.tolist() for k, v in b.items()} for b in dataset.as_numpy_iterator()]


def _through_service(dataset, dispatcher, name):
  return dataset.apply(tf.data.experimental.service.distribute(
      processing_mode=tf.data.experimental.service.ShardingPolicy.OFF,
      service=dispatcher.target, job_name=name))


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_training_batches_come_from_a_worker_without_python(corpus, service, static):
  config, data = corpus
  config = dataclasses.replace(config, static_shapes=static)
  train = pipeline.TrainData(config, data.train_fn.split)
  ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                   num_replicas_in_sync=2)
  kwargs = dict(input_context=ctx, start_step=5, accum_steps=2)
  if static:
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
