"""Sweeps what killed builds left behind: temporary files and directories no live build
can own.

The tokenized cache and the vocabulary are built under fresh random names (cache:
`<split>-<key>/build-<id>/`, `stats.json.tmp-<id>`; vocabulary: `<file>.tmp-<id>`) and
published at the end, so a reader never sees half a build. A process killed mid-build
leaves its temporary behind, and since the names are random no later run reuses it: on
a corpus the size of WMT that is gigabytes, forever. So each build, as it starts, sweeps
the leftovers of its own kind (the caller says which paths are candidates; this module
only judges their age and removes them, through tf.io.gfile, so gs:// works too).

Why an age rule, and why 24 hours. A live build on another host (a shared gs://
data_dir, several workers tokenizing at once) holds no lock we could check; what it
writes is all that shows it is alive. The longest a live build goes without writing
anything visible is one pass of tokenization: the ids stream into source.bin and
target.bin, which on gs:// appear only when closed at the end of the pass. On a small
CPU host that pass takes tens of minutes for WMT14 EN-DE and hours for the largest WMT
corpus, EN-FR (figures: docs/benchmarks.md, "Measurements behind other code comments").
24 hours without a change is several times that and dwarfs any clock skew between
hosts; waiting costs only a day of disk space. A path whose age cannot be told (a file
system that reports no modification times, such as ram://) or whose newest change is
in the future (skew) is kept. On gs:// directories carry no dates and a file appears
only when closed, so a build killed while tokenizing leaves an empty directory marker
(no bytes, kept); one killed later leaves dated files, and goes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import tensorflow as tf
from absl import logging

ABANDONED_AFTER_SECONDS = 24 * 3600


def _newest_change_and_size(path: str) -> tuple[float | None, int]:
  """(newest modification time in seconds of `path` and everything under it, or None
  when it cannot be told; total bytes).

  Directories that report no time are skipped (gs:// directories are prefixes, never
  dated); a file that reports none (ram://) makes the whole path undated.
  """
  entries = [tf.io.gfile.stat(path)]
  if entries[0].is_directory:
    for directory, subdirs, files in tf.io.gfile.walk(path):
      for name in subdirs + files:
        try:
          entries.append(tf.io.gfile.stat(f"{directory.rstrip('/')}/{name}"))
        except tf.errors.NotFoundError:  # removed meanwhile: a live build, if anything
          return time.time(), 0
  files = [e for e in entries if not e.is_directory]
  if any(e.mtime_nsec <= 0 for e in files):
    return None, 0
  times = [e.mtime_nsec for e in entries if e.mtime_nsec > 0]
  return (max(times) / 1e9 if times else None), sum(e.length for e in files)


def sweep(paths: Iterable[str], what: str,
          max_age_seconds: float = ABANDONED_AFTER_SECONDS,
          now: float | None = None) -> list[str]:
  """Removes each of `paths` (a file or a directory tree) untouched for longer than
  `max_age_seconds`, and logs what went with its size.

  Never fails the build that calls it: a path that vanishes meanwhile (another sweeper)
  or cannot be read is skipped with a warning.

  Args:
    paths: candidates, already known to be temporaries of this kind of build.
    what: what they are, for the log ("tokenized-cache build").
    max_age_seconds: the age after which no live build can own them (module doc).
    now: the current time in seconds (tests).

  Returns:
    The removed paths.
  """
  now = time.time() if now is None else now
  removed = []
  for path in paths:
    try:
      newest, size = _newest_change_and_size(path)
      if newest is None or now - newest <= max_age_seconds:
        continue
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
      continue  # another sweeper was first
    except tf.errors.OpError as error:
      logging.warning("Could not remove the abandoned %s %s: %s", what, path, error)
      continue
    removed.append(path)
    logging.info("Removed the abandoned %s %s (%s, untouched for %.0f hours)", what, path,
                 _megabytes(size), (now - newest) / 3600)
  return removed


def _megabytes(size: int) -> str:
  return f"{size / 1e6:,.1f} MB" if size >= 100_000 else f"{size:,} bytes"
