"""Runs an entry point's `main(argv)` in the test's own process.

A command started as a subprocess pays TensorFlow's import and runtime start (4-8 s on
2 cores) before any work; most command tests check a message, an exit code or an
output file, which the same `main` gives in-process. `run` returns what
`subprocess.run(..., capture_output=True, text=True)` would (returncode, stdout,
stderr), so a test can switch between the two. Each entry point keeps at least one
real subprocess test (tests/tools_test.py runs every console script): signals, exit
codes of a fresh process and the runtime's start belong there.

The call parses `argv` as `absl.app.run` does (a bad flag: exit 1 with absl's
"FATAL Flags parsing error"; `app.UsageError`: its message and exit 1), runs the
command with `sys.argv`, the working directory and standard input set, and restores
the flags, the working directory, logging, Keras' dtype policy and signal handlers
afterwards, so later tests see none of it. Differences from a process: flags of every
command imported so far are defined (a process would refuse another command's flag as
unknown), and TensorFlow's runtime has started (threads per op cannot be set).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import signal
import subprocess
import sys
from typing import Optional

from tests.conftest import REPO_ROOT

# The commands whose flags can share one process (t2t_keras/flags.py defines the
# common ones once); the tools of t2t_keras/tools define flags of the same names
# (--model_dir) with other meanings, so they run as subprocesses.
MODULES = {"train": "t2t_keras.train", "decode": "t2t_keras.decode",
           "score": "t2t_keras.score", "evaluate": "t2t_keras.evaluate",
           "export": "t2t_keras.export.__main__"}


def run(command: str, *args, stdin: Optional[str] = None,
        cwd: str = REPO_ROOT) -> subprocess.CompletedProcess:
  """`python -m t2t_keras.<command> args...` in this process.

  Args:
    command: a key of MODULES.
    *args: the command line after the program name (converted with str).
    stdin: text the command reads as standard input (default: none).
    cwd: the working directory during the call (flagfile paths resolve from it).

  Returns:
    A CompletedProcess with returncode, stdout and stderr (text).
  """
  # pylint: disable=import-outside-toplevel
  import keras
  from absl import app, flags
  from absl import logging as absl_logging
  from absl.testing import flagsaver

  module = importlib.import_module(MODULES[command])
  argv = [f"t2t_keras.{command}", *map(str, args)]
  stdout, stderr = io.StringIO(), io.StringIO()
  stdin_stream = io.TextIOWrapper(io.BytesIO((stdin or "").encode("utf-8")),
                                  encoding="utf-8")
  handler = absl_logging.get_absl_handler()
  saved_handler = (handler.formatter, list(handler.filters))
  saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  saved_policy = keras.config.dtype_policy()
  saved_argv, saved_cwd = sys.argv, os.getcwd()
  was_parsed = flags.FLAGS.is_parsed()
  code = 0
  with flagsaver.flagsaver(), contextlib.redirect_stdout(stdout), \
      contextlib.redirect_stderr(stderr):
    old_stdin, sys.stdin = sys.stdin, stdin_stream
    sys.argv = argv
    os.chdir(cwd)
    python_handler = handler.python_handler
    saved_stream, python_handler.stream = python_handler.stream, stderr
    # app.run puts absl's handler on the root logger (use_absl_handler); pytest's
    # process has its own, so the command's log lines would not reach its stderr.
    attached = handler not in logging.root.handlers
    if attached:
      logging.root.addHandler(handler)
    saved_levels = absl_logging.get_absl_logger().level, logging.root.level
    try:
      flags.FLAGS.unparse_flags()
      try:
        remaining = flags.FLAGS(argv)
      except flags.Error as error:
        print(f"FATAL Flags parsing error: {error}", file=sys.stderr)
        code = 1
      else:
        if flags.FLAGS["verbosity"].using_default_value:
          flags.FLAGS.verbosity = 0  # INFO, as app.run makes it once flags are parsed
        flags.FLAGS["verbosity"]._update_logging_levels()  # pylint: disable=protected-access
        module.main(remaining)
    except app.UsageError as error:
      print(f"{error}", file=sys.stderr)
      code = error.exitcode
    except SystemExit as exit_:
      code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
      if isinstance(exit_.code, str):
        print(exit_.code, file=sys.stderr)
    finally:
      python_handler.stream = saved_stream
      if attached:
        logging.root.removeHandler(handler)
      absl_logging.get_absl_logger().setLevel(saved_levels[0])
      logging.root.setLevel(saved_levels[1])
      sys.stdin, sys.argv = old_stdin, saved_argv
      os.chdir(saved_cwd)
      handler.setFormatter(saved_handler[0])
      handler.filters[:] = saved_handler[1]
      for signum, previous in saved_signals.items():
        signal.signal(signum, previous)
      keras.config.set_dtype_policy(saved_policy)
      if not was_parsed:
        flags.FLAGS.unparse_flags()
  return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())
