"""Every absl flag of t2t_keras, grouped, with validators; FLAGS -> frozen dataclasses.

Entry points (train, decode, export, evaluate) call `define_*` for the groups they use
and then turn FLAGS into configs with the `*_config` functions below: library code
never reads FLAGS. Names follow tensor2tensor's hparams so its users recognise them.

Presets are flagfiles under flags/ (`--flagfile=flags/base_en_de.cfg`); a flagfile can
include another, and later flags override earlier ones. Relative paths in flagfiles
resolve from the current directory: run the commands from the repository root.
"""

from __future__ import annotations

import functools
import itertools

from absl import flags

from t2t_keras.configs import DataConfig, DecodeConfig, ModelConfig, TrainConfig

FLAGS = flags.FLAGS


class _Definer:
  """absl's DEFINE_* and validators bound to one FlagValues (tests use fresh ones)."""

  def __init__(self, flag_values):
    self.flag_values = flag_values

  def __getattr__(self, name):
    return functools.partial(getattr(flags, name), flag_values=self.flag_values)


def _once(first_flag):
  """Lets several entry points define the same group without duplicate errors."""
  def wrapper(fn):
    @functools.wraps(fn)
    def define(flag_values=FLAGS):
      if first_flag not in flag_values:
        fn(_Definer(flag_values))
    return define
  return wrapper


@_once("vocab_size")
def define_model_flags(f):
  """Architecture flags (paper section 3 and Table 3)."""
  d = ModelConfig()
  f.DEFINE_integer("vocab_size", d.vocab_size,
                       "Shared source/target subword vocabulary size (paper EN-DE ~37000).")
  f.DEFINE_integer("hidden_size", d.hidden_size, "d_model.")
  f.DEFINE_integer("filter_size", d.filter_size, "d_ff, feed-forward inner size.")
  f.DEFINE_integer("num_heads", d.num_heads, "h, attention heads.")
  f.DEFINE_integer("num_hidden_layers", d.num_hidden_layers,
                       "N, layers in each stack.")
  f.DEFINE_integer("num_encoder_layers", 0, "Encoder layers; 0 = num_hidden_layers.")
  f.DEFINE_integer("num_decoder_layers", 0, "Decoder layers; 0 = num_hidden_layers.")
  f.DEFINE_integer("key_size", 0,
                       "d_k per head (Table 3 A, B); 0 = hidden_size / num_heads.")
  f.DEFINE_integer("value_size", 0,
                       "d_v per head (Table 3 A); 0 = hidden_size / num_heads.")
  f.DEFINE_float("layer_prepostprocess_dropout", d.layer_prepostprocess_dropout,
                     "P_drop: residual and embedding dropout (paper 0.1, big EN-DE 0.3).")
  f.DEFINE_float("attention_dropout", d.attention_dropout,
                     "Dropout on attention probabilities.")
  f.DEFINE_float("relu_dropout", d.relu_dropout, "Dropout after the FFN ReLU.")
  f.DEFINE_enum("position_embedding", d.position_embedding, ["sinusoid", "learned"],
                    "Sinusoidal (paper) or learned (Table 3 row E) positions.")
  f.DEFINE_integer("max_position", d.max_position,
                       "Positions a learned position table covers.")
  f.DEFINE_boolean("pre_norm", d.pre_norm,
                       "LayerNorm before each sublayer (t2t's later default); "
                       "false = post-norm as in the paper.")
  f.DEFINE_float("norm_epsilon", d.norm_epsilon, "LayerNorm epsilon.")
  f.DEFINE_boolean("shared_embeddings", d.shared_embeddings,
                       "One matrix for source/target embeddings and the pre-softmax layer.")
  f.DEFINE_enum("dtype", d.dtype, ["float32", "bfloat16", "mixed_float16"],
                    "Compute precision; variables, logits and loss stay float32.")
  for name in ("vocab_size", "hidden_size", "filter_size", "num_heads",
               "num_hidden_layers", "max_position"):
    f.register_validator(name, lambda v: v > 0, message=f"--{name} must be positive.")
  for name in ("num_encoder_layers", "num_decoder_layers", "key_size", "value_size"):
    f.register_validator(name, lambda v: v >= 0,
                             message=f"--{name} must be >= 0 (0 = default).")
  for name in ("layer_prepostprocess_dropout", "attention_dropout", "relu_dropout"):
    f.register_validator(name, lambda v: 0.0 <= v < 1.0,
                             message=f"--{name} must be in [0, 1).")

  @f.multi_flags_validator(["hidden_size", "num_heads", "key_size", "value_size"])
  def _heads_divide(v):
    if v["key_size"] and v["value_size"]:
      return True
    if v["num_heads"] > 0 and v["hidden_size"] % v["num_heads"]:
      raise flags.ValidationError(
          f"--hidden_size={v['hidden_size']} is not divisible by --num_heads="
          f"{v['num_heads']}: choose sizes that divide, or set --key_size and "
          "--value_size (d_k, d_v per head) explicitly.")
    return True


