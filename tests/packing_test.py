"""Packed rows (--packed_length, t2t_keras/data/batching/packing.py): a packed row computes what
each of its pairs computes alone (every position kind), the packed dataset holds the
batch plan's pairs (none lost, none twice, segment ids and positions right) with its
resume and hosts, the loss and its normalisation are those of unpacked training, and a
static-shapes run traces one training program whatever the buckets."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.configs import DataConfig, ModelConfig, TrainConfig
from t2t_keras.data.tokens import cache
from t2t_keras.data.sources import corpora
from t2t_keras.data.batching import packing, pipeline
from t2t_keras.data.batching import plan as plan_lib
from t2t_keras.errors import ConfigError
from t2t_keras.model import create_model
from t2t_keras.training import losses
from t2t_keras.training.trainer import Trainer
from tests.corpora_test import FIRST_IDS, _split
from tests.trainer_test import MODEL, train, weights_of

V = 40
POSITION_KINDS = ("sinusoid", "learned", "relative")


def _model(position_embedding, **overrides):
  keras.utils.set_random_seed(0)
  return create_model(ModelConfig(
      vocab_size=V, hidden_size=16, filter_size=32, num_heads=2, num_hidden_layers=2,
      layer_prepostprocess_dropout=0.0, position_embedding=position_embedding,
      max_relative_position=3, **overrides))


def _pairs(rng, lengths):
  """Pairs of random ids + EOS with (source, target) lengths (EOS included)."""
  return [(np.append(rng.integers(4, V, s - 1), EOS_ID).astype(np.int32),
           np.append(rng.integers(4, V, t - 1), EOS_ID).astype(np.int32))
          for s, t in lengths]


def _packed(pairs, per_row, length):
  """The pairs packed by `packing.pack`, as numpy."""
  sides = {key: tf.ragged.constant([p[i] for p in pairs], tf.int32)
           for i, key in enumerate(("inputs", "targets"))}
  rows = len(pairs) // per_row
  return {k: v.numpy() for k, v in packing.pack(sides, [per_row] * rows, [rows, length]
                                                ).items()}


def unpack(batch):
  """A packed batch's pairs, row after row, by segment: [(source ids, target ids)],
  each checked to have positions 0, 1, ... and segments numbered from 1 in order."""
  pairs = []
  for r in range(len(batch["inputs"])):
    sides = []
    for key in ("inputs", "targets"):
      ids, seg = batch[key][r], batch[packing.SEGMENTS[key]][r]
      pos = batch[packing.POSITIONS[key]][r]
      real = seg > 0
      assert (ids[~real] == PAD_ID).all() and (pos[~real] == 0).all()
      # Segments are contiguous, numbered 1, 2, ... from the row's start.
      count = int(real.sum())
      assert real[:count].all(), (key, seg)
      if not count:  # a row whose strata are all empty this step
        sides.append([])
        continue
      starts = np.flatnonzero(np.diff(np.concatenate([[0], seg[:count]])) != 0)
      assert seg[starts].tolist() == list(range(1, len(starts) + 1)), seg
      side = np.split(ids[:count], starts[1:])
      for piece in np.split(pos[:count], starts[1:]):
        assert piece.tolist() == list(range(len(piece))), pos
      sides.append([s.tolist() for s in side])
    assert len(sides[0]) == len(sides[1])  # as many sources as targets in every row
    pairs += list(zip(*sides))
  return pairs


# ---------------------------------------------------------------- the model
@pytest.mark.parametrize("position_embedding", POSITION_KINDS)
def test_packed_row_equals_each_pair_run_alone(position_embedding):
  """Per-token losses and logits of a packed row (3 pairs in one row, 2 in another,
  padding after) equal those of each pair run alone, to 1e-5: attention never crosses
  a segment (encoder, decoder, encoder-decoder) and positions restart at each pair."""
  model = _model(position_embedding)
  rng = np.random.default_rng(1)
  # Sources and targets of unequal lengths, so that a pair's source and target
  # segments start at different offsets of their rows.
  pairs = _pairs(rng, [(5, 3), (2, 6), (4, 4), (7, 2), (3, 5), (6, 6)])
  batch = _packed(pairs, per_row=3, length=20)
  logits = model(batch, training=False).numpy()
  token_losses = losses.smoothed_cross_entropy(logits, batch["targets"], 0.1).numpy()
  row_of = [i // 3 for i in range(len(pairs))]
  offset = {}
  for i, (src, tgt) in enumerate(pairs):
    alone = model({"inputs": src[None], "targets": tgt[None]}, training=False).numpy()
    alone_losses = losses.smoothed_cross_entropy(alone, tgt[None], 0.1).numpy()
    r = row_of[i]
    start = offset.get(r, 0)
    offset[r] = start + len(tgt)
    np.testing.assert_allclose(logits[r, start:start + len(tgt)], alone[0], atol=1e-5)
    np.testing.assert_allclose(token_losses[r, start:start + len(tgt)], alone_losses[0],
                               atol=1e-5)
  # Every other position is padding and costs nothing.
  for r, end in offset.items():
    assert (token_losses[r, end:] == 0).all()


def test_packed_gradients_equal_those_of_the_same_pairs_unpacked():
  """The trainer's loss sum, token count and gradients for a packed batch are those of
  the same pairs one a row (padded): each real token counts once and the update is
  normalised by the same global token count as unpacked training."""
  keras.utils.set_random_seed(0)
  trainer = Trainer(dataclasses.replace(MODEL, vocab_size=V), TrainConfig(label_smoothing=0.1))
  pairs = _pairs(np.random.default_rng(2), [(4, 3), (2, 5), (6, 2), (3, 3)])
  packed = _packed(pairs, per_row=2, length=12)
  unpacked = {key: np.stack([np.pad(p[i], (0, 8 - len(p[i]))) for p in pairs])
              for i, key in enumerate(("inputs", "targets"))}
  tokens = sum(len(t) for _, t in pairs)
  results = []
  for b in (packed, unpacked):
    grads, loss_sum, count, _ = trainer._gradients(b, tf.constant(float(tokens)))
    results.append((grads, float(loss_sum), float(count)))
  assert results[0][2] == results[1][2] == tokens
  assert results[0][1] == pytest.approx(results[1][1], rel=1e-5)
  for g1, g2 in zip(results[0][0], results[1][0]):
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), atol=1e-5)


def test_source_pointer_refuses_packed_rows():
  model = _model("sinusoid", source_pointer=True, pre_norm=True)
  batch = _packed(_pairs(np.random.default_rng(0), [(3, 3), (2, 2)]), 2, 8)
  with pytest.raises(ValueError, match="--packed_length"):
    model(batch, training=False)


# ---------------------------------------------------------------- the dataset
N = 400
L = 24


def _tokenized(n=N, seed=0, longer=()):
  """Pairs whose first ids (10 + i on both sides) name them, of unequal random lengths
  on the two sides, some longer than max_length (dropped) and some empty (dropped);
  `longer`: more target lengths over max_length, one every 40 pairs each."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 22, size=(n, 2)).astype(np.int32)
  lengths[::50, 1] = 0  # empty targets
  lengths[7::60, 0] = 30  # over max_length
  for i, length in enumerate(longer):
    lengths[3 + i::40, 1] = length
  src = np.concatenate([[10 + i] + [4] * (k - 1) for i, k in enumerate(lengths[:, 0]) if k])
  tgt = np.concatenate([[10 + i] + [5] * (k - 1) for i, k in enumerate(lengths[:, 1]) if k])
  return cache.TokenizedSplit(path=None, lengths=lengths, invalid_utf8=0,
                              groups=cache.group_by_length(src, tgt, lengths))


