"""A training run: `train_and_evaluate(model, data, train, decode, run configs)`.

What `python -m t2t_keras.train` does once its flags are configs, callable from Python
with configs built in code (no flags read): the strategy, the data and the model
directory's files (written by the chief), fine-tuning's start (`--init_from`), the
trainer with its dev evaluation (dev BLEU: `evaluator.dev_bleu_hook`), then the actions
after training. The actions, as orbit's, are small callables the run calls in turn
once training has finished (`AFTER_TRAINING`): printing dev examples and exporting a
SavedModel, each deciding from the configs whether it has anything to do.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Optional, Sequence

import keras
import tensorflow as tf

from t2t_keras.trained import modeldir
from t2t_keras.trained.checkpoints import listed_checkpoints
from t2t_keras.configs import DataConfig, DecodeConfig, ModelConfig, RunConfig, TrainConfig
from t2t_keras.data.sources import sources
from t2t_keras.data.batching import service
from t2t_keras.data import make_datasets
from t2t_keras.errors import DataError, UserError
from t2t_keras.export import saved_model
from t2t_keras.inference import translate
from t2t_keras.model import create_model
from t2t_keras.training import distribute, init_from
from t2t_keras.training.evaluator import DecodingWeights, dev_bleu_hook
from t2t_keras.training.trainer import PREEMPTED_EXIT_CODE, Trainer, format_duration


def print_model(config: ModelConfig) -> None:
  """--dry_run: builds the model without any data and prints its summary, the last line
  `parameters: <count>`."""
  model = create_model(config)
  model.summary(print_fn=lambda line, *args, **kwargs: print(line))
  print(f"encoder layers: {config.encoder_layers}, decoder layers: {config.decoder_layers}, "
        f"d_model {config.hidden_size}, d_ff {config.filter_size}, heads "
        f"{config.num_heads} (d_k {config.head_key_size}, d_v {config.head_value_size}), "
        f"vocabulary {config.vocab_size}")
  print(f"parameters: {model.count_params()}")


def prepare(agreement, model_config, data_config, train_config, decode_config,
            run_config=RunConfig()):
  """Data, model config and the model directory's files, written by the chief alone.

  The chief validates the data and builds the vocabulary and the tokenized caches
  first; the other workers wait for it (one collective) and then read what it wrote,
  so no file is written twice and no worker reads a half-written one. A chief that
  fails here tells the others, which stop too instead of waiting forever.

  Returns:
    (datasets, model_config with the vocabularies' sizes, the vocabulary file in
    model_dir or None).
  """
  def load():
    datasets = make_datasets(data_config)
    return datasets, dataclasses.replace(
        model_config, vocab_size=datasets.vocab_size or model_config.vocab_size,
        target_vocab_size=(datasets.target_vocab_size
                           or model_config.target_vocab_size)).validate()

  model_dir = train_config.model_dir
  stopped = UserError("another worker stopped while preparing the data and the model "
                      "directory; its output says why.")
  if not agreement.chief:
    if agreement.barrier():  # wait for the chief's files
      raise stopped
    try:
      datasets, model_config = load()
    except BaseException:
      agreement.barrier(failed=True)
      raise
    if agreement.barrier():  # every worker has read them
      raise stopped
    return datasets, model_config, modeldir.vocab_file_of(datasets.tokenizer, model_dir)
  try:
    datasets, model_config = load()
    # The decoding flags this run was given are the recipe's way to decode the model:
    # decode, score and export read them back when not given them (flags.use_recipe).
    modeldir.write_or_check_config(model_dir, model_config, data=data_config,
                                   train=train_config, decode=decode_config,
                                   recipe_decoding=run_config.recipe_decoding or {})
    vocab = modeldir.save_vocab(datasets.tokenizer, model_dir)
    if run_config.flags_text:
      modeldir.append_flags(model_dir, run_config.flags_text)
  except BaseException:
    agreement.barrier(failed=True)
    raise
  agreement.barrier()
  if agreement.barrier():  # every worker has read them
    raise stopped
  return datasets, model_config, vocab


class Finished(NamedTuple):
  """What the actions after training get: the trained model (the host copy of its
  weights, see `evaluator.DecodingWeights`), its data and the run's configs."""

  model: keras.Model
  datasets: object  # data.Datasets
  vocab: Optional[str]
  data_config: DataConfig
  train_config: TrainConfig
  decode_config: DecodeConfig
  run_config: RunConfig