@_once("data_source")
def define_data_flags(f):
  """Where the sentence pairs come from and how they are batched."""
  d = DataConfig()
  f.DEFINE_enum("data_source", d.source, ["files", "tfds", "synthetic", "parsing"],
                    "files: --train_src/--train_tgt; tfds: --tfds_name; synthetic: an "
                    "offline algorithmic task (--synthetic_task); parsing: .mrg trees.")
  f.DEFINE_string("train_src", None, "Training source file, one sentence per line "
                  "(--data_source=parsing: a .mrg file of bracketed trees).")
  f.DEFINE_string("train_tgt", None, "Training target file, line-aligned with source.")
  f.DEFINE_string("dev_src", None, "Dev source file (evaluation during training; "
                  "parsing: a .mrg file).")
  f.DEFINE_string("dev_tgt", None, "Dev target file.")
  f.DEFINE_string("tfds_name", d.tfds_name, "tensorflow-datasets name.")
  f.DEFINE_string("tfds_data_dir", None, "tensorflow-datasets data directory.")
  f.DEFINE_string("source_lang", d.source_lang, "Source language (TFDS direction).")
  f.DEFINE_string("target_lang", d.target_lang, "Target language (TFDS direction).")
  f.DEFINE_enum("synthetic_task", d.synthetic_task, ["copy", "reverse"],
                    "Offline algorithmic task.")
  f.DEFINE_integer("synthetic_min_length", d.synthetic_min_length,
                       "Shortest synthetic sequence.")
  f.DEFINE_integer("synthetic_max_length", d.synthetic_max_length,
                       "Longest synthetic sequence.")
  f.DEFINE_integer("synthetic_vocab_size", d.synthetic_vocab_size,
                       "Distinct symbols of the synthetic task.")
  f.DEFINE_integer("synthetic_train_size", d.synthetic_train_size,
                   "Synthetic training examples (generated once, then repeated).")
  f.DEFINE_integer("synthetic_eval_size", d.synthetic_eval_size,
                   "Held-out synthetic examples (a different seed from training).")
  f.DEFINE_string("data_dir", None,
                      "Where the vocabulary and tokenized caches live (default: model_dir).")
  f.DEFINE_enum("vocab_type", d.vocab_type, ["bpe", "unigram"],
                "SentencePiece model: bpe (paper EN-DE) or unigram (the word-piece-like "
                "EN-FR choice).")
  f.DEFINE_string("vocab_file", None,
                  "SentencePiece model to use (built there if missing); default: a name "
                  "derived from the data inside --data_dir.")
  f.DEFINE_integer("vocab_sample_sentences", d.vocab_sample_sentences,
                       "Sentences sampled from the training data to build the vocabulary.")
  f.DEFINE_integer("max_length", d.max_length,
                       "Pairs with more subword tokens on either side are dropped (counted).")
  f.DEFINE_integer("batch_size", d.batch_size,
                       "Token budget per replica per batch (t2t semantics).")
  f.DEFINE_boolean("static_shapes", d.static_shapes,
                       "Pad every batch to its bucket boundary with a fixed batch size "
                       "per bucket (TPU / XLA).")
  f.DEFINE_integer("shuffle_buffer", None, "Deprecated and ignored: training shuffles "
                       "the whole corpus (t2t_keras.data.plan). Kept so that old "
                       "flagfiles run; setting it logs a warning.")
  f.DEFINE_boolean("skip_invalid_utf8", d.skip_invalid_utf8,
                       "Skip and count lines with invalid UTF-8 instead of failing.")
  for name in ("max_length", "batch_size", "synthetic_vocab_size", "synthetic_max_length",
               "vocab_sample_sentences"):
    f.register_validator(name, lambda v: v > 0, message=f"--{name} must be positive.")

  @f.multi_flags_validator(["data_source", "train_src", "train_tgt"])
  def _files_given(v):
    if v["data_source"] in ("files", "parsing") and not v["train_src"]:
      raise flags.ValidationError(
          f"--data_source={v['data_source']} needs --train_src (and --train_tgt for "
          "files): name the training files, or use --data_source=synthetic.")
    if v["data_source"] == "files" and not v["train_tgt"]:
      raise flags.ValidationError("--data_source=files needs --train_tgt.")
    return True

  @f.multi_flags_validator(["data_source", "dev_src", "dev_tgt"])
  def _dev_pair(v):
    if v["data_source"] != "parsing" and bool(v["dev_src"]) != bool(v["dev_tgt"]):
      raise flags.ValidationError("--dev_src and --dev_tgt go together: give both or "
                                  "neither.")
    return True

  @f.multi_flags_validator(["batch_size", "max_length"])
  def _batch_fits(v):
    if v["batch_size"] < v["max_length"]:
      raise flags.ValidationError(
          f"--batch_size={v['batch_size']} tokens cannot hold one sentence of "
          f"--max_length={v['max_length']}; raise --batch_size or lower --max_length.")
    return True


