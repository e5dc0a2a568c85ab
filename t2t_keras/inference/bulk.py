"""Bulk translation: the decode command's input in windows, its outputs appended per
window, resumable after an interruption, and split into shards across hosts.

The decode command reads `--decode_buffer_lines` lines at a time (a window), decodes
them (sorted by length inside the window, `translate.translate`) and appends their
translations, in input order, to its outputs before it reads the next window: memory
is bounded by the window, not the file, and stdin to stdout streams the same way.

Resume. Beside a local `--output_file` a small state file, `.<name>.resume.json`, says
after each window how far the run got: lines done, the byte length of each output, a
sha256 of the input (and `--target_prefix_file`) bytes consumed, and the settings that
decide the output (decoding flags, checkpoints, window, shard). The outputs are
flushed to disk (fsync) before the state is replaced (write + rename), so after any
interruption (SIGTERM, SIGINT, SIGKILL, a crash, a lost VM) the state describes
complete windows only. The same command run again truncates the outputs to the
recorded lengths and continues with the next window: the result is byte for byte the
file an uninterrupted run writes. A run with another input or other settings is
refused, naming what differs (`--nodecode_resume` starts over). A run that completes
removes its state, so running it again decodes it again, as the command always did.

Shards. `--num_shards=N --shard_index=k` decodes the k-th of N contiguous ranges of
the input's lines (sizes differ by at most one line), so `cat` of the N outputs in
shard order is the output of one run over the whole file. Each shard streams and
resumes on its own. Sampling keys are the input's line numbers in the whole file, so
sampled outputs do not depend on the split either.

Object stores (gs://) cannot append to or truncate an object: outputs there are written
whole under a temporary name and renamed at the end (`outputs.PendingOutputs`), as
before, and such a run does not resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

from t2t_keras import console, outputs
from t2t_keras.errors import DataError, InputError
from t2t_keras.textio import decode_line, read_lines

STATE_VERSION = 1
# The inputs whose lines decide the output (--reference_file only scores it): a resume
# checks that their lines done are the same bytes as then.
DECIDING = ("--input_file", "--target_prefix_file")
_CHUNK = 1 << 20  # bytes read at a time


def _gfile():
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  return tf.io.gfile


def is_local(path: str) -> bool:
  """Whether `path` is on local disk (appendable, truncatable), not an object store."""
  return "://" not in path or path.startswith("file://")


def _local(path: str) -> str:
  return path[len("file://"):] if path.startswith("file://") else path


def state_path(output_file: str) -> str:
  """The resume state of `output_file`: `.<name>.resume.json` beside it."""
  directory, name = os.path.split(_local(output_file))
  return os.path.join(directory, f".{name}.resume.json")


def count_lines(path: str, flag: str) -> int:
  """The number of lines of a file as `textio.read_lines` counts them (a last line
  without a newline counts), read in chunks: memory does not grow with the file.

  Raises:
    DataError: the file does not exist.
  """
  if not _gfile().exists(path):
    raise DataError(f"{flag} {path} does not exist.")
  lines, last = 0, b"\n"
  with _gfile().GFile(path, "rb") as f:
    while True:
      chunk = f.read(_CHUNK)
      if not chunk:
        break
      lines += chunk.count(b"\n")
      last = chunk[-1:]
  return lines + (last != b"\n")


def shard_range(total: int, num_shards: int, shard_index: int) -> Tuple[int, int]:
  """Lines [start, end) of shard `shard_index` of `num_shards` over `total` lines:
  contiguous, in order, sizes differing by at most one."""
  return total * shard_index // num_shards, total * (shard_index + 1) // num_shards


class LineReader:
  """The lines of a UTF-8 file (stdin when `path` is None) read forward, a few at a
  time, with the bytes consumed counted and hashed (sha256) for resume checks."""

  def __init__(self, path: Optional[str], flag: str):
    self.path, self.flag = path, flag
    self.name = path or "<stdin>"
    if path is None:
      stream = sys.stdin.buffer
      self._file = None
      # read1: what a pipe has now, not a whole chunk (a producer may be slow).
      self._read = getattr(stream, "read1", stream.read)
    else:
      if not _gfile().exists(path):
        raise DataError(f"{flag} {path} does not exist.")
      self._file = _gfile().GFile(path, "rb")
      self._read = self._file.read
    self._buffer, self._pos, self._eof = b"", 0, False
    self.line = 0  # lines consumed from the start of the file
    self.offset = 0  # bytes consumed
    self.hash = hashlib.sha256()  # of the bytes consumed by `read` (not `skip`)

  def _next_raw(self) -> Optional[bytes]:
    """The next line with its newline (if any), or None at the end."""
    while True:
      end = self._buffer.find(b"\n", self._pos)
      if end >= 0:
        raw = self._buffer[self._pos:end + 1]
        self._pos = end + 1
        return raw
      if self._eof:
        raw = self._buffer[self._pos:]
        self._buffer, self._pos = b"", 0
        return raw or None
      chunk = self._read(_CHUNK)
      if not chunk:
        self._eof = True
      self._buffer = self._buffer[self._pos:] + chunk
      self._pos = 0

  def skip(self, n: int) -> int:
    """Passes over `n` lines (fewer at the end) without decoding or hashing them."""
    done = 0
    while done < n:
      raw = self._next_raw()
      if raw is None:
        break
      self.line += 1
      self.offset += len(raw)
      done += 1
    return done

  def read(self, n: int) -> List[str]:
    """Up to `n` lines (fewer at the end), without line ends.

    Raises:
      DataError: a line is not UTF-8 (naming the flag, the file and the line).
    """
    lines = []
    while len(lines) < n:
      raw = self._next_raw()
      if raw is None:
        break
      self.line += 1
      self.offset += len(raw)
      self.hash.update(raw)
      lines.append(decode_line(raw, self.line, self.flag, self.name, DataError))
    return lines

  def close(self) -> None:
    if self._file is not None:
      self._file.close()


@dataclasses.dataclass
class Window:
  """Consecutive input lines: `first` is the 0-based line number of the first in the
  whole input; `aligned` the lines of each line-aligned file, by flag name."""

  first: int
  sentences: List[str]
  aligned: Dict[str, List[str]]


class Job:
  """What one run of the decode command reads and writes: its windows, shard, outputs
  and resume state.

  Use: `Job(...)` (checks the files and flags, counts lines, reads the state of an
  interrupted run and passes over the lines it did; before the model loads), then
  `check_settings` with what decides the output (once before the model loads, once
  with its checkpoints after), then inside `with job:` `job.open_outputs()`,
  `job.commit(window, texts)` for each window of `job.windows()`, and `job.finish()`
  (leaving the `with` early keeps the complete windows and the state).
  """

  def __init__(self, input_file: Optional[str], aligned: Dict[str, Optional[str]],
               output_file: Optional[str], output_alignments: Optional[str],
               buffer_lines: int, num_shards: int = 1, shard_index: int = 0,
               resume: bool = True, stderr=None):
    """Args:
      input_file: the source file; None = stdin.
      aligned: files line-aligned with the input, by flag ("--target_prefix_file");
        a None path is left out.
      output_file: the translations' file; None = stdout.
      output_alignments: the alignments' file, or None.
      buffer_lines: lines per window.
      num_shards, shard_index: decode the shard_index-th of num_shards ranges.
      resume: continue an interrupted run of the same output (False: start over).
      stderr: where the resume line goes (default sys.stderr).

    Raises:
      InputError: bad shard flags, or a state that does not match this run.
      DataError: a missing file, or line-aligned files of other lengths.
    """
    if buffer_lines < 1:
      raise InputError(f"--decode_buffer_lines={buffer_lines}: give a number of lines "
                       ">= 1 (lines read, sorted and decoded at a time).")
    if num_shards < 1:
      raise InputError(f"--num_shards={num_shards}: give the number of shards (>= 1) the "
                       "input is split into.")
    if not 0 <= shard_index < num_shards:
      raise InputError(f"--shard_index={shard_index} with --num_shards={num_shards}: give "
                       f"0..{num_shards - 1} (this host's shard).")
    if num_shards > 1 and input_file is None:
      raise InputError(f"--num_shards={num_shards} needs --input_file: each shard decodes "
                       "its range of the same file (stdin cannot be split).")
    self.stderr = stderr or sys.stderr
    self.buffer_lines = buffer_lines
    self.shard = (num_shards, shard_index)
    self.output_file, self.output_alignments = output_file, output_alignments
    self.aligned_paths = {flag: path for flag, path in aligned.items() if path}
    self.total: Optional[int] = None  # lines of the whole input, when known
    self.start, self.end = 0, None  # this run's lines [start, end) of the input
    if input_file is not None:
      self.total = count_lines(input_file, "--input_file")
      for flag, path in self.aligned_paths.items():
        lines = count_lines(path, flag)
        if lines != self.total:
          raise DataError(f"{flag} {path} has {lines} lines but --input_file "
                          f"{input_file} has {self.total}: they must be line-aligned.")
      self.start, self.end = shard_range(self.total, num_shards, shard_index)
    self.input = LineReader(input_file, "--input_file")
    self.readers = {flag: LineReader(path, flag) for flag, path in self.aligned_paths.items()}
    for reader in (self.input, *self.readers.values()):
      reader.skip(self.start)
    self.resumable = bool(output_file) and all(
        is_local(p) for p in (output_file, output_alignments) if p)
    self.state_file = state_path(output_file) if self.resumable else None
    self.state: Optional[dict] = None  # the interrupted run's, once matched
    self.done = 0  # lines of this run's range already in the outputs
    self.settings: dict = {}
    self._first: Optional[Window] = None  # read ahead (stdin: to size the run)
    self._files: Dict[str, object] = {}
    self._pending: Optional[outputs.PendingOutputs] = None
    if self.resumable and os.path.exists(self.state_file):
      if resume:
        self._resume()
      else:
        os.remove(self.state_file)
    if self.end is None:  # stdin: the first window says whether there is more
      self._first = self._read_window()
      if len(self._first.sentences) < self.buffer_lines:
        self.end = self.done + len(self._first.sentences)

  # ---------------------------------------------------------------- sizing the run
  @property
  def lines(self) -> Optional[int]:
    """This run's lines (the shard's, or all), when known."""
    return None if self.end is None else self.end - self.start

  def sentences_for_choices(self) -> int:
    """The number of sentences the batching and XLA choices see: the whole input's
    (a shard then decodes as the unsharded run does), or stdin's first window."""
    if self.total is not None:
      return self.total
    return self.lines if self.lines is not None else self.buffer_lines

  def count_text(self):
    """This run's sentence count for the "decoding N sentences" line ("10000+" on a
    stdin longer than a window)."""
    return self.lines if self.lines is not None else f"{self.buffer_lines}+"

  # ---------------------------------------------------------------------- resume
  def _describe_output(self) -> str:
    return (f"--output_file={self.output_file} (resume state {self.state_file}: "
            f"{self.state['lines_done']} lines done)")

  def _resume(self) -> None:
    """Reads the state of an interrupted run and passes over the lines it did,
    checking that they are the same bytes as then."""
    with open(self.state_file, encoding="utf-8") as f:
      state = json.load(f)
    self.state = state
    what = self._describe_output()
    advice = ("rerun with its input and settings to continue, or add --nodecode_resume "
              "to start the output over.")
    if state.get("version") != STATE_VERSION:
      raise InputError(f"{what}: a state of another version of this command; {advice}")
    paths = {"--input_file": self.input.path, **self.aligned_paths}
    for key in DECIDING:  # given then and now, or neither; the same file
      then = state["inputs"].get(key, {}).get("path")
      now = outputs.normalized(paths[key]) if paths.get(key) else None
      if then != now:
        raise InputError(f"{what} was decoded with {key}={then or '<not given>'}, not "
                         f"{now or '<not given>'}; {advice}")
    for name, (flag, path) in {"output": ("--output_file", self.output_file),
                               "alignments": ("--output_alignments",
                                              self.output_alignments)}.items():
      then = state["outputs"].get(name)
      if (then is None) != (path is None):
        raise InputError(f"{what} was decoded {'with' if then else 'without'} {flag}; "
                         f"{advice}")
      if path and then["path"] != outputs.normalized(_local(path)):
        raise InputError(f"{what} was decoded with {flag}={then['path']}, not {path}; "
                         f"{advice}")
      if path and (not os.path.exists(_local(path))
                   or os.path.getsize(_local(path)) < then["bytes"]):
        raise InputError(f"{what}: {flag}={path} is missing or shorter than the "
                         f"{then['bytes']} bytes written: it was changed since; add "
                         "--nodecode_resume to start it over.")
    if state["shard"] != list(self.shard):
      raise InputError(f"{what} was shard {state['shard'][1]} of {state['shard'][0]} "
                       f"(--shard_index, --num_shards), not {self.shard[1]} of "
                       f"{self.shard[0]}; {advice}")
    if state["buffer_lines"] != self.buffer_lines:
      raise InputError(f"{what} was decoded with --decode_buffer_lines="
                       f"{state['buffer_lines']}, not {self.buffer_lines} (windows decide "
                       f"the batches); {advice}")
    done = state["lines_done"]
    for key, reader in [("--input_file", self.input), *self.readers.items()]:
      while reader.line - self.start < done:
        got = len(reader.read(min(self.buffer_lines, done - (reader.line - self.start))))
        if not got:
          break
      if key not in DECIDING:
        continue
      if (reader.line - self.start != done
          or reader.hash.hexdigest() != state["inputs"][key]["sha256"]):
        raise InputError(f"{what}: the first {done} lines of {key} {reader.name} are not "
                         f"those it was decoded from (they changed since); {advice}")
    self.done = done

  def check_settings(self, settings: dict) -> None:
    """Records the settings that decide the output; refuses those that differ from
    the interrupted run's (only keys both have: call it again as more are known).

    Raises:
      InputError: naming each setting that differs, then and now.
    """
    settings = json.loads(json.dumps(settings))  # as the state file holds them
    self.settings.update(settings)
    if self.state is None:
      return
    then = self.state["settings"]
    differ = [f"{key} {then[key]!r} then, {value!r} now" for key, value in settings.items()
              if key in then and then[key] != value]
    if differ:
      raise InputError(f"{self._describe_output()} was decoded with other settings: "
                       f"{'; '.join(differ)}. Rerun with its settings to continue, or add "
                       "--nodecode_resume to start the output over.")

  def _write_state(self) -> None:
    inputs = {key: {"path": outputs.normalized(reader.path) if reader.path else None,
                    "sha256": reader.hash.hexdigest()}
              for key, reader in [("--input_file", self.input), *self.readers.items()]
              if key in DECIDING}
    files = {"output": self._files.get("output"), "alignments": self._files.get("alignments")}
    state = {"version": STATE_VERSION, "lines_done": self.done,
             "inputs": inputs, "shard": list(self.shard), "buffer_lines": self.buffer_lines,
             "outputs": {name: {"path": outputs.normalized(f.name), "bytes": f.tell()}
                         for name, f in files.items() if f is not None},
             "settings": self.settings}
    temporary = f"{self.state_file}.tmp"  # one writer per output: one name
    with open(temporary, "w", encoding="utf-8") as f:
      json.dump(state, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, self.state_file)

  # ------------------------------------------------------------- reading, writing
  def _read_window(self) -> Window:
    first = self.input.line  # lines before it in the whole input
    want = self.buffer_lines
    if self.end is not None:
      want = min(want, self.end - self.input.line)
    sentences = self.input.read(want)
    aligned = {}
    for flag, reader in self.readers.items():
      aligned[flag] = reader.read(len(sentences))
      if len(aligned[flag]) != len(sentences):  # stdin: counted as it goes
        raise DataError(f"{flag} {reader.name} has {reader.line} lines but --input_file "
                        f"{self.input.name} has more: they must be line-aligned.")
    return Window(first, sentences, aligned)

  def windows(self) -> Iterator[Window]:
    """The windows of this run's lines after those already done, in order."""
    while True:
      window, self._first = self._first or self._read_window(), None
      if not window.sentences:
        for flag, reader in self.readers.items():
          if self.end is None and reader.read(1):
            raise DataError(f"{flag} {reader.name} has more lines than --input_file "
                            f"{self.input.name} ({self.input.line}): they must be "
                            "line-aligned.")
        return
      yield window

  def open_outputs(self) -> "Job":
    """Opens the outputs: a resumed run's truncated to the lengths of its complete
    windows, a new run's emptied (a state with no line done first, so a run killed
    now resumes from the start)."""
    if self.resumable:
      for name, path in (("output", self.output_file),
                         ("alignments", self.output_alignments)):
        if not path:
          continue
        if self.state is not None:
          handle = open(_local(path), "r+b")  # pylint: disable=consider-using-with
          handle.truncate(self.state["outputs"][name]["bytes"])
          handle.seek(0, os.SEEK_END)
        else:
          handle = open(_local(path), "wb")  # pylint: disable=consider-using-with
        self._files[name] = handle
      if self.state is not None:
        lines = self.lines if self.lines is not None else "?"
        print(f"resuming {self.output_file} after {self.done} of {lines} lines (state "
              f"{self.state_file}; --nodecode_resume starts over)", file=self.stderr,
              flush=True)
      self._write_state()
    else:
      self._pending = outputs.PendingOutputs()
      if self.output_file:
        self._files["output"] = self._pending.open(self.output_file)
      if self.output_alignments:
        self._files["alignments"] = self._pending.open(self.output_alignments)
    return self

  def commit(self, window: Window, texts: Dict[str, str]) -> None:
    """Appends a window's text to each output ("output", "alignments") and records
    it as done (local outputs: on disk before the state says so)."""
    for name, text in texts.items():
      handle = self._files.get(name)
      if handle is None:  # no --output_file: stdout
        sys.stdout.write(text)
        sys.stdout.flush()
      elif self.resumable:
        handle.write(text.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())
      else:
        handle.write(text)
    self.done += len(window.sentences)
    if self.resumable:
      self._write_state()

  def finish(self) -> None:
    """Closes the outputs after the last window; removes the state (the run is
    complete: running it again decodes it again) or renames the temporaries."""
    if self._pending is not None:
      self._pending.commit()
      self._pending = None
    for handle in self._files.values():
      handle.close()
    self._files = {}
    if self.resumable and os.path.exists(self.state_file):
      os.remove(self.state_file)

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    """Closes what is open: local outputs keep their complete windows (the state says
    which); temporaries of object-store outputs are removed."""
    if self._pending is not None:
      self._pending.discard()
      self._pending = None
    for handle in self._files.values():
      handle.close()
    self._files = {}
    for reader in (self.input, *self.readers.values()):
      reader.close()


