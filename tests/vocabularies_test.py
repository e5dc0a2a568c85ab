"""--separate_vocabularies: a SentencePiece model per side, built from that side; the
model's source embedding sized by the source's, its target embedding and softmax by the
target's; training, decoding, scoring and both exports through them; old model
directories of one shared vocabulary load unchanged.

The data: a slice of Multi30k whose German side is written in Cyrillic letters (a pair
in two scripts, as EN-RU is), so every target piece is absent from the source's
vocabulary and a side mixed up shows as the wrong script.
"""

import dataclasses
import json
import os
import re
import shutil

import pytest
import tensorflow as tf

from t2t_keras import EOS_ID
from t2t_keras.configs import DataConfig, ModelConfig
from t2t_keras.data.tokens import cache
from t2t_keras.data.tokens import tokenizer as tokenizer_lib
from t2t_keras.errors import ConfigError
from t2t_keras.inference import loading
from t2t_keras.model import create_model
from tests import inprocess
from tests.conftest import SessionModel

_LATIN = "abcdefghijklmnopqrstuvwxyzäöüß"
_CYRILLIC = "абцдефгхийклмнопярстувшхызэёющ"
assert len(_LATIN) == len(_CYRILLIC)
TO_CYRILLIC = str.maketrans(_LATIN, _CYRILLIC)


def cyrillic(text):
  return text.lower().translate(TO_CYRILLIC)
CYRILLIC = re.compile("[\u0400-\u04ff]")
LATIN = re.compile("[A-Za-z]")
SOURCE_SIZE, TARGET_SIZE = 300, 360
SENTENCES = ["A skateboarder performs a trick over colorful graffiti .",
             "Two dogs play in the snow .", "A woman in a red dress sits on a bench ."]


def write_corpus(shared_data, directory, train=1500, dev=8):
  """my/{train,dev}.{en,ru}: Multi30k's English, and its German in Cyrillic letters."""
  multi30k = os.path.join(shared_data, "multi30k")
  os.makedirs(directory, exist_ok=True)
  for name, upstream, lines in (("train", "train", train), ("dev", "valid", dev)):
    for side, lang in (("en", "en"), ("ru", "de")):
      with open(os.path.join(multi30k, f"{upstream}.{lang}"), encoding="utf-8") as f:
        head = [next(f) for _ in range(lines)]
      if side == "ru":
        head = [cyrillic(line) for line in head]
      with open(os.path.join(directory, f"{name}.{side}"), "w", encoding="utf-8") as f:
        f.writelines(head)
  return {"train_src": f"{directory}/train.en", "train_tgt": f"{directory}/train.ru",
          "dev_src": f"{directory}/dev.en", "dev_tgt": f"{directory}/dev.ru"}


def pieces(tokenizer):
  proto = tokenizer.model_proto
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  processor = spm.SentencePieceProcessor(model_proto=proto)
  return {processor.id_to_piece(i) for i in range(processor.get_piece_size())}


def test_two_vocabularies_are_built_each_from_its_own_side(tmp_path, shared_data):
  files = write_corpus(shared_data, str(tmp_path / "my"), train=600)
  config = DataConfig(source="files", data_dir=str(tmp_path / "data"), vocab_size=SOURCE_SIZE,
                      separate_vocabularies=True, target_vocab_size=TARGET_SIZE, **files)
  tokenizer = tokenizer_lib.load_or_build_tokenizer(config)
  assert isinstance(tokenizer, tokenizer_lib.PairTokenizer)
  source, target = pieces(tokenizer.source), pieces(tokenizer.target)
  assert tokenizer.vocab_size == len(source) and tokenizer.target_vocab_size == len(target)
  assert len(source) != len(target)  # sized by --vocab_size and --target_vocab_size
  # A target-only piece (Cyrillic) is absent from the source's vocabulary, and no
  # source piece of a word is Latin-free text of the target's script.
  assert any(CYRILLIC.search(p) for p in target)
  assert not any(CYRILLIC.search(p) for p in source)
  assert "▁" + cyrillic("ein") in target and "▁" + cyrillic("ein") not in source
  written = sorted(os.listdir(tmp_path / "data"))
  assert any(n.startswith("vocab.source.bpe300.") and n.endswith(".model") for n in written)
  assert any(n.startswith("vocab.target.bpe360.") and n.endswith(".model") for n in written)
  # The tokenized cache: sources with the source's ids, targets with the target's.
  target_text = cyrillic("ein hund läuft .")
  text = tf.data.Dataset.from_tensor_slices((["A dog runs ."], [target_text]))
  (src, tgt), = list(cache.tokenize_pairs(text, tokenizer, what=None))
  assert src.to_list() == tokenizer.source.tokenize(["A dog runs ."]).to_list()
  expected = tokenizer.target.tokenize([target_text])
  assert tgt.to_list() == expected.to_list()
  assert tgt.to_list() != tokenizer.source.tokenize([target_text]).to_list()
  # Outputs are detokenized with the target's model.
  assert tokenizer.detokenize(expected).numpy()[0].decode() == target_text
  # The cache key covers both models: a shared vocabulary's cache is never reused.
  assert tokenizer_lib.tokenizer_digest(tokenizer) != tokenizer_lib.tokenizer_digest(
      tokenizer.source)


