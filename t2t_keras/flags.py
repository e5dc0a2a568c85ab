"""The shared absl flags of t2t_keras, generated from the config fields; FLAGS -> configs.

The flags of ModelConfig, DataConfig, TrainConfig, DecodeConfig and WeightsConfig are
generated from their fields (configs.py holds each setting's default, help, choices and
check); this module adds the few shared flags that are not config fields (--model_dir,
--dry_run, --output_file; what a run does besides training, --eval_bleu_sentences,
--export, ..., are RunConfig's). The inference settings' flags a command reads are
`decoding_flags(command)`: the one list of decoding flags. The settings' checks are not
written here: each config group gets one flag validator that builds the config and calls
its `validate()`, and the data group's also asks the chosen data source
(t2t_keras.data.sources.sources) to check its own flags; which data flags a source reads, and so
which ones train refuses, is the source's answer. This module's own checks are of the
command line: flags typed for a run that ignores them, and the few checks across configs
(a TPU needs static shapes). Entry points call `define_*` for the groups they use and
turn FLAGS into configs with the `*_config` functions below: library code never reads
FLAGS. A command's own flags (decode's --input_file, evaluate's --hypotheses, ...) live
in its entry point. Names follow tensor2tensor's hparams so its users recognise them.

Every entry point that reads a model directory defines the model, data, training and
decoding groups, so one recipe serves train, decode and export; a flag typed
on the command line that the command would ignore is refused or warned about
(`check_train_flags`, `check_inference_flags`). Training records the decoding flags it
was given in the model directory (`recipe_decoding`), and decode, score and export
default to them where they are not given (`use_recipe`), so a model decodes as its
recipe says without being given the recipe again.

Recipes are the files of flags/, passed with --flagfile (`--flagfile=flags/base_en_de.cfg`);
a recipe can include another, and later flags override earlier ones. Relative paths in
recipes resolve from the current directory: run the commands from the repository root.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

from absl import flags

from t2t_keras import errors
from t2t_keras.configs import (SHARED_EMBEDDINGS_PROBLEM, DataConfig, DecodeConfig,
                               ModelConfig, RunConfig, TrainConfig, WeightsConfig,
                               dtype_name, flag_name, guided_alignment_problems)
from t2t_keras.data.sources import sources
from t2t_keras.trained import modeldir

FLAGS = flags.FLAGS


class _Definer:
  """absl's DEFINE_* and validators bound to one FlagValues (tests use fresh ones)."""

  def __init__(self, flag_values):
    self.flag_values = flag_values

  def __getattr__(self, name):
    return functools.partial(getattr(flags, name), flag_values=self.flag_values)


# The groups `--help` lists the shared flags in (console.own_help): group -> what it
# is, in the order shown, and flag name -> group, in definition order. A command's help
# shows the groups it defined, so the names are recorded as the groups define them.
GROUPS = {}
GROUP_OF = {}
_CONFIG_GROUPS = {ModelConfig: "model", DataConfig: "data", TrainConfig: "training",
                  DecodeConfig: "decoding", WeightsConfig: "decoding"}


def _once(first_flag, group):
  """Lets several entry points define the same group without duplicate errors, and
  files the flags it defines under `group` for --help (the docstring describes it)."""
  def wrapper(fn):
    GROUPS[group] = " ".join(fn.__doc__.split())

    @functools.wraps(fn)
    def define(flag_values=FLAGS):
      if first_flag not in flag_values:
        before = set(flag_values)
        fn(_Definer(flag_values))
        for name in flag_values:
          if name not in before:
            GROUP_OF.setdefault(name, group)
    return define
  return wrapper


_DEFINERS = {"int": "DEFINE_integer", "float": "DEFINE_float", "bool": "DEFINE_boolean",
             "str": "DEFINE_string", "Optional[str]": "DEFINE_string"}


