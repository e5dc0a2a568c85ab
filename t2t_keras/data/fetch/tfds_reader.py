"""Loading a tensorflow-datasets translation dataset (WMT14 and the like), offline-first.

TFDS prepares a dataset by downloading it; when the files are not there and the
network is not either, the loader says which URLs it needs and where to put the
prepared data (`--tfds_data_dir`), instead of a long stack trace.

A WMT dataset's training split is several sub-datasets concatenated (wmt14_translate/
de-en: europarl_v7, commoncrawl, newscommentary_v9), and its examples do not say which
they came from. To weight them (--tfds_train_subsets with --train_weights), each
sub-dataset is its own dataset: TFDS's `wmt_translate` builder with a custom
`WmtConfig` of the same language pair and that one training subset (the way TFDS
documents for choosing subsets), prepared, cached and fingerprinted on its own; the
dev split stays the named dataset's.
"""

from __future__ import annotations

import os
from typing import List

import tensorflow as tf

from t2t_keras.configs import DataConfig
from t2t_keras.data.sources import corpora
from t2t_keras.errors import DataError

# TFDS split names of the WMT builders for our two splits.
_TFDS_SPLITS = {"train": "train", "dev": "validation"}


class _UrlsRecorded(Exception):
  """Stops a builder's `_split_generators` once it has asked for its first download."""


class _RecordingDownloadManager:
  """Stands in for tfds' DownloadManager to learn which URLs a builder would fetch."""

  def __init__(self, manual_dir):
    self.manual_dir = manual_dir
    self.urls: List[str] = []

  def _record(self, url_or_urls, *args, **kwargs):
    del args, kwargs
    queue = [url_or_urls]  # breadth-first, in the builder's order
    while queue:
      item = queue.pop(0)
      if isinstance(item, dict):
        queue.extend(item.values())
      elif isinstance(item, (list, tuple)):
        queue.extend(item)
      elif item is not None:
        self.urls.append(str(getattr(item, "url", item)))
    if self.urls:
      raise _UrlsRecorded()
    return url_or_urls

  download = download_and_extract = download_kaggle_data = _record

  def extract(self, paths):
    return paths


def _download_urls(builder) -> List[str]:
  """The URLs a TFDS builder downloads first (empty when they cannot be learned)."""
  recorder = _RecordingDownloadManager(manual_dir=os.path.join(
      builder.data_dir, "manual"))
  try:  # stops at the first download (_UrlsRecorded)
    builder._split_generators(recorder)  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except  (also: a builder we cannot introspect)
    pass
  return recorder.urls


def _tfds_help(config: DataConfig, data_dir: str) -> str:
  return (f"Prepare it on a machine with internet, `tfds build {config.tfds_name} "
          f"--data_dir=DIR` (pip install tensorflow-datasets), copy DIR here and pass "
          f"--tfds_data_dir=DIR (now {data_dir}); or train from text files with "
          "--data_source=files --train_src=... --train_tgt=... (BUILD.md, Data).")


def _check_download_reachable(builder, config: DataConfig) -> None:
  """Fails fast, with what to do, when an unprepared dataset's download is unreachable.

  Offline, tfds' downloader retries with back-off for minutes before failing; one probe
  of the first URL without retries tells the user at once.
  """
  import requests  # pylint: disable=import-outside-toplevel  (a tensorflow-datasets dependency)

  urls = [u for u in _download_urls(builder) if u.startswith(("http://", "https://"))]
  if not urls:
    return  # ftp, Kaggle, manual downloads: left to tfds
  try:
    requests.head(urls[0], timeout=20, allow_redirects=True)
  except requests.exceptions.Timeout:
    return  # slow, not absent: tfds retries
  except requests.ConnectionError as error:  # no route, no DNS, refused
    reason = str(error).split("(Caused by")[-1].strip(" )")[:200]
    raise DataError(
        f"tensorflow-datasets {config.tfds_name!r} is not prepared in "
        f"{builder.data_dir} and its download ({urls[0]}) cannot be reached from this "
        f"machine ({type(error).__name__}: {reason}). " + _tfds_help(
            config, config.tfds_data_dir or "the default ~/tensorflow_datasets")) from None