@_once("model_dir")
def define_train_flags(f):
  """Optimisation, distribution and checkpointing."""
  d = TrainConfig()
  f.DEFINE_string("model_dir", None, "Checkpoints, summaries, vocabulary, flags.")
  f.DEFINE_integer("train_steps", d.train_steps, "Total optimizer updates.")
  f.DEFINE_float("train_minutes", d.train_minutes,
                 "Training-time budget of this run in minutes (dev evaluation not "
                 "counted): training stops with a checkpoint at --train_steps or when the "
                 "budget is spent, whichever comes first; 0 = no budget.")
  f.DEFINE_integer("eval_bleu_sentences", 0,
                   "At each dev evaluation, also decode the first N dev sentences with the "
                   "decode flags and log sacreBLEU (files data source; 0 = off).")
  f.DEFINE_enum("learning_rate_schedule", d.learning_rate_schedule, ["paper", "t2t"],
                    "paper: d^-0.5 min(s^-0.5, s w^-1.5); t2t: constant * "
                    "min(1, s/w) * rsqrt(max(s, w)) * d^-0.5.")
  f.DEFINE_float("learning_rate", d.learning_rate,
                     "Multiplier of the schedule (paper 1.0, t2t 2.0).")
  f.DEFINE_integer("learning_rate_warmup_steps", d.learning_rate_warmup_steps,
                       "Warm-up steps (paper 4000, t2t 8000).")
  f.DEFINE_float("adam_beta1", d.adam_beta1, "Adam beta1.")
  f.DEFINE_float("adam_beta2", d.adam_beta2, "Adam beta2 (paper 0.98, t2t 0.997).")
  f.DEFINE_float("adam_epsilon", d.adam_epsilon, "Adam epsilon.")
  f.DEFINE_float("label_smoothing", d.label_smoothing, "eps_ls.")
  f.DEFINE_enum("strategy", d.strategy,
                    ["default", "mirrored", "multi_worker_mirrored", "tpu"],
                    "tf.distribute strategy.")
  f.DEFINE_string("tpu", None, "Cloud TPU name or address (--strategy=tpu).")
  f.DEFINE_integer("num_logical_devices", 0,
                       "Split the CPU into N logical devices (testing distribution).")
  f.DEFINE_boolean("jit_compile", d.jit_compile, "Compile train steps with XLA.")
  f.DEFINE_integer("steps_per_loop", d.steps_per_loop,
                       "Train steps per host call (TPU).")
  f.DEFINE_integer("accum_steps", d.accum_steps,
                       "Micro-batches accumulated per update.")
  f.DEFINE_integer("seed", d.seed, "Random seed for initialisation and shuffling.")
  f.DEFINE_boolean("deterministic", d.deterministic,
                       "Deterministic ops (bitwise reproducible resume).")
  f.DEFINE_integer("log_every", d.log_every, "Steps between progress lines.")
  f.DEFINE_integer("eval_every", d.eval_every, "Steps between dev evaluations.")
  f.DEFINE_integer("eval_steps", d.eval_steps, "Dev batches per evaluation; 0 = all.")
  f.DEFINE_integer("save_checkpoint_steps", d.save_checkpoint_steps,
                       "Steps between checkpoints.")
  f.DEFINE_float("save_checkpoint_minutes", d.save_checkpoint_minutes,
                     "Minutes between checkpoints (paper: 10).")
  f.DEFINE_boolean("export", False,
                   "After training, export a SavedModel for TensorFlow Serving to "
                   "--export_dir (decoding settings from the decode flags).")
  f.DEFINE_string("export_dir", None, "Where exports go (default <model_dir>/export); "
                  "each export is a numbered version below it.")
  f.DEFINE_boolean("dry_run", False,
                   "Build the model from the flags, print its summary and parameter "
                   "count, and exit (no data needed).")
  f.DEFINE_integer("show_examples", 5,
                   "After training, decode the dev set with beam search, print this "
                   "many examples and the exact-match accuracy (0 = skip).")
  f.DEFINE_boolean("keep_best_checkpoint", d.keep_best_checkpoint,
                   "After each dev evaluation keep the best checkpoint so far (by dev BLEU "
                   "with --eval_bleu_sentences > 0, else dev loss) in <model_dir>/best, "
                   "outside the --keep_checkpoint_max rotation; decode or export it with "
                   "--checkpoint_path=<model_dir>/best.")
  f.DEFINE_integer("early_stopping_patience", d.early_stopping_patience,
                   "Stop training after this many dev evaluations (--eval_every) without "
                   "improvement of dev BLEU (or dev loss), with a final checkpoint; 0 = "
                   "never.", lower_bound=0)
  f.DEFINE_integer("keep_checkpoint_max", d.keep_checkpoint_max,
                       "Checkpoints kept (paper averages the last 5 or 20).")
  for name in ("train_steps", "learning_rate_warmup_steps", "steps_per_loop", "accum_steps",
               "log_every", "eval_every", "save_checkpoint_steps", "keep_checkpoint_max"):
    f.register_validator(name, lambda v: v > 0, message=f"--{name} must be positive.")
  f.register_validator("train_minutes", lambda v: v >= 0,
                       message="--train_minutes must be >= 0 (0 = no budget).")
  f.register_validator("eval_bleu_sentences", lambda v: v >= 0,
                       message="--eval_bleu_sentences must be >= 0 (0 = off).")
  f.register_validator("label_smoothing", lambda v: 0.0 <= v < 1.0,
                           message="--label_smoothing must be in [0, 1).")

  @f.multi_flags_validator(["strategy", "tpu"])
  def _tpu_named(v):
    if v["strategy"] == "tpu" and v["tpu"] is None:
      raise flags.ValidationError("--strategy=tpu needs --tpu (a Cloud TPU name, "
                                  "'local' on a TPU VM, or grpc://host:port).")
    return True


