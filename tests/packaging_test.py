"""What `pip install` gives a user: a wheel with the tools as commands, the license and
its metadata; every command resolves to a function that runs; `python tools/X.py` in
the repository runs the same code."""

import ast
import configparser
import glob
import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent import futures

import pytest

from tests import inprocess
from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)
# Repository tools that are not commands, and why (setup.py would say so too): none.
REPOSITORY_ONLY_TOOLS = set()


def setup_literals():
  """setup.py's ENTRY_POINTS and TOOLS, read without running setup()."""
  with open(os.path.join(REPO_ROOT, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  values = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
      values[node.targets[0].id] = ast.literal_eval(node.value)
  return values["ENTRY_POINTS"], values["TOOLS"]


def declared_commands():
  """command -> "module:function", as setup.py declares them."""
  entry_points, tools = setup_literals()
  commands = {f"t2t-{name}": f"t2t_keras.{module}:console_script_main"
              for name, module in entry_points.items()}
  commands.update({command: f"t2t_keras.tools.{module}:console_main"
                   for module, command in tools.items()})
  return commands


def test_every_tool_is_a_command_and_its_launcher_is_thin():
  _, tools = setup_literals()
  packaged = {os.path.basename(p)[:-3] for p in glob.glob(
      os.path.join(REPO_ROOT, "t2t_keras", "tools", "*.py"))} - {"__init__"}
  assert packaged == set(tools)
  launchers = {os.path.basename(p)[:-3] for p in glob.glob(
      os.path.join(REPO_ROOT, "tools", "*.py"))}
  assert launchers == set(tools) | REPOSITORY_ONLY_TOOLS
  for module in tools:
    with open(os.path.join(REPO_ROOT, "tools", f"{module}.py"), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert [(node.module, [a.name for a in node.names]) for node in imports] == [
        (f"t2t_keras.tools.{module}", ["console_main"])], module
    # Only the docstring, the import and the __main__ guard: the code is in the package.
    assert len(tree.body) == 3, module
  assert len(set(declared_commands().values())) == len(declared_commands())


def _run_help(command, target):
  """Runs the target of `command` with --help in a fresh process, as the console
  script's wrapper does (import the module, call the function)."""
  module, function = target.split(":")
  script = ("import importlib, sys\n"
            f"sys.argv = [{command!r}, '--help']\n"
            f"sys.exit(getattr(importlib.import_module({module!r}), {function!r})())\n")
  return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        cwd=REPO_ROOT, env=ENV, timeout=600, check=False)


# Flags each command's --help must list, by the section it lists them under: its own
# flags under its name, the shared ones under their group of t2t_keras.flags (model,
# data, training, decoding). Not only the docstring, as absl's --help printed.
OWN_FLAGS = {
    "t2t-train": {"model": ["hidden_size", "num_heads"], "data": ["data_source"],
                  "training": ["model_dir", "train_steps", "learning_rate"],
                  "decoding": ["beam_size", "alpha"]},
    "t2t-decode": {"decode": ["input_file", "output_file", "reference_file"],
                   "decoding": ["beam_size", "sampling_topk", "checkpoint_path"],
                   "training": ["model_dir"]},
    "t2t-export": {"export": ["export_version", "format"], "decoding": ["beam_size"]},
    "t2t-evaluate": {"evaluate": ["hypotheses", "references"]},
    "t2t-score": {"score": ["source_file", "target_file", "output_file"],
                  "training": ["model_dir"]},
    "t2t-average-checkpoints": {"average_checkpoints": ["model_dir", "last_n"]},
    "t2t-beam-translate": {"beam_translate": ["saved_model", "input", "output_dir",
                                              "invalid_utf8"]},
    "t2t-build-vocab": {"build_vocab": ["overwrite_vocab"],
                        "model": ["vocab_size"], "data": ["data_dir"]},
    "t2t-ct2-translate": {"ct2_translate": ["model", "compute_type", "beam_size"]},
    "t2t-data-service": {"data_service": ["dispatcher_address", "port"]},
    "t2t-datagen": {"datagen": ["data_dir", "corpora", "tatoeba_file"]},
    "t2t-linearize-trees": {"linearize_trees": ["trees"]},
    "t2t-plot-learning-curve": {"plot_learning_curve": ["model_dir", "labels"]},
    "t2t-query-server": {"query_serving": ["server", "signature_name"]},
    "t2t-run-recipe": {"run_recipe": ["recipe", "model_dir", "test_src", "train_minutes"]},
    "t2t-saved-model-cli": {"saved_model_cli": ["dir", "tag_set"]},
    "t2t-visualize-attention": {"visualize_attention": ["model_dir", "sentence"],
                                "decoding": ["beam_size"]},
}
# absl's and TensorFlow's flags (--helpfull's): absltest's, the TPU tracer's, logging's.
NOT_OWN = ("test_srcdir", "test_tmpdir", "tt_check_filter", "hbm_oom_exit",
           "op_conversion_fallback_to_while_loop", "logtostderr", "only_check_args")


def help_sections(output: str) -> dict:
  """section -> flag names listed under it, read from a command's --help output."""
  sections, current = {}, None
  lines = output.splitlines()
  start = next((i for i, line in enumerate(lines) if line.startswith("flags")), len(lines))
  for line in lines[start + 1:]:
    header = re.match(r"([A-Za-z_]\w*):( |$)", line)
    flag = re.match(r"  (?:-\S,)?--(?:\[no\])?(\w+):", line)
    if header:
      current = sections.setdefault(header.group(1), [])
    elif flag and current is not None:
      current.append(flag.group(1))
  return sections


def check_help(command: str, output: str) -> None:
  """`output` lists the flags OWN_FLAGS expects of `command` in their sections, and
  none of absl's or TensorFlow's."""
  sections = help_sections(output)
  for section, names in OWN_FLAGS[command].items():
    assert section in sections, (command, sorted(sections), output[-3000:])
    missing = set(names) - set(sections[section])
    assert not missing, (command, section, missing, sections[section])
  listed = {name for names in sections.values() for name in names}
  assert not listed & set(NOT_OWN), (command, listed & set(NOT_OWN))
  assert not any(f"--{name}" in output for name in NOT_OWN), command


def _top_level_names(tree) -> set:
  """Names a module defines at its top level (functions, and assignments such as
  `main, console_main = command.main, command.console_main`)."""
  names = set()
  for node in tree.body:
    if isinstance(node, ast.FunctionDef):
      names.add(node.name)
    elif isinstance(node, ast.Assign):
      for target in node.targets:
        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
  return names


def _first_docstring_line(target: str) -> str:
  """The first line of the docstring of the module a `module:function` target runs (a
  console script's wrapper has none; a package's is its __main__'s)."""
  spec = importlib.util.find_spec(target.split(":")[0])
  origin = spec.origin
  if spec.submodule_search_locations:
    origin = os.path.join(os.path.dirname(origin), "__main__.py")
  with open(origin, encoding="utf-8") as f:
    return ast.get_docstring(ast.parse(f.read())).splitlines()[0]


# Commands whose --help runs as a fresh process. The others' --help runs in-process
# (test_help_lists_the_commands_own_flags_by_group): a process each would only repeat
# TensorFlow's import. t2t-data-service and t2t-saved-model-cli have no in-process
# runner; t2t-train and t2t-run-recipe stand for the entry points and the tools.
HELP_PROCESSES = ("t2t-train", "t2t-run-recipe", "t2t-data-service", "t2t-saved-model-cli")


@pytest.mark.slow
def test_every_command_resolves_and_shows_its_own_help():
  """Each declared `module:function` imports and is a top-level function of its module;
  HELP_PROCESSES print their usage with their own flags as fresh processes (each
  imports TensorFlow), the others in-process."""
  commands = declared_commands()
  assert set(commands) == set(OWN_FLAGS)
  in_process = {_command_of(name) for name in [*inprocess.ENTRY_POINTS, *inprocess.TOOLS]}
  assert set(commands) == in_process | set(HELP_PROCESSES)
  for target in commands.values():  # resolvable without running anything
    module, function = target.split(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin.startswith(REPO_ROOT), target
    with open(spec.origin, encoding="utf-8") as f:
      assert function in _top_level_names(ast.parse(f.read())), target
  with futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(HELP_PROCESSES, pool.map(
        lambda command: _run_help(command, commands[command]), HELP_PROCESSES)))
  for command, result in results.items():
    output = result.stdout + result.stderr
    # absl's --help exits with 1 after the usage; TensorFlow's saved_model_cli with 0.
    assert result.returncode in (0, 1) and "Traceback" not in output, (command, output)
    assert output.startswith(_first_docstring_line(commands[command])), (command,
                                                                         output[:500])
    check_help(command, output)


def _command_of(name: str) -> str:
  """The console script of an inprocess.run name (an entry point or a tool module)."""
  return f"t2t-{name}" if name in inprocess.ENTRY_POINTS else setup_literals()[1][name]


@pytest.mark.parametrize("name", sorted(inprocess.ENTRY_POINTS) + list(inprocess.TOOLS))
def test_help_lists_the_commands_own_flags_by_group(name):
  """--help in-process: the command's own flags and its groups of shared flags, each
  with its help and default, and not absl's or TensorFlow's (absl's --help printed the
  docstring and "Try --helpfull": not one flag of train's)."""
  result = inprocess.run(name, "--help")
  assert result.returncode == 1, result  # absl's code after --help
  command = _command_of(name)
  assert result.stdout.startswith(_first_docstring_line(declared_commands()[command])), (
      command, result.stdout[:500])
  check_help(command, result.stdout)
  assert "(default: " in result.stdout


def _source_copy(destination):
  """The repository's files as a checkout has them (git's tracked and new files)."""
  listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                           "--exclude-standard"], cwd=REPO_ROOT, capture_output=True,
                          check=False)
  if listed.returncode != 0:
    pytest.skip("not a git checkout")
  for name in listed.stdout.decode().split("\0"):
    if name and os.path.isfile(os.path.join(REPO_ROOT, name)):
      os.makedirs(os.path.dirname(os.path.join(destination, name)), exist_ok=True)
      shutil.copy2(os.path.join(REPO_ROOT, name), os.path.join(destination, name))