def _pair(split, i):
  s, t = split.lengths[i]
  return ([10 + i] + [4] * (s - 1) + [EOS_ID], [10 + i] + [5] * (t - 1) + [EOS_ID])


def _config(**overrides):
  return DataConfig(**{**dict(batch_size=96, max_length=20, packed_length=L,
                              static_shapes=True, bucket_growth=1.3), **overrides})


def test_packed_batches_hold_each_planned_pair_once_in_rows_of_L():
  """Every batch is [batch_size // L, L]; its segments are exactly the pairs the packed
  plan gives its step (plan.unit), row by row as the template places them, each once,
  with positions restarting at each; rows mix pairs of different buckets; an epoch
  holds every kept pair exactly once."""
  split = _tokenized()
  data = pipeline.TrainData(_config(), split)
  batch_plan = data.plan(1)
  rows = 96 // L
  assert data.bucket_shape(0) == [rows, L]
  assert batch_plan.strata > rows  # more pairs a step than rows: several a row
  seen, mixed = [], 0
  bucket_of = lambda i: np.searchsorted(data.lengths, split.lengths[i].max() + 1)
  for step, batch in enumerate(data(repeat=False)):
    batch = {k: v.numpy() for k, v in batch.items()}
    assert {k: v.shape for k, v in batch.items()} == {
        k: (rows, L) for k in ("inputs", "targets") + packing.FEATURES}
    _, planned = batch_plan.unit(step)
    in_rows = planned[0][batch_plan.order]
    in_rows = in_rows[in_rows >= 0]
    assert unpack(batch) == [_pair(split, i) for i in in_rows], step
    seen += in_rows.tolist()
    starts = np.cumsum(batch["inputs_position"] == 0, axis=1) * (
        batch["inputs_segmentation"] > 0)
    row_of_pair = np.repeat(np.arange(rows), starts.max(axis=1))
    mixed += any(len({bucket_of(i) for i in in_rows[row_of_pair == r]}) > 1
                 for r in range(rows))
  assert step + 1 == batch_plan.units_per_epoch
  assert mixed > step // 2  # most steps have a row of pairs of several buckets
  lengths = split.lengths
  kept = np.flatnonzero((lengths.min(axis=1) > 0) & (lengths.max(axis=1) + 1 <= 20))
  assert sorted(seen) == kept.tolist()  # each kept pair once: none twice, none left


