"""Exports that appear whole or not at all, on local disk and on object stores.

Readers of an export open it by name: TensorFlow Serving polls the model base path and
loads the highest directory whose name is an integer; `ctranslate2.Translator` and
our own loaders open a directory and read `saved_model.pb` / `model.bin` first. None of
them may find half an export.

Every export is first written whole under a hidden sibling, `<parent>/.tmp-<name>`
(not an integer, so TF Serving ignores it), then made visible under its final name:

- Local disk: one `rename` of the directory, atomic on POSIX file systems: the final
  name appears complete or not at all.
- Object stores (gs://, s3://, and TensorFlow's in-memory `ram://`, which the tests use
  for them): there are no directories and no atomic rename, only objects, each of
  which appears whole when its upload completes; renaming a "directory" copies its
  objects one by one in an order we do not choose. So the files are copied here one by
  one with the *marker* last: the file a reader opens first (`saved_model.pb`,
  `model.bin`), without which nothing loads. Whoever finds the marker finds every other
  file. TF Serving may notice the version directory during the copy, before the
  marker; its load then fails ("SavedModel not found") and is retried
  (the server's max_num_load_retries, tensorflow/serving#631), which is the safe failure: the
  reverse order (saved_model.pb before the variables) loads and then fails requests
  (tensorflow/serving#1086).

Leftovers of a crash are handled by name: a `.tmp-<name>` is only ever ours and never
read, so the next export of that name removes it (and says so) instead of writing into
it; a final directory without its marker (a crash during the copy to an object store)
is refused with a message saying to remove it.
"""

from __future__ import annotations

import os
import sys
from typing import List

import tensorflow as tf

TMP_PREFIX = ".tmp-"


def is_local(path: str) -> bool:
  """Whether `path` is on a local file system (atomic directory rename)."""
  return "://" not in path or path.startswith("file://")


def temp_path(final: str) -> str:
  """The hidden sibling an export of `final` is written to."""
  parent, name = os.path.split(final.rstrip("/"))
  if parent.endswith(":"):  # at the root of a file system ("ram://x": split gives "ram:")
    parent += "//"
  return os.path.join(parent, TMP_PREFIX + name)


def _files(root: str) -> List[str]:
  """Paths of the files under `root`, relative to it."""
  files = []
  for directory, _, names in tf.io.gfile.walk(root):
    relative = directory[len(root):].lstrip("/")
    files.extend(os.path.join(relative, n) if relative else n for n in names)
  # Some file systems list by name prefix (ram:// shows `assets.extra/x` under `assets`
  # as `.extra/x`): keep only files that are there.
  return sorted(f for f in set(files) if tf.io.gfile.exists(os.path.join(root, f))
                and not tf.io.gfile.isdir(os.path.join(root, f)))


def remove_tree(root: str) -> None:
  """Removes `root` and everything under it (file by file first: see `_files`)."""
  for relative in _files(root):
    tf.io.gfile.remove(os.path.join(root, relative))
  try:
    tf.io.gfile.rmtree(root)
  except tf.errors.NotFoundError:  # an object store's listing of names already gone
    pass


def is_empty(path: str) -> bool:
  return tf.io.gfile.isdir(path) and not tf.io.gfile.listdir(path)


def prepare(final: str, marker: str, what: str, allow_empty: bool = False) -> str:
  """Checks that `final` is free and returns the clean temporary path to write to.

  Args:
    final: the export's final directory.
    marker: the file a reader opens first (written last on object stores).
    what: how to fix a taken `final`, for the message (e.g. "pass another
      --export_version or remove it").
    allow_empty: an existing empty `final` is fine (it is replaced).

  Raises:
    FileExistsError: `final` exists (naming it; an interrupted export when it lacks
      the marker).
  """
  if tf.io.gfile.exists(final) and not (allow_empty and is_empty(final)):
    if not tf.io.gfile.exists(os.path.join(final, marker)):
      raise FileExistsError(
          f"{final} exists but has no {marker}: it is what an interrupted export left "
          "(no reader loads it). Remove it and export again.")
    raise FileExistsError(f"{final} exists; {what}.")
  tmp = temp_path(final)
  if tf.io.gfile.exists(tmp):
    print(f"removing {tmp}: left by an interrupted export (never read by anyone)",
          file=sys.stderr, flush=True)
    remove_tree(tmp)
  return tmp


def publish(tmp: str, final: str, marker: str) -> str:
  """Makes the complete export in `tmp` visible as `final` (see the module docstring)."""
  final = final.rstrip("/")
  if is_local(final):
    if is_empty(final):
      tf.io.gfile.rmtree(final)  # empty
    tf.io.gfile.rename(tmp, final)
    return final
  files = _files(tmp)
  if marker not in files:
    raise FileNotFoundError(f"{tmp} has no {marker}: the export was not written whole")
  for relative in [f for f in files if f != marker] + [marker]:
    target = os.path.join(final, relative)
    tf.io.gfile.makedirs(os.path.dirname(target))
    tf.io.gfile.copy(os.path.join(tmp, relative), target, overwrite=True)
  remove_tree(tmp)
  return final
