"""Tree-constrained decoding (parsing): every output a valid tree over the source's
words, in every cache layout (graph, XLA in place), and word copying. Split from
decoding_test.py, whose fixtures and sources it shares."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID
from t2t_keras.configs import DecodeConfig
from t2t_keras.inference import search as bs
from t2t_keras.inference import decoding, processors
from t2t_keras.parsing.constraint import TreeConstraint
# The module's fixtures by import (pytest finds them here); tests name them as arguments.
from tests.decoding_test import V, model, pointer_model, sources  # noqa: F401

# A parsing vocabulary for the V=30 model: tree tokens, word-start and inner pieces.
TREE_PIECES = (["<pad>", "</s>", "<unk>", "<s>", "\u2581(S", "\u2581(NP", "\u2581(VP",
                "\u2581)", "\u2581NN", "\u2581DT", "\u2581VB"]
               + [f"\u2581w{i}" for i in range(11, 20)] + [f"p{i}" for i in range(20, V)])


def check_tree(out, words, constraint):
  """`out` (ids) is one linearized tree with exactly `words` leaves, then EOS."""
  kinds = constraint.kinds.numpy()
  out = list(out)
  assert EOS_ID in out, out
  body = out[:out.index(EOS_ID)]
  if words == 0:
    assert body == []
    return
  depth = leaves = run = opened = 0
  for n, token in enumerate(body):
    kind = kinds[token]
    assert kind in (constraint.OPEN, constraint.CLOSE, constraint.LEAF), body
    assert n == 0 or depth > 0, body  # one root, nothing after it
    run = run + 1 if kind == constraint.OPEN else 0
    assert run <= constraint.max_open_run, body  # the treebank's bounds on brackets
    if kind == constraint.OPEN:
      opened += 1
      assert opened - 1 < constraint.BRACKETS_PER_WORD * words + 1, body  # when it opened
      depth += 1
    elif kind == constraint.CLOSE:
      assert kinds[body[n - 1]] != constraint.OPEN, body  # no empty constituent
      depth -= 1
    else:
      assert depth > 0, body
      leaves += 1
  assert kinds[body[0]] == constraint.OPEN and depth == 0 and leaves == words, body


def assert_xla_in_place_agrees(model, inputs, config, constraint, ids, scores):  # noqa: F811
  """The in-place cache layout under XLA gives the reordered layout's beams."""
  compiled = tf.function(lambda x: decoding.decode_ids(
      model, x, dataclasses.replace(config, jit_compile=True), constraint), jit_compile=True,
      autograph=False)
  xla_ids, xla_scores = compiled(tf.constant(inputs))
  np.testing.assert_array_equal(xla_ids.numpy(), ids)
  np.testing.assert_allclose(xla_scores.numpy(), scores.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("beam,extra", [(1, 2), (3, 2), (3, 6)])
def test_tree_constrained_decoding_writes_valid_trees_in_every_layout(model, beam, extra,  # noqa: F811
                                                                      monkeypatch):
  # An untrained model left alone writes anything; constrained, every beam of every
  # sentence must be a tree over exactly its words, even at the tightest length limit
  # (extra 2), and the in-place XLA layout must agree with the reordered one.
  monkeypatch.setattr(decoding, "MAX_SLOTTED_BEAM", 4)
  constraint = TreeConstraint(TREE_PIECES)
  rng = np.random.default_rng(5)
  inputs = sources(rng, [6, 3, 9, 12, 2])
  inputs[4, 0] = 25  # a sentence of one inner piece: no words, so EOS at once
  words = constraint.count_words(inputs).numpy()
  assert words[4] == 0 and words.max() > 3
  # return_beams: every beam is final, so both layouts must agree on all of them.
  config = DecodeConfig(beam_size=beam, alpha=0.6, extra_decode_length=extra,
                        return_beams=True)
  free_ids, _ = decoding.decode_ids(model, inputs, config)
  ids, scores = decoding.decode_ids(model, inputs, config, tree_constraint=constraint)
  ids = ids.numpy().reshape(len(inputs), beam, -1)
  live = scores.numpy() > bs.NEG_INF / 1e3  # a sentence may have < K possible trees
  assert np.all(live[:, 0]) and np.all(live[:4])
  for b in range(len(inputs)):
    for k in range(beam):
      if live[b, k]:
        check_tree(ids[b, k], words[b], constraint)
  assert not np.array_equal(free_ids.numpy().reshape(ids.shape), ids)  # it constrained
  if beam > 1:
    assert_xla_in_place_agrees(model, inputs, config, constraint, ids, scores)


def check_word_tree(out, source, constraint):
  """`out` is a "words" tree: each word's source pieces, in order, then a tag."""
  kinds, starts = constraint.kinds.numpy(), constraint.starts_word.numpy()
  source = [p for p in source if p not in (PAD_ID, EOS_ID)]
  first = next((n for n, p in enumerate(source) if starts[p]), len(source))
  words, word = [], None
  for piece in source[first:]:
    if starts[piece]:
      word = [piece]
      words.append(word)
    else:
      word.append(piece)
  out = list(out)
  body = out[:out.index(EOS_ID)]
  brackets_and_tags, copied, n, depth = [], 0, 0, 0
  while n < len(body):
    if depth > 0 and copied < len(words) and body[n] == words[copied][0]:  # a word
      word = words[copied]
      assert body[n:n + len(word)] == word, (body, words)
      n += len(word)
      assert n < len(body) and kinds[body[n]] == constraint.LEAF, body  # its tag
      copied += 1
    else:
      assert kinds[body[n]] in (constraint.OPEN, constraint.CLOSE), body
      depth += 1 if kinds[body[n]] == constraint.OPEN else -1
    brackets_and_tags.append(body[n])
    n += 1
  assert copied == len(words)
  check_tree(brackets_and_tags + [EOS_ID], len(words), constraint)


@pytest.mark.parametrize("beam,extra,pointer", [(1, 3, False), (3, 3, False),
                                               (3, 20, False), (3, 3, True)])
@pytest.mark.slow
def test_word_copying_constraint_copies_every_word_once_in_every_layout(
    model, pointer_model, beam, extra, pointer, monkeypatch):  # noqa: F811
  # The "words" linearization: where a leaf may come, the search may only write the
  # next word's source pieces, then a tag. An untrained model must still write a
  # valid tree that copies the sentence exactly, at the tightest length (every piece
  # is owed), with leading orphan pieces, and the in-place XLA layout must agree with
  # the reordered one.
  # With a source pointer (the recipe's model), the copied words move each beam's
  # pointer through the sentence; both cache layouts must carry it alike.
  model = pointer_model if pointer else model
  monkeypatch.setattr(decoding, "MAX_SLOTTED_BEAM", 4)
  constraint = TreeConstraint(TREE_PIECES, "words")
  rng = np.random.default_rng(8)
  inputs = sources(rng, [6, 3, 9, 12, 2])
  inputs[0, 0] = 22  # a leading piece that starts no word
  inputs[1, 0] = 12
  inputs[4, 0] = 25  # no words at all: EOS at once
  words = constraint.count_words(inputs).numpy()
  assert words[4] == 0 and words.max() > 3
  # extra 3: the words-mode decode length limit is pieces + words + 2 x brackets; give
  # the decoder what it needs beyond the source length.
  config = DecodeConfig(beam_size=beam, alpha=0.6,
                        extra_decode_length=int(words.max()) + extra, return_beams=True)
  ids, scores = decoding.decode_ids(model, inputs, config, tree_constraint=constraint)
  ids = ids.numpy().reshape(len(inputs), beam, -1)
  live = scores.numpy() > bs.NEG_INF / 1e3
  assert np.all(live[:, 0])
  for b in range(len(inputs)):
    for k in range(beam):
      if live[b, k]:
        check_word_tree(ids[b, k], inputs[b], constraint)
  if beam > 1:
    assert_xla_in_place_agrees(model, inputs, config, constraint, ids, scores)


def test_tree_constraint_needs_a_parsing_vocabulary():
  with pytest.raises(ValueError, match="open, close, leaf.*data_source=parsing"):
    TreeConstraint(["<pad>", "</s>", "<unk>", "<s>", "\u2581the", "\u2581cat"])


@pytest.mark.parametrize("beam,favourites,extra", [(1, [EOS_ID, 7], 2), (4, [EOS_ID, 7], 2),
                                                   (1, [5], 60), (4, [5, 6], 60)])
def test_tree_constraint_holds_against_a_decoder_that_wants_to_stop(beam, favourites,
                                                                    extra):
  # A stand-in decoder that prefers `)` and EOS above all (random logits otherwise):
  # the constraint must still give every sentence its root and all of its leaves.
  # One that prefers opening brackets `(NP`, `(VP` (a model caught in a loop) with
  # room to spare: brackets stay within the treebank's bounds.
  constraint = TreeConstraint(TREE_PIECES)
  words = tf.constant([1, 4, 7])
  limits = words + 3 + extra  # extra 2: the tightest limit decode_ids can give
  bias = np.zeros(V, np.float32)
  bias[favourites] = 8.0

  def fn(ids, index, state):
    noise = tf.random.stateless_normal([tf.shape(ids)[0], V], seed=tf.stack([index, 7]))
    return noise * 2.0 + bias, state

  rows = 3 * beam
  tiled = (lambda t: bs.tile_beams(t, beam)) if beam > 1 else (lambda t: t)
  # Sources of 1, 4 and 7 words (id 11 is the word "w11"), EOS, PAD.
  inputs = np.zeros([3, 8], np.int32)
  for b, n in enumerate(words.numpy()):
    inputs[b, :n], inputs[b, n] = 11, EOS_ID
  assert list(constraint.count_words(inputs).numpy()) == list(words.numpy())
  step, state = processors.compose(
      fn, tf.zeros([rows, 1]), [constraint, processors.LengthLimit()],
      processors.Rows(inputs=tiled(tf.constant(inputs)), limits=tiled(limits)))
  start = tf.fill([3], BOS_ID)
  length = int(tf.reduce_max(limits))
  if beam == 1:
    ids, _ = bs.greedy_search(step, start, state, length)  # (B, 1, L)
  else:
    ids, scores = bs.beam_search(step, start, state, length, bs.Beam(beam, alpha=0.3))
    assert np.all(scores.numpy()[:, 0] > bs.NEG_INF / 1e3)
  for b, n in enumerate(words.numpy()):
    check_tree(ids.numpy()[b, 0], n, constraint)
