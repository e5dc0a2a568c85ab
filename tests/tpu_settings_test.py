"""flags/tpu.cfg and what a TPU run needs of the host loop: the settings it gives after
a model preset (bfloat16, also by Keras' name mixed_bfloat16; packed rows; 100 steps a
host call), one training program and few host calls on the path such a run takes (on
CPU, another strategy), and one device-to-host read of a call's results."""

import dataclasses
import math

import keras
import numpy as np
import pytest
from absl import flags
from tensorflow.python.framework import ops

from t2t_keras import flags as t2t_flags
from t2t_keras.trained import modeldir
from t2t_keras.configs import ModelConfig, TrainConfig
from t2t_keras.model import create_model
from t2t_keras.training import trainer as trainer_lib
from t2t_keras.training.trainer import Trainer
from tests import inprocess
from tests.flags_test import parse
from tests.trainer_test import MODEL, make_dataset_fn
from tests.user_errors_test import _parsed

TPU = "--flagfile=flags/tpu.cfg"


# ---------------------------------------------------------------- flags/tpu.cfg
@pytest.mark.parametrize("preset", ["base_en_de", "big_en_de", "tiny"])
def test_tpu_cfg_after_a_preset_gives_the_tpu_settings_and_keeps_the_preset(preset):
  values, model, train = parse(f"--flagfile=flags/{preset}.cfg", TPU, "--tpu=local",
                               "--model_dir=gs://b/m")
  _, alone, alone_train = parse(f"--flagfile=flags/{preset}.cfg", "--model_dir=gs://b/m")
  data = t2t_flags.data_config(fv=values)
  assert (train.strategy, train.tpu, train.steps_per_loop) == ("tpu", "local", 100)
  assert model.dtype == "bfloat16"  # the presets pin float32
  assert (data.static_shapes, data.packed_length) == (True, 256)
  # The preset's model and schedule are kept.
  assert dataclasses.replace(model, dtype=alone.dtype) == alone
  assert (train.train_steps, train.log_every) == (alone_train.train_steps,
                                                   alone_train.log_every)
  # The train command's own checks pass (--strategy=tpu needs --static_shapes).
  argv, fv = _parsed(f"--flagfile=flags/{preset}.cfg", TPU, "--tpu=local",
                     "--model_dir=gs://b/m")
  t2t_flags.check_train_flags(argv, fv)


def test_flags_after_tpu_cfg_win_and_a_preset_after_it_would_undo_it():
  _, model, train = parse("--flagfile=flags/base_en_de.cfg", TPU, "--strategy=mirrored",
                          "--steps_per_loop=7", "--dtype=float32")
  assert (train.strategy, train.steps_per_loop, model.dtype) == ("mirrored", 7, "float32")
  # Before the preset, the preset's --dtype=float32 wins: hence "after a preset".
  _, model, _ = parse(TPU, "--flagfile=flags/base_en_de.cfg", "--tpu=local")
  assert model.dtype == "float32"
  # Without --tpu the TPU strategy is refused, naming the flag.
  with pytest.raises(flags.IllegalFlagValueError, match="--strategy=tpu needs --tpu"):
    parse("--flagfile=flags/base_en_de.cfg", TPU)


# ---------------------------------------------------------------- --dtype=mixed_bfloat16
def test_mixed_bfloat16_is_another_name_of_bfloat16():
  """Keras' policy name is accepted and becomes the project's "bfloat16": the same
  config (so the same config.json, restart check and decode check), the same model."""
  _, model, _ = parse("--dtype=mixed_bfloat16")
  _, plain, _ = parse("--dtype=bfloat16")
  assert model == plain and model.dtype == "bfloat16"
  assert ModelConfig(dtype="mixed_bfloat16") == ModelConfig(dtype="bfloat16")
  assert dataclasses.replace(MODEL, dtype="mixed_bfloat16").validate().dtype == "bfloat16"
  built = create_model(dataclasses.replace(MODEL, dtype="mixed_bfloat16"))
  assert built.dtype_policy.name == "mixed_bfloat16"  # bfloat16 compute
  assert all(w.dtype == "float32" for w in built.trainable_weights)
  # decode/export compare the model flags typed with config.json: either name agrees
  # with a model trained as bfloat16.
  argv, fv = _parsed("--dtype=mixed_bfloat16")
  assert t2t_flags.check_inference_flags(argv, plain, "decode", fv=fv) == []
  with pytest.raises(flags.ValidationError, match="--dtype=mixed_bfloat16 but the model"):
    t2t_flags.check_inference_flags(argv, ModelConfig(), "decode", fv=fv)


def test_a_restart_with_the_other_bfloat16_name_is_the_same_model(tmp_path):
  modeldir.write_or_check_config(str(tmp_path), dataclasses.replace(MODEL, dtype="bfloat16"))
  modeldir.write_or_check_config(str(tmp_path),
                                 dataclasses.replace(MODEL, dtype="mixed_bfloat16"))
  assert modeldir.load_model_config(str(tmp_path)).dtype == "bfloat16"


# ---------------------------------------------------------------- one read per host call
class _Reads:
  """Counts device-to-host reads of tensors (every numpy(), float(), int() and
  np.asarray of an eager tensor goes through `_numpy`) made inside `Trainer._run`."""

  def __init__(self, monkeypatch):
    self.per_call, self._inside = [], False
    numpy, run = ops._EagerTensorBase._numpy, Trainer._run  # pylint: disable=protected-access

    def counting_numpy(tensor):
      if self._inside:
        self.per_call[-1] += 1
      return numpy(tensor)

    def counting_run(trainer, *args, **kwargs):
      self.per_call.append(0)
      self._inside = True
      try:
        return run(trainer, *args, **kwargs)
      finally:
        self._inside = False
    monkeypatch.setattr(ops._EagerTensorBase, "_numpy", counting_numpy)  # pylint: disable=protected-access
    monkeypatch.setattr(Trainer, "_run", counting_run)


