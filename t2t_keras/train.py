"""Trains a Transformer: `python -m t2t_keras.train --flagfile=flags/base_en_de.cfg
--model_dir=...`.

A thin entry point: flags -> configs -> library. The same command resumes from the
latest checkpoint in --model_dir. `--dry_run` builds the model without any data,
prints its summary and, as the last line, `parameters: <count>`.
"""

from __future__ import annotations

import dataclasses
import sys

from t2t_keras import console

console.quiet_tensorflow()  # before TensorFlow is imported

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402

from t2t_keras import flags as t2t_flags

FLAGS = flags.FLAGS
t2t_flags.define_all()


def dry_run() -> None:
  from t2t_keras.model import create_model  # pylint: disable=import-outside-toplevel
  config = t2t_flags.model_config()
  model = create_model(config)
  model.summary(print_fn=lambda line, *args, **kwargs: print(line))
  print(f"encoder layers: {config.encoder_layers}, decoder layers: {config.decoder_layers}, "
        f"d_model {config.hidden_size}, d_ff {config.filter_size}, heads "
        f"{config.num_heads} (d_k {config.head_key_size}, d_v {config.head_value_size}), "
        f"vocabulary {config.vocab_size}")
  print(f"parameters: {model.count_params()}")


def dev_bleu_hook(model, tokenizer, data_config, decode_config, n: int,
                  model_dir=None, strategy=None):
  """A Trainer eval hook: sacreBLEU of the first `n` dev sentences, decoded as configured.

  The dev sentences and references are the data source's (`Source.dev_pairs`: the
  --dev_src/--dev_tgt files, a TFDS validation split, the synthetic held-out set);
  the returned function gives {"bleu": cased sacreBLEU}. With `model_dir`, each score
  is also recorded with its step and sacreBLEU's signature (`modeldir.record_dev_bleu`,
  read by the model card). Under the trainer's `strategy` (other than the default) the
  decode runs on a plain copy of the weights on the host (TPU) or the first replica's
  device, refreshed at every call (`evaluator.DecodingWeights` says why).
  """
  # pylint: disable=import-outside-toplevel
  from t2t_keras import metrics
  from t2t_keras.inference import decoding, translate
  from t2t_keras.data.sources import sources as sources_lib
  from t2t_keras.errors import DataError
  from t2t_keras.training.evaluator import DecodingWeights
  source = sources_lib.data_source(data_config)
  pairs = source.dev_pairs(n)
  if pairs is None:
    raise DataError(f"--eval_bleu_sentences needs a dev split: {source.dev_help} (or "
                    "--eval_bleu_sentences=0).")
  sources, references = pairs
  weights = DecodingWeights(model, strategy)
  from t2t_keras import language_tags
  # Whole dev sentences (no cut), into the dev files' language (or None).
  decode_config = dataclasses.replace(
      decode_config, max_input_length=0,
      target_language=language_tags.default_language(data_config))
  decode_fn = decoding.make_decode_fn(weights.model, decode_config)

  def hook(step):
    weights.refresh()
    with weights.scope():
      outputs = translate.translate(decode_fn, tokenizer, sources, decode_config,
                                    progress=False)
    report = metrics.bleu_report([o.texts[0] for o in outputs], [references])
    if model_dir:
      from t2t_keras.trained import modeldir
      modeldir.record_dev_bleu(model_dir, {
          "bleu": report["bleu"], "step": int(step), "signature": report["bleu_signature"],
          "sentences": len(sources), "dev_src": data_config.dev_src,
          "dev_tgt": data_config.dev_tgt})
    return {"bleu": report["bleu"]}
  return hook


