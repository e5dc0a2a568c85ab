"""Downloads that a later run can trust: checksums, atomic writes, progress, mirrors.

`t2t-datagen` (t2t_keras/tools/datagen.py) fetches the public corpora the recipes read
(t2t_keras/data/fetch/public_corpora.py). Every file it writes obeys one rule: a file exists
under its final name only once it is complete and checked. Bytes go to a temporary name
beside the target (`.<name>.tmp-<random>`) and are renamed over it at the end, so a
killed process, a dropped connection or a full disk leaves at most a temporary file,
which no run reads and the next run of the same download removes. A body shorter than
the server's Content-Length is refused: urllib returns a short read at a closed
connection without raising, so the count is checked here.

Checksums: SHA-256 where the expected digest is known (the prepared files, whose digests
this project records), MD5 where the only published digest is MD5 (sacreBLEU's table of
test-set tarballs). A mismatch names the file, its URL, both digests and what to do.

Mirrors: `mirrored(url, mirror)` maps `https://host/path` to `<mirror>/host/path`, the
layout `wget --force-directories` writes, so one base URL serves files of several hosts
(a local mirror on a machine without internet, or a test's loopback server).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Iterable, Optional

from t2t_keras.errors import DataError

_CHUNK = 1 << 16
TIMEOUT_SECONDS = 60  # a stalled server fails the download instead of hanging it


class ChecksumError(DataError):
  """A downloaded or prepared file whose digest is not the expected one."""


def mirrored(url: str, mirror: Optional[str]) -> str:
  """`url` fetched through `mirror` (`<mirror>/<host>/<path>`), or `url` itself."""
  if not mirror:
    return url
  parts = urllib.parse.urlsplit(url)
  return f"{mirror.rstrip('/')}/{parts.netloc}{parts.path}"


def digest(path: str, algorithm: str = "sha256") -> str:
  """The hex digest of a file's bytes."""
  h = hashlib.new(algorithm)
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _size(n: float) -> str:
  for unit in ("B", "KB", "MB", "GB"):
    if n < 1000 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1000
  raise AssertionError("unreachable")


class DownloadProgress:
  """Progress lines on stderr, at most one a second: bytes, percent, rate and ETA
  (percent and ETA only when the server sent the size)."""

  def __init__(self, name: str, total: Optional[int], stream=None, every: float = 1.0):
    self.name, self.total, self.every = name, total, every
    self.stream = stream or sys.stderr
    self.start = self.last = time.monotonic()
    self.done = 0

  def update(self, n: int) -> None:
    self.done += n
    if time.monotonic() - self.last >= self.every:
      self.report()

  def report(self) -> None:
    now = self.last = time.monotonic()
    rate = self.done / max(now - self.start, 1e-6)
    line = f"{self.name}: {_size(self.done)}"
    if self.total:
      eta = (self.total - self.done) / rate if rate > 0 else float("inf")
      line += (f" of {_size(self.total)} ({100 * self.done / self.total:.0f}%), "
               f"{_size(rate)}/s, ETA {eta:.0f}s")
    else:
      line += f", {_size(rate)}/s"
    print(line, file=self.stream, flush=True)


def remove_temporaries(path: str) -> None:
  """Removes what interrupted writes of `path` left (`.<name>.tmp-*` beside it)."""
  folder, name = os.path.split(path)
  if os.path.isdir(folder or "."):
    for entry in os.listdir(folder or "."):
      if entry.startswith(f".{name}.tmp-"):
        os.remove(os.path.join(folder, entry))


def write_atomically(path: str, chunks: Iterable[bytes],
                     check: Optional[Callable[[str], None]] = None) -> None:
  """Writes `chunks` to a temporary file beside `path`, runs `check(temporary path)`
  (which raises to refuse it), then renames it to `path`; on any error the temporary
  file is removed and `path` is left as it was."""
  folder, name = os.path.split(path)
  os.makedirs(folder or ".", exist_ok=True)
  remove_temporaries(path)
  fd, temporary = tempfile.mkstemp(prefix=f".{name}.tmp-", dir=folder or ".")
  try:
    with os.fdopen(fd, "wb") as f:
      for chunk in chunks:
        f.write(chunk)
    if check is not None:
      check(temporary)
    # mkstemp creates the file private (0600); the data is not: the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise


def check_digest(path: str, expected: Optional[str], what: str, source: str,
                 algorithm: str = "sha256", remedy: str = "") -> None:
  """Raises ChecksumError naming `what` (the file's name for the user), `source`
  (where it came from), both digests and `remedy`, unless `path` has the digest."""
  if expected is None:
    return
  actual = digest(path, algorithm)
  if actual != expected:
    raise ChecksumError(
        f"{what} (from {source}) has {algorithm.upper()} {actual}, expected {expected}: "
        "the download was corrupted, or the upstream file changed. It was not kept. "
        + (remedy or "Run the command again; if it fails the same way, the upstream "
           "file changed: please report it."))


def _response_chunks(response, url: str, progress: DownloadProgress):
  expected = progress.total
  for chunk in iter(lambda: response.read(_CHUNK), b""):
    progress.update(len(chunk))
    yield chunk
  progress.report()
  if expected is not None and progress.done != expected:
    raise DataError(f"The download of {url} stopped after {progress.done} of {expected} "
                    "bytes (the connection closed early); nothing was kept. Run the "
                    "command again.")


def download(url: str, path: str, *, sha256: Optional[str] = None,
             md5: Optional[str] = None, stream=None) -> str:
  """Downloads `url` to `path` unless `path` exists; returns `path`.

  A file that exists under `path` was complete and checked when it was renamed there
  (`write_atomically`), so it is reused without a new download; with a digest given it
  is checked again, and a file that fails is removed and downloaded again.

  Args:
    url: what to fetch (http, https or file).
    path: where the file goes.
    sha256: its expected SHA-256 (hex), if known.
    md5: its expected MD5, where only that is published.
    stream: where progress lines go (default: stderr).

  Raises:
    DataError: the server cannot be reached or answers with an error, or the body is
      shorter than announced; ChecksumError: the bytes are not the expected ones.
  """
  name = os.path.basename(path)
  expected = [(sha256, "sha256"), (md5, "md5")]
  if os.path.exists(path):
    if all(value is None or digest(path, algo) == value for value, algo in expected):
      return path
    print(f"{path} does not have the expected checksum: downloading it again.",
          file=stream or sys.stderr)
    os.remove(path)

  def check(temporary):
    for value, algorithm in expected:
      check_digest(temporary, value, name, url, algorithm)

  print(f"Downloading {url}", file=stream or sys.stderr, flush=True)
  try:
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
      length = response.headers.get("Content-Length")
      progress = DownloadProgress(name, int(length) if length else None, stream)
      write_atomically(path, _response_chunks(response, url, progress), check)
  except urllib.error.HTTPError as error:
    raise DataError(f"{url} answered HTTP {error.code} ({error.reason}). If the file "
                    "moved, or on a machine without internet, download it elsewhere and "
                    "give --mirror (docs/data.md).") from None
  except (urllib.error.URLError, http.client.HTTPException, OSError) as error:
    reason = getattr(error, "reason", None) or error
    raise DataError(f"{url} cannot be downloaded ({reason}). Check the connection and "
                    "run the command again; on a machine without internet, see "
                    "docs/data.md (--mirror).") from None
  return path