def define_settings(config_class, names=None, flag_values=FLAGS, choices=None,
                    helps=None) -> None:
  """Defines the flags of `config_class`'s fields that have help (or only `names`),
  skipping flags `flag_values` already has.

  Each flag gets the field's default and help, an enum of its choices, and a
  validator of its check (`configs.setting`); `choices` and `helps` ({field name:
  value}) give those of fields whose values another module owns (the data sources).
  """
  f = _Definer(flag_values)
  for field in dataclasses.fields(config_class):
    meta = field.metadata
    if meta.get("help") is None or (names is not None and field.name not in names):
      continue
    name = flag_name(field)
    if name in flag_values:  # defined by an earlier call (entry points share groups)
      continue
    enum = (choices or {}).get(field.name, meta["choices"])
    text = (helps or {}).get(field.name, meta["help"])
    if enum:
      f.DEFINE_enum(name, field.default, list(enum), text)
    else:
      getattr(f, _DEFINERS[field.type])(name, field.default, text)
    if config_class in _CONFIG_GROUPS:
      GROUP_OF.setdefault(name, _CONFIG_GROUPS[config_class])
    if meta["check"]:
      ok, text = meta["check"]
      f.register_validator(name, lambda v, ok=ok: v is None or ok(v),
                           message=f"--{name} {text}.")


def settings_from_flags(config_class, fv=FLAGS, **values):
  """`config_class` with each field read from its flag where `fv` has one.

  Fields given in `values`, and fields whose flag `fv` does not define, keep those
  values or their defaults.
  """
  for field in dataclasses.fields(config_class):
    name = flag_name(field)
    meta = field.metadata
    if field.name not in values and (meta.get("help") or meta.get("flag")) and name in fv:
      values[field.name] = fv[name].value
  return config_class(**values)


def _validate_group(f, config_class, check) -> None:
  """Registers one validator over the flags of `config_class` defined so far: it
  builds the config from them and runs `check(config)` (its `validate()`, ...), so a
  command line that breaks a config's checks fails while it is parsed."""
  names = {flag_name(field): field.name for field in dataclasses.fields(config_class)
           if flag_name(field) in f.flag_values and (field.metadata.get("help")
                                                     or field.metadata.get("flag"))}

  def valid(values):
    try:
      check(config_class(**{names[name]: value for name, value in values.items()}))
    except errors.UserError as error:
      raise flags.ValidationError(str(error)) from None
    return True
  f.register_multi_flags_validator(sorted(names), valid)


def _check_data(config: DataConfig) -> None:
  sources.data_source(config.validate()).validate()  # the source checks its own flags


@_once("vocab_size", "model")
def define_model_flags(f):
  """Architecture flags (paper section 3 and Table 3)."""
  define_settings(ModelConfig, flag_values=f.flag_values)
  _validate_group(f, ModelConfig, ModelConfig.validate)


@_once("data_source", "data")
def define_data_flags(f):
  """Where the sentence pairs come from (the sources of t2t_keras.data.sources.sources) and how
  they are batched."""
  define_settings(DataConfig, flag_values=f.flag_values,
                  choices={"source": sources.SOURCES},
                  helps={"source": sources.flag_help()})
  f.DEFINE_integer("shuffle_buffer", None, "Deprecated and ignored: training shuffles "
                       "the whole corpus (t2t_keras.data.batching.plan). Kept so that old "
                       "recipes run; setting it logs a warning.")
  _validate_group(f, DataConfig, _check_data)


@_once("model_dir", "training")
def define_train_flags(f):
  """Optimisation, distribution and checkpointing, and what happens after training."""
  define_settings(TrainConfig, flag_values=f.flag_values)
  f.DEFINE_string("model_dir", None, "Checkpoints, summaries, vocabulary, flags.")
  # After --model_dir and around --dry_run, in the order --help lists them.
  define_settings(RunConfig, ("eval_bleu_sentences", "export", "export_dir"),
                  flag_values=f.flag_values)
  f.DEFINE_boolean("dry_run", False,
                   "Build the model from the flags, print its summary and parameter "
                   "count, and exit (no data needed).")
  define_settings(RunConfig, flag_values=f.flag_values)
  _validate_group(f, TrainConfig, TrainConfig.validate)


