"""The transformers export (--format=huggingface): transformers must compute our model.

- Teacher-forced logits of `AutoModelForSeq2SeqLM.from_pretrained(D)` equal ours to
  1e-4 for a post-norm model (MarianMT) and a pre-norm one (Pegasus), with one shared
  vocabulary and with separate ones, each built in-process.
- The permutation of the model dimension and the embeddings' scale are both needed.
- `AutoTokenizer.from_pretrained(D)` gives our tokenizer's ids on real text, and
  decodes them back as ours does.
- On a trained model, transformers' beam search (beam 4, no length penalty) writes the
  decode command's outputs (--alpha=0).

transformers and torch are an optional extra (`pip install -e ".[huggingface]"`); CI
runs this file in a lane of its own (.ci/huggingface). Elsewhere it is skipped when
transformers is missing.
"""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from t2t_keras.configs import DecodeConfig, ModelConfig
from t2t_keras.data.tokens import tokenizer as tokenizer_lib
from t2t_keras import export
from t2t_keras.errors import ExportError
from t2t_keras.export import huggingface as hf
from t2t_keras.model import create_model
from tests import inprocess

transformers = pytest.importorskip(
    "transformers", reason='transformers is not installed: pip install -e ".[huggingface]" '
    "(CI runs this file in .ci/huggingface's lane)")
torch = pytest.importorskip("torch", reason='torch is not installed: pip install -e '
                            '".[huggingface]"')

VOCAB, TARGET_VOCAB = 40, 30
BASE = ModelConfig(vocab_size=VOCAB, hidden_size=32, filter_size=64, num_heads=4,
                   num_hidden_layers=2, layer_prepostprocess_dropout=0.0)
CONFIGS = {
    "post_norm_shared": BASE,  # the paper: MarianMT
    "post_norm_separate": dataclasses.replace(BASE, shared_embeddings=False,
                                              shared_decoder_embeddings=True,
                                              target_vocab_size=TARGET_VOCAB),
    "post_norm_untied_softmax": dataclasses.replace(BASE, shared_embeddings=False,
                                                    target_vocab_size=TARGET_VOCAB,
                                                    num_decoder_layers=1),
    "pre_norm_shared": dataclasses.replace(BASE, pre_norm=True),  # Pegasus
}


def _rows(vocab, n=6, seed=0):
  rng = np.random.default_rng(seed)
  return [list(rng.integers(4, vocab, size=rng.integers(2, 11))) + [EOS_ID]
          for _ in range(n)]


def _padded(rows):
  width = max(map(len, rows))
  return np.array([r + [PAD_ID] * (width - len(r)) for r in rows], np.int64)


class _Ids:
  """A tokenizer stand-in of the synthetic tasks' kind (no SentencePiece model)."""

  class _Side:
    model_proto = None

  source = target = _Side()


def _logits_both(tmp_path, config, permute=True, scale=True):
  """(ours, transformers') teacher-forced logits of a random model, at real positions."""
  keras.utils.set_random_seed(5)
  model = create_model(config)
  path = str(tmp_path / "hf")
  weights = hf.state_dict(model, config, permute=permute)
  if not scale:  # the mutation: embeddings without sqrt(d_model)
    files = {"config.json": hf._json({**hf.model_config(config), "scale_embedding": False})}
  else:
    files = {"config.json": hf._json(hf.model_config(config))}
  hf.write(weights, files, path)
  theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(path).eval()
  sources = _padded(_rows(config.vocab_size))
  targets = _padded(_rows(config.output_vocab_size, seed=1))
  ours = model({"inputs": tf.constant(sources), "targets": tf.constant(targets)}).numpy()
  decoder_inputs = np.concatenate([np.full_like(targets[:, :1], BOS_ID), targets[:, :-1]],
                                  axis=1)
  with torch.no_grad():
    output = theirs(input_ids=torch.tensor(sources),
                    attention_mask=torch.tensor(sources != PAD_ID),
                    decoder_input_ids=torch.tensor(decoder_inputs))
  real = targets != PAD_ID
  return ours[real], output.logits.numpy()[real], theirs


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_teacher_forced_logits_equal_ours(tmp_path, name):
  config = CONFIGS[name]
  ours, theirs, model = _logits_both(tmp_path, config)
  assert type(model).__name__ == ("PegasusForConditionalGeneration" if config.pre_norm
                                  else "MarianMTModel")
  assert ours.shape == theirs.shape == (ours.shape[0], config.output_vocab_size)
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


def test_the_permutation_and_the_embedding_scale_are_needed(tmp_path):
  for broken in (dict(permute=False), dict(scale=False)):
    ours, theirs, _ = _logits_both(tmp_path / str(len(broken)) / next(iter(broken)),
                                   BASE, **broken)
    assert np.abs(theirs - ours).max() > 1e-2, broken


