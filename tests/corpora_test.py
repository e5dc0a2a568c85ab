"""Tests of t2t_keras.data.sources.corpora: several training corpora mixed by weights, through
the batch plan and the training dataset (issue 35)."""

import collections
import dataclasses
import logging

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import DataConfig
from t2t_keras.data.tokens import cache
from t2t_keras.data.sources import corpora, sources
from t2t_keras.data.batching import pipeline
from t2t_keras.errors import ConfigError, DataError
from tests import inprocess

FIRST_IDS = (10, 1000)  # corpus c's i-th pair starts with id FIRST_IDS[c] + i


def _split(n, first_id, seed):
  """An in-memory tokenized corpus whose pairs tell themselves apart by their first id."""
  lengths = np.random.default_rng(seed).integers(2, 20, n)
  src = np.concatenate([[first_id + i] + [4] * (k - 1) for i, k in enumerate(lengths)])
  pairs = np.stack([lengths, lengths], axis=1).astype(np.int32)
  return cache.TokenizedSplit(path=None, lengths=pairs, invalid_utf8=0,
                              groups=cache.group_by_length(src, src, pairs))


def _data(weights="1,3", by="size", sizes=(300, 100), static=False, seed=1):
  split = corpora.CorpusSplits([_split(n, FIRST_IDS[c], c) for c, n in enumerate(sizes)],
                               ["small.en", "other.en"])
  config = DataConfig(batch_size=96, max_length=24, static_shapes=static, seed=seed,
                      train_weights=weights, train_weights_by=by)
  return pipeline.TrainData(config, split)


def _firsts(batch):
  """The first id of each real row of a batch."""
  return sorted(int(row[0]) for row in batch["inputs"].numpy() if row[0])


def _corpus(first_id):
  return int(first_id >= FIRST_IDS[1])


# ---------------------------------------------------------------- multiplicities
@pytest.mark.parametrize("weights,by,kept,expected", [
    ([1, 3], "size", [300, 100], (1, 3)),  # by size: m proportional to the weight
    ([1, 1], "weight", [1000, 3000], (3, 1)),  # by weight: to weight / size
    ([1, 1.5], "size", [300, 100], (2, 3)),  # 1:1.5 rounded would be 33% off: scaled
    ([2, 2], "size", [5, 7], (1, 1)),
])
def test_multiplicities_give_each_corpus_its_share(weights, by, kept, expected):
  mix = corpora.mixture(["a", "b"], kept, weights, by)
  assert mix.multiplicity == expected
  assert mix.error() <= corpora.TOLERANCE
  np.testing.assert_allclose(mix.achieved, mix.requested, rtol=corpora.TOLERANCE)
  assert mix.epoch_pairs == sum(m * n for m, n in zip(expected, kept))
  lines = mix.summary()
  assert len(lines) == 2 and lines[1].startswith("Corpus 2/2 b: ")
  assert f"x{expected[1]} an epoch" in lines[1] and "requested" in lines[1]


def test_weights_that_would_blow_up_an_epoch_are_refused_with_what_to_do():
  # 1:1.01 by weight of sizes 10**6 and 10: m = (1, ~10**5) is fine, but bounded at
  # 10**6 pairs an epoch it is not reachable.
  with pytest.raises(ConfigError) as error:
    corpora.mixture(["big", "tiny"], [10**6, 10], [1, 1], "weight",
                    max_epoch_pairs=10**6)
  message = str(error.value)
  assert "--train_weights=1,1" in message and "--train_weights_by=size" in message
  assert "at most 1000000" in message
  # A ratio that rounding cannot reach within the bound either (7:10 needs 7, 10).
  with pytest.raises(ConfigError, match="simpler ratios"):
    corpora.mixture(["a", "b"], [100, 100], [1, 1.43], "size", max_epoch_pairs=300)


def test_a_corpus_with_nothing_left_is_named():
  with pytest.raises(ConfigError, match="training corpus b.en has no pair left"):
    corpora.mixture(["a.en", "b.en"], [10, 0], [1, 1])


# ---------------------------------------------------------------- flags
def _problems(**flags):
  return sources.FileSource(DataConfig(source="files", **flags)).problems()


