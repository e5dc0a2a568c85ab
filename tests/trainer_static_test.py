"""Static shapes (the TPU setting): one bucket per step on every replica, resume inside
a run of a bucket, 2 replicas equal 1 with accumulation, one XLA program per bucket;
evaluation one program per dev bucket with the dynamic loss, dev BLEU on a host copy."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import TrainConfig
from t2t_keras.training import distribute
from t2t_keras.training.trainer import Trainer
from tests.trainer_test import MODEL, train, weights_of


@pytest.mark.slow
def test_static_per_bucket_resume_equals_uninterrupted(tmp_path):
  """Static shapes read one dataset per bucket, in runs of --static_run_steps steps: a
  restart in the middle of a run (step 7 of runs of 5) continues with exactly the
  batches of an uninterrupted run."""
  from t2t_keras.configs import DataConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  data = pipeline.make_datasets(DataConfig(
      source="synthetic", synthetic_max_length=20, synthetic_vocab_size=16,
      synthetic_train_size=2000, synthetic_eval_size=10, max_length=24, batch_size=128,
      static_shapes=True, bucket_growth=1.5))
  model = dataclasses.replace(MODEL, vocab_size=data.vocab_size)
  runs = {}
  for name, stops in (("straight", [20]), ("resumed", [7, 20])):
    for stop in stops:
      trainer, result = train(tmp_path, name, stop, model=model, dataset_fn=data.train_fn,
                              steps_per_loop=5, static_run_steps=5)
    runs[name] = (trainer, result)
  (straight, _), (resumed, result) = runs["straight"], runs["resumed"]
  assert result.steps == 20 and resumed.current_step() == 20
  assert len(resumed._last_batches.buckets_used) >= 2  # several buckets came up
  for a, b in zip(weights_of(straight), weights_of(resumed)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _shapes_per_step(static, steps=30, accum_steps=1):
  """Per step of a 2-replica MirroredStrategy: the shapes each replica's batches have."""
  from t2t_keras.configs import DataConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  config = DataConfig(source="synthetic", synthetic_max_length=20, synthetic_vocab_size=16,
                      synthetic_train_size=3000, synthetic_eval_size=10, max_length=24,
                      batch_size=128, static_shapes=static,
                      bucket_growth=1.5, accum_steps=accum_steps)
  datasets = pipeline.make_datasets(config)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  iterator = iter(strategy.distribute_datasets_from_function(datasets.train_fn))
  steps_shapes = []
  for _ in range(steps):
    batches = [next(iterator) for _ in range(accum_steps)]
    steps_shapes.append([tuple(t.shape) for b in batches
                         for t in strategy.experimental_local_results(b["targets"])])
  return steps_shapes


@pytest.mark.slow
@pytest.mark.parametrize("accum_steps", [1, 2])
def test_static_shapes_give_every_replica_of_a_step_the_same_shape(accum_steps):
  """On a TPU the cores of one step must get one shape (else XLA compiles per
  combination): every replica and micro-batch of a step shares a bucket, and the
  distinct shapes are the bucket shapes, a small fixed set."""
  steps = _shapes_per_step(static=True, accum_steps=accum_steps)
  assert all(len(set(shapes)) == 1 for shapes in steps), steps
  programs = {shapes[0] for shapes in steps}
  assert 2 <= len(programs) <= 6  # several buckets occur; one program each
  # Without static shapes the check has teeth: consecutive batches differ.
  dynamic = _shapes_per_step(static=False, accum_steps=accum_steps)
  assert any(len(set(shapes)) > 1 for shapes in dynamic)


@pytest.mark.slow
def test_static_two_replicas_equal_one_with_accumulation_on_the_real_pipeline(tmp_path):
  """The per-step bucketing keeps the invariant: with the real pipeline in static mode,
  2 replicas make the updates of 1 replica with --accum_steps=2."""
  from t2t_keras.configs import DataConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  runs = {}
  for name, strategy, accum in (("one", "default", 2), ("two", "mirrored", 1)):
    data = pipeline.make_datasets(DataConfig(
        source="synthetic", synthetic_max_length=12, synthetic_vocab_size=16,
        synthetic_train_size=2000, synthetic_eval_size=10, max_length=16, batch_size=96,
        static_shapes=True, accum_steps=accum, bucket_growth=2.0))  # buckets 8 and 16
    model = dataclasses.replace(MODEL, vocab_size=data.vocab_size)
    runs[name] = train(tmp_path, name, 5, strategy=strategy, model=model,
                       dataset_fn=data.train_fn, accum_steps=accum, learning_rate=0.05,
                       adam_epsilon=1e-4)
  (one, r1), (two, r2) = runs["one"], runs["two"]
  assert two.strategy.num_replicas_in_sync == 2
  assert len(two._last_batches.buckets_used) == 2  # both buckets came up in the 5 steps
  assert r1.target_tokens == r2.target_tokens
  for a, b in zip(weights_of(one), weights_of(two)):
    np.testing.assert_allclose(a, b, atol=1e-6)