def _reads(field: dataclasses.Field, command) -> bool:
  """Whether `command` reads the flag of an inference setting (`configs.setting`'s
  `only`); command None: the flags every command that decodes defines."""
  only = field.metadata.get("only")
  has_flag = field.metadata.get("help") or field.metadata.get("flag")
  return bool(has_flag) and (only is None or only == command)


def decoding_fields(command=None, config_class=DecodeConfig) -> tuple:
  """The fields of `config_class` whose flags `command` reads (see `_reads`)."""
  return tuple(field.name for field in dataclasses.fields(config_class)
               if _reads(field, command))


def decoding_flags(command=None) -> tuple:
  """The inference flags (DecodeConfig's, WeightsConfig's) that `command` reads:
  those every command that decodes reads, and with a command also its own. The one
  list of decoding flags: the flags layer, the export formats' declarations
  (tests/export_formats_test.py) and the commands' checks of unused flags read it."""
  return tuple(flag_name(field) for config_class in (DecodeConfig, WeightsConfig)
               for field in dataclasses.fields(config_class) if _reads(field, command))


@_once("beam_size", "decoding")
def define_decode_flags(f):
  """Beam search (paper: beam 4, alpha 0.6, input length + 50) and what to decode with."""
  define_settings(DecodeConfig, decoding_fields(), flag_values=f.flag_values)
  define_settings(WeightsConfig, flag_values=f.flag_values)


def define_output_file(help_text: str, flag_values=FLAGS) -> None:
  """--output_file, which decode and score both take: defined by whichever is imported
  first (a process runs one command; tests import several into one process)."""
  if "output_file" not in flag_values:
    flags.DEFINE_string("output_file", None, help_text, flag_values=flag_values)


def define_all(flag_values=FLAGS):
  define_model_flags(flag_values)
  define_data_flags(flag_values)
  define_train_flags(flag_values)
  define_decode_flags(flag_values)


def model_config(vocab_size=None, fv=FLAGS, target_vocab_size=None) -> ModelConfig:
  """ModelConfig from FLAGS (vocab_size, and target_vocab_size with separate
  vocabularies, from the built vocabularies when given)."""
  values = {"vocab_size": vocab_size} if vocab_size else {}
  if target_vocab_size:
    values["target_vocab_size"] = target_vocab_size
  return settings_from_flags(ModelConfig, fv, **values).validate()


def data_config(fv=FLAGS) -> DataConfig:
  """DataConfig from FLAGS, validated with its source's checks; the data directory
  defaults to --model_dir."""
  config = settings_from_flags(
      DataConfig, fv, data_dir=fv.data_dir or (fv.model_dir if "model_dir" in fv else None))
  _check_data(config)
  return config


def train_config(fv=FLAGS) -> TrainConfig:
  return settings_from_flags(TrainConfig, fv).validate()


def run_config(resume_command=None, fv=FLAGS) -> RunConfig:
  """RunConfig from FLAGS, with what the run records of its command line: whether
  --vocab_file was given, the decoding flags given (`recipe_decoding`), the flags as a
  flagfile, and `resume_command` (the command that resumes the run)."""
  return settings_from_flags(
      RunConfig, fv, vocab_file_given=fv["vocab_file"].present,
      recipe_decoding=recipe_decoding(fv), flags_text=fv.flags_into_string(),
      resume_command=resume_command).validate()


def decode_config(fv=FLAGS) -> DecodeConfig:
  """DecodeConfig from FLAGS (the sampling fields too where the command defines them),
  validated."""
  return settings_from_flags(DecodeConfig, fv).validate()


def model_dirs(fv=FLAGS) -> list:
  """The model directories of --model_dir (a comma-separated list for ensembles)."""
  dirs = [d.strip() for d in (fv.model_dir or "").split(",")]
  if not all(dirs):
    raise flags.ValidationError(f"--model_dir={fv.model_dir} has an empty entry: give "
                                "one directory, or several separated by commas.")
  return dirs