@_once("beam_size")
def define_decode_flags(f):
  """Beam search (paper: beam 4, alpha 0.6, input length + 50)."""
  d = DecodeConfig()
  f.DEFINE_integer("beam_size", d.beam_size, "Beam size; 1 = greedy.")
  f.DEFINE_float("alpha", d.alpha, "GNMT length penalty exponent.")
  f.DEFINE_integer("extra_decode_length", d.extra_decode_length,
                       "Maximum output length = input length + this.")
  f.DEFINE_integer("min_decode_length", d.min_decode_length,
                   "Outputs have at least this many tokens before EOS: 1 never returns an "
                   "empty translation (as CTranslate2's beam search); 0 (tensor2tensor) "
                   "returns one when ending at once scores best.", lower_bound=0)
  f.DEFINE_boolean("return_beams", d.return_beams, "Output every beam with its score.")
  f.DEFINE_integer("decode_batch_size", d.batch_size, "Sentences per decoding batch.")
  f.DEFINE_boolean("decode_jit_compile", d.jit_compile,
                   "Decode with XLA (Transformer base in bench/decode_speed.py: 2-3x "
                   "faster on CPU; the small Multi30k model: 1.25x). Batches are padded to --decode_batch_size rows and "
                   "a power-of-two source width (16, 32, 64, ...), and each width "
                   "compiles once (tens of seconds for a base model), so it pays off "
                   "from a few hundred sentences. Same translations as without.")
  f.DEFINE_integer("max_input_length", 256,
                   "Sources longer than this many subwords (EOS included) are truncated "
                   "when decoding and in exports: bounds the memory of a batch.")
  f.DEFINE_string("checkpoint_path", None,
                  "Decode/export this checkpoint (a prefix such as <model_dir>/ckpt-5000, "
                  "or a directory of checkpoints such as <model_dir>/best) instead of the "
                  "latest. Typed on the command line, it overrides a flagfile's "
                  "--average_last_n.")
  f.DEFINE_integer("average_last_n", 0,
                   "Decode/export the average of the last N checkpoints' weights (paper "
                   "section 6.1: 5 for base, 20 for big); 0 or 1 = the latest only.")
  f.DEFINE_string("decode_dtype", None,
                  "Override the model's dtype for decoding (e.g. float32).")
  f.register_validator("average_last_n", lambda v: v >= 0,
                       message="--average_last_n must be >= 0.")
  f.register_validator("max_input_length", lambda v: v >= 2,
                       message="--max_input_length must be >= 2 (a token and EOS).")
  f.register_validator("beam_size", lambda v: v > 0, message="--beam_size must be > 0.")
  f.register_validator("alpha", lambda v: v >= 0, message="--alpha must be >= 0.")