# Buckets of 8 and 24 tokens: two XLA programs to compile on 2 replicas (each costs
# seconds), the fewest that can show one program per bucket.
XLA_BUCKET_GROWTH = 3.0


def _compiled_step_signatures(tmp_path, static, steps=None):
  """Trains `steps` steps with XLA on 2 replicas (5 steps per call); returns the input
  shapes the XLA-compiled gradient step was traced for, the buckets used and the
  trainer. steps=None: the fewest of the plan's runs (one bucket each, a host call or
  more each) in which at least 2 buckets come up and one of them twice (so that a
  retrace per call would show)."""
  from t2t_keras.configs import DataConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  datasets = pipeline.make_datasets(DataConfig(
      source="synthetic", synthetic_max_length=20, synthetic_vocab_size=16,
      synthetic_train_size=2000, synthetic_eval_size=10, max_length=24, batch_size=128,
      static_shapes=static, bucket_growth=XLA_BUCKET_GROWTH))
  config = TrainConfig(model_dir=str(tmp_path / f"static{static}"), strategy="mirrored",
                       train_steps=steps, jit_compile=True, steps_per_loop=5,
                       log_every=10, eval_every=1000, save_checkpoint_steps=1000,
                       learning_rate_warmup_steps=10)
  run = min(config.steps_per_loop, config.static_run_steps)
  plan = datasets.train_fn.plan(2, run)
  if steps is None:
    runs = next(n for n in range(2, 40)
                if 2 <= len({plan.bucket_of_step(run * r) for r in range(n)}) < n)
    steps = run * runs
    config = dataclasses.replace(config, train_steps=steps)
  keras.utils.set_random_seed(0)
  trainer = Trainer(dataclasses.replace(MODEL, vocab_size=datasets.vocab_size), config,
                    distribute.create_strategy(config))
  assert trainer.strategy.num_replicas_in_sync == 2
  result = trainer.train(datasets.train_fn, progress=lambda line: None)
  assert result.steps == steps and np.isfinite(result.final_loss)
  shapes = [tuple(f.structured_input_signature[0][0]["inputs"].shape)
            for f in trainer._compute_gradients._list_all_concrete_functions()]
  buckets = {plan.bucket_of_step(s) for s in range(steps)}
  return shapes, buckets, trainer


@pytest.mark.slow
def test_xla_on_two_replicas_compiles_one_program_per_bucket(tmp_path):
  """The TPU setting on 2 logical CPUs: with static shapes every batch the compiled
  step is traced for has a fully static shape, one per bucket used (XLA compiles each
  once); the loop of 5 steps is traced once per bucket too. Without static shapes the
  step is traced for [None, None], which XLA recompiles for every new shape: the check
  fails."""
  from t2t_keras.configs import DataConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  shapes, buckets, trainer = _compiled_step_signatures(tmp_path, static=True)
  runs = trainer.current_step() // min(5, trainer.config.static_run_steps)
  assert all(None not in shape for shape in shapes), shapes
  lengths = pipeline.bucket_boundaries(DataConfig().bucket_min, 24, XLA_BUCKET_GROWTH)
  assert {length for _, length in shapes} <= set(lengths)  # padded to bucket lengths
  assert len(buckets) >= 2 and len(set(shapes)) == len(buckets), (shapes, buckets)
  assert runs > len(buckets)  # a bucket comes up in two runs: a retrace would show
  assert trainer.train_fn.experimental_get_tracing_count() == len(buckets)
  shapes, _, _ = _compiled_step_signatures(tmp_path, static=False, steps=1)
  assert any(None in shape for shape in shapes)


def _eval_datasets(static):
  """A dev set of 60 pairs over both buckets (8 and 24 tokens: 16 and 5 rows), whose
  batches straddle the buckets and end partly filled."""
  from t2t_keras.configs import DataConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  return pipeline.make_datasets(DataConfig(
      source="synthetic", synthetic_max_length=20, synthetic_vocab_size=16,
      synthetic_train_size=200, synthetic_eval_size=60, max_length=24, batch_size=128,
      static_shapes=static, bucket_growth=XLA_BUCKET_GROWTH))