@pytest.mark.parametrize("change,flag", [
    (dict(position_embedding="relative"), "--position_embedding=relative"),
    (dict(position_embedding="learned"), "--position_embedding=learned"),
    (dict(source_pointer=True), "--source_pointer"),
    (dict(key_size=16, value_size=16), "--key_size / --value_size"),
    (dict(pre_norm=True, shared_embeddings=False, target_vocab_size=TARGET_VOCAB),
     "--separate_vocabularies or --noshared_embeddings"),
])
def test_settings_transformers_cannot_compute_are_refused_naming_the_flag(change, flag):
  with pytest.raises(ExportError) as raised:
    hf.check_supported(dataclasses.replace(BASE, **change))
  assert flag in str(raised.value)


def test_generation_config_carries_the_recipe():
  generation = hf.generation_config(DecodeConfig(beam_size=5, alpha=0.0,
                                                 extra_decode_length=7,
                                                 max_input_length=20,
                                                 min_decode_length=1))
  assert generation["num_beams"] == 5 and generation["length_penalty"] == 0.0
  assert generation["max_new_tokens"] == 27 and generation["min_new_tokens"] == 1
  assert generation["decoder_start_token_id"] == BOS_ID
  assert generation["eos_token_id"] == EOS_ID and generation["pad_token_id"] == PAD_ID
  assert generation["forced_eos_token_id"] == EOS_ID  # at the limit, as ours


def _real_lines(shared_data, name, count=300):
  path = os.path.join(shared_data, name)
  with open(path, encoding="utf-8") as f:
    return [line.rstrip("\n") for _, line in zip(range(count), f) if line.strip()]


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_tokenizer_gives_our_ids_and_text_on_real_sentences(tmp_path, shared_data,
                                                            separate):
  english = _real_lines(shared_data, "multi30k/train.en")
  german = _real_lines(shared_data, "multi30k/train.de")
  if separate:
    source = tokenizer_lib.load_tokenizer(tokenizer_lib.train_sentencepiece(
        english, str(tmp_path / "en.model"), 300, user_defined_symbols=["<2de>"]))
    target = tokenizer_lib.load_tokenizer(tokenizer_lib.train_sentencepiece(
        german, str(tmp_path / "de.model"), 260))
    ours = tokenizer_lib.PairTokenizer(source, target)
  else:
    ours = tokenizer_lib.load_tokenizer(tokenizer_lib.train_sentencepiece(
        english + german, str(tmp_path / "v.model"), 400, user_defined_symbols=["<2de>"]))
  path = str(tmp_path / "hf")
  hf.write({"final_logits_bias": np.zeros((1, 1), np.float32)},
           hf.tokenizer_files(ours, ["de"], max_input_length=64), path)
  theirs = transformers.AutoTokenizer.from_pretrained(path)
  assert type(theirs).__name__ == "MarianTokenizer"
  held_out_en = _real_lines(shared_data, "multi30k/test2016.en", 200)
  held_out_de = _real_lines(shared_data, "multi30k/test2016.de", 200)
  encoded = theirs(held_out_en)["input_ids"]
  expected = ours.source.tokenize(tf.constant(held_out_en)).to_list()
  assert encoded == [ids + [EOS_ID] for ids in expected]
  tag = theirs(">>de<< " + held_out_en[0])["input_ids"]
  assert tag == [ours.source.tag_id("de")] + expected[0] + [EOS_ID]
  # Outputs: target ids (as generate writes them: BOS first, EOS last) back to text.
  # UNK is a special token in transformers, which skip_special_tokens drops (as every
  # transformers tokenizer does), where SentencePiece writes " ⁇ ": compared without.
  outputs = ours.target.tokenize(tf.constant(held_out_de)).to_list()
  assert sum(UNK_ID in ids for ids in outputs) <= 5
  outputs = [[i for i in ids if i != UNK_ID] for ids in outputs]
  text = theirs.batch_decode([[BOS_ID] + ids + [EOS_ID] for ids in outputs],
                             skip_special_tokens=True)
  ours_text = [t.decode() for t in ours.detokenize(
      tf.ragged.constant(outputs).to_tensor()).numpy()]
  assert text == ours_text
  assert sum(t == s for t, s in zip(text, held_out_de)) >= 0.9 * len(held_out_de)


@pytest.fixture(scope="module")
def exported(trained_reverse_dir, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("hf") / "model")
  result = inprocess.run("export", f"--model_dir={trained_reverse_dir}",
                         f"--export_dir={path}", "--format=huggingface", "--alpha=0")
  assert result.returncode == 0, result.stderr
  return path