@pytest.mark.slow
def test_wheel_carries_the_tools_commands_and_license(tmp_path):
  source, wheels = tmp_path / "src", tmp_path / "wheels"
  _source_copy(source)
  built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(wheels), str(source)],
                         capture_output=True, text=True, timeout=600, check=False,
                         env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"))
  assert built.returncode == 0, built.stderr[-3000:]
  (wheel,) = glob.glob(str(wheels / "t2t_keras-*.whl"))
  with zipfile.ZipFile(wheel) as archive:
    names = set(archive.namelist())
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    metadata = archive.read(f"{dist_info}/METADATA").decode()
    entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    license_text = archive.read(next(n for n in names if n.startswith(dist_info)
                                     and os.path.basename(n) == "LICENSE")).decode()
  _, tools = setup_literals()
  for module in tools:
    assert f"t2t_keras/tools/{module}.py" in names, module
  assert "t2t_keras/trained/model_card.py" in names and "t2t_keras/tools/__init__.py" in names
  assert not any(n.startswith(("tools/", "tests/", "bench/")) for n in names)
  parser = configparser.ConfigParser()
  parser.read_string(entry_points)
  assert {k: v.replace(" ", "") for k, v in parser["console_scripts"].items()} == \
      declared_commands()
  with open(os.path.join(REPO_ROOT, "LICENSE"), encoding="utf-8") as f:
    assert license_text == f.read()
  assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
  assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
  assert "\nLicense: Apache-2.0\n" in metadata
  assert "Classifier: Topic :: Scientific/Engineering :: Artificial Intelligence" in metadata


