"""The public corpora of the CPU recipes (flags/*.cfg), fetched and prepared into a data
directory: one object per corpus, each owning its upstream location, its preparation and
the SHA-256 of every file it writes.

Layout (each folder as the recipes and docs/results.md read it):
  <data_dir>/multi30k/{train,valid,test2016}.{en,de}     Multi30k task 1
  <data_dir>/wmt14/newstest{2013,2014}.{en,de}           WMT dev and full test set
  <data_dir>/ptb_wsj_sample/{train,dev,test}.mrg          NLTK's Penn Treebank sample
  <data_dir>/tatoeba_deu_eng/{train,valid,test}.{en,de}  from a Tatoeba export you give
  <data_dir>/downloads/<host>/<path>                     the upstream files as fetched

Why the digests are of the PREPARED files: they are the files the published figures
(docs/results.md) were measured on, so they are what must be reproduced; the upstream
files' own digests could not be recorded where this was written (no internet), and for
Multi30k and the treebank none is published. A changed or corrupted upstream file is
therefore caught after preparation: the prepared file is refused (nothing written under
its final name), the download it came from is deleted, and the message names both.
sacreBLEU's table carries MD5s of the WMT tarballs: those are checked on download too.

Tatoeba has no reproducible source: its export (tatoeba.org, manythings.org/anki) grows
every week and keeps no versions, so the pairs behind the published Tatoeba figures
cannot be fetched again. `Tatoeba` prepares a split of the same kind from an export the
user gives, deterministic for a given file, and says its digests so two users can tell
whether they have the same data.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import re
import sys
import zipfile
from typing import Dict, Iterable, List, Optional, Tuple

from t2t_keras.data.fetch import fetch
from t2t_keras.errors import DataError


@dataclasses.dataclass(frozen=True)
class Options:
  """What the datagen command passes down.

  Attributes:
    data_dir: where the corpora go.
    mirror: a base URL serving the upstream files at `<mirror>/<host>/<path>`
      (fetch.mirrored), for machines without internet and for tests; None: upstream.
    tatoeba_file: a Tatoeba export (manythings.org/anki deu-eng.zip, or its deu.txt).
    stream: where progress and messages go (default: stderr).
  """

  data_dir: str
  mirror: Optional[str] = None
  tatoeba_file: Optional[str] = None
  stream: object = None

  def out(self, message: str) -> None:
    print(message, file=self.stream or sys.stderr, flush=True)

  def download(self, url: str, **digests) -> str:
    """Fetches `url` (through the mirror) to downloads/<host>/<path>; returns the path."""
    parts = url.split("://", 1)[1]
    path = os.path.join(self.data_dir, "downloads", *parts.split("/"))
    return fetch.download(fetch.mirrored(url, self.mirror), path, stream=self.stream,
                          **digests)


class Corpus:
  """A corpus: `files` maps each prepared file (relative to the data directory) to its
  SHA-256 (None: not reproducible, see Tatoeba); `prepare` writes them."""

  name = ""
  files: Dict[str, Optional[str]] = {}

  def paths(self, data_dir: str) -> List[str]:
    return [os.path.join(data_dir, name) for name in self.files]

  def is_prepared(self, data_dir: str) -> bool:
    """Every file there with its recorded digest (unrecorded: present)."""
    return all(os.path.exists(os.path.join(data_dir, name))
               and (sha is None or fetch.digest(os.path.join(data_dir, name)) == sha)
               for name, sha in self.files.items())

  def prepare(self, options: Options) -> List[str]:
    """Fetches and prepares the corpus unless it is there; returns the file paths."""
    if self.is_prepared(options.data_dir):
      options.out(f"{self.name}: prepared already in {options.data_dir}, checked.")
    else:
      self._prepare(options)
      options.out(f"{self.name}: prepared in {options.data_dir}: {', '.join(self.files)}"
                  + (", each file's SHA-256 checked." if all(self.files.values()) else "."))
    return self.paths(options.data_dir)

  def _prepare(self, options: Options) -> None:
    raise NotImplementedError

  def _write(self, options: Options, name: str, lines: Iterable[str], source: str,
             downloads: Tuple[str, ...] = ()) -> None:
    """Writes one prepared file atomically, checked against its recorded SHA-256; a
    mismatch deletes `downloads` (what it was made from) so the next run fetches them
    again."""
    def check(temporary):
      try:
        fetch.check_digest(temporary, self.files[name], name, source, remedy=(
            "The download it was prepared from was deleted: run the command again. If "
            "it fails the same way, the upstream file changed and the published figures "
            "(docs/results.md) are not reproducible from it: please report it."))
      except fetch.ChecksumError:
        for path in downloads:
          if os.path.exists(path):
            os.remove(path)
        raise
    encoded = (line.encode("utf-8") for line in lines)
    fetch.write_atomically(os.path.join(options.data_dir, name), encoded, check)


def _split(text: str) -> List[str]:
  """Lines split at newlines only (str.splitlines would also split inside a sentence
  at U+2028, U+0085 or a form feed); a CR before the newline goes."""
  lines = text.split("\n")
  if lines and not lines[-1]:
    lines.pop()
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def _lines(data: bytes) -> List[str]:
  """A text file's lines, each ending in a newline (the last one too)."""
  return [line + "\n" for line in _split(data.decode("utf-8"))]


