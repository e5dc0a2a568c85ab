"""Training on one replica: schedules, loss by hand, padding, resume, NaN, intervals,
time budget, accumulation, checkpoints; tests/trainer_replicas_test.py and
tests/trainer_static_test.py build on the helpers here."""

import dataclasses
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.trained import modeldir
from t2t_keras import EOS_ID, PAD_ID, errors
from t2t_keras.configs import ModelConfig, TrainConfig
from t2t_keras.trained import checkpoints
from t2t_keras.training import distribute, losses
from t2t_keras.training.schedules import TransformerSchedule
from t2t_keras.training.trainer import Trainer, TrainingError


V = 24
MODEL = ModelConfig(vocab_size=V, hidden_size=16, filter_size=32, num_heads=2,
                    num_hidden_layers=1, layer_prepostprocess_dropout=0.0)


def test_paper_schedule_values():
  schedule = TransformerSchedule(512, 4000)
  for step in (1, 100, 4000, 10000):
    expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
    assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)
  peak = float(schedule(3999))
  assert peak > float(schedule(3998)) and peak > float(schedule(4000))


def test_t2t_schedule_values():
  schedule = TransformerSchedule(512, 8000, multiplier=2.0, kind="t2t")
  for step in (1, 8000, 20000):
    expected = 2.0 * min(1, step / 8000) * max(step, 8000) ** -0.5 * 512 ** -0.5
    assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)


def test_label_smoothing_loss_by_hand():
  rng = np.random.default_rng(0)
  v, eps = 6, 0.1
  logits = rng.normal(size=(1, 2, v)).astype("float32")
  targets = np.array([[4, PAD_ID]], "int32")
  loss = np.asarray(losses.smoothed_cross_entropy(logits, targets, eps))
  log_probs = logits[0, 0] - np.log(np.exp(logits[0, 0]).sum())
  q = np.full(v, eps / (v - 2))
  q[4], q[PAD_ID] = 1 - eps, 0.0
  entropy = -sum(p * math.log(p) for p in q if p > 0)
  assert loss[0, 0] == pytest.approx(-(q * log_probs).sum() - entropy, rel=1e-5)
  assert loss[0, 1] == 0.0  # padding position
  # A perfect (one-hot-ish towards q) prediction has loss ~0 after the constant.
  perfect = np.log(np.where(q > 0, q, 1e-30))[None, None].astype("float32")
  assert abs(float(losses.smoothed_cross_entropy(perfect, targets[:, :1], eps)[0, 0])) < 1e-4


def batch_data(rng, batch, src_len, tgt_len):
  inputs = rng.integers(4, V, size=(batch, src_len)).astype("int32")
  targets = rng.integers(4, V, size=(batch, tgt_len)).astype("int32")
  inputs[:, -1] = targets[:, -1] = EOS_ID
  return {"inputs": inputs, "targets": targets}


def test_padding_changes_neither_loss_nor_gradients():
  keras.utils.set_random_seed(0)
  trainer = Trainer(MODEL, TrainConfig(label_smoothing=0.1))
  rng = np.random.default_rng(1)
  batch = batch_data(rng, 2, 5, 4)
  padded = {k: np.pad(v, ((0, 0), (0, 3)), constant_values=PAD_ID) for k, v in batch.items()}
  results = []
  for b in (batch, padded):
    grads, loss_sum, tokens, _ = trainer._gradients(b, tf.constant(8.0))
    results.append((grads, float(loss_sum), float(tokens)))
  assert results[0][1] == pytest.approx(results[1][1], rel=1e-5)
  assert results[0][2] == results[1][2] == 8.0
  for g1, g2 in zip(results[0][0], results[1][0]):
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), atol=1e-5)


def make_dataset_fn(num_batches=8, global_batch=4, seed=0):
  """Same global batches for any replica count: each replica gets a slice."""
  rng = np.random.default_rng(seed)
  data = [batch_data(rng, global_batch, 3 + i % 4, 2 + i % 5) for i in range(num_batches)]

  def dataset_fn(ctx):
    per_replica = ctx.get_per_replica_batch_size(global_batch)
    dataset = None
    for b in data:
      for start in range(0, global_batch, per_replica):
        piece = tf.data.Dataset.from_tensors({k: v[start:start + per_replica]
                                              for k, v in b.items()})
        dataset = piece if dataset is None else dataset.concatenate(piece)
    return dataset.repeat()
  return dataset_fn