def _requirements(extra=None):
  """name -> SpecifierSet of the installed t2t_keras' requirements: the unconditional
  ones, or those of one extra."""
  from importlib import metadata  # pylint: disable=import-outside-toplevel
  from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel
  found = {}
  for line in metadata.requires("t2t_keras"):
    requirement = Requirement(line)
    marker = requirement.marker
    if extra is None and marker is None:
      found[requirement.name] = requirement.specifier
    elif extra is not None and marker is not None and marker.evaluate({"extra": extra}):
      found[requirement.name] = requirement.specifier
  return found


def test_tensorflow_is_an_extra_so_a_tpu_vm_keeps_its_own():
  """A Cloud TPU VM's TensorFlow is the `tensorflow-tpu` distribution: a plain
  requirement on `tensorflow` (or on packages whose own requirements name it) would
  install a CPU-only TensorFlow over it. Both supported lines, 2.20 (the newest
  tensorflow-tpu) and 2.21, must satisfy each extra."""
  base = _requirements()
  assert not {"tensorflow", "tensorflow-text", "tensorflow-serving-api",
              "tensorflow-cpu", "tensorflow-tpu"} & set(base), base
  assert {"keras", "sacrebleu", "sentencepiece", "tensorflow-datasets"} <= set(base)
  tensorflow = _requirements("tensorflow")
  assert set(tensorflow) == {"tensorflow", "tensorflow-text", "tensorflow-serving-api"}
  tpu = _requirements("tpu")
  assert set(tpu) == {"tensorflow-tpu"}
  for specifiers in list(tensorflow.values()) + list(tpu.values()):
    for version in ("2.20.0", "2.20.1", "2.21.0", "2.21.1"):
      assert specifiers.contains(version), (specifiers, version)
    assert not specifiers.contains("2.22.0") and not specifiers.contains("2.19.1")
  assert not {"tensorflow", "tensorflow-text", "tensorflow-serving-api"} & set(
      _requirements("test")), "the test extra must install on a TPU VM's TensorFlow"


