"""Dev evaluation during training: the loss, the eval hook (dev BLEU: `dev_bleu_hook`),
the best checkpoint and early stopping.

The trainer's loop asks `Evaluator.due(step, last)` and calls it; everything about what
an evaluation decides lives here. In a multi-worker run the dev loss is computed by all
workers together, the hook (decoding the dev set) runs on the chief alone, and the
chief's judgement (best so far? stop now?) is shared through the trainer's agreement
collective, so that every worker saves the best checkpoint and stops at the same step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import uuid
from typing import Callable, Optional

import tensorflow as tf

from t2t_keras.trained import modeldir
from t2t_keras import language_tags
from t2t_keras import metrics as metrics_lib
from t2t_keras.data.sources import sources as sources_lib
from t2t_keras.errors import DataError, TrainingError
from t2t_keras.inference import decoding, translate
from t2t_keras.model import create_model
from t2t_keras.training import distribute


class DecodingWeights:
  """The model the dev-BLEU decode runs: the training model, or a plain copy of it.

  Under a distribution strategy the training weights are distributed variables on the
  replicas' devices. On a TPU they live in TPU memory, and a search run outside
  `strategy.run` would be placed there op by op, at shapes that change every step of
  the search, which TPUs cannot run. So under any strategy but the default one the
  decode runs on a plain copy, refreshed from the training weights (one read of each
  variable) before every decode: on this process's CPU under TPUStrategy (the client's
  when it drives a pod slice: `distribute.on_client`), on the first replica's device
  otherwise (a GPU decodes faster than the host). One path for every strategy, the one
  tests check on 2 logical CPU devices; a compiled static-shape search inside
  `strategy.run` would spare the copy but ties decoding to the training topology.
  Under the default strategy the weights are ordinary variables and the model decodes
  as it is.

  Args:
    model: the training model.
    strategy: the trainer's strategy (None: the default one).
  """

  def __init__(self, model, strategy: Optional[tf.distribute.Strategy] = None):
    self.source = model
    self.device = None
    if strategy is not None and strategy is not tf.distribute.get_strategy():
      tpu = isinstance(strategy, (tf.distribute.TPUStrategy,
                                  tf.distribute.experimental.TPUStrategy))
      # This process's CPU: under a remote master "/device:CPU:0" is the master's.
      self.device = (distribute.client_cpu() if tpu
                     else strategy.extended.worker_devices[0])
    self.model = model
    if self.device is not None:
      with tf.device(self.device):
        self.model = create_model(model.model_config)

  def scope(self):
    """Where the decode runs: the copy's device (none in particular without a copy)."""
    return tf.device(self.device) if self.device else contextlib.nullcontext()

  def refresh(self):
    """The decoding model, holding the training model's current weights."""
    if self.model is not self.source:
      with self.scope():
        self.model.set_weights(self.source.get_weights())
    return self.model


def dev_bleu_hook(model, tokenizer, data_config, decode_config, n: int,
                  model_dir=None, strategy=None):
  """A Trainer eval hook: sacreBLEU of the first `n` dev sentences, decoded as configured.

  The dev sentences and references are the data source's (`Source.dev_pairs`: the
  --dev_src/--dev_tgt files, a TFDS validation split, the synthetic held-out set);
  the returned function gives {"bleu": cased sacreBLEU}. With `model_dir`, each score
  is also recorded with its step and sacreBLEU's signature (`modeldir.record_dev_bleu`,
  read by the model card). Under the trainer's `strategy` (other than the default) the
  decode runs on a plain copy of the weights on the host (TPU) or the first replica's
  device, refreshed at every call (`DecodingWeights` says why).
  """
  source = sources_lib.data_source(data_config)
  pairs = source.dev_pairs(n)
  if pairs is None:
    raise DataError(f"--eval_bleu_sentences needs a dev split: {source.dev_help} (or "
                    "--eval_bleu_sentences=0).")
  sources, references = pairs
  weights = DecodingWeights(model, strategy)
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
    report = metrics_lib.bleu_report([o.texts[0] for o in outputs], [references])
    if model_dir:
      modeldir.record_dev_bleu(model_dir, {
          "bleu": report["bleu"], "step": int(step), "signature": report["bleu_signature"],
          "sentences": len(sources), "dev_src": data_config.dev_src,
          "dev_tgt": data_config.dev_tgt})
    return {"bleu": report["bleu"]}
  return hook


