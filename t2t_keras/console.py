"""What a person sees in the terminal when running an entry point.

By default: this project's progress lines, results, its own log lines (data statistics,
checkpoints) as plain text, and warnings from anywhere. Hidden: TensorFlow's C++ log
lines (a cuInit failure on every CPU-only machine, oneDNN notes, CPU feature notes) and
the INFO chatter of TensorFlow, Keras, matplotlib and tensorflow-datasets ("Sharding
callback duration", 2,000-character signature messages per export). `--verbosity=0`
(or higher) on the command line brings all of it back, in absl's usual format;
`TF_CPP_MIN_LOG_LEVEL` set in the environment is respected (0 shows every C++ line).
The default hides TensorFlow's C++ ERROR lines as well (the cuInit one is an ERROR);
a failing op still raises a Python exception with its message, and a run that fails
in a way the message does not explain is worth repeating with `--verbosity=0`.

Entry points call `quiet_tensorflow()` before TensorFlow is imported (the C++ level is
read once, at import) and `setup_logging()` once flags are parsed; every command's
`console_main` (and `console_script_main`) calls `own_help()`, which answers --help with
the command's own flags.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import t2t_keras
from t2t_keras import errors

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_DIR = os.path.dirname(_PACKAGE_DIR)
_OWN_DIRS = tuple(os.path.join(_REPO_DIR, d) + os.sep for d in ("t2t_keras", "tools"))


def _verbosity_requested(argv: Sequence[str]) -> bool:
  """--verbosity=N (or -v / --v) with N >= 0 on the command line: show everything."""
  for i, arg in enumerate(argv[1:], 1):
    if arg == "--":
      break
    name, _, value = arg.partition("=")
    if name in ("--verbosity", "-v", "--v"):
      if not value and i + 1 < len(argv):
        value = argv[i + 1]
      try:
        return int(value) >= 0
      except ValueError:
        return True
  return False


def quiet_tensorflow(argv: Optional[Sequence[str]] = None, import_now: bool = True) -> None:
  """Hides TensorFlow's C++ log lines unless asked for (call before importing TF).

  TF_CPP_MIN_LOG_LEVEL governs the lines after TensorFlow's logging is initialised;
  the lines written while `import tensorflow` runs (oneDNN and CUDA-stub notes, each
  printed twice) ignore it, so with `import_now` TensorFlow is imported here with the
  process's stderr set aside, and what it wrote is shown only if the import fails.
  A level the user set is kept; at 0 the import's lines are shown too. Without
  TensorFlow installed, raises ImportError saying how to install it, unless the
  caller imports it only if it turns out to need it (`import_now=False`: evaluate,
  which needs TensorFlow for remote paths only).
  """
  if import_now:  # the first place a command needs TensorFlow
    t2t_keras.require_tensorflow()
  argv = sys.argv if argv is None else argv
  if _verbosity_requested(argv):
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  if (os.environ["TF_CPP_MIN_LOG_LEVEL"].strip() in ("", "0") or not import_now
      or "tensorflow" in sys.modules):
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except BaseException:
      os.dup2(saved, 2)
      captured.seek(0)
      sys.stderr.write(captured.read().decode("utf-8", "replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


# absl's spellings of --help (--helpfull stays absl's: every flag of the process).
_HELP_FLAGS = ("help", "helpshort", "?")


def _help_requested(argv: Sequence[str]) -> bool:
  for arg in argv[1:]:
    if arg == "--":
      break
    name, _, value = arg.lstrip("-").partition("=")
    if arg.startswith("-") and name in _HELP_FLAGS and value.lower() in ("", "true", "1"):
      return True
  return False


def _command_name(module_name: str) -> str:
  """"decode" for t2t_keras.decode, "export" for t2t_keras.export.__main__, ..."""
  if module_name == "__main__":
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module_name = spec.name if spec else os.path.splitext(os.path.basename(sys.argv[0]))[0]
  return [part for part in module_name.split(".") if part != "__main__"][-1]


def _render_flag(flag) -> str:
  """One flag as absl's help renders it: name, help, default, type."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  text = f"-{flag.short_name}," if flag.short_name else ""
  text += f"--{'[no]' if flag.boolean else ''}{flag.name}: {flag.help or ''}"
  lines = [flags.text_wrap(text, indent="    ", firstline_indent="  ")]
  if flag.default_as_str:
    lines.append(flags.text_wrap(f"(default: {flag.default_as_str})", indent="    "))
  if flag.parser.syntactic_help:
    lines.append(flags.text_wrap(f"({flag.parser.syntactic_help})", indent="    "))
  return "\n".join(lines)