def test_a_command_without_tensorflow_says_how_to_install_it(monkeypatch):
  """The package imports without TensorFlow (tests/layering_test.py); a command's first
  step, `console.quiet_tensorflow()`, says how to install it."""
  from t2t_keras import console  # pylint: disable=import-outside-toplevel
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "tensorflow" else real(name, *a))
  with pytest.raises(ImportError, match=r"pip install 't2t_keras\[tensorflow\]'.*Cloud TPU"):
    console.quiet_tensorflow(["t2t-train"])


def test_a_tensorflow_text_of_another_line_is_named_with_the_fix(monkeypatch):
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.tokens import tokenizer  # pylint: disable=import-outside-toplevel
  line = ".".join(tf.__version__.split(".")[:2])
  fake = type(sys)("tensorflow_text")
  fake.__version__ = "2.19.0"
  monkeypatch.setitem(sys.modules, "tensorflow_text", fake)
  with pytest.raises(ImportError, match=(
      rf"tensorflow-text 2\.19\.0 was built for another TensorFlow.*"
      rf"pip install 'tensorflow-text=={line}\.\*'.*--no-deps")):
    tokenizer._import_tensorflow_text()  # pylint: disable=protected-access
  monkeypatch.setitem(sys.modules, "tensorflow_text", None)  # not installed
  with pytest.raises(ImportError, match=r"tensorflow-text is not installed: install"):
    tokenizer._import_tensorflow_text()  # pylint: disable=protected-access
  monkeypatch.delitem(sys.modules, "tensorflow_text")
  assert tokenizer._import_tensorflow_text().__version__.startswith(line + ".")  # pylint: disable=protected-access