def define_all(flag_values=FLAGS):
  define_model_flags(flag_values)
  define_data_flags(flag_values)
  define_train_flags(flag_values)
  define_decode_flags(flag_values)


def model_config(vocab_size=None, fv=FLAGS) -> ModelConfig:
  """ModelConfig from FLAGS (vocab_size from the built vocabulary when given)."""
  return ModelConfig(
      vocab_size=vocab_size or fv.vocab_size, hidden_size=fv.hidden_size,
      filter_size=fv.filter_size, num_heads=fv.num_heads,
      num_hidden_layers=fv.num_hidden_layers,
      num_encoder_layers=fv.num_encoder_layers,
      num_decoder_layers=fv.num_decoder_layers, key_size=fv.key_size,
      value_size=fv.value_size,
      layer_prepostprocess_dropout=fv.layer_prepostprocess_dropout,
      attention_dropout=fv.attention_dropout, relu_dropout=fv.relu_dropout,
      position_embedding=fv.position_embedding, max_position=fv.max_position,
      pre_norm=fv.pre_norm, norm_epsilon=fv.norm_epsilon,
      shared_embeddings=fv.shared_embeddings, dtype=fv.dtype).validate()


def data_config(fv=FLAGS) -> DataConfig:
  return DataConfig(
      source=fv.data_source, train_src=fv.train_src, train_tgt=fv.train_tgt,
      dev_src=fv.dev_src, dev_tgt=fv.dev_tgt, tfds_name=fv.tfds_name,
      tfds_data_dir=fv.tfds_data_dir, source_lang=fv.source_lang,
      target_lang=fv.target_lang, synthetic_task=fv.synthetic_task,
      synthetic_min_length=fv.synthetic_min_length,
      synthetic_max_length=fv.synthetic_max_length,
      synthetic_vocab_size=fv.synthetic_vocab_size,
      data_dir=fv.data_dir or (fv.model_dir if "model_dir" in fv else None),
      synthetic_train_size=fv.synthetic_train_size,
      synthetic_eval_size=fv.synthetic_eval_size, vocab_file=fv.vocab_file,
      vocab_type=fv.vocab_type, vocab_size=fv.vocab_size,
      vocab_sample_sentences=fv.vocab_sample_sentences, max_length=fv.max_length,
      batch_size=fv.batch_size, static_shapes=fv.static_shapes,
      seed=fv.seed if "seed" in fv else 1,
      skip_invalid_utf8=fv.skip_invalid_utf8,
      accum_steps=fv.accum_steps if "accum_steps" in fv else 1)