def test_the_model_sizes_each_side_by_its_vocabulary():
  config = ModelConfig(vocab_size=50, target_vocab_size=70, hidden_size=16, filter_size=32,
                       num_heads=2, num_hidden_layers=1, shared_embeddings=False)
  model = create_model(config)
  shapes = {v.path: tuple(v.shape) for v in model.weights if "embedding" in v.path
            or "softmax" in v.path}
  assert shapes["transformer/source_embedding/embeddings"] == (50, 16)
  assert shapes["transformer/target_embedding/embeddings"] == (70, 16)
  assert shapes["transformer/softmax/embeddings"] == (70, 16)
  logits = model({"inputs": tf.constant([[49, EOS_ID]]), "targets": tf.constant([[69, 5]])})
  assert logits.shape[-1] == 70
  # The decoder's input and output may still share one matrix.
  shared = create_model(dataclasses.replace(config, shared_decoder_embeddings=True))
  names = sorted(v.path for v in shared.weights if "embedding" in v.path or "softmax" in v.path)
  assert names == ["transformer/source_embedding/embeddings",
                   "transformer/target_embedding/embeddings"]
  assert shared.softmax_embedding is shared.target_embedding
  assert shared.count_params() == model.count_params() - 70 * 16


def test_shared_embeddings_and_other_bad_combinations_are_refused_naming_the_flags(
    tmp_path):
  with pytest.raises(ConfigError, match="--shared_embeddings cannot be used with "
                     "--separate_vocabularies.*--noshared_embeddings"):
    ModelConfig(vocab_size=50, target_vocab_size=70).validate()
  with pytest.raises(ConfigError, match="--source_pointer cannot be used with "
                     "--separate_vocabularies"):
    ModelConfig(vocab_size=50, target_vocab_size=70, shared_embeddings=False,
                source_pointer=True).validate()
  with pytest.raises(ConfigError, match="--target_vocab_size=500 .*add "
                     "--separate_vocabularies"):
    DataConfig(target_vocab_size=500).validate()
  with pytest.raises(ConfigError, match="--vocab_file=v.model .*--separate_vocabularies"):
    DataConfig(vocab_file="v.model", separate_vocabularies=True).validate()
  # The train command refuses before it builds anything (shared_embeddings is the
  # default of the paper's presets).
  result = inprocess.run("train", "--flagfile=flags/tiny.cfg", f"--model_dir={tmp_path}/m",
                         "--data_source=files", f"--train_src={tmp_path}/a",
                         f"--train_tgt={tmp_path}/b", "--separate_vocabularies")
  assert result.returncode == 2, result.stderr[-2000:]  # a usage error
  assert "--shared_embeddings cannot be used with --separate_vocabularies" in result.stderr
  assert not os.path.exists(tmp_path / "m" / "config.json")


def test_init_from_refuses_a_change_of_vocabulary_mode_naming_the_flags():
  from t2t_keras.errors import ModelDirError  # pylint: disable=import-outside-toplevel
  from t2t_keras.training import init_from  # pylint: disable=import-outside-toplevel
  shared, separate = DataConfig(source="files"), DataConfig(source="files",
                                                            separate_vocabularies=True)
  for vocab in ("source", "new"):
    with pytest.raises(ModelDirError, match="--init_from=old was trained with "
                       "--separate_vocabularies .* add --separate_vocabularies "
                       "--noshared_embeddings"):
      init_from.check_vocabularies("old", separate, shared, vocab)
    with pytest.raises(ModelDirError, match="--init_from=old was trained with one shared "
                       "vocabulary, this run with --separate_vocabularies: drop "
                       "--separate_vocabularies"):
      init_from.check_vocabularies("old", shared, separate, vocab)
  # Two and two: the parent's vocabularies (mapping new pieces is not written yet).
  with pytest.raises(ModelDirError, match="--init_from_vocab=new does not map yet: use "
                     "--init_from_vocab=source"):
    init_from.check_vocabularies("old", separate, separate, "new")
  init_from.check_vocabularies("old", separate, separate, "source")
  init_from.check_vocabularies("old", shared, shared, "source")  # one shared: as before