@pytest.mark.slow  # trains the shared reverse model (conftest's rule)
def test_generate_writes_the_decode_commands_translations(trained_reverse_dir, exported,
                                                          tmp_path):
  for name in ("config.json", "generation_config.json", "model.safetensors", "README.md"):
    assert os.path.exists(os.path.join(exported, name)), name
  with open(os.path.join(exported, "generation_config.json"), encoding="utf-8") as f:
    assert json.load(f)["length_penalty"] == 0.0
  rng = np.random.default_rng(11)
  sources = [list(rng.integers(4, 20, size=rng.integers(3, 9))) for _ in range(40)]
  source_file, output_file = tmp_path / "in.txt", tmp_path / "out.txt"
  source_file.write_text("".join(" ".join(map(str, s)) + "\n" for s in sources))
  result = inprocess.run("decode", f"--model_dir={trained_reverse_dir}",
                         f"--input_file={source_file}",
                         f"--output_file={output_file}", "--beam_size=4", "--alpha=0")
  assert result.returncode == 0, result.stderr
  ours = [[int(t) for t in line.split()] for line in output_file.read_text().splitlines()]
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
  batch = _padded([s + [EOS_ID] for s in sources])
  with torch.no_grad():
    generated = model.generate(input_ids=torch.tensor(batch),
                               attention_mask=torch.tensor(batch != PAD_ID),
                               num_beams=4, length_penalty=0.0).numpy()
  theirs = []
  for row in generated:
    ids = [int(i) for i in row[1:]]  # after the decoder start (BOS)
    theirs.append(ids[:ids.index(EOS_ID)] if EOS_ID in ids else ids)
  assert len(ours) == len(theirs) == len(sources)
  assert theirs == ours
  assert sum(o == s[::-1] for o, s in zip(ours, sources)) >= 30  # a model that reverses


def test_the_command_refuses_flags_the_directory_cannot_carry():
  export.HUGGINGFACE.check_flags({name: 1 for name in export.HUGGINGFACE.carries})
  with pytest.raises(ExportError, match=r"--return_beams \(huggingface does not carry "
                                        r"it\): .*num_return_sequences"):
    export.HUGGINGFACE.check_flags({"return_beams": True})
  with pytest.raises(ExportError, match=r"--target_language .*>>de<<"):
    export.HUGGINGFACE.check_flags({"target_language": "de"})
  with pytest.raises(ExportError, match="--quantization is for --format=ctranslate2"):
    export.HUGGINGFACE.check_flags({"quantization": "int8"})


def test_exported_text_model_translates_text_as_decode_does(tiny_model_dir, tmp_path):
  """The whole directory from the command: AutoTokenizer and AutoModelForSeq2SeqLM
  turn text into the decode command's text (greedy, one sentence a batch, each output
  at most its source's length + 3 tokens, as decode's limit)."""
  path = str(tmp_path / "hf")
  result = inprocess.run("export", f"--model_dir={tiny_model_dir}", f"--export_dir={path}",
                         "--format=huggingface", "--beam_size=1", "--alpha=0",
                         "--extra_decode_length=3")
  assert result.returncode == 0, result.stderr
  assert "AutoModelForSeq2SeqLM.from_pretrained" in result.stdout
  with open(os.path.join(path, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  assert "pipeline_tag: translation" in readme and "parameters" in readme
  lines = ["the man runs in the park .", "ein Hund spielt", "a small red ball"]
  source_file, output_file = tmp_path / "in.txt", tmp_path / "out.txt"
  source_file.write_text("\n".join(lines) + "\n")
  result = inprocess.run("decode", f"--model_dir={tiny_model_dir}",
                         f"--input_file={source_file}", f"--output_file={output_file}",
                         "--beam_size=1", "--alpha=0", "--extra_decode_length=3",
                         "--decode_batch_size=1")
  assert result.returncode == 0, result.stderr
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(path).eval()
  theirs = []
  for line in lines:
    batch = tokenizer([line], return_tensors="pt")
    with torch.no_grad():
      generated = model.generate(**batch, num_beams=1,
                                 max_new_tokens=batch["input_ids"].shape[1] + 3)
    theirs.append(tokenizer.decode(generated[0], skip_special_tokens=True))
  assert theirs == output_file.read_text().splitlines()


def test_export_of_a_model_in_memory_loads_and_refuses_a_full_directory(tmp_path):
  keras.utils.set_random_seed(1)
  model = create_model(BASE)
  path = str(tmp_path / "hf")
  assert hf.export(model, BASE, _Ids(), path, DecodeConfig(beam_size=3)) == path
  assert sorted(os.listdir(path)) == ["README.md", "config.json", "generation_config.json",
                                      "model.safetensors"]  # no tokenizer: integer ids
  loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(path)
  assert loaded.generation_config.num_beams == 3
  with pytest.raises(ExportError, match="is not empty"):
    hf.export(model, BASE, _Ids(), path)