def train_config(fv=FLAGS) -> TrainConfig:
  return TrainConfig(
      model_dir=fv.model_dir, train_steps=fv.train_steps, train_minutes=fv.train_minutes,
      learning_rate_schedule=fv.learning_rate_schedule,
      learning_rate=fv.learning_rate,
      learning_rate_warmup_steps=fv.learning_rate_warmup_steps,
      adam_beta1=fv.adam_beta1, adam_beta2=fv.adam_beta2,
      adam_epsilon=fv.adam_epsilon, label_smoothing=fv.label_smoothing,
      strategy=fv.strategy, tpu=fv.tpu,
      num_logical_devices=fv.num_logical_devices, jit_compile=fv.jit_compile,
      steps_per_loop=fv.steps_per_loop, accum_steps=fv.accum_steps, seed=fv.seed,
      deterministic=fv.deterministic, log_every=fv.log_every,
      eval_every=fv.eval_every, eval_steps=fv.eval_steps,
      save_checkpoint_steps=fv.save_checkpoint_steps,
      save_checkpoint_minutes=fv.save_checkpoint_minutes,
      keep_checkpoint_max=fv.keep_checkpoint_max,
      keep_best_checkpoint=fv.keep_best_checkpoint,
      early_stopping_patience=fv.early_stopping_patience)


def decode_config(fv=FLAGS) -> DecodeConfig:
  return DecodeConfig(beam_size=fv.beam_size, alpha=fv.alpha,
                      extra_decode_length=fv.extra_decode_length,
                      min_decode_length=fv.min_decode_length,
                      return_beams=fv.return_beams, batch_size=fv.decode_batch_size,
                      jit_compile=fv.decode_jit_compile)


def model_dirs(fv=FLAGS) -> list:
  """The model directories of --model_dir (a comma-separated list for ensembles)."""
  dirs = [d.strip() for d in (fv.model_dir or "").split(",")]
  if not all(dirs):
    raise flags.ValidationError(f"--model_dir={fv.model_dir} has an empty entry: give "
                                "one directory, or several separated by commas.")
  return dirs


def checkpoint_choice(argv, fv=FLAGS) -> tuple:
  """(checkpoint_path, average_last_n) for decode, score and export.

  A recipe's flagfile may set --average_last_n (the paper's 5 or 20); a
  --checkpoint_path typed on the command line then wins over it (both typed on the
  command line is refused by `inference.load`).
  """
  average = fv.average_last_n
  if fv.checkpoint_path and "average_last_n" not in command_line_flags(argv, fv):
    average = 0
  return fv.checkpoint_path, average


# ------------------------------------------------------------ flags a run does not use
_MODEL_FLAGS = ("vocab_size", "hidden_size", "filter_size", "num_heads", "num_hidden_layers",
                "num_encoder_layers", "num_decoder_layers", "key_size", "value_size",
                "layer_prepostprocess_dropout", "attention_dropout", "relu_dropout",
                "position_embedding", "max_position", "pre_norm", "norm_epsilon",
                "shared_embeddings", "dtype")