def train_tiny(model_dir, files, *flags):
  """A few steps with two vocabularies (SOURCE_SIZE, TARGET_SIZE unless `flags` say)."""
  return inprocess.run(
      "train", "--hidden_size=16", "--filter_size=32", "--num_heads=2",
      "--num_hidden_layers=1", "--data_source=files",
      *(f"--{k}={v}" for k, v in files.items()), f"--model_dir={model_dir}",
      "--separate_vocabularies", "--noshared_embeddings", f"--vocab_size={SOURCE_SIZE}",
      f"--target_vocab_size={TARGET_SIZE}", "--max_length=40", "--batch_size=512",
      "--train_steps=2", "--log_every=1", "--eval_every=1000", "--eval_bleu_sentences=0",
      "--save_checkpoint_steps=2", "--show_examples=0", *flags)


@pytest.mark.slow
def test_fine_tuning_takes_both_vocabularies_of_a_two_vocabulary_parent(
    tmp_path, shared_data):
  """`--init_from` a model of two vocabularies onto other pairs: the run trains on both
  of the parent's (its own sizes ignored, nothing built), resumes on them, and a run
  of one shared vocabulary is refused before any step, naming the flags."""
  parent = tmp_path / "parent"
  result = train_tiny(parent, write_corpus(shared_data, str(tmp_path / "a"), train=800))
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  # Other pairs, whose own vocabularies would be other pieces of other sizes.
  other = write_corpus(shared_data, str(tmp_path / "b"), train=400)
  child = tmp_path / "child"
  result = train_tiny(child, other, f"--init_from={parent}", "--vocab_size=200",
                      "--target_vocab_size=250")
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert f"initialized from {parent}/ckpt-2" in result.stdout, result.stdout[-2000:]
  assert json.loads((child / "init_from.json").read_text())["vocabulary"] == "source"
  for name in ("vocab.source.model", "vocab.target.model"):
    assert (child / name).read_bytes() == (parent / name).read_bytes(), name
  assert not [n for n in os.listdir(child) if re.match(r"vocab\.\w+\.bpe", n)]
  config = json.loads((child / "config.json").read_text())["model"]
  assert (config["vocab_size"], config["target_vocab_size"]) == (SOURCE_SIZE, TARGET_SIZE)
  again = train_tiny(child, other, f"--init_from={parent}", "--train_steps=3")
  assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
  assert "resumed from" in again.stdout and "initialized from" not in again.stdout

  shared = tmp_path / "shared"
  result = inprocess.run(
      "train", "--flagfile=flags/tiny.cfg", "--data_source=files",
      *(f"--{k}={v}" for k, v in other.items()), f"--model_dir={shared}",
      f"--init_from={parent}", "--train_steps=2")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert "trained with --separate_vocabularies" in result.stderr, result.stderr[-2000:]
  assert "add --separate_vocabularies --noshared_embeddings" in result.stderr
  assert not tf.train.latest_checkpoint(str(shared))


def test_an_old_shared_vocabulary_model_dir_loads_unchanged(tiny_model_dir, tmp_path):
  """A model directory written before the flag existed: config.json without
  separate_vocabularies / target_vocab_size, one vocab.model."""
  old = tmp_path / "old"
  shutil.copytree(tiny_model_dir, old)
  path = old / "config.json"
  record = json.loads(path.read_text())
  del record["model"]["target_vocab_size"]
  del record["data"]["separate_vocabularies"], record["data"]["target_vocab_size"]
  path.write_text(json.dumps(record))
  assert "vocab.model" in os.listdir(old) and "vocab.source.model" not in os.listdir(old)
  loaded = loading.load(str(old))
  assert isinstance(loaded.tokenizer, tokenizer_lib.SentencePieceTokenizer)
  assert loaded.model_config.target_vocab_size == 0
  assert loaded.model_config.output_vocab_size == loaded.model_config.vocab_size
  assert loaded.tokenizer.source is loaded.tokenizer.target is loaded.tokenizer
  fresh = loading.load(tiny_model_dir)
  for a, b in zip(loaded.model.weights, fresh.model.weights):
    assert a.path == b.path and bool(tf.reduce_all(a.value == b.value))


