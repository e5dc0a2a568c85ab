"""Decoding with the real model: cached == uncached, XLA == eager, input order kept."""

import dataclasses
import io

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.inference import search as bs
from t2t_keras import console
from t2t_keras.inference import decoding, processors, translate
from t2t_keras.configs import DecodeConfig, ModelConfig
from t2t_keras.data.tokens.tokenizer import IntegerTokenizer
from t2t_keras.model import create_model
from t2t_keras.model.layers import decoder_step

V = 30


@pytest.fixture(scope="module")
def model():
  keras.utils.set_random_seed(3)
  return create_model(ModelConfig(vocab_size=V, hidden_size=16, filter_size=32, num_heads=2,
                                  num_hidden_layers=2, layer_prepostprocess_dropout=0.0))


@pytest.fixture(scope="module")
def pointer_model():
  """A model with a source pointer (random weights: its outputs copy some source
  tokens by chance; `test_source_pointers_follow_copies` checks the pointer itself)."""
  keras.utils.set_random_seed(4)
  return create_model(ModelConfig(vocab_size=V, hidden_size=16, filter_size=32,
                                  num_heads=2, num_hidden_layers=2,
                                  layer_prepostprocess_dropout=0.0, pre_norm=True,
                                  source_pointer=True))


@pytest.fixture(scope="module")
def relative_model():
  """Relative positions in self-attention (no absolute encoding); K = 3 < the
  lengths decoded, so clipped distances are exercised."""
  keras.utils.set_random_seed(5)
  return create_model(ModelConfig(vocab_size=V, hidden_size=16, filter_size=32,
                                  num_heads=2, num_hidden_layers=2,
                                  layer_prepostprocess_dropout=0.0,
                                  position_embedding="relative", max_relative_position=3))


@pytest.fixture
def models(model, pointer_model, relative_model):
  return {"plain": model, "pointer": pointer_model, "relative": relative_model}


def sources(rng, lengths):
  ids = np.full((len(lengths), max(lengths)), PAD_ID, np.int32)
  for b, n in enumerate(lengths):
    ids[b, :n - 1] = rng.integers(4, V, n - 1)
    ids[b, n - 1] = EOS_ID
  return ids


def uncached_scorer(model, inputs, beam, length):
  """Re-runs the full teacher-forced decoder on the whole prefix at every step."""
  encoded, mask = model.encode(inputs)
  encoded, mask = bs.tile_beams(encoded, beam), bs.tile_beams(mask, beam)
  rows = bs.tile_beams(tf.constant(inputs), beam)

  def fn(ids, index, prefix):
    # prefix holds the generated tokens; the token chosen last step goes at index - 1.
    position = tf.one_hot(index - 1, length, on_value=True, off_value=False)
    prefix = tf.where(position[None, :] & (index > 0), ids[:, None], prefix)
    logits = model.decode(prefix, encoded, mask, inputs=rows)
    return logits[:, index], prefix
  state = tf.zeros([inputs.shape[0] * beam, length], tf.int32)
  return fn, state


@pytest.mark.parametrize("beam,alpha,slotted,which", [
    (1, 0.0, False, "plain"), (4, 0.6, True, "plain"), (4, 0.6, False, "plain"),
    (10, 0.3, False, "plain"), (1, 0.0, False, "pointer"), (4, 0.6, True, "pointer"),
    (4, 0.6, False, "pointer"), (1, 0.0, True, "relative"), (4, 0.6, True, "relative"),
    (4, 0.6, False, "relative")])
