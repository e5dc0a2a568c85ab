"""The training loop's host-side bookkeeping: its clock, its progress log, and when it
saves and stops.

`Trainer.train` runs compiled steps and asks these objects what to do between calls;
each owns one concern, so the loop reads top to bottom:

- `RunClock`: wall time of the run and the training time in it. Dev evaluations are
  not training: they count neither against --train_minutes nor in the next tok/s.
- `ProgressLog`: the window of loss, target tokens and FLOPs since the last progress
  line, the line itself and the train TensorBoard scalars.
- `SavePolicy`: whether to save now (step interval, --save_checkpoint_minutes, the last
  step) and whether to stop (--train_steps, the --train_minutes budget, SIGTERM or
  SIGINT). In a multi-worker run those decisions are taken by the chief (a stop signal:
  by any worker) and shared through ONE collective per host call, so every worker
  saves and leaves the loop at the same step.

They never touch the model: saving itself is the trainer's (`trainer._Checkpoints`).
"""

from __future__ import annotations

import math
import signal
import threading
from typing import Callable, NamedTuple

import numpy as np
import tensorflow as tf

from t2t_keras.configs import TrainConfig


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class RunClock:
  """Wall time since the loop started, and training time: wall time less evaluations.

  Args:
    clock: seconds now (time.time; tests pass a fake).
    train_minutes: the training-time budget; 0 = none.
  """

  def __init__(self, clock: Callable[[], float], train_minutes: float):
    self.now = clock
    self.start = clock()
    self.eval_seconds = 0.0  # not counted against --train_minutes
    self.budget = 60 * train_minutes if train_minutes > 0 else math.inf

  def elapsed(self, now: float) -> float:
    return now - self.start

  def trained(self, now: float) -> float:
    """Seconds of training by `now`: evaluations are left out."""
    return now - self.start - self.eval_seconds

  def budget_spent(self, now: float) -> bool:
    return self.trained(now) >= self.budget

  def budget_left(self, now: float) -> float:
    return max(self.budget - self.trained(now), 0.0)

  def exclude_since(self, since: float) -> None:
    """Leaves the time from `since` to now (an evaluation) out of the training time."""
    self.eval_seconds += self.now() - since


class ProgressLog:
  """The progress line and the train scalars, every --log_every steps and at the end.

  Loss and tok/s are over the window since the previous line (loss = loss sum / target
  tokens, as everywhere in training); the totals feed the TrainResult.

  Args:
    config: the run's TrainConfig (train_steps for the ETA).
    learning_rate: the schedule, to log the rate the last update used.
    writer: the summary writer of the train logs (a no-op writer off the chief).
    progress: where lines go.
    clock: the run's RunClock.
    start_step: the step this run resumed at (steps/s counts this run's steps).
  """

  def __init__(self, config: TrainConfig, learning_rate, writer,
               progress: Callable[[str], None], clock: RunClock, start_step: int):
    self.config, self.learning_rate, self.writer = config, learning_rate, writer
    self.progress, self.clock, self.start_step = progress, clock, start_step
    self.window = np.zeros(3)  # loss_sum, tokens, flops since the last progress line
    self.total_tokens = self.total_flops = 0.0
    self.loss = float("nan")  # of the last window logged
    self.last_log = clock.start

  def add(self, sums: np.ndarray) -> None:
    """Adds one host call's global (loss_sum, tokens, flops, ...) sums."""
    self.window += sums[:3]
    self.total_tokens += sums[1]
    self.total_flops += sums[2]

  def write(self, step: int, now: float) -> None:
    """Logs the window ending at `step` (one line and the scalars) and starts anew."""
    cfg, clock, window = self.config, self.clock, self.window
    self.loss = window[0] / max(window[1], 1.0)
    rate = window[1] / max(now - self.last_log, 1e-9)
    steps_per_sec = (step - self.start_step) / max(clock.elapsed(now), 1e-9)
    eta = min((cfg.train_steps - step) / max(steps_per_sec, 1e-9), clock.budget_left(now))
    lr = float(self.learning_rate(step - 1))
    self.progress(f"step {step}/{cfg.train_steps} | loss {self.loss:.4f} | lr {lr:.3g} | "
                  f"{rate:,.0f} tok/s | elapsed {format_duration(clock.elapsed(now))} | "
                  f"eta {format_duration(eta)}")
    with self.writer.as_default(step=step):
      tf.summary.scalar("loss", self.loss)
      tf.summary.scalar("learning_rate", lr)
      tf.summary.scalar("target_tokens_per_sec", rate)
      tf.summary.scalar("flops_per_sec", window[2] / max(now - self.last_log, 1e-9))
    window[:] = 0
    self.last_log = now

  def exclude_since(self, since: float) -> None:
    """Leaves the time from `since` to now (an evaluation) out of the next tok/s."""
    self.last_log += self.clock.now() - since