# ------------------------------------------------------------------- the decoding loop
@dataclasses.dataclass
class Decoded:
  """What `decode` reports: inputs cut to --max_input_length and decoded (this run's),
  and with --reference_file the best translations and references of the whole range
  (a resumed run's earlier ones read back)."""

  cut: int = 0
  count: int = 0
  best: list = dataclasses.field(default_factory=list)
  references: list = dataclasses.field(default_factory=list)


def decode(job: Job, translator, multiple: bool, attention=(-1, -1)) -> Decoded:
  """Decodes `job`'s windows in order with `translator` (`translator.Translator`), each
  appended to the outputs when done (interrupted: the complete windows stay, and the
  state to resume them). `multiple`: every beam or sample is written, as
  `score<TAB>text` lines, an empty line after each input's; `attention`: the (decoder
  layer, head) of --output_alignments."""
  meter = console.Progress(job.lines, done=job.done,
                           where=translator.where() if len(translator.devices) > 1 else "")
  references = job.aligned_paths.get("--reference_file")
  done = Decoded()
  with job:
    job.open_outputs()
    for window in job.windows():
      results = translator.translations(
          window.sentences, target_prefixes=window.aligned.get("--target_prefix_file"),
          progress=meter, first_key=window.first)
      _write_outputs(job, window, results, multiple, translator, attention)
      done.cut += sum(r.truncated for r in results)
      done.count += len(results)
      if references:
        done.best += [r.texts[0] for r in results]
        done.references += window.aligned["--reference_file"]
    job.finish()
  if references and job.done > done.count:  # resumed: read the earlier back
    best, earlier = _earlier_translations(job, job.done - done.count, multiple, references)
    done.best, done.references = best + done.best, earlier + done.references
  return done