@pytest.mark.slow
def test_cached_decoding_equals_uncached(models, beam, alpha, slotted, which,
                                         monkeypatch):
  # Both cache layouts: beam slots kept in place, and one row per hypothesis reordered.
  # With a source pointer, the search carries each hypothesis' pointer; the uncached
  # scorer recounts it from the prefix (Transformer.decode). With relative positions,
  # each step's distances (to slotted or grown positions) against teacher forcing's.
  model = models[which]
  monkeypatch.setattr(decoding, "MAX_SLOTTED_BEAM", max(beam, 4))
  inputs = sources(np.random.default_rng(0), [6, 3, 9])
  # return_beams: all K beams are final (compared below), not only the first.
  config = DecodeConfig(beam_size=beam, alpha=alpha, extra_decode_length=3,
                        return_beams=True)
  ids, scores = decoding.decode_ids(model, inputs,
                                    dataclasses.replace(config, jit_compile=slotted))
  length = inputs.shape[1] + 3
  fn, state = uncached_scorer(model, inputs, beam, length)
  limits = bs.tile_beams(tf.reduce_sum(tf.cast(inputs != PAD_ID, tf.int32), 1) + 3, beam)
  fn, state = processors.compose(fn, state, [processors.LengthLimit()], processors.Rows(
      inputs=bs.tile_beams(inputs, beam), limits=limits))
  start = tf.fill([3], BOS_ID)
  if beam == 1:
    want_ids, want_scores = bs.greedy_search(fn, start, state, length)
  else:
    want_ids, want_scores = bs.beam_search(fn, start, state, length, bs.Beam(beam, alpha=alpha))
  np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())
  np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-4, atol=1e-5)


