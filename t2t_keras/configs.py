"""Frozen dataclasses that carry every setting from the entry points to the library.

Only entry points read the absl flags; they build these objects once (see flags.py) and
pass them down, so library code, tests and notebooks can construct them directly.
Names follow tensor2tensor / Model Garden where those exist (hidden_size, filter_size,
num_heads, num_hidden_layers, attention_dropout, relu_dropout, label_smoothing, ...).

Each setting is written once, here: its default, its help text, the values its flag
accepts and its check sit beside the field (`setting`). flags.py generates the flags
from these fields and builds the configs back from the flags.

Validation has one home per config: each class's `validate()` runs the fields' checks
and the checks that span its fields (hidden_size and num_heads, batch_size and
max_length, strategy and tpu, ...) and raises `errors.ConfigError` naming the flags.
The flags layer calls it once (as flag validators, so a bad command line fails while
it is parsed), and library entry points call it for configs built in code
(`create_model`, `make_datasets`, `Trainer`). The settings of one data source (which
files, which TFDS name, the synthetic task) are that source's to check:
`t2t_keras.data.sources.sources` (each source validates them when it is made). Checks that
span configs (a TPU needs static shapes) are the train command's (flags.py).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, List, Optional, Tuple

from t2t_keras.errors import ConfigError

Check = Tuple[Callable[[Any], bool], str]
POSITIVE: Check = (lambda v: v > 0, "must be positive")
AT_LEAST_0: Check = (lambda v: v >= 0, "must be >= 0")
ZERO_MEANS_DEFAULT: Check = (lambda v: v >= 0, "must be >= 0 (0 = default)")
DROPOUT: Check = (lambda v: 0.0 <= v < 1.0, "must be in [0, 1)")


def setting(default, help: Optional[str] = None, *, flag: Optional[str] = None,  # pylint: disable=redefined-builtin
            choices: Optional[Tuple[str, ...]] = None, check: Optional[Check] = None,
            only: Optional[str] = None):
  """A config field with what its command-line flag needs.

  Args:
    default: the field's default, also the flag's.
    help: the flag's help text; None = the field has no flag of its own (it may still
      read one defined elsewhere, see `flag`).
    flag: the flag's name when it differs from the field's (e.g. `decode_batch_size`
      for DecodeConfig.batch_size), or the shared flag a field without help reads.
    choices: the values the flag accepts (an enum flag).
    check: (predicate, "must be ...") that the value must pass, for the flag's
      validator and for `validate()`.
    only: the one command that reads the field (e.g. "decode" for the sampling
      flags), which defines its flag itself; None: every command that defines the
      config's group reads it.
  """
  return dataclasses.field(default=default, metadata={
      "help": help, "flag": flag, "choices": choices, "check": check, "only": only})


def split_list(value: Optional[str]) -> List[str]:
  """A comma-separated flag value: "a,b" -> ["a", "b"] (blanks around commas dropped);
  None or "" -> []."""
  return [part.strip() for part in value.split(",")] if value else []


def dtype_name(dtype: Optional[str]) -> Optional[str]:
  """--dtype's one name for a precision: "mixed_bfloat16" (Keras' policy name, which
  t2t's TPU users know) is "bfloat16", so that config.json, the restart check and
  decode's check of the model flags see one value whichever name a command used."""
  return "bfloat16" if dtype == "mixed_bfloat16" else dtype


def flag_name(field: dataclasses.Field) -> str:
  """The flag a config field is read from."""
  return field.metadata.get("flag") or field.name


def check_fields(config) -> List[str]:
  """The fields of `config` that fail their check, as "--<flag>=<value> must be ..."."""
  problems = []
  for field in dataclasses.fields(config):
    check, value = field.metadata.get("check"), getattr(config, field.name)
    if check and value is not None and not check[0](value):
      problems.append(f"--{flag_name(field)}={value} {check[1]}")
  return problems


def raise_problems(problems: List[str], what: str) -> None:
  """Raises ConfigError("Invalid <what>: <problem>; <problem>.") when there are any."""
  if problems:
    raise ConfigError(f"Invalid {what}: " + "; ".join(problems) + ".")


