"""Sampling (decode --sampling_topk/--sampling_topp): reproducible for a seed, different
for another, independent of the batch, the same under XLA, drawn from the model's
distribution (top-k / nucleus restricted), scored with the model's log probability."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.inference.search import sampling
from t2t_keras.inference import decoding, scoring, translate
from t2t_keras.configs import DecodeConfig, ModelConfig
from t2t_keras.model import create_model

V = 30
SAMPLE = DecodeConfig(sampling_topk=0, extra_decode_length=6)


@pytest.fixture(scope="module")
def model():
  keras.utils.set_random_seed(5)
  return create_model(ModelConfig(vocab_size=V, hidden_size=16, filter_size=32, num_heads=2,
                                  num_hidden_layers=2, layer_prepostprocess_dropout=0.0))


def padded(rows):
  width = max(len(r) for r in rows) + 1
  out = np.full((len(rows), width), PAD_ID, np.int32)
  for b, row in enumerate(rows):
    out[b, :len(row)] = row
    out[b, len(row)] = EOS_ID
  return out


ROWS = [[5, 9, 12, 4], [7, 7], [20, 21, 22, 23, 24, 25]]


def sample(model, rows, config, keys=None, jit=False):
  fn = decoding.make_decode_fn(model, dataclasses.replace(config, jit_compile=jit))
  keys = np.arange(len(rows), dtype=np.int32) if keys is None else np.asarray(keys, np.int32)
  ids, scores = fn(tf.constant(padded(rows)), tf.constant(keys))
  return ids.numpy(), scores.numpy()


@pytest.mark.slow
def test_same_seed_same_samples_another_seed_others(model):
  config = dataclasses.replace(SAMPLE, num_samples=3)
  ids, scores = sample(model, ROWS, config)
  assert ids.shape[:2] == (3, 3) and scores.shape == (3, 3)
  again, again_scores = sample(model, ROWS, config)
  np.testing.assert_array_equal(ids, again)
  np.testing.assert_allclose(scores, again_scores, rtol=1e-5)
  other, _ = sample(model, ROWS, dataclasses.replace(config, seed=2))
  assert not np.array_equal(ids, other)
  # The samples of one input differ from each other.
  assert any(not np.array_equal(ids[b, 0], ids[b, 1]) for b in range(3))


@pytest.mark.slow
def test_samples_do_not_depend_on_the_batch(model):
  """An input's samples depend on the seed and its key, not on its batch-mates or on
  the padding its batch needs."""
  config = dataclasses.replace(SAMPLE, num_samples=2)
  keys = [10, 11, 12]
  ids, scores = sample(model, ROWS, config, keys)
  for b, row in enumerate(ROWS):
    alone, alone_scores = sample(model, [row], config, [keys[b]])
    width = min(alone.shape[-1], ids.shape[-1])
    np.testing.assert_array_equal(alone[0, :, :width], ids[b, :, :width])
    assert np.all(ids[b, :, width:] == PAD_ID)
    np.testing.assert_allclose(alone_scores[0], scores[b], rtol=1e-4, atol=1e-4)
  reordered, _ = sample(model, ROWS[::-1], config, keys[::-1])
  np.testing.assert_array_equal(reordered[::-1], ids)


@pytest.mark.slow
def test_xla_sampling_equals_graph(model):
  config = dataclasses.replace(SAMPLE, sampling_topk=5, sampling_temperature=0.7)
  graph, graph_scores = sample(model, ROWS, config)
  xla, xla_scores = sample(model, ROWS, config, jit=True)
  np.testing.assert_array_equal(graph, xla)
  np.testing.assert_allclose(graph_scores, xla_scores, rtol=1e-4, atol=1e-4)


def first_token_frequencies(model, config, n=6000):
  rows = [[5, 9, 12]] * n
  ids, _ = sample(model, rows, dataclasses.replace(config, extra_decode_length=1))
  return np.bincount(ids[:, 0, 0], minlength=V) / n


def first_token_logits(model):
  """The model's logits for the first output token, by teacher forcing (another path
  than the cached decoder the sampler uses)."""
  logits = model({"inputs": tf.constant(padded([[5, 9, 12]])),
                  "targets": tf.constant([[EOS_ID]], tf.int32)})
  logits = logits.numpy()[0, 0].astype(np.float64)
  logits[[PAD_ID, BOS_ID]] = -np.inf  # never outputs: the sampler excludes them
  return logits


def softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


@pytest.mark.parametrize("topk,topp,temperature", [(0, 1.0, 1.0), (0, 1.0, 2.5),
                                                   (3, 1.0, 1.0), (0, 0.3, 1.0)])
def test_samples_follow_the_model_distribution(model, topk, topp, temperature):
  """Over 6,000 samples of the first token, the frequencies match the model's
  distribution at that temperature, restricted to the top-k or nucleus, renormalised
  (total variation well below what a wrong distribution gives)."""
  logits = first_token_logits(model)
  expected = softmax(logits / temperature)
  order = np.argsort(-logits, kind="stable")
  keep = np.ones(V, bool)
  if topk:
    keep[order[topk:]] = False
  if topp < 1.0:
    cumulative = np.cumsum(softmax(logits / temperature)[order])
    kept = int(np.sum(np.concatenate([[0.0], cumulative[:-1]]) < topp))
    keep[order[kept:]] = False
    assert 1 < kept < V - 2  # the test has a real nucleus to check
  expected = np.where(keep, expected, 0.0)
  expected /= expected.sum()
  got = first_token_frequencies(model, dataclasses.replace(
      SAMPLE, sampling_topk=topk, sampling_topp=topp, sampling_temperature=temperature))
  assert np.all(got[~keep] == 0.0), "a token outside the top-k / nucleus was drawn"
  distance = 0.5 * np.abs(got - expected).sum()
  assert distance < 0.06, (distance, got, expected)
  # The same test catches a sampler that ignores the temperature or the filter.
  if temperature != 1.0 or topk or topp < 1.0:
    plain = softmax(logits)  # what a sampler that ignored the settings would draw
    assert 0.5 * np.abs(got - plain).sum() > 0.08


@pytest.mark.slow
def test_sample_scores_are_the_model_log_probabilities(model):
  """A sample's score is its log probability under the model (no temperature), as
  teacher forcing computes it (the sampler runs the cached decoder)."""
  # 16 samples a row: those that reach the length limit (EOS forced, scored 0) are
  # left out, and a random model at temperature 1.5 writes many such.
  config = dataclasses.replace(SAMPLE, num_samples=16, sampling_temperature=1.5,
                               extra_decode_length=30)
  ids, scores = sample(model, ROWS, config)
  checked = 0
  for b, row in enumerate(ROWS):
    limit = len(row) + 1 + config.extra_decode_length
    for s in range(config.num_samples):
      out = translate.strip_ids(ids[b, s])
      if len(out) + 1 >= limit:
        continue  # EOS forced at the limit: scored 0 by the decoder
      (forced,) = scoring.force(model, [row + [EOS_ID]], [out + [EOS_ID]])
      assert forced.total == pytest.approx(float(scores[b, s]), abs=1e-3)
      checked += 1
  assert checked >= 6


def test_filter_logits_keeps_top_k_and_nucleus():
  logits = tf.constant([[4.0, 3.0, 2.0, 1.0, 0.0]])
  top2 = sampling.filter_logits(logits, topk=2).numpy()[0]
  assert list(top2[:2]) == [4.0, 3.0] and np.all(top2[2:] == sampling.NEG_INF)
  probs = softmax(np.array([4.0, 3.0, 2.0, 1.0, 0.0]))  # 0.64, 0.24, 0.09, ...
  nucleus = sampling.filter_logits(logits, topp=0.7).numpy()[0]  # 0.64 < 0.7: two tokens
  assert probs[0] < 0.7 < probs[0] + probs[1]
  assert list(nucleus[:2]) == [4.0, 3.0] and np.all(nucleus[2:] == sampling.NEG_INF)
  single = sampling.filter_logits(logits, topp=0.5).numpy()[0]  # the top token alone
  assert single[0] == 4.0 and np.all(single[1:] == sampling.NEG_INF)


def test_row_uniform_is_uniform_and_keyed():
  u = sampling.row_uniform(7, tf.range(200), 3, 1000).numpy()
  assert u.min() > 0.0 and u.max() < 1.0
  counts = np.histogram(u, bins=10, range=(0, 1))[0]
  assert np.all(np.abs(counts - 20000) < 600)  # 200,000 values: sd ~ 134 per bin
  np.testing.assert_array_equal(sampling.row_uniform(7, tf.constant([5]), 3, 1000).numpy()[0],
                                u[5])
  assert not np.array_equal(sampling.row_uniform(8, tf.range(200), 3, 1000).numpy(), u)
  assert not np.array_equal(sampling.row_uniform(7, tf.range(200), 4, 1000).numpy(), u)


def test_sampling_settings_are_validated():
  with pytest.raises(ValueError, match="--num_samples=3 needs sampling"):
    DecodeConfig(num_samples=3).validate()
  with pytest.raises(ValueError, match=r"--sampling_topp=0.0 must be in \(0, 1\]"):
    DecodeConfig(sampling_topp=0.0).validate()
  with pytest.raises(ValueError, match="--sampling_temperature=0.0 must be > 0"):
    DecodeConfig(sampling_topk=0, sampling_temperature=0.0).validate()
  assert DecodeConfig(sampling_topp=0.9).sampling and not DecodeConfig().sampling


def test_decode_cli_samples_reproducibly_whatever_the_batching(tiny_model_dir, tmp_path):
  """The user's path: `decode --sampling_topk=0 --seed=S` twice with other batch sizes
  (so each sentence meets other batch-mates and padding) gives the same lines; another
  seed gives others; --num_samples=3 writes 3 scored samples per input."""
  from tests import inprocess  # pylint: disable=import-outside-toplevel
  src = tmp_path / "src.txt"
  src.write_text("a man runs in the park\nthe dog plays with a red ball .\nsmall cat\n"
                 "a woman sits on the big street\nthe cat\n", encoding="utf-8")

  def decode(name, *args):
    out = tmp_path / name
    result = inprocess.run("decode", f"--model_dir={tiny_model_dir}", f"--input_file={src}",
                           f"--output_file={out}", "--extra_decode_length=6",
                           "--sampling_topk=0", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return out.read_text(encoding="utf-8")

  first = decode("a.txt", "--seed=3", "--decode_batch_size=32")
  assert len(first.splitlines()) == 5
  assert decode("b.txt", "--seed=3", "--decode_batch_size=2") == first
  assert decode("c.txt", "--seed=4") != first
  many = decode("d.txt", "--seed=3", "--num_samples=3").split("\n\n")
  assert len([block for block in many if block.strip()]) == 5
  for block in many[:5]:
    lines = block.strip("\n").splitlines()
    assert len(lines) == 3 and all(float(l.split("\t")[0]) < 0 for l in lines)
