"""A pod slice's remote master: the client's string ops stay in the client.

`--strategy=tpu --tpu=NAME` connects to the TPU's hosts (`experimental_connect_to_cluster`
with a remote master), which makes the master's CPU the default device of every op the
client runs next. The TPU hosts run TensorFlow alone: tensorflow-text's SentencePiece
ops are not registered there, so the vocabulary, the tokenized cache, dev BLEU, the
examples and the export must run in the client (`distribute.on_client`), and the input
pipelines the strategy places on the hosts must hold core ops only.

The remote master here is a bare `tf.distribute.Server` in a process of its own that
imports TensorFlow alone, on 127.0.0.1. No TPU: the training command is the user's,
`python -m t2t_keras.train --strategy=tpu --tpu=grpc://...`, with TensorFlow's three TPU
calls in `create_strategy` replaced. The resolver names the server as the master (so
the real `experimental_connect_to_cluster` connects to it and makes it the default
device), the TPU system needs no initialisation, and the strategy is one device, the
master's CPU: variables, steps and the input pipelines run in the server process, as
they run on the TPU and its hosts, and decoding takes the TPU's branch (a host copy).
The command also prints where each tokenizer and each decoding copy of the weights
lives: an op that fails on the master may report its error later or never (a tokenizer
only read in Python), so the test reads their devices too.
"""

import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

# The remote master: TensorFlow alone (checked), on a port it picks and prints.
SERVER = """
import socket, sys
import tensorflow as tf
with socket.socket() as s:
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
server = tf.distribute.Server(tf.train.ClusterSpec({"worker": [f"127.0.0.1:{port}"]}),
                              job_name="worker", task_index=0)
assert not [m for m in sys.modules if m.startswith(("tensorflow_text", "t2t_keras"))]
print(port, flush=True)
server.join()
"""

# `python -m t2t_keras.train` with the TPU calls of create_strategy replaced (see above).
# It imports TensorFlow while the server starts, then reads the server's port from
# standard input into its --tpu flag.
TRAIN = """
import runpy
import sys
import tensorflow as tf
port = input()
sys.argv = [arg.replace("PORT", port) for arg in sys.argv]

def resolver(tpu, zone=None, project=None):
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": [tpu.replace("grpc://", "")]}), master=tpu)

class OnTheMaster(tf.distribute.OneDeviceStrategy):
  def __init__(self, resolver):
    super().__init__("/job:worker/replica:0/task:0/device:CPU:0")

tf.distribute.cluster_resolver.TPUClusterResolver = resolver
tf.tpu.experimental.initialize_tpu_system = lambda resolver: None
tf.distribute.TPUStrategy = tf.distribute.experimental.TPUStrategy = OnTheMaster

from t2t_keras.training import evaluator
made = evaluator.DecodingWeights.__init__
def say_where(weights, *args, **kwargs):  # where each copy that decodes lives
  made(weights, *args, **kwargs)
  print("decoding weights on", weights.model.weights[0].value.device, flush=True)
evaluator.DecodingWeights.__init__ = say_where

from t2t_keras.data.tokens import tokenizer
loaded = tokenizer.SentencePieceTokenizer.__init__
def say_where_too(self, *args, **kwargs):  # each tokenizer's SentencePiece model
  loaded(self, *args, **kwargs)  # (an error on the master may surface later, or never)
  print("tokenizer on", self._sp._model_resource.resource_handle.device, flush=True)
tokenizer.SentencePieceTokenizer.__init__ = say_where_too
runpy.run_module("t2t_keras.train", run_name="__main__", alter_sys=True)
"""

WORDS = [("the", "die"), ("cat", "Katze"), ("dog", "Hund"), ("house", "Haus"),
         ("red", "rot"), ("blue", "blau"), ("sees", "sieht"), ("runs", "läuft")]


@pytest.fixture
def remote_master():
  """A bare TensorFlow server (no tensorflow-text), for one test: its process; its port
  is the first line of its standard output."""
  server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=ENV)
  try:
    yield server
    assert server.poll() is None, "the remote master ended during the test"
  finally:
    server.kill()
    server.wait()