def checkpoint_choice(argv, fv=FLAGS) -> tuple:
  """(checkpoint_path, average_last_n) for decode, score and export.

  A recipe may set --average_last_n (the paper's 5 or 20); a
  --checkpoint_path typed on the command line then wins over it (both typed on the
  command line is refused by `checkpoints.choose_checkpoints`).
  """
  average = fv.average_last_n
  if fv.checkpoint_path and "average_last_n" not in command_line_flags(argv, fv):
    average = 0
  return fv.checkpoint_path, average


def weights_config(argv, fv=FLAGS) -> WeightsConfig:
  """The WeightsConfig of the flags, its checkpoint chosen by `checkpoint_choice`."""
  checkpoint_path, average_last_n = checkpoint_choice(argv, fv)
  return settings_from_flags(WeightsConfig, fv, checkpoint_path=checkpoint_path,
                             average_last_n=average_last_n)


# ------------------------------------------------------------ the recipe's decoding
# Not recorded: a checkpoint path names weights of one place and time, not a setting.
_NOT_RECORDED = ("checkpoint_path",)


def recipe_decoding(fv=FLAGS) -> dict:
  """The decoding flags a training run was given (command line or recipe), by name:
  what the model directory records as its recipe's way to decode (config.json,
  `modeldir.recipe_decoding_of`). Flags left at their defaults are not recorded, so a
  command's own default (decode's choice of XLA, ...) still applies to them."""
  return {name: fv[name].value for name in decoding_flags()
          if name in fv and fv[name].present and name not in _NOT_RECORDED}


@dataclasses.dataclass(frozen=True)
class RecipeUse:
  """How a command's decoding flags relate to the model directory's recipe.

  Attributes:
    applied: flag -> the recipe's value, for the flags the command was not given.
    overridden: flag -> the recipe's value, for the flags given (command line or
      recipe) with another value, which wins.
  """

  applied: dict
  overridden: dict

  def describe(self, names=None, fv=FLAGS) -> str:
    """Where the settings came from, for the command's first line ("" when the
    recipe set nothing); `names`: only these flags (those the command reads)."""
    def shown(record):
      return " ".join(f"--{n}={_as_flag(v)}" for n, v in sorted(record.items())
                      if names is None or n in names)
    parts = []
    if shown(self.applied):
      parts.append(f"from the model directory's recipe: {shown(self.applied)}")
    if shown(self.overridden):
      given = " ".join(f"--{n}={_value(fv, n)}" for n in sorted(self.overridden)
                       if names is None or n in names)
      parts.append(f"given here instead of the recipe's {shown(self.overridden)}: {given}")
    return "; ".join(parts)


def _as_flag(value) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


def use_recipe(model_dir: str, fv=FLAGS) -> RecipeUse:
  """Sets the decoding flags that were not given (on the command line or in a
  recipe) to the values the model directory's recipe recorded at training, so that
  decode, score and export decode a model as its recipe says, as tensor2tensor's
  hparams and OpenNMT-tf's model configuration do. Given flags win; a directory
  without a record keeps the flags' defaults. Call before reading the configs."""
  applied, overridden = {}, {}
  for name, value in modeldir.recipe_decoding_of(model_dir).items():
    if name not in fv or name in _NOT_RECORDED:
      continue
    if fv[name].present:
      if fv[name].value != value:
        overridden[name] = value
    else:
      fv[name].value = value  # a default, not "given": `present` stays False
      applied[name] = value
  return RecipeUse(applied, overridden)


# ------------------------------------------------------------ flags a run does not use
_MODEL_FLAGS = tuple(flag_name(field) for field in dataclasses.fields(ModelConfig))


def _data_flags(fields) -> tuple:
  """The flags of DataConfig fields (a source's `reads`, `sources.TEXT_FIELDS`)."""
  by_field = {field.name: flag_name(field) for field in dataclasses.fields(DataConfig)}
  return tuple(by_field[name] for name in fields)


