"""training.run: the train command's run as a library call, with configs built in code."""

import os

import tensorflow as tf
from absl import flags

from t2t_keras.trained import modeldir
from t2t_keras.configs import DataConfig, DecodeConfig, ModelConfig, RunConfig, TrainConfig
from t2t_keras.data.sources import sources
from t2t_keras.training import run


def test_train_and_evaluate_runs_from_configs_alone(tmp_path, capsys):
  """`train_and_evaluate` with configs built in Python, absl's flags unparsed (a read of
  a flag would raise): it trains a tiny model, writes its checkpoint and config.json,
  decodes dev BLEU at the evaluation, and runs the actions after training (the
  examples, then one of the caller's own) on the trained model."""
  assert not flags.FLAGS.is_parsed()  # as in a notebook: nothing parsed a command line
  model_dir = str(tmp_path / "run")
  model = ModelConfig(vocab_size=64, hidden_size=16, filter_size=32, num_heads=2,
                      num_hidden_layers=1, layer_prepostprocess_dropout=0.0)
  data = DataConfig(synthetic_task="copy", synthetic_vocab_size=8, synthetic_max_length=6,
                    synthetic_train_size=64, synthetic_eval_size=8, max_length=8,
                    batch_size=64, data_dir=model_dir)
  train = TrainConfig(model_dir=model_dir, train_steps=4, log_every=2, eval_every=4,
                      save_checkpoint_steps=4, learning_rate_warmup_steps=10)
  decode = DecodeConfig(beam_size=1, extra_decode_length=2)
  finished = []
  mine = run.Action(lambda run_config, datasets: True, finished.append)
  result = run.train_and_evaluate(
      model, data, train, decode, RunConfig(eval_bleu_sentences=4, show_examples=2),
      actions=run.AFTER_TRAINING + (mine,))
  out = capsys.readouterr().out
  assert result.steps == 4 and not result.preempted
  assert os.path.basename(tf.train.latest_checkpoint(model_dir)) == "ckpt-4"
  # The model's vocabulary is the data's (8 symbols and the reserved ids), not the 64 given.
  saved = modeldir.load_model_config(model_dir)
  assert saved.vocab_size == sources.data_source(data).vocab_size != model.vocab_size
  assert "done: 4 steps" in out
  assert "| bleu " in out  # dev BLEU at the evaluation of step 4
  assert "2 dev examples" in out  # the examples action
  (done,) = finished  # the caller's action, after the run's own
  assert done.model.model_config == saved
  assert done.run_config.show_examples == 2 and done.train_config is train
  assert not os.path.exists(os.path.join(model_dir, "flags.txt"))  # no command line

