"""Beam search against brute force on toy scorers whose state carries the history."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.inference import search as bs

VOCAB = 5  # 0 PAD, 1 EOS, 2..4 words
TABLE_ROWS = 97


def make_table(seed, eos_bias=0.0):
  table = np.random.RandomState(seed).normal(0, 2.0, (TABLE_ROWS, VOCAB)).astype(np.float32)
  table[:, PAD_ID] = -1e4  # the model never emits PAD
  table[:, EOS_ID] += eos_bias
  return table


def next_hash(h, token):
  return (h * 7 + token + 1) % 1009


def history_scorer(tables):
  """Logits depend on the whole prefix through a hash kept in the state (B*K,)."""
  tables = tf.constant(np.stack(tables))  # (B, rows, V): one table per sentence

  def fn(ids, index, state):
    del index
    h, row = state
    h = next_hash(h, ids)
    logits = tf.gather_nd(tables, tf.stack([row, h % TABLE_ROWS], axis=1))
    return logits, (h, row)
  return fn


def initial_state(batch, beam):
  return (tf.zeros([batch * beam], tf.int32),
          bs.tile_beams(tf.range(batch, dtype=tf.int32), beam))


def log_softmax(x):
  x = x - x.max()
  return x - np.log(np.exp(x).sum())


def brute_force(table, length, alpha):
  """Every sequence of words ending with EOS within `length`, best first."""
  results = []
  for n in range(length):
    for words in itertools.product(range(2, VOCAB), repeat=n):
      seq = list(words) + [EOS_ID]
      h, prev, total = 0, BOS_ID, 0.0
      for token in seq:
        h = next_hash(h, prev)
        total += log_softmax(table[h % TABLE_ROWS])[token]
        prev = token
      results.append((total / ((5.0 + len(seq)) / 6.0) ** alpha, seq))
  results.sort(key=lambda r: -r[0])
  return results


def run(tables, beam, length, alpha):
  batch = len(tables)
  ids, scores = bs.beam_search(history_scorer(tables), tf.fill([batch], BOS_ID),
                               initial_state(batch, beam), length, bs.Beam(beam, alpha=alpha))
  return ids.numpy(), scores.numpy()


def strip(seq):
  seq = list(seq)
  return seq[:seq.index(EOS_ID) + 1] if EOS_ID in seq else seq


def test_length_penalty_formula():
  assert float(bs.length_penalty(4, 0.6)) == pytest.approx((9 / 6) ** 0.6)
  assert float(bs.length_penalty(17, 0.0)) == 1.0


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_wide_beam_is_exhaustive_search(alpha):
  # 3 words, length 4: at most 27 word prefixes with 4 extensions each (3 words and
  # EOS), so with 2K = 128 >= 108 candidates per step nothing is ever pruned and the
  # search must return the 40 sequences of exhaustive search, in order.
  table = make_table(0)
  ids, scores = run([table], 64, 4, alpha)
  expected = brute_force(table, 4, alpha)
  assert len(expected) == 40
  for k in range(40):
    assert strip(ids[0, k]) == expected[k][1]
    assert scores[0, k] == pytest.approx(expected[k][0], rel=1e-5, abs=1e-5)


def test_finds_planted_best_that_greedy_misses():
  # Step 0: word 2 (p=0.55) beats word 3 (0.45). After 2 every next token is nearly
  # uniform; after 3, EOS is almost certain. The best sequence is [3, EOS].
  def fn(ids, index, state):
    first = tf.math.log(tf.constant([1e-9, 1e-9, 0.55, 0.45, 1e-9]))
    after_2 = tf.math.log(tf.constant([1e-9, 0.25, 0.25, 0.25, 0.25]))
    after_3 = tf.math.log(tf.constant([1e-9, 0.99, 0.005, 0.005, 1e-9]))
    logits = tf.where(tf.equal(index, 0), first,
                      tf.where(tf.equal(ids, 3)[:, None], after_3, after_2))
    return logits, state
  state = tf.zeros([2])
  greedy, _ = bs.greedy_search(fn, tf.fill([1], BOS_ID), tf.zeros([1]), 6)
  assert strip(greedy[0, 0].numpy())[0] == 2
  ids, scores = bs.beam_search(fn, tf.fill([1], BOS_ID), state, 6, bs.Beam(2, alpha=0.0))
  assert strip(ids[0, 0].numpy()) == [3, EOS_ID]
  assert scores[0, 0].numpy() == pytest.approx(np.log(0.45 * 0.99), rel=1e-4)


def test_beam_one_equals_greedy_when_eos_is_never_a_runner_up():
  # With 2K candidates, beam 1 also records an EOS that was second best; greedy never
  # does, so they agree exactly when EOS is either the arg-max or hopeless. Here EOS
  # is certain at a sentence-specific step and impossible before it.
  tables = [make_table(s) for s in range(4)]
  stop_at = tf.constant([3, 7, 1, 5])
  scorer = history_scorer(tables)

  def fn(ids, index, state):
    logits, state = scorer(ids, index, state)
    stop = tf.equal(index, tf.gather(stop_at, state[1]))[:, None]
    eos = tf.one_hot(EOS_ID, VOCAB, on_value=True, off_value=False)[None, :]
    return tf.where(eos, tf.where(stop, 1e4, -1e4), logits), state
  beam_ids, beam_scores = bs.beam_search(fn, tf.fill([4], BOS_ID), initial_state(4, 1), 12,
                                         bs.Beam(1, alpha=0.0))
  greedy_ids, greedy_scores = bs.greedy_search(fn, tf.fill([4], BOS_ID),
                                               initial_state(4, 1), 12)
  np.testing.assert_array_equal(beam_ids.numpy(), greedy_ids.numpy())
  np.testing.assert_allclose(beam_scores.numpy(), greedy_scores.numpy(), rtol=1e-5)
  assert [len(strip(s)) for s in greedy_ids[:, 0].numpy()] == [4, 8, 2, 6]


def test_sentences_are_independent_of_their_batch():
  tables = [make_table(s) for s in range(3)]
  ids, scores = run(tables, 4, 6, 0.6)
  for b, table in enumerate(tables):
    alone_ids, alone_scores = run([table], 4, 6, 0.6)
    np.testing.assert_array_equal(ids[b], alone_ids[0])
    np.testing.assert_allclose(scores[b], alone_scores[0], rtol=1e-6)


def test_beams_sorted_and_padded_after_eos():
  ids, scores = run([make_table(5)], 4, 8, 0.6)
  assert np.all(np.diff(scores[0]) <= 1e-6)
  for seq in ids[0]:
    seq = list(seq)
    if EOS_ID in seq:
      assert all(t == PAD_ID for t in seq[seq.index(EOS_ID) + 1:])


def test_stops_early_when_no_alive_beam_can_win():
  calls = []

  def fn(ids, index, state):  # EOS has probability 0.9 everywhere
    calls.append(1)
    return tf.math.log(tf.tile([[1e-9, 0.9, 0.04, 0.03, 0.03]], [tf.shape(ids)[0], 1])), state
  ids, _ = bs.beam_search(fn, tf.fill([2], BOS_ID), tf.zeros([8]), 50, bs.Beam(4, alpha=0.6))
  # Eager while_loop runs the body in Python: count the decoder calls.
  assert len(calls) < 6
  assert strip(ids[0, 0].numpy()) == [EOS_ID]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_one_result_is_the_full_searchs_best_in_fewer_steps(alpha):
  """num_results=1 stops when each sentence's best finished hypothesis beats every
  alive one: the best result (ids and score) is the full search's, over sentences that
  end early and late, and the search takes fewer steps."""
  tables = [make_table(s, eos_bias=bias) for s, bias in ((0, 1.5), (1, 0.0), (2, 3.0),
                                                          (3, -1.0))]
  counted = {}
  for results in (4, 1):
    calls = []
    scorer = history_scorer(tables)

    def fn(ids, index, state, scorer=scorer, calls=calls):
      calls.append(1)  # eager while_loop: the body runs in Python
      return scorer(ids, index, state)
    ids, scores = bs.beam_search(fn, tf.fill([len(tables)], BOS_ID),
                                 initial_state(len(tables), 4), 12,
                                 bs.Beam(4, alpha=alpha, num_results=results))
    counted[results] = (ids.numpy(), scores.numpy(), len(calls))
  (full_ids, full_scores, full_steps), (ids, scores, steps) = counted[4], counted[1]
  np.testing.assert_array_equal(ids[:, 0], full_ids[:, 0])
  np.testing.assert_allclose(scores[:, 0], full_scores[:, 0], rtol=1e-6)
  assert steps < full_steps, (steps, full_steps)
  with pytest.raises(ValueError, match="num_results"):
    bs.beam_search(history_scorer(tables), tf.fill([1], BOS_ID), initial_state(1, 2), 4,
                   bs.Beam(2, num_results=3))


def test_falls_back_to_alive_beams_when_nothing_finished():
  probs = [[1e-9, 1e-30, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]]

  def fn(ids, index, state):  # EOS never makes the 2K = 6 candidates
    return tf.math.log(tf.tile(probs, [tf.shape(ids)[0], 1])), state
  ids, scores = bs.beam_search(fn, tf.fill([1], BOS_ID), tf.zeros([3]), 4, bs.Beam(3, alpha=0.6))
  assert list(ids[0, 0].numpy()) == [2, 2, 2, 2]
  assert scores[0, 0].numpy() == pytest.approx(4 * np.log(0.3) / (9 / 6) ** 0.6, rel=1e-4)
  assert np.all(scores.numpy() > -1e3)


def test_compiles_with_xla_and_matches_eager():
  tables = [make_table(s) for s in range(2)]
  eager = run(tables, 4, 7, 0.6)

  @tf.function(jit_compile=True, autograph=False)
  def compiled():
    return bs.beam_search(history_scorer(tables), tf.fill([2], BOS_ID),
                          initial_state(2, 4), 7, bs.Beam(4, alpha=0.6))
  ids, scores = compiled()
  np.testing.assert_array_equal(ids.numpy(), eager[0])
  np.testing.assert_allclose(scores.numpy(), eager[1], rtol=1e-5)


@pytest.mark.parametrize("vocab,jit", [(8000, False), (32003, False), (32003, True)])
def test_top_k_rows_equals_top_k(vocab, jit):
  values = tf.random.stateless_normal([6, vocab], seed=[vocab, 1])
  # A row whose best values sit in one chunk, and a row of mostly equal values.
  values = tf.tensor_scatter_nd_update(values, [[1, 5], [1, 6], [1, 7]], [9.0, 8.0, 7.5])
  values = tf.concat([values, tf.fill([1, vocab], -1.0e9)], 0)
  values = tf.tensor_scatter_nd_update(values, [[6, vocab - 1]], [0.0])
  fn = tf.function(lambda v: bs.top_k_rows(v, 8), jit_compile=jit or None, autograph=False)
  got_values, got_ids = fn(values)
  want_values, want_ids = tf.math.top_k(values, 8)
  np.testing.assert_array_equal(got_values.numpy(), want_values.numpy())
  np.testing.assert_array_equal(got_ids.numpy()[:6], want_ids.numpy()[:6])
  assert got_ids.numpy()[6, 0] == vocab - 1
  np.testing.assert_array_equal(np.take_along_axis(values.numpy(), got_ids.numpy(), 1),
                                got_values.numpy())


@pytest.mark.parametrize("vocab", [8000, 32000, 32003, 50])
def test_top_k_log_probs_equal_log_softmax_then_top_k(vocab):
  logits = 4.0 * tf.random.stateless_normal([5, vocab], seed=[vocab, 2])
  logits = tf.concat([logits, tf.one_hot([3], vocab, 0.0, -1.0e9)], 0)  # one token left
  got_values, got_ids = tf.function(lambda v: bs.top_k_log_probs(v, 8), autograph=False)(logits)
  want_values, want_ids = tf.math.top_k(tf.nn.log_softmax(logits), 8)
  np.testing.assert_allclose(got_values.numpy(), want_values.numpy(), rtol=1e-6, atol=1e-5)
  np.testing.assert_array_equal(got_ids.numpy()[:5], want_ids.numpy()[:5])
  assert got_ids.numpy()[5, 0] == 3 and got_values.numpy()[5, 0] == 0.0


def test_chunks_divide_the_vocabulary_when_they_can():
  assert bs._chunk_size(8000, 128) == 125  # 64 chunks, no pad
  assert bs._chunk_size(32000, 128) == 128
  assert bs._chunk_size(32003, 128) == 128  # prime: padded
  assert 8000 % bs._chunk_size(8000, 128) == 0


@pytest.mark.parametrize("alpha,results,mode,halvings", [
    (0.0, 1, "eager", 2), (0.6, 4, "eager", 5), (0.6, 1, "xla", 3), (0.0, 4, "xla", 1)])
def test_halving_batch_gives_the_full_batchs_results(alpha, results, mode, halvings):
  """HalvingBatch (XLA's static-shape shrink): the batch halves (7 -> 4 -> 2 -> 1) as its
  sentences finish; each sentence's table row comes through `context` and its length
  limit through the state, so a row that followed the wrong sentence would score with
  another table. Its results are those of the search that keeps every sentence, under
  XLA as well, and the rows computed halve."""
  tables = [make_table(s, eos_bias=bias) for s, bias in
            ((0, 1.5), (1, 0.0), (2, 3.0), (3, -1.0), (4, 2.0), (5, 0.5), (6, -2.0))]
  batch, beam = len(tables), 4
  # Half of the logits from the table of the state's row, half from the context's.
  by_state, by_context = history_scorer(tables), history_scorer(tables[1:] + tables[:1])
  seen_rows = []

  def full_scorer(ids, index, state):
    h, row = state
    logits, (new_h, _) = by_state(ids, index, (h, row))
    return logits + by_context(ids, index, (h, row))[0], (new_h, row)

  def with_context(ids, index, state, context):
    seen_rows.append(ids.shape[0])
    h, row = state
    logits, (new_h, _) = by_state(ids, index, (h, row))
    logits += by_context(ids, index, (h, bs.tile_beams(context, beam)))[0]
    return logits, (new_h, row)

  def full():
    return bs.beam_search(full_scorer, tf.fill([batch], BOS_ID), initial_state(batch, beam),
                          12, bs.Beam(beam, alpha=alpha, num_results=results))

  def halved():
    return bs.beam_search(with_context, tf.fill([batch], BOS_ID), initial_state(batch, beam),
                          12, bs.Beam(beam, alpha=alpha, num_results=results,
                                      batch=bs.HalvingBatch(halvings)),
                          context=tf.range(batch))
  if mode == "xla":
    halved = tf.function(halved, jit_compile=True, autograph=False)
  (want_ids, want_scores), (ids, scores) = full(), halved()
  compared = slice(None) if results == beam else slice(0, 1)
  np.testing.assert_array_equal(ids.numpy()[:, compared], want_ids.numpy()[:, compared])
  np.testing.assert_allclose(scores.numpy()[:, compared], want_scores.numpy()[:, compared],
                             rtol=1e-6)
  if mode == "eager":
    sizes = [beam * size for size in (7, 4, 2, 1, 1, 1)[:halvings + 1]]
    assert seen_rows[0] == batch * beam and set(seen_rows) <= set(sizes), seen_rows
    assert min(seen_rows) < batch * beam, seen_rows


def test_halving_batch_keeps_sentences_that_reach_the_length_limit():
  """Sentences that never write EOS reach the length limit in the first loop, all of
  them still searching: each keeps its best hypothesis, as in the full search (none is
  left behind when the batch would halve)."""
  tables = [make_table(s, eos_bias=-1.0e4) for s in range(5)]
  scorer = history_scorer(tables)
  start, state = tf.fill([5], BOS_ID), initial_state(5, 2)
  want_ids, want_scores = bs.beam_search(scorer, start, state, 6, bs.Beam(2, alpha=0.6))
  ids, scores = bs.beam_search(scorer, start, state, 6,
                               bs.Beam(2, alpha=0.6, batch=bs.HalvingBatch(2)))
  np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())
  np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-6)
  assert (scores.numpy() > bs.NEG_INF / 2).all()


@pytest.mark.parametrize("alpha,results,graph", [(0.0, 1, False), (0.6, 1, True),
                                                 (0.6, 4, False), (0.0, 4, True)])
def test_shrinking_batch_gives_the_full_batchs_results(alpha, results, graph):
  """ShrinkingBatch drops each sentence from the batch once its results are final; the
  sentence's table row comes through `context`, so a row that followed the wrong
  sentence would score with another table. The results are those of the search that
  keeps every sentence (all K beams with num_results=K, the first otherwise), and the
  rows computed shrink."""
  tables = [make_table(s, eos_bias=bias) for s, bias in
            ((0, 1.5), (1, 0.0), (2, 3.0), (3, -1.0), (4, 2.0), (5, 0.5))]
  batch, beam = len(tables), 4
  scorer = history_scorer(tables)
  seen_rows = []

  def with_context(ids, index, state, context):  # context: each sentence's table row
    seen_rows.append(ids.shape[0])
    logits, (h, _) = scorer(ids, index, (state, bs.tile_beams(context, beam)))
    return logits, h

  def full():
    return bs.beam_search(scorer, tf.fill([batch], BOS_ID), initial_state(batch, beam), 12,
                          bs.Beam(beam, alpha=alpha, num_results=results))

  def shrunk():
    h, _ = initial_state(batch, beam)
    return bs.beam_search(with_context, tf.fill([batch], BOS_ID), h, 12,
                          bs.Beam(beam, alpha=alpha, num_results=results,
                                  batch=bs.ShrinkingBatch()), context=tf.range(batch))
  if graph:
    full, shrunk = (tf.function(f, autograph=False) for f in (full, shrunk))
  (want_ids, want_scores), (ids, scores) = full(), shrunk()
  compared = slice(None) if results == beam else slice(0, 1)
  np.testing.assert_array_equal(ids.numpy()[:, compared], want_ids.numpy()[:, compared])
  np.testing.assert_allclose(scores.numpy()[:, compared], want_scores.numpy()[:, compared],
                             rtol=1e-6)
  if not graph:  # eager while_loop: the body runs in Python with concrete shapes
    assert seen_rows[0] == batch * beam and min(seen_rows) < seen_rows[0], seen_rows
  # Without a context (state only) the batch shrinks alike.
  def alone_fn():
    return bs.beam_search(scorer, tf.fill([batch], BOS_ID), initial_state(batch, beam),
                          12, bs.Beam(beam, alpha=alpha, num_results=results,
                                      batch=bs.ShrinkingBatch()))
  alone, alone_scores = (tf.function(alone_fn, autograph=False) if graph else alone_fn)()
  np.testing.assert_array_equal(alone.numpy()[:, compared], want_ids.numpy()[:, compared])
  np.testing.assert_allclose(alone_scores.numpy()[:, compared],
                             want_scores.numpy()[:, compared], rtol=1e-6)


@pytest.mark.parametrize("graph", [False, True])
def test_greedy_rows_leave_the_batch_with_the_same_results(graph):
  """greedy_search(shrink=True): each row leaves when it writes EOS, its table row
  coming through `context`; ids and log probabilities are the full batch's (sentences
  that end early, late and never within the limit), and the rows computed shrink."""
  tables = [make_table(s, eos_bias=bias) for s, bias in
            ((0, 1.5), (1, 0.0), (2, 4.0), (3, -6.0), (4, 2.0))]
  batch = len(tables)
  scorer = history_scorer(tables)
  seen_rows = []

  def with_context(ids, index, state, context):
    seen_rows.append(ids.shape[0])
    logits, (h, _) = scorer(ids, index, (state, context))
    return logits, h

  def full():
    return bs.greedy_search(scorer, tf.fill([batch], BOS_ID), initial_state(batch, 1), 9)

  def shrunk():
    return bs.greedy_search(with_context, tf.fill([batch], BOS_ID),
                            tf.zeros([batch], tf.int32), 9, context=tf.range(batch),
                            shrink=True)
  if graph:
    full, shrunk = (tf.function(f, autograph=False) for f in (full, shrunk))
  (want_ids, want_scores), (ids, scores) = full(), shrunk()
  np.testing.assert_array_equal(ids.numpy(), want_ids.numpy())
  np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-6)
  lengths = [len(strip(row)) for row in ids.numpy()[:, 0]]
  assert len(set(lengths)) > 1 and EOS_ID not in ids.numpy()[3, 0], lengths
  if not graph:
    assert seen_rows[0] == batch and min(seen_rows) < batch, seen_rows