def _builder(config: DataConfig, split: str):
  """The TFDS builder of a split: --tfds_name's, or (training, --tfds_train_subsets,
  one subset) that of the one sub-dataset (module docstring).

  Raises:
    DataError: an unknown name, a dataset without sub-datasets, an unknown subset.
  """
  import tensorflow_datasets as tfds  # Heavy import, only for this source.

  try:
    builder = tfds.builder(config.tfds_name, data_dir=config.tfds_data_dir)
  except Exception as e:  # pylint: disable=broad-except  (unknown name, bad config, ...)
    raise DataError(f"--tfds_name={config.tfds_name!r}: tensorflow-datasets cannot build "
                    f"it ({type(e).__name__}: {str(e).splitlines()[0][:300]}). Use a "
                    "name of `tfds.list_builders()`, e.g. wmt14_translate/de-en.") from None
  subsets = corpora.split_list(config.tfds_train_subsets) if split == "train" else []
  if not subsets:
    return builder
  if len(subsets) > 1:
    raise ValueError(f"one sub-dataset at a time, not {subsets} (TfdsSource.corpora)")
  from tensorflow_datasets.translate import wmt  # pylint: disable=import-outside-toplevel

  available = getattr(builder, "subsets", {}).get(tfds.Split.TRAIN) if isinstance(
      builder, wmt.WmtTranslate) else None
  if not available:
    raise DataError(f"--tfds_train_subsets={config.tfds_train_subsets}: "
                    f"--tfds_name={config.tfds_name} is no WMT dataset of sub-datasets; "
                    "drop --tfds_train_subsets, or name a WMT dataset such as "
                    "wmt14_translate/de-en")
  if subsets[0] not in available:
    raise DataError(f"--tfds_train_subsets: {subsets[0]!r} is no training sub-dataset "
                    f"of {config.tfds_name}; it has {', '.join(available)}")
  subset = wmt.WmtConfig(
      name=subsets[0], language_pair=builder.builder_config.language_pair,
      version=str(builder.info.version), url=builder.builder_config.url,
      citation=builder.builder_config.citation,
      description=f"{config.tfds_name}, training sub-dataset {subsets[0]} (t2t_keras)",
      subsets={tfds.Split.TRAIN: [subsets[0]]})
  return tfds.builder("wmt_translate", config=subset, data_dir=config.tfds_data_dir)


def load(config: DataConfig, split: str) -> tf.data.Dataset:
  """The TFDS split as a dataset of feature dicts keyed by language.

  The dataset is prepared on first use (downloaded and converted by its real TFDS
  builder into --tfds_data_dir); an unreachable download fails fast with what to do.
  """
  builder = _builder(config, split)
  languages = sorted(builder.info.features.keys())
  for lang in (config.source_lang, config.target_lang):
    if lang not in languages:
      raise DataError(f"{config.tfds_name} has languages {languages}; "
                      f"--source_lang/--target_lang={lang!r} is not one of them.")
  if not builder.is_prepared():
    _check_download_reachable(builder, config)
  try:
    builder.download_and_prepare()
    return builder.as_dataset(split=_TFDS_SPLITS[split], shuffle_files=False)
  except Exception as e:  # Download/preparation failures of any kind.
    raise DataError(
        f"Could not prepare tensorflow-datasets {config.tfds_name!r} split "
        f"{_TFDS_SPLITS[split]!r} in {builder.data_dir} ({type(e).__name__}: "
        f"{str(e)[:500]}). " + _tfds_help(
            config, config.tfds_data_dir or "the default ~/tensorflow_datasets")) from e


def fingerprint(config: DataConfig, split: str) -> dict:
  """What identifies a TFDS split's content (name, version, split, direction, and
  the training sub-datasets when --tfds_train_subsets chooses them)."""
  import tensorflow_datasets as tfds

  builder = tfds.builder(config.tfds_name, data_dir=config.tfds_data_dir)
  fp = {"tfds": config.tfds_name, "version": str(builder.info.version),
        "split": _TFDS_SPLITS[split], "src": config.source_lang,
        "tgt": config.target_lang}
  if split == "train" and config.tfds_train_subsets:
    fp["subsets"] = corpora.split_list(config.tfds_train_subsets)
  return fp
