"""TFDS's real `wmt14_translate` builder, offline (issue: the user's path).

`tfds.testing.mock_data` replaces the builder's preparation with random examples, so a
broken TFDS install (a missing dependency of `download_and_prepare`) or a change in
the builder's file layout passes it. Here only the network step is replaced: the
download manager hands the builder local directories laid out as the WMT archives
unpack, and everything else (`_split_generators`, `_generate_examples` parsing the
text and SGML files, writing TFRecords, reading them back) is tensorflow-datasets' own
code, driven through t2t_keras's loading code. The headline command is also run
offline for real and must end with the data message, not minutes of retries.
"""

import os
import subprocess
import sys

import pytest
import requests
import tensorflow as tf
import tree

from t2t_keras.configs import DataConfig
from t2t_keras.data.sources import sources
from t2t_keras.data.batching import pipeline
from tests.conftest import REPO_ROOT

tfds = pytest.importorskip("tensorflow_datasets")
from tensorflow_datasets.translate import wmt  # noqa: E402  pylint: disable=wrong-import-position

NAME = "wmt14_translate/de-en"
ENGLISH = ["A Republican strategy to counter the re-election of Obama",
           "Republican leaders justified their policy.", "One thing is certain.",
           "Indeed, it is rarer than lightning.", "Zürich is a city."]
GERMAN = ["Eine republikanische Strategie gegen die Wiederwahl Obamas",
          "Republikanische Führer rechtfertigten ihre Politik.", "Eines ist sicher.",
          "Tatsächlich ist es seltener als ein Blitz.", "Zürich ist eine Stadt."]


def _write(path, lines, sgm):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    if sgm:
      f.write('<srcset setid="t" srclang="any">\n<doc docid="d" sysid="ref">\n')
      for i, line in enumerate(lines, 1):
        f.write(f'<seg id="{i}">{line}</seg>\n')
      f.write("</doc>\n</srcset>\n")
    else:
      f.write("\n".join(lines) + "\n")


def _fake_archives(root, builder):
  """URL -> local directory with the files each sub-dataset reads, as unpacked.

  Every sub-dataset gets its own sentences (prefixed with its name) so the test can
  tell which files each split was built from.
  """
  by_url = {}
  for subsets in builder.subsets.values():
    for name in subsets:
      ds = wmt.DATASET_MAP[name]
      urls = ds.get_url("de")
      urls = [urls] if isinstance(urls, str) else list(urls)
      rel_paths = ds.get_path("de")
      rel_paths = [rel_paths] if isinstance(rel_paths, str) else list(rel_paths)
      for url in urls:  # dev.tgz holds both newstest2013 and newstest2014
        directory = by_url.setdefault(url, os.path.join(root, f"archive{len(by_url)}"))
        for rel_path in rel_paths:
          # The builder tells a pair's languages apart by the file suffix.
          parts = rel_path.split(".")
          lang = parts[-2] if parts[-1] in ("sgm", "gz") else parts[-1]
          lines = ENGLISH if lang == "en" else GERMAN
          _write(os.path.join(directory, rel_path), [f"{name} {x}" for x in lines],
                 rel_path.endswith(".sgm"))
  return by_url


@pytest.fixture
def offline_wmt14(tmp_path, monkeypatch):
  """A data dir and a download manager whose downloads are local directories."""
  builder = tfds.builder(NAME, data_dir=str(tmp_path / "tfds"))
  by_url = _fake_archives(str(tmp_path / "archives"), builder)
  fetched = []

  def download_and_extract(self, url_or_urls):
    del self
    def local(url):
      fetched.append(url)
      return by_url[url]
    return tree.map_structure(local, url_or_urls)

  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract",
                      download_and_extract)
  # The "network" is up: t2t_keras's reachability probe of the first URL succeeds.
  probed = []
  monkeypatch.setattr(requests, "head", lambda url, **kwargs: probed.append(url))
  yield DataConfig(source="tfds", tfds_name=NAME, tfds_data_dir=str(tmp_path / "tfds"),
                    source_lang="en", target_lang="de"), builder, fetched
  assert probed == ["http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz"]


def test_real_builder_prepares_and_loads_both_directions(offline_wmt14):
  config, builder, fetched = offline_wmt14
  assert not builder.is_prepared()
  train = sorted((s.decode(), t.decode()) for s, t in
                 sources.data_source(config).text_pairs("train").as_numpy_iterator())
  # The builder asked for the archives of its three EN-DE training corpora and the
  # dev/test sets, and parsed every one of them.
  assert set(builder.subsets[tfds.Split.TRAIN]) == {
      "europarl_v7", "commoncrawl", "newscommentary_v9"}
  assert len(fetched) >= 5
  expected = sorted((f"{name} {en}", f"{name} {de}")
                    for name in builder.subsets[tfds.Split.TRAIN]
                    for en, de in zip(ENGLISH, GERMAN))
  assert train == expected
  assert tfds.builder(NAME, data_dir=config.tfds_data_dir).is_prepared()
  # The dev split is newstest2013, and the direction follows --source_lang / --target_lang.
  de_en = DataConfig(**{**config.__dict__, "source_lang": "de", "target_lang": "en"})
  dev = sorted((s.decode(), t.decode()) for s, t in
               sources.data_source(de_en).text_pairs("dev").as_numpy_iterator())
  assert dev == sorted((f"newstest2013 {de}", f"newstest2013 {en}")
                       for en, de in zip(ENGLISH, GERMAN))
  # The Python iterator (vocabulary sampling) sees the same pairs.
  assert sorted(sources.data_source(config).python_pairs("train")) == expected