@pytest.mark.slow  # XLA compiles the 2 buckets' programs on 2 replicas: about 20 s
def test_static_eval_on_two_replicas_is_one_program_per_bucket_with_the_dynamic_loss(
    tmp_path, monkeypatch):
  """--static_shapes --jit_compile on 2 replicas: evaluation runs one program per dev
  bucket, traced for the bucket's static shape on both replicas (also in a second
  evaluation: no retrace), every step gives both replicas one shape (padding batches
  and rows are masked), and the dev loss is the dynamic evaluation's."""
  from t2t_keras.data.batching import pipeline  # pylint: disable=import-outside-toplevel
  static_data, dynamic_data = _eval_datasets(True), _eval_datasets(False)
  config = TrainConfig(model_dir=str(tmp_path / "m"), strategy="mirrored", train_steps=1,
                       jit_compile=True)
  keras.utils.set_random_seed(0)
  trainer = Trainer(dataclasses.replace(MODEL, vocab_size=static_data.vocab_size), config,
                    distribute.create_strategy(config))
  strategy = trainer.strategy
  assert strategy.num_replicas_in_sync == 2
  traced, run = [], strategy.run  # per trace of an eval program: each replica's shape

  def recording_run(fn, args=(), kwargs=None, options=None):
    traced.append([tuple(t.shape) for t in
                   strategy.experimental_local_results(args[0]["targets"])])
    return run(fn, args=args, kwargs=kwargs, options=options)
  monkeypatch.setattr(strategy, "run", recording_run)
  lines = []
  static = trainer.evaluate(static_data.eval_fn, progress=lines.append)
  again = trainer.evaluate(static_data.eval_fn, progress=lines.append)
  programs = list(traced)
  dynamic = trainer.evaluate(dynamic_data.eval_fn)
  lengths = pipeline.bucket_boundaries(8, 24, XLA_BUCKET_GROWTH)
  shapes = {(128 // n, n) for n in lengths}
  assert 1 <= len(programs) <= len(lengths), programs
  for replicas in programs:  # each program: one static bucket shape on both replicas
    assert len(replicas) == 2 and len(set(replicas)) == 1 and replicas[0] in shapes, programs
  assert len({r[0] for r in programs}) == len(programs) == 2, programs  # both buckets
  assert sum("eval program" in line for line in lines) == len(programs), lines
  # What each replica receives, step by step, from the dev data of static mode.
  steps = [[tuple(t.shape) for t in strategy.experimental_local_results(b["targets"])]
           for b in strategy.distribute_datasets_from_function(static_data.eval_fn)]
  assert all(len(set(s)) == 1 and s[0] in shapes for s in steps), steps
  assert static["tokens"] == dynamic["tokens"] == again["tokens"]
  for key in ("loss", "perplexity", "accuracy"):
    assert static[key] == pytest.approx(dynamic[key], rel=1e-5, abs=1e-5), key
    assert again[key] == static[key], key


def test_dev_bleu_under_two_replicas_decodes_a_host_copy_as_the_plain_decode(monkeypatch):
  """The dev-BLEU decode of a run on 2 replicas with --static_shapes --jit_compile reads
  a plain copy of the weights on the host (as it must where the training weights live
  on an accelerator), refreshed at each evaluation: it gives the plain decode's
  translations of the current weights."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras import metrics
  from t2t_keras.training import evaluator
  from t2t_keras.inference import decoding, translate
  from t2t_keras.configs import DataConfig, DecodeConfig
  from t2t_keras.data.tokens import tokenizer
  from t2t_keras.data.sources import sources
  from t2t_keras.model import create_model
  data = DataConfig(synthetic_task="copy", synthetic_vocab_size=8, synthetic_eval_size=6,
                    static_shapes=True)
  source = sources.data_source(data)
  model_config = dataclasses.replace(MODEL, vocab_size=source.vocab_size)
  config = TrainConfig(model_dir="unused", strategy="mirrored", jit_compile=True)
  keras.utils.set_random_seed(1)
  trainer = Trainer(model_config, config, distribute.create_strategy(config))
  integers = tokenizer.IntegerTokenizer(source.vocab_size)
  decode_config = DecodeConfig(beam_size=2, extra_decode_length=2)
  # The model the hook decodes with: the one its decoding function is made for.
  decoded, real_make = [], decoding.make_decode_fn
  monkeypatch.setattr(decoding, "make_decode_fn", lambda model, *args, **kwargs: (
      decoded.append(model) or real_make(model, *args, **kwargs)))
  hook = evaluator.dev_bleu_hook(trainer.model, integers, data, decode_config, 4,
                             strategy=trainer.strategy)
  monkeypatch.setattr(decoding, "make_decode_fn", real_make)
  # Training moves the weights after the hook is made.
  rng = np.random.default_rng(2)
  trainer.model.set_weights([w + rng.normal(0, 0.5, w.shape).astype(w.dtype)
                             for w in trainer.model.get_weights()])
  hypotheses, real_report = [], metrics.bleu_report
  monkeypatch.setattr(metrics, "bleu_report",
                      lambda hyps, refs: hypotheses.append(hyps) or real_report(hyps, refs))
  hook(1)
  (model,), (texts,) = decoded, hypotheses
  assert model is not trainer.model
  assert not any(isinstance(v.value, tf.distribute.DistributedValues)
                 for v in model.variables)  # plain variables ...
  assert all("CPU" in v.value.device for v in model.variables)  # ... on the host
  plain = create_model(model_config)
  plain.set_weights(trainer.model.get_weights())
  expected = translate.translate(decoding.make_decode_fn(plain, decode_config), integers,
                                 source.dev_pairs(4)[0], decode_config, progress=False)
  assert texts == [o.texts[0] for o in expected]
  assert len(set(texts)) > 1, texts  # outputs that tell weights apart