@dataclasses.dataclass(frozen=True)
class Action:
  """Something the run does after training, as orbit's actions: `act(finished)`, where
  `wanted(run_config, datasets)` says there is work (the host copy of the weights is
  made only then)."""

  wanted: Callable[[RunConfig, object], bool]
  act: Callable[[Finished], None]


def show_examples(done: Finished) -> None:
  """--show_examples / --dev_exact_match: dev sentences decoded after training."""
  translate.report_examples(done.model, done.datasets, done.decode_config,
                            done.run_config.show_examples,
                            whole_dev_set=done.run_config.dev_exact_match)


def export(done: Finished) -> None:
  """--export / --export_dir: a SavedModel of the trained model."""
  model_dir = done.train_config.model_dir
  translator = saved_model.Translator(done.model, done.datasets.tokenizer,
                                      done.decode_config, vocab_file=done.vocab,
                                      data_config=done.data_config)
  path = saved_model.export(translator, done.run_config.export_dir or
                            modeldir.default_export_dir(model_dir),
                            model_dir=model_dir,  # for the model card
                            checkpoints=listed_checkpoints(model_dir)[-1:])
  limits = translator.limits
  print(f"exported {path} (serving_default: strings in, translations out; per request "
        f"at most {limits.max_rows} rows, {limits.max_string_bytes} bytes per string, "
        f"{limits.max_tokens} source tokens: the defaults, python -m t2t_keras.export "
        "sets others)", flush=True)


# The actions after training, in order; the chief alone runs them (written once).
AFTER_TRAINING = (
    Action(lambda run, datasets: bool((run.show_examples or run.dev_exact_match)
                                      and datasets.eval_fn is not None), show_examples),
    Action(lambda run, datasets: bool(run.export or run.export_dir), export),
)


def train_and_evaluate(model_config: ModelConfig, data_config: DataConfig,
                       train_config: TrainConfig, decode_config: DecodeConfig,
                       run_config: RunConfig = RunConfig(),
                       actions: Sequence[Action] = AFTER_TRAINING):
  """Trains (or resumes) the model in `train_config.model_dir`, then runs `actions`.

  Args:
    model_config: the architecture; its vocabulary sizes are the data's.
    data_config: the training and dev data.
    train_config: the optimisation, distribution and checkpoints.
    decode_config: how dev BLEU, the examples and the export decode.
    run_config: dev BLEU, the actions' settings and what the run records of its
      command line.
    actions: run in turn by the chief after training, those `wanted`.

  Returns:
    The trainer's `TrainResult` (`preempted`: stopped by a stop signal with a
    checkpoint; the train command exits with PREEMPTED_EXIT_CODE).

  Raises:
    distribute.WorkerLostError: a worker was lost; its `command` is
      `run_config.resume_command`.
  """
  try:
    return _train_and_evaluate(model_config, data_config, train_config, decode_config,
                               run_config, actions)
  except distribute.WorkerLostError as error:
    error.command = run_config.resume_command
    raise


