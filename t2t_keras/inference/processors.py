"""Decoding processors: the options that change which tokens a search may write.

A decoding option (a minimum length, the length limit, the tree constraint of parsing,
later a target prefix or a repetition penalty) is one small object behind one protocol,
composed by `t2t_keras.inference.decoding.decode_ids` around the model's step, as keras-hub
composes samplers and OpenNMT-tf decoding strategies. The searches themselves (beam,
greedy, sampling in `t2t_keras.inference.search`) stay pure functions that know nothing of
the options.

Protocol: `processor.start(rows)` binds the processor to a batch and returns
`(step, initial_state)`:
  * `rows` (`Rows`): per-hypothesis tensors of the batch (R = batch x beam rows): the
    source ids and the output length limit (and the vocabulary size V);
  * `initial_state`: a nest of tensors with leading dimension R (or `()`), the
    processor's memory of each hypothesis' history (e.g. brackets opened so far);
  * `step(logits, ids, index, state) -> (logits, state)`: float32 logits (R, V) of
    the position `index` being decoded, `ids` (R,) the token each hypothesis wrote
    last (BOS at index 0); returns the adjusted logits (NEG_INF for a token that may
    not come) and the new state.
The decoder reorders every processor's state with the beams (each row follows its
parent hypothesis) in both cache layouts, so a processor never handles beams itself.
Per-row tensors a step reads (taken from `rows`) belong in its state too, not in the
step's closure: in graph mode a sentence whose result is final leaves the batch
(`beam_search.ShrinkingBatch`), and only the state follows.
Processors run in order; the length limit comes last, so that it wins.

`for_config` lists the processors of the inference settings (`configs.DecodeConfig`):
a new decoding option is its setting there and its processor here.
"""

from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.configs import DecodeConfig
from t2t_keras.inference.search import NEG_INF

Step = Callable[[tf.Tensor, tf.Tensor, tf.Tensor, Any], Tuple[tf.Tensor, Any]]


class Rows(NamedTuple):
  """The batch a processor is bound to, one row per hypothesis (R = B x K)."""

  inputs: tf.Tensor  # (R, S) int32 source ids, EOS then PAD
  limits: tf.Tensor  # (R,) int32: EOS is forced at position limits - 1
  prefix: Optional[tf.Tensor] = None  # (R, P) int32 forced first target ids, PAD after
  vocab_size: Optional[int] = None  # V, the logits' width


def for_config(config: DecodeConfig, tree_constraint: Optional["Processor"] = None,
               target_prefix: bool = False) -> List["Processor"]:
  """The decoding options of `config`, in the order they apply: the target prefix,
  the tree constraint (parsing, `config.constrain_trees`: its `TreeConstraint`), the
  minimum length, then the length limit (last, so that it wins)."""
  options = [TargetPrefix()] if target_prefix else []
  if tree_constraint is not None:
    options.append(tree_constraint)
  if config.min_decode_length > 0:
    options.append(MinLength(config.min_decode_length))
  return options + [LengthLimit()]


class Processor:
  """One decoding option (see the module docstring). Subclasses override `start`."""

  def start(self, rows: Rows) -> Tuple[Step, Any]:
    raise NotImplementedError


class MinLength(Processor):
  """No EOS before position `min_length` (`--min_decode_length`): 1 never returns an
  empty output."""

  def __init__(self, min_length: int):
    self.min_length = min_length

  def start(self, rows: Rows):
    del rows

    def step(logits, ids, index, state):
      del ids
      is_eos = tf.equal(tf.range(tf.shape(logits)[-1]), EOS_ID)[None, :]
      # Only the first steps pay for a pass over (R, V).
      return only_when(index < self.min_length,
                       lambda: tf.where(is_eos, NEG_INF, logits), logits), state
    return step, ()


class TargetPrefix(Processor):
  """The output starts with each row's `rows.prefix` (`--target_prefix_file`, the
  serving signature `translate_with_prefix`), as CTranslate2's `target_prefix`: at
  position i < the prefix's length the prefix's token is the only one allowed, with
  log probability 0 (a hypothesis' score is that of what the search chose after the
  prefix); a row whose prefix is empty (all PAD) decodes freely. Comes first, so that
  the length limit still wins."""

  def start(self, rows: Rows):
    if rows.prefix is None:
      raise ValueError("TargetPrefix needs Rows.prefix")
    prefix = tf.cast(rows.prefix, tf.int32)
    # One PAD column more: position P (and every later one, clipped to it) is free.
    prefix = tf.pad(prefix, [[0, 0], [0, 1]], constant_values=PAD_ID)

    def step(logits, ids, index, prefix):
      del ids
      last = tf.shape(prefix)[1] - 1
      forced = tf.gather(prefix, tf.minimum(index, last), axis=1)  # (R,)
      only = tf.where(tf.equal(tf.range(tf.shape(logits)[-1])[None, :], forced[:, None]),
                      0.0, NEG_INF)
      return tf.where(tf.not_equal(forced, PAD_ID)[:, None], only, logits), prefix
    return step, prefix


class LengthLimit(Processor):
  """Each hypothesis must end (EOS, with log probability 0) at its row's limit - 1: the
  paper's input length + 50, counted per sentence so that a translation does not
  depend on the batch it is decoded in."""

  def start(self, rows: Rows):
    def step(logits, ids, index, limits):
      del ids
      at_limit = index >= limits - 1  # (R,)

      def force_eos():
        eos_only = tf.where(tf.equal(tf.range(tf.shape(logits)[-1]), EOS_ID), 0.0, NEG_INF)
        return tf.where(at_limit[:, None], eos_only[None, :], logits)
      return only_when(tf.reduce_any(at_limit), force_eos, logits), limits
    return step, tf.cast(rows.limits, tf.int32)  # the state: each row's limit


def only_when(condition: tf.Tensor, adjust: Callable[[], tf.Tensor],
              logits: tf.Tensor) -> tf.Tensor:
  """`adjust()` when `condition` holds, else `logits` untouched: a processor that
  changes the logits on few steps skips its pass over the whole (R, V) tensor on the
  others (each such pass costs about as much as a step's smaller matmuls)."""
  return tf.cond(condition, adjust, lambda: logits)


def compose(symbols_to_logits, state, processors: Sequence[Processor], rows: Rows):
  """The model's step with `processors` applied to its logits, in order.

  Args:
    symbols_to_logits: (ids, index, state) -> (logits, state), the model's step
      (or (ids, index, state, context) -> ...: the composed step passes a search's
      `context` on).
    state: the model's initial state.
    processors: the decoding options.
    rows: the batch, per hypothesis row.

  Returns:
    (step, initial state): the state is (the model's, a tuple of each processor's).
  """
  bound = [p.start(rows) for p in processors]

  def step(ids, index, full_state, *context):
    inner, states = full_state
    logits, inner = symbols_to_logits(ids, index, inner, *context)
    logits = tf.cast(logits, tf.float32)
    new_states = []
    for (fn, _), processor_state in zip(bound, states):
      logits, processor_state = fn(logits, ids, index, processor_state)
      new_states.append(processor_state)
    return logits, (inner, tuple(new_states))
  return step, (state, tuple(initial for _, initial in bound))