def test_a_host_call_reads_its_sums_and_step_back_once(tmp_path, monkeypatch):
  """Each call of the train loop reads its four sums and the step counter in one
  transfer (before: four float() reads and optimizer.iterations, five round trips to
  a remote TPU a call)."""
  reads = _Reads(monkeypatch)
  keras.utils.set_random_seed(0)
  trainer = Trainer(MODEL, TrainConfig(
      model_dir=str(tmp_path / "m"), train_steps=10, steps_per_loop=5, log_every=5,
      eval_every=10, save_checkpoint_steps=10, learning_rate_warmup_steps=4))
  result = trainer.train(make_dataset_fn(), progress=lambda line: None)
  assert result.steps == 10 == trainer.current_step() and result.host_calls == 2
  assert reads.per_call == [1, 1]
  assert np.isfinite(result.final_loss) and result.target_tokens > 0


def test_skipped_float16_steps_count_in_the_step_a_call_reads(tmp_path):
  """float16 steps skipped for overflow still count: a call of 4 steps that skips some
  reaches step 4 in one call (the counter crosses in the call's one read)."""
  keras.utils.set_random_seed(0)
  trainer = Trainer(dataclasses.replace(MODEL, dtype="mixed_float16"), TrainConfig(
      model_dir=str(tmp_path / "m"), train_steps=4, steps_per_loop=4, log_every=4,
      eval_every=4, save_checkpoint_steps=4, learning_rate_warmup_steps=4))
  trainer.optimizer.dynamic_scale.assign(2.0 ** 100)  # float16 gradients overflow
  result = trainer.train(make_dataset_fn(), progress=lambda line: None)
  assert float(trainer.optimizer.dynamic_scale.numpy()) < 2.0 ** 100  # steps were skipped
  assert result.steps == 4 == trainer.current_step() and result.host_calls == 1


@pytest.mark.slow
def test_the_step_a_call_reads_is_exact_beyond_float32s_integers(tmp_path):
  """The step crosses in float32 (TPUs have no float64), split in two parts: a step
  past 2**24, where float32 has no odd integers, still reads back exactly."""
  start = 2 ** 24 + 3
  keras.utils.set_random_seed(0)
  trainer = Trainer(MODEL, TrainConfig(
      model_dir=str(tmp_path / "m"), train_steps=start + 2, steps_per_loop=2,
      learning_rate_warmup_steps=4))
  trainer.optimizer.iterations.assign(start)
  data = make_dataset_fn()

  def from_step(ctx, start_step=0, accum_steps=1):  # seeks nothing: any batches do
    del start_step, accum_steps
    return data(ctx)
  result = trainer.train(from_step, progress=lambda line: None)
  assert result.steps == start + 2 == trainer.current_step() and result.host_calls == 1


# ---------------------------------------------------------------- the TPU path on CPU
@pytest.mark.slow
def test_the_tpu_settings_train_one_program_in_few_host_calls(tmp_path, monkeypatch):
  """The train command with a preset and flags/tpu.cfg, on 2 CPU replicas instead of a
  TPU: one training program (packed rows, static shapes) and one evaluation program,
  bfloat16, and ceil(steps / --steps_per_loop) host calls, the evaluations and
  checkpoints falling on calls' ends (bucketed static shapes: one program per bucket
  and a call a step)."""
  trained = []
  train = trainer_lib.Trainer.train

  def keeping_train(trainer, *args, **kwargs):
    trained.append((trainer, train(trainer, *args, **kwargs)))
    return trained[-1][1]
  monkeypatch.setattr(trainer_lib.Trainer, "train", keeping_train)
  # tpu.cfg's 100 steps a call, scaled down tenfold with tiny.cfg's evaluation and
  # checkpoint periods: the same shape of run in a tenth of the steps.
  steps = 20
  result = inprocess.run(
      "train", "--flagfile=flags/tiny.cfg", TPU, "--strategy=mirrored",
      f"--model_dir={tmp_path / 'm'}", f"--train_steps={steps}", "--log_every=10",
      "--steps_per_loop=10", "--eval_every=10", "--save_checkpoint_steps=10",
      "--show_examples=0")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
  (trainer, run), = trained
  assert trainer.strategy.num_replicas_in_sync == 2
  assert trainer.model.dtype_policy.name == "mixed_bfloat16"
  assert run.steps == steps and np.isfinite(run.final_loss)
  assert trainer.train_fn.experimental_get_tracing_count() == 1
  assert len(trainer.train_fn._list_all_concrete_functions()) == 1  # pylint: disable=protected-access
  assert "packed rows: every batch [1, 256]" in result.stdout
  # Evaluations at 10 and 20, checkpoints at 10 and 20: both at calls' ends, so no
  # more calls than the loop needs.
  assert run.host_calls == math.ceil(steps / 10) == 2
  assert trainer.eval_loop_fn.experimental_get_tracing_count() == 1
  assert "eval at step 10:" in result.stdout and "eval at step 20:" in result.stdout
  assert (tmp_path / "m" / "ckpt-10.index").exists()
  assert (tmp_path / "m" / "ckpt-20.index").exists()
