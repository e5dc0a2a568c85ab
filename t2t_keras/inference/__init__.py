"""Inference: everything that turns a trained model into outputs.

The front door is `Translator` (`translator.py`): `Translator.load(model_dir)`, then
`.translate(lines)` / `.translations(lines)` and `.score(pairs)`, with the decode
command's own choices (XLA or graph mode, batches at a time).

Read top-down: `decoding` (ids -> ids in the graph: the encoder once, then a search
over the key/value cache), `search` (the searches: beam, greedy, sampling),
`processors` (decoding options composed around the model's step), `loading` (a
restored model for inference), `translate` (host side: strings in, translations out),
`translator` (the front door above them), `bulk` (the decode command's windows,
resume and shards), `ensemble`, `scoring` (teacher-forced scores and alignments) and
`attention_maps`.

The commands that use it (`decode`, `score`, `export`) stay at the package root, where
users call them. Nothing here is imported on `import t2t_keras.inference`: the
commands check their flags before TensorFlow loads, and a module of the package may
import one of this package's modules without loading them all.
"""

from __future__ import annotations

__all__ = ["Translator"]


def __getattr__(name: str):
  """`from t2t_keras.inference import Translator`, imported on first use (PEP 562), so
  that importing any module of this package does not import TensorFlow and the model."""
  if name == "Translator":
    from t2t_keras.inference.translator import Translator  # pylint: disable=import-outside-toplevel
    return Translator
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
