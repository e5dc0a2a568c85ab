"""Per-request limits of the export (export.saved_model.RequestLimits), in the session TF Serving
uses: a request over a limit is refused with INVALID_ARGUMENT naming the limit, its
flag and the request's value, before any tokenization or decoding, and the session
answers the next request; ids outside the vocabulary are refused."""
# pylint: disable=redefined-outer-name  (pytest fixtures)

import dataclasses
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.trained import modeldir
from t2t_keras import EOS_ID
from t2t_keras.configs import DecodeConfig
from t2t_keras.export.saved_model import RequestLimits, read_limits
from tests.conftest import (REPO_ROOT, TINY_EXPORT_DECODE, TINY_EXPORT_MAX_INPUT,
                            SessionModel)

DECODE = DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=5)
MAX_INPUT = 24


@pytest.fixture(scope="module")
def default_export(tiny_export):
  """An export with the default limits (256 rows, 16,384 bytes, 16,384 tokens):
  conftest's shared one, whose decoding settings are DECODE's (and every beam
  returned, which no limit depends on)."""
  assert dataclasses.replace(DECODE, return_beams=True) == DecodeConfig(**TINY_EXPORT_DECODE)
  assert MAX_INPUT == TINY_EXPORT_MAX_INPUT
  path = tiny_export[1]
  return path, SessionModel(path)


