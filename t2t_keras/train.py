"""Trains a Transformer: `python -m t2t_keras.train --flagfile=flags/base_en_de.cfg
--model_dir=...`.

A thin entry point: flags -> configs -> library. The same command resumes from the
latest checkpoint in --model_dir. `--dry_run` builds the model without any data,
prints its summary and, as the last line, `parameters: <count>`.
"""

from __future__ import annotations

import os
import shlex
import sys

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags

FLAGS = flags.FLAGS
t2t_flags.define_all()


def relaunch_command() -> str:
  """The command line of this process, as a user would type it again."""
  program = sys.argv[0]
  if os.path.abspath(program) == os.path.abspath(__file__):  # python -m t2t_keras.train
    program = "python -m t2t_keras.train"
  return " ".join([program] + [shlex.quote(arg) for arg in sys.argv[1:]])


def train() -> None:
  """Flags -> configs -> the run (t2t_keras.training.run); --dry_run: the model only.
  A lost worker's message ends with the command that resumes the run."""
  model_config = t2t_flags.model_config()
  from t2t_keras.training import run  # pylint: disable=import-outside-toplevel
  if FLAGS.dry_run:
    run.print_model(model_config)
    return
  result = run.train_and_evaluate(
      model_config, t2t_flags.data_config(), t2t_flags.train_config(),
      t2t_flags.decode_config(), t2t_flags.run_config(resume_command=relaunch_command()))
  if result.preempted:  # the run said so; rerunning the command resumes it
    sys.exit(run.PREEMPTED_EXIT_CODE)


def check_usage() -> None:
  for warning in t2t_flags.check_train_flags(sys.argv):
    logging.warning(warning)
  if not FLAGS.model_dir and not FLAGS.dry_run:
    raise app.UsageError("--model_dir is required: checkpoints, vocabulary and logs go "
                         "there (a local path or gs://bucket/path).")


command = console.Command(train, check=check_usage, model_dir=None)
main, console_main = command.main, command.console_main  # console_main: python -m
console_script_main = command.console_script_main  # t2t-train

if __name__ == "__main__":
  console_main()
