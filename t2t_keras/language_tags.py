"""Target-language tags: one model translating into several languages.

As in Johnson et al. 2017 (Google's multilingual NMT), fairseq's and Marian's language
tokens: every source starts with a tag naming the language to translate into, `<2de>`.
The tag is one piece of the vocabulary (a SentencePiece user-defined symbol, never
split, added when the vocabulary is built) and is put before the source's pieces as an
id, not as text: SentencePiece would give the text "<2de> A dog" a lone "▁" piece
before the tag, and "<2de>A" would glue the tag to the first word.

Where the tags come from and go:
  * training (`--target_language_tags=de,en`, one language per training corpus in
    --train_src's order; `--dev_target_language` for the dev files, default the first
    corpus's): the vocabulary gets every language's tag, and the tokenized cache holds
    each source with its corpus's tag first (the tag is part of the cache's key);
  * decoding (`--target_language=de`), dev BLEU, scoring: `translate(...,
    target_language=)` puts the tag before every source;
  * the SavedModel: `serving_default` translates into the export's
    `--target_language` (default: the dev target language), and the signature
    `translate_to_language` takes a language per row.
The languages a model knows are the data config's (config.json), so decode and export
check a request against them with a message naming the choices.
"""

from __future__ import annotations

import re
from typing import List, Optional

from t2t_keras.configs import DataConfig
from t2t_keras.configs import split_list as split  # "de,en" -> ["de", "en"]

_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,15}")


def tag(language: str) -> str:
  """The vocabulary piece of a target language: "de" -> "<2de>"."""
  return f"<2{language}>"


def problems(config: DataConfig, corpora: int) -> List[str]:
  """What is wrong with --target_language_tags / --dev_target_language for `corpora`
  training corpora, each naming the flag and what to do."""
  found = []
  languages = split(config.target_language_tags)
  if config.dev_target_language and not languages:
    found.append(f"--dev_target_language={config.dev_target_language} needs "
                 "--target_language_tags (the target language of each training corpus)")
  if not languages:
    return found
  if len(languages) != corpora:
    found.append(f"--target_language_tags={config.target_language_tags} names "
                 f"{len(languages)} languages for {corpora} training corpora: give the "
                 "target language of each --train_src/--train_tgt pair, in the same order")
  for language in languages + ([config.dev_target_language]
                               if config.dev_target_language else []):
    if not _CODE.fullmatch(language):
      found.append(f"target language {language!r} (--target_language_tags / "
                   "--dev_target_language) must be a language code: a letter, then up "
                   "to 15 letters, digits, '-' or '_' (e.g. de, pt_BR)")
  return found


def languages(config: DataConfig) -> List[str]:
  """The distinct target languages of a data config, in order (dev's last): the tags
  its vocabulary holds; [] for a model without tags."""
  out = []
  for language in split(config.target_language_tags) + [config.dev_target_language]:
    if language and language not in out:
      out.append(language)
  return out


def split_language(config: DataConfig, split_name: str) -> Optional[str]:
  """The target language whose tag starts a one-corpus config's sources of a split
  (`Source.corpora` gives one config per corpus), None without tags."""
  listed = split(config.target_language_tags)
  if not listed:
    return None
  if split_name == "dev":
    return config.dev_target_language or listed[0]
  if len(set(listed)) != 1:
    raise ValueError(f"the train split of --target_language_tags="
                     f"{config.target_language_tags} has one language per corpus: "
                     "tokenize each corpus with its own config (Source.corpora)")
  return listed[0]


def default_language(config: DataConfig) -> Optional[str]:
  """The language a tagged model translates into when nobody says: the dev files'."""
  return split_language(config, "dev")


def check_request(language: Optional[str], config: DataConfig, flag: str
                  ) -> Optional[str]:
  """The language to translate into for a request of `flag` (None: the model has no
  tags and none was asked for).

  Raises:
    ValueError: a language the model has no tag for, or one asked of an untagged model,
      naming the flag and the choices.
  """
  known = languages(config)
  if not known:
    if language:
      raise ValueError(f"{flag}={language}: this model was trained without "
                       "--target_language_tags, so it translates into one language only; "
                       f"drop {flag}")
    return None
  language = language or default_language(config)
  if language not in known:
    raise ValueError(f"{flag}={language}: this model has tags for "
                     f"{', '.join(known)} only (--target_language_tags at training)")
  return language
