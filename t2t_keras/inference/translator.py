"""The front door of inference: `Translator.load(model_dir)`, then `.translate(lines)`
and `.score(pairs)`, with the decode command's own choices.

A `Translator` holds a restored model (or an ensemble, `loading.load_ensemble`), its
tokenizer and the decoding settings, resolved as the decode command resolves them:
the target language against the model's data, batches at a time
(`choose_parallel_batches`, before the model loads: TensorFlow's threads per op can
only be set before its runtime starts) and XLA or graph mode (`choose_xla`). The
decode and score commands are flags -> configs -> a Translator; a notebook or a
service gets the same speed and the same bytes from the same calls.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import List, Optional, Sequence, Tuple, Union

import tensorflow as tf
from absl import logging

from t2t_keras.trained import modeldir
from t2t_keras import console, language_tags
from t2t_keras.configs import DataConfig, DecodeConfig, WeightsConfig
from t2t_keras.errors import ConfigError, DataError
from t2t_keras.inference import decoding, loading, scoring, translate
from t2t_keras.parsing.constraint import TreeConstraint

# Greedy search and sampling (one row per hypothesis) use XLA from this many input
# sentences on, unless --decode_jit_compile says otherwise: each source-width bucket
# compiles once and XLA's steps are faster, so a few hundred sentences repay the
# compilations; the translations are the same (tests/decoding_test.py). Beam search
# stays in graph mode: there a sentence leaves the batch once its result is final,
# which XLA's fixed shapes cannot do, and on real sentences that wins. Figures:
# docs/benchmarks.md, "Measurements behind the decoding code".
AUTO_XLA_SENTENCES = 256

AUTO_PARALLEL_BATCHES_MAX = 8  # each batch in flight holds its own caches and logits


def choose_xla(decode_config: DecodeConfig, sentences: int,
               given: bool = False) -> DecodeConfig:
  """`decode_config.jit_compile` as it is when `given` (--decode_jit_compile on the
  command line, in a recipe or in the model directory's recorded recipe); when not given, XLA for
  greedy search and sampling of `AUTO_XLA_SENTENCES` sentences or more, graph mode for
  beam search (see AUTO_XLA_SENTENCES)."""
  if given:
    return decode_config
  return dataclasses.replace(
      decode_config,
      jit_compile=sentences >= AUTO_XLA_SENTENCES and decode_config.beams_per_row == 1)


def choose_parallel_batches(decode_config: DecodeConfig, sentences: Optional[int],
                            alignments: bool = False) -> DecodeConfig:
  """--decode_parallel_batches resolved, and TensorFlow's threads per op set to the
  cores / that many; must run before TensorFlow starts its runtime (before the model
  loads). 0: one batch per CPU core (at most AUTO_PARALLEL_BATCHES_MAX) without GPUs,
  and 1 with `alignments` (--output_alignments scores one batch at a time afterwards,
  on the threads set here). Any value is capped at the input's number of batches
  (`sentences`; None: not known yet, `translate.translate` caps each call's)."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
      os.cpu_count() or 1)
  workers = decode_config.parallel_batches
  if not workers:
    gpus = tf.config.list_physical_devices("GPU")
    workers = 1 if gpus or alignments else min(cores, AUTO_PARALLEL_BATCHES_MAX)
  if sentences is not None:
    workers = min(workers, math.ceil(sentences / decode_config.batch_size))
  workers = max(1, workers)
  if workers > 1:
    try:
      tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // workers))
    except RuntimeError:  # the runtime has started (a caller in the same process)
      logging.warning("--decode_parallel_batches=%d: TensorFlow has started, so each "
                      "batch's ops keep their threads", workers)
  return dataclasses.replace(decode_config, parallel_batches=workers)


def host_devices() -> List[str]:
  """This host's CPU and GPU devices as --decode_devices names them (CPU:0, GPU:1, ...),
  logical devices included (starts TensorFlow's runtime)."""
  return [device.name.replace("/device:", "") for device in tf.config.list_logical_devices()
          if device.device_type in ("CPU", "GPU")]


def choose_devices(decode_config: DecodeConfig) -> Tuple[str, ...]:
  """--decode_devices resolved against this host: the devices batches are spread over
  (`translate.translate` gives batch i to the i-th mod N, each its copy of the weights),
  or () for TensorFlow's default device alone, as without the flag. 'auto': every GPU
  when the host has more than one, else (); 'all': every GPU, else every CPU device
  (logical CPU devices: how tests check it); or the devices listed. Call it after
  `choose_parallel_batches`: it starts TensorFlow's runtime (but for 'auto' on a host
  without two GPUs, which asks the physical devices only).

  Raises:
    ConfigError: a device this host does not have, or one listed twice (naming
      --decode_devices and the host's devices).
  """
  value = decode_config.devices.strip()
  if value == "auto" and len(tf.config.list_physical_devices("GPU")) < 2:
    return ()
  host = host_devices()
  gpus = [name for name in host if name.startswith("GPU:")]
  if value == "auto":
    return tuple(gpus) if len(gpus) > 1 else ()
  if value == "all":
    return tuple(gpus or [name for name in host if name.startswith("CPU:")])
  chosen = [part.strip().upper().replace("/DEVICE:", "") for part in value.split(",")]
  unknown = [name for name in chosen if name not in host]
  if unknown:
    raise ConfigError(
        f"--decode_devices={value}: this host has no {', '.join(unknown)}; its devices are "
        f"{', '.join(host)}. Name some of them, or use 'auto' (every GPU when there are "
        "several) or 'all'.")
  if len(set(chosen)) < len(chosen):
    raise ConfigError(f"--decode_devices={value} names a device twice: name each once.")
  return tuple(chosen)


def with_language(config: DecodeConfig, data_config: DataConfig) -> DecodeConfig:
  """`config` with its target language resolved against the model's data
  (`language_tags.check_request`: the dev files' language by default).

  Raises:
    ConfigError: a language the model has no tag for (naming --target_language).
  """
  try:
    language = language_tags.check_request(config.target_language, data_config,
                                           "--target_language")
  except ValueError as error:
    raise ConfigError(str(error)) from None
  return dataclasses.replace(config, target_language=language)


def guided_attention(model_dirs: Sequence[str]) -> Optional[Tuple[int, int]]:
  """The (decoder layer, head) one model trained with guided alignment
  (--train_alignments) was trained to align with, else None (an ensemble, or a model
  trained without: the average of the heads aligns worse than the guided head, the
  other heads were never told to align)."""
  guided = modeldir.guided_alignment_of(model_dirs[0]) if len(model_dirs) == 1 else None
  return None if guided is None else (guided["layer"], guided["head"])


def tree_constraint(decode_config: DecodeConfig, loaded, model_dirs: Sequence[str]):
  """--constrain_trees: the tree constraint of the (first) model's parser, else None."""
  if not decode_config.constrain_trees:
    return None
  try:
    return TreeConstraint.from_tokenizer(loaded[0].tokenizer,
                                         loaded[0].data_config.parsing_linearization)
  except ValueError as error:
    raise DataError(f"--constrain_trees with --model_dir={','.join(model_dirs)}: "
                    f"{error}") from None


class Translator:
  """A loaded model (or ensemble) that translates and scores, as decode and score do.

  Attributes:
    model: the Keras model (an `ensemble.Ensemble` for several model directories).
    loaded: the `loading.Loaded` of every model directory (checkpoints, configs).
    tokenizer: the (first) model's tokenizer.
    decode_config: the settings it decodes with (target language and batches at a
      time resolved; `jit_compile` too when the number of sentences was given).
    xla_given: whether XLA or graph mode was chosen by the caller (or the recipe),
      rather than by `choose_xla` from each input's number of sentences.
    devices: the devices `translate` spreads batches over (`choose_devices`); () =
      TensorFlow's default device.
    replicas: the model on each of `devices`, in order (`loading.on_device`: `model`
      itself where its weights are, else a copy there, made on the first translation);
      `model` alone without devices. `score` and `alignments` run on `model`.
  """

  def __init__(self, model, loaded: Sequence[loading.Loaded], decode_config: DecodeConfig,
               *, xla: Optional[bool] = None, sentences: Optional[int] = None,
               constraint=None, devices: Optional[Sequence[str]] = None):
    """Wraps a model already loaded (`Translator.load` loads one).

    Args:
      model: the model to decode with (`loading.load_ensemble`'s first result).
      loaded: the `Loaded` of each model directory.
      decode_config: the decoding settings.
      xla: True/False: XLA / graph mode whatever the input; None: `choose_xla`.
      sentences: the number of sentences the caller will translate in all (the
        decode command's input): XLA or graph mode is chosen once for them; None:
        for each `translate` call's lines.
      constraint: the tree constraint of a parsing model (`tree_constraint`).
      devices: the devices to decode on (`choose_devices`' names); None:
        `choose_devices(decode_config)`. Each gets a copy of the weights, made once
        when the first lines are translated (scoring alone makes none).
    """
    self.model, self.loaded = model, list(loaded)
    self.devices = tuple(choose_devices(decode_config) if devices is None else devices)
    self.tokenizer = self.loaded[0].tokenizer
    self.xla_given = xla is not None
    if self.xla_given:
      decode_config = dataclasses.replace(decode_config, jit_compile=xla)
    self._fixed = self.xla_given or sentences is not None
    if sentences is not None:
      decode_config = choose_xla(decode_config, sentences, self.xla_given)
    self.decode_config = decode_config
    self._constraint = constraint
    self._decode_fns = {}  # jit_compile -> a decode_fn per device: traces are reused

  @classmethod
  def load(cls, model_dir: Union[str, Sequence[str]],
           decode_config: Optional[DecodeConfig] = None,
           weights_config: Optional[WeightsConfig] = None, *,
           sentences: Optional[int] = None, xla: Optional[bool] = None,
           alignments: bool = False) -> "Translator":
    """Loads a model directory (or several sharing a vocabulary: an ensemble).

    Args:
      model_dir: a model directory written by training, or a list of them.
      decode_config: the decoding settings; None: the model's recipe's
        (`modeldir.recipe_decode_config`, DecodeConfig's defaults where it set none).
      weights_config: which weights; None: as the recipe says (its --average_last_n
        and --decode_dtype; else the latest checkpoint in the model's dtype).
      sentences: see `Translator`; also caps the batches at a time.
      xla: see `Translator`; None: the recipe's --decode_jit_compile if it recorded
        one, else `choose_xla`.
      alignments: alignments will be computed (`alignments`): one batch at a time
        unless `decode_config.parallel_batches` says otherwise.

    Raises:
      ModelDirError / CheckpointError / ConfigError / DataError with what to do.
    """
    model_dirs = [model_dir] if isinstance(model_dir, str) else list(model_dir)
    recorded = modeldir.recipe_decoding_of(model_dirs[0])
    if decode_config is None:
      decode_config = modeldir.recipe_decode_config(model_dirs[0])
    if xla is None and "decode_jit_compile" in recorded:
      xla = bool(recorded["decode_jit_compile"])
    weights = weights_config or WeightsConfig(average_last_n=None)
    decode_config = with_language(decode_config, modeldir.data_config_of(model_dirs[0]))
    # Before the model loads: threads per op are set before TensorFlow's runtime starts.
    decode_config = choose_parallel_batches(decode_config, sentences, alignments)
    devices = choose_devices(decode_config)  # a device the host lacks: before the loading
    model, loaded = loading.load_ensemble(model_dirs, weights.checkpoint_path,
                                          weights.average_last_n, weights.dtype)
    return cls(model, loaded, decode_config, xla=xla, sentences=sentences,
               constraint=tree_constraint(decode_config, loaded, model_dirs),
               devices=devices)

  @functools.cached_property
  def replicas(self) -> list:
    """See the class docstring."""
    return [loading.on_device(self.model, d) for d in self.devices] or [self.model]

  def config_for(self, sentences: int) -> DecodeConfig:
    """The settings a call translating `sentences` sentences decodes with."""
    if self._fixed:
      return self.decode_config
    return choose_xla(self.decode_config, sentences)

  def decode_fn(self, config: DecodeConfig):
    """The model's search under `config` (`decoding.make_decode_fn`), made once per
    mode; on the first of `devices` when there are some (`decode_fns`: all)."""
    return self.decode_fns(config)[0]

  def decode_fns(self, config: DecodeConfig) -> list:
    """The search under `config` on each of `devices`, over its replica (one without
    devices), made once per mode: under XLA each compiles its own programs."""
    if config.jit_compile not in self._decode_fns:
      self._decode_fns[config.jit_compile] = [
          decoding.make_decode_fn(replica, config, self._constraint, device)
          for replica, device in zip(self.replicas, self.devices or [None])]
    return self._decode_fns[config.jit_compile]

  def translations(self, lines: Sequence[str], *,
                   target_prefixes: Optional[Sequence[str]] = None, progress=False,
                   first_key: int = 0) -> List[translate.Translation]:
    """One `translate.Translation` per line, in input order: texts and scores (every
    beam with `return_beams`, the samples when sampling), output and source ids,
    whether the source was cut. Arguments as `translate.translate`'s."""
    config = self.config_for(len(lines))
    return translate.translate(self.decode_fns(config), self.tokenizer, lines, config,
                               target_prefixes=target_prefixes, progress=progress,
                               first_key=first_key)

  def translate(self, lines: Sequence[str], **kwargs) -> List[str]:
    """The best translation of each line, in input order (`translations`' arguments)."""
    return [result.texts[0] for result in self.translations(lines, **kwargs)]

  def alignments(self, results: Sequence[translate.Translation], multiple: bool = False,
                 attention: Tuple[int, int] = (-1, -1), progress: bool = False) -> List[str]:
    """Word alignments of `translations`' results: one Pharaoh line (`i-j`, 0-based
    source and target word indices) per output line, from `attention`'s encoder-decoder
    attention (decoder layer, head; -1 = heads averaged); with `multiple` (every beam
    or sample written) one per beam and an empty line after each input's."""
    layer, head = attention
    pairs = [(r.source_ids, ids) for r in results for ids in (r.ids if multiple
                                                               else r.ids[:1])]
    meter = console.Progress(len(pairs), unit="pairs", verb="aligned") if progress else None
    forced = scoring.force(self.model, [s for s, _ in pairs],
                           [scoring.with_eos(t) for _, t in pairs],
                           batch_size=self.decode_config.batch_size,
                           attention_layer=layer, progress=meter)
    starts = scoring.word_starts(self.tokenizer)
    aligned = iter([scoring.pharaoh(scoring.align(f.attention, s, scoring.with_eos(t),
                                                  starts, head))
                    for f, (s, t) in zip(forced, pairs)])
    lines = []
    for result in results:
      for _ in (result.ids if multiple else result.ids[:1]):
        lines.append(next(aligned))
      if multiple:
        lines.append("")
    return lines

  def score(self, pairs: Sequence[Tuple[str, str]], *, progress=False,
            stream=None) -> List[scoring.Forced]:
    """log P(target | source) of each (source, target) pair, teacher-forced, in input
    order: `total` (nats, EOS included) and each target token's `log_probs`, as the
    score command writes them. Sources start with the target language's tag (a
    multilingual model) and are cut to `decode_config.max_input_length`; with
    `stream`, a note saying how many were cut is printed there."""
    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    language = self.decode_config.target_language
    tag = [self.tokenizer.tag_id(language)] if language else []  # the source's first piece
    source_ids = [scoring.with_eos(tag + s) for s in self.tokenizer.tokenize(tf.constant(
        sources or [""])).to_list()]
    target_ids = [scoring.with_eos(t) for t in self.tokenizer.target.tokenize(
        tf.constant(targets or [""])).to_list()]
    if not sources:
      source_ids = target_ids = []
    limit = self.decode_config.max_input_length
    note = translate.truncation_note(sum(len(s) > limit for s in source_ids),
                                     len(source_ids), limit, "sources", "score")
    if note and stream is not None:
      print(note, file=stream, flush=True)
    source_ids = [s if len(s) <= limit else s[:limit - 1] + [s[-1]] for s in source_ids]
    meter = progress if isinstance(progress, console.Progress) else (
        console.Progress(len(sources), unit="pairs", verb="scored") if progress else None)
    return scoring.force(self.model, source_ids, target_ids,
                         batch_size=self.decode_config.batch_size, progress=meter)

  def truncation_note(self, cut: int, total: int) -> Optional[str]:
    """The note on `cut` of `total` sources cut to this decoding's max_input_length
    (None when none was)."""
    return translate.truncation_note(cut, total, self.decode_config.max_input_length)

  def describe(self, sentences) -> str:
    """The decode command's first line: how many `sentences` decode with what (the
    checkpoints; several: their average), how, and in which mode and why."""
    config = self.decode_config
    if config.sampling:
      how = (f"sampling {config.num_samples} per input: top-k "
             f"{config.sampling_topk or 'all'}, top-p {config.sampling_topp:g}, "
             f"temperature {config.sampling_temperature:g}, seed {config.seed}")
    else:
      how = f"beam {config.beam_size}, alpha {config.alpha}"
    how += (f"; {config.parallel_batches} batches at a time"
            if config.parallel_batches > 1 else "")
    if len(self.devices) > 1:
      how += (f"{' on each of' if config.parallel_batches > 1 else '; batches spread over'}"
              f" {len(self.devices)} devices ({self.where()})")
    elif self.devices:
      how += f"; on {self.devices[0]}"
    used = self.describe_weights()
    if config.jit_compile:
      mode = "XLA" + ("" if self.xla_given else
                      f" (one row per input from {AUTO_XLA_SENTENCES} sentences on; "
                      "--nodecode_jit_compile for graph mode)")
    else:
      mode = "graph mode" + ("" if self.xla_given else
                             " (beam search drops finished sentences from the batch; "
                             "--decode_jit_compile for XLA)")
    return (f"decoding {sentences} sentences with {used}"
            f"{' (ensemble)' if len(self.loaded) > 1 else ''} ({how}, extra length "
            f"{config.extra_decode_length}; {mode})")

  def where(self) -> str:
    """The devices it decodes on ("GPU:0, GPU:1"); "" on the default device."""
    return ", ".join(self.devices)

  def describe_weights(self) -> str:
    """The checkpoints it decodes with (several in one model: their average)."""
    return "; ".join(("the average of " if len(m.checkpoints) > 1 else "")
                     + ", ".join(m.checkpoints) for m in self.loaded)