class Multi30k(Corpus):
  """Multi30k task 1 (Elliott et al. 2016) from its official repository, raw (not
  tokenized, original case): train 29,000, valid 1,014, test2016 1,000 captions."""

  name = "multi30k"
  URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
  SPLITS = {"train": "train", "val": "valid", "test_2016_flickr": "test2016"}
  files = {
      "multi30k/train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
      "multi30k/train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
      "multi30k/valid.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
      "multi30k/valid.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
      "multi30k/test2016.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
      "multi30k/test2016.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
  }

  def _prepare(self, options: Options) -> None:
    for upstream, split in self.SPLITS.items():
      for lang in ("en", "de"):
        url = f"{self.URL}{upstream}.{lang}.gz"
        path = options.download(url)  # no published digest: the output is checked
        try:
          with gzip.open(path, "rb") as f:
            data = f.read()
        except (OSError, EOFError) as error:
          os.remove(path)
          raise DataError(f"{url} is not a valid gzip file ({error}); it was deleted: "
                          "run the command again.") from None
        self._write(options, f"multi30k/{split}.{lang}", _lines(data), url, (path,))


class WMT14Tests(Corpus):
  """The paper's dev and test sets through sacreBLEU's own table: newstest2013 (its
  `wmt13`) and the full 3,003-line newstest2014 (`wmt14/full`; sacreBLEU's `wmt14` is
  a 2,737-line filtered subset the paper did not use), EN-DE.

  The tarball is downloaded here, into the place sacreBLEU caches it, with the MD5 of
  sacreBLEU's table, and extracted by sacreBLEU's own function; its own downloader is
  not used for the transfer: it shows no progress and trusts a partial file left by an
  interrupted run. newstest2014 is sacreBLEU's text (`get_source_file`,
  `get_reference_files`), so `sacrebleu -t wmt14/full` scores against the same lines.
  newstest2013 is the SGML files' segments as written: the published runs' newstest2013
  keeps 12 no-break and thin spaces (U+00A0, U+2009) that sacreBLEU's conversion turns
  into plain spaces. Neither was compared with the real tarballs where this was written
  (no internet): the recorded digests are those of the published runs' files, checked on
  every preparation.
  """

  name = "wmt14"
  # file name: (sacreBLEU test set, keep the segments' own whitespace)
  SETS = {"newstest2013": ("wmt13", True), "newstest2014": ("wmt14/full", False)}
  files = {
      "wmt14/newstest2013.en": "ace268a1d9724ca76f6d8e5c720ffdc08f01bdce45630ed8b269dc7918e1c16e",
      "wmt14/newstest2013.de": "d7ea35ab91ff3709e03ad9cb6bf5b4f2cc775cd2d72efd5254c4aec5e69663ca",
      "wmt14/newstest2014.en": "7294bccf2879a97b3706b95c9595f1459617a8ee7130d5d8581c910e69736971",
      "wmt14/newstest2014.de": "ae5d110486bc33d7175e9e28c7d0051eb3e5fcd2166dd93371089852c091a20e",
  }

  def _prepare(self, options: Options) -> None:
    # pylint: disable=import-outside-toplevel,protected-access
    from sacrebleu import DATASETS
    from sacrebleu.utils import extract_tarball, get_reference_files, get_source_file
    for name, (test_set, as_written) in self.SETS.items():
      dataset = DATASETS[test_set]
      url = dataset.data[0]
      # Where sacreBLEU's maybe_download puts the tarball. It skips a tarball already
      # there, and its extraction with it: so it is extracted here, by its own function.
      tarball = os.path.join(dataset._rawdir, dataset._get_tarball_filename(url))
      fetch.download(fetch.mirrored(url, options.mirror), tarball,
                     md5=dataset.md5[0] if dataset.md5 else None, stream=options.stream)
      try:
        extract_tarball(tarball, dataset._rawdir)
        if as_written:
          texts = [os.path.join(dataset._rawdir, p) for p in dataset.langpairs["en-de"]]
          sides = {"en": _segments(texts[0]), "de": _segments(texts[1])}
        else:
          texts = [get_source_file(test_set, "en-de"),
                   get_reference_files(test_set, "en-de")[0]]
          sides = {"en": _lines(_read(texts[0])), "de": _lines(_read(texts[1]))}
      except Exception as error:  # sacreBLEU raises plain Exceptions
        raise DataError(f"sacreBLEU could not prepare {test_set} from {tarball} "
                        f"({type(error).__name__}: {error}); delete {dataset._outdir} and "
                        "run the command again.") from None
      for lang, lines in sides.items():
        # A mismatch deletes sacreBLEU's text files too: it would reuse them otherwise.
        self._write(options, f"wmt14/{name}.{lang}", lines,
                    f"sacreBLEU {test_set}, {url}", (tarball, *texts))


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def _segments(path: str) -> List[str]:
  """The text of each `<seg ...>...</seg>` line of a WMT SGML file, as written (the
  pattern of sacreBLEU's FakeSGMLDataset, without its whitespace folding)."""
  return [re.sub(r"<seg.*?>(.*)</seg>.*?", r"\1", line).strip() + "\n"
          for line in _split(_read(path).decode("utf-8"))
          if line.startswith("<seg ")]