SHARED_EMBEDDINGS_PROBLEM = (
    "--shared_embeddings cannot be used with --separate_vocabularies: one matrix for the "
    "source embeddings, target embeddings and softmax needs one vocabulary for both "
    "sides (the paper's sharing, section 3.4); pass --noshared_embeddings")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of the Transformer (paper section 3, Table 3)."""

  vocab_size: int = setting(
      37000, "Shared source/target subword vocabulary size (paper EN-DE ~37000); with "
      "--separate_vocabularies the source's.", check=POSITIVE)
  # The target vocabulary's size when it is not the source's (--separate_vocabularies):
  # set by training from the built target vocabulary; 0 = one shared vocabulary.
  target_vocab_size: int = setting(0, check=AT_LEAST_0)
  hidden_size: int = setting(512, "d_model.", check=POSITIVE)
  filter_size: int = setting(2048, "d_ff, feed-forward inner size.", check=POSITIVE)
  num_heads: int = setting(8, "h, attention heads.", check=POSITIVE)
  num_hidden_layers: int = setting(6, "N, layers in each stack.", check=POSITIVE)
  num_encoder_layers: int = setting(0, "Encoder layers; 0 = num_hidden_layers.",
                                    check=ZERO_MEANS_DEFAULT)
  num_decoder_layers: int = setting(0, "Decoder layers; 0 = num_hidden_layers.",
                                    check=ZERO_MEANS_DEFAULT)
  key_size: int = setting(0, "d_k per head (Table 3 A, B); 0 = hidden_size / num_heads.",
                          check=ZERO_MEANS_DEFAULT)
  value_size: int = setting(0, "d_v per head (Table 3 A); 0 = hidden_size / num_heads.",
                            check=ZERO_MEANS_DEFAULT)
  layer_prepostprocess_dropout: float = setting(
      0.1, "P_drop: residual and embedding dropout (paper 0.1, big EN-DE 0.3).",
      check=DROPOUT)
  attention_dropout: float = setting(0.0, "Dropout on attention probabilities.",
                                     check=DROPOUT)
  relu_dropout: float = setting(0.0, "Dropout after the FFN ReLU.", check=DROPOUT)
  position_embedding: str = setting(
      "sinusoid", "Sinusoidal (paper) or learned (Table 3 row E) positions added to "
      "the embeddings, or relative positions in self-attention instead (Shaw et al. "
      "2018, t2t's transformer_relative; --max_relative_position).",
      choices=("sinusoid", "learned", "relative"))
  max_position: int = setting(
      1024, "Positions a learned position table covers (later positions reuse its "
      "last row).", check=POSITIVE)
  max_relative_position: int = setting(
      20, "--position_embedding=relative: distances key - query are clipped to "
      "[-K, K], K this flag (t2t's default 20); each self-attention layer learns 2K+1 "
      "key and value embeddings.", check=POSITIVE)
  pre_norm: bool = setting(False, "LayerNorm before each sublayer (t2t's later default); "
                           "false = post-norm as in the paper.")
  norm_epsilon: float = setting(1e-6, "LayerNorm epsilon.")
  shared_embeddings: bool = setting(
      True, "One matrix for source/target embeddings and the pre-softmax layer (one "
      "shared vocabulary only: --noshared_embeddings with --separate_vocabularies).")
  shared_decoder_embeddings: bool = setting(
      False, "Without --shared_embeddings: one matrix for the target embeddings and the "
      "pre-softmax layer (the decoder's input and output; as fairseq's "
      "share-decoder-input-output-embed option), the sharing two vocabularies still allow.")
  source_pointer: bool = setting(
      False, "Add to each decoder input the encoder output at the source position the "
      "target has copied up to (a pointer that moves on whenever the target writes the "
      "source token it points at): for targets that copy their source in order between "
      "tokens of their own, e.g. parsing with --parsing_linearization=words; the decoder "
      "then always knows its place.")
  dtype: str = setting("float32", "Compute precision; variables, logits and loss stay "
                       "float32. mixed_bfloat16 (Keras' policy name) is bfloat16.",
                       choices=("float32", "bfloat16", "mixed_bfloat16", "mixed_float16"))

  def __post_init__(self):
    object.__setattr__(self, "dtype", dtype_name(self.dtype))

  @property
  def encoder_layers(self) -> int:
    return self.num_encoder_layers or self.num_hidden_layers

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_hidden_layers

  @property
  def output_vocab_size(self) -> int:
    """The target vocabulary's size: the decoder embedding's and the softmax's rows."""
    return self.target_vocab_size or self.vocab_size

  @property
  def head_key_size(self) -> int:
    return self.key_size or self.hidden_size // self.num_heads

  @property
  def head_value_size(self) -> int:
    return self.value_size or self.hidden_size // self.num_heads

  def validate(self) -> "ModelConfig":
    """Raises ConfigError naming the offending flags and values; returns self."""
    problems = check_fields(self)
    if self.num_heads > 0 and (not self.key_size or not self.value_size):
      if self.hidden_size % self.num_heads:
        problems.append(
            f"--hidden_size={self.hidden_size} is not divisible by --num_heads="
            f"{self.num_heads}: choose sizes that divide, or set --key_size and "
            "--value_size (d_k, d_v per head) explicitly")
    if self.position_embedding not in ("sinusoid", "learned", "relative"):
      problems.append(f"--position_embedding={self.position_embedding!r} must be "
                      "'sinusoid', 'learned' or 'relative'")
    if self.target_vocab_size and self.shared_embeddings:
      problems.append(SHARED_EMBEDDINGS_PROBLEM)
    if self.target_vocab_size and self.source_pointer:
      problems.append("--source_pointer cannot be used with --separate_vocabularies: "
                      "it compares target ids with source ids, which needs one "
                      "vocabulary for both sides")
    if self.dtype not in ("float32", "bfloat16", "mixed_float16"):
      problems.append(f"--dtype={self.dtype!r} must be float32, bfloat16 (or "
                      "mixed_bfloat16) or mixed_float16")
    raise_problems(problems, "model configuration")
    return self


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where sentence pairs come from and how they are batched.

  A few fields have no flag of their own: `vocab_size` reads --vocab_size (a model
  flag), `seed` and `accum_steps` read the training flags (the trainer passes its own
  accum_steps: all batches of one update, on every replica, share a bucket), `data_dir`
  defaults to --model_dir, and the bucket boundaries start at `bucket_min` and grow by
  `bucket_growth`.
  """

  # The kinds, their help and the flags each reads are the sources' own
  # (t2t_keras.data.sources.sources); flags.py makes this flag an enum of them.
  source: str = setting("synthetic", "Where the sentence pairs come from.",
                        flag="data_source")
  train_src: Optional[str] = setting(
      None, "Training source file, one sentence per line (--data_source=parsing: a .mrg "
      "file of bracketed trees); several corpora comma-separated (a.en,b.en), mixed by "
      "--train_weights.")
  train_tgt: Optional[str] = setting(
      None, "Training target file, line-aligned with source; several comma-separated, "
      "one per --train_src file, in the same order.")
  train_weights: Optional[str] = setting(
      None, "Several training corpora (--train_src=a.en,b.en, or --tfds_train_subsets): "
      "one positive weight each, comma-separated (e.g. 1,3); unset = 1 each. Each "
      "corpus's pairs are trained on a whole number of times an epoch, chosen to give it "
      "its share (t2t_keras/data/sources/corpora.py); the training log shows requested and "
      "achieved shares.")
  train_weights_by: str = setting(
      "size", "How --train_weights share an epoch. size: in proportion to weight x pairs "
      "(weights 1,3: the second corpus's pairs are seen 3 times as often); weight: in "
      "proportion to the weight alone, whatever the corpus's size.",
      choices=("size", "weight"))
  target_language_tags: Optional[str] = setting(
      None, "Multilingual models: the language each training corpus translates into, "
      "comma-separated in --train_src's order (e.g. de,en with --train_src=a.en,a.de "
      "--train_tgt=a.de,a.en). Every source starts with its pair's target-language tag "
      "<2xx>, one vocabulary piece; decode with --target_language "
      "(t2t_keras/language_tags.py).")
  dev_target_language: Optional[str] = setting(
      None, "With --target_language_tags: the target language of --dev_src/--dev_tgt "
      "(default: the first corpus's), also the language an export translates into by "
      "default.")
  train_alignments: Optional[str] = setting(
      None, "Guided alignment (Garg et al. 2019; Marian, OpenNMT-tf): word alignments "
      "of the training pairs from an external aligner (eflomal, fast_align), one "
      "Pharaoh line 'i-j ...' per --train_src/--train_tgt pair (0-based whitespace-"
      "separated source word i, target word j). One encoder-decoder attention head "
      "(--guided_alignment_layer, --guided_alignment_head) learns them, weighted by "
      "--guided_alignment_weight; decode --output_alignments then reads that head.")
  dev_src: Optional[str] = setting(
      None, "Dev source file (evaluation during training; parsing: a .mrg file).")
  dev_tgt: Optional[str] = setting(None, "Dev target file.")
  parsing_linearization: str = setting(
      "tags", "--data_source=parsing: the target tree's leaves. tags: POS tags only "
      "(Vinyals et al.); words: each word, copied from the input, then its tag "
      "(the decoder sees where it is; t2t_keras/parsing/trees.py).",
      choices=("tags", "words"))
  tfds_name: str = setting("wmt14_translate/de-en", "tensorflow-datasets name.")
  tfds_data_dir: Optional[str] = setting(None, "tensorflow-datasets data directory.")
  tfds_train_subsets: Optional[str] = setting(
      None, "Train on these training sub-datasets of the WMT --tfds_name, comma-"
      "separated (wmt14_translate/de-en: europarl_v7,commoncrawl,newscommentary_v9), "
      "each prepared as a dataset of its own and mixed by --train_weights; unset = the "
      "whole training split as one corpus.")
  source_lang: str = setting("en", "Source language (TFDS direction).")
  target_lang: str = setting("de", "Target language (TFDS direction).")
  synthetic_task: str = setting("copy", "Offline algorithmic task.",
                                choices=("copy", "reverse"))
  synthetic_min_length: int = setting(1, "Shortest synthetic sequence.")
  synthetic_max_length: int = setting(10, "Longest synthetic sequence.", check=POSITIVE)
  synthetic_vocab_size: int = setting(16, "Distinct symbols of the synthetic task.",
                                      check=POSITIVE)
  synthetic_train_size: int = setting(
      100_000, "Synthetic training examples (generated once, then repeated).")
  synthetic_eval_size: int = setting(
      1_000, "Held-out synthetic examples (a different seed from training).")
  data_dir: Optional[str] = setting(
      None, "Where the vocabulary and tokenized caches live (default: model_dir).")
  vocab_type: str = setting(
      "bpe", "SentencePiece model: bpe (paper EN-DE) or unigram (the word-piece-like "
      "EN-FR choice).", choices=("bpe", "unigram"))
  vocab_file: Optional[str] = setting(
      None, "SentencePiece model to use (built there if missing); default: a name "
      "derived from the data inside --data_dir.")
  vocab_size: int = setting(8000, flag="vocab_size")
  separate_vocabularies: bool = setting(
      False, "Two SentencePiece models, the source's built from the source side and "
      "the target's from the target side (for pairs in different scripts: EN-ZH, EN-RU, "
      "EN-JA), instead of one shared by both; needs --noshared_embeddings. The model "
      "directory keeps both (vocab.source.model, vocab.target.model).")
  target_vocab_size: int = setting(
      0, "With --separate_vocabularies: the target vocabulary's size; 0 = --vocab_size.",
      check=AT_LEAST_0)
  # No flag: the (source, target) files of --separate_vocabularies when they are given
  # rather than named after the data, as --vocab_file is for one shared vocabulary; set
  # by --init_from, whose run trains on its parent's two vocabularies.
  side_vocab_files: Tuple[str, ...] = setting(())
  vocab_sample_sentences: int = setting(
      1_000_000, "Sentences sampled from the training data to build the vocabulary.",
      check=POSITIVE)
  max_length: int = setting(
      256, "Pairs with more subword tokens on either side are dropped (counted).",
      check=POSITIVE)
  batch_size: int = setting(4096, "Token budget per replica per batch (t2t semantics).",
                            check=POSITIVE)
  static_shapes: bool = setting(
      False, "Pad every batch to its bucket boundary with a fixed batch size per bucket "
      "(TPU / XLA).")
  packed_length: int = setting(
      0, "Pack several training pairs into each row of this many tokens a side, with "
      "segment ids and positions per pair (t2t's _packed problems, its TPU default): "
      "one batch shape [batch_size // packed_length, packed_length] for every step, so "
      "one compiled program with --static_shapes, and little padding. At least "
      "--max_length; 0 = no packing.", check=AT_LEAST_0)
  bucket_min: int = setting(
      8, "Shortest bucket length (t2t's min_length_bucket); lengths grow from it by "
      "--length_bucket_step up to --max_length.", flag="min_length_bucket", check=POSITIVE)
  bucket_growth: float = setting(
      1.1, "Factor between consecutive bucket lengths (t2t's length_bucket_step). Larger "
      "means fewer buckets, so fewer compiled programs with --static_shapes (up to 256: "
      "42 buckets at 1.1, 22 at 1.2, 10 at 1.5), and more padding.",
      flag="length_bucket_step", check=(lambda v: v > 1, "must be > 1"))
  seed: int = setting(1, flag="seed")
  skip_invalid_utf8: bool = setting(
      False, "Skip and count lines with invalid UTF-8 instead of failing.")
  accum_steps: int = setting(1, flag="accum_steps")

  def validate(self) -> "DataConfig":
    """Raises ConfigError naming the offending flags and values; returns self.

    The settings of the chosen source are checked by the source
    (`t2t_keras.data.sources.sources.data_source`).
    """
    problems = check_fields(self)
    if self.batch_size < self.max_length:
      problems.append(
          f"--batch_size={self.batch_size} tokens cannot hold one sentence of "
          f"--max_length={self.max_length}; raise --batch_size or lower --max_length")
    if self.packed_length and self.packed_length < self.max_length:
      problems.append(
          f"--packed_length={self.packed_length} is shorter than --max_length="
          f"{self.max_length}: every kept pair must fit one packed row; raise "
          "--packed_length or lower --max_length (longer pairs are dropped and counted)")
    if self.packed_length and self.batch_size < self.packed_length:
      problems.append(
          f"--batch_size={self.batch_size} tokens cannot hold one packed row of "
          f"--packed_length={self.packed_length}; raise --batch_size or lower "
          "--packed_length")
    if self.train_alignments and self.packed_length:
      problems.append(
          f"--train_alignments={self.train_alignments} cannot be used with "
          f"--packed_length={self.packed_length} yet: packed rows do not carry the "
          "alignment matrices; drop --packed_length (bucketed batches, with or without "
          "--static_shapes, carry them)")
    if self.train_alignments and self.skip_invalid_utf8:
      problems.append(
          f"--train_alignments={self.train_alignments} cannot be used with "
          "--skip_invalid_utf8: skipped pairs would shift every later alignment line; "
          "fix the files' encoding (or drop those pairs and their alignment lines)")
    if self.separate_vocabularies and self.vocab_file:
      problems.append(
          f"--vocab_file={self.vocab_file} names one vocabulary but "
          "--separate_vocabularies builds two (into --data_dir); drop one of them")
    if self.target_vocab_size and not self.separate_vocabularies:
      problems.append(
          f"--target_vocab_size={self.target_vocab_size} sizes the target's own "
          "vocabulary: add --separate_vocabularies, or drop it (one shared vocabulary "
          "of --vocab_size)")
    raise_problems(problems, "data settings")
    return self


# A tf.data service dispatcher, as --data_service names it (the protocol is optional).
DATA_SERVICE_ADDRESS = re.compile(r"^(grpc://)?([^:/\s,]+):(\d+)$")

_STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "tpu")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How the model is optimised, distributed and checkpointed."""

  model_dir: str = setting("/tmp/t2t_keras", flag="model_dir")
  train_steps: int = setting(100_000, "Total optimizer updates.", check=POSITIVE)
  train_minutes: float = setting(
      0.0, "Training-time budget of this run in minutes (dev evaluation not counted): "
      "training stops with a checkpoint at --train_steps or when the budget is spent, "
      "whichever comes first; 0 = no budget.", check=(lambda v: v >= 0,
                                                       "must be >= 0 (0 = no budget)"))
  learning_rate_schedule: str = setting(
      "paper", "paper: d^-0.5 min(s^-0.5, s w^-1.5); t2t: constant * min(1, s/w) * "
      "rsqrt(max(s, w)) * d^-0.5.", choices=("paper", "t2t"))
  learning_rate: float = setting(1.0, "Multiplier of the schedule (paper 1.0, t2t 2.0).")
  learning_rate_warmup_steps: int = setting(4000, "Warm-up steps (paper 4000, t2t 8000).",
                                            check=POSITIVE)
  optimizer: str = setting(
      "adam", "adam: the paper's Adam (--adam_beta1/--adam_beta2/--adam_epsilon). "
      "adafactor: Adafactor as tensor2tensor ran it (factored second moments, no "
      "momentum, decay 1 - s^-0.8, update clipping 1.0, steps relative to each weight's "
      "RMS): optimizer state of n + m numbers per n x m matrix instead of Adam's 2nm; "
      "--learning_rate_schedule still sets its (relative) step size, see "
      "docs/training.md. A model directory keeps the optimizer it started with.",
      choices=("adam", "adafactor"))
  clip_grad_norm: float = setting(
      0.0, "Scale each update's gradient down to this global L2 norm when above it, "
      "measured on the whole batch's gradient (after the sum over replicas and "
      "--accum_steps, so it does not depend on how the batch is split); 0 = never.",
      check=AT_LEAST_0)
  adam_beta1: float = setting(0.9, "Adam beta1.")
  adam_beta2: float = setting(0.98, "Adam beta2 (paper 0.98, t2t 0.997).")
  adam_epsilon: float = setting(1e-9, "Adam epsilon.")
  label_smoothing: float = setting(0.1, "eps_ls.", check=DROPOUT)
  guided_alignment_weight: float = setting(
      0.1, "With --train_alignments: weight of the guided-alignment loss (the cross-"
      "entropy of one head's attention against the row-normalised reference "
      "alignment, per target token) added to the translation loss; Marian's default "
      "0.1.", check=AT_LEAST_0)
  guided_alignment_layer: int = setting(
      -1, "With --train_alignments: the decoder layer whose encoder-decoder attention "
      "is guided; -1 = the last (Marian, OpenNMT-tf).")
  guided_alignment_head: int = setting(
      0, "With --train_alignments: the head of that layer that is guided (0-based).",
      check=AT_LEAST_0)
  strategy: str = setting("default", "tf.distribute strategy.", choices=_STRATEGIES)
  tpu: Optional[str] = setting(None, "Cloud TPU name or address (--strategy=tpu).")
  tpu_zone: Optional[str] = setting(
      None, "--strategy=tpu: the Cloud TPU's zone, where the resolver cannot read it "
      "from the VM's metadata or gcloud's configuration (a host outside the TPU's zone).")
  gcp_project: Optional[str] = setting(
      None, "--strategy=tpu: the Cloud TPU's project, where the resolver cannot read it "
      "from the VM's metadata or gcloud's configuration.")
  data_service: Optional[str] = setting(
      None, "Run the training input pipelines on tf.data service: grpc://HOST:PORT of a "
      "dispatcher with one worker (python -m t2t_keras.tools.data_service), or several "
      "such dispatchers comma-separated (input pipeline i reads from the i-th mod their "
      "number). The same batches as without it, at every step and on resume "
      "(t2t_keras/data/batching/service.py; docs/training.md).")
  num_logical_devices: int = setting(
      0, "Split the CPU into N logical devices (testing distribution).")
  peer_timeout_minutes: float = setting(
      30.0, "--strategy=multi_worker_mirrored: the longest a worker waits for the others "
      "in one collective (a step, a shared decision) before it stops with an error naming "
      "the lost worker and the checkpoint to resume from. It must cover the longest any "
      "worker can be busy alone: the chief's dev BLEU decoding, a checkpoint write. The "
      "first call of each program (its trace or XLA compilation) is not bounded. A "
      "worker that dies is noticed within seconds whatever this is; 0 = wait forever.",
      check=AT_LEAST_0)
  collective: str = setting(
      "auto", "--strategy=multi_worker_mirrored: how the workers all-reduce gradients. "
      "nccl: NVIDIA's NCCL between the GPUs of all workers (TensorFlow uses it only when "
      "asked); ring: TensorFlow's ring all-reduce over gRPC (workers without GPUs); auto: "
      "nccl where the workers have GPUs, else ring.", choices=("auto", "nccl", "ring"))
  jit_compile: bool = setting(False, "Compile train steps with XLA.")
  steps_per_loop: int = setting(1, "Train steps per host call (TPU).", check=POSITIVE)
  static_run_steps: int = setting(
      1, "--static_shapes: consecutive steps kept on one bucket (length), so that one "
      "compiled call of up to this many of the --steps_per_loop steps runs on one shape. "
      "1 (default) draws every step's bucket anew, as dynamic shapes do: runs of 50 "
      "trained visibly worse on Multi30k (docs/training.md, Cloud TPU).", check=POSITIVE)
  accum_steps: int = setting(1, "Micro-batches accumulated per update.", check=POSITIVE)
  seed: int = setting(1, "Random seed for initialisation and shuffling.")
  deterministic: bool = setting(False, "Deterministic ops (bitwise reproducible resume).")
  log_every: int = setting(100, "Steps between progress lines.", check=POSITIVE)
  eval_every: int = setting(1000, "Steps between dev evaluations.", check=POSITIVE)
  eval_steps: int = setting(0, "Dev batches per evaluation; 0 = all.")
  save_checkpoint_steps: int = setting(1000, "Steps between checkpoints.", check=POSITIVE)
  save_checkpoint_minutes: float = setting(10.0,
                                           "Minutes between checkpoints (paper: 10).")
  keep_checkpoint_max: int = setting(
      20, "Checkpoints kept (paper averages the last 5 or 20).", check=POSITIVE)
  keep_best_checkpoint: bool = setting(
      False, "After each dev evaluation keep the best checkpoint so far (by dev BLEU "
      "with --eval_bleu_sentences > 0, else dev loss) in <model_dir>/best, outside the "
      "--keep_checkpoint_max rotation; decode or export it with "
      "--checkpoint_path=<model_dir>/best.")
  early_stopping_patience: int = setting(
      0, "Stop training after this many dev evaluations (--eval_every) without "
      "improvement of dev BLEU (or dev loss), with a final checkpoint; 0 = never. The "
      "stop is recorded: the same command run again says the run is finished.",
      check=AT_LEAST_0)
  continue_after_early_stop: bool = setting(
      False, "Train on after a run that stopped early (--early_stopping_patience): the "
      "count of evaluations without improvement starts again from 0.")
  init_from: Optional[str] = setting(
      None, "Fine-tune: start from this model directory's latest checkpoint (or this "
      "checkpoint prefix), its shapes checked, with a fresh optimizer at step 0; once, "
      "in a --model_dir without checkpoints (a restart resumes its own).")
  init_from_vocab: str = setting(
      "source", "With --init_from: train on the source model's vocabulary (source), or "
      "on this run's own (new: embedding rows of pieces both share are copied, the "
      "others start fresh).", choices=("source", "new"))
  init_from_optimizer: bool = setting(
      False, "With --init_from: also take the checkpoint's optimizer state and step "
      "(same --optimizer and vocabulary only).")

  def validate(self) -> "TrainConfig":
    """Raises ConfigError naming the offending flags and values; returns self."""
    problems = check_fields(self)
    if self.strategy not in _STRATEGIES:
      problems.append(f"--strategy={self.strategy!r} must be one of "
                      f"{', '.join(_STRATEGIES)}")
    if self.strategy == "tpu" and self.tpu is None:
      problems.append("--strategy=tpu needs --tpu (a Cloud TPU name, 'local' on a TPU "
                      "VM, or grpc://host:port)")
    if self.data_service is not None and not all(
        DATA_SERVICE_ADDRESS.match(part.strip()) for part in self.data_service.split(",")):
      problems.append(
          f"--data_service={self.data_service} must be grpc://HOST:PORT, the address of "
          "a tf.data service dispatcher (several comma-separated, one per "
          "dispatcher+worker pair); start them with `python -m "
          "t2t_keras.tools.data_service --dispatcher --worker --port=PORT`")
    raise_problems(problems, "training settings")
    return self


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """What a training run does besides training (`training.run.train_and_evaluate`):
  dev BLEU at each evaluation, the examples and the export after training, and what
  it records of the command that started it.

  The fields without a flag are facts about the command line, which the train command
  fills in (flags.run_config); a run built in code keeps their defaults.
  """

  eval_bleu_sentences: int = setting(
      0, "At each dev evaluation, also decode the first N dev sentences with the decode "
      "flags and log sacreBLEU (the data source's dev pairs: --dev_src/--dev_tgt, the "
      "TFDS validation split, the synthetic held-out set; 0 = off).",
      check=(lambda v: v >= 0, "must be >= 0 (0 = off)"))
  export: bool = setting(
      False, "After training, export a SavedModel for TensorFlow Serving to --export_dir "
      "(decoding settings from the decode flags).")
  export_dir: Optional[str] = setting(
      None, "Where exports go (default <model_dir>/export); each export is a numbered "
      "version below it.")
  show_examples: int = setting(
      5, "After training, decode this many dev sentences (spread over the dev lengths) "
      "with the decode flags and print them (0 = skip).")
  dev_exact_match: bool = setting(
      False, "After training, decode the whole dev set and print the exact-match accuracy "
      "of the best beam (the demo's figure; costs a full dev decode), with "
      "--show_examples of its outputs.")
  # --vocab_file was given: --init_from (with the source's vocabulary) refuses it.
  vocab_file_given: bool = setting(False)
  # The decoding flags given, by name: config.json's recipe (flags.recipe_decoding).
  recipe_decoding: Optional[dict] = setting(None)
  # The command's flags as a flagfile, appended to <model_dir>/flags.txt ("" = none).
  flags_text: str = setting("")
  # The command that resumes the run, named by a lost worker's error.
  resume_command: Optional[str] = setting(None)

  def validate(self) -> "RunConfig":
    """Raises ConfigError naming the offending flags and values; returns self."""
    raise_problems(check_fields(self), "run settings")
    return self