def test_prepared_data_is_reused_without_downloading(offline_wmt14, monkeypatch):
  config, _, fetched = offline_wmt14
  list(sources.data_source(config).text_pairs("dev").as_numpy_iterator())
  count = len(fetched)

  def offline(*args, **kwargs):
    raise AssertionError("downloaded again")
  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract", offline)
  pairs = list(sources.data_source(config).text_pairs("train").as_numpy_iterator())
  assert len(pairs) == 15 and len(fetched) == count


@pytest.mark.slow
def test_headline_command_offline_ends_with_a_data_message(tmp_path):
  """`train --flagfile=flags/big_en_de.cfg` with no route to the internet: a proxy on a
  closed local port stands for "offline" on any machine, CI's or one with internet."""
  env = dict(os.environ, HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
             http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
             NO_PROXY="", no_proxy="")
  result = subprocess.run(
      [sys.executable, "-m", "t2t_keras.train", "--flagfile=flags/big_en_de.cfg",
       f"--model_dir={tmp_path / 'big'}", f"--tfds_data_dir={tmp_path / 'tfds'}"],
      cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=600, check=False)
  assert result.returncode == 1, result.stderr[-3000:]
  error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(error) == 1, result.stderr[-3000:]
  message = error[0]
  assert "wmt14_translate/de-en" in message and "cannot be reached" in message
  assert f"--tfds_data_dir=DIR (now {tmp_path / 'tfds'})" in message
  assert "--data_source=files" in message and "Traceback" not in result.stderr
  # The message came from the probe, before tfds' retry loop started downloading.
  assert not tf.io.gfile.exists(str(tmp_path / "tfds" / "downloads"))


def test_training_subsets_are_datasets_of_their_own_mixed_by_weights(tmp_path, monkeypatch):
  """--tfds_train_subsets with --train_weights: each WMT sub-dataset is prepared by the
  real builder (`wmt_translate` with a config of that one subset, offline as above),
  cached on its own and trained on its multiplicity; dev stays newstest2013."""
  data_dir = str(tmp_path / "tfds")
  by_url = _fake_archives(str(tmp_path / "archives"), tfds.builder(NAME, data_dir=data_dir))
  monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract",
                      lambda self, urls: tree.map_structure(by_url.__getitem__, urls))
  monkeypatch.setattr(requests, "head", lambda url, **kwargs: None)
  config = DataConfig(source="tfds", tfds_name=NAME, tfds_data_dir=data_dir,
                      source_lang="en", target_lang="de",
                      tfds_train_subsets="europarl_v7,newscommentary_v9",
                      train_weights="1,3", data_dir=str(tmp_path / "data"), vocab_size=80,
                      max_length=128, batch_size=512)
  source = sources.data_source(config)
  parts = source.corpora("train")
  assert [name for name, _ in parts] == ["europarl_v7", "newscommentary_v9"]
  for name, part in parts:  # each subset alone, from its own prepared dataset
    pairs = sorted(s.decode() for s, _ in
                   sources.data_source(part).text_pairs("train").as_numpy_iterator())
    assert pairs == sorted(f"{name} {en}" for en in ENGLISH)
    assert tfds.builder("wmt_translate/de-en." + name, data_dir=data_dir).is_prepared()
  assert len(list(source.python_pairs("train"))) == 10  # the vocabulary sees both
  data = pipeline.make_datasets(config)
  assert data.train_fn.mixture.multiplicity == (1, 3)
  assert data.train_fn.mixture.summary()[1].startswith(
      "Corpus 2/2 newscommentary_v9: 5 pairs kept, weight 3 (by size), x3")
  firsts = [s.split()[0] for b in pipeline.train_dataset(config, data.tokenizer,
                                                         repeat=False)
            for s in data.tokenizer.detokenize(b["inputs"]).numpy().tolist() if s]
  assert firsts.count(b"newscommentary_v9") >= 3 * firsts.count(b"europarl_v7") - 5
  assert firsts.count(b"europarl_v7") >= 5
  dev = sorted(s.decode() for s, _ in source.text_pairs("dev").as_numpy_iterator())
  assert dev == sorted(f"newstest2013 {en}" for en in ENGLISH)
  bad = DataConfig(**{**config.__dict__, "tfds_train_subsets": "europarl_v7,gigafren"})
  with pytest.raises(sources.DataError, match="'gigafren' is no training sub-dataset of "
                     "wmt14_translate/de-en; it has europarl_v7, commoncrawl"):
    pipeline.make_datasets(bad)