class BestEval:
  """The best dev result so far and the evaluations since, kept across restarts.

  The metric is dev BLEU (higher is better) when the evaluation computes it, else dev
  loss (lower is better). The state lives in <model_dir>/best_eval.json, so a resumed
  run keeps its best checkpoint and its early-stopping count. A record that cannot be
  read stops the run (starting over would overwrite the best checkpoint), and so does
  a run whose metric differs from the record's: its best checkpoint would be replaced
  by one judged on another scale.
  """

  def __init__(self, model_dir: str, write: bool, metric: str = "loss"):
    self.path = modeldir.best_state_path(model_dir)
    self.write = write
    self.metric = metric
    self.state = {}
    if tf.io.gfile.exists(self.path):
      try:
        with tf.io.gfile.GFile(self.path) as f:
          self.state = json.load(f)
      except (json.JSONDecodeError, tf.errors.OpError, UnicodeDecodeError) as error:
        raise TrainingError(
            f"cannot read {self.path} ({type(error).__name__}: {error}), the record of the "
            f"best checkpoint in {modeldir.best_dir(model_dir)}: rerun once the file is "
            "readable, or move it and best/ away to start the record anew.") from None
    saved = self.state.get("metric")
    if saved and saved != metric:
      how = {"bleu": "--eval_bleu_sentences > 0", "loss": "--eval_bleu_sentences=0"}
      raise TrainingError(
          f"{modeldir.best_dir(model_dir)} holds the best checkpoint by dev {saved} "
          f"({self.path}) but this run judges dev {metric}: keep judging by {saved} "
          f"({how[saved]}), or move best/ and {os.path.basename(self.path)} away to "
          "start a new record.")

  @property
  def stopped_early_at(self) -> Optional[int]:
    """The step at which early stopping ended the run, if it did."""
    return self.state.get("stopped_early_at")

  def record_stop(self, step: int) -> None:
    self.state["stopped_early_at"] = step

  def resume_after_stop(self) -> None:
    """Trains on after an early stop: patience counts from 0 again."""
    self.state.pop("stopped_early_at", None)
    if self.state:
      self.state["evaluations_since_best"] = 0

  @property
  def since_best(self) -> int:
    return int(self.state.get("evaluations_since_best", 0))

  def update(self, step: int, metrics: dict) -> bool:
    """Records an evaluation in memory; returns whether it is the best so far.

    `commit` writes the record, once the best checkpoint it names is saved.
    """
    value = float(metrics[self.metric])
    best = self.state.get("value")
    improved = (best is None or (value > best if self.metric == "bleu" else value < best))
    if improved:
      self.state = {"metric": self.metric, "value": value, "step": step,
                    "evaluations_since_best": 0}
    elif self.state.get("step") != step:  # the same step evaluated again at a restart
      self.state["evaluations_since_best"] = self.since_best + 1
    return improved

  def commit(self) -> None:
    if self.write and self.state:
      path = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
      with tf.io.gfile.GFile(path, "w") as f:
        json.dump(self.state, f, indent=2, sort_keys=True)
      tf.io.gfile.rename(path, self.path, overwrite=True)

  def describe(self) -> str:
    return (f"dev {self.state['metric']} {self.state['value']:.4g} at step "
            f"{self.state['step']}")


