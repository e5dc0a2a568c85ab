"""MultiWorkerMirroredStrategy for real: 2 worker processes on 127.0.0.1 (TF_CONFIG)
train together and end with the weights of one process on the same global batches."""

import os
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from tests import multi_worker_worker as worker
from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def free_ports(n):
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


@pytest.mark.slow
def test_two_workers_equal_one_process(tmp_path):
  from t2t_keras.training import distribute  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel

  ports = ",".join(str(p) for p in free_ports(2))
  model_dir = tmp_path / "mw"
  start = time.time()
  processes = [subprocess.Popen(
      [sys.executable, os.path.join(REPO_ROOT, "tests", "multi_worker_worker.py"),
       f"--index={i}", f"--ports={ports}", f"--model_dir={model_dir}",
       f"--out={tmp_path}/w{i}.npz"], cwd=REPO_ROOT, env=ENV, text=True,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]
  outputs = []
  try:
    for p in processes:
      outputs.append(p.communicate(timeout=300)[0])
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
  for p, out in zip(processes, outputs):
    assert p.returncode == 0, out[-3000:]
  print(f"2-worker training took {time.time() - start:.1f}s")

  keras.utils.set_random_seed(0)
  model, train = worker.configs(str(tmp_path / "single"), "default")
  single = Trainer(model, train, distribute.create_strategy(train))
  result = single.train(worker.dataset_fn, progress=lambda line: None)
  expected = [np.asarray(w) for w in single.model.weights]

  for i in range(2):
    saved = np.load(tmp_path / f"w{i}.npz")
    assert int(saved["replicas"]) == 2  # the workers really formed one 2-replica cluster
    assert float(saved["tokens"]) == result.target_tokens
    assert float(saved["loss"]) == pytest.approx(result.final_loss, abs=1e-5)
    weights = [saved[f"arr_{j}"] for j in range(len(expected))]
    for a, b in zip(weights, expected):
      np.testing.assert_allclose(a, b, atol=1e-5)
  # Only the chief (worker 0) writes checkpoints and logs into model_dir.
  assert (model_dir / "checkpoint").exists() and (model_dir / "train").exists()
  assert "ckpt-6.index" in os.listdir(model_dir)
  assert not (model_dir / ".worker-0").exists()
