"""Frozen dataclasses that carry every setting from the entry points to the library.

Only entry points read absl FLAGS; they build these objects once (see flags.py) and
pass them down, so library code, tests and notebooks can construct them directly.
Names follow tensor2tensor / Model Garden where those exist (hidden_size, filter_size,
num_heads, num_hidden_layers, attention_dropout, relu_dropout, label_smoothing, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of the Transformer (paper section 3, Table 3).

  Attributes:
    vocab_size: size of the shared source/target vocabulary.
    hidden_size: d_model.
    filter_size: d_ff, inner size of the feed-forward network.
    num_heads: h.
    num_hidden_layers: N, used for both stacks unless overridden below.
    num_encoder_layers: encoder depth; 0 means num_hidden_layers.
    num_decoder_layers: decoder depth; 0 means num_hidden_layers.
    key_size: d_k per head; 0 means hidden_size // num_heads.
    value_size: d_v per head; 0 means hidden_size // num_heads.
    layer_prepostprocess_dropout: P_drop on sublayer outputs and embedding sums.
    attention_dropout: dropout on attention weights.
    relu_dropout: dropout after the FFN's ReLU.
    position_embedding: "sinusoid" (paper) or "learned" (Table 3 row E).
    max_position: longest position the model can embed (learned positions size).
    pre_norm: False = post-norm as in the paper; True = tensor2tensor's later default.
    norm_epsilon: LayerNorm epsilon.
    shared_embeddings: one matrix for source, target embeddings and pre-softmax.
    dtype: "float32", "bfloat16", "mixed_float16" or "mixed_bfloat16" (logits always
      float32); the --dtype flag offers the first three.
  """

  vocab_size: int = 37000
  hidden_size: int = 512
  filter_size: int = 2048
  num_heads: int = 8
  num_hidden_layers: int = 6
  num_encoder_layers: int = 0
  num_decoder_layers: int = 0
  key_size: int = 0
  value_size: int = 0
  layer_prepostprocess_dropout: float = 0.1
  attention_dropout: float = 0.0
  relu_dropout: float = 0.0
  position_embedding: str = "sinusoid"
  max_position: int = 1024
  pre_norm: bool = False
  norm_epsilon: float = 1e-6
  shared_embeddings: bool = True
  dtype: str = "float32"

  @property
  def encoder_layers(self) -> int:
    return self.num_encoder_layers or self.num_hidden_layers

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_hidden_layers

  @property
  def head_key_size(self) -> int:
    return self.key_size or self.hidden_size // self.num_heads

  @property
  def head_value_size(self) -> int:
    return self.value_size or self.hidden_size // self.num_heads

  def validate(self) -> "ModelConfig":
    """Raises ValueError naming the offending values; returns self."""
    problems = []
    for name in ("vocab_size", "hidden_size", "filter_size", "num_heads",
                 "num_hidden_layers", "max_position"):
      if getattr(self, name) <= 0:
        problems.append(f"{name}={getattr(self, name)} must be positive")
    if self.num_heads > 0 and (not self.key_size or not self.value_size):
      if self.hidden_size % self.num_heads:
        problems.append(
            f"hidden_size={self.hidden_size} is not divisible by num_heads="
            f"{self.num_heads}; pick sizes that divide, or set --key_size and "
            "--value_size (d_k, d_v per head) explicitly")
    for name in ("layer_prepostprocess_dropout", "attention_dropout", "relu_dropout"):
      value = getattr(self, name)
      if not 0.0 <= value < 1.0:
        problems.append(f"{name}={value} must be in [0, 1)")
    if self.position_embedding not in ("sinusoid", "learned"):
      problems.append(f"position_embedding={self.position_embedding!r} must be "
                      "'sinusoid' or 'learned'")
    if self.dtype not in ("float32", "bfloat16", "mixed_float16", "mixed_bfloat16"):
      problems.append(f"dtype={self.dtype!r} must be float32, bfloat16 or "
                      "mixed_float16")
    if problems:
      raise ValueError("Invalid model configuration: " + "; ".join(problems))
    return self


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where sentence pairs come from and how they are batched.

  Attributes:
    source: "files", "tfds", "synthetic" (or "parsing").
    train_src / train_tgt: line-aligned training files (source "files").
    dev_src / dev_tgt: line-aligned dev files (optional).
    tfds_name: e.g. "wmt14_translate/de-en" (source "tfds").
    tfds_data_dir: tensorflow-datasets data directory (None = default).
    source_lang / target_lang: translation direction for TFDS ("en" -> "de").
    synthetic_task: "copy" or "reverse" (source "synthetic").
    synthetic_min_length / synthetic_max_length: lengths of synthetic sequences.
    synthetic_vocab_size: symbols used by the synthetic task (ids above reserved).
    synthetic_train_size / synthetic_eval_size: examples generated per split.
    data_dir: where the vocabulary and tokenized caches live.
    vocab_type: "bpe" (paper EN-DE) or "unigram" (SentencePiece unigram, the
      word-piece-like EN-FR choice).
    vocab_file: explicit SentencePiece model path; None = a name derived from the
      data inside data_dir. Built there if missing, reused if present.
    vocab_size: target size of the shared subword vocabulary.
    vocab_sample_sentences: sentences sampled to train the vocabulary.
    max_length: pairs with more tokens on either side are dropped (and counted).
    batch_size: token budget per replica per batch (t2t semantics).
    static_shapes: pad to bucket boundaries with a fixed batch per bucket (TPU/XLA).
    bucket_min / bucket_growth: bucket boundaries start at bucket_min, grow by factor.
    seed: the seed of the batch plan (the order of the training pairs).
    skip_invalid_utf8: skip and count lines with invalid UTF-8 instead of failing.
    accum_steps: micro-batches per replica per update (the training flag; the
      trainer passes its own): all batches of one update, on every replica, share a
      bucket.
  """

  source: str = "synthetic"
  train_src: Optional[str] = None
  train_tgt: Optional[str] = None
  dev_src: Optional[str] = None
  dev_tgt: Optional[str] = None
  tfds_name: str = "wmt14_translate/de-en"
  tfds_data_dir: Optional[str] = None
  source_lang: str = "en"
  target_lang: str = "de"
  synthetic_task: str = "copy"
  synthetic_min_length: int = 1
  synthetic_max_length: int = 10
  synthetic_vocab_size: int = 16
  synthetic_train_size: int = 100_000
  synthetic_eval_size: int = 1_000
  data_dir: Optional[str] = None
  vocab_type: str = "bpe"
  vocab_file: Optional[str] = None
  vocab_size: int = 8000
  vocab_sample_sentences: int = 1_000_000
  max_length: int = 256
  batch_size: int = 4096
  static_shapes: bool = False
  bucket_min: int = 8
  bucket_growth: float = 1.1
  seed: int = 1
  skip_invalid_utf8: bool = False
  accum_steps: int = 1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How the model is optimised, distributed and checkpointed."""

  model_dir: str = "/tmp/t2t_keras"
  train_steps: int = 100_000
  train_minutes: float = 0.0  # training-time budget of this process; 0 = none
  learning_rate_schedule: str = "paper"  # "paper" or "t2t" (constant * warmup * rsqrt)
  learning_rate: float = 1.0  # multiplier of the schedule (t2t: 2.0)
  learning_rate_warmup_steps: int = 4000
  adam_beta1: float = 0.9
  adam_beta2: float = 0.98
  adam_epsilon: float = 1e-9
  label_smoothing: float = 0.1
  strategy: str = "default"  # default | mirrored | multi_worker_mirrored | tpu
  tpu: Optional[str] = None
  num_logical_devices: int = 0  # split the CPU into N devices (tests, demos)
  jit_compile: bool = False
  steps_per_loop: int = 1
  accum_steps: int = 1
  seed: int = 1
  deterministic: bool = False
  log_every: int = 100
  eval_every: int = 1000
  eval_steps: int = 0  # 0 = the whole dev set
  save_checkpoint_steps: int = 1000
  save_checkpoint_minutes: float = 10.0
  keep_checkpoint_max: int = 20
  # After each dev evaluation, keep the best checkpoint (by dev BLEU when it is
  # computed, else dev loss) in <model_dir>/best, outside the rotation above.
  keep_best_checkpoint: bool = False
  # Stop after this many dev evaluations without improvement (0 = never).
  early_stopping_patience: int = 0


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Decoding settings (paper section 6.1: beam 4, alpha 0.6, input + 50).

  Random sampling (for back-translation) replaces beam search when `sampling_topk`
  is not 1 or `sampling_topp` < 1: each input gets `num_samples` samples drawn from
  the model's distribution at `sampling_temperature`, restricted to the `sampling_topk`
  most likely tokens (0 = the whole vocabulary) and to the smallest set of tokens whose
  probability reaches `sampling_topp` (nucleus). The noise of a sample depends only on
  `seed`, the input's key (its line number) and the sample's index, never on the batch.
  """

  beam_size: int = 4
  alpha: float = 0.6
  extra_decode_length: int = 50
  return_beams: bool = False
  batch_size: int = 32
  # XLA-compiled decoding (`decoding.translate`): batches are padded to batch_size rows
  # and to a power-of-two source width, so it compiles once per width bucket.
  jit_compile: bool = False
  # EOS cannot end an output before this many tokens (1: never an empty translation,
  # as CTranslate2's beam search; 0: tensor2tensor's behaviour).
  min_decode_length: int = 0
  sampling_topk: int = 1
  sampling_topp: float = 1.0
  sampling_temperature: float = 1.0
  num_samples: int = 1
  seed: int = 1

  @property
  def sampling(self) -> bool:
    """Whether decoding samples (instead of beam search / arg-max)."""
    return self.sampling_topk != 1 or self.sampling_topp < 1.0

  def validate(self) -> "DecodeConfig":
    """Raises ValueError naming the offending flags; returns self."""
    problems = []
    if self.beam_size < 1:
      problems.append(f"--beam_size={self.beam_size} must be >= 1")
    if self.min_decode_length < 0:
      problems.append(f"--min_decode_length={self.min_decode_length} must be >= 0")
    if self.sampling_topk < 0:
      problems.append(f"--sampling_topk={self.sampling_topk} must be >= 0 (0 = the "
                      "whole vocabulary, 1 = no sampling)")
    if not 0.0 < self.sampling_topp <= 1.0:
      problems.append(f"--sampling_topp={self.sampling_topp} must be in (0, 1]")
    if self.sampling_temperature <= 0.0:
      problems.append(f"--sampling_temperature={self.sampling_temperature} must be > 0")
    if self.num_samples < 1:
      problems.append(f"--num_samples={self.num_samples} must be >= 1")
    if self.num_samples > 1 and not self.sampling:
      problems.append(f"--num_samples={self.num_samples} needs sampling: set "
                      "--sampling_topk (0 = whole vocabulary) or --sampling_topp < 1")
    if problems:
      raise ValueError("Invalid decoding settings: " + "; ".join(problems) + ".")
    return self
