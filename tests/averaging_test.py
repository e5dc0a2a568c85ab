"""Averaging checkpoints equals the mean of their weights; other models are refused."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import ModelConfig
from t2t_keras.model import create_model
from t2t_keras.training import averaging, checkpoints

CONFIG = ModelConfig(vocab_size=20, hidden_size=8, filter_size=16, num_heads=2,
                     num_hidden_layers=1)


def test_average_equals_mean_of_weights(tmp_path):
  paths, weights = [], []
  for seed in range(3):
    keras.utils.set_random_seed(seed)
    model = create_model(CONFIG)
    weights.append([np.asarray(w) for w in model.weights])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)  # slots in the checkpoint are ignored
    paths.append(tf.train.Checkpoint(model=model, optimizer=optimizer).save(
        str(tmp_path / f"ckpt{seed}")))
  keras.utils.set_random_seed(9)
  target = create_model(CONFIG)
  averaging.average_into_model(target, paths)
  for i, w in enumerate(target.weights):
    np.testing.assert_allclose(np.asarray(w), np.mean([ws[i] for ws in weights], axis=0),
                               rtol=1e-6, atol=1e-7)


def test_other_shapes_are_refused(tmp_path):
  keras.utils.set_random_seed(0)
  other = create_model(ModelConfig(vocab_size=20, hidden_size=16, filter_size=16,
                                   num_heads=2, num_hidden_layers=1))
  path = tf.train.Checkpoint(model=other).save(str(tmp_path / "other"))
  with pytest.raises(checkpoints.CheckpointError, match="cannot restore checkpoint"):
    averaging.average_into_model(create_model(CONFIG), [path])
