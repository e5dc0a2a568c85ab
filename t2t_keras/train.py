"""Trains a Transformer: `python -m t2t_keras.train --flagfile=flags/base_en_de.cfg`.

A thin entry point: flags -> configs -> library. `--dry_run` builds the model without
any data, prints its summary and, as the last line, `parameters: <count>`.
"""

from __future__ import annotations

from absl import app
from absl import flags

from t2t_keras import flags as t2t_flags

FLAGS = flags.FLAGS
t2t_flags.define_all()
flags.DEFINE_boolean("dry_run", False,
                     "Build the model from the flags, print its summary and parameter "
                     "count, and exit (no data needed).")


def dry_run() -> None:
  from t2t_keras.model import create_model  # pylint: disable=import-outside-toplevel
  config = t2t_flags.model_config()
  model = create_model(config)
  model.summary(print_fn=lambda line, *args, **kwargs: print(line))
  print(f"encoder layers: {config.encoder_layers}, decoder layers: {config.decoder_layers}, "
        f"d_model {config.hidden_size}, d_ff {config.filter_size}, heads "
        f"{config.num_heads} (d_k {config.head_key_size}, d_v {config.head_value_size}), "
        f"vocabulary {config.vocab_size}")
  print(f"parameters: {model.count_params()}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if FLAGS.dry_run:
    dry_run()
    return
  raise app.UsageError("Training is not available yet; use --dry_run.")


if __name__ == "__main__":
  app.run(main)