def prepare(agreement, data_config, train_config, decode_config):
  """Data, model config and the model directory's files, written by the chief alone.

  The chief validates the data and builds the vocabulary and the tokenized caches
  first; the other workers wait for it (one collective) and then read what it wrote,
  so no file is written twice and no worker reads a half-written one. A chief that
  fails here tells the others, which stop too instead of waiting forever.

  Returns:
    (datasets, model_config, the vocabulary file in model_dir or None).
  """
  # pylint: disable=import-outside-toplevel
  from t2t_keras.trained import modeldir
  from t2t_keras import data
  from t2t_keras.errors import UserError

  def load():
    datasets = data.make_datasets(data_config)
    return datasets, t2t_flags.model_config(vocab_size=datasets.vocab_size,
                                            target_vocab_size=datasets.target_vocab_size)

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
                                   recipe_decoding=t2t_flags.recipe_decoding())
    vocab = modeldir.save_vocab(datasets.tokenizer, model_dir)
    modeldir.append_flags(model_dir, FLAGS.flags_into_string())
  except BaseException:
    agreement.barrier(failed=True)
    raise
  agreement.barrier()
  if agreement.barrier():  # every worker has read them
    raise stopped
  return datasets, model_config, vocab


def init_from_data_config(train_config, data_config, checkpoint):
  """--init_from with --init_from_vocab=source: the data is tokenized with the source
  run's vocabulary (its model directory's copy; on a restart, `checkpoint` None, this
  run's own copy of it when the source is gone)."""
  # pylint: disable=import-outside-toplevel
  import dataclasses

  import tensorflow as tf

  from t2t_keras.trained import modeldir
  from t2t_keras.data.sources import sources
  from t2t_keras.training import init_from
  if checkpoint is not None:
    init_from.check_vocabularies(
        train_config.init_from, modeldir.data_config_of(init_from.source_dir(checkpoint)),
        data_config, train_config.init_from_vocab)
  if (train_config.init_from_vocab != "source"
      or not sources.SOURCE_CLASSES[data_config.source].is_text):
    return data_config  # its own vocabulary, or symbol ids: the same as the source's
  if FLAGS["vocab_file"].present:
    raise flags.ValidationError(
        f"--vocab_file={FLAGS.vocab_file} with --init_from: the run trains on the source "
        "model's vocabulary (--init_from_vocab=source, the default); drop --vocab_file, "
        "or pass --init_from_vocab=new to train on this one (shared pieces keep their "
        "embeddings).")
  if data_config.separate_vocabularies:
    return _init_from_side_vocabs(train_config, data_config, checkpoint)
  if checkpoint is None:  # a restart: as the first run of this model directory chose
    own = modeldir.data_config_of(train_config.model_dir)
    vocab = own.vocab_file
    if not vocab or not tf.io.gfile.exists(vocab):
      vocab = modeldir.vocab_path(train_config.model_dir)
    return dataclasses.replace(data_config, vocab_file=vocab, vocab_size=own.vocab_size,
                               vocab_type=own.vocab_type)
  vocab = init_from.source_vocab(checkpoint, train_config.init_from)
  source = modeldir.data_config_of(init_from.source_dir(checkpoint))
  return dataclasses.replace(data_config, vocab_file=vocab, vocab_size=source.vocab_size,
                             vocab_type=source.vocab_type)


def _init_from_side_vocabs(train_config, data_config, checkpoint):
  """`init_from_data_config` with --separate_vocabularies: both of the source run's
  vocabularies (its model directory's copies), with their sizes; on a restart this
  run's own copies of them (the source may be gone)."""
  # pylint: disable=import-outside-toplevel
  import dataclasses

  from t2t_keras.trained import modeldir
  from t2t_keras.training import init_from
  if checkpoint is None:
    own = modeldir.data_config_of(train_config.model_dir)
    files = tuple(modeldir.vocab_paths(train_config.model_dir, own))
  else:
    own = modeldir.data_config_of(init_from.source_dir(checkpoint))
    files = init_from.source_vocab(checkpoint, train_config.init_from, own)
  return dataclasses.replace(data_config, side_vocab_files=files, vocab_size=own.vocab_size,
                             target_vocab_size=own.target_vocab_size,
                             vocab_type=own.vocab_type)