def command_help(module_name: str, adopt: Sequence[str] = (), flag_values=None) -> str:
  """The --help of the command `module_name`: its docstring, then its flags by group.

  First the flags the command's module defines or declares key flags (and those of the
  modules in `adopt`), then the groups of t2t_keras.flags it defined (model, data,
  training, decoding), each flag with its help and default. Flags of absl, TensorFlow
  and other commands imported into the same process are left out.
  """
  from absl import flags  # pylint: disable=import-outside-toplevel
  # Only a command that imported t2t_keras.flags has its groups (importing it would
  # import TensorFlow for the help of a tool that needs none).
  t2t_flags = sys.modules.get("t2t_keras.flags")
  groups = t2t_flags.GROUPS if t2t_flags else {}
  fv = flags.FLAGS if flag_values is None else flag_values
  defined_by = {id(flag): module for module, defined in fv.flags_by_module_dict().items()
                for flag in defined}

  def current(flag) -> bool:  # the registry may have swapped a flag of that name
    return flag.name in fv and fv[flag.name] is flag

  own, seen = [], set()
  for key in (sys.argv[0] if module_name == "__main__" else module_name, *adopt):
    for flag in fv.get_key_flags_for_module(key):
      if current(flag) and id(flag) not in seen:
        own.append(flag)
        seen.add(id(flag))
  sections = [(f"{_command_name(module_name)}:", own)] if own else []
  for group, about in groups.items():
    listed = [fv[name] for name, of in t2t_flags.GROUP_OF.items()
              if of == group and name in fv and id(fv[name]) not in seen
              and defined_by.get(id(fv[name])) == t2t_flags.__name__]
    if listed:
      sections.append((f"{group}: {about}", listed))
  doc = (sys.modules[module_name].__doc__ or "").strip()
  out = [doc, "", flags.text_wrap(
      "flags (--flagfile=FILE reads flags from FILE, e.g. a recipe of flags/; "
      "--helpfull also lists absl's and TensorFlow's):")]
  for title, listed in sections:
    out += ["", flags.text_wrap(title, indent="  ", firstline_indent="")]
    out += [_render_flag(flag) for flag in listed]
  return "\n".join(out) + "\n"


def own_help(module_name: str, adopt: Sequence[str] = ()) -> None:
  """`--help` prints `command_help(module_name, adopt)` and exits (code 1, as absl's).

  absl's --help lists only the flags `__main__` defines: none for a command whose
  flags t2t_keras.flags generates from the configs, nor for a console script's wrapper
  or a `tools/` launcher; its --helpfull lists every flag of the process, absl's test
  flags and TensorFlow's TPU tracer among them. Call it once every flag is defined, before
  `app.run`. For absl's own usage message (a usage error), `module_name`'s docstring
  and flags become those of the `__main__` that launched it.
  """
  from absl import flags  # pylint: disable=import-outside-toplevel
  if _help_requested(sys.argv):
    sys.stdout.write(command_help(module_name, adopt))
    sys.stdout.flush()
    sys.exit(1)
  module = sys.modules[module_name]
  main = sys.modules.get("__main__")
  if main is None or main is module:
    return
  main.__doc__ = module.__doc__
  for flag in flags.FLAGS.get_key_flags_for_module(module_name):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)