class PTBSample(Corpus):
  """The ~10% Penn Treebank WSJ sample NLTK distributes (treebank.zip of nltk_data),
  split by file as is usual for it: wsj_0001-0144 train (3,177 trees), 0145-0174 dev
  (392), 0175-0199 test (345); one tree per line, whitespace collapsed, -NONE- elements
  and function tags kept (the parsing source cleans them; t2t_keras/parsing).

  The zip is read with zipfile: NLTK itself is not needed for 199 bracketed files.
  """

  name = "ptb_wsj_sample"
  URL = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/treebank.zip"
  SPLITS = (("train", 1, 144), ("dev", 145, 174), ("test", 175, 199))
  files = {
      "ptb_wsj_sample/train.mrg":
          "c0390c27a17929ff05d0331f94dfd1613681b8a6f101979712587e61896b12c8",
      "ptb_wsj_sample/dev.mrg": "1bb549b0505497d73393a879d5486a54694b01e5334eb633ce39a7dd2ceac643",
      "ptb_wsj_sample/test.mrg": "75c69be10ceaeeccd06c6e2246c6b5329d4b6987c38e7991f4a27afd7645b0f4",
  }

  def _prepare(self, options: Options) -> None:
    path = options.download(self.URL)
    try:
      with zipfile.ZipFile(path) as archive:
        texts = {n: archive.read(n).decode("utf-8") for n in archive.namelist()
                 if re.fullmatch(r"treebank/combined/wsj_\d{4}\.mrg", n)}
    except (zipfile.BadZipFile, OSError, EOFError) as error:
      os.remove(path)
      raise DataError(f"{self.URL} is not a valid zip file ({error}); it was deleted: "
                      "run the command again.") from None
    for split, first, last in self.SPLITS:
      lines = []
      for number in range(first, last + 1):
        member = f"treebank/combined/wsj_{number:04d}.mrg"
        if member not in texts:
          os.remove(path)
          raise DataError(f"{self.URL} has no {member}; it was deleted: run the command "
                          "again.")
        lines.extend(tree + "\n" for tree in one_line_trees(texts[member]))
      self._write(options, f"ptb_wsj_sample/{split}.mrg", lines, self.URL, (path,))


def one_line_trees(text: str) -> List[str]:
  """Each top-level bracketed tree of a .mrg text on one line: whitespace runs become
  one space and the space the treebank puts before a closing bracket goes, so
  `(NP (NNP Pierre) (NNP Vinken) )` over lines becomes `(NP (NNP Pierre) (NNP Vinken))`."""
  trees, depth, start = [], 0, None
  for i, char in enumerate(text):
    if char == "(":
      if depth == 0:
        start = i
      depth += 1
    elif char == ")":
      depth -= 1
      if depth == 0:
        trees.append(re.sub(r" \)", ")", " ".join(text[start:i + 1].split())))
  return trees