def start_from(trainer, tokenizer, train_config, checkpoint: str, chief: bool) -> None:
  """--init_from: the source checkpoint's weights (and with --init_from_optimizer its
  optimizer state) into the new run's model, recorded in init_from.json."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.inference import loading
  from t2t_keras.training import init_from
  old_pieces = new_pieces = None
  if train_config.init_from_vocab == "new":
    # The source's tokenizer as its config.json says: SentencePiece or symbol ids.
    old = loading.load_tokenizer(init_from.source_dir(checkpoint))
    old_pieces, new_pieces = init_from.pieces(old), init_from.pieces(tokenizer)
  record = init_from.initialize(
      trainer.model, checkpoint,
      optimizer=trainer.optimizer if train_config.init_from_optimizer else None,
      old_pieces=old_pieces, new_pieces=new_pieces,
      fix="Fine-tuning needs the source's model shape: give the flags of the model "
      f"{train_config.init_from} was trained with (its config.json).")
  if chief:
    init_from.write_record(train_config.model_dir, record)
  vocab = ("the source's vocabulary" if record["vocabulary"] == "source" else
           f"a new vocabulary ({record['pieces_kept']} pieces kept, "
           f"{record['pieces_new']} new)")
  print(f"initialized from {record['checkpoint']}: {record['variables']} variables, "
        f"{vocab}, optimizer {record['optimizer']}", flush=True)


def relaunch_command() -> str:
  """The command line of this process, as a user would type it again."""
  import os  # pylint: disable=import-outside-toplevel
  import shlex  # pylint: disable=import-outside-toplevel
  program = sys.argv[0]
  if os.path.abspath(program) == os.path.abspath(__file__):  # python -m t2t_keras.train
    program = "python -m t2t_keras.train"
  return " ".join([program] + [shlex.quote(arg) for arg in sys.argv[1:]])


def train() -> None:
  """Trains; a lost worker's message ends with the command that resumes the run."""
  from t2t_keras.training import distribute  # pylint: disable=import-outside-toplevel
  try:
    run_training()
  except distribute.WorkerLostError as error:
    error.command = relaunch_command()
    raise