def test_bad_weight_flags_are_clear_errors():
  assert _problems(train_src="a.en,b.en", train_tgt="a.de,b.de") == []
  assert _problems(train_src="a.en,b.en", train_tgt="a.de,b.de", train_weights="1,3") == []
  assert _problems(train_src="a.en", train_tgt="a.de", train_weights="2") == []  # one
  problem, = _problems(train_src="a.en,b.en", train_tgt="a.de")
  assert "--train_src names 2 files and --train_tgt 1" in problem
  problem, = _problems(train_src="a.en,b.en", train_tgt="a.de,b.de", train_weights="1")
  assert "gives 1 weights for 2 training corpora" in problem
  problem, = _problems(train_src="a.en,b.en", train_tgt="a.de,b.de", train_weights="1,0")
  assert "must be a positive number (got 0)" in problem
  problem, = _problems(train_src="a.en,b.en", train_tgt="a.de,b.de", train_weights="1,x")
  assert "'x' is not a number" in problem
  problem, = _problems(train_src="a.en,,b.en", train_tgt="a.de,c.de,b.de")
  assert "empty file name" in problem
  with pytest.raises(DataError, match="--train_weights=-1"):
    sources.FileSource(DataConfig(source="files", train_src="a.en,b.en",
                                  train_tgt="a.de,b.de", train_weights="-1,2")).validate()


def test_corpora_are_one_config_each_and_one_corpus_is_unchanged():
  config = DataConfig(source="files", train_src="a.en, b.en", train_tgt="a.de,b.de",
                      train_weights="1,3", dev_src="d.en", dev_tgt="d.de")
  parts = sources.FileSource(config).corpora("train")
  assert [name for name, _ in parts] == ["a.en", "b.en"]
  assert [(c.train_src, c.train_tgt, c.train_weights) for _, c in parts] == [
      ("a.en", "a.de", None), ("b.en", "b.de", None)]
  assert sources.FileSource(config).corpora("dev") == [("dev", config)]
  one = dataclasses.replace(config, train_src="a.en", train_tgt="a.de", train_weights="2")
  assert sources.FileSource(one).corpora("train") == [("train", one)]


# ---------------------------------------------------------------- the plan
@pytest.mark.slow
def test_an_epoch_trains_each_pair_its_multiplicity_and_the_shares_hold_early():
  data = _data()  # 300 pairs x1 and 100 pairs x3: half the epoch each
  assert data.mixture.multiplicity == (1, 3)
  seen, first = collections.Counter(), []
  for batch in data(repeat=False):
    rows = _firsts(batch)
    seen.update(rows)
    first += rows[:max(0, 150 - len(first))]
  for c, n in enumerate((300, 100)):
    counts = [seen[FIRST_IDS[c] + i] for i in range(n)]
    assert min(counts) >= data.mixture.multiplicity[c], (c, counts)
  plan = data.plan(1)
  extra = sum(seen.values()) - data.mixture.epoch_pairs
  assert 0 <= extra < sum(plan.rows)  # only the pools' last units are completed
  # The first 150 pairs of the epoch (a quarter): a binomial share, loosely bounded.
  share = sum(_corpus(f) for f in first) / len(first)
  assert 0.35 < share < 0.65, share


@pytest.mark.slow
@pytest.mark.parametrize("weights,by,expected", [("1,1", "weight", (1, 3)),
                                                 ("3,1", "size", (3, 1))])
def test_the_epoch_follows_the_mode(weights, by, expected):
  data = _data(weights, by)
  assert data.mixture.multiplicity == expected
  per_corpus = collections.Counter(_corpus(f) for batch in data(repeat=False)
                                   for f in _firsts(batch))
  achieved = per_corpus[1] / sum(per_corpus.values())
  assert abs(achieved - data.mixture.achieved[1]) < 0.05, (achieved, data.mixture)


@pytest.mark.slow
def test_same_seed_same_batches_and_the_host_plan_agrees():
  data, again, other = _data(), _data(), _data(seed=2)
  plan = data.plan(1)
  first = [_firsts(b) for b in data().take(8)]
  assert first == [_firsts(b) for b in again().take(8)]
  assert first != [_firsts(b) for b in other().take(8)]
  ids = np.concatenate([FIRST_IDS[0] + np.arange(300), FIRST_IDS[1] + np.arange(100)])
  for step in range(8):  # plan.unit (tools, tests) names the pairs the dataset reads
    _, pairs = plan.unit(step)
    assert sorted(ids[pairs.ravel()].tolist()) == first[step]


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True])
def test_resume_and_two_hosts_give_the_batches_of_one_run(static):
  """A plan rebuilt and asked for step s gives the batches of an uninterrupted run
  (into the second epoch), and 2 hosts of 1 replica the batches of 1 host with 2."""
  sizes = (120, 40)  # small corpora: a short first epoch, resumed into the second
  data = _data(static=static, sizes=sizes)
  units = data.plan(2).units_per_epoch
  one = [_firsts(b) for b in data(tf.distribute.InputContext(1, 0, 2)).take(2 * units + 6)]
  steps = [sorted(one[2 * s] + one[2 * s + 1]) for s in range(units + 3)]
  start = units - 3  # into the second epoch
  resumed = _data(static=static, sizes=sizes)(tf.distribute.InputContext(1, 0, 2),
                                              start_step=start)
  again = [_firsts(b) for b in resumed.take(2 * 6)]
  assert [sorted(again[2 * s] + again[2 * s + 1]) for s in range(6)] == steps[
      start:start + 6]
  hosts = [iter(_data(static=static, sizes=sizes)(tf.distribute.InputContext(2, h, 2)))
           for h in range(2)]
  for s in range(12):
    apart = [_firsts(next(hosts[h])) for h in range(2)]
    assert apart == one[2 * s:2 * s + 2], s


