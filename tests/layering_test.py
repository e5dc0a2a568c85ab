"""How the package's modules import each other (CONTRIBUTING.md's "Map of the package").

The bottom layer imports without TensorFlow; library modules import the package's own
modules at the top (a command may make one deferred import after its flags are
checked); and no two modules import each other, lazily or not. The import graph is read
with `ast`, so a lazy import counts as much as one at the top.
"""

import ast
import os
import subprocess
import sys
import textwrap

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = os.path.join(REPO_ROOT, "t2t_keras")

# The modules under everything else: settings, errors, the terminal, text files, scores,
# trees. Whatever imports TensorFlow builds on them, never the other way round.
TENSORFLOW_FREE = ("t2t_keras", "t2t_keras.configs", "t2t_keras.errors", "t2t_keras.console",
                   "t2t_keras.textio", "t2t_keras.metrics", "t2t_keras.parsing.trees",
                   "t2t_keras.parsing.evalb")

# issue 66's bound on imports of the package's own modules inside functions, over the
# whole package: the commands' deferred imports after their flags are checked.
MAX_IN_FUNCTION = 12


def _modules() -> dict:
  """{dotted module name: path} of every module of the package."""
  found = {}
  for folder, _, files in os.walk(PACKAGE_DIR):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".")
        found[dotted[:-len(".__init__")] if dotted.endswith(".__init__") else dotted] = path
  return found


def _own_module(name: str, modules) -> str | None:
  """The package's module a dotted name is (or is in): its longest prefix that is one."""
  parts = name.split(".")
  while parts and ".".join(parts) not in modules:
    parts.pop()
  return ".".join(parts) or None


def _imports(module: str, path: str, modules) -> list:
  """[(imported module of the package, line, inside a function)] of one module."""
  is_package = path.endswith("__init__.py")
  found = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      inside = in_function or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
      names = []
      if isinstance(child, ast.Import):
        names = [alias.name for alias in child.names]
      elif isinstance(child, ast.ImportFrom):
        base = child.module or ""
        if child.level:
          package = module.split(".")[:None if is_package else -1]
          package = package[:len(package) - child.level + 1]
          base = ".".join(package + ([base] if base else []))
        # `from a import b`: the module a.b if there is one, else a.
        names = [f"{base}.{alias.name}" for alias in child.names]
      for name in names:
        if name.split(".")[0] == "t2t_keras":
          target = _own_module(name, modules)
          if target and target != module:
            found.append((target, child.lineno, inside))
      visit(child, inside)

  visit(ast.parse(open(path, encoding="utf-8").read()), False)
  return found


def _cycles(graph) -> list:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, components = {}, {}, [], set(), []

  def connect(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for target in graph.get(node, ()):
      if target not in index:
        connect(target)
        low[node] = min(low[node], low[target])
      elif target in on_stack:
        low[node] = min(low[node], index[target])
    if low[node] == index[node]:
      component = []
      while True:
        top = stack.pop()
        on_stack.discard(top)
        component.append(top)
        if top == node:
          break
      if len(component) > 1:
        components.append(sorted(component))

  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(max(limit, 10000))
  try:
    for node in sorted(graph):
      if node not in index:
        connect(node)
  finally:
    sys.setrecursionlimit(limit)
  return components


def test_own_modules_are_imported_at_the_top_and_import_no_cycle():
  modules = _modules()
  graph, in_function = {}, []
  for module, path in modules.items():
    for target, line, inside in _imports(module, path, modules):
      graph.setdefault(module, set()).add(target)
      if inside:
        in_function.append(f"{module}:{line} imports {target}")
  assert not _cycles(graph), f"import cycles (lazy imports counted): {_cycles(graph)}"
  assert len(in_function) <= MAX_IN_FUNCTION, (
      f"{len(in_function)} imports of the package's own modules inside functions "
      f"(at most {MAX_IN_FUNCTION}: a library module imports at the top, a command "
      "makes one deferred import after its flags are checked):\n" + "\n".join(in_function))


def test_the_graph_reader_sees_lazy_imports_and_cycles(tmp_path):
  """The reader itself: a lazy import is an edge and is counted; a cycle through one
  is found."""
  modules = {"t2t_keras.a": "a.py", "t2t_keras.b": "b.py", "t2t_keras.c": "c.py"}
  source = textwrap.dedent("""\
      from t2t_keras import b
      def f():
        from t2t_keras.c import thing
        import t2t_keras.b
      """)
  probe = tmp_path / "a.py"
  probe.write_text(source, encoding="utf-8")
  found = _imports("t2t_keras.a", str(probe), modules)
  assert found == [("t2t_keras.b", 1, False), ("t2t_keras.c", 3, True),
                   ("t2t_keras.b", 4, True)]
  assert _cycles({"t2t_keras.a": {"t2t_keras.c"}, "t2t_keras.c": {"t2t_keras.a"}}) == [
      ["t2t_keras.a", "t2t_keras.c"]]
  assert not _cycles({"t2t_keras.a": {"t2t_keras.b", "t2t_keras.c"},
                      "t2t_keras.c": {"t2t_keras.b"}})


@pytest.mark.slow  # a fresh interpreter: this one has imported TensorFlow already
def test_the_bottom_layer_imports_without_tensorflow():
  """In a process where `import tensorflow` fails, the bottom layer (and evaluate, which
  builds on it alone) imports, imports no TensorFlow, and a command's first step says
  how to install it.

  A fresh interpreter, because re-importing the package's modules in this process
  (where TensorFlow and the package are loaded) would make second copies of their
  classes beside the ones other tests hold.
  """
  probe = textwrap.dedent(f"""\
      import importlib, sys
      sys.modules["tensorflow"] = None  # `import tensorflow` raises ModuleNotFoundError
      for name in {TENSORFLOW_FREE!r}:
        importlib.import_module(name)
      import t2t_keras.evaluate  # a command on local files needs no TensorFlow either
      loaded = sorted(m for m in sys.modules
                      if m.split(".")[0] in ("tensorflow", "keras") and sys.modules[m])
      assert not loaded, loaded
      from t2t_keras import console
      try:
        console.quiet_tensorflow(["t2t-train"])
      except ImportError as error:
        print("quiet_tensorflow:", error)
      print("imported without TensorFlow")
      """)
  result = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300, check=False,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "imported without TensorFlow" in result.stdout
  assert "pip install 't2t_keras[tensorflow]'" in result.stdout, result.stdout