def train(tmp_path, name, steps, strategy="default", seed=0, model=MODEL, dataset_fn=None,
          **overrides):
  keras.utils.set_random_seed(seed)
  settings = dict(log_every=2, eval_every=100, save_checkpoint_steps=2,
                  learning_rate_warmup_steps=4, label_smoothing=0.1)
  config = TrainConfig(model_dir=str(tmp_path / name), train_steps=steps, strategy=strategy,
                       **{**settings, **overrides})
  trainer = Trainer(model, config, distribute.create_strategy(config))
  result = trainer.train(dataset_fn or make_dataset_fn(), progress=lambda line: None)
  return trainer, result


def weights_of(trainer):
  return [np.asarray(w) for w in trainer.model.weights]


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path):
  straight, _ = train(tmp_path, "straight", 6)
  train(tmp_path, "resumed", 2)  # stops after a checkpoint at step 2 ...
  resumed, result = train(tmp_path, "resumed", 6, seed=123)  # ... and resumes (new seed)
  assert result.steps == 6 and resumed.current_step() == 6
  for a, b in zip(weights_of(straight), weights_of(resumed)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_nan_loss_stops_with_step_and_keeps_checkpoint(tmp_path):
  train(tmp_path, "nan", 2)
  with pytest.raises(TrainingError, match=r"loss became nan at step [34].*ckpt-2"):
    train(tmp_path, "nan", 6, learning_rate=float("nan"))
  assert tf.train.latest_checkpoint(str(tmp_path / "nan")).endswith("ckpt-2")


def test_model_dir_refuses_another_shape(tmp_path):
  model_dir = str(tmp_path / "m")
  modeldir.write_or_check_config(model_dir, MODEL)
  modeldir.write_or_check_config(model_dir, MODEL)  # same shape: fine
  other = ModelConfig(**{**MODEL.__dict__, "hidden_size": 32, "num_heads": 4})
  with pytest.raises(errors.ModelDirError,
                     match=r"--hidden_size: saved 16, requested 32.*--num_heads: saved 2"):
    modeldir.write_or_check_config(model_dir, other)
  assert modeldir.load_model_config(model_dir) == MODEL
  relative = ModelConfig(**{**MODEL.__dict__, "position_embedding": "relative",
                            "max_relative_position": 8})
  modeldir.write_or_check_config(str(tmp_path / "r"), relative)
  with pytest.raises(errors.ModelDirError, match=r"--max_relative_position: saved 8, "
                     "requested 16"):
    modeldir.write_or_check_config(str(tmp_path / "r"), ModelConfig(
        **{**relative.__dict__, "max_relative_position": 16}))


@pytest.mark.slow
def test_corrupt_checkpoint_gives_clear_error(tmp_path):
  train(tmp_path, "corrupt", 2)
  model_dir = tmp_path / "corrupt"
  for data_file in model_dir.glob("ckpt-2.data-*"):
    data_file.write_bytes(b"garbage")
  with pytest.raises(errors.CheckpointError, match=r"cannot restore checkpoint .*ckpt-2"):
    train(tmp_path, "corrupt", 4)


def test_eval_sums_match_definitions():
  rng = np.random.default_rng(5)
  logits = rng.normal(size=(2, 3, 7)).astype("float32")
  targets = np.array([[4, 5, PAD_ID], [6, 1, 4]], "int32")
  loss, nll, correct, tokens = (float(x) for x in losses.loss_sums(logits, targets, 0.1))
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  mask = targets != PAD_ID
  picked = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  assert tokens == 5
  assert nll == pytest.approx(-(picked * mask).sum(), rel=1e-5)
  assert correct == ((logits.argmax(-1) == targets) & mask).sum()
  smoothed = losses.smoothed_cross_entropy(logits, targets, 0.1)
  assert loss == pytest.approx(float(np.sum(smoothed)), rel=1e-6)


def test_evaluation_traces_once_for_every_dev_shape_and_sums_each_batch(tmp_path):
  """Dev batches of 4 lengths and 5 target lengths: one trace (from the dataset's spec),
  and the totals of each batch's loss sums."""
  keras.utils.set_random_seed(0)
  config = TrainConfig(model_dir=str(tmp_path / "m"), train_steps=1, label_smoothing=0.1)
  trainer = Trainer(MODEL, config, distribute.create_strategy(config))
  dataset_fn = lambda ctx: make_dataset_fn(num_batches=8)(ctx).take(8)  # noqa: E731
  got = trainer.evaluate(dataset_fn)
  assert trainer._eval_fn.experimental_get_tracing_count() == 1  # pylint: disable=protected-access
  sums = np.zeros(4)
  for batch in dataset_fn(tf.distribute.InputContext()):
    logits = trainer.model(batch, training=False)
    sums += [float(v) for v in losses.loss_sums(logits, batch["targets"], 0.1)]
  assert got["tokens"] == sums[3] and got["loss"] == pytest.approx(sums[0] / sums[3], rel=1e-5)
  assert got["accuracy"] == sums[2] / sums[3]
  trainer.evaluate(dataset_fn)  # a second evaluation reuses the trace
  assert trainer._eval_fn.experimental_get_tracing_count() == 1  # pylint: disable=protected-access


@pytest.mark.slow
def test_time_budget_stops_with_a_checkpoint_and_logs_eval_time(tmp_path):
  """--train_minutes ends training early, saves, evaluates; eval time is not counted."""
  from t2t_keras.learning_curves import read_scalars  # pylint: disable=import-outside-toplevel
  clock = {"now": 1000.0}
  config = TrainConfig(model_dir=str(tmp_path / "budget"), train_steps=50, log_every=1,
                       eval_every=2, save_checkpoint_steps=100, train_minutes=1.0,
                       learning_rate_warmup_steps=4)
  trainer = Trainer(MODEL, config, distribute.create_strategy(config))
  trainer.clock = lambda: clock["now"]
  lines, hook_steps = [], []

  def progress(line):  # each step's progress line: that step "took" 10 s of training
    lines.append(line)
    if line.startswith("step "):
      clock["now"] += 10.0

  def hook(step):  # evaluation "takes" 100 s, which the budget must not count
    hook_steps.append(step)
    clock["now"] += 100.0
    return {"bleu": 12.5}
  eval_fn = lambda ctx: make_dataset_fn(num_batches=2)(ctx).take(2)  # one finite pass
  result = trainer.train(make_dataset_fn(), eval_fn, progress=progress, eval_hook=hook)
  # Checked after step k: 10 (k - 1) s trained; 60 s reached after step 7, despite
  # 300 s of evaluations before it.
  assert result.steps == 7, lines
  assert trainer.current_step() == 7
  assert tf.train.latest_checkpoint(str(tmp_path / "budget")).endswith("ckpt-7")
  assert hook_steps == [2, 4, 6, 7]
  assert any("stopping at step 7" in line and "budget is spent" in line for line in lines)
  assert any("bleu 12.50" in line for line in lines)
  scalars = read_scalars(str(tmp_path / "budget" / "eval"))
  assert [s for s, _ in scalars["bleu"]] == [2, 4, 6, 7]
  np.testing.assert_allclose([m for _, m in scalars["train_minutes"]],
                             [20 / 60, 40 / 60, 60 / 60, 70 / 60], atol=1e-6)


@pytest.mark.slow
def test_gradient_accumulation_equals_one_bigger_batch(tmp_path):
  """--accum_steps=2 over micro-batches == one update on their concatenation."""
  rng = np.random.default_rng(7)
  micro = [batch_data(rng, 2, 5, 4) for _ in range(6)]  # 3 updates x 2 micro-batches
  for m in micro:  # different padding per micro-batch: normalisation must be global
    m["targets"][0, -2:] = [EOS_ID, PAD_ID]
  big = [{k: np.concatenate([micro[2 * i][k], micro[2 * i + 1][k]]) for k in micro[0]}
         for i in range(3)]

  def fn_of(batches):
    return lambda ctx: tf.data.Dataset.from_tensor_slices(
        {k: np.stack([b[k] for b in batches]) for k in batches[0]}).repeat()

  settings = dict(learning_rate=0.05, adam_epsilon=1e-4, label_smoothing=0.1, log_every=3,
                  eval_every=100, save_checkpoint_steps=3, learning_rate_warmup_steps=4,
                  train_steps=3)
  results = []
  for name, batches, accum in (("accum", micro, 2), ("big", big, 1)):
    keras.utils.set_random_seed(0)
    config = TrainConfig(model_dir=str(tmp_path / name), accum_steps=accum, **settings)
    trainer = Trainer(MODEL, config, distribute.create_strategy(config))
    result = trainer.train(fn_of(batches), progress=lambda line: None)
    results.append((trainer, result))
  (accum_trainer, accum_result), (big_trainer, big_result) = results
  assert accum_trainer.current_step() == big_trainer.current_step() == 3
  assert accum_result.target_tokens == big_result.target_tokens
  assert accum_result.final_loss == pytest.approx(big_result.final_loss, rel=1e-6)
  for a, b in zip(weights_of(accum_trainer), weights_of(big_trainer)):
    np.testing.assert_allclose(a, b, atol=1e-6)


class _Repeating:
  """An iterator that gives the same batch at every `next`: the train loop's reads."""

  def __init__(self, batch):
    self.batch = batch

  def __next__(self):
    return self.batch


def _train_program(accum_steps):
  """(instructions, dot products) of the HLO of the train loop with `accum_steps`
  micro-batches, compiled whole, as a TPU compiles `strategy.run`'s step (the iterator
  replaced by tensors, which XLA cannot take)."""
  keras.utils.set_random_seed(0)
  trainer = Trainer(MODEL, TrainConfig(accum_steps=accum_steps))
  batch = batch_data(np.random.default_rng(0), 2, 5, 4)
  loop = tf.function(lambda b, n: trainer._train_loop(_Repeating(b), n), autograph=False,
                     jit_compile=True)
  hlo = loop.experimental_get_compiler_ir(batch, tf.constant(1))(stage="hlo")
  return sum(" = " in line for line in hlo.splitlines()), hlo.count(" dot(")


def test_accumulation_is_a_loop_not_k_copies_of_the_step():
  """--accum_steps=4 compiles one forward and backward pass, as 1 does: its matrix
  products appear once (unrolled, 4 times) and the program is about as big (the loop
  adds a few instructions per variable; unrolled, it was 2.1 times bigger)."""
  instructions_1, dots_1 = _train_program(1)
  instructions_4, dots_4 = _train_program(4)
  assert dots_1 > 0 and dots_4 == dots_1
  assert instructions_4 < 1.25 * instructions_1, (instructions_1, instructions_4)


@pytest.mark.slow
def test_checkpoint_holds_dropout_seed_state(tmp_path):
  """Resuming restores the dropout layers' seed generators (same masks as uninterrupted)."""
  model = dataclasses.replace(MODEL, layer_prepostprocess_dropout=0.3)
  config = TrainConfig(model_dir=str(tmp_path / "seeds"), train_steps=2, log_every=1,
                       eval_every=100, save_checkpoint_steps=1, learning_rate_warmup_steps=4)
  keras.utils.set_random_seed(0)
  trainer = Trainer(model, config, distribute.create_strategy(config))
  trainer.train(make_dataset_fn(), progress=lambda line: None)
  seeds = trainer.checkpoint().dropout_seeds
  assert len(seeds) > 0
  saved = [s.numpy().copy() for s in seeds]
  keras.utils.set_random_seed(99)  # a fresh process would seed them differently
  fresh = Trainer(model, config, distribute.create_strategy(config))
  assert any((s.numpy() != t).any() for s, t in zip(fresh.checkpoint().dropout_seeds, saved))
  checkpoint = fresh.checkpoint()
  checkpoints.restore(checkpoint, tf.train.latest_checkpoint(config.model_dir))
  for s, t in zip(checkpoint.dropout_seeds, saved):
    np.testing.assert_array_equal(s.numpy(), t)


def _pieces_dataset(pieces):
  dataset = None
  for piece in pieces:
    d = tf.data.Dataset.from_tensors(piece)
    dataset = d if dataset is None else dataset.concatenate(d)
  return dataset


@pytest.mark.slow
def test_weights_made_non_finite_are_never_saved(tmp_path):
  """An update that overflows the weights (finite loss before it) must not be saved
  and later trusted as "the last good checkpoint"."""
  train(tmp_path, "inf", 2)  # ckpt-2 is good
  with pytest.raises(TrainingError, match=r"non-finite.*ckpt-2"):
    train(tmp_path, "inf", 6, learning_rate=float("inf"), log_every=1,
          save_checkpoint_steps=1)
  model_dir = str(tmp_path / "inf")
  assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-2")
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  for name in reader.get_variable_to_shape_map():
    value = reader.get_tensor(name)
    if np.issubdtype(np.asarray(value).dtype, np.floating):
      assert np.isfinite(value).all(), name


@pytest.mark.slow
def test_every_interval_is_honoured(tmp_path):
  """Intervals that do not divide each other are each kept (before, --log_every=3 with
  saves every 4 stopped only at multiples of 3: checkpoints came every 12 steps)."""
  lines = []
  keras.utils.set_random_seed(0)
  config = TrainConfig(model_dir=str(tmp_path / "iv"), train_steps=12, log_every=3,
                       eval_every=5, save_checkpoint_steps=4, keep_checkpoint_max=10,
                       learning_rate_warmup_steps=4, steps_per_loop=10)
  trainer = Trainer(MODEL, config, distribute.create_strategy(config))
  eval_fn = lambda ctx: make_dataset_fn(num_batches=2)(ctx).take(2)  # noqa: E731
  result = trainer.train(make_dataset_fn(), eval_fn, progress=lines.append)
  logged = [int(l.split()[1].split("/")[0]) for l in lines if l.startswith("step ")]
  evaluated = [int(l.split()[3].rstrip(":")) for l in lines if l.startswith("eval at")]
  saved = [int(p.rsplit("-", 1)[1])
           for p in checkpoints.listed_checkpoints(str(tmp_path / "iv"))]
  assert logged == [3, 6, 9, 12]
  assert evaluated == [5, 10, 12]
  assert saved == [4, 8, 12]
  # --steps_per_loop=10 stops at each interval's multiple: 3 4 5 6 8 9 10 12.
  assert result.host_calls == 8


def test_dev_bleu_reads_the_dev_pairs_of_any_source(monkeypatch):
  """Dev BLEU asks the data source for its dev pairs: the synthetic task's held-out
  set works as the --dev_src/--dev_tgt files do."""
  from t2t_keras.training import evaluator  # pylint: disable=import-outside-toplevel
  from t2t_keras.configs import DataConfig, DecodeConfig  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.tokens import tokenizer  # pylint: disable=import-outside-toplevel
  from t2t_keras.data.sources import sources  # pylint: disable=import-outside-toplevel
  from t2t_keras.model import create_model  # pylint: disable=import-outside-toplevel
  import sacrebleu  # pylint: disable=import-outside-toplevel
  from t2t_keras import metrics  # pylint: disable=import-outside-toplevel
  data = DataConfig(synthetic_task="copy", synthetic_vocab_size=8, synthetic_eval_size=6)
  source = sources.data_source(data)
  keras.utils.set_random_seed(6)  # an untrained model whose outputs score above 0 BLEU
  model = create_model(dataclasses.replace(MODEL, vocab_size=source.vocab_size))
  integers = tokenizer.IntegerTokenizer(source.vocab_size)
  config = DecodeConfig(beam_size=1, extra_decode_length=2)
  hook = evaluator.dev_bleu_hook(model, integers, data, config, 4)
  calls, real = [], metrics.bleu_report
  monkeypatch.setattr(metrics, "bleu_report",
                      lambda hyps, refs: calls.append((hyps, refs)) or real(hyps, refs))
  result = hook(0)
  (hypotheses, references), = calls
  dev_sources, dev_references = source.dev_pairs(4)
  assert references == [dev_references] and len(hypotheses) == 4
  assert hypotheses != dev_sources  # the untrained model's outputs, not its inputs
  # The hook returns sacreBLEU of its hypotheses, recomputed here: above 0, so that a
  # score not computed from them shows (another seed if a new Keras initialises
  # otherwise and this model's outputs share no word with the references).
  bleu = sacrebleu.corpus_bleu(hypotheses, [dev_references]).score
  assert bleu > 0.0, (hypotheses, dev_references)
  assert result == pytest.approx({"bleu": bleu}, abs=1e-9), (result, bleu, hypotheses)


def test_releasing_the_iterators_does_not_wait_for_their_deletion():
  """Deleting a tf.data iterator can wait seconds for its autotuning thread: the end
  of training drops them on a thread of its own and goes on; they are still deleted."""
  import threading  # pylint: disable=import-outside-toplevel

  from t2t_keras.training import trainer as trainer_lib  # pylint: disable=import-outside-toplevel
  may_finish, deleted = threading.Event(), threading.Event()

  class SlowToDelete:
    def __del__(self):
      may_finish.wait(10)  # a synchronous release would sit here for 10 s
      deleted.set()

  for per_bucket in (True, False):
    may_finish.clear()
    deleted.clear()
    batches = object.__new__(trainer_lib._Batches)  # pylint: disable=protected-access
    batches.per_bucket = per_bucket
    if per_bucket:
      batches.iterators = {2: SlowToDelete()}
    else:
      batches.single = SlowToDelete()
    batches.release()
    assert not deleted.is_set()  # release came back while the deletion waits
    may_finish.set()
    assert deleted.wait(30)
    if per_bucket:
      assert batches.buckets_used == [2] and batches.iterators == {}
    else:
      assert batches.single is None
