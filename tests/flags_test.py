"""Every flagfile parses; presets and Table 3 rows give the architecture the paper says."""

import glob
import os

import pytest
from absl import flags

from t2t_keras import flags as t2t_flags
from tests import inprocess
from tests.conftest import REPO_ROOT

FLAGFILES = sorted(glob.glob(os.path.join(REPO_ROOT, "flags", "*.cfg")))


def parse(*args):
  """Parses args into a fresh FlagValues with all t2t_keras flags defined."""
  values = flags.FlagValues()
  t2t_flags.define_all(values)
  cwd = os.getcwd()
  os.chdir(REPO_ROOT)  # flagfiles include each other by repository-relative paths
  try:
    values(["prog", *args])
  finally:
    os.chdir(cwd)
  return values, t2t_flags.model_config(fv=values), t2t_flags.train_config(fv=values)


def test_flagfiles_exist():
  names = {os.path.basename(f) for f in FLAGFILES}
  assert {"base_en_de.cfg", "big_en_de.cfg", "base_en_fr.cfg", "big_en_fr.cfg",
          "parsing_wsj.cfg", "tiny.cfg"} <= names


# Presets for the user's own files (README's "Train on your own data") and the TPU
# settings (which TPU is the user's): they parse once the command line names the files
# or the TPU, and are refused, naming the flag, without them.
USER_FILES = {"small_cpu.cfg": ["--train_src=my/train.en", "--train_tgt=my/train.de"],
              "tpu.cfg": ["--tpu=local"]}


@pytest.mark.parametrize("path", FLAGFILES, ids=os.path.basename)
def test_every_flagfile_parses(path):
  flagfile = f"--flagfile={os.path.relpath(path, REPO_ROOT)}"
  files = USER_FILES.get(os.path.basename(path), [])
  if files:
    with pytest.raises(flags.IllegalFlagValueError, match=files[0].split("=")[0]):
      parse(flagfile, "--model_dir=/tmp/x")
  values, model, _ = parse(flagfile, "--model_dir=/tmp/x", *files)
  assert model.hidden_size % model.num_heads == 0 or model.key_size


def test_big_is_base_plus_deltas():
  _, base, base_train = parse("--flagfile=flags/base_en_de.cfg")
  _, big, big_train = parse("--flagfile=flags/big_en_de.cfg")
  assert (big.hidden_size, big.filter_size, big.num_heads) == (1024, 4096, 16)
  assert big.layer_prepostprocess_dropout == 0.3 and big_train.train_steps == 300_000
  assert (base.hidden_size, base.filter_size, base.num_heads) == (512, 2048, 8)
  assert base.num_hidden_layers == big.num_hidden_layers == 6
  assert base_train.adam_beta2 == 0.98 and base_train.learning_rate_warmup_steps == 4000


def test_presets_average_the_papers_checkpoints_and_a_typed_checkpoint_wins():
  """Paper 6.1: base averages the last 5 checkpoints, big the last 20; decode and
  export take it from the flagfile, unless --checkpoint_path is typed."""
  base, _, _ = parse("--flagfile=flags/base_en_de.cfg")
  big, _, _ = parse("--flagfile=flags/big_en_de.cfg")
  assert (base.average_last_n, big.average_last_n) == (5, 20)
  argv = ["decode", "--flagfile=flags/big_en_de.cfg"]
  assert t2t_flags.checkpoint_choice(argv, big) == (None, 20)
  chosen, _, _ = parse("--flagfile=flags/big_en_de.cfg", "--checkpoint_path=m/best")
  assert t2t_flags.checkpoint_choice(argv + ["--checkpoint_path=m/best"], chosen) == \
      ("m/best", 0)
  both, _, _ = parse("--flagfile=flags/big_en_de.cfg", "--checkpoint_path=m/best",
                     "--average_last_n=3")
  assert t2t_flags.checkpoint_choice(
      argv + ["--checkpoint_path=m/best", "--average_last_n=3"], both) == ("m/best", 3)


def test_en_fr_big_uses_low_dropout():
  _, model, _ = parse("--flagfile=flags/big_en_fr.cfg")
  assert model.hidden_size == 1024 and model.layer_prepostprocess_dropout == 0.1


# Table 3 rows as overrides of base: (flags, expected d_k, d_v, h, N, d_model, d_ff).
TABLE3 = [
    (["--num_heads=1"], 512, 512, 1, 6, 512, 2048),
    (["--num_heads=4"], 128, 128, 4, 6, 512, 2048),
    (["--num_heads=16"], 32, 32, 16, 6, 512, 2048),
    (["--num_heads=32"], 16, 16, 32, 6, 512, 2048),
    (["--key_size=16"], 16, 64, 8, 6, 512, 2048),
    (["--key_size=32"], 32, 64, 8, 6, 512, 2048),
    (["--num_hidden_layers=2"], 64, 64, 8, 2, 512, 2048),
    (["--hidden_size=256"], 32, 32, 8, 6, 256, 2048),
    (["--hidden_size=1024"], 128, 128, 8, 6, 1024, 2048),
    (["--filter_size=4096"], 64, 64, 8, 6, 512, 4096),
    (["--layer_prepostprocess_dropout=0.2"], 64, 64, 8, 6, 512, 2048),
    (["--label_smoothing=0.2"], 64, 64, 8, 6, 512, 2048),
    (["--position_embedding=learned"], 64, 64, 8, 6, 512, 2048),
]