_DECODE_FLAGS = ("beam_size", "alpha", "extra_decode_length", "min_decode_length",
                 "return_beams",
                 "decode_batch_size", "decode_jit_compile", "max_input_length",
                 "checkpoint_path", "average_last_n", "decode_dtype")
# Data flags each --data_source reads (the others are ignored by it).
_SOURCE_FLAGS = {
    "files": ("train_src", "train_tgt", "dev_src", "dev_tgt"),
    "parsing": ("train_src", "dev_src"),
    "tfds": ("tfds_name", "tfds_data_dir", "source_lang", "target_lang"),
    "synthetic": ("synthetic_task", "synthetic_min_length", "synthetic_max_length",
                  "synthetic_vocab_size", "synthetic_train_size", "synthetic_eval_size"),
}
_TEXT_ONLY_FLAGS = ("vocab_size", "vocab_type", "vocab_file", "vocab_sample_sentences",
                    "data_dir", "skip_invalid_utf8")


def command_line_flags(argv, fv=FLAGS) -> list:
  """Names of the flags typed on the command line itself, not read from a flagfile.

  Flagfile values may pass silently when a command does not use them (one recipe
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
    Warnings to log, one line each (deprecated flags).

  Raises:
    flags.ValidationError: naming each such flag, why it is unused and what to do.
  """
  warnings = []
  if "shuffle_buffer" in fv and fv.shuffle_buffer is not None:
    warnings.append("--shuffle_buffer is ignored: training shuffles the whole corpus "
                    "every epoch (no buffer); drop the flag")
  if "dry_run" in fv and fv.dry_run:
    return warnings  # builds the model from the model flags (including --vocab_size) only
  source = fv.data_source
  ignored = set(itertools.chain.from_iterable(
      names for kind, names in _SOURCE_FLAGS.items() if kind != source))
  ignored -= set(_SOURCE_FLAGS.get(source, ()))
  if source == "synthetic":
    ignored |= set(_TEXT_ONLY_FLAGS)
  if fv.strategy != "tpu":
    ignored.add("tpu")
  problems = []
  for name in command_line_flags(argv, fv):
    if name in ignored:
      reads = ", ".join(f"--{n}" for n in _SOURCE_FLAGS.get(source, ()))
      if name == "tpu":
        problems.append(f"--tpu is set but --strategy={fv.strategy} does not use it: "
                        "add --strategy=tpu, or drop --tpu")
      else:
        problems.append(
            f"--{name}={_value(fv, name)} is set but --data_source={source} does not "
            f"read it (it reads {reads or 'no file flags'}"
            f"{'; its vocabulary is its symbols' if source == 'synthetic' else ''}): "
            f"{_fix_for(name)}, or drop --{name}")
  if problems:
    raise flags.ValidationError("; ".join(problems) + ".")
  return warnings


def _fix_for(name: str) -> str:
  for kind, names in _SOURCE_FLAGS.items():
    if name in names:
      return f"add --data_source={kind} to use it"
  return "add --data_source=files (or tfds) to train on text"


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
    reads: the shared flags (of this module) the command reads besides the decoding
      flags and --model_dir; flags the command defines itself are always read.
    fv: the FlagValues.
    requested_vocab_size: the --vocab_size training was given (config.json's data
      section); the model's own size may be smaller (SentencePiece stops early on a
      small corpus), and either is accepted.

  Returns:
    Warnings for flags that are set but unused.

  Raises:
    flags.ValidationError: naming each model flag that disagrees with config.json.
  """
  used = set(_DECODE_FLAGS) | {"model_dir"} | set(reads)
  problems, warnings = [], []
  for name in command_line_flags(argv, fv):
    if name in _TRAINING_ONLY_MODEL_FLAGS:
      warnings.append(f"--{name} is not used by {command} (no dropout when decoding): "
                      "ignored.")
    elif name in _MODEL_FLAGS:
      saved = getattr(saved_model, name)
      if name == "vocab_size" and fv[name].value == requested_vocab_size:
        continue
      if fv[name].value != saved:
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
        "the model flags from the command line (a recipe flagfile may keep them).")
  return warnings