def test_graph_beam_search_runs_position_0_on_a_row_per_sentence(model, monkeypatch):
  """Graph mode runs position 0 once per sentence and repeats its logits and cache K
  times (`GrowingCache._first_step`); the results are those of the step on all K rows.
  (Mutation: `_first_step` not taken: the rows of the first call are B * K.)"""
  inputs = sources(np.random.default_rng(4), [6, 3, 9])
  config = DecodeConfig(beam_size=3, extra_decode_length=4, return_beams=True)
  rows, step = [], model.decode_step

  def counting(ids, *args, **kwargs):
    rows.append(int(ids.shape[0]))
    return step(ids, *args, **kwargs)
  monkeypatch.setattr(model, "decode_step", counting)
  ids, scores = decoding.decode_ids(model, inputs, config)  # eagerly: shapes are known
  assert rows[0] == 3 and rows[1] == 9, rows
  monkeypatch.setattr(decoding.GrowingCache, "_first_step",
                      lambda self, *args: decoding.RowCache.step(self, *args))
  all_ids, all_scores = decoding.decode_ids(model, inputs, config)
  np.testing.assert_array_equal(ids.numpy(), all_ids.numpy())
  np.testing.assert_allclose(scores.numpy(), all_scores.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("beam,jit", [(1, False), (3, False), (1, True), (3, True)])
def test_search_attends_on_few_rows_as_by_products(model, monkeypatch, beam, jit):
  """With `attention_by_size` (the SavedModel's searches) each step chooses between
  elementwise attention (few rows) and batched products by size
  (`decoder_step.few_rows`; at run time in graph mode, when compiling under XLA): a
  search with every step on the one form finds what it finds with every step on the
  other, in both cache layouts of XLA (a row per hypothesis for greedy search, slots
  for beams). (Mutation: the elementwise form's probabilities unnormalised, or the
  slotted mask's queries and heads mixed up.)"""
  inputs = sources(np.random.default_rng(7), [6, 3, 9, 5])
  config = DecodeConfig(beam_size=beam, extra_decode_length=5, return_beams=True,
                        attention_by_size=True, jit_compile=jit, batch_size=4)

  def search(limit):
    monkeypatch.setattr(decoder_step, "FEW_ROWS_PRODUCTS", limit)
    ids, scores = decoding.make_decode_fn(model, config)(tf.constant(inputs))
    return ids.numpy(), scores.numpy()
  (ids, scores), (product_ids, product_scores) = search(2 ** 30), search(0)
  np.testing.assert_array_equal(ids, product_ids)
  np.testing.assert_allclose(scores, product_scores, rtol=1e-5, atol=1e-5)
  # The branch that runs is the one chosen: with the elementwise form broken, the
  # few-rows search changes and the products' does not.
  elementwise = decoder_step._few_rows_attention
  monkeypatch.setattr(decoder_step, "_few_rows_attention",
                      lambda *args: 3 * elementwise(*args))
  assert not np.allclose(search(2 ** 30)[1], product_scores, rtol=1e-3)
  np.testing.assert_allclose(search(0)[1], product_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["plain", "pointer", "relative"])
def test_padding_does_not_change_translations(models, which):
  model = models[which]
  inputs = sources(np.random.default_rng(1), [7, 4])
  config = DecodeConfig(beam_size=3, extra_decode_length=5, decode_length=12)
  ids, scores = decoding.decode_ids(model, inputs, config)
  alone_ids, alone_scores = decoding.decode_ids(model, inputs[1:, :4], config)
  np.testing.assert_array_equal(ids[1].numpy(), alone_ids[0].numpy())
  np.testing.assert_allclose(scores[1].numpy(), alone_scores[0].numpy(), rtol=1e-5)


@pytest.mark.parametrize("alpha,in_place", [(0.0, False), (0.6, False), (0.0, True)])
def test_first_beam_is_final_when_the_other_beams_are_not_asked_for(alpha, in_place):
  """Without --return_beams the search stops once every sentence's best is final: the
  first beam and its score are those of the search that finds all K (both cache
  layouts; EOS pushed up so that sentences end early, at different lengths)."""
  keras.utils.set_random_seed(6)
  eager = create_model(ModelConfig(vocab_size=V, hidden_size=16, filter_size=32,
                                   num_heads=2, num_hidden_layers=1))
  original = eager.softmax_embedding.logits
  eager.softmax_embedding.logits = (
      lambda x, kernel=None: original(x, kernel) + tf.one_hot(EOS_ID, V) * 1.5)
  inputs = sources(np.random.default_rng(5), [6, 2, 9, 4, 7, 3])
  first, everything = (decoding.decode_ids(
      eager, inputs, DecodeConfig(beam_size=4, alpha=alpha, extra_decode_length=12,
                                  min_decode_length=1, return_beams=all_beams,
                                  jit_compile=in_place))
                       for all_beams in (False, True))
  np.testing.assert_array_equal(first[0][:, 0].numpy(), everything[0][:, 0].numpy())
  np.testing.assert_allclose(first[1][:, 0].numpy(), everything[1][:, 0].numpy(),
                             rtol=1e-5, atol=1e-6)
  lengths = [len(translate.strip_ids(row)) for row in first[0].numpy()[:, 0]]
  assert len(set(lengths)) > 1 and min(lengths) < 12, lengths


@pytest.mark.slow
@pytest.mark.parametrize("which", ["plain", "pointer", "relative"])
def test_xla_decoding_equals_eager(models, which, monkeypatch):
  """Also as the batch halves (4 -> 2 -> 1, --decode_xla_halvings) while sentences of
  other lengths end: each row's cache, slot table, pointer and length limit go with it."""
  model = models[which]
  inputs = sources(np.random.default_rng(2), [5, 8, 2, 11])
  config = DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=4, return_beams=True)
  assert config.xla_halvings >= 2
  eager = decoding.decode_ids(model, inputs, config)
  # The same search run eagerly: its steps see the batch halve.
  rows, step = [], model.decode_step

  def counted(ids, *args, **kwargs):
    rows.append(int(ids.shape[0]))
    return step(ids, *args, **kwargs)
  monkeypatch.setattr(model, "decode_step", counted)
  xla_config = dataclasses.replace(config, jit_compile=True)
  in_place = decoding.decode_ids(model, inputs, xla_config)
  monkeypatch.undo()
  assert rows[0] == 8 and min(rows) < 8 and set(rows) <= {8, 4, 2}, rows
  np.testing.assert_array_equal(in_place[0].numpy(), eager[0].numpy())
  compiled = tf.function(lambda x: decoding.decode_ids(model, x, xla_config),
                         jit_compile=True, autograph=False)
  ids, scores = compiled(tf.constant(inputs))
  np.testing.assert_array_equal(ids.numpy(), eager[0].numpy())
  np.testing.assert_allclose(scores.numpy(), eager[1].numpy(), rtol=1e-4, atol=1e-5)