def _write_outputs(job: Job, window: Window, results, multiple: bool, translator,
                   attention) -> None:
  """One window's translations (and --output_alignments), appended to the outputs
  (`Job.commit`)."""
  out = io.StringIO()
  for result in results:
    if multiple:
      for text, score in zip(result.texts, result.scores):
        out.write(f"{score:.4f}\t{text}\n")
      out.write("\n")
    else:
      out.write(result.texts[0] + "\n")
  texts = {"output": out.getvalue()}
  if job.output_alignments:
    texts["alignments"] = "".join(
        line + "\n" for line in translator.alignments(results, multiple, attention))
  job.commit(window, texts)


def _earlier_translations(job: Job, lines: int, multiple: bool, reference_file: str) -> tuple:
  """The best translations of a resumed run's first `lines` lines, read back from
  --output_file, and their --reference_file lines (for BLEU over the whole run)."""
  written = read_lines(job.output_file, "--output_file", DataError)
  if multiple:  # blocks of "score<TAB>text" lines, each ended by an empty line
    starts = [0] + [i + 1 for i, line in enumerate(written) if not line]
    written = [written[i].split("\t", 1)[1] for i in starts[:lines]]
  reader = LineReader(reference_file, "--reference_file")
  reader.skip(job.start)
  references = reader.read(lines)
  reader.close()
  return written[:lines], references
