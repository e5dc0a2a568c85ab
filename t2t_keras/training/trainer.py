"""One strategy-agnostic training loop: a host loop around compiled device steps.

The host loop logs progress, writes TensorBoard summaries, evaluates and checkpoints;
what it decides between calls lives beside it, so that `Trainer.train` reads as a
short loop: `loop_state` (its clock, the progress log, when to save and when to stop)
and `evaluator` (dev evaluation, the best checkpoint, early stopping). The device
side, `steps.DeviceSteps` (which `Trainer` inherits), runs `steps_per_loop` steps per
call (a `tf.while_loop`, as TPUs need) with `strategy.run`. Each replica returns SUMS
(loss, target tokens) and divides its loss by the GLOBAL token count, so 1 and N
replicas make the same update for the same global batch; Keras' optimizer then sums
the replicas' gradients (with --clip_grad_norm the replicas sum them first, to clip
the batch's gradient: `_apply`). With reference alignments in the batch
(--train_alignments), the guided head's alignment loss joins the translation loss as a
sum over target tokens, normalised the same way (`_forward`,
`losses.guided_alignment_sum`).

The step counter is `optimizer.iterations`; a `tf.train.CheckpointManager` keeps model
and optimizer state, and the data position follows from the step count (the data
package's batch plan reads any step's batches directly; see `_resuming`), so rerunning
the same command resumes at the same step and data position, at once.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from typing import Callable, Optional

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from t2t_keras.trained import modeldir
from t2t_keras.configs import (ModelConfig, TrainConfig, guided_alignment_problems,
                               raise_problems)
from t2t_keras.errors import TrainingError
from t2t_keras.model import create_model
from t2t_keras.trained import checkpoints
from t2t_keras.training import batches as batches_lib
from t2t_keras.training import distribute, optimizers
from t2t_keras.training.evaluator import BestEval, Evaluator  # noqa: F401 (re-export)
from t2t_keras.training.loop_state import (  # noqa: F401 (format_duration: re-export)
    ProgressLog, RunClock, SavePolicy, format_duration)
from t2t_keras.training.schedules import TransformerSchedule
from t2t_keras.training.steps import STEP_SPLIT, DeviceSteps

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]


# Exit code of a run that saved a checkpoint and stopped on SIGTERM (preemption): the
# code TensorFlow's PreemptionCheckpointHandler uses, so that cluster managers restart
# the job and the same command resumes.
PREEMPTED_EXIT_CODE = 42


@dataclasses.dataclass
class TrainResult:
  steps: int
  wall_seconds: float
  target_tokens: float
  flops: float
  final_loss: float
  eval_metrics: dict
  preempted: bool = False  # stopped by SIGTERM after saving a checkpoint
  stopped_early: bool = False  # --early_stopping_patience evaluations without improvement
  already_finished: bool = False  # an earlier run of this model_dir stopped early here
  # Compiled calls the host made: each costs a round trip to the devices (a remote
  # TPU's is far dearer than a local CPU's), so steps / host_calls is what
  # --steps_per_loop and --static_run_steps buy.
  host_calls: int = 0


class Trainer(DeviceSteps):
  """Builds model and optimizer in the strategy scope and trains them.

  Args:
    model_config: the architecture.
    train_config: optimisation, checkpointing and logging settings.
    strategy: from `distribute.create_strategy`.
  """

  def __init__(self, model_config: ModelConfig, train_config: TrainConfig,
               strategy: Optional[tf.distribute.Strategy] = None):
    train_config.validate()
    raise_problems(guided_alignment_problems(model_config, train_config),
                   "guided alignment settings")
    self.model_config = model_config
    self.config = train_config
    self.strategy = strategy or tf.distribute.get_strategy()
    self.clock = time.time  # wall clock of progress, budgets and checkpoints (tests fake it)
    with self.strategy.scope():
      self.model = create_model(model_config)
      self.learning_rate = TransformerSchedule(
          model_config.hidden_size, train_config.learning_rate_warmup_steps,
          train_config.learning_rate, train_config.learning_rate_schedule)
      optimizer = optimizers.create(train_config, self.learning_rate)
      if model_config.dtype == "mixed_float16":
        optimizer = _LossScaleOptimizer(optimizer)
      self.optimizer = optimizer
      self.optimizer.build(self.model.trainable_variables)
    self._compute_gradients = tf.function(self._gradients, autograph=False,
                                          jit_compile=train_config.jit_compile or None)
    # Dynamic shapes: dev batches come in many shapes; one trace for all of them, from
    # the dev dataset's spec (`evaluate`). Static shapes: one compiled loop per dev
    # bucket (`_evaluate_static`), kept on the trainer so that later evaluations reuse
    # its traces.
    self._eval_fn = tf.function(self._eval_step, autograph=False)
    self._eval_replica_fn = tf.function(self._eval_replica, autograph=False,
                                        jit_compile=train_config.jit_compile or None)
    self.eval_loop_fn = tf.function(self._eval_loop, autograph=False)
    self._eval_programs = []  # the static dev buckets evaluated so far, in order
    self._weights_finite_fn = None  # see _weights_finite
    # Called on the chief after each checkpoint (train.py records the batch plan's key
    # with the first one, so that the key describes what the checkpoints were trained on).
    self.on_save: Optional[Callable[[int], None]] = None
    self.agreement = distribute.Agreement(self.strategy,
                                          60 * train_config.peer_timeout_minutes)
    self.chief, self.worker_id = self.agreement.chief, self.agreement.worker_id
    self.host_calls = 0  # of the last train() call
    # The programs (train loop per bucket, evaluation) that ran once in this process:
    # later calls do not trace or compile, so the peer watch bounds them.
    self._programs_run = set()

  # ------------------------------------------------------------------ host side
  def agree(self, any_worker=(), chief_decides=()) -> list:
    """Loop decisions all workers share (see `distribute.Agreement`)."""
    return self.agreement(any_worker, chief_decides)

  def current_step(self) -> int:
    """optimizer.iterations as a Python int (works for mirrored variables too)."""
    return int(self.optimizer.iterations.numpy())

  def evaluate(self, eval_dataset_fn: DatasetFn, max_batches: int = 0,
               progress: Optional[Callable[[str], None]] = None) -> dict:
    """Loss (smoothed), perplexity (exp NLL per token) and token accuracy on a dev set.

    A dev dataset function with static shapes (the data package's `EvalData` under
    --static_shapes) is evaluated bucket by bucket, one compiled program per bucket
    (`_evaluate_static`); `progress` then gets a line for each program's first use.
    `max_batches` (0: all) counts steps, of one batch per replica.
    """
    if getattr(eval_dataset_fn, "static_shapes", False) and hasattr(eval_dataset_fn,
                                                                   "buckets"):
      totals = self._evaluate_static(eval_dataset_fn, max_batches, progress or print)
    else:
      dataset = self.strategy.distribute_datasets_from_function(eval_dataset_fn)
      totals = np.zeros(4)
      # One trace for every dev shape, from the dataset's own spec (its lengths and
      # rows unknown), rather than one for the first shape and one relaxed after it.
      eval_fn = self._eval_fn.get_concrete_function(dataset.element_spec)
      bounded = "eval" in self._programs_run
      for i, batch in enumerate(dataset):
        if max_batches and i >= max_batches:
          break
        with self.agreement.collective(bounded):  # dev loss: all workers together
          totals += np.array([float(v) for v in eval_fn(batch)])
      self._programs_run.add("eval")
    loss_sum, nll_sum, correct, tokens = totals
    if tokens == 0:
      raise TrainingError("the dev set produced no target tokens: check --dev_src/--dev_tgt "
                          "(empty files, or every pair longer than --max_length?).")
    return {"loss": loss_sum / tokens, "perplexity": math.exp(min(nll_sum / tokens, 50.0)),
            "accuracy": correct / tokens, "tokens": tokens}

  def _evaluate_static(self, eval_data, max_batches: int,
                       progress: Callable[[str], None]) -> np.ndarray:
    """Sums over the dev buckets, one host call (a `tf.range` loop) per bucket.

    Each bucket's dataset has a static element shape and whole steps (all-PAD rows
    and batches fill them, with zero loss weight), so every replica of every step gets
    the bucket's shape, and the loop is traced (on TPU or with --jit_compile,
    compiled) once per bucket, in the first evaluation only.
    """
    batches_lib.ByDesignRetracing.install()
    replicas = self.strategy.num_replicas_in_sync
    buckets = eval_data.buckets()
    totals, steps_left = np.zeros(4), max_batches or -1
    for bucket in buckets:
      steps = eval_data.steps(bucket, replicas)
      if steps_left >= 0:
        steps, steps_left = min(steps, steps_left), steps_left - min(steps, steps_left)
      if steps == 0:
        break
      bounded = bucket in self._eval_programs
      if not bounded:
        self._eval_programs.append(bucket)
        rows, length = eval_data.bucket_shape(bucket)
        progress(f"static shapes: eval program {len(self._eval_programs)} of "
                 f"{len(buckets)}, dev bucket [{rows}, {length}] (evaluation is traced "
                 "and compiled once per dev bucket)")
      dataset = self.strategy.distribute_datasets_from_function(
          lambda ctx, bucket=bucket: eval_data(ctx, bucket=bucket))
      with self.agreement.collective(bounded):  # dev loss: all workers together
        totals += np.array([float(v) for v in self.eval_loop_fn(iter(dataset),
                                                                 tf.constant(steps))])
    return totals

  def checkpoint(self) -> tf.train.Checkpoint:
    """Model, optimizer and the dropout layers' random-seed states.

    The seed states make a resumed run draw the same dropout masks as an uninterrupted
    one (with --deterministic, bitwise the same weights).
    """
    layers = self.model._flatten_layers()  # pylint: disable=protected-access
    seeds = [layer.seed_generator.state for layer in layers
             if getattr(layer, "seed_generator", None) is not None]
    return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                               dropout_seeds=seeds)

  def _resuming(self, train_dataset_fn: DatasetFn, step: int) -> DatasetFn:
    """The training data from `step` on, for this run's micro-batches per step.

    A dataset function that takes `start_step` (the data package's, which reads the
    pairs of any step directly) starts there, in time independent of the step, and is
    told the trainer's accum_steps, so its steps are this trainer's. Any other
    function is replayed: its first batches are skipped, which is right if it is
    deterministic but costs time proportional to the step.
    """
    parameters = inspect.signature(train_dataset_fn).parameters
    if "start_step" in parameters:
      def seek(ctx):
        return train_dataset_fn(ctx, start_step=step, accum_steps=self.config.accum_steps)
      return seek

    def replay(ctx):
      dataset = train_dataset_fn(ctx)
      per_step = self.strategy.num_replicas_in_sync // max(ctx.num_input_pipelines, 1)
      per_step *= self.config.accum_steps
      return dataset.skip(step * per_step) if step else dataset
    return replay

  def train(self, train_dataset_fn: DatasetFn, eval_dataset_fn: Optional[DatasetFn] = None,
            progress: Callable[[str], None] = print,
            eval_hook: Optional[Callable[[int], dict]] = None) -> TrainResult:
    """Trains to `train_steps`, resuming from the latest checkpoint in model_dir.

    Stops early, with a checkpoint, once the chief has trained for `train_minutes`
    (when set); time spent evaluating is not counted. `eval_hook(step)`, if given, runs
    on the chief after each dev evaluation and returns more scalars to log (e.g. dev
    BLEU). Every evaluation also logs `train_minutes`, the training time so far in this
    process, so that learning curves can be drawn against training time.

    In a multi-worker run every decision that ends or changes the loop (preemption,
    the time budget, a time-based save, the best checkpoint, early stopping) is taken
    once, by the chief (preemption: by any worker), and shared through a collective
    (`agree`), so that the workers never leave the loop at different steps.
    """
    cfg = self.config
    saver = _Checkpoints(self, progress)  # resumes from the latest checkpoint
    batches = self._last_batches = _Batches(self, train_dataset_fn, self.current_step(),
                                            progress)
    # One host call: --steps_per_loop steps. Kept on the trainer so that its traces can
    # be counted (one program per bucket shape, tests/trainer_test.py).
    self.train_fn = tf.function(self._train_call, autograph=False)
    writer, eval_writer = self._summary_writers()
    evaluator = Evaluator(self, eval_dataset_fn, eval_hook, saver.save_dir, eval_writer, progress)
    step = start_step = self.current_step()
    if evaluator.finished(step):
      saver.close()
      return TrainResult(steps=step, wall_seconds=0.0, target_tokens=0.0, flops=0.0,
                         final_loss=float("nan"), eval_metrics={}, stopped_early=True,
                         already_finished=True)
    clock = RunClock(self.clock, cfg.train_minutes)
    log = ProgressLog(cfg, self.learning_rate, writer, progress, clock, start_step)
    eval_metrics, stopped_early = {}, False
    self.host_calls = 0
    try:
      with SavePolicy(cfg, self.agree, clock, progress) as policy:
        while step < cfg.train_steps:
          sums, step = self._run(batches, step)
          log.add(sums)
          now = clock.now()
          decision = policy.decide(step, now)
          if step % cfg.log_every == 0 or decision.last:
            log.write(step, now)
          if decision.save:
            saver.save(step)
            policy.saved()
          if evaluator.due(step, decision.last) and not decision.preempted:
            eval_start = clock.now()
            eval_metrics, stopped_early = evaluator(
                step, decision.last, train_minutes=clock.trained(eval_start) / 60)
            clock.exclude_since(eval_start)
            log.exclude_since(eval_start)
          if decision.last or stopped_early:
            break
    except BaseException as error:
      # What the loop logged reaches TensorBoard also when it ends in an error (a
      # command's process ends without the teardown that would flush the writers,
      # console.exit_without_teardown); a flush that fails then must not hide the error.
      for summaries in (writer, eval_writer):
        try:
          summaries.flush()
        except Exception:  # pylint: disable=broad-except
          logging.warning("could not flush the TensorBoard summaries", exc_info=True)
      saver.close()
      if isinstance(error, distribute.WorkerLostError):  # the resume point, for its message
        raise error.at(step, tf.train.latest_checkpoint(cfg.model_dir))
      raise
    writer.flush()
    eval_writer.flush()
    if policy.preempted:
      progress(policy.preemption_line(step))
    saver.save_unless_saved(step)
    saver.close()
    batches.release()
    wall = clock.elapsed(clock.now())
    logging.info("trained %d steps in %.1fs in %d host calls (%.1f steps a call)",
                 step - start_step, wall, self.host_calls,
                 (step - start_step) / max(self.host_calls, 1))
    return TrainResult(steps=step, wall_seconds=wall, target_tokens=log.total_tokens,
                       flops=log.total_flops, final_loss=log.loss, eval_metrics=eval_metrics,
                       preempted=policy.preempted, stopped_early=stopped_early,
                       host_calls=self.host_calls)

  def _run(self, batches: _Batches, step: int):
    """One host call from `step`; returns its global sums and the step it reached.

    The call runs up to the next multiple of each interval (logging, saving,
    evaluating), so that every interval is honoured.
    """
    cfg = self.config
    intervals = (cfg.log_every, cfg.save_checkpoint_steps, cfg.eval_every)
    n = min([cfg.steps_per_loop, cfg.train_steps - step,
             batches.steps_left_in_run(step)] + [k - step % k for k in intervals])
    program = ("train", batches.bucket_of_step(step))
    try:
      with self.agreement.collective(bounded=program in self._programs_run):
        # The call's one read back: the sums and the step counter together.
        result = self.train_fn(batches.iterator(step), tf.constant(n)).numpy()
    except tf.errors.OutOfRangeError:
      raise TrainingError("the training dataset ran out of batches: it is empty or every "
                          "pair was filtered (see the data log above).") from None
    self._programs_run.add(program)
    self.host_calls += 1
    sums = result[:4].astype(np.float64)
    # The one counter (skipped float16 steps count), as _train_call splits it.
    step = int(result[4]) * STEP_SPLIT + int(result[5])
    self._check_finite(sums, step, n)
    return sums, step

  def _summary_writers(self):
    """The train and eval summary writers: files on the chief, no-ops elsewhere."""
    if not self.chief:
      writer = tf.summary.create_noop_writer()
      return writer, writer
    return (tf.summary.create_file_writer(modeldir.logs_dir(self.config.model_dir, "train")),
            tf.summary.create_file_writer(modeldir.logs_dir(self.config.model_dir, "eval")))

  def _check_finite(self, sums: np.ndarray, step: int, n: int) -> None:
    """Stops the run, without saving, on a non-finite loss or (without loss scaling,
    where skipped steps are the design) non-finite gradients on any replica."""
    overflowed = (sums[3] > 0
                  and not isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer))
    if np.isfinite(sums[0]) and not overflowed:
      return
    what = f"loss became {sums[0]}" if not np.isfinite(sums[0]) else (
        f"gradients became non-finite on {sums[3]:g} replica-step(s) (updates skipped)")
    good = tf.train.latest_checkpoint(self.config.model_dir) or "none yet"
    raise TrainingError(
        f"{what} at step {step} (window of {n} steps): training stopped without saving, "
        f"so the last good checkpoint ({good}) is intact. Lower --learning_rate, raise "
        "--learning_rate_warmup_steps, or check the data.")

  def _weights_finite(self) -> bool:
    if self._weights_finite_fn is None:  # one trace per trainer, not per save
      self._weights_finite_fn = tf.function(lambda: tf.reduce_all(
          [tf.reduce_all(tf.math.is_finite(v)) for v in self.model.trainable_variables]),
                                            autograph=False)
    return bool(self._weights_finite_fn())


class _Checkpoints:
  """This run's checkpoints: resumed from the chief's latest, saved by every worker.

  Every worker of a multi-worker run takes part in saving (variables may need a
  collective read), but only the chief writes into model_dir; the others write to a
  scratch directory of their own, as TensorFlow's multi-worker guide prescribes, on
  their local disk and never under a remote model_dir (`modeldir.worker_scratch_dir`).
  Weights that are not finite are never saved.
  """

  def __init__(self, trainer: Trainer, progress: Callable[[str], None]):
    cfg = trainer.config
    self.trainer, self.model_dir = trainer, cfg.model_dir
    checkpoint = trainer.checkpoint()
    chief = trainer.chief
    self.save_dir = (cfg.model_dir if chief
                     else modeldir.worker_scratch_dir(trainer.worker_id))
    # The state file may name paths outside model_dir (a downloaded directory), which the
    # manager would read and, rotating, delete: refused before the manager reads it.
    checkpoints.check_checkpoint_state(cfg.model_dir)
    checkpoints.check_checkpoint_state(modeldir.best_dir(cfg.model_dir))
    self.manager = tf.train.CheckpointManager(checkpoint, self.save_dir,
                                              checkpoint_name=modeldir.CHECKPOINT_PREFIX,
                                              max_to_keep=1 if not chief else
                                              cfg.keep_checkpoint_max,
                                              step_counter=trainer.optimizer.iterations)
    self.saved_step = None  # the step of this run's last checkpoint
    latest = tf.train.latest_checkpoint(cfg.model_dir)  # all workers resume the chief's
    if latest:
      checkpoints.restore(checkpoint, latest)
      progress(f"resumed from {latest} at step {trainer.current_step()}")
      self.saved_step = trainer.current_step()

  def save(self, step: int) -> None:
    """Saves a checkpoint, never one of non-finite weights."""
    if not self.trainer._weights_finite():  # pylint: disable=protected-access
      good = tf.train.latest_checkpoint(self.model_dir) or "none yet"
      raise TrainingError(
          f"the weights became non-finite (inf or NaN) by step {step}: training stopped "
          f"without saving them, so the last good checkpoint ({good}) is intact. Lower "
          "--learning_rate, raise --learning_rate_warmup_steps, or check the data.")
    self.manager.save(checkpoint_number=step)
    self.saved_step = step
    if not self.trainer.chief:
      modeldir.discard_worker_dir(self.save_dir)
    if self.trainer.chief and self.trainer.on_save is not None:
      self.trainer.on_save(step)

  def close(self) -> None:
    """Removes a non-chief worker's scratch directory: training is over."""
    if not self.trainer.chief:
      modeldir.remove_worker_dir(self.save_dir)

  def save_unless_saved(self, step: int) -> None:
    """Saves at the end of the loop unless this run's last checkpoint is of `step`
    (the same on every worker, not a look at its own directory)."""
    if self.saved_step != step:
      self.save(step)


class _LossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
  """Keras' LossScaleOptimizer whose skipped (overflowing) steps still count.

  Keras leaves `iterations` alone on a skipped step, while the host loop counts every
  step it ran: checkpoints numbered by the host step would then resume from a smaller
  `iterations`, replaying data already seen and training past --train_steps. Counting
  the skipped step keeps one counter, `iterations`, equal to the steps run (the
  learning-rate schedule advances over a skipped step, as tensor2tensor's global step
  did).
  """

  def _stateful_handle_non_finite_grads(self):
    super()._stateful_handle_non_finite_grads()
    self.inner_optimizer.iterations.assign_add(1)


# The batches' source lives in training/batches.py; the trainer's name for it stays.
_Batches = batches_lib.TrainBatches
