"""Tests of t2t_keras.data.tokens.tokenizer: vocabulary building/reuse, in-graph tokenizers."""

import os

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, NUM_RESERVED_IDS, PAD_ID, UNK_ID
from t2t_keras.configs import DataConfig
from t2t_keras.data.tokens import tokenizer as tokenizer_lib

WORDS = ("the a house cat dog runs sleeps quickly under over small big green red "
         "Haus Katze Hund läuft schläft schnell unter über klein groß grün rot").split()


def _corpus(tmp_path, num_lines=300, seed=0):
  rng = np.random.default_rng(seed)
  src, tgt = [], []
  for _ in range(num_lines):
    words = rng.choice(WORDS, size=rng.integers(1, 10))
    src.append(" ".join(words))
    tgt.append(" ".join(reversed(words)).capitalize() + ".")
  paths = []
  for name, lines in (("train.en", src), ("train.de", tgt)):
    paths.append(str(tmp_path / name))
    with open(paths[-1], "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
  return paths, src, tgt


def _config(tmp_path, **kwargs):
  (src, tgt), _, _ = _corpus(tmp_path)
  kwargs.setdefault("vocab_size", 120)
  return DataConfig(source="files", train_src=src, train_tgt=tgt,
                    data_dir=str(tmp_path / "data"), **kwargs)


@pytest.mark.parametrize("vocab_type", ["bpe", "unigram"])
def test_round_trip_and_reserved_ids(tmp_path, vocab_type):
  config = _config(tmp_path, vocab_type=vocab_type)
  tok = tokenizer_lib.load_or_build_tokenizer(config)
  assert 60 < tok.vocab_size <= 120
  _, src, tgt = _corpus(tmp_path)
  texts = tf.constant(src[:50] + tgt[:50])
  ids = tok.tokenize(texts)
  assert isinstance(ids, tf.RaggedTensor) and ids.dtype == tf.int32
  flat = ids.flat_values.numpy()
  assert flat.min() >= NUM_RESERVED_IDS  # No PAD/EOS/UNK/BOS for in-vocabulary text.
  np.testing.assert_array_equal(tok.detokenize(ids).numpy(), texts.numpy())
  pieces = [tok._sp.id_to_string(i).numpy() for i in range(NUM_RESERVED_IDS)]
  assert pieces == [b"<pad>", b"</s>", b"<unk>", b"<s>"]


def test_detokenize_stops_at_eos_and_skips_pad_and_bos(tmp_path):
  tok = tokenizer_lib.load_or_build_tokenizer(_config(tmp_path))
  ids = tok.tokenize(tf.constant(["the cat", "a dog runs"])).to_list()
  dense = tf.constant([[BOS_ID] + ids[0] + [EOS_ID] + ids[1] + [PAD_ID],
                       ids[1] + [EOS_ID, PAD_ID, PAD_ID, PAD_ID] + ids[0][:1]])
  assert tok.detokenize(dense).numpy().tolist() == [b"the cat", b"a dog runs"]
  assert tok.detokenize(tf.constant(ids[1])).numpy() == b"a dog runs"  # Rank 1.
  beams = tf.stack([dense, dense])  # (B, K, T) like beam search output.
  assert tok.detokenize(beams).shape == (2, 2)


def test_unknown_characters_map_to_unk(tmp_path):
  tok = tokenizer_lib.load_or_build_tokenizer(_config(tmp_path))
  assert UNK_ID in tok.tokenize(tf.constant("the 猫")).numpy().tolist()


def test_vocabulary_is_reused_not_retrained(tmp_path, monkeypatch):
  config = _config(tmp_path)
  first = tokenizer_lib.load_or_build_tokenizer(config)
  path = tokenizer_lib.data_vocab_path(config)
  assert first.vocab_file == path and os.path.dirname(path) == config.data_dir
  assert os.path.isfile(os.path.splitext(path)[0] + ".vocab")
  stamp = os.stat(path).st_mtime_ns

  def fail(*args, **kwargs):
    raise AssertionError("vocabulary retrained")

  monkeypatch.setattr(tokenizer_lib, "train_sentencepiece", fail)
  second = tokenizer_lib.load_or_build_tokenizer(config)
  assert second.model_proto == first.model_proto and os.stat(path).st_mtime_ns == stamp
  # Another size or type is another vocabulary: it would be built.
  with pytest.raises(AssertionError, match="retrained"):
    tokenizer_lib.load_or_build_tokenizer(
        DataConfig(**{**config.__dict__, "vocab_size": 100}))


def test_vocabulary_found_without_training_files(tmp_path):
  config = _config(tmp_path)
  built = tokenizer_lib.load_or_build_tokenizer(config)
  os.remove(config.train_src)  # E.g. exporting on another machine.
  assert tokenizer_lib.data_vocab_path(config) == built.vocab_file
  assert tokenizer_lib.load_or_build_tokenizer(config).model_proto == built.model_proto
  with pytest.raises(tokenizer_lib.sources.DataError, match="does not exist"):
    tokenizer_lib.data_vocab_path(DataConfig(**{**config.__dict__, "vocab_size": 99}))


def test_explicit_vocab_file(tmp_path):
  vocab_file = str(tmp_path / "my" / "spm.model")
  config = _config(tmp_path, vocab_file=vocab_file)
  assert tokenizer_lib.load_or_build_tokenizer(config).vocab_file == vocab_file
  assert tokenizer_lib.load_tokenizer(vocab_file).vocab_size > NUM_RESERVED_IDS


def test_vocabulary_with_other_reserved_ids_is_rejected(tmp_path):
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  _, src, _ = _corpus(tmp_path)
  prefix = str(tmp_path / "foreign")
  spm.SentencePieceTrainer.train(sentence_iterator=iter(src), model_prefix=prefix,
                                 vocab_size=40, minloglevel=2)  # unk 0, bos 1, eos 2
  with pytest.raises(tokenizer_lib.sources.DataError, match="rebuild"):
    tokenizer_lib.load_tokenizer(prefix + ".model")


def test_sample_is_bounded_and_covers_both_sides():
  pairs = [(f"s{i}", f"t{i}") for i in range(1000)]
  sample = tokenizer_lib.sample_sentences(iter(pairs), max_sentences=100, seed=3)
  assert len(sample) == 100
  assert sum(s.startswith("s") for s in sample) == 50
  assert int(max(sample, key=lambda s: int(s[1:]))[1:]) > 500  # Not just a prefix.
  assert sample == tokenizer_lib.sample_sentences(iter(pairs), 100, seed=3)


def test_wordpiece_is_rejected_with_advice(tmp_path):
  with pytest.raises(ValueError, match="unigram"):
    tokenizer_lib.build_vocab(_config(tmp_path, vocab_type="wordpiece"))


def test_integer_tokenizer_round_trip():
  tok = tokenizer_lib.IntegerTokenizer(NUM_RESERVED_IDS + 10)
  ids = tok.tokenize(tf.constant(["4 5 13", "7", "14 x 2"]))
  assert ids.to_list() == [[4, 5, 13], [7], [UNK_ID, UNK_ID, UNK_ID]]
  padded = tf.constant([[4, 5, 13, EOS_ID, 6], [7, EOS_ID, 0, 0, 0]])
  assert tok.detokenize(padded).numpy().tolist() == [b"4 5 13", b"7"]
  assert tok.detokenize(ids[:2]).numpy().tolist() == [b"4 5 13", b"7"]


def test_tokenizer_exports_in_a_saved_model(tmp_path):
  tok = tokenizer_lib.load_or_build_tokenizer(_config(tmp_path))
  module = tf.Module()
  module.tok = tok
  module.round_trip = tf.function(
      lambda s: tok.detokenize(tok.tokenize(s).to_tensor()),
      input_signature=[tf.TensorSpec([None], tf.string)])
  os.remove(tok.vocab_file)  # The graph must carry the model, not a path.
  tf.saved_model.save(module, str(tmp_path / "export"))
  loaded = tf.saved_model.load(str(tmp_path / "export"))
  texts = ["the small cat sleeps", "Grün rot."]
  assert loaded.round_trip(tf.constant(texts)).numpy().tolist() == [
      t.encode() for t in texts]


def test_round_trip_on_real_sentences(tmp_path, shared_data):
  folder = os.path.join(shared_data, "multi30k")
  config = DataConfig(source="files", train_src=os.path.join(folder, "valid.en"),
                      train_tgt=os.path.join(folder, "valid.de"),
                      data_dir=str(tmp_path), vocab_size=2000)
  tok = tokenizer_lib.load_or_build_tokenizer(config)
  lines = []
  for path in (config.train_src, config.train_tgt):
    with open(path, encoding="utf-8") as f:
      lines += [line.rstrip("\n") for line in f][:300]
  plain = [line for line in lines if " ".join(line.split()) == line]  # Single spaces.
  assert len(plain) > 500
  ids = tok.tokenize(tf.constant(plain))
  assert ids.flat_values.numpy().min() >= NUM_RESERVED_IDS
  assert tok.detokenize(ids).numpy().tolist() == [line.encode() for line in plain]


def test_the_old_name_of_data_vocab_path_still_works_and_warns():
  """t2t_keras.data.vocab_path was renamed data_vocab_path (modeldir.vocab_path is a
  model directory's vocab.model); the old name stays one release."""
  import t2t_keras.data  # pylint: disable=import-outside-toplevel
  with pytest.warns(DeprecationWarning, match="renamed data_vocab_path"):
    assert t2t_keras.data.vocab_path is tokenizer_lib.data_vocab_path
  with pytest.raises(AttributeError):
    t2t_keras.data.no_such_name  # pylint: disable=pointless-statement