def test_xla_halvings_follow_the_flag_and_the_rows(model, monkeypatch):
  """--decode_xla_halvings=0 keeps every row to the end, with the same results; the
  halvings a batch can use are capped by its rows (none for one row)."""
  config = DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=4)
  assert [decoding.xla_halvings(config, rows) for rows in (None, 1, 2, 3, 4, 32)] == [
      2, 0, 1, 2, 2, 2]
  assert decoding.xla_halvings(DecodeConfig(xla_halvings=5), 4) == 2
  inputs = sources(np.random.default_rng(2), [5, 8, 2, 11])
  results, step = {}, model.decode_step
  for halvings in (0, 2):
    rows = []

    def counted(ids, *args, **kwargs):
      rows.append(int(ids.shape[0]))  # pylint: disable=cell-var-from-loop
      return step(ids, *args, **kwargs)
    monkeypatch.setattr(model, "decode_step", counted)
    results[halvings] = decoding.decode_ids(
        model, inputs, DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=4,
                                    xla_halvings=halvings, jit_compile=True))
    monkeypatch.undo()
    # Rows leave the loop in halvings (8 -> 4 -> 2), none without the flag; how many
    # halvings a batch takes depends on when its sentences end.
    assert rows[0] == 8 and rows == sorted(rows, reverse=True), (halvings, rows)
    assert (set(rows) == {8}) if halvings == 0 else ({8} < set(rows) <= {8, 4, 2}), rows
  for a, b in zip(results[0], results[2]):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_source_pointer_ensemble_of_one_equals_the_model(pointer_model):
  """An ensemble of a pointer model with itself translates as the model does (each
  member reads the pointer)."""
  from t2t_keras.inference.ensemble import Ensemble  # pylint: disable=import-outside-toplevel
  inputs = sources(np.random.default_rng(6), [7, 4])
  config = DecodeConfig(beam_size=3, extra_decode_length=5, decode_length=12)
  ids, scores = decoding.decode_ids(pointer_model, inputs, config)
  pair_ids, pair_scores = decoding.decode_ids(Ensemble([pointer_model, pointer_model]),
                                              inputs, config)
  np.testing.assert_array_equal(pair_ids.numpy(), ids.numpy())
  np.testing.assert_allclose(pair_scores.numpy(), scores.numpy(), rtol=1e-4, atol=1e-5)


def test_translate_keeps_input_order(model):
  rng = np.random.default_rng(4)
  sentences = [" ".join(str(t) for t in rng.integers(4, V, n)) for n in (9, 1, 5, 12, 3, 7)]
  sentences.append("")  # an empty line still gets a translation slot
  tokenizer = IntegerTokenizer(V)
  config = DecodeConfig(beam_size=2, extra_decode_length=4, batch_size=2)
  decode_fn = decoding.make_decode_fn(model, config)
  together = translate.translate(decode_fn, tokenizer, sentences, config, progress=False)
  assert len(together) == len(sentences)
  for sentence, result in zip(sentences, together):
    alone = translate.translate(decode_fn, tokenizer, [sentence], config,
                                progress=False)[0]
    assert result.texts == alone.texts
    np.testing.assert_allclose(result.scores, alone.scores, rtol=1e-4)
    assert len(result.texts) == 1  # the best: the other beam need not be final
    # An untrained model rarely ends early: the output stops at the sentence's limit.
    assert all(len(t.split()) <= len(sentence.split()) + 4 for t in result.texts)
  beams = dataclasses.replace(config, return_beams=True)
  every = translate.translate(decoding.make_decode_fn(model, beams), tokenizer, sentences,
                              beams, progress=False)
  assert [len(r.texts) for r in every] == [2] * len(sentences)
  assert [r.texts[0] for r in every] == [r.texts[0] for r in together]


@pytest.mark.slow
def test_translate_with_xla_equals_graph_and_compiles_once_per_width_bucket(model):
  # Lengths 1-40 tokens (+ EOS): width buckets 16, 32 and 64; 7 batches of 3, the last
  # one short (filler rows).
  rng = np.random.default_rng(6)
  lengths = [1, 2, 30, 3, 15, 14, 40, 5, 16, 8, 33, 20, 7, 4, 31, 9, 2, 6, 25]
  sentences = [" ".join(str(t) for t in rng.integers(4, V, n)) for n in lengths]
  tokenizer = IntegerTokenizer(V)
  config = DecodeConfig(beam_size=3, alpha=0.6, extra_decode_length=3, batch_size=3)
  graph = translate.translate(decoding.make_decode_fn(model, config), tokenizer, sentences,
                              config, progress=False)
  xla_config = DecodeConfig(beam_size=3, alpha=0.6, extra_decode_length=3, batch_size=3,
                            jit_compile=True)
  compiled = decoding.make_decode_fn(model, xla_config)
  shapes = []

  def decode_fn(inputs):  # XLA compiles once per distinct input shape
    shapes.append(tuple(inputs.shape))
    return compiled(inputs)
  xla = translate.translate(decode_fn, tokenizer, sentences, xla_config, progress=False)
  assert [r.texts for r in xla] == [r.texts for r in graph]
  np.testing.assert_allclose([r.scores for r in xla], [r.scores for r in graph],
                             rtol=1e-4, atol=1e-5)
  assert len(shapes) == 7 and set(shapes) == {(3, 16), (3, 32), (3, 64)}
  assert [decoding.padded_width(w) for w in (1, 16, 17, 33, 257)] == [16, 16, 32, 64, 512]