def _packed_firsts(batch):
  """The first id of each pair of a packed batch, sorted."""
  starts = (batch["inputs_position"].numpy() == 0) & (
      batch["inputs_segmentation"].numpy() > 0)
  return sorted(batch["inputs"].numpy()[starts].tolist())


def _mixed(sizes=(120, 40)):
  split = corpora.CorpusSplits([_split(n, FIRST_IDS[c], c) for c, n in enumerate(sizes)],
                               ["small.en", "other.en"])
  return pipeline.TrainData(_config(train_weights="1,3", max_length=24), split)


@pytest.mark.slow
def test_packed_resume_and_two_hosts_give_the_batches_of_one_run():
  """As the unpacked plan (tests/corpora_test.py), with corpus weights: a plan rebuilt
  at step s gives the packed batches of an uninterrupted run (into its second epoch),
  2 hosts of 1 replica those of 1 host with 2, and the weights hold (each pair of the
  second corpus 3 times an epoch)."""
  data = _mixed()
  units = data.plan(2).units_per_epoch
  one = [_packed_firsts(b) for b in data(tf.distribute.InputContext(1, 0, 2)).take(
      2 * units + 6)]
  steps = [sorted(one[2 * s] + one[2 * s + 1]) for s in range(units + 3)]
  epoch = [f for step in steps[:units] for f in step]
  counts = np.bincount(epoch, minlength=FIRST_IDS[1] + 40)
  assert (counts[FIRST_IDS[1]:] >= 3).all() and (counts[FIRST_IDS[0]:FIRST_IDS[0] + 120]
                                                   >= 1).all()
  start = units - 3
  resumed = _mixed()(tf.distribute.InputContext(1, 0, 2), start_step=start)
  again = [_packed_firsts(b) for b in resumed.take(2 * 6)]
  assert [sorted(again[2 * s] + again[2 * s + 1]) for s in range(6)] == steps[
      start:start + 6]
  hosts = [iter(_mixed()(tf.distribute.InputContext(2, h, 2))) for h in range(2)]
  for s in range(12):
    apart = [_packed_firsts(next(hosts[h])) for h in range(2)]
    assert apart == one[2 * s:2 * s + 2], s