@pytest.fixture(scope="module")
def cli_export(tiny_model_dir, tmp_path_factory):
  """An export written by the CLI with smaller limits: (path, stdout, session)."""
  export_dir = str(tmp_path_factory.mktemp("cli_limits"))
  result = subprocess.run(
      [sys.executable, "-m", "t2t_keras.export", f"--model_dir={tiny_model_dir}",
       f"--export_dir={export_dir}", "--export_version=1", "--beam_size=2",
       "--extra_decode_length=5", f"--max_input_length={MAX_INPUT}",
       "--max_request_rows=8", "--max_string_bytes=300", "--max_request_tokens=60"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  path = os.path.join(export_dir, "1")
  return path, result.stdout, SessionModel(path)


def refused(session, pattern, signature="serving_default", **inputs):
  """Runs a request that must fail with INVALID_ARGUMENT matching `pattern`; returns
  the seconds it took."""
  start = time.perf_counter()
  with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
    session.run(signature, **inputs)
  return time.perf_counter() - start


def answered(session):
  out = session.run(inputs=np.array(["a small dog", "the man"], object))
  assert out["outputs"].shape == (2,) and np.all(np.isfinite(out["scores"]))


@pytest.mark.slow
def test_defaults_are_written_into_the_export(default_export):
  path, _ = default_export
  assert read_limits(path) == {"max_input_length": MAX_INPUT, "max_rows": 256,
                               "max_string_bytes": 16384, "max_tokens": 16384}
  assert RequestLimits() == RequestLimits(256, 16384, 16384)


def functions_called(graph_def, node_name):
  """The FunctionDefs a top-level node runs, its calls' calls included."""
  library = {f.signature.name: f for f in graph_def.library.function}
  node = next(n for n in graph_def.node if n.name == node_name)
  todo, found = [node], {}
  while todo:
    for attr in todo.pop().attr.values():
      if attr.func.name in library and attr.func.name not in found:
        found[attr.func.name] = library[attr.func.name]
        todo.extend(found[attr.func.name].node_def)
  return list(found.values())


def ancestors(function, node):
  """The nodes of `function` that must run before `node`: its inputs and control
  inputs, and theirs."""
  nodes = {n.name: n for n in function.node_def}
  seen, todo = set(), [node]
  while todo:
    for name in todo.pop().input:
      parent = nodes.get(name.lstrip("^").split(":")[0])
      if parent is not None and parent.name not in seen:
        seen.add(parent.name)
        todo.append(parent)
  return seen


def test_too_many_rows_is_refused_before_tokenization(default_export):
  _, session = default_export
  pattern = (r"request of 20000 rows: this export takes at most 256 rows per request "
             r"\(export flag --max_request_rows\)")
  refused(session, pattern, inputs=np.array(["a dog"] * 20000, object))
  answered(session)
  # Before tokenization, on any host: in the graph TF Serving runs, the tokenizer waits
  # for the rows check (and the bytes check), so a refused request is never tokenized.
  graph = session.graph.as_graph_def()
  signature = session.signatures["serving_default"]
  called = functions_called(graph, signature.outputs["outputs"].name.split(":")[0])
  tokenizing = [(f, n) for f in called for n in f.node_def
                if n.op == "SentencepieceTokenizeOp"]
  assert tokenizing
  for function, tokenizer in tokenizing:
    checks = {n.name: n.attr["template"].s.decode() for n in function.node_def
              if n.op == "StringFormat"}
    before = ancestors(function, tokenizer)
    for limit in ("rows: this export takes at most 256 rows",
                  "bytes: this export takes at most 16384 bytes"):
      asserts = [n.name for n in function.node_def if n.op == "Assert" and any(
          limit in checks.get(i.split(":")[0], "") for i in n.input)]
      assert len(asserts) == 1 and asserts[0] in before, (limit, asserts)


def test_a_2mb_string_is_refused_before_tokenization(default_export):
  _, session = default_export
  # No time bound here: feeding 2 MB into the session alone takes about a second on a
  # loaded host; the message shows the byte limit refused it.
  refused(session, r"request with a row of 2000000 bytes: this export takes at "
          r"most 16384 bytes per row \(export flag --max_string_bytes\)",
          inputs=np.array(["a dog", "w" * 2_000_000], object))
  answered(session)
  # Within the byte limit, long strings are still cut to max_input_length pieces.
  out = session.run(inputs=np.array(["a man " * 2000], object))
  assert out["outputs"].shape == (1,)


@pytest.mark.slow
def test_cli_flags_are_printed_written_and_enforced(cli_export):
  path, stdout, session = cli_export
  assert read_limits(path) == {"max_input_length": MAX_INPUT, "max_rows": 8,
                               "max_string_bytes": 300, "max_tokens": 60}
  assert ("limits per request: 8 rows (--max_request_rows), 300 bytes per string "
          "(--max_string_bytes), 60 source tokens (--max_request_tokens)") in stdout
  refused(session, r"request of 9 rows: .* at most 8 rows",
          inputs=np.array(["a dog"] * 9, object))
  answered(session)
  # 4 rows whose longest is cut to 24 tokens: 4 x 24 = 96 > 60 tokens.
  refused(session, r"request of 4 rows x 24 tokens \(its longest row, cut to 24\) = 96 "
          r"source tokens: this export takes at most 60 \(export flag "
          r"--max_request_tokens\)",
          inputs=np.array(["a dog", "the man", "a small red dog plays " * 5, "x"], object))
  answered(session)
  refused(session, r"request with a row of 301 bytes", inputs=np.array(["w" * 301], object))
  answered(session)
  # translate_ids: the same row and token limits, and ids per row as bytes per string.
  refused(session, r"request of 9 rows", "translate_ids",
          input_ids=np.full([9, 2], EOS_ID, np.int32))
  refused(session, r"request with a row of 301 ids", "translate_ids",
          input_ids=np.full([1, 301], EOS_ID, np.int32))
  refused(session, r"= 96 source tokens", "translate_ids",
          input_ids=np.full([4, 30], 5, np.int32))
  answered(session)


def test_ids_outside_the_vocabulary_are_refused(default_export, tiny_model_dir):
  _, session = default_export
  vocab_size = modeldir.load_model_config(tiny_model_dir).vocab_size
  for bad in (-1, vocab_size):
    refused(session, rf"request with ids from {min(bad, 5)} to {max(bad, 5)}: ids must be "
            rf"in \[0, {vocab_size}\)", "translate_ids",
            input_ids=np.array([[5, bad, EOS_ID], [5, EOS_ID, 0]], np.int32))
  # The largest id and anything after a row's EOS (padding) are fine.
  out = session.run("translate_ids", input_ids=np.array([[vocab_size - 1, EOS_ID, -7]],
                                                        np.int32))
  assert np.all(np.isfinite(out["scores"]))