# ---------------------------------------------------------------- files
def _write(path, lines):
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


@pytest.mark.slow
def test_files_of_two_corpora_are_cached_each_and_mixed(tmp_path, caplog):
  words = "the a house cat dog runs sleeps under over small big green".split()
  rng = np.random.default_rng(0)
  files = []
  for name, n in (("alpha", 400), ("beta", 100)):
    lines = [f"{name} " + " ".join(rng.choice(words, rng.integers(1, 8)))
             for _ in range(n)]
    for side in ("en", "de"):
      _write(str(tmp_path / f"{name}.{side}"), lines)
    files.append([str(tmp_path / f"{name}.{side}") for side in ("en", "de")])
  config = DataConfig(source="files", train_src=f"{files[0][0]},{files[1][0]}",
                      train_tgt=f"{files[0][1]},{files[1][1]}", train_weights="1,4",
                      data_dir=str(tmp_path / "data"), vocab_size=60, max_length=32,
                      batch_size=128)
  # absl's own logger too: a test before this one in the process may have raised it.
  with caplog.at_level(logging.INFO, logger="absl"):
    data = pipeline.make_datasets(config)
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Corpus")]
  assert lines == data.train_fn.mixture.summary() and len(lines) == 2
  assert lines[1].startswith(f"Corpus 2/2 {files[1][0]}: 100 pairs kept, weight 4 (by "
                             "size), x4 an epoch = 400 of 800 pairs")
  # One cache per corpus, the one of a run on that corpus alone.
  alone = dataclasses.replace(config, train_src=files[1][0], train_tgt=files[1][1],
                              train_weights=None)
  split = pipeline.load_split(alone, "train", data.tokenizer)
  assert split.path in data.train_fn.split.path
  assert len(tf.io.gfile.glob(str(tmp_path / "data" / "cache" / "train-*"))) == 2
  texts = [s for b in pipeline.train_dataset(config, data.tokenizer, repeat=False)
           for s in data.tokenizer.detokenize(b["inputs"]).numpy() if s]
  share = sum(t.startswith(b"beta") for t in texts) / len(texts)
  assert 0.45 < share < 0.55, share
  # The vocabulary samples from both corpora (all their pairs, corpus after corpus).
  names = collections.Counter(src.split()[0] for src, _ in
                              sources.data_source(config).python_pairs("train"))
  assert names == {"alpha": 400, "beta": 100}


def test_train_command_logs_the_counts_of_each_corpus(tmp_path):
  """`python -m t2t_keras.train` on two small corpora weighted 1,3: a few steps of a
  tiny model, and the log line of each corpus (pairs, multiplicity, shares)."""
  words = "ein der Mann Frau Hund läuft a the man woman dog runs".split()
  rng = np.random.default_rng(1)
  for name, n in (("a", 200), ("b", 100)):
    lines = [" ".join(rng.choice(words, rng.integers(2, 7))) for _ in range(n)]
    for side in ("en", "de"):
      _write(str(tmp_path / f"{name}.{side}"), lines)
  result = inprocess.run(  # the command's main, in this process
      "train", "--data_source=files", f"--train_src={tmp_path}/a.en,{tmp_path}/b.en",
      f"--train_tgt={tmp_path}/a.de,{tmp_path}/b.de", "--train_weights=1,3",
      "--vocab_size=60", "--hidden_size=16", "--filter_size=32", "--num_heads=2",
      "--num_hidden_layers=1", "--batch_size=256", "--max_length=32", "--train_steps=2",
      "--log_every=1", "--save_checkpoint_steps=2", "--eval_bleu_sentences=0",
      "--show_examples=0", f"--model_dir={tmp_path}/m")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [line.split("] ", 1)[-1] for line in result.stderr.splitlines()
           if "Corpus " in line]
  assert lines == [
      f"Corpus 1/2 {tmp_path}/a.en: 200 pairs kept, weight 1 (by size), x1 an epoch = "
      "200 of 500 pairs; share requested 40.0%, achieved 40.0%",
      f"Corpus 2/2 {tmp_path}/b.en: 100 pairs kept, weight 3 (by size), x3 an epoch = "
      "300 of 500 pairs; share requested 60.0%, achieved 60.0%"], result.stderr[-3000:]
  # The resolved flags in the model directory keep the corpora and their weights.
  with open(tmp_path / "m" / "config.json", encoding="utf-8") as f:
    assert '"train_weights": "1,3"' in f.read()