@pytest.mark.parametrize("overrides,dk,dv,h,n,d,dff", TABLE3, ids=[r[0][0] for r in TABLE3])
def test_table3_rows_are_overrides_of_base(overrides, dk, dv, h, n, d, dff):
  _, model, _ = parse("--flagfile=flags/base_en_de.cfg", *overrides)
  assert (model.head_key_size, model.head_value_size, model.num_heads,
          model.encoder_layers, model.hidden_size, model.filter_size) == (dk, dv, h, n, d, dff)


def test_relative_positions_are_a_flag_and_their_window_is_checked():
  _, model, _ = parse("--flagfile=flags/base_en_de.cfg", "--position_embedding=relative",
                      "--max_relative_position=16")
  assert (model.position_embedding, model.max_relative_position) == ("relative", 16)
  with pytest.raises(flags.IllegalFlagValueError, match="max_relative_position"):
    parse("--position_embedding=relative", "--max_relative_position=0")


def test_inconsistent_flags_are_refused_with_values():
  with pytest.raises(flags.IllegalFlagValueError, match="hidden_size=512.*num_heads=7"):
    parse("--flagfile=flags/base_en_de.cfg", "--num_heads=7")
  with pytest.raises(flags.IllegalFlagValueError, match="dev_src and --dev_tgt"):
    parse("--dev_src=a.txt")
  with pytest.raises(flags.IllegalFlagValueError, match="needs --train_src"):
    parse("--data_source=files")
  with pytest.raises(flags.UnrecognizedFlagError):
    parse("--hiden_size=3")


def dry_run(*args):
  """`python -m t2t_keras.train --dry_run ARGS`, its main in this process (the console
  script test of tests/tools_test.py runs a dry run as a process)."""
  result = inprocess.run("train", "--dry_run", *args)
  assert result.returncode == 0, result.stderr[-2000:]
  last = result.stdout.strip().splitlines()[-1]
  assert last.startswith("parameters: "), last
  return int(last.split()[1])


def expected_parameters(v, d, dff, n, h=None):
  """Parameter count from the architecture: shared embedding, attention projections
  without bias, FFN with biases, two (encoder) / three (decoder) LayerNorms per layer."""
  attention = 4 * d * d
  ffn = d * dff + dff + dff * d + d
  norm = 2 * d
  return v * d + n * (attention + ffn + 2 * norm) + n * (2 * attention + ffn + 3 * norm)


@pytest.mark.parametrize("cfg,d,dff,paper", [("base_en_de", 512, 2048, 65e6),
                                              ("big_en_de", 1024, 4096, 213e6)])
@pytest.mark.slow
def test_dry_run_parameter_counts(cfg, d, dff, paper):
  count = dry_run(f"--flagfile=flags/{cfg}.cfg", "--vocab_size=37000")
  assert count == expected_parameters(37000, d, dff, 6)
  assert abs(count - paper) / paper < 0.04  # the paper reports ~65M and 213M


def test_each_config_validates_itself_and_the_flags_ask_it():
  """One home per check: the config's validate(), which the flag validators call."""
  from t2t_keras import errors  # pylint: disable=import-outside-toplevel
  from t2t_keras.configs import (DataConfig,  # pylint: disable=import-outside-toplevel
                                 DecodeConfig, ModelConfig, TrainConfig)
  cases = [(TrainConfig(strategy="tpu"), "--strategy=tpu needs --tpu"),
           (TrainConfig(strategy="horovod"), "--strategy='horovod' must be one of"),
           (TrainConfig(accum_steps=0), "--accum_steps=0 must be positive"),
           (DataConfig(batch_size=100, max_length=200), "--batch_size=100 tokens"),
           (ModelConfig(hidden_size=10, num_heads=3), "--hidden_size=10 is not divisible"),
           (DecodeConfig(num_samples=2), "--num_samples=2 needs sampling")]
  for config, message in cases:
    with pytest.raises(errors.ConfigError, match=message) as error:
      config.validate()
    assert isinstance(error.value, errors.UserError)
  with pytest.raises(flags.IllegalFlagValueError, match="--strategy=tpu needs --tpu"):
    parse("--strategy=tpu")
  with pytest.raises(flags.IllegalFlagValueError, match="--batch_size=100 tokens"):
    parse("--batch_size=100", "--max_length=200")