class _OwnInfoOnly(logging.Filter):
  """Lets through this project's INFO lines and everyone's warnings and errors."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.pathname.startswith(_OWN_DIRS)


class _PlainFormatter(logging.Formatter):
  """INFO as the bare message; warnings and errors prefixed with their level."""

  def format(self, record: logging.LogRecord) -> str:
    message = record.getMessage()
    if record.exc_info:
      message += "\n" + self.formatException(record.exc_info)
    if record.levelno >= logging.ERROR:
      return f"error: {message}"
    if record.levelno >= logging.WARNING:
      return f"warning: {message}"
    return message


def setup_logging(argv: Optional[Sequence[str]] = None) -> None:
  """Plain, filtered log lines unless --verbosity was given (call after flag parsing)."""
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  argv = sys.argv if argv is None else argv
  if _verbosity_requested(argv):
    return
  handler = absl_logging.get_absl_handler()
  handler.setFormatter(_PlainFormatter())
  if not any(isinstance(f, _OwnInfoOnly) for f in handler.filters):
    handler.addFilter(_OwnInfoOnly())


class Progress:
  """A progress line on stderr every `every` seconds: done/total, rate, ETA.

  `total` None: unknown (a stream), the line shows done and rate only. `done`: work
  done before this run (a resumed decode); the rate and ETA count this run's work.
  `where`: the devices doing it, named after the count (decode on several devices).
  """

  def __init__(self, total: Optional[int], unit: str = "sentences", every: float = 5.0,
               stream=None, verb: str = "decoded", done: int = 0, where: str = ""):
    self.total, self.unit, self.every, self.verb = total, unit, every, verb
    self.on = f" on {where}" if where else ""
    self.stream = stream or sys.stderr
    self.start = self.last = time.time()
    self.done = self.before = done

  def update(self, n: int, force: bool = False):
    self.done += n
    now = time.time()
    if force or now - self.last >= self.every or (self.total is not None
                                                 and self.done >= self.total):
      self.last = now
      elapsed = max(now - self.start, 1e-9)
      rate = (self.done - self.before) / elapsed
      if self.total is None:
        print(f"{self.verb} {self.done} {self.unit}{self.on} ({rate:.1f} {self.unit}/s, elapsed "
              f"{elapsed:.0f}s)", file=self.stream, flush=True)
        return
      eta = (self.total - self.done) / rate if rate > 0 else float("inf")
      print(f"{self.verb} {self.done}/{self.total} {self.unit}{self.on} ({rate:.1f} {self.unit}/s, "
            f"elapsed {elapsed:.0f}s, eta {eta:.0f}s)", file=self.stream, flush=True)


class Command:
  """The `main(argv)`, `console_main()` and `console_script_main()` every entry point
  shares.

  `main` sets up logging, refuses positional arguments, requires --model_dir (unless
  told not to), runs `check` (usage checks before any work: an `app.UsageError` prints the usage;
  a user error or a flag `ValidationError` prints one `error: ...` line and exits 2, as
  absl does for a bad flag), then runs `run` through `errors.exit_on_user_error` (a
  user error: one line and exit 1).

  An entry point writes `command = console.Command(run, ...)`, then
  `main, console_main = command.main, command.console_main` (its `__main__` guard
  calls `console_main`) and `console_script_main = command.console_script_main`
  (setup.py's console scripts name it).
  """

  def __init__(self, run: Callable[[], object], *,
               check: Optional[Callable[[], object]] = None,
               model_dir: Optional[str] = "--model_dir is required (the directory "
                                         "training wrote).",
               extra_errors: Sequence[type] = ()):
    """Args:
      run: the command's work.
      check: usage checks, run first.
      model_dir: the message when --model_dir is missing; None: not required.
      extra_errors: further exception types that are the user's to fix
        (`errors.exit_on_user_error`).
    """
    self.run, self.check, self.model_dir = run, check, model_dir
    self.extra_errors = tuple(extra_errors)

  def main(self, argv) -> None:
    # pylint: disable=import-outside-toplevel
    from absl import app
    from absl import flags
    setup_logging()
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
    if self.model_dir and not flags.FLAGS.model_dir:
      raise app.UsageError(self.model_dir)
    if self.check is not None:
      try:
        self.check()
      except (errors.UserError, flags.ValidationError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    errors.exit_on_user_error(self.run, self.extra_errors)

  def console_main(self) -> None:
    """`python -m t2t_keras.<name>` (the module's `__main__` guard); its help is the
    entry point's (`own_help` of the module that defines `run`)."""
    self._main_of_process(sys._getframe(1), script=False)  # pylint: disable=protected-access

  def console_script_main(self) -> None:
    """The `t2t-<name>` console script (setup.py): pip's launcher calls it as its last
    act, `sys.exit(console_script_main())` at its top level."""
    self._main_of_process(sys._getframe(1), script=True)  # pylint: disable=protected-access

  def _main_of_process(self, caller, script: bool) -> None:
    from absl import app  # pylint: disable=import-outside-toplevel
    own_help(self.run.__module__)
    try:
      try:
        app.run(self.main)
      except BrokenPipeError:
        # Whoever read the output went away (`t2t-decode ... | head`): stop quietly, as
        # Unix tools do, with stdout pointed at nothing for the flushes to come.
        try:
          os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):  # stdout is no file (a caller's)
          pass
        sys.exit(1)
    except SystemExit as done:
      if not _ends_without_teardown(caller, script):
        raise
      exit_without_teardown(done.code)


def _ends_without_teardown(caller, script: bool) -> bool:
  """Whether the process may end here without Python's teardown.

  Only when the command is the process, and nothing can catch its `SystemExit` and go
  on: `python -m t2t_keras.X` (runpy's `_run_module_as_main` runs the module's code,
  whose `__main__` guard calls `console_main`) or pip's console-script launcher (the
  top level of a `__main__` script calling `console_script_main`). Not for a script's
  own call, which a `try`, `with` or `finally` around it may outlive, nor under
  IPython's `%run -m`, a notebook, `runpy.run_module`, a debugger or the tests, nor
  with `python -i` (the prompt comes after the exit). Not for one task of a cluster
  (TF_CONFIG) or a TPU run either, where TensorFlow's teardown takes part in the
  cluster's shutdown.
  """
  from absl import flags  # pylint: disable=import-outside-toplevel
  if sys.flags.inspect or os.environ.get("PYTHONINSPECT"):
    return False
  if caller.f_code.co_name != "<module>" or caller.f_globals.get("__name__") != "__main__":
    return False
  outer = caller.f_back
  if script:
    if outer is not None:
      return False
  else:  # runpy's _run_module_as_main -> _run_code -> the module's code
    below = outer.f_back if outer is not None else None
    if (outer is None or outer.f_code.co_name != "_run_code" or below is None
        or below.f_code.co_name != "_run_module_as_main" or below.f_back is not None
        or "runpy" not in below.f_code.co_filename):
      return False
  if os.environ.get("TF_CONFIG"):
    return False
  strategy = flags.FLAGS["strategy"].value if "strategy" in flags.FLAGS else None
  return strategy not in ("tpu", "multi_worker_mirrored")


def exit_without_teardown(code) -> None:
  """Ends the process as `sys.exit(code)` would, without Python's teardown.

  Teardown frees every graph and function TensorFlow traced, one by one: 0.7-1 s of
  a tiny training command and a quarter of a short decode's time, all after the
  command's work. Everything a command writes is closed or flushed by then (files in
  `with` blocks, summary writers flushed, checkpoints and exports synchronous); what
  still runs here is what Python runs before teardown, in its order: the message of
  `sys.exit("message")`; threading's exit hooks (an idle `ThreadPoolExecutor`, such
  as tensorflow-datasets' downloader, is told to stop) and the wait for non-daemon
  threads, but for the trainer's one that drops its input iterators, which only frees
  memory (unless a tf.data service job must be released); atexit handlers (logging's
  flush among them); the flush of stdout and stderr.
  """
  import atexit  # pylint: disable=import-outside-toplevel
  import threading  # pylint: disable=import-outside-toplevel

  from absl import flags  # pylint: disable=import-outside-toplevel
  if code is None:
    code = 0
  elif not isinstance(code, int):  # sys.exit("message"): printed, exit status 1
    print(code, file=sys.stderr)
    code = 1
  for hook in reversed(getattr(threading, "_threading_atexits", [])):
    hook()
  service = "data_service" in flags.FLAGS and flags.FLAGS["data_service"].value
  for thread in threading.enumerate():
    if (thread is not threading.current_thread() and not thread.daemon
        and (thread.name != FREES_MEMORY_ONLY or service)):
      thread.join()
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  except (OSError, ValueError):  # a closed pipe (`t2t-decode ... | head`): as Python
    code = 120
  os._exit(code)  # pylint: disable=protected-access


# The name of the trainer's thread that drops its input iterators (trainer.py).
FREES_MEMORY_ONLY = "t2t_keras_drop_iterators"