def test_token_budget_batches_hold_both_caps_and_change_no_translation(model):
  lengths = [3, 9, 4, 17, 2, 30, 5, 5]
  config = DecodeConfig(batch_size=3, batch_tokens=20)
  chunks = translate.batches(lengths, config)
  assert sorted(i for chunk in chunks for i in chunk) == list(range(len(lengths)))
  for chunk in chunks:
    longest = max(lengths[i] for i in chunk)
    assert len(chunk) <= 3 and (len(chunk) * longest <= 20 or len(chunk) == 1), chunk
  assert [30] in [[lengths[i] for i in c] for c in chunks]  # over the cap: alone
  assert translate.batches(lengths, DecodeConfig(batch_size=3)) == [
      [4, 0, 2], [6, 7, 1], [3, 5]]
  # Under XLA the budget counts padded widths (16 at least).
  assert all(len(c) == 1 for c in translate.batches(
      lengths, DecodeConfig(batch_size=3, batch_tokens=31, jit_compile=True)))
  # A random model's outputs are nearly flat: batches of other widths change the sums'
  # order, which can flip a near-tie. These sentences have none (about half of the
  # seeds tried do).
  rng = np.random.default_rng(6)
  sentences = [" ".join(str(t) for t in rng.integers(4, V, n)) for n in (2, 7, 3, 12, 5)]
  tokenizer = IntegerTokenizer(V)
  plain, budget = (translate.translate(decoding.make_decode_fn(model, config), tokenizer,
                                       sentences, config, progress=False)
                   for config in (DecodeConfig(beam_size=2, extra_decode_length=4,
                                               batch_size=4, batch_tokens=tokens)
                                  for tokens in (0, 16)))
  assert [t.texts for t in plain] == [t.texts for t in budget]


def test_progress_line_has_rate_and_eta():
  stream = io.StringIO()
  meter = console.Progress(10, stream=stream, every=0.0)
  meter.update(4)
  line = stream.getvalue()
  assert "4/10 sentences" in line and "sentences/s" in line and "eta" in line


@pytest.mark.slow
def test_exact_match_counts_sequences(model):
  # A dataset whose targets are the model's own greedy outputs: 100% exact match;
  # an all-PAD filler row (static-shape eval batches) is not counted.
  inputs = sources(np.random.default_rng(5), [4, 6, 3])
  config = DecodeConfig(beam_size=1, extra_decode_length=2)
  ids, _ = decoding.decode_ids(model, inputs, config)
  targets = ids[:, 0].numpy()
  batch = {"inputs": np.concatenate([inputs, np.zeros((1, inputs.shape[1]), np.int32)]),
           "targets": np.concatenate([targets, np.zeros((1, targets.shape[1]), np.int32)])}
  dataset = tf.data.Dataset.from_tensors(batch)
  accuracy, total, _ = translate.exact_match(model, dataset, config)
  assert (accuracy, total) == (1.0, 3)
  wrong = dict(batch, targets=np.where(batch["targets"] == EOS_ID, PAD_ID, 5))
  accuracy, _, _ = translate.exact_match(model, tf.data.Dataset.from_tensors(wrong), config)
  assert accuracy < 1.0