def _train_and_evaluate(model_config, data_config, train_config, decode_config,
                        run_config, actions):
  tf.get_logger().setLevel("WARNING")  # TF's own INFO chatter (saver timings, ...)
  strategy = distribute.create_strategy(train_config)  # first: it may split the CPU
  agreement = distribute.Agreement(strategy)
  if train_config.deterministic:
    tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(train_config.seed)
  dispatchers = []
  if train_config.data_service:  # an absent dispatcher: said now, not a hang at step 1
    dispatchers = service.addresses(train_config.data_service)
    service.check_reachable(dispatchers)
  # --init_from applies once, to a model directory without checkpoints; the chief
  # names the checkpoint every worker starts from.
  init_checkpoint = None
  if train_config.init_from:
    if not tf.train.latest_checkpoint(train_config.model_dir):
      init_checkpoint = init_from.agreed_checkpoint(train_config.init_from, agreement)
    data_config = init_from.init_from_data_config(train_config, data_config,
                                                  init_checkpoint,
                                                  run_config.vocab_file_given)
  # Under a remote master (a pod slice) the vocabulary, the tokenizer and the cache (a
  # tf.data pipeline of tokenizer ops) are made in this process, not on the TPU hosts,
  # which have no tensorflow-text (distribute.on_client).
  with distribute.on_client():
    datasets, model_config, vocab = prepare(agreement, model_config, data_config,
                                            train_config, decode_config, run_config)
  print(f"training {model_config.encoder_layers}+{model_config.decoder_layers} layers, "
        f"d_model {model_config.hidden_size}, vocabulary {model_config.vocab_size} on "
        f"{strategy.num_replicas_in_sync} replica(s)"
        f"{'' if agreement.chief else f' (worker {agreement.worker_id})'}; model_dir "
        f"{train_config.model_dir}", flush=True)
  if ((train_config.keep_best_checkpoint or train_config.early_stopping_patience)
      and datasets.eval_fn is None):
    raise DataError("--keep_best_checkpoint and --early_stopping_patience judge the dev "
                    "set, and this run has none: "
                    f"{sources.data_source(data_config).dev_help}, or drop those flags.")
  plan_key = modeldir.plan_key(data_config, train_config, strategy.num_replicas_in_sync)
  change = modeldir.check_plan(train_config.model_dir, plan_key)
  if change:
    print(change, flush=True)
  trainer = Trainer(model_config, train_config, strategy)
  if init_checkpoint:
    with distribute.on_client():  # the source's tokenizer (--init_from_vocab=new)
      init_from.start_from(trainer, datasets.tokenizer, train_config, init_checkpoint,
                           agreement.chief)
  # The key describes what the checkpoints were trained on: recorded with the first
  # checkpoint of this run, not before (a run that fails before saving changes nothing).
  trainer.on_save = lambda step: modeldir.record_plan(train_config.model_dir, plan_key)
  eval_hook = None
  if run_config.eval_bleu_sentences and datasets.eval_fn is not None:
    # Every worker reads the dev text (a bad file stops them all here); only the chief
    # decodes it (training.evaluator).
    eval_hook = dev_bleu_hook(trainer.model, datasets.tokenizer, data_config, decode_config,
                              run_config.eval_bleu_sentences, train_config.model_dir,
                              strategy=strategy)
  train_fn = datasets.train_fn
  if dispatchers:
    train_fn = service.ServedTrainData(train_fn, dispatchers)
    print(f"training input from tf.data service: {', '.join(dispatchers)}", flush=True)
  result = trainer.train(train_fn, datasets.eval_fn,
                         progress=lambda line: print(line, flush=True), eval_hook=eval_hook)
  if result.already_finished:
    return result
  if result.preempted:
    print(f"stopped by a stop signal at step {result.steps} with a checkpoint; exit code "
          f"{PREEMPTED_EXIT_CODE}: rerun the same command to resume", flush=True)
    return result
  if result.stopped_early:
    print(f"stopped early at step {result.steps}: the dev score stopped improving "
          f"(--early_stopping_patience={train_config.early_stopping_patience})", flush=True)
  print(f"done: {result.steps} steps in {format_duration(result.wall_seconds)}, "
        f"{result.target_tokens:,.0f} target tokens this run, estimated training cost "
        f"{result.flops:.3g} FLOPs this run (matmuls, forward + backward)", flush=True)
  # Examples and the export are the chief's: written once.
  todo = [action for action in actions if action.wanted(run_config, datasets)]
  if not agreement.chief or not todo:
    return result
  # The host copy that dev BLEU decodes (evaluator.DecodingWeights says why): a search
  # or an export traced from the distributed training variables would run on the
  # replicas' devices op by op (a TPU cannot) and read every variable across them.
  weights = DecodingWeights(trainer.model, strategy)
  done = Finished(weights.refresh(), datasets, vocab, data_config, train_config,
                  decode_config, run_config)
  with weights.scope():
    for action in todo:
      action.act(done)
  return result