class Evaluator:
  """Evaluates on the dev set and keeps the best checkpoint and early stopping.

  Args:
    trainer: the Trainer (its model, config, `evaluate` and `agree`).
    eval_dataset_fn: input context -> the one-pass dev dataset (None: no evaluation).
    eval_hook: step -> more scalars (dev BLEU), run on the chief after the dev loss.
    save_dir: where this worker saves (the model directory, or a worker's scratch).
    writer: the summary writer of the eval logs.
    progress: where lines go.
  """

  def __init__(self, trainer, eval_dataset_fn, eval_hook: Optional[Callable[[int], dict]],
               save_dir: str, writer, progress: Callable[[str], None]):
    cfg = trainer.config
    self.trainer, self.config, self.save_dir = trainer, cfg, save_dir
    self.dataset_fn, self.writer, self.progress = eval_dataset_fn, writer, progress
    self.hook = eval_hook if trainer.chief else None
    self.best = self.best_manager = None
    if cfg.keep_best_checkpoint or cfg.early_stopping_patience:
      error = None
      if trainer.chief:  # the chief judges; the others follow its decisions
        try:
          self.best = BestEval(cfg.model_dir, write=True,
                               metric="bleu" if eval_hook is not None else "loss")
        except TrainingError as raised:
          error = raised
      self._raise_if_failed(error)
      if cfg.keep_best_checkpoint:
        self.best_manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(model=trainer.model), modeldir.best_dir(save_dir),
            max_to_keep=1)

  def _raise_if_failed(self, error: Optional[BaseException], decisions=()) -> list:
    """Shares the chief's `decisions` and whether some worker failed (`error`), in one
    collective, so that a failure on one worker stops all of them at the same point
    instead of leaving the others waiting in the next collective."""
    failed, *decisions = self.trainer.agree(
        any_worker=[error is not None], chief_decides=decisions)
    if error is not None:
      raise error
    if failed:
      raise TrainingError("another worker stopped during evaluation; its output says why.")
    return decisions

  def finished(self, step: int) -> bool:
    """Whether an earlier run stopped early at `step`: then there is nothing to train
    (unless --continue_after_early_stop). Agreed by all workers."""
    best, cfg = self.best, self.config
    finished = False
    if best is not None and best.stopped_early_at is not None:
      if cfg.continue_after_early_stop:
        self.progress(f"continuing after the early stop at step {best.stopped_early_at} "
                      "(--continue_after_early_stop): patience counts from 0 again")
        best.resume_after_stop()
        best.commit()
      else:
        finished = best.stopped_early_at == step
    finished = self.trainer.agree(chief_decides=[finished])[0]
    if finished:
      self.progress(
          f"this run stopped early at step {step} (--early_stopping_patience="
          f"{cfg.early_stopping_patience}: "
          + (f"best {best.describe()}" if best is not None else "the chief's record")
          + "): it is finished, nothing to train. Pass --continue_after_early_stop to "
          "train on.")
    return finished

  def due(self, step: int, last: bool) -> bool:
    return bool(self.dataset_fn) and (step % self.config.eval_every == 0 or last)

  def __call__(self, step: int, last: bool, train_minutes: float):
    """Evaluates at `step`; returns (the metrics, whether to stop early now)."""
    cfg, best = self.config, self.best
    metrics = self.trainer.evaluate(self.dataset_fn, cfg.eval_steps, self.progress)
    line = (f"eval at step {step}: loss {metrics['loss']:.4f} | perplexity "
            f"{metrics['perplexity']:.3f} | accuracy {metrics['accuracy']:.4f}")
    improved = stop = False
    error = None
    try:  # the chief's part; any failure is shared before the next collective
      if self.hook is not None:
        extra = self.hook(step)
        if best is not None and best.metric not in {**metrics, **extra}:
          raise TrainingError(
              f"the eval hook returned {sorted(extra)} without {best.metric!r}, which "
              "--keep_best_checkpoint and --early_stopping_patience judge.")
        metrics.update(extra)
        line += "".join(f" | {name} {value:.2f}" for name, value in extra.items())
      if best is not None:
        improved = best.update(step, metrics)
        stop = bool(cfg.early_stopping_patience and not last
                    and best.since_best >= cfg.early_stopping_patience)
    except Exception as raised:  # pylint: disable=broad-except
      error = raised
    self.progress(line)
    improved, stop = self._raise_if_failed(error, [improved, stop])
    if self.best_manager is not None or cfg.early_stopping_patience:
      if improved and self.best_manager is not None:
        self.best_manager.save(checkpoint_number=step)
        if not self.trainer.chief:
          modeldir.discard_worker_dir(self.save_dir)
        if best is not None:
          self.progress(f"best so far: {best.describe()}, saved in "
                        f"{modeldir.best_dir(cfg.model_dir)}")
      if best is not None:
        if stop:
          best.record_stop(step)
        best.commit()  # after the checkpoint it names exists
        if not improved and cfg.early_stopping_patience:
          self.progress(f"no improvement for {best.since_best} evaluation(s) (best: "
                        f"{best.describe()}; patience {cfg.early_stopping_patience})")
      if stop:
        self.progress(f"early stopping at step {step}: "
                      + (f"{best.since_best} evaluations without improvement of the best "
                         f"{best.describe()}" if best is not None
                         else "the chief's decision"))
    with self.writer.as_default(step=step):
      for name, value in metrics.items():
        tf.summary.scalar(name, value)
      tf.summary.scalar("train_minutes", train_minutes)
    self.writer.flush()
    return metrics, stop