@pytest.mark.parametrize("beam,topk", [(1, 1), (4, 1), (1, 0)])
def test_min_decode_length_keeps_eos_away(beam, topk):
  """A decoder that wants to stop at once (EOS scores best everywhere) writes at least
  --min_decode_length tokens, and EOS comes right after them."""
  keras.utils.set_random_seed(4)
  eager = create_model(ModelConfig(vocab_size=V, hidden_size=16, filter_size=32,
                                   num_heads=2, num_hidden_layers=1))
  bias = eager.softmax_embedding  # push EOS far above every other token
  original = bias.logits
  bias.logits = lambda x, kernel=None: original(x, kernel) + tf.one_hot(EOS_ID, V) * 50.0
  try:
    inputs = sources(np.random.default_rng(1), [5, 3])
    for minimum in (0, 3):
      config = DecodeConfig(beam_size=beam, sampling_topk=topk, extra_decode_length=8,
                            min_decode_length=minimum)
      ids, _ = decoding.decode_ids(eager, inputs, config)
      # EOS's position, not strip_ids: a random model may write BOS, which it drops.
      lengths = [list(row).index(EOS_ID) for row in ids.numpy()[:, 0]]
      assert lengths == [minimum, minimum], (minimum, lengths)
  finally:
    bias.logits = original