def test_bad_packed_lengths_are_clear_errors():
  with pytest.raises(ConfigError, match="--packed_length=16 is shorter than "
                     "--max_length=20.*raise --packed_length or lower --max_length"):
    _config(packed_length=16).validate()
  with pytest.raises(ConfigError, match="--batch_size=96 tokens cannot hold one packed "
                     "row of --packed_length=128"):
    _config(packed_length=128).validate()
  with pytest.raises(ValueError, match="bucket=None"):
    pipeline.TrainData(_config(), _tokenized())(bucket=0)


def test_the_train_command_refuses_packing_with_a_source_pointer_and_records_packing():
  from absl import flags  # pylint: disable=import-outside-toplevel
  from tests.user_errors_test import _parsed  # pylint: disable=import-outside-toplevel
  from t2t_keras import flags as t2t_flags  # pylint: disable=import-outside-toplevel
  from t2t_keras.trained import model_card  # pylint: disable=import-outside-toplevel
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--packed_length=16", "--source_pointer")
  with pytest.raises(flags.ValidationError, match="--packed_length=16 packs several pairs "
                     "into a row, and --source_pointer reads one source per row"):
    t2t_flags.check_train_flags(argv, fv)
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--packed_length=16", "--static_shapes")
  t2t_flags.check_train_flags(argv, fv)
  assert t2t_flags.data_config(fv).packed_length == 16
  data = {"source": "files", "train_src": "a.en", "packed_length": 256}
  assert model_card.training_data(data)["packed_length"] == 256
  assert "packed_length" not in model_card.training_data({**data, "packed_length": 0})
  # A restart that packs differently is a changed batch plan (modeldir.check_plan).
  from t2t_keras.trained import modeldir  # pylint: disable=import-outside-toplevel
  assert modeldir.plan_key(_config(), TrainConfig(), 1)["packed_length"] == L
  assert modeldir.plan_key(_config(), TrainConfig(), 1)["packing"] == "length strata"
  # Packed steps mix buckets whatever --static_run_steps says (one shape for all).
  runs = TrainConfig(steps_per_loop=10, static_run_steps=10)
  assert modeldir.plan_key(_config(), runs, 1)["steps_per_loop"] == 1
  assert modeldir.plan_key(_config(packed_length=0), runs, 1)["steps_per_loop"] == 10
  assert "packed_length" not in modeldir.plan_key(_config(packed_length=0), TrainConfig(), 1)


# ---------------------------------------------------------------- the trainer
def _synthetic(**overrides):
  return pipeline.make_datasets(DataConfig(**{**dict(
      source="synthetic", synthetic_max_length=20, synthetic_vocab_size=16,
      synthetic_train_size=2000, synthetic_eval_size=10, max_length=24, batch_size=128,
      packed_length=32, static_shapes=True, bucket_growth=1.5), **overrides}))


