"""One worker of tests/multi_worker_test.py: trains a tiny Transformer under
MultiWorkerMirroredStrategy (TF_CONFIG on 127.0.0.1) and saves its final weights.

  python tests/multi_worker_worker.py --index=0 --ports=5001,5002 --model_dir=D --out=w0.npz

Also imports as a module: `dataset_fn` and `MODEL`/`settings` are what the test's
single-process reference run uses, so both see the same global batches.
"""

import json
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH = 4
STEPS = 6


def make_data(seed=0, num_batches=6, vocab=24):
  """Global batches (B=4) of random ids with EOS at the end, lengths varying by batch."""
  from t2t_keras import EOS_ID  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  data = []
  for i in range(num_batches):
    inputs = rng.integers(4, vocab, size=(GLOBAL_BATCH, 3 + i % 4)).astype("int32")
    targets = rng.integers(4, vocab, size=(GLOBAL_BATCH, 2 + i % 5)).astype("int32")
    inputs[:, -1] = targets[:, -1] = EOS_ID
    data.append({"inputs": inputs, "targets": targets})
  return data


def dataset_fn(ctx):
  """Every replica gets its slice of each global batch; each input pipeline (one per
  worker) keeps only its own slices, so 1 process and N workers see the same batches."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  per_replica = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
  pieces = [{k: v[start:start + per_replica] for k, v in batch.items()}
            for batch in make_data() for start in range(0, GLOBAL_BATCH, per_replica)]
  dataset = tf.data.Dataset.from_tensors(pieces[0])
  for piece in pieces[1:]:  # shapes differ between batches
    dataset = dataset.concatenate(tf.data.Dataset.from_tensors(piece))
  if ctx.num_input_pipelines > 1:
    dataset = dataset.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
  return dataset.repeat()


def configs(model_dir, strategy):
  from t2t_keras.configs import ModelConfig, TrainConfig  # pylint: disable=import-outside-toplevel
  model = ModelConfig(vocab_size=24, hidden_size=16, filter_size=32, num_heads=2,
                      num_hidden_layers=1, layer_prepostprocess_dropout=0.0)
  # A larger Adam epsilon: near-zero gradients summed in another order would otherwise
  # become whole lr-sized steps (see trainer_test's 1 vs 2 replicas).
  train = TrainConfig(model_dir=model_dir, train_steps=STEPS, log_every=2, eval_every=100,
                      save_checkpoint_steps=3, learning_rate_warmup_steps=4,
                      label_smoothing=0.1, learning_rate=0.05, adam_epsilon=1e-4,
                      strategy=strategy)
  return model, train


def main(argv):
  args = dict(a.lstrip("-").split("=", 1) for a in argv[1:])
  ports = args["ports"].split(",")
  os.environ["TF_CONFIG"] = json.dumps({
      "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
      "task": {"type": "worker", "index": int(args["index"])}})
  sys.path.insert(0, REPO_ROOT)
  import keras  # pylint: disable=import-outside-toplevel

  from t2t_keras.training import distribute  # pylint: disable=import-outside-toplevel
  from t2t_keras.training.trainer import Trainer  # pylint: disable=import-outside-toplevel
  model, train = configs(args["model_dir"], "multi_worker_mirrored")
  strategy = distribute.create_strategy(train)
  keras.utils.set_random_seed(0)
  trainer = Trainer(model, train, strategy)
  result = trainer.train(dataset_fn, progress=lambda line: print(line, flush=True))
  np.savez(args["out"], *[np.asarray(w) for w in trainer.model.weights],
           tokens=result.target_tokens, loss=result.final_loss,
           replicas=strategy.num_replicas_in_sync)
  print(f"worker {args['index']} done: {result.steps} steps", flush=True)


if __name__ == "__main__":
  main(sys.argv)