class Tatoeba(Corpus):
  """Tatoeba EN-DE pairs from an export the user gives (--tatoeba_file: the
  manythings.org/anki deu-eng.zip, or its deu.txt: English TAB German TAB attribution).

  Not reproducible byte for byte: the export changes every week and old ones are not
  kept, so the files behind the published Tatoeba figures cannot be fetched again and
  no digest is checked. The split is deterministic for a given export: repeated pairs
  are dropped, pairs are grouped by their English sentence, and a group goes to valid
  or test when a hash of that sentence says so (about 1% each), so every English
  sentence of valid and test is absent from train, whatever the file's order.
  """

  name = "tatoeba_deu_eng"
  files = {f"tatoeba_deu_eng/{split}.{lang}": None
           for split in ("train", "valid", "test") for lang in ("en", "de")}
  HELD_OUT_PER_MILLE = {"valid": (0, 10), "test": (10, 20)}

  def is_prepared(self, data_dir: str) -> bool:
    del data_dir  # no digest to check the files against: a given export is prepared
    return False

  def prepare(self, options: Options) -> List[str]:
    if not options.tatoeba_file and super(Tatoeba, self).is_prepared(options.data_dir):
      options.out(f"{self.name}: in {options.data_dir} already (from an export given "
                  "before; give --tatoeba_file to prepare another).")
      return self.paths(options.data_dir)
    return super().prepare(options)

  def _prepare(self, options: Options) -> None:
    if not options.tatoeba_file:
      raise DataError(
          "tatoeba_deu_eng needs --tatoeba_file: download deu-eng.zip from "
          "https://www.manythings.org/anki/ (CC-BY 2.0, tatoeba.org) and give its path. "
          "The export changes over time: the published Tatoeba figures are not "
          "reproducible byte for byte (docs/data.md).")
    splits = split_tatoeba(_read_tatoeba(options.tatoeba_file))
    for split, pairs in splits.items():
      for column, lang in enumerate(("en", "de")):
        self._write(options, f"tatoeba_deu_eng/{split}.{lang}",
                    (pair[column] + "\n" for pair in pairs), options.tatoeba_file)
    for name in self.files:
      options.out(f"  {name}: SHA-256 {fetch.digest(os.path.join(options.data_dir, name))}")


def _read_tatoeba(path: str) -> List[Tuple[str, str]]:
  try:
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as archive:
        data = archive.read("deu.txt")
    else:
      with open(path, "rb") as f:
        data = f.read()
  except (OSError, KeyError) as error:
    raise DataError(f"--tatoeba_file={path} cannot be read ({error}): give "
                    "manythings.org/anki's deu-eng.zip or its deu.txt.") from None
  pairs = []
  for number, line in enumerate(_split(data.decode("utf-8")), 1):
    fields = line.split("\t")
    if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
      raise DataError(f"--tatoeba_file={path}:{number}: expected English TAB German "
                      f"[TAB attribution], got {line[:80]!r}.")
    pairs.append((fields[0].strip(), fields[1].strip()))
  return pairs


def split_tatoeba(pairs: List[Tuple[str, str]]) -> Dict[str, List[Tuple[str, str]]]:
  """{train, valid, test: pairs}: repeats dropped, held-out by a hash of the English."""
  seen, splits = set(), {"train": [], "valid": [], "test": []}
  for pair in pairs:
    if pair in seen:
      continue
    seen.add(pair)
    bucket = int(hashlib.sha256(pair[0].encode("utf-8")).hexdigest()[:8], 16) % 1000
    split = next((name for name, (low, high) in Tatoeba.HELD_OUT_PER_MILLE.items()
                  if low <= bucket < high), "train")
    splits[split].append(pair)
  return splits


CORPORA: Dict[str, Corpus] = {c.name: c for c in (Multi30k(), WMT14Tests(), PTBSample(),
                                                   Tatoeba())}
# What `t2t-datagen` prepares when no corpus is named: every one it can fetch itself.
DEFAULT = ("multi30k", "wmt14", "ptb_wsj_sample")


def unknown(names: Iterable[str]) -> List[str]:
  return [name for name in names if name not in CORPORA]