def test_static_packed_training_traces_one_program(tmp_path):
  """With --static_shapes and --packed_length the XLA-compiled step and the loop are
  traced once, for the static shape [R, L], while the steps' pairs span several
  buckets (each its own program without packing: tests/trainer_static_test.py)."""
  data = _synthetic()
  steps = 8
  plan = data.train_fn.plan(1)
  pairs = np.concatenate([plan.unit(s)[1].ravel() for s in range(steps)])
  padded = data.train_fn.split.lengths[pairs[pairs >= 0]].max(axis=1) + 1
  assert len(set(np.searchsorted(data.train_fn.lengths, padded))) >= 2
  model = dataclasses.replace(MODEL, vocab_size=data.vocab_size)
  keras.utils.set_random_seed(0)
  trainer, lines = Trainer(model, TrainConfig(
      model_dir=str(tmp_path / "packed"), train_steps=steps, jit_compile=True,
      steps_per_loop=4, log_every=4, save_checkpoint_steps=4)), []
  result = trainer.train(data.train_fn, progress=lines.append)
  assert f"packed rows: every batch [4, 32], up to {plan.strata} pairs of mixed lengths" in (
      "\n".join(lines))
  assert result.steps == steps and np.isfinite(result.final_loss)
  shapes = [tuple(f.structured_input_signature[0][0]["inputs"].shape)
            for f in trainer._compute_gradients._list_all_concrete_functions()]
  assert shapes == [(128 // 32, 32)]
  assert trainer.train_fn.experimental_get_tracing_count() == 1


@pytest.mark.slow
def test_packed_training_resume_equals_uninterrupted(tmp_path):
  """A packed run stopped at step 7 and resumed trains the weights of a straight run."""
  data = _synthetic()
  model = dataclasses.replace(MODEL, vocab_size=data.vocab_size)
  runs = {}
  for name, stops in (("straight", [14]), ("resumed", [7, 14])):
    for stop in stops:
      runs[name] = train(tmp_path, name, stop, model=model, dataset_fn=data.train_fn,
                         steps_per_loop=3)
  (straight, _), (resumed, result) = runs["straight"], runs["resumed"]
  assert result.steps == 14 and resumed.current_step() == 14
  for a, b in zip(weights_of(straight), weights_of(resumed)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_packed_two_replicas_equal_one_with_accumulation(tmp_path):
  """Through the trainer: packed rows on 2 replicas (the CPU split in two) make the
  updates of 1 replica accumulating 2 micro-batches, over steps that span several
  buckets: the two runs read the same pairs, packed the same, and normalise by the
  same global token count (2 workers read what 2 replicas read: the 2-host test)."""
  assert len(tf.config.list_logical_devices("CPU")) >= 2, "conftest splits the CPU"
  runs = {}
  for name, strategy, accum in (("one", "default", 2), ("two", "mirrored", 1)):
    data = _synthetic(accum_steps=accum)
    model = dataclasses.replace(MODEL, vocab_size=data.vocab_size)
    runs[name] = train(tmp_path, name, 5, strategy=strategy, model=model,
                       dataset_fn=data.train_fn, accum_steps=accum, learning_rate=0.05,
                       adam_epsilon=1e-4)
  (one, r1), (two, r2) = runs["one"], runs["two"]
  assert two.strategy.num_replicas_in_sync == 2
  assert r1.target_tokens == r2.target_tokens > 0
  assert r1.final_loss == pytest.approx(r2.final_loss, abs=1e-5)
  for a, b in zip(weights_of(one), weights_of(two)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("packed_length", [64, 128])
def test_rows_that_mix_lengths_leave_much_less_padding_on_multi30k(shared_data,
                                                                   packed_length):
  """On the real Multi30k training file (its words as tokens), an epoch of packed rows
  that mix lengths pads well under rows of one bucket's pairs (the first packing: k_b =
  L // len_b pairs of bucket b a row). Each kept pair is in an epoch once
  (test above), so the padding is what the epoch's rows do not hold."""
  lengths = np.stack([[len(line.split()) for line in open(
      f"{shared_data}/multi30k/train.{side}", encoding="utf-8")] for side in ("en", "de")],
      axis=1)
  assert len(lengths) == 29000
  batch_size, max_length = 1024, 64
  rows = batch_size // packed_length
  keep = (lengths.min(axis=1) > 0) & (lengths.max(axis=1) + 1 <= max_length)
  tokens = 2 * keep.sum() + lengths[keep].sum()  # both sides, EOS included
  mixed = packing.PackedPlan(lengths, max_length, batch_size, packed_length, 1,
                             dict(seed=1))
  assert (np.bincount(mixed.row_of_stratum, weights=mixed.bounds) <= packed_length).all()
  boundaries = pipeline.bucket_boundaries(8, max_length, 1.1)
  one_bucket = plan_lib.BatchPlan(lengths, boundaries, batch_size, 1, 1, rows=[
      packed_length // b * rows for b in boundaries])
  padding = {name: 1 - tokens / (2 * rows * packed_length * p.units_per_epoch)
             for name, p in (("mixed", mixed), ("one bucket", one_bucket))}
  # Measured: 11.0% against 19.3% at L = 64, 9.6% against 13.6% at 128; what is left
  # is mostly each pair's shorter side (5.9% of the tokens).
  assert padding["mixed"] < 0.75 * padding["one bucket"], padding


def test_packed_dev_loss_equals_the_unpacked_dev_loss():
  """With --static_shapes, evaluation packs the dev pairs as training does, in one
  program: every dev pair once, and the loss, tokens and accuracy of the unpacked
  (dynamic) evaluation, to 1e-5."""
  from t2t_keras.data.batching import dev_batches  # pylint: disable=import-outside-toplevel
  packed = _synthetic(synthetic_eval_size=97)
  plain = _synthetic(synthetic_eval_size=97, packed_length=0, static_shapes=False)
  eval_data = packed.eval_fn
  rows = 128 // 32
  assert eval_data.buckets() == [dev_batches.PACKED]
  # Several batches, several pairs a row, and all-PAD rows completing the last batch.
  assert rows < eval_data.packed_rows < 97 // 2 and eval_data.packed_rows % rows
  keras.utils.set_random_seed(0)
  trainer = Trainer(dataclasses.replace(MODEL, vocab_size=packed.vocab_size),
                    TrainConfig(label_smoothing=0.1))
  lines = []
  got = trainer.evaluate(eval_data, progress=lines.append)
  want = trainer.evaluate(plain.eval_fn)
  assert [line for line in lines if "eval program" in line] == [
      f"static shapes: eval program 1 of 1, dev bucket [{rows}, 32] (evaluation is traced "
      "and compiled once per dev bucket)"]
  assert got["tokens"] == want["tokens"]
  for name in ("loss", "perplexity", "accuracy"):
    assert got[name] == pytest.approx(want[name], abs=1e-5), name
  pairs = [p for b in eval_data(bucket=dev_batches.PACKED)
           for p in unpack({k: v.numpy() for k, v in b.items()})]
  alone = [(s[s > 0].tolist(), t[t > 0].tolist()) for b in plain.eval_fn()
           for s, t in zip(b["inputs"].numpy(), b["targets"].numpy())]
  assert sorted(pairs) == sorted(alone) and len(pairs) == 97


@pytest.mark.slow
def test_packed_evaluation_keeps_longer_pairs_apart_and_runs_on_two_replicas(tmp_path):
  """Dev pairs longer than L (kept in evaluation) stay in buckets of their own after
  the packed rows; every dev pair, empty sides included, comes once; and the dev loss
  on 2 replicas (the CPU split in two) and on 1 equals the unpacked (dynamic) one."""
  from t2t_keras.data.batching import dev_batches  # pylint: disable=import-outside-toplevel
  from t2t_keras.training import distribute  # pylint: disable=import-outside-toplevel
  # Padded lengths 23 (packed) and 25 (not) share the dev bucket (20, 26]: L = 24
  # is no bucket boundary.
  split = _tokenized(n=120, longer=(22, 24))
  packed = dev_batches.EvalData(_config(), split)
  plain = dev_batches.EvalData(_config(packed_length=0, static_shapes=False), split)
  buckets = packed.buckets()
  assert buckets[0] == dev_batches.PACKED and len(buckets) >= 2
  assert [packed.lengths[b] for b in buckets[1:]] == [26, 31]
  real = lambda b: [(s[s > 0].tolist(), t[t > 0].tolist()) for s, t in zip(
      b["inputs"].numpy(), b["targets"].numpy()) if (s > 0).any() or (t > 0).any()]
  pairs = []
  for bucket in buckets:
    for batch in packed(bucket=bucket):
      pairs += (unpack({k: v.numpy() for k, v in batch.items()})
                if bucket == dev_batches.PACKED else real(batch))
  assert sorted(pairs) == sorted(p for b in plain() for p in real(b)) and len(pairs) == 120
  model = dataclasses.replace(MODEL, vocab_size=160)
  results = []
  for strategy in ("default", "mirrored"):
    config = TrainConfig(model_dir=str(tmp_path / strategy), strategy=strategy)
    keras.utils.set_random_seed(0)
    trainer = Trainer(model, config, distribute.create_strategy(config))
    assert trainer.strategy.num_replicas_in_sync == (2 if strategy == "mirrored" else 1)
    results.append(trainer.evaluate(packed, progress=lambda line: None))
  want = trainer.evaluate(plain)
  for got in results:
    assert got["tokens"] == want["tokens"]
    for name in ("loss", "accuracy"):
      assert got[name] == pytest.approx(want[name], abs=1e-5), name
