"""Optimizer state of --optimizer=adam and --optimizer=adafactor for a model recipe.

Builds the model of a recipe's architecture flags (e.g. flags/base_en_de.cfg) and
each optimizer as the trainer builds it (`t2t_keras.training.optimizers.create`), and
prints the bytes of the optimizer's variables (slots and step counter) beside the
weights': what each replica holds on top of the model.

  .venv/bin/python bench/optimizer_memory.py --flagfile=flags/base_en_de.cfg
"""

import dataclasses
import os
import sys

from absl import app

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from t2t_keras import flags as t2t_flags  # noqa: E402  pylint: disable=wrong-import-position

t2t_flags.define_all()


def _bytes(variables) -> int:
  return sum(v.shape.num_elements() * v.dtype.size
             for v in (getattr(v, "value", v) for v in variables))


def main(argv):
  del argv
  # pylint: disable=import-outside-toplevel
  from t2t_keras.model import create_model
  from t2t_keras.training import optimizers
  from t2t_keras.training.schedules import TransformerSchedule
  model_config = t2t_flags.model_config()
  model = create_model(model_config)
  weights = _bytes(model.trainable_variables)
  print(f"model: hidden_size {model_config.hidden_size}, filter_size "
        f"{model_config.filter_size}, {model_config.num_hidden_layers} layers, vocabulary "
        f"{model_config.vocab_size}: weights {weights / 2**20:,.1f} MiB")
  for name in ("adam", "adafactor"):
    config = dataclasses.replace(t2t_flags.train_config(), optimizer=name)
    optimizer = optimizers.create(config, TransformerSchedule(model_config.hidden_size, 4000))
    optimizer.build(model.trainable_variables)
    state = _bytes(optimizer.variables)
    print(f"  --optimizer={name}: optimizer state {state / 2**20:,.1f} MiB "
          f"({state / weights:.4f} x the weights)")


if __name__ == "__main__":
  app.run(main)