@pytest.mark.slow
def test_decode_cli_chooses_graph_mode_for_beams_and_xla_for_greedy_from_many_sentences(
    tiny_model_dir, tmp_path, monkeypatch):
  """The decode command's default: beam search in graph mode (finished sentences leave
  the batch); greedy search with XLA from AUTO_XLA_SENTENCES sentences on, graph mode
  below; --decode_jit_compile / --nodecode_jit_compile force either, with the same
  translations; and so do several batches at a time (--decode_parallel_batches).

  The rule runs in-process with the threshold lowered to 24 sentences (the same code
  at a tenth of the decoding); several batches at a time run in a fresh process, the
  only place where the command can still set TensorFlow's threads per op."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  # pylint: disable-next=import-outside-toplevel
  from t2t_keras.inference import translator as policy  # the decode command's choices
  from tests import inprocess  # pylint: disable=import-outside-toplevel
  from tests.conftest import REPO_ROOT  # pylint: disable=import-outside-toplevel
  assert policy.AUTO_XLA_SENTENCES == 256  # README and the flag's help say 256
  many = 24
  monkeypatch.setattr(policy, "AUTO_XLA_SENTENCES", many)
  rng = np.random.default_rng(9)
  words = "a the man dog runs in park red small plays ball .".split()
  lines = [" ".join(rng.choice(words, rng.integers(2, 14))) for _ in range(many)]

  def decode(n, *flags, process=False):
    source, output = tmp_path / f"in{n}.txt", tmp_path / f"out{n}{''.join(flags)}.txt"
    source.write_text("".join(line + "\n" for line in lines[:n]), encoding="utf-8")
    args = [f"--model_dir={tiny_model_dir}", f"--input_file={source}",
            f"--output_file={output}", "--extra_decode_length=4", "--decode_batch_size=8",
            *flags]
    if process:
      result = subprocess.run([sys.executable, "-m", "t2t_keras.decode", *args],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                              check=False)
      assert "TensorFlow has started" not in result.stderr, result.stderr[-3000:]
    else:
      result = inprocess.run("decode", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    first = next(x for x in result.stderr.splitlines() if x.startswith("decoding "))
    return first, output.read_text(encoding="utf-8").splitlines()

  line, beams = decode(many)
  assert line.endswith("; graph mode (beam search drops finished sentences from the "
                       "batch; --decode_jit_compile for XLA))"), line
  line, forced = decode(many, "--decode_jit_compile")
  assert line.endswith("; XLA)"), line
  assert forced == beams and len(beams) == many
  line, greedy_xla = decode(many, "--beam_size=1")
  assert line.endswith(f"; XLA (one row per input from {many} sentences on; "
                       "--nodecode_jit_compile for graph mode))"), line
  line, greedy = decode(many, "--beam_size=1", "--nodecode_jit_compile")
  assert line.endswith("; graph mode)") and greedy == greedy_xla, line
  line, few = decode(many - 1, "--beam_size=1")
  assert "; graph mode (beam search drops" in line and few == greedy[:many - 1], line
  # --decode_parallel_batches: batches side by side (threads), the same translations in
  # input order as one batch at a time.
  line, side_by_side = decode(many, "--decode_parallel_batches=3", "--decode_batch_size=4",
                              process=True)
  assert "; 3 batches at a time, extra length" in line, line
  line, one = decode(many, "--decode_parallel_batches=1", "--decode_batch_size=4")
  assert "batches at a time" not in line and one == side_by_side == beams, line


def prefixes_of(ids, lengths):
  """(B, L) output ids -> (B, P) their first `lengths[b]` tokens, PAD after."""
  out = np.full((len(lengths), max(max(lengths), 1)), PAD_ID, np.int32)
  for b, n in enumerate(lengths):
    out[b, :n] = translate.strip_ids(ids[b])[:n]
  return out


@pytest.mark.parametrize("beam,in_place", [(1, False), (4, False), (4, True)])
def test_target_prefix_starts_the_output_and_the_search_goes_on_from_it(model, beam,
                                                                         in_place):
  """Each output starts with its row's prefix (rows with and without one in a batch);
  a row with an empty prefix, and (greedy) a row whose prefix is the model's own first
  words, get the unconstrained output; a foreign prefix changes what follows; the
  XLA layout agrees with the reordered one."""
  inputs = sources(np.random.default_rng(11), [6, 3, 9, 5])
  config = DecodeConfig(beam_size=beam, alpha=0.6, extra_decode_length=6,
                        min_decode_length=1)

  def decode(prefix=None):
    return decoding.decode_ids(model, inputs, dataclasses.replace(config, jit_compile=in_place),
                               target_prefix=prefix)
  # Under XLA one program serves every prefix of a shape (compiled once, not per call).
  prefixed = tf.function(decode, jit_compile=True, autograph=False) if in_place else decode

  def run(prefix=None):
    if prefix is None:
      ids, scores = (tf.function(decode, jit_compile=True, autograph=False)() if in_place
                     else decode())
    else:
      ids, scores = prefixed(prefix)
    return ids.numpy()[:, 0], scores.numpy()[:, 0]
  free, _ = run()
  foreign = np.array([[7, 7, 7], [9, 0, 0], [0, 0, 0], [12, 13, 0]], np.int32)
  own = prefixes_of(free, [2, 0, 1, 0])  # rows 1 and 3: no prefix; padded as foreign
  own = np.pad(own, ((0, 0), (0, foreign.shape[1] - own.shape[1])))
  with_own, _ = run(tf.constant(own))
  with_foreign, _ = run(tf.constant(foreign))
  if in_place:
    assert prefixed.experimental_get_tracing_count() == 1
  for b in range(len(inputs)):
    got = translate.strip_ids(with_foreign[b])
    want = [t for t in foreign[b] if t != PAD_ID]
    assert got[:len(want)] == want, (b, got, want)
    mine = [t for t in own[b] if t != PAD_ID]
    assert translate.strip_ids(with_own[b])[:len(mine)] == mine
  for b in (1, 3):  # empty own prefix: free
    np.testing.assert_array_equal(with_own[b][:free.shape[1]], free[b])
  np.testing.assert_array_equal(with_foreign[2][:free.shape[1]], free[2])
  if beam == 1:  # greedy: forcing its own choices changes nothing
    for b in range(len(inputs)):
      assert translate.strip_ids(with_own[b]) == translate.strip_ids(free[b])
  assert any(translate.strip_ids(with_foreign[b])[len(foreign[b][foreign[b] > 0]):]
             != translate.strip_ids(free[b]) for b in (0, 1, 3))
  if in_place:
    graph, _ = decoding.decode_ids(model, inputs, config, target_prefix=tf.constant(foreign))
    np.testing.assert_array_equal(with_foreign, graph.numpy()[:, 0])


def test_translate_with_target_prefixes_keeps_them_per_sentence(model):
  """translate(): prefixes follow their sentences through the length sort and the
  batches, and a prefix count that does not match is refused."""
  tokenizer = IntegerTokenizer(V)
  rng = np.random.default_rng(12)
  sentences = [" ".join(str(t) for t in rng.integers(4, V, n)) for n in (7, 2, 5, 9, 3)]
  prefixes = ["8 9", "", "10", "11 12 13", ""]
  config = DecodeConfig(beam_size=2, extra_decode_length=4, batch_size=2)
  decode_fn = decoding.make_decode_fn(model, config)
  results = translate.translate(decode_fn, tokenizer, sentences, config, progress=False,
                                target_prefixes=prefixes)
  free = translate.translate(decode_fn, tokenizer, sentences, config, progress=False)
  for result, prefix, alone in zip(results, prefixes, free):
    assert result.texts[0].startswith(prefix), (result.texts[0], prefix)
    if not prefix:
      assert result.texts == alone.texts
  with pytest.raises(ValueError, match="2 target prefixes for 5 sentences"):
    translate.translate(decode_fn, tokenizer, sentences, config, target_prefixes=["", ""])


@pytest.mark.slow
def test_decode_command_imports_leave_tensorflow_unstarted_and_cap_parallel_batches():
  """In a fresh process (the decode command's flags are its own):
  1. the decode command sets threads per op (--decode_parallel_batches) once its flags
     are read, which TensorFlow allows only before its runtime starts: no module of the
     package may make a tensor at import;
  2. any --decode_parallel_batches is capped at the input's batches; the default is 1
     with --output_alignments, and otherwise one per core up to
     AUTO_PARALLEL_BATCHES_MAX."""
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  code = """
import dataclasses, os
import t2t_keras.decode, t2t_keras.inference.translate, t2t_keras.inference.loading
import t2t_keras.inference.translator, t2t_keras.inference.bulk
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
print('unstarted')
from t2t_keras.inference import translator as decode
from t2t_keras.configs import DecodeConfig
config = DecodeConfig(batch_size=16, parallel_batches=4)
auto = dataclasses.replace(config, parallel_batches=0)
cores = min(decode.AUTO_PARALLEL_BATCHES_MAX, len(os.sched_getaffinity(0)))
print(decode.choose_parallel_batches(config, 5).parallel_batches,
      decode.choose_parallel_batches(auto, 400, alignments=True).parallel_batches,
      decode.choose_parallel_batches(config, 40).parallel_batches,
      decode.choose_parallel_batches(auto, 400).parallel_batches == cores)
"""
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["unstarted", "1", "1", "3", "True"], result.stdout


@pytest.mark.parametrize("beam_size", [1, 4])
def test_filler_rows_end_at_step_0(model, beam_size, monkeypatch):
  """A row of PAD alone fills a static-shape batch (XLA's padded batches): it is final
  after step 0, so it does not hold the search when the real sentences end early
  (here at step 0, their EOS pushed up; the filler's pushed down would otherwise run
  to its length limit). Run eagerly to count the steps; the real rows' results are
  those of the batch without the filler."""
  inputs = sources(np.random.default_rng(9), [5, 3])
  padded = np.concatenate([inputs, np.full((1, 5), PAD_ID, np.int32)])
  config = DecodeConfig(beam_size=beam_size, alpha=0.6, extra_decode_length=12,
                        min_decode_length=0, jit_compile=True, xla_halvings=0)
  plain = decoding.decode_ids(model, inputs, config)
  step, steps = model.decode_step, []

  def biased(ids, *args, **kwargs):  # rows stay in place: a full batch (no halving)
    logits, cache = step(ids, *args, **kwargs)
    real = tf.range(tf.shape(ids)[0]) < 2 * beam_size  # sentences 0 and 1
    steps.append(1)
    return logits + tf.where(real, 50.0, -50.0)[:, None] * tf.one_hot(EOS_ID, V), cache
  monkeypatch.setattr(model, "decode_step", biased)
  ids, scores = decoding.decode_ids(model, padded, config)
  assert len(steps) == 1, len(steps)
  np.testing.assert_array_equal(ids[2, 0, :2].numpy(), [EOS_ID, PAD_ID])
  monkeypatch.setattr(model, "decode_step", step)
  ids, scores = decoding.decode_ids(model, padded, config)
  np.testing.assert_array_equal(ids[:2].numpy(), plain[0].numpy())
  np.testing.assert_allclose(scores[:2].numpy(), plain[1].numpy(), atol=1e-6)


def test_only_a_row_of_pad_is_a_filler():
  """An empty real input (EOS alone) keeps its length limit (1 + the extra length);
  a row of PAD alone gets 1: EOS at position 0."""
  inputs = tf.constant([[EOS_ID, PAD_ID], [PAD_ID, PAD_ID], [5, EOS_ID]])
  _, limits = decoding._output_lengths(DecodeConfig(extra_decode_length=7), inputs, None,
                                       None)
  np.testing.assert_array_equal(limits.numpy(), [8, 1, 9])
