"""Target-language tags (t2t_keras/language_tags.py): the flags' checks, the vocabulary's
tag pieces, each corpus's sources starting with its tag in the tokenized cache, and
decode's --target_language (issue 35)."""

import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import language_tags
from t2t_keras.inference import decoding, translate
from t2t_keras.configs import DataConfig, DecodeConfig
from t2t_keras.data.sources import sources
from t2t_keras.data.batching import pipeline
from t2t_keras.errors import DataError
from tests import inprocess
from tests.conftest import REPO_ROOT, SessionModel

WORDS_EN = "the a man woman dog cat runs sits on in park street red small".split()
WORDS_DE = "der ein Mann Frau Hund Katze läuft sitzt auf im Park Straße rot klein".split()


def _write(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


def _corpus(tmp_path, n=120, seed=0):
  """English and German files whose lines are word-for-word translations."""
  rng = np.random.default_rng(seed)
  en, de = [], []
  for _ in range(n):
    words = rng.integers(0, len(WORDS_EN), rng.integers(2, 7))
    en.append(" ".join(WORDS_EN[w] for w in words))
    de.append(" ".join(WORDS_DE[w] for w in words))
  for name, lines in (("train.en", en), ("train.de", de), ("dev.en", en[:8]),
                      ("dev.de", de[:8])):
    _write(str(tmp_path / name), lines)
  return tmp_path


def _bidirectional(path, **overrides):
  """EN->DE and DE->EN from the same files, tagged de and en."""
  flags = dict(source="files", train_src=f"{path}/train.en,{path}/train.de",
               train_tgt=f"{path}/train.de,{path}/train.en", target_language_tags="de,en",
               dev_src=f"{path}/dev.en", dev_tgt=f"{path}/dev.de",
               data_dir=str(path / "data"), vocab_size=80, max_length=32, batch_size=256)
  flags.update(overrides)
  return DataConfig(**flags)


@pytest.mark.parametrize("overrides,message", [
    (dict(target_language_tags="de"), "names 1 languages for 2 training corpora"),
    (dict(target_language_tags="de,e n"), "'e n'.*must be a language code"),
    (dict(target_language_tags=None, dev_target_language="de"),
     "--dev_target_language=de needs --target_language_tags"),
])
def test_tag_flags_are_checked_naming_the_flag(tmp_path, overrides, message):
  config = _bidirectional(tmp_path, **overrides)
  with pytest.raises(DataError, match=message):
    sources.data_source(config).validate()


def test_languages_and_the_language_of_each_split():
  config = DataConfig(source="files", train_src="a,b,c", train_tgt="x,y,z",
                      target_language_tags="de,en,de", dev_target_language="fr")
  assert language_tags.languages(config) == ["de", "en", "fr"]
  assert language_tags.default_language(config) == "fr"
  parts = sources.data_source(config).corpora("train")
  assert [language_tags.split_language(c, "train") for _, c in parts] == ["de", "en", "de"]
  assert language_tags.check_request(None, config, "--target_language") == "fr"
  with pytest.raises(ValueError, match="--target_language=it: this model has tags for "
                     "de, en, fr only"):
    language_tags.check_request("it", config, "--target_language")
  with pytest.raises(ValueError, match="trained without --target_language_tags"):
    language_tags.check_request("de", DataConfig(), "--target_language")


@pytest.mark.slow
def test_each_corpus_sources_start_with_its_tag_in_the_cache(tmp_path):
  config = _bidirectional(_corpus(tmp_path))
  data = pipeline.make_datasets(config)
  tokenizer = data.tokenizer
  de, en = tokenizer.tag_id("de"), tokenizer.tag_id("en")
  assert de != en and min(de, en) > 3
  # A tag is one piece, never split, and the words around it tokenize as without it.
  assert tokenizer.tokenize(["<2de>"]).to_list() != [[de]]  # text: "▁" + tag (why ids)
  with pytest.raises(DataError, match="has no piece <2fr>"):
    tokenizer.tag_id("fr")
  split = data.train_fn.split
  src, _, counts = (t.numpy() for t in split.read(split.present))
  firsts = src[np.cumsum(counts[:, 0]) - counts[:, 0]]
  assert sorted(set(firsts.tolist())) == sorted([de, en])
  assert (firsts == de).sum() == (firsts == en).sum() == 120
  # The dev split's sources carry the dev language's tag (the first corpus's: de).
  dev = pipeline.load_split(config, "dev", tokenizer)
  dev_src, _, dev_counts = (t.numpy() for t in dev.read(dev.present))
  assert set(dev_src[np.cumsum(dev_counts[:, 0]) - dev_counts[:, 0]].tolist()) == {de}
  # Untagged, the same files make another vocabulary and other caches.
  plain = _bidirectional(tmp_path, target_language_tags=None)
  assert (sources.data_source(plain).fingerprint("train", shared_vocab=True)
          != sources.data_source(config).fingerprint("train", shared_vocab=True))


@pytest.mark.slow
def test_translate_puts_the_tag_first_and_counts_it(tmp_path):
  from t2t_keras.configs import ModelConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.model import create_model  # pylint: disable=import-outside-toplevel
  config = _bidirectional(_corpus(tmp_path))
  tokenizer = pipeline.make_datasets(config).tokenizer
  model = create_model(ModelConfig(vocab_size=tokenizer.vocab_size, hidden_size=16,
                                   filter_size=32, num_heads=2, num_hidden_layers=1))
  decode = DecodeConfig(beam_size=1, extra_decode_length=2)
  plain = translate.translate(decoding.make_decode_fn(model, decode), tokenizer,
                              ["the dog runs"], decode, progress=False)
  tagged_config = dataclasses.replace(decode, target_language="en", max_input_length=3)
  tagged = translate.translate(decoding.make_decode_fn(model, tagged_config), tokenizer,
                               ["the dog runs"], tagged_config, progress=False)
  assert tagged[0].source_ids[0] == tokenizer.tag_id("en")
  assert tagged[0].source_ids[1:-1] == plain[0].source_ids[:1] and tagged[0].truncated


def _language_votes(line):
  """(English words, German words) of an output line: the two word lists share none."""
  words = line.split()
  return sum(w in WORDS_EN for w in words), sum(w in WORDS_DE for w in words)


@pytest.mark.slow
def test_train_and_decode_commands_with_target_languages(tmp_path):
  """`python -m t2t_keras.train` on EN->DE and EN->EN (a copy) tagged de and en, then
  decode: the same English sentences go into German or English as --target_language
  says (the tag alone decides: an ignored or swapped tag fails), the model refuses a
  language it has no tag for, naming its languages. The entry points and the
  CTranslate2 tool run in this process (tests/inprocess.py); decode, score and
  export run once more each as a fresh process with the flags only they define
  (--target_language, --target_prefix_file, --output_alignments): in this process
  every command's flags are defined, so a command reading a flag it does not define
  would pass here and fail for users."""
  path = _corpus(tmp_path)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
  model_dir = str(tmp_path / "m")
  # 150 steps (about 10 s): enough for each tag to pick its language's words, not for
  # the translations to be right.
  train = inprocess.run(
      "train", "--data_source=files",
       f"--train_src={path}/train.en,{path}/train.en",
       f"--train_tgt={path}/train.de,{path}/train.en", "--target_language_tags=de,en",
       f"--dev_src={path}/dev.en", f"--dev_tgt={path}/dev.de", "--vocab_size=80",
       "--hidden_size=32", "--filter_size=64", "--num_heads=2", "--num_hidden_layers=1",
       "--layer_prepostprocess_dropout=0", "--batch_size=1024", "--max_length=32",
       "--learning_rate=2", "--learning_rate_warmup_steps=40", "--train_steps=150",
       "--log_every=50", "--save_checkpoint_steps=150", "--eval_every=150",
       "--eval_bleu_sentences=4", "--show_examples=0", f"--model_dir={model_dir}")
  assert train.returncode == 0, train.stderr[-3000:]
  # dev BLEU, decoded with dev's tag
  assert re.search(r"eval at step 150: .* \| bleu \d+\.\d\d", train.stdout), train.stdout
  sentences = ["the dog runs", "a man sits in the park", "the small cat",
               "a red woman on the street"]

  def decode(*extra):
    return inprocess.run("decode", f"--model_dir={model_dir}", "--beam_size=1",
                         "--extra_decode_length=3", *extra,
                         stdin="".join(s + "\n" for s in sentences))

  def fresh(module, *args, stdin=None):
    """`python -m t2t_keras.MODULE ARGS` as a process of its own: its flags only."""
    result = subprocess.run([sys.executable, "-m", f"t2t_keras.{module}", *args],
                            input=stdin, cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, (module, result.stderr[-3000:])
    return result

  decoded = {}
  for language in ("en", "de"):
    result = decode(f"--target_language={language}")
    assert result.returncode == 0, result.stderr[-3000:]
    decoded[language] = result.stdout.splitlines()
    assert len(decoded[language]) == len(sentences)
  # Each line in the language asked for: more of its words than the other's (an empty
  # line has neither), so the two languages' lines differ.
  for english, german in zip(decoded["en"], decoded["de"]):
    (en_words, de_words), (en_in_de, de_in_de) = (_language_votes(english),
                                                  _language_votes(german))
    assert en_words > de_words and de_in_de > en_in_de, decoded
  default = decode()
  assert default.stdout.splitlines() == decoded["de"]  # the dev files' language
  # The decode command's own flags in a process of its own: a target language, target
  # prefixes and alignments, as in this process.
  (tmp_path / "prefix.txt").write_text("the\n" * len(sentences), encoding="utf-8")
  own = ["--target_language=en", f"--target_prefix_file={tmp_path}/prefix.txt"]
  here = decode(*own, f"--output_alignments={tmp_path}/here.align")
  assert here.returncode == 0, here.stderr[-3000:]
  assert all(line.startswith("the") for line in here.stdout.splitlines()), here.stdout
  alone = fresh("decode", f"--model_dir={model_dir}", "--beam_size=1",
                "--extra_decode_length=3", *own, f"--output_alignments={tmp_path}/alone.align",
                stdin="".join(s + "\n" for s in sentences))
  assert alone.stdout == here.stdout
  alignments = (tmp_path / "alone.align").read_text(encoding="utf-8")
  assert alignments == (tmp_path / "here.align").read_text(encoding="utf-8")
  assert len(alignments.splitlines()) == len(sentences) and "-" in alignments
  # Scoring reads the tag too: a pair scores as the decoder saw it.
  (tmp_path / "src.txt").write_text("the dog runs\n", encoding="utf-8")
  (tmp_path / "tgt.txt").write_text(decoded["en"][0] + "\n", encoding="utf-8")
  scores = {}
  for language in ("en", "de"):
    scored = inprocess.run("score", f"--model_dir={model_dir}",
                           f"--source_file={tmp_path}/src.txt",
                           f"--target_file={tmp_path}/tgt.txt",
                           f"--target_language={language}")
    assert scored.returncode == 0, scored.stderr[-3000:]
    scores[language] = float(scored.stdout.split()[0])
  assert scores["en"] > scores["de"]  # English output: likelier as English
  alone = fresh("score", f"--model_dir={model_dir}", f"--source_file={tmp_path}/src.txt",
                f"--target_file={tmp_path}/tgt.txt", "--target_language=en")
  assert float(alone.stdout.split()[0]) == pytest.approx(scores["en"], abs=1e-5)
  refused = decode("--target_language=fr")
  assert refused.returncode != 0
  assert "--target_language=fr: this model has tags for de, en only" in refused.stderr
  assert "Traceback" not in refused.stderr

  # The export, loaded as TF Serving loads it: translate_to_language per row, as the
  # decode command; serving_default into the default language; unknown ones refused.
  export_dir = str(tmp_path / "export")
  exported = inprocess.run("export", f"--model_dir={model_dir}",
                           f"--export_dir={export_dir}", "--export_version=1",
                           "--beam_size=1", "--extra_decode_length=3")
  assert exported.returncode == 0, exported.stderr[-3000:]
  served = SessionModel(os.path.join(export_dir, "1"))
  out = served.run("translate_to_language", inputs=np.array(["the dog runs"] * 2, object),
                   target_language=np.array(["en", "de"], object))
  assert [t.decode() for t in out["outputs"]] == [decoded["en"][0], decoded["de"][0]]
  plain = served.run(inputs=np.array(["the dog runs"], object))
  assert [t.decode() for t in plain["outputs"]] == decoded["de"][:1]
  # --target_language at export: serving_default translates into it.
  # (The export command's own flags in a process of its own.)
  fresh("export", f"--model_dir={model_dir}", f"--export_dir={export_dir}",
        "--export_version=2", "--beam_size=1", "--extra_decode_length=3",
        "--target_language=en")
  english = SessionModel(os.path.join(export_dir, "2")).run(
      inputs=np.array(["the dog runs"], object))
  assert [t.decode() for t in english["outputs"]] == decoded["en"][:1]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"target_language \W{0,2}fr\W{0,2}: this model translates "
                     "into de, en only"):
    served.run("translate_to_language", inputs=np.array(["a", "b"], object),
               target_language=np.array(["de", "fr"], object))

  # CTranslate2: the tag is a source token of its vocabulary (t2t-ct2-translate).
  ct2_dir = str(tmp_path / "ct2")
  converted = inprocess.run("export", f"--model_dir={model_dir}", f"--export_dir={ct2_dir}",
                            "--format=ctranslate2")
  assert converted.returncode == 0, converted.stderr[-3000:]
  (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sentences), encoding="utf-8")

  def ct2(language):
    # In this process: tools_test and ct2_translate_test run the tool as a process.
    return inprocess.run("ct2_translate", f"--model={ct2_dir}",
                         f"--input_file={tmp_path}/in.txt", "--beam_size=1",
                         "--extra_decode_length=3", f"--target_language={language}")

  assert ct2("en").stdout.splitlines() == decoded["en"]
  missing = ct2("fr")
  assert missing.returncode != 0 and "has no piece <2fr>" in missing.stderr
