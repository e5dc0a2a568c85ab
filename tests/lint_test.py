"""The tree passes `ruff check` with the repository's ruff.toml (pyflakes and
pycodestyle at 100 columns): unused imports, undefined names and shadowed definitions
fail here rather than in review."""

import os
import shutil
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff():
  beside = os.path.join(os.path.dirname(sys.executable), "ruff")
  return beside if os.path.exists(beside) else shutil.which("ruff")


def test_ruff_finds_nothing():
  ruff = _ruff()
  if ruff is None:
    pytest.fail("ruff is not installed: pip install -e '.[test]' installs it")
  result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