def command_line_flags(argv, fv=FLAGS) -> list:
  """Names of the flags typed on the command line itself, not read from a recipe
  (--flagfile).

  A recipe's values may pass silently when a command does not use them (one recipe
  serves train, decode and export); a flag typed for this command must not.
  """
  names = []
  for arg in argv[1:]:
    if arg == "--":  # absl stops parsing flags here
      break
    if not arg.startswith("-") or arg == "-":
      continue
    name = arg.lstrip("-").split("=", 1)[0]
    if name not in fv and name.startswith("no") and name[2:] in fv:
      name = name[2:]
    if name in fv and name != "flagfile" and name not in names:
      names.append(name)
  return names


def _value(fv, name) -> str:
  value = fv[name].value
  return str(value).lower() if isinstance(value, bool) else str(value)


def check_train_flags(argv, fv=FLAGS) -> list:
  """Refuses flags typed for `train` that this run would silently ignore.

  Returns:
    Warnings to log, one line each (deprecated flags, --jit_compile without one batch
    shape per program).

  Raises:
    flags.ValidationError: naming each such flag, why it is unused and what to do.
  """
  warnings = []
  if "shuffle_buffer" in fv and fv.shuffle_buffer is not None:
    warnings.append("--shuffle_buffer is ignored: training shuffles the whole corpus "
                    "every epoch (no buffer); drop the flag")
  if "dry_run" in fv and fv.dry_run:
    return warnings  # builds the model from the model flags (including --vocab_size) only
  if fv.jit_compile and not fv.static_shapes and not fv.packed_length:
    # Bucketed batches without static shapes vary in rows and length from step to step;
    # static shapes give one shape per bucket, packed rows one shape for all.
    warnings.append(
        "--jit_compile without --static_shapes or --packed_length: XLA compiles the train "
        "step once per batch shape, and batches of dynamic shape (rows x length) come in "
        "a new shape nearly every step, so the run would spend its time compiling; add "
        "--static_shapes (one program per bucket) or --packed_length (one for all), or "
        "drop --jit_compile")
  source = sources.SOURCE_CLASSES[fv.data_source]
  ignored = set(itertools.chain.from_iterable(
      _data_flags(cls.reads) for cls in sources.SOURCE_CLASSES.values()))
  ignored -= set(_data_flags(source.reads))
  if not source.is_text:
    ignored |= set(_data_flags(sources.TEXT_FIELDS))
  # The flags of one strategy: {flag: the strategy that reads it}.
  strategy_flags = {"tpu": "tpu", "tpu_zone": "tpu", "gcp_project": "tpu",
                    "collective": "multi_worker_mirrored"}
  ignored |= {name for name, strategy in strategy_flags.items() if fv.strategy != strategy}
  problems = []
  for name in command_line_flags(argv, fv):
    if name in ignored:
      reads = ", ".join(f"--{n}" for n in _data_flags(source.reads))
      if name in strategy_flags:
        problems.append(f"--{name} is set but --strategy={fv.strategy} does not use it: "
                        f"add --strategy={strategy_flags[name]}, or drop --{name}")
      else:
        problems.append(
            f"--{name}={_value(fv, name)} is set but --data_source={source.kind} does "
            f"not read it (it reads {reads or 'no file flags'}"
            f"{'' if source.is_text else '; its vocabulary is its symbols'}): "
            f"{_fix_for(name)}, or drop --{name}")
  if fv.strategy == "tpu" and not fv.static_shapes:
    problems.append(
        "--strategy=tpu needs --static_shapes: XLA compiles one TPU program per batch "
        "shape, and only static shapes give every core and host of a step the same, "
        "fully known shape (one per bucket); add --static_shapes")
  if fv.packed_length and fv.source_pointer:
    problems.append(
        f"--packed_length={fv.packed_length} packs several pairs into a row, and "
        "--source_pointer reads one source per row: drop one of them")
  if fv.separate_vocabularies and fv.shared_embeddings:
    problems.append(SHARED_EMBEDDINGS_PROBLEM)
  problems += _alignment_flag_problems(argv, fv)
  problems += sources.data_source(data_config(fv)).check_model(
      settings_from_flags(ModelConfig, fv))
  if problems:
    raise flags.ValidationError("; ".join(problems) + ".")
  return warnings