@pytest.mark.slow
def test_train_decode_score_and_export_with_two_vocabularies(tmp_path, shared_data):
  """A few steps of training with two vocabularies of different sizes; the decode
  command's translations (target script), the SavedModel loaded as TF Serving loads
  it (equal to them), scoring, and the CTranslate2 export (equal greedy outputs).
  120 steps: the first words in the target's script (at 40, every translation was
  empty, so every check on them held whatever they were)."""
  files = write_corpus(shared_data, str(tmp_path / "my"))
  model_dir = tmp_path / "model"
  decode_flags = ["--beam_size=2", "--alpha=0.6", "--extra_decode_length=5"]
  result = inprocess.run(
      "train", "--hidden_size=32", "--filter_size=64", "--num_heads=4",
      "--num_hidden_layers=2", "--layer_prepostprocess_dropout=0", "--data_source=files",
      *(f"--{k}={v}" for k, v in files.items()), f"--model_dir={model_dir}",
      "--separate_vocabularies", "--noshared_embeddings", "--shared_decoder_embeddings",
      f"--vocab_size={SOURCE_SIZE}",
      f"--target_vocab_size={TARGET_SIZE}", "--max_length=40", "--batch_size=2048",
      "--learning_rate=1", "--learning_rate_warmup_steps=60", "--train_steps=120",
      "--log_every=40", "--eval_every=120", "--eval_bleu_sentences=4",
      "--save_checkpoint_steps=120", "--show_examples=0", *decode_flags)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert re.search(r"eval at step 120: loss .* \| bleu \d", result.stdout), result.stdout[-2000:]
  names = sorted(os.listdir(model_dir))
  assert "vocab.source.model" in names and "vocab.target.model" in names
  assert "vocab.model" not in names
  config = json.loads((model_dir / "config.json").read_text())
  assert config["data"]["separate_vocabularies"] is True
  loaded = loading.load(str(model_dir))
  assert isinstance(loaded.tokenizer, tokenizer_lib.PairTokenizer)
  assert config["model"]["vocab_size"] == loaded.tokenizer.vocab_size
  assert config["model"]["target_vocab_size"] == loaded.tokenizer.target_vocab_size
  assert loaded.tokenizer.vocab_size != loaded.tokenizer.target_vocab_size

  # Decode: sources tokenized with the source's model, outputs in the target's script.
  (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
  result = inprocess.run("decode", f"--model_dir={model_dir}",
                         f"--input_file={tmp_path / 'in.txt'}",
                         f"--output_file={tmp_path / 'out.txt'}", *decode_flags)
  assert result.returncode == 0, result.stderr[-3000:]
  decoded = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
  assert len(decoded) == len(SENTENCES)
  # Every translation is text of the target's script: not empty, Cyrillic, no Latin
  # letter (the target's vocabulary has none; the source's pieces would be Latin).
  assert all(CYRILLIC.search(line) and not LATIN.search(line) for line in decoded), decoded
  # A target prefix is tokenized with the target's model and the output detokenized
  # with it: the translations start with the prefix, in the target's script (with the
  # source's model, its letters would be unknown pieces).
  prefix = cyrillic("ein skateboardfahrer")  # a word of several target pieces
  (tmp_path / "prefix.txt").write_text(f"{prefix}\n" * len(SENTENCES), encoding="utf-8")
  result = inprocess.run("decode", f"--model_dir={model_dir}",
                         f"--input_file={tmp_path / 'in.txt'}",
                         f"--target_prefix_file={tmp_path / 'prefix.txt'}",
                         f"--output_file={tmp_path / 'prefixed.txt'}",
                         f"--output_alignments={tmp_path / 'align.txt'}", *decode_flags)
  assert result.returncode == 0, result.stderr[-3000:]
  prefixed = (tmp_path / "prefixed.txt").read_text(encoding="utf-8").splitlines()
  assert len(prefixed) == len(SENTENCES)
  assert all(line.startswith(prefix) for line in prefixed), prefixed
  # Alignments count words: source words by the source's pieces, target words by the
  # target's (each side's "▁" pieces).
  alignments = (tmp_path / "align.txt").read_text(encoding="utf-8").splitlines()
  for source, output, line in zip(SENTENCES, prefixed, alignments):
    pairs = [tuple(map(int, pair.split("-"))) for pair in line.split()]
    assert pairs and max(i for i, _ in pairs) < len(source.split())
    assert max(j for _, j in pairs) == len(output.split()) - 1, (output, line)

  # Score: the decode's own outputs as targets (tokenized with the target's model).
  (tmp_path / "hyp.txt").write_text("\n".join(decoded) + "\n", encoding="utf-8")
  result = inprocess.run("score", f"--model_dir={model_dir}",
                         f"--source_file={tmp_path / 'in.txt'}",
                         f"--target_file={tmp_path / 'hyp.txt'}")
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [line.split("\t") for line in result.stdout.splitlines()]
  assert len(rows) == len(SENTENCES) and all(float(total) < 0 for total, _ in rows)
  # Each target counted in the target's pieces (+ EOS).
  assert [int(n) for _, n in rows] == [
      len(ids) + 1 for ids in loaded.tokenizer.target.tokenize(decoded).to_list()]

  # The SavedModel, loaded as TF Serving loads it: the same translations.
  export_dir = tmp_path / "export"
  result = inprocess.run("export", f"--model_dir={model_dir}", f"--export_dir={export_dir}",
                         *decode_flags)
  assert result.returncode == 0, result.stderr[-3000:]
  (version,) = os.listdir(export_dir)
  assets = sorted(os.listdir(export_dir / version / "assets"))
  assert "vocab.source.model" in assets and "vocab.target.model" in assets
  card = json.loads((export_dir / version / "assets.extra" / "model_card.json").read_text())
  assert card["vocab_size"] == loaded.tokenizer.vocab_size
  assert card["target_vocab_size"] == loaded.tokenizer.target_vocab_size
  session = SessionModel(str(export_dir / version))
  served = session.run(inputs=SENTENCES)["outputs"]
  assert [s.decode("utf-8") for s in served] == decoded
  served = session.run("translate_with_prefix", inputs=SENTENCES,
                       target_prefix=[prefix] * len(SENTENCES))["outputs"]
  assert [s.decode("utf-8") for s in served] == prefixed

  # CTranslate2: both vocabularies, both SentencePiece models; greedy outputs equal ours.
  pytest.importorskip("ctranslate2")
  ct2_dir = tmp_path / "ct2"
  result = inprocess.run("export", f"--model_dir={model_dir}", f"--export_dir={ct2_dir}",
                         "--format=ctranslate2")
  assert result.returncode == 0, result.stderr[-3000:]
  assert {"source.model", "target.model"} <= set(os.listdir(ct2_dir))
  import ctranslate2  # pylint: disable=import-outside-toplevel
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  translator = ctranslate2.Translator(str(ct2_dir), device="cpu")
  source_sp = spm.SentencePieceProcessor(model_file=str(ct2_dir / "source.model"))
  target_sp = spm.SentencePieceProcessor(model_file=str(ct2_dir / "target.model"))
  # Its log-probabilities of the prefixed translations equal ours (the score command):
  # source embedding, target embedding and softmax each over its own vocabulary.
  (tmp_path / "prefixed_in.txt").write_text("\n".join(prefixed) + "\n", encoding="utf-8")
  result = inprocess.run("score", f"--model_dir={model_dir}",
                         f"--source_file={tmp_path / 'in.txt'}",
                         f"--target_file={tmp_path / 'prefixed_in.txt'}")
  assert result.returncode == 0, result.stderr[-3000:]
  ours = [float(line.split("\t")[0]) for line in result.stdout.splitlines()]
  sources = [source_sp.encode(s, out_type=str) for s in SENTENCES]
  targets = [target_sp.encode(t, out_type=str) for t in prefixed]
  theirs = [sum(r.log_probs) for r in translator.score_batch(sources, targets)]
  assert theirs == pytest.approx(ours, abs=1e-3)
  # t2t-ct2-translate tokenizes with source.model and detokenizes with target.model.
  result = inprocess.run("ct2_translate", f"--model={ct2_dir}",
                         f"--input_file={tmp_path / 'in.txt'}",
                         f"--output_file={tmp_path / 'ct2.txt'}", "--beam_size=1",
                         "--extra_decode_length=5")
  assert result.returncode == 0, result.stderr[-3000:]
  expected = [target_sp.decode_pieces(translator.translate_batch(
      [tokens], beam_size=1, max_decoding_length=len(tokens) + 5)[0].hypotheses[0])
              for tokens in sources]
  assert (tmp_path / "ct2.txt").read_text(encoding="utf-8").splitlines() == expected