def write_pairs(directory, name, lines):
  """`lines` pairs of 1-3 words, word for word, as name.en and name.de."""
  pairs = [[WORDS[(7 * i + 3 * j) % len(WORDS)] for j in range(1 + i % 3)]
           for i in range(lines)]
  for side, lang in enumerate(("en", "de")):
    (directory / f"{name}.{lang}").write_text(
        "".join(" ".join(w[side] for w in pair) + "\n" for pair in pairs), encoding="utf-8")
  return [str(directory / f"{name}.{lang}") for lang in ("en", "de")]


@pytest.mark.slow
def test_tpu_run_with_a_remote_master_keeps_string_ops_in_the_client(
    tmp_path, remote_master, tiny_model_dir):
  """From text files: the vocabulary and the caches are built, the run starts from
  another model's weights with its own vocabulary (--init_from_vocab=new loads the
  source's tokenizer), trains on bucketed static shapes (the host reads each epoch's
  order, data/batching/plan.py), evaluates dev BLEU, prints an example and exports.

  Before: the cache's tokenization ran on the master and failed with "NotFoundError:
  'SentencepieceOp' is neither a type of a primitive operation nor a name of a function
  registered in binary running on ..."; dev BLEU's host copy lived on the master."""
  train_src, train_tgt = write_pairs(tmp_path, "train", 120)
  dev_src, dev_tgt = write_pairs(tmp_path, "dev", 2)
  model_dir = tmp_path / "run"
  train = subprocess.Popen(
      [sys.executable, "-c", TRAIN, "--strategy=tpu", "--tpu=grpc://127.0.0.1:PORT",
       "--static_shapes", "--max_length=16", "--min_length_bucket=16", "--batch_size=64",
       "--data_source=files", f"--train_src={train_src}", f"--train_tgt={train_tgt}",
       f"--dev_src={dev_src}", f"--dev_tgt={dev_tgt}", "--vocab_size=40",
       f"--init_from={tiny_model_dir}", "--init_from_vocab=new",
       f"--model_dir={model_dir}", "--hidden_size=16", "--filter_size=32",
       "--num_heads=2", "--num_hidden_layers=2", "--train_steps=1", "--log_every=1",
       "--eval_every=1", "--save_checkpoint_steps=1", "--eval_bleu_sentences=2",
       "--beam_size=1", "--extra_decode_length=2", "--show_examples=1", "--export"],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      cwd=REPO_ROOT, env=ENV)
  try:
    port = remote_master.stdout.readline().strip()
    assert port.isdigit(), f"the server did not start (exit code {remote_master.poll()})"
    out, _ = train.communicate(port + "\n", timeout=300)
  finally:
    train.kill()
  assert train.returncode == 0, out[-3000:]
  assert "Wrote vocabulary" in out and "Tokenized 120 train pairs" in out, out[-3000:]
  assert re.search(r"initialized from \S+ckpt-7: .*new vocabulary", out), out[-3000:]
  assert "on 1 replica(s)" in out and "step 1/1 | loss" in out, out[-3000:]
  assert "eval at step 1: loss" in out and "| bleu " in out, out[-3000:]
  assert "reference:" in out and "1 dev examples" in out, out[-3000:]
  versions = tf.io.gfile.listdir(str(model_dir / "export"))
  assert len(versions) == 1, versions
  assert (model_dir / "export" / versions[0].strip("/") / "saved_model.pb").exists()
  # Every tokenizer (this run's, the source's) and every copy that decodes live in the
  # client; the training weights live on the master.
  client = "/job:localhost/replica:0/task:0/device:CPU:0"
  tokenizers = re.findall(r"tokenizer on (\S+)", out)
  assert len(tokenizers) >= 2 and set(tokenizers) == {client}, tokenizers
  places = re.findall(r"decoding weights on (\S+)", out)
  assert places and set(places) == {client}, places
