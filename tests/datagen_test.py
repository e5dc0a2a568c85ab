"""t2t-datagen fetches, checks and prepares the recipes' corpora through its real code,
from a loopback HTTP server that serves the upstream files at the upstream paths (built
here from ../shared/data, compressed and packed as upstream has them)."""

import gzip
import hashlib
import http.server
import io
import os
import re
import tarfile
import threading
import zipfile

import pytest

from t2t_keras.data.fetch import public_corpora
from tests import inprocess
from tests.conftest import REPO_ROOT, SHARED_DATA, flagfile_values

M30K = "/raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
TREEBANK = "/raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/treebank.zip"


class _Handler(http.server.BaseHTTPRequestHandler):
  def do_GET(self):  # noqa: N802 (http.server's name)
    body = self.server.files.get(self.path)
    if body is None:
      self.send_error(404)
      return
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.path in self.server.truncate:  # the connection drops mid-body
      self.wfile.write(body[:len(body) // 2])
      self.close_connection = True
      return
    self.wfile.write(body)

  def log_message(self, *args):
    del args


def _gzip(data):
  return gzip.compress(data, compresslevel=1, mtime=0)


def _sgm(lines, lang):
  segs = "".join(f'<seg id="{i}">{line}</seg>\n' for i, line in enumerate(lines, 1))
  return (f'<srcset setid="t" srclang="any" trglang="{lang}">\n<doc sysid="ref" '
          f'docid="d" genre="news" origlang="en">\n{segs}</doc>\n</srcset>\n').encode()


def _tgz(members):
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    for name, data in members.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return buffer.getvalue()


def _ptb_layout(tree):
  """A one-line tree as the treebank's .mrg files write it: phrases on lines of their
  own, a space before each closing bracket that follows another."""
  while "))" in tree:
    tree = tree.replace("))", ") )")
  return re.sub(r" \((?=[^ ()]+ \()", "\n    (", tree) + "\n\n"


def _treebank_zip(shared):
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w") as archive:
    archive.writestr("treebank/README", "Penn Treebank sample\n")
    for split, first, last in public_corpora.PTBSample.SPLITS:
      with open(os.path.join(shared, "ptb_wsj_sample", f"{split}.mrg"), encoding="utf-8") as f:
        trees = f.read().splitlines()
      files = last - first + 1  # the split's trees spread over its files, in order
      for k in range(files):
        chunk = trees[k * len(trees) // files:(k + 1) * len(trees) // files]
        archive.writestr(f"treebank/combined/wsj_{first + k:04d}.mrg",
                         "".join(_ptb_layout(t) for t in chunk))
  return buffer.getvalue()


def _read(path):
  with open(path, "rb") as f:
    return f.read()


@pytest.fixture(scope="module")
def upstream():
  """{URL path: bytes} of every file the corpora fetch, as upstream serves them."""
  if not os.path.isdir(SHARED_DATA):  # the shared_data fixture's skip, once a module
    pytest.skip(f"real corpora not found at {SHARED_DATA} (../shared/data beside the "
                "repository)")
  shared_data, files = SHARED_DATA, {}
  for upstream_name, split in public_corpora.Multi30k.SPLITS.items():
    for lang in ("en", "de"):
      files[f"{M30K}{upstream_name}.{lang}.gz"] = _gzip(
          _read(os.path.join(shared_data, "multi30k", f"{split}.{lang}")))
  wmt = {name: {lang: _read(os.path.join(shared_data, "wmt14", f"{name}.{lang}"))
                .decode().splitlines() for lang in ("en", "de")}
         for name in ("newstest2013", "newstest2014")}
  files["/statmt.org/wmt13/test.tgz"] = _tgz({
      f"test/newstest2013-src.{lang}.sgm": _sgm(wmt["newstest2013"][lang], lang)
      for lang in ("en", "de")})
  files["/statmt.org/wmt14/test-full.tgz"] = _tgz({
      "test-full/newstest2014-deen-src.en.sgm": _sgm(wmt["newstest2014"]["en"], "en"),
      "test-full/newstest2014-deen-ref.de.sgm": _sgm(wmt["newstest2014"]["de"], "de")})
  files[TREEBANK] = _treebank_zip(shared_data)
  return files


@pytest.fixture
def server(upstream):
  """A loopback server of `upstream` (server.files, server.truncate: per test)."""
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  httpd.files, httpd.truncate = dict(upstream), set()
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
  yield httpd
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture
def sacrebleu_cache(tmp_path, monkeypatch, upstream):
  """sacreBLEU's wmt13 and wmt14/full with their cache in tmp_path and the MD5s of
  this test's tarballs: the rest of its table (the URLs) and its code are its own."""
  from sacrebleu import DATASETS  # pylint: disable=import-outside-toplevel
  for name, path in (("wmt13", "/statmt.org/wmt13/test.tgz"),
                     ("wmt14/full", "/statmt.org/wmt14/test-full.tgz")):
    dataset = DATASETS[name]
    outdir = str(tmp_path / "sacrebleu" / name)
    monkeypatch.setattr(dataset, "_outdir", outdir)
    monkeypatch.setattr(dataset, "_rawdir", os.path.join(outdir, "raw"))
    monkeypatch.setattr(dataset, "md5", [hashlib.md5(upstream[path]).hexdigest()])
  return tmp_path / "sacrebleu"


def datagen(server, data_dir, *args):
  return inprocess.run("datagen", f"--mirror={server.url}", f"--data_dir={data_dir}",
                       *args)


def test_datagen_prepares_the_files_the_published_figures_used(
    server, sacrebleu_cache, shared_data, tmp_path):
  """Multi30k, the WMT test sets (through sacreBLEU) and the treebank sample come out
  equal to ../shared/data byte for byte (so their recorded digests are those of the
  published runs' files); a second run checks them and downloads nothing."""
  data_dir = tmp_path / "data"
  result = datagen(server, data_dir)
  assert result.returncode == 0, result.stderr[-3000:]
  names = [n for c in public_corpora.DEFAULT for n in public_corpora.CORPORA[c].files]
  assert len(names) == 13
  for name in names:
    assert _read(data_dir / name) == _read(os.path.join(shared_data, name)), name
  assert f"Downloading {server.url}{M30K}train.en.gz" in result.stderr
  # progress: size, share, rate and ETA once the size is known
  assert re.search(r"train\.de\.gz: [\d.]+ [KMG]?B of [\d.]+ [KMG]?B \(100%\), "
                   r"[\d.]+ [KMG]?B/s, ETA 0s", result.stderr), result.stderr[-2000:]
  assert (sacrebleu_cache / "wmt14/full/raw/wmt14_full.test-full.tgz").exists()
  assert not [p for p in data_dir.rglob("*") if ".tmp-" in p.name]

  again = datagen(server, data_dir)
  assert again.returncode == 0 and "Downloading" not in again.stderr, again.stderr
  assert again.stderr.count("prepared already") == 3


def test_a_corrupted_download_is_refused_naming_the_file_and_both_checksums(
    server, tmp_path):
  good = gzip.decompress(server.files[f"{M30K}val.en.gz"])
  bad = good.replace(b"A", b"An", 1)
  server.files[f"{M30K}val.en.gz"] = _gzip(bad)
  data_dir = tmp_path / "data"
  result = datagen(server, data_dir, "--corpora=multi30k")
  assert result.returncode == 1
  error = result.stderr.strip().splitlines()[-1]
  assert error.startswith("error: multi30k/valid.en (from https://raw.githubusercontent"
                          ".com/multi30k/dataset/master/data/task1/raw/val.en.gz)"), error
  assert f"SHA256 {hashlib.sha256(bad).hexdigest()}, expected " \
         f"{public_corpora.Multi30k.files['multi30k/valid.en']}" in error
  assert not (data_dir / "multi30k" / "valid.en").exists()
  # the download it came from is gone too: the next run fetches it again
  assert not list(data_dir.rglob("val.en.gz"))
  assert (data_dir / "multi30k" / "train.en").exists()  # what was checked is kept

  server.files[f"{M30K}val.en.gz"] = _gzip(good)
  assert datagen(server, data_dir, "--corpora=multi30k").returncode == 0
  assert _read(data_dir / "multi30k" / "valid.en") == good


def test_an_interrupted_download_leaves_nothing_a_later_run_trusts(server, tmp_path):
  server.truncate.add(f"{M30K}train.de.gz")
  data_dir = tmp_path / "data"
  result = datagen(server, data_dir, "--corpora=multi30k")
  assert result.returncode == 1
  size = len(server.files[f"{M30K}train.de.gz"])
  assert re.search(rf"error: The download of {server.url}{M30K}train.de.gz stopped "
                   rf"after {size // 2} of {size} bytes", result.stderr), result.stderr
  assert not [p for p in data_dir.rglob("*") if "train.de" in p.name]  # no temporary

  server.truncate.clear()
  rerun = datagen(server, data_dir, "--corpora=multi30k")
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert f"{M30K}train.de.gz" in rerun.stderr  # fetched again, not trusted
  assert public_corpora.CORPORA["multi30k"].is_prepared(str(data_dir))


def test_a_tarball_not_matching_sacrebleus_md5_is_refused(server, sacrebleu_cache,
                                                          monkeypatch, tmp_path):
  from sacrebleu import DATASETS  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(DATASETS["wmt13"], "md5", ["0" * 32])
  result = datagen(server, tmp_path / "data", "--corpora=wmt14")
  assert result.returncode == 1
  error = result.stderr.strip().splitlines()[-1]
  assert error.startswith(f"error: wmt13.test.tgz (from {server.url}/statmt.org/wmt13/"
                          f"test.tgz) has MD5 "), error
  assert "expected " + "0" * 32 in error
  assert not list((sacrebleu_cache / "wmt13").rglob("*.tgz"))


def test_treebank_files_become_one_tree_per_line(shared_data):
  """wsj_0001.mrg's first tree as the treebank writes it becomes the first line of
  the prepared train.mrg."""
  mrg = """( (S
    (NP-SBJ
      (NP (NNP Pierre) (NNP Vinken) )
      (, ,)
      (ADJP
        (NP (CD 61) (NNS years) )
        (JJ old) )
      (, ,) )
    (VP (MD will)
      (VP (VB join)
        (NP (DT the) (NN board) )
        (PP-CLR (IN as)
          (NP (DT a) (JJ nonexecutive) (NN director) ))
        (NP-TMP (NNP Nov.) (CD 29) )))
    (. .) ))
"""
  with open(os.path.join(shared_data, "ptb_wsj_sample", "train.mrg"), encoding="utf-8") as f:
    first = f.readline().rstrip("\n")
  assert public_corpora.one_line_trees(mrg + "\n" + mrg) == [first, first]


def test_tatoeba_split_keeps_held_out_english_out_of_train(tmp_path):
  pairs = [(f"Sentence {i}.", f"Satz {i}.") for i in range(3000)]
  pairs += [("Sentence 7.", "Der Satz 7."), ("Sentence 7.", "Satz 7.")]  # a repeat
  export = tmp_path / "deu-eng.zip"
  with zipfile.ZipFile(export, "w") as archive:
    archive.writestr("deu.txt", "".join(f"{en}\t{de}\tCC-BY 2.0 (France)\n"
                                        for en, de in pairs))
  data_dir = tmp_path / "data"
  result = inprocess.run("datagen", f"--data_dir={data_dir}", "--corpora=tatoeba_deu_eng",
                         f"--tatoeba_file={export}")
  assert result.returncode == 0, result.stderr
  split = {s: list(zip(*(_read(data_dir / f"tatoeba_deu_eng/{s}.{lang}").decode()
                          .splitlines() for lang in ("en", "de"))))
           for s in ("train", "valid", "test")}
  assert sum(map(len, split.values())) == 3001  # the repeat dropped
  train_en = {en for en, _ in split["train"]}
  for held_out in ("valid", "test"):
    assert 10 <= len(split[held_out]) <= 60
    assert not {en for en, _ in split[held_out]} & train_en
  # The same pairs in another order: the same held-out sentences.
  assert public_corpora.split_tatoeba(pairs[::-1])["test"] == split["test"][::-1]

  kept = inprocess.run("datagen", f"--data_dir={data_dir}", "--corpora=tatoeba_deu_eng")
  assert kept.returncode == 0 and "already (from an export given before" in kept.stderr
  missing = inprocess.run("datagen", f"--data_dir={tmp_path / 'other'}",
                          "--corpora=tatoeba_deu_eng")
  assert missing.returncode == 1 and "needs --tatoeba_file" in missing.stderr


@pytest.mark.parametrize("recipe", ["multi30k_en_de", "tatoeba_en_de",
                                    "parsing_ptb_sample"])
def test_recipes_read_the_files_datagen_writes_under_data(recipe):
  """Every data path of the CPU recipes is a file t2t-datagen writes with its default
  --data_dir=data, and the flagfile's header says the command."""
  values = flagfile_values(f"flags/{recipe}.cfg")
  written = {os.path.join("data", n) for c in public_corpora.CORPORA.values()
             for n in c.files}
  paths = [p for name in ("train_src", "train_tgt", "dev_src", "dev_tgt")
           for p in (values[name].value or "").split(",") if p]
  assert paths and set(paths) <= written, paths
  with open(os.path.join(REPO_ROOT, "flags", f"{recipe}.cfg"), encoding="utf-8") as f:
    text = f.read()
  assert "t2t_keras.tools.datagen --corpora=" in text and "shared/data" not in text


def test_a_missing_recipe_file_names_the_command_that_fetches_it():
  from t2t_keras.data.sources import textfiles  # pylint: disable=import-outside-toplevel
  from t2t_keras.errors import DataError  # pylint: disable=import-outside-toplevel
  with pytest.raises(DataError, match=r"data/nope/train\.en.*python -m "
                     r"t2t_keras\.tools\.datagen"):
    textfiles.check_file_exists("data/nope/train.en")
  with pytest.raises(DataError) as raised:
    textfiles.check_file_exists("elsewhere/train.en")
  assert "tools.datagen" not in str(raised.value)