def guided_alignment_problems(model: ModelConfig, train: TrainConfig) -> List[str]:
  """The guided head (--guided_alignment_layer/--guided_alignment_head) against the
  model's decoder layers and heads."""
  layers, heads = model.decoder_layers, model.num_heads
  problems = []
  if not -layers <= train.guided_alignment_layer < layers:
    problems.append(f"--guided_alignment_layer={train.guided_alignment_layer} but the "
                    f"model has {layers} decoder layers: use 0..{layers - 1} or -1 (the "
                    "last)")
  if not 0 <= train.guided_alignment_head < heads:
    problems.append(f"--guided_alignment_head={train.guided_alignment_head} but the model "
                    f"has {heads} heads: use 0..{heads - 1}")
  return problems


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """The inference settings (paper section 6.1: beam 4, alpha 0.6, input + 50).

  One value for everything that turns a model into outputs: the search, the output
  length, the options processors apply (minimum length, tree constraint), how sources
  are cut and which language they are translated into, and how the host batches them.
  The decode command, training's dev BLEU, every export format (`export.Format`
  declares which of these flags its artifact carries) and the CTranslate2 tool read
  it; `WeightsConfig` says which weights they decode with. `decoding_flags` in
  flags.py is the list of its flags a command reads.

  Random sampling (for back-translation) replaces beam search when `sampling_topk`
  is not 1 or `sampling_topp` < 1: each input gets `num_samples` samples drawn from
  the model's distribution at `sampling_temperature`, restricted to the `sampling_topk`
  most likely tokens (0 = the whole vocabulary) and to the smallest set of tokens whose
  probability reaches `sampling_topp` (nucleus). The noise of a sample depends only on
  `seed`, the input's key (its line number) and the sample's index, never on the batch.
  """

  beam_size: int = setting(4, "Beam size; 1 = greedy.", check=(lambda v: v >= 1,
                                                              "must be >= 1"))
  alpha: float = setting(0.6, "GNMT length penalty exponent.", check=AT_LEAST_0)
  extra_decode_length: int = setting(50, "Maximum output length = input length + this.")
  return_beams: bool = setting(False, "Output every beam with its score.")
  batch_size: int = setting(32, "Sentences per decoding batch.", flag="decode_batch_size",
                            check=POSITIVE)
  batch_tokens: int = setting(
      0, "Also cap each decoding batch at this many source tokens (rows x the longest "
      "source, EOS included; fairseq's --max-tokens): batches of long sentences hold "
      "fewer rows, short ones up to --decode_batch_size. 0 = sentences only. A sentence "
      "longer than the cap is decoded alone.", flag="decode_batch_tokens",
      check=AT_LEAST_0, only="decode")
  parallel_batches: int = setting(
      0, "Batches the decode command decodes at the same time, each on its share of the "
      "CPU cores (CTranslate2's inter_threads): a decoding step is many small ops that one "
      "batch cannot spread over several cores, so N batches side by side, each with "
      "cores / N threads per op, are faster (docs/benchmarks.md); each "
      "holds its own cache and logits in memory. The decode command resolves 0 to one "
      "per CPU core (at most 8) on a machine without GPUs, 1 with --output_alignments; "
      "any value is capped at the input's number of batches. 1 = one batch at a time, "
      "every core on it. (translate.translate with N > 1 runs N batches from threads; "
      "its caller sets threads per op.)", flag="decode_parallel_batches",
      check=AT_LEAST_0, only="decode")
  devices: str = setting(
      "auto", "Devices the decode command spreads its batches over, batch i on the i-th "
      "mod N, each device with its own copy of the weights and --decode_parallel_batches "
      "batches at a time: 'auto' = every GPU when the host has more than one, else "
      "TensorFlow's default device (as without the flag); 'all' = every GPU, or every "
      "CPU device on a host without; or a list such as GPU:0,GPU:1. The same "
      "translations on any number of devices (docs/decoding.md).",
      flag="decode_devices", only="decode",
      check=(lambda v: v.strip() in ("auto", "all") or all(
          re.fullmatch(r"(/device:)?(CPU|GPU):\d+", part.strip(), re.IGNORECASE)
          for part in v.split(",")), "must be auto, all or devices such as GPU:0,GPU:1"))
  jit_compile: bool = setting(
      False, "Decode with XLA (faster steps on CPU; docs/benchmarks.md). Batches are "
      "padded to --decode_batch_size rows and a power-of-two source width (16, 32, "
      "64, ...), and each width compiles once (tens of seconds for a base model), so it "
      "pays off from a few hundred sentences: the decode command "
      "uses it for greedy search and sampling from 256 input sentences on (beam search "
      "stays in graph mode, where finished sentences leave the batch) unless this flag "
      "is given either way "
      "(export and training's dev BLEU do not unless it is set). Same translations as "
      "without.", flag="decode_jit_compile")
  xla_halvings: int = setting(
      2, "Under XLA (--decode_jit_compile, the export's --export_jit_compile) beam "
      "search (beams of 2 to 8) runs fixed shapes, so finished sentences cannot leave "
      "the batch as they do in graph mode; instead the batch halves up to this many "
      "times as its sentences finish (B rows, then B/2, then B/4: a loop each). Each "
      "halving adds a loop to compile; the default decoded fastest in the runs of "
      "docs/benchmarks.md. Capped at what the batch's rows allow (none for 1-row "
      "exports, --max_request_rows=1). The same translations (up to the rounding of "
      "near ties, as with any other batch size).",
      flag="decode_xla_halvings", check=AT_LEAST_0)
  min_decode_length: int = setting(
      0, "Outputs have at least this many tokens before EOS: 1 never returns an empty "
      "translation (as CTranslate2's beam search); 0 (tensor2tensor) returns one when "
      "ending at once scores best.", check=AT_LEAST_0)
  # Library callers may give 0: no cut (training's dev BLEU scores whole sentences).
  max_input_length: int = setting(
      256, "Sources longer than this many subwords (EOS included) are truncated when "
      "decoding and in exports: bounds the memory of a batch.",
      check=(lambda v: v >= 2, "must be >= 2 (a token and EOS)"))
  constrain_trees: bool = setting(
      False, "Parsing models (decode and export): let beam search write only "
      "linearized trees over exactly the input's words (one POS tag per word, with "
      "--parsing_linearization=words each after its word copied, balanced brackets, no "
      "empty constituents), instead of repairing outputs afterwards.")
  target_language: Optional[str] = setting(
      None, "A multilingual model's target language (--target_language_tags at "
      "training): its tag <2xx> starts every source (decode, score; export: the language "
      "serving_default translates into). Default: the dev files' language.")
  # The sampling flags are the decode command's own (decode.py defines them).
  sampling_topk: int = setting(
      1, "Sample instead of beam search: from the K most likely tokens; 0 = the whole "
      "vocabulary; 1 = no sampling (beam search / greedy).",
      check=(lambda v: v >= 0, "must be >= 0 (0 = the whole vocabulary, 1 = no "
             "sampling)"), only="decode")
  sampling_topp: float = setting(
      1.0, "Sample from the smallest set of tokens whose probability reaches P (nucleus "
      "sampling); < 1 turns sampling on.", check=(lambda v: 0.0 < v <= 1.0,
                                                  "must be in (0, 1]"), only="decode")
  sampling_temperature: float = setting(
      1.0, "Divide the logits by this before sampling (< 1 sharper, > 1 flatter).",
      check=(lambda v: v > 0.0, "must be > 0"), only="decode")
  num_samples: int = setting(
      1, "Samples per input when sampling (N > 1 writes them as --return_beams does).",
      check=(lambda v: v >= 1, "must be >= 1"), only="decode")
  seed: int = setting(1, flag="seed", only="decode")
  # No flag: a fixed output width whatever the sources (callers that compare the
  # outputs of different batches); None = the source width + extra_decode_length.
  decode_length: Optional[int] = setting(None)
  # No flag: float32 attention on few rows by elementwise kernels, chosen at each step
  # by its size (`decoder_step.few_rows`), which makes a sentence's last digits depend
  # on the rows beside it. The SavedModel's searches set it (a request's latency: the
  # client makes the batches); the decode command does not, so that its output is the
  # same bytes whatever the batches (shards, resumed runs, devices).
  attention_by_size: bool = setting(False)

  @property
  def sampling(self) -> bool:
    """Whether decoding samples (instead of beam search / arg-max)."""
    return self.sampling_topk != 1 or self.sampling_topp < 1.0

  @property
  def beams_per_row(self) -> int:
    """Hypotheses a search step keeps per input row: the beam, or one when sampling
    (each sample is a row of its own, drawn as greedy search draws its arg-max)."""
    return 1 if self.sampling else self.beam_size

  def validate(self) -> "DecodeConfig":
    """Raises ConfigError naming the offending flags; returns self."""
    problems = check_fields(self)
    if self.num_samples > 1 and not self.sampling:
      problems.append(f"--num_samples={self.num_samples} needs sampling: set "
                      "--sampling_topk (0 = whole vocabulary) or --sampling_topp < 1")
    raise_problems(problems, "decoding settings")
    return self


@dataclasses.dataclass(frozen=True)
class WeightsConfig:
  """Which weights an inference command (decode, score, export) restores, and the
  dtype it computes in; the sibling of `DecodeConfig`, read by `loading.load`."""

  checkpoint_path: Optional[str] = setting(
      None, "Decode/export this checkpoint (a prefix such as <model_dir>/ckpt-5000, "
      "or a directory of checkpoints such as <model_dir>/best) instead of the "
      "latest. Typed on the command line, it overrides a recipe's "
      "--average_last_n.")
  average_last_n: int = setting(
      0, "Decode/export the average of the last N checkpoints' weights (paper section "
      "6.1: 5 for base, 20 for big); 0 or 1 = the latest only.", check=AT_LEAST_0)
  dtype: Optional[str] = setting(
      None, "Override the model's dtype for decoding and SavedModel exports (e.g. "
      "float32, bfloat16).", flag="decode_dtype")