def _alignment_flag_problems(argv, fv) -> list:
  """The guided alignment flags (--guided_alignment_weight, --guided_alignment_layer,
  --guided_alignment_head): typed without --train_alignments they do nothing;
  with it, the guided head must exist."""
  guided = [name for name in command_line_flags(argv, fv)
            if name.startswith("guided_alignment_")]
  if not fv.train_alignments:
    return [f"--{name}={_value(fv, name)} is set but only guided alignment reads it: add "
            f"--train_alignments=FILE (word alignments of the training pairs), or drop "
            f"--{name}" for name in guided]
  return guided_alignment_problems(settings_from_flags(ModelConfig, fv),
                                   settings_from_flags(TrainConfig, fv))


def _fix_for(name: str) -> str:
  for kind, cls in sources.SOURCE_CLASSES.items():
    if name in _data_flags(cls.reads):
      return f"add --data_source={kind} to use it"
  text = [kind for kind, cls in sources.SOURCE_CLASSES.items() if cls.is_text]
  return f"add --data_source={text[0]} (or {', '.join(text[1:])}) to train on text"


# Model flags that only training reads: decoding runs without dropout.
_TRAINING_ONLY_MODEL_FLAGS = ("layer_prepostprocess_dropout", "attention_dropout",
                              "relu_dropout")


def check_inference_flags(argv, saved_model, command: str, reads=(), fv=FLAGS,
                          requested_vocab_size=None) -> list:
  """Checks flags typed for decode/export against the model directory.

  Model flags must agree with the model's config.json (its shape is fixed by training);
  other flags the command does not read are returned for a one-line warning each.

  Args:
    argv: the command line.
    saved_model: the ModelConfig of the model directory.
    command: "decode" or "export", for messages.
    reads: the shared flags (of this module) the command reads besides its decoding
      flags (`decoding_flags(command)`) and --model_dir; flags the command defines
      itself are always read.
    fv: the FlagValues.
    requested_vocab_size: the --vocab_size training was given (config.json's data
      section); the model's own size may be smaller (SentencePiece stops early on a
      small corpus), and either is accepted.

  Returns:
    Warnings for flags that are set but unused.

  Raises:
    flags.ValidationError: naming each model flag that disagrees with config.json.
  """
  used = set(decoding_flags(command)) | {"model_dir"} | set(reads)
  problems, warnings = [], []
  for name in command_line_flags(argv, fv):
    if name in _TRAINING_ONLY_MODEL_FLAGS:
      warnings.append(f"--{name} is not used by {command} (no dropout when decoding): "
                      "ignored.")
    elif name in _MODEL_FLAGS:
      saved = getattr(saved_model, name)
      if name == "vocab_size" and fv[name].value == requested_vocab_size:
        continue
      if (dtype_name(fv[name].value) if name == "dtype" else fv[name].value) != saved:
        fix = " (use --decode_dtype to decode in another precision)" if name == "dtype" else ""
        problems.append(f"--{name}={_value(fv, name)} but the model in --model_dir was "
                        f"trained with {str(saved).lower() if isinstance(saved, bool) else saved}"
                        f"{fix}")
    elif name not in used and fv.find_module_defining_flag(name) == __name__:
      warnings.append(f"--{name} is not used by {command} (the model directory's "
                      "config.json and the decoding flags decide): ignored.")
  if problems:
    raise flags.ValidationError(
        "; ".join(problems) + f". {command} builds the model config.json describes; drop "
        "the model flags from the command line (a recipe may keep them).")
  return warnings

