"""Errors a user can fix, and the one place that turns them into a message and exit code.

Every error class here carries a message that names the file, line, flag, checkpoint or
step and says what to do. The modules that detect a problem raise these; entry points
and tools run their work through `exit_on_user_error`, so a user sees one `error: ...`
line and exit code 1 instead of a stack trace (the trace is logged at debug level, shown
with `--verbosity=1`). Errors that are not a user's to fix (a bug, an op failing for an
unexplained reason) keep their stack trace.

This module imports nothing heavy (no TensorFlow), so any module can raise these.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence, Type


class UserError(Exception):
  """A problem the user can fix; the message says what it is and what to do."""


class ConfigError(UserError, ValueError):
  """A setting, or a combination of settings, that cannot work; the message names the
  flags and their values and says what to do (raised by the configs' `validate()`)."""


class DataError(UserError, ValueError):
  """Training or evaluation data: a file, line or dataset and what to do about it."""


class TreeError(UserError, ValueError):
  """A malformed parse tree; the message names the file (or input) and line."""


class InputError(UserError, ValueError):
  """A missing, undecodable or misaligned input file of a command; the message names it."""


class ModelDirError(UserError, ValueError):
  """The model directory does not match the requested run, or cannot be read."""


class CheckpointError(UserError, RuntimeError):
  """A checkpoint is corrupt or belongs to a different model."""


class TrainingError(UserError, RuntimeError):
  """Training cannot go on (NaN loss, empty dataset); the message says what to do."""


class ExportError(UserError, ValueError):
  """A model or request an export format cannot represent, or its package is missing."""


def exit_on_user_error(fn: Callable[[], object],
                       extra_errors: Sequence[Type[BaseException]] = ()) -> None:
  """Runs an entry point's or tool's `fn`; a user error becomes one line and exit 1.

  Args:
    fn: the command's work, called without arguments.
    extra_errors: further exception types that are the user's to fix for this command
      (e.g. `FileExistsError` for an export directory that exists, `OSError` for a
      tool's input file), reported the same way.
  """
  # pylint: disable=import-outside-toplevel
  from absl import flags
  from absl import logging as absl_logging
  try:
    fn()
  except (UserError, flags.ValidationError, *extra_errors) as error:
    absl_logging.debug("user error", exc_info=True)
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)


def reporting_user_errors(main: Callable[[list], object],
                          extra_errors: Sequence[Type[BaseException]] = ()):
  """An absl `main(argv)` whose user errors exit as in `exit_on_user_error`:
  `app.run(errors.reporting_user_errors(main))`."""
  return lambda argv: exit_on_user_error(lambda: main(argv), extra_errors)
