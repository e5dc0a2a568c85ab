"""--keep_best_checkpoint and --early_stopping_patience: the best dev result's weights
are kept outside the rotation, training stops after N evaluations without
improvement, and both survive a restart."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.trained import checkpoints, modeldir
from t2t_keras import errors
from t2t_keras.inference import loading
from t2t_keras.configs import DataConfig, TrainConfig
from t2t_keras.training import distribute
from t2t_keras.trained.modeldir import BEST_STATE_FILE
from t2t_keras.training.trainer import Trainer
from tests.trainer_test import MODEL, make_dataset_fn


def run(model_dir, steps, bleus=None, **overrides):
  """Trains with an eval every 2 steps; the eval hook reports the scripted BLEU scores
  (None: no hook, so dev loss decides)."""
  config = TrainConfig(model_dir=str(model_dir), train_steps=steps, log_every=2,
                       eval_every=2, save_checkpoint_steps=2, keep_checkpoint_max=2,
                       learning_rate_warmup_steps=4, **overrides)
  trainer = Trainer(MODEL, config, distribute.create_strategy(config))
  lines = []
  scripted = iter(bleus or [])
  trainer.weights_at_eval = {}

  def hook(step):  # also records the weights each evaluation saw
    trainer.weights_at_eval[step] = [w.numpy() for w in trainer.model.weights]
    return {"bleu": next(scripted)}
  hook = hook if bleus is not None else None
  eval_fn = lambda ctx: make_dataset_fn(num_batches=2)(ctx).take(2)
  result = trainer.train(make_dataset_fn(), eval_fn, progress=lines.append, eval_hook=hook)
  return trainer, result, lines


@pytest.mark.slow
def test_best_checkpoint_kept_and_early_stopping(tmp_path):
  model_dir = tmp_path / "run"
  # Evaluations at steps 2, 4, 6, 8: best at 4, then two without improvement.
  trainer, result, lines = run(model_dir, 40, bleus=[10.0, 12.0, 11.0, 11.5, 50.0],
                               keep_best_checkpoint=True, early_stopping_patience=2)
  assert result.stopped_early and result.steps == 8, lines
  assert any(l.startswith("early stopping at step 8: 2 evaluations without improvement "
                          "of the best dev bleu 12 at step 4") for l in lines), lines
  best = tf.train.latest_checkpoint(str(model_dir / "best"))
  assert best.endswith("best/ckpt-4")
  # The rotation (2 kept) has dropped ckpt-4 by now; the best copy holds its weights.
  assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-8")
  assert not os.path.exists(str(model_dir / "ckpt-4.index"))
  state = json.loads((model_dir / BEST_STATE_FILE).read_text())
  assert state == {"metric": "bleu", "value": 12.0, "step": 4, "evaluations_since_best": 2,
                   "stopped_early_at": 8}
  # Decoding loads it by directory, and gets the step-4 weights, not the latest.
  modeldir.write_or_check_config(str(model_dir), MODEL, data=DataConfig())
  loaded = loading.load(str(model_dir), checkpoint_path=str(model_dir / "best"))
  assert loaded.checkpoints == [best]
  for restored, at_step_4 in zip(loaded.model.weights, trainer.weights_at_eval[4]):
    np.testing.assert_array_equal(restored.numpy(), at_step_4)
  assert any(not np.array_equal(w.numpy(), at_step_4) for w, at_step_4 in
             zip(trainer.model.weights, trainer.weights_at_eval[4]))


@pytest.mark.slow
def test_early_stopping_count_survives_a_restart(tmp_path):
  """Patience 3: evaluations at 2 (10), 4 (12, best), 6 (11) in a first run; the
  restarted run sees 8 (11.5) and 10 (9): the third without improvement stops it at
  10. A run that forgot the count would stop at 12 or later."""
  model_dir = tmp_path / "run"
  _, result, _ = run(model_dir, 6, bleus=[10.0, 12.0, 11.0], early_stopping_patience=3)
  assert not result.stopped_early and result.steps == 6
  _, result, lines = run(model_dir, 40, bleus=[11.5, 9.0, 8.0, 7.0, 6.0],
                         early_stopping_patience=3)
  assert result.stopped_early and result.steps == 10, lines
  assert not os.path.exists(str(model_dir / "best"))  # not asked to keep it


@pytest.mark.slow
def test_without_bleu_dev_loss_decides(tmp_path):
  model_dir = tmp_path / "run"
  _, result, lines = run(model_dir, 12, keep_best_checkpoint=True)
  losses = [float(l.split("loss ")[1].split(" ")[0]) for l in lines
            if l.startswith("eval at step")]
  state = json.loads((model_dir / BEST_STATE_FILE).read_text())
  assert state["metric"] == "loss"
  assert state["value"] == pytest.approx(min(losses), abs=1e-4)
  assert tf.train.latest_checkpoint(str(model_dir / "best")).endswith(
      f"ckpt-{state['step']}")


def test_empty_best_directory_is_a_clear_error(tiny_model_dir, tmp_path):
  empty = tmp_path / "best"
  empty.mkdir()
  with pytest.raises(errors.CheckpointError, match="is a directory without a "
                     "checkpoint"):
    loading.load(tiny_model_dir, checkpoint_path=str(empty))


@pytest.mark.slow
def test_a_changed_dev_metric_keeps_the_old_best(tmp_path):
  """A restart that judges dev loss where the record is by BLEU is refused, naming
  both and what to do (before: the record started anew and best/ was overwritten)."""
  model_dir = tmp_path / "run"
  run(model_dir, 4, bleus=[10.0, 12.0], keep_best_checkpoint=True)
  kept = tf.train.latest_checkpoint(str(model_dir / "best"))
  with pytest.raises(errors.TrainingError,
                     match=r"best checkpoint by dev bleu .* this run judges dev loss"):
    run(model_dir, 8, keep_best_checkpoint=True)  # no BLEU hook: dev loss
  assert tf.train.latest_checkpoint(str(model_dir / "best")) == kept
  assert json.loads((model_dir / BEST_STATE_FILE).read_text())["value"] == 12.0


@pytest.mark.slow
def test_an_unreadable_best_record_stops_the_run(tmp_path):
  """A record that cannot be read (a damaged file, a transient gs:// error) stops the
  run instead of starting a new record that would replace the best checkpoint."""
  model_dir = tmp_path / "run"
  run(model_dir, 4, bleus=[10.0, 12.0], keep_best_checkpoint=True)
  (model_dir / BEST_STATE_FILE).write_text("{not json")
  kept = tf.train.latest_checkpoint(str(model_dir / "best"))
  with pytest.raises(errors.TrainingError, match=r"cannot read .*best_eval.json"):
    run(model_dir, 8, bleus=[1.0, 2.0], keep_best_checkpoint=True)
  assert tf.train.latest_checkpoint(str(model_dir / "best")) == kept


@pytest.mark.slow
def test_a_run_that_stopped_early_is_finished(tmp_path):
  """The same command run again after an early stop trains nothing (before: it
  trained another --eval_every steps, rotating checkpoints out of the window that
  --average_last_n averages); --continue_after_early_stop trains on."""
  model_dir = tmp_path / "run"
  _, result, _ = run(model_dir, 40, bleus=[10.0, 12.0, 11.0, 11.5],
                     early_stopping_patience=2)
  assert result.stopped_early and result.steps == 8
  listed = checkpoints.listed_checkpoints(str(model_dir))
  _, again, lines = run(model_dir, 40, bleus=[13.0], early_stopping_patience=2)
  assert again.already_finished and again.steps == 8
  assert any("it is finished" in line for line in lines), lines
  assert checkpoints.listed_checkpoints(str(model_dir)) == listed
  _, more, lines = run(model_dir, 12, bleus=[9.0, 8.0], early_stopping_patience=2,
                       continue_after_early_stop=True)
  assert more.steps == 12 and not more.already_finished, lines