def run_training() -> None:
  # pylint: disable=import-outside-toplevel
  import keras
  import tensorflow as tf

  from t2t_keras.trained import modeldir
  from t2t_keras.data.sources import sources
  from t2t_keras.errors import DataError
  from t2t_keras.training import distribute
  from t2t_keras.training.trainer import PREEMPTED_EXIT_CODE, Trainer, format_duration

  tf.get_logger().setLevel("WARNING")  # TF's own INFO chatter (saver timings, ...)
  train_config = t2t_flags.train_config()
  strategy = distribute.create_strategy(train_config)  # first: it may split the CPU
  agreement = distribute.Agreement(strategy)
  if train_config.deterministic:
    tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(train_config.seed)
  dispatchers = []
  if train_config.data_service:  # an absent dispatcher: said now, not a hang at step 1
    from t2t_keras.data.batching import service
    dispatchers = service.addresses(train_config.data_service)
    service.check_reachable(dispatchers)
  data_config = t2t_flags.data_config()
  decode_config = t2t_flags.decode_config()
  # --init_from applies once, to a model directory without checkpoints; the chief
  # names the checkpoint every worker starts from.
  init_checkpoint = None
  if train_config.init_from:
    from t2t_keras.training import init_from
    if not tf.train.latest_checkpoint(train_config.model_dir):
      init_checkpoint = init_from.agreed_checkpoint(train_config.init_from, agreement)
    data_config = init_from_data_config(train_config, data_config, init_checkpoint)
  # Under a remote master (a pod slice) the vocabulary, the tokenizer and the cache (a
  # tf.data pipeline of tokenizer ops) are made in this process, not on the TPU hosts,
  # which have no tensorflow-text (distribute.on_client).
  with distribute.on_client():
    datasets, model_config, vocab = prepare(agreement, data_config, train_config,
                                            decode_config)
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
      start_from(trainer, datasets.tokenizer, train_config, init_checkpoint,
                 agreement.chief)
  # The key describes what the checkpoints were trained on: recorded with the first
  # checkpoint of this run, not before (a run that fails before saving changes nothing).
  trainer.on_save = lambda step: modeldir.record_plan(train_config.model_dir, plan_key)
  eval_hook = None
  if FLAGS.eval_bleu_sentences and datasets.eval_fn is not None:
    # Every worker reads the dev text (a bad file stops them all here); only the chief
    # decodes it (training.evaluator).
    eval_hook = dev_bleu_hook(trainer.model, datasets.tokenizer, data_config, decode_config,
                              FLAGS.eval_bleu_sentences, train_config.model_dir,
                              strategy=strategy)
  train_fn = datasets.train_fn
  if dispatchers:
    train_fn = service.ServedTrainData(train_fn, dispatchers)
    print(f"training input from tf.data service: {', '.join(dispatchers)}", flush=True)
  result = trainer.train(train_fn, datasets.eval_fn,
                         progress=lambda line: print(line, flush=True), eval_hook=eval_hook)
  if result.already_finished:
    return
  if result.preempted:
    print(f"stopped by a stop signal at step {result.steps} with a checkpoint; exit code "
          f"{PREEMPTED_EXIT_CODE}: rerun the same command to resume", flush=True)
    sys.exit(PREEMPTED_EXIT_CODE)
  if result.stopped_early:
    print(f"stopped early at step {result.steps}: the dev score stopped improving "
          f"(--early_stopping_patience={train_config.early_stopping_patience})", flush=True)
  print(f"done: {result.steps} steps in {format_duration(result.wall_seconds)}, "
        f"{result.target_tokens:,.0f} target tokens this run, estimated training cost "
        f"{result.flops:.3g} FLOPs this run (matmuls, forward + backward)", flush=True)
  if not agreement.chief:  # examples and the export are the chief's: written once
    return
  if not ((FLAGS.show_examples or FLAGS.dev_exact_match) and datasets.eval_fn is not None
          or FLAGS.export or FLAGS.export_dir):
    return
  from t2t_keras.training.evaluator import DecodingWeights
  # The host copy that dev BLEU decodes (evaluator.DecodingWeights says why): a search
  # or an export traced from the distributed training variables would run on the
  # replicas' devices op by op (a TPU cannot) and read every variable across them.
  weights = DecodingWeights(trainer.model, strategy)
  model = weights.refresh()
  with weights.scope():
    if (FLAGS.show_examples or FLAGS.dev_exact_match) and datasets.eval_fn is not None:
      from t2t_keras.inference import translate
      translate.report_examples(model, datasets, decode_config, FLAGS.show_examples,
                                whole_dev_set=FLAGS.dev_exact_match)
    if FLAGS.export or FLAGS.export_dir:
      export(model, datasets, decode_config, data_config, train_config, vocab)


def export(model, datasets, decode_config, data_config, train_config, vocab) -> None:
  """--export: a SavedModel of `model` (the host copy of the trained weights)."""
  # pylint: disable=import-outside-toplevel
  from t2t_keras.trained import modeldir
  from t2t_keras.trained.checkpoints import listed_checkpoints
  from t2t_keras.export import saved_model
  translator = saved_model.Translator(model, datasets.tokenizer, decode_config,
                                      vocab_file=vocab, data_config=data_config)
  path = saved_model.export(translator, FLAGS.export_dir or
                            modeldir.default_export_dir(train_config.model_dir),
                            model_dir=train_config.model_dir,  # for the model card
                            checkpoints=listed_checkpoints(train_config.model_dir)[-1:])
  limits = translator.limits
  print(f"exported {path} (serving_default: strings in, translations out; per request "
        f"at most {limits.max_rows} rows, {limits.max_string_bytes} bytes per string, "
        f"{limits.max_tokens} source tokens: the defaults, python -m t2t_keras.export "
        "sets others)", flush=True)


def check_usage() -> None:
  for warning in t2t_flags.check_train_flags(sys.argv):
    logging.warning(warning)
  if not FLAGS.model_dir and not FLAGS.dry_run:
    raise app.UsageError("--model_dir is required: checkpoints, vocabulary and logs go "
                         "there (a local path or gs://bucket/path).")


command = console.Command(lambda: dry_run() if FLAGS.dry_run else train(),
                          check=check_usage, model_dir=None)
main, console_main = command.main, command.console_main  # console_main: python -m
console_script_main = command.console_script_main  # t2t-train

if __name__ == "__main__":
  console_main()