class Decision(NamedTuple):
  """What the loop does after a host call; the same on every worker."""
  preempted: bool  # a stop signal arrived (on some worker): save and stop
  last: bool  # the last host call of this run: --train_steps, the budget, or preempted
  save: bool  # save a checkpoint at this step


class SavePolicy:
  """When the loop saves and when it stops, agreed by all workers once per host call.

  Use as a context manager around the loop: inside it SIGTERM (preemption) and SIGINT
  (Ctrl-C) are recorded instead of killing the process, so that the loop saves and
  stops between steps (a second Ctrl-C stops at once).

  Args:
    config: the run's TrainConfig.
    agree: the trainer's agreement collective (`distribute.Agreement`).
    clock: the run's RunClock (time-based saves and the budget).
    progress: where lines go.
  """

  def __init__(self, config: TrainConfig, agree, clock: RunClock,
               progress: Callable[[str], None]):
    self.config, self.agree, self.clock, self.progress = config, agree, clock, progress
    self.signals = _SignalFlag(signal.SIGTERM, signal.SIGINT)
    self.last_save = clock.start
    self.preempted = False

  def __enter__(self) -> SavePolicy:
    self.signals.install()
    return self

  def __exit__(self, *exc_info) -> None:
    self.signals.uninstall()

  def decide(self, step: int, now: float) -> Decision:
    """Decides, at `step` (reached at time `now`), whether to save and to stop.

    One collective on every call, whatever the outcome: every worker must make the
    same collective calls in the same order.
    """
    cfg = self.config
    self.preempted, out_of_time, save_for_time = self.agree(
        any_worker=[self.signals.received],
        chief_decides=[self.clock.budget_spent(now),
                       now - self.last_save > 60 * cfg.save_checkpoint_minutes])
    last = step == cfg.train_steps or out_of_time or self.preempted
    if out_of_time:
      self.progress(f"stopping at step {step}: the --train_minutes={cfg.train_minutes:g} "
                    "budget is spent")
    save = step % cfg.save_checkpoint_steps == 0 or last or save_for_time
    return Decision(preempted=self.preempted, last=last, save=save)

  def saved(self) -> None:
    """Restarts the --save_checkpoint_minutes interval: a checkpoint was just saved."""
    self.last_save = self.clock.now()

  def preemption_line(self, step: int) -> str:
    return (f"{self.signals.name or 'a stop signal on another worker'} received: saving "
            f"a checkpoint at step {step} and stopping; rerun the same command to resume")


class _SignalFlag:
  """Records stop signals (SIGTERM: preemption; SIGINT: Ctrl-C) so that the loop can
  save and stop between steps.

  Installed only in the main thread (Python's rule for signal handlers); elsewhere
  it is inert and the default handling stays.
  """

  def __init__(self, *signums):
    self.signums = signums
    self.received = False
    self.name = None  # of the first signal received
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.name == "SIGINT":  # a second Ctrl-C: stop now
      self.uninstall()
      raise KeyboardInterrupt
    self.received = True
    self.name = self.name or signal.Signals(signum).name

  def install(self):
    if threading.current_thread() is threading.main_thread():
      for signum in self.signums:
        self._previous[signum] = signal.signal(signum, self._handle)

  def uninstall(self):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}
