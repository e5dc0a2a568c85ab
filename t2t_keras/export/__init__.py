"""Exports of a trained model: one module per format, and what each format carries.

- `saved_model.py`: a SavedModel for TensorFlow Serving (strings in, translations out;
  beam search, tokenization and per-request limits in the graph); `serving.py` the
  module it serves (its signatures' graph).
- `ctranslate2.py`: a CTranslate2 model directory (OpenNMT's C++ engine).
- `huggingface.py`: a transformers model directory (MarianMT or Pegasus, safetensors).
- `publish.py`: how both make an export appear whole or not at all.
- `__main__.py`: the command, `python -m t2t_keras.export` / `t2t-export`.

A format is declared by a `Format` here: its name, the decoding settings its artifact
carries (fixed at export: whoever loads it decodes with them), and for every other
decoding setting where a user sets it instead. The command checks the flags typed on
its command line against the declaration (`Format.check_flags`), generically: a
decoding setting an artifact would silently drop is refused, naming the flag and
where it goes instead. Refused rather than warned: an export is an artifact shipped to
a server, where a beam size the user believed fixed would differ without a trace; the
refusal costs one edit of the command line, while a warning scrolls past in an export
log. Settings a recipe holds are not refused (one recipe serves train,
decode and export). `tests/export_formats_test.py` checks that every format declares
every decoding flag (`flags.decoding_flags`, the fields of the inference settings), so a
new decoding option must say, per format, whether the export carries it.

Each format module implements the same three functions, which `Format` calls:
`default_dir(model_dir)`, `export_from_settings(settings)` (returns the path written)
and `describe(path, settings)` (what the command prints after writing it).

Nothing here imports TensorFlow: the command checks its flags before loading anything.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Dict, Mapping, Optional, Tuple

from t2t_keras.configs import DecodeConfig, WeightsConfig
from t2t_keras.errors import ExportError

# CTranslate2's weight types (`--quantization`); its `compute_type` can also convert
# when the model is loaded.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                 "float16", "bfloat16", "float32")


# The XLA export searches requests of up to this many rows with XLA, larger ones in
# graph mode: XLA's fused step wins where a request's few rows leave the step
# dispatch-bound, while graph mode drops finished sentences from larger batches and
# runs a request's two halves side by side (docs/benchmarks.md, "The XLA export by
# request size"). Also fewer programs to compile when a server loads the model.
XLA_MAX_ROWS = 16


@dataclasses.dataclass(frozen=True)
class ExportSettings:
  """What the export command was asked for; each format reads the fields it declares.

  Attributes:
    model_dir: the model directory training wrote.
    export_dir: where the export goes (`Format.default_dir` when not given).
    decode_config: the inference settings, a `configs.DecodeConfig` (beam size, alpha,
      extra decode length, max_input_length, constrain_trees, target_language, ...):
      what the artifact carries (`Format.carries`).
    weights: which weights, in which dtype (`configs.WeightsConfig`).
    version: the SavedModel version (0: the Unix time).
    jit_compile: the SavedModel's beam search compiled with XLA.
    xla_max_rows: with `jit_compile`, requests of at most this many rows take the XLA
      search, larger ones the graph-mode search (0: every request takes XLA).
    max_request_rows, max_string_bytes, max_request_tokens: the SavedModel's
      per-request limits.
    quantization: CTranslate2's weight type (None: float32).
  """

  model_dir: str
  export_dir: str
  decode_config: DecodeConfig = DecodeConfig()
  weights: WeightsConfig = WeightsConfig()
  version: int = 0
  jit_compile: bool = False
  xla_max_rows: int = XLA_MAX_ROWS
  max_request_rows: int = 256
  max_string_bytes: int = 16384
  max_request_tokens: int = 16384
  quantization: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Format:
  """An export format: what it carries and where the rest goes.

  Attributes:
    name: the `--format` value.
    help: one line for `--format`'s help.
    module: the module that writes it (imported when needed).
    carries: the decoding flags the artifact carries (fixed at export).
    instead: every other decoding flag -> where a user sets it instead (an option of
      the program that loads the artifact, or another export flag).
    own_flags: flags of the export command only this format reads.
  """

  name: str
  help: str
  module: str
  carries: Tuple[str, ...]
  instead: Mapping[str, str]
  own_flags: Tuple[str, ...] = ()

  def __post_init__(self):
    both = set(self.carries) & set(self.instead)
    assert not both, f"{self.name} both carries and drops {sorted(both)}"

  def _impl(self):
    return importlib.import_module(self.module)

  def default_dir(self, model_dir: str) -> str:
    return self._impl().default_dir(model_dir)

  def export(self, settings: ExportSettings) -> str:
    """Writes the export; returns its path."""
    return self._impl().export_from_settings(settings)

  def describe(self, path: str, settings: ExportSettings) -> str:
    """What the command prints once `path` is written (how to use it)."""
    return self._impl().describe(path, settings)

  def check_flags(self, typed: Mapping[str, object]) -> None:
    """Refuses flags typed on the command line that this format would drop.

    Args:
      typed: name -> value of the flags typed on the command line
        (`flags.command_line_flags`), not those of a recipe. A flag turned off
        (False, None) asks for nothing and passes.

    Raises:
      ExportError: naming each such flag and where it goes instead.
    """
    typed = [name for name, value in typed.items() if value is not False and value is not None]
    problems = [f"--{name} ({self.name} does not carry it): {self.instead[name]}"
                for name in typed if name in self.instead]
    for other in FORMATS.values():
      problems += [f"--{name} is for --format={other.name} only: drop it"
                   for name in typed if name in other.own_flags
                   and name not in self.own_flags]
    if problems:
      raise ExportError(f"--format={self.name} would drop flags typed on the command "
                        "line: " + "; ".join(problems) + ".")


_CT2_TOOL = "tools/ct2_translate.py"
SAVED_MODEL = Format(
    name="saved_model",
    help="TensorFlow Serving (strings in, translations out)",
    module="t2t_keras.export.saved_model",
    carries=("beam_size", "alpha", "extra_decode_length", "return_beams",
             "min_decode_length", "max_input_length", "decode_dtype", "constrain_trees",
             "target_language", "decode_xla_halvings"),
    instead={
        "decode_batch_size": "a request is one batch (its rows are the client's, at most "
                             "--max_request_rows; TF Serving's batching merges requests "
                             "up to its max_batch_size)",
        "decode_jit_compile": "use --export_jit_compile to compile the exported beam "
                              "search with XLA",
    },
    own_flags=("export_version", "export_jit_compile", "export_xla_max_rows",
               "max_request_rows",
               "max_string_bytes", "max_request_tokens"))

CTRANSLATE2 = Format(
    name="ctranslate2",
    help="a CTranslate2 model directory (pip install ctranslate2)",
    module="t2t_keras.export.ctranslate2",
    carries=(),  # CTranslate2 model directories hold weights and vocabulary only
    instead={
        "beam_size": f"give it when translating: {_CT2_TOOL} --beam_size, or "
                     "translate_batch(beam_size=...)",
        "alpha": f"give a length penalty when translating: {_CT2_TOOL} --length_penalty, "
                 "or translate_batch(length_penalty=...), which divides by length^p, not by "
                 "GNMT's ((5 + length) / 6)^alpha (0 ranks as --alpha=0 does)",
        "extra_decode_length": f"give it when translating: {_CT2_TOOL} "
                               "--extra_decode_length, or translate_batch("
                               "max_decoding_length=source length + N)",
        "target_language": f"give it when translating: {_CT2_TOOL} --target_language "
                           "(the tag token <2xx> first in each source)",
        "max_input_length": f"give it when translating: {_CT2_TOOL} --max_input_length, "
                            "or translate_batch(max_input_length=...)",
        "return_beams": "ask for them when translating: translate_batch("
                        "num_hypotheses=K, return_scores=True)",
        "min_decode_length": "give it when translating: translate_batch("
                             "min_decoding_length=...)",
        "decode_batch_size": f"give it when translating: {_CT2_TOOL} --batch_size, or "
                             "translate_batch(max_batch_size=...)",
        "decode_jit_compile": "CTranslate2 runs its own kernels; drop it",
        "decode_xla_halvings": "CTranslate2 runs its own kernels (its batch drops each "
                               "finished sentence); drop it",
        "decode_dtype": "use --quantization for the weights' type, or "
                        f"{_CT2_TOOL} --compute_type (ctranslate2.Translator("
                        "compute_type=...)) when loading",
        "constrain_trees": "a CTranslate2 model cannot carry the tree constraint; use "
                           "--format=saved_model",
    },
    own_flags=("quantization",))

_GENERATE = "pass it to transformers' generate"
HUGGINGFACE = Format(
    name="huggingface",
    help="a transformers model directory (MarianMT or Pegasus, PyTorch safetensors; "
         "loading it needs pip install transformers torch)",
    module="t2t_keras.export.huggingface",
    # generation_config.json (alpha as length_penalty: exact at 0, see huggingface.py;
    # max_input_length: the tokenizer's model_max_length, and max_new_tokens with
    # extra_decode_length)
    carries=("beam_size", "alpha", "extra_decode_length", "min_decode_length",
             "max_input_length"),
    instead={
        "return_beams": f"{_GENERATE}: generate(num_return_sequences=K, "
                        "output_scores=True, return_dict_in_generate=True)",
        "target_language": "start each source with the language's tag as Marian "
                           "writes it: '>>de<< A dog runs.' (vocab.json maps it to <2de>)",
        "decode_batch_size": "batch the sources yourself: tokenizer(texts, padding=True)",
        "decode_jit_compile": "transformers runs PyTorch; drop it (torch.compile is "
                              "yours to try)",
        "decode_xla_halvings": "transformers runs PyTorch; drop it",
        "decode_dtype": "give it when loading: from_pretrained(..., dtype=torch.bfloat16)",
        "constrain_trees": "a transformers model cannot carry the tree constraint; use "
                           "--format=saved_model",
    })

FORMATS: Dict[str, Format] = {f.name: f for f in (SAVED_MODEL, CTRANSLATE2, HUGGINGFACE)}

