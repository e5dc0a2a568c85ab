"""Runs a command's `main` in the test's own process.

A command started as a subprocess pays TensorFlow's import and runtime start (4-8 s on
2 cores) before any work; most command tests check a message, an exit code or an
output file, which the same `main` gives in-process. `run` returns what
`subprocess.run(..., capture_output=True, text=True)` would (returncode, stdout,
stderr), so a test can switch between the two. Each entry point keeps at least one
real subprocess test (tests/tools_test.py runs the console scripts): signals, exit
codes of a fresh process and the runtime's start belong there.

The call goes through the command's `console_main` (what `python -m` runs),
with `absl.app.run` replaced by the steps of app.run that matter here: parse `argv`
(a bad flag: exit 1 with absl's "FATAL Flags parsing error"), INFO logging, then the
main (`app.UsageError`: its message and exit 1). `sys.argv`, the working directory
and standard input are set for the call; the flags, the working directory, logging,
Keras' dtype policy, op determinism and signal handlers are restored afterwards, so
later tests see none of it.

The entry points (t2t_keras/flags.py defines their common flags once) share the
process's flags: a flag of another entry point imported earlier is accepted, where a
process would refuse it as unknown. The tools of t2t_keras/tools define flags of the
same names with other meanings (--model_dir is a list for the learning-curve tool), so
each tool gets a flag registry of its own: absl's and TensorFlow's flags and those its
import defines, swapped in for the call. TensorFlow's runtime has started in this
process: threads per op cannot be set (decode's --decode_parallel_batches warns).
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
from typing import Dict, Optional
from unittest import mock

from tests.conftest import REPO_ROOT

ENTRY_POINTS = {"train": "t2t_keras.train", "decode": "t2t_keras.decode",
                "score": "t2t_keras.score", "evaluate": "t2t_keras.evaluate",
                "export": "t2t_keras.export.__main__"}
TOOLS = ("average_checkpoints", "beam_translate", "build_vocab", "ct2_translate", "datagen",
         "linearize_trees", "plot_learning_curve", "query_serving", "run_recipe",
         "visualize_attention")

_TOOL_REGISTRIES: Dict[str, dict] = {}


def _own_registry(flag_values) -> dict:
  return flag_values._flags()  # pylint: disable=protected-access


def _tool_registry(module_name: str) -> dict:
  """The flags `module_name` runs with: the process's flags but this project's, plus
  those importing the tool defines (built on the first call)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  if module_name not in _TOOL_REGISTRIES:
    if module_name in sys.modules:
      raise RuntimeError(f"{module_name} was imported with the process's flags; "
                         "inprocess.run must be the first to import a tool")
    registry = _own_registry(flags.FLAGS)
    saved = dict(registry)
    ours = {id(flag) for module, defined in flags.FLAGS.flags_by_module_dict().items()
            if module.startswith(("t2t_keras", "tests", "__main__")) for flag in defined}
    registry.clear()
    registry.update({name: flag for name, flag in saved.items() if id(flag) not in ours})
    try:
      importlib.import_module(module_name)
      _TOOL_REGISTRIES[module_name] = dict(registry)
    finally:
      registry.clear()
      registry.update(saved)
  return _TOOL_REGISTRIES[module_name]


@contextlib.contextmanager
def _flags_of(command: str):
  """Yields the command's module with its flags in place (a tool's own registry)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  if command in ENTRY_POINTS:
    yield importlib.import_module(ENTRY_POINTS[command])
    return
  if command not in TOOLS:
    raise ValueError(f"unknown command {command!r}: one of {sorted(ENTRY_POINTS)} or "
                     f"{list(TOOLS)}")
  module_name = f"t2t_keras.tools.{command}"
  tool = _tool_registry(module_name)
  registry = _own_registry(flags.FLAGS)
  saved = dict(registry)
  registry.clear()
  registry.update(tool)
  try:
    yield sys.modules[module_name]
  finally:
    registry.clear()
    registry.update(saved)


def run(command: str, *args, stdin: Optional[str] = None,
        cwd: str = REPO_ROOT) -> subprocess.CompletedProcess:
  """`python -m t2t_keras.<command> args...` (or a tool's console script) here.

  Args:
    command: a key of ENTRY_POINTS or a name in TOOLS.
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
  from tensorflow.python.framework import config as tf_config

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
  was_deterministic = tf_config.is_op_determinism_enabled()
  code = 0

  def app_run(main, argv=None, flags_parser=None, **unused):
    """absl.app.run's part that matters in-process: parse (with the command's
    `flags_parser`, if it has one), log at INFO, run main."""
    del unused
    try:
      remaining = (flags_parser or flags.FLAGS)(argv or sys.argv)
    except flags.Error as error:
      print(f"FATAL Flags parsing error: {error}", file=sys.stderr)
      sys.exit(1)
    if flags.FLAGS["verbosity"].using_default_value:
      flags.FLAGS.verbosity = 0  # INFO, as app.run makes it once flags are parsed
    flags.FLAGS["verbosity"]._update_logging_levels()  # pylint: disable=protected-access
    sys.exit(main(remaining))

  with _flags_of(command) as module, flagsaver.flagsaver(), \
      contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
      mock.patch.object(app, "run", app_run):
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
      module.console_main()
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
      if not was_deterministic:  # train's --deterministic turns it on for the process
        tf_config.disable_op_determinism()
      if not was_parsed:
        flags.FLAGS.unparse_flags()
  return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())
