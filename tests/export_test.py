"""The SavedModel translates strings with only TensorFlow + TensorFlow Text, equals
eager decoding, holds only registered ops and survives odd requests."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras import EOS_ID, PAD_ID
from t2t_keras.inference import decoding, loading
from t2t_keras.configs import DecodeConfig, WeightsConfig
from t2t_keras.data.tokens import tokenizer as tokenizer_lib
from t2t_keras.export import ExportSettings
from t2t_keras.export.saved_model import export_from_settings
from tests import inprocess
from tests.conftest import (REPO_ROOT, TINY_EXPORT_DECODE, TINY_EXPORT_MAX_INPUT, SessionModel,
                            build_tiny_model_dir)

DECODE = DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=5, return_beams=True)
MAX_INPUT = 24
SENTENCES = ["a small dog runs on the grass .", "Zwei Männer spielen Fußball.", "",
             "the man is smiling", "über", "x " * 40]


def settings(model_dir, export_dir, weights=WeightsConfig(), **decode) -> ExportSettings:
  """The ExportSettings of DECODE (and `decode`'s changes), sources cut to MAX_INPUT,
  version 1."""
  return ExportSettings(model_dir, export_dir, dataclasses.replace(
      DECODE, max_input_length=MAX_INPUT, **decode), weights, version=1)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
  return tiny_model_dir


@pytest.fixture(scope="module")
def export_path(tiny_export):
  """conftest's shared export: DECODE and MAX_INPUT are its settings."""
  assert DECODE == DecodeConfig(**TINY_EXPORT_DECODE) and MAX_INPUT == TINY_EXPORT_MAX_INPUT
  return tiny_export[1]


def test_constrain_trees_refuses_a_translation_model(model_dir, tmp_path):
  """--constrain_trees on a model that is no parser: a clear error, nothing written."""
  from t2t_keras.errors import ExportError  # pylint: disable=import-outside-toplevel
  with pytest.raises(ExportError, match=r"--constrain_trees with --model_dir=.*parsing model"):
    export_from_settings(settings(model_dir, str(tmp_path / "export"), constrain_trees=True))
  assert not (tmp_path / "export").exists()


def eager_translations(model_dir, sentences, dtype=None):
  from t2t_keras.inference import translate  # pylint: disable=import-outside-toplevel
  loaded = loading.load(model_dir, dtype=dtype)
  config = dataclasses.replace(DECODE, max_input_length=MAX_INPUT)
  return translate.translate(decoding.make_decode_fn(loaded.model, config), loaded.tokenizer,
                             sentences, config, progress=False)


@pytest.mark.slow
def test_versioned_layout_with_vocab_asset(export_path):
  assert os.path.basename(export_path) == "1"
  assert os.path.exists(os.path.join(export_path, "saved_model.pb"))
  assert os.path.exists(os.path.join(export_path, "assets", "vocab.model"))


SERVE_SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops
sentences = np.array(json.loads(sys.argv[1]), object)
results = {}
for path in sys.argv[2:]:
  # As tensorflow_model_server does: a session, the signature's tensors by name.
  graph = tf.Graph()
  session = tf.compat.v1.Session(graph=graph)
  with graph.as_default():
    meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], path)
  signature = meta.signature_def["serving_default"]
  out = session.run({k: v.name for k, v in signature.outputs.items()},
                    {signature.inputs["inputs"].name: sentences})
  results[path] = {"outputs": [t.decode() for t in out["outputs"]],
                   "scores": out["scores"].tolist(),
                   "beams": [[t.decode() for t in row] for row in out["beams"]]}
assert not any(m.startswith("t2t_keras") for m in sys.modules), "t2t_keras was imported"
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def relative_model(tmp_path_factory):
  """(model dir, export) of a tiny model with --position_embedding=relative."""
  path = tmp_path_factory.mktemp("relative")
  model_dir = build_tiny_model_dir(str(path / "model"), seed=2,
                                   position_embedding="relative", max_relative_position=3)
  return model_dir, export_from_settings(settings(model_dir, str(path / "export")))


@pytest.fixture(scope="module")
def fresh_process(export_path, xla_export_path, relative_model):
  """{export path: what SERVE_SCRIPT served} for this file's exports, all in one process
  without t2t_keras (a process of its own proves nothing more per export)."""
  paths = [export_path, xla_export_path, relative_model[1]]
  env = dict(os.environ, PYTHONPATH="")
  result = subprocess.run([sys.executable, "-c", SERVE_SCRIPT, json.dumps(SENTENCES), *paths],
                          capture_output=True, text=True, env=env, cwd="/", timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def assert_served_equals_eager(model_dir, served):
  """The export's SENTENCES, as served by SERVE_SCRIPT, are eager decoding's (best,
  beams, scores)."""
  eager = eager_translations(model_dir, SENTENCES)
  assert served["outputs"] == [t.texts[0] for t in eager]
  assert served["beams"] == [t.texts for t in eager]
  np.testing.assert_allclose(served["scores"], [t.scores[0] for t in eager], rtol=1e-4,
                             atol=1e-5)


@pytest.mark.slow
def test_fresh_process_without_t2t_keras_equals_eager(model_dir, export_path, fresh_process):
  assert_served_equals_eager(model_dir, fresh_process[export_path])


@pytest.mark.slow
def test_relative_position_model_export_equals_eager(relative_model, fresh_process):
  """--position_embedding=relative: the export (each step's distances to the grown
  cache, in a session without t2t_keras) translates as eager decoding."""
  model_dir, path = relative_model
  assert_served_equals_eager(model_dir, fresh_process[path])


@pytest.fixture(scope="module")
def served(export_path):
  return SessionModel(export_path)


def _ids(export_path, sentences):
  vocab = tokenizer_lib.load_tokenizer(os.path.join(export_path, "assets", "vocab.model"))
  return [row.numpy().tolist() + [EOS_ID] for row in vocab.tokenize(tf.constant(sentences))], vocab


def test_ids_signature_matches_strings(export_path, served):
  rows, vocab = _ids(export_path, SENTENCES[:2])
  ids = tf.ragged.constant(rows).to_tensor().numpy()
  by_ids = served.run("translate_ids", input_ids=ids)
  by_text = served.run(inputs=np.array(SENTENCES[:2], object))
  np.testing.assert_array_equal(vocab.detokenize(by_ids["output_ids"][:, 0]).numpy(),
                                by_text["outputs"])


def test_served_step_reads_its_stored_weights(export_path):
  """The export stores the transposed output embedding and the fused self-attention
  kernels (`Transformer.store_step_weights`) and the served step reads those copies:
  zeroing the stored output kernel in the session changes every translation.
  (Mutation: `step_weights` ignoring the stored copies: the outputs stay.)"""
  session_model = SessionModel(export_path)
  handles = [op for op in session_model.graph.get_operations()
             if op.type == "VarHandleOp" and "step_output_kernel" in op.name]
  assert handles, sorted(op.name for op in session_model.graph.get_operations()
                         if op.type == "VarHandleOp")
  inputs = np.array(SENTENCES[:2], object)
  before = session_model.run(inputs=inputs)["outputs"]
  with session_model.graph.as_default():
    handle = handles[0].outputs[0]
    shape = session_model.session.run(tf.raw_ops.VariableShape(input=handle))
    session_model.session.run(tf.raw_ops.AssignVariableOp(
        resource=handle, value=tf.zeros(shape, tf.float32)))
  after = session_model.run(inputs=inputs)["outputs"]
  assert not np.array_equal(before, after), before


def test_served_search_attends_on_few_rows_by_elementwise_kernels(export_path):
  """The SavedModel's graph-mode search chooses its attention by size at each step
  (`DecodeConfig.attention_by_size`): a request of one sentence, as TF Serving runs it,
  attends by elementwise kernels (their softmax is a LogSoftmax, which nothing else of
  the search runs). (Mutation: the export's search without `attention_by_size`.)"""
  session_model = SessionModel(export_path)
  signature = session_model.signatures["serving_default"]
  metadata = tf.compat.v1.RunMetadata()
  session_model.session.run(
      [t.name for t in signature.outputs.values()],
      {signature.inputs["inputs"].name: np.array(SENTENCES[:1], object)},
      options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
      run_metadata=metadata)
  kinds = {node.timeline_label.partition(" = ")[2].partition("(")[0]
           for device in metadata.step_stats.dev_stats for node in device.node_stats}
  # (Beam search itself runs no LogSoftmax; a greedy export's search would.)
  assert "LogSoftmax" in kinds, sorted(kinds)


def test_both_searches_of_the_export_choose_attention_by_size(tiny_model_dir):
  """The graph-mode and the XLA search of an export choose attention by size; the
  decode command's config does not (its bytes do not depend on the batches).
  (Mutation: either search's config without it.)"""
  from t2t_keras.export import saved_model  # pylint: disable=import-outside-toplevel
  loaded = loading.load(tiny_model_dir)
  config = DecodeConfig(beam_size=2)
  translator = saved_model.Translator(loaded.model, loaded.tokenizer, config,
                                      jit_compile=True)
  assert translator.graph_config.attention_by_size
  assert translator.xla_config.attention_by_size
  assert not config.attention_by_size


def test_ids_rows_end_at_their_first_eos_whatever_the_padding(export_path, served):
  """TF Serving's batching pads int32 inputs with the tensor's first element: the
  short rows arrive followed by copies of a real token, and must translate as alone."""
  rows, _ = _ids(export_path, SENTENCES[:5])
  width = max(map(len, rows)) + 3
  filler = rows[0][0]
  assert filler not in (EOS_ID, PAD_ID)
  batched = np.array([row + [filler] * (width - len(row)) for row in rows], np.int32)
  together = served.run("translate_ids", input_ids=batched)
  for i, row in enumerate(rows):
    alone = served.run("translate_ids", input_ids=np.array([row], np.int32))
    np.testing.assert_array_equal(
        together["output_ids"][i, :, :alone["output_ids"].shape[2]], alone["output_ids"][0])
    assert not together["output_ids"][i, :, alone["output_ids"].shape[2]:].any()
    np.testing.assert_allclose(together["scores"][i], alone["scores"][0], rtol=1e-5,
                               atol=1e-5)


def test_long_ids_rows_are_cut_with_eos_like_strings(export_path, served):
  long_sentence = "x " * 40
  (row,), _ = _ids(export_path, [long_sentence])
  assert len(row) > MAX_INPUT
  for ids in (row, row[:-1]):  # with and without the client's EOS
    by_ids = served.run("translate_ids", input_ids=np.array([ids], np.int32))
    by_text = served.run(inputs=np.array([long_sentence], object))
    np.testing.assert_allclose(by_ids["scores"][0, 0], by_text["scores"][0], rtol=1e-5)


def graph_ops(export_path):
  """(op types used by any node, names of the graph's own functions)."""
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
  with open(os.path.join(export_path, "saved_model.pb"), "rb") as f:
    proto = saved_model_pb2.SavedModel.FromString(f.read())
  ops, functions = set(), set()
  for meta in proto.meta_graphs:
    ops.update(node.op for node in meta.graph_def.node)
    for function in meta.graph_def.library.function:
      functions.add(function.signature.name)
      ops.update(node.op for node in function.node_def)
  return ops, functions


def test_only_tensorflow_and_tensorflow_text_ops(export_path):
  import tensorflow_text  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from tensorflow.python.framework import op_def_registry  # pylint: disable=import-outside-toplevel
  ops, functions = graph_ops(export_path)
  assert any("Sentencepiece" in op for op in ops), sorted(ops)
  forbidden = {"PyFunc", "PyFuncStateless", "EagerPyFunc"} & ops
  assert not forbidden, f"python ops in the serving graph: {forbidden}"
  # A node may call one of the graph's own functions; every other op type must be
  # registered once tensorflow and tensorflow_text are imported.
  unknown = sorted(op for op in ops - functions if op_def_registry.get(op) is None)
  assert not unknown, f"ops registered by neither TensorFlow nor TensorFlow Text: {unknown}"


@pytest.mark.slow
def test_saved_model_cli_shows_and_runs(export_path):
  cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
  show = subprocess.run([cli, "show", "--dir", export_path, "--all"], capture_output=True,
                        text=True, timeout=300, check=False)
  assert show.returncode == 0, show.stderr[-2000:]
  assert "serving_default" in show.stdout and "translate_ids" in show.stdout
  # The stock CLI cannot run it (no TensorFlow Text ops); tools/saved_model_cli.py can.
  run = subprocess.run(
      [sys.executable, os.path.join(REPO_ROOT, "tools", "saved_model_cli.py"), "run",
       "--dir", export_path, "--tag_set", "serve", "--signature_def",
       "serving_default", "--input_exprs", "inputs=['a small dog', 'the man']"],
      capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-2000:]
  assert "outputs" in run.stdout and "scores" in run.stdout


@pytest.mark.parametrize("request_", [
    [""], ["w" * 5000], ["a man " * 800], [b"caf\xe9 \xff\xfe ok"], ["a dog"],
    ["the red dog sits"] * 256], ids=["empty", "5000_chars", "5000_chars_words",
                                       "invalid_utf8", "batch_1", "batch_256"])
def test_odd_requests(served, request_):
  out = served.run(inputs=np.array(request_, object))
  assert out["outputs"].shape == (len(request_),)
  assert np.all(np.isfinite(out["scores"]))
  for text in out["outputs"]:
    text.decode("utf-8")  # valid UTF-8 out, always
  if len(request_) == 256:  # identical inputs, identical outputs
    assert len(set(out["outputs"].tolist())) == 1


def test_empty_batch(served):
  out = served.run(inputs=np.array([], object))
  assert out["outputs"].shape == (0,)
  ids = served.run("translate_ids", input_ids=np.zeros([0, 3], np.int32))
  assert ids["output_ids"].shape[0] == 0


# The XLA export's rows in these tests: requests of up to XLA_ROWS rows are searched by
# XLA (fewer programs to compile than the default's, each compiled when the warm-up
# requests are replayed), larger ones, up to MAX_ROWS, in graph mode.
XLA_ROWS = 8  # the least power of two that holds SENTENCES
MAX_ROWS = 16


@pytest.fixture(scope="module")
def xla_export_path(model_dir, tmp_path_factory):
  """Written by the export command, as a user would: `--export_jit_compile` (its
  `main`, in this process: tests/inprocess.py)."""
  export_dir = str(tmp_path_factory.mktemp("xla_export"))
  result = inprocess.run(
      "export", f"--model_dir={model_dir}", f"--export_dir={export_dir}",
      "--export_version=1", "--export_jit_compile", f"--beam_size={DECODE.beam_size}",
      f"--alpha={DECODE.alpha}", f"--extra_decode_length={DECODE.extra_decode_length}",
      "--return_beams", f"--max_input_length={MAX_INPUT}", f"--max_request_rows={MAX_ROWS}",
      f"--export_xla_max_rows={XLA_ROWS}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "--xla_cpu_compilation_enabled=true" in result.stdout  # the server command
  assert (f"requests of up to {XLA_ROWS} rows are searched by XLA; requests of more than "
          f"{XLA_ROWS} rows are searched in graph mode") in result.stdout
  return os.path.join(export_dir, "1")


@pytest.fixture(scope="module")
def xla_served(xla_export_path):
  """The XLA export in one session for the tests of this file: XLA's compiled programs
  are cached per session, so the warm-up test's compilations serve the others."""
  return SessionModel(xla_export_path)


def _must_compile_functions(export_path):
  """Names of the SavedModel's functions marked for XLA (`_XlaMustCompile`)."""
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
  with open(os.path.join(export_path, "saved_model.pb"), "rb") as f:
    proto = saved_model_pb2.SavedModel.FromString(f.read())
  return {function.signature.name for meta in proto.meta_graphs
          for function in meta.graph_def.library.function
          if function.attr["_XlaMustCompile"].b}


@pytest.mark.slow
def test_xla_export_in_a_fresh_session_equals_eager(model_dir, xla_export_path, export_path,
                                                    fresh_process):
  """--export_jit_compile: the beam search is marked for XLA, and the export, loaded as
  TF Serving loads it in a process without t2t_keras, translates as eager decoding."""
  assert _must_compile_functions(xla_export_path)
  assert len(SENTENCES) <= XLA_ROWS  # one request
  assert not _must_compile_functions(export_path)
  assert_served_equals_eager(model_dir, fresh_process[xla_export_path])


def _loops_of_must_compile_functions(export_path):
  """{the number of while loops in each function marked for XLA}: the beam search's
  loops, one per batch size (`beam_search.HalvingBatch`)."""
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
  with open(os.path.join(export_path, "saved_model.pb"), "rb") as f:
    proto = saved_model_pb2.SavedModel.FromString(f.read())
  return {sum(node.op in ("While", "StatelessWhile") for node in function.node_def)
          for meta in proto.meta_graphs for function in meta.graph_def.library.function
          if function.attr["_XlaMustCompile"].b}


@pytest.mark.slow
def test_xla_export_carries_decode_xla_halvings(model_dir, xla_export_path, tmp_path):
  """--decode_xla_halvings: the XLA beam search's batch halves that many times, a loop
  per batch size, so the compiled programs of an export hold 1 + that many loops: the
  default's 2 (XLA_ROWS = 8 rows allow 3) in the module's export, 0 here. (The
  results are the same: beam_search_test and decoding_test compare them.)"""
  result = inprocess.run(
      "export", f"--model_dir={model_dir}", f"--export_dir={tmp_path}", "--export_version=1",
      "--export_jit_compile", f"--beam_size={DECODE.beam_size}",
      f"--max_input_length={MAX_INPUT}", f"--max_request_rows={MAX_ROWS}",
      f"--export_xla_max_rows={XLA_ROWS}", "--decode_xla_halvings=0")
  assert result.returncode == 0, result.stderr[-3000:]
  assert DecodeConfig().xla_halvings == 2
  assert _loops_of_must_compile_functions(xla_export_path) == {3}
  assert _loops_of_must_compile_functions(str(tmp_path / "1")) == {1}


@pytest.mark.slow
def test_xla_export_warmup_requests_compile_every_program(xla_export_path, xla_served):
  """The XLA export carries TF Serving's warm-up file: PredictionLog records of
  serving_default requests whose padded shapes (counted here with SentencePiece from
  the export's own vocabulary) are every program a request within the limits can
  need: power-of-two rows up to --export_xla_max_rows (8 here) x source widths 16 and 32
  (--max_input_length 24). Replayed as the server replays them, each is answered."""
  import sentencepiece  # pylint: disable=import-outside-toplevel
  from tensorflow_serving.apis import prediction_log_pb2  # pylint: disable=import-outside-toplevel
  path = os.path.join(xla_export_path, "assets.extra", "tf_serving_warmup_requests")
  requests = []
  for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
    request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
    assert request.model_spec.signature_name == "serving_default"
    assert list(request.inputs) == ["inputs"]
    requests.append(tf.make_ndarray(request.inputs["inputs"]))
  spm = sentencepiece.SentencePieceProcessor(
      model_file=os.path.join(xla_export_path, "assets", "vocab.model"))

  def power_of_two(n, least):
    return max(least, 1 << (n - 1).bit_length())
  shapes = set()
  for strings in requests:
    width = max(min(len(spm.encode(s.decode())) + 1, MAX_INPUT) for s in strings)
    shapes.add((power_of_two(len(strings), 1), power_of_two(width, 16)))
  assert len(shapes) == len(requests)
  assert shapes == {(1 << r, w) for r in range(XLA_ROWS.bit_length()) for w in (16, 32)}
  for strings in requests:
    assert xla_served.run(inputs=strings)["outputs"].shape == (len(strings),)


@pytest.mark.slow
def test_xla_export_ids_rows_translate_as_alone(xla_served, served, export_path):
  """The XLA export pads each batch to a power of two rows and columns: any batch
  size (3 rows, 1 row, none) and width gives the graph export's ids and scores; a
  request of more than --export_xla_max_rows rows (12) is searched in graph mode, with
  the same results."""
  xla, graph = xla_served, served
  rows, _ = _ids(export_path, SENTENCES[:3])
  ids = tf.ragged.constant(rows).to_tensor().numpy()
  large = np.tile(ids, (4, 1))
  for batch in (ids, ids[:1], ids[:0], large):
    by_xla = xla.run("translate_ids", input_ids=batch)
    by_graph = graph.run("translate_ids", input_ids=batch)
    assert by_xla["output_ids"].shape[0] == len(batch)
    width = by_graph["output_ids"].shape[2]
    np.testing.assert_array_equal(by_xla["output_ids"][:, :, :width], by_graph["output_ids"])
    assert not by_xla["output_ids"][:, :, width:].any()
    np.testing.assert_allclose(by_xla["scores"], by_graph["scores"], rtol=1e-4, atol=1e-5)
    if len(batch) > 1:  # XLA's fixed output width, or graph mode's own
      assert (by_xla["output_ids"].shape[2] == width) == (len(batch) > XLA_ROWS), (
          len(batch), by_xla["output_ids"].shape, width)


@pytest.mark.slow
def test_xla_export_refuses_too_many_rows_before_compiling(xla_served):
  """The row limit holds in the XLA export too: 20,000 rows would otherwise be padded
  to 32,768 and compiled; refused, the session then answers a normal request."""
  xla = xla_served
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"request of 20000 rows: this export takes at most {MAX_ROWS} rows"):
    xla.run(inputs=np.array(["a dog"] * 20000, object))
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"request of 20000 rows"):
    xla.run("translate_ids", input_ids=np.full([20000, 2], EOS_ID, np.int32))
  out = xla.run(inputs=np.array(["a dog"], object))
  assert out["outputs"].shape == (1,)


@pytest.mark.slow
def test_decode_dtype_is_carried_into_the_export(model_dir, tmp_path):
  """--decode_dtype: the export computes in that dtype, as `decode --decode_dtype` does:
  it equals eager decoding in bfloat16, whose scores are not float32's."""
  from t2t_keras import export  # pylint: disable=import-outside-toplevel
  bfloat16 = settings(model_dir, str(tmp_path), WeightsConfig(dtype="bfloat16"))
  out = SessionModel(export.SAVED_MODEL.export(bfloat16)).run(
      inputs=np.array(SENTENCES, object))
  eager = eager_translations(model_dir, SENTENCES, dtype="bfloat16")
  assert [t.decode() for t in out["outputs"]] == [t.texts[0] for t in eager]
  np.testing.assert_allclose(out["scores"], [t.scores[0] for t in eager], rtol=1e-3,
                             atol=1e-3)
  float32 = [t.scores[0] for t in eager_translations(model_dir, SENTENCES)]
  assert not np.allclose(out["scores"], float32, rtol=1e-5, atol=1e-5)


def test_an_unknown_decode_dtype_is_refused_naming_the_flag(model_dir, tmp_path):
  from t2t_keras.errors import ExportError  # pylint: disable=import-outside-toplevel
  with pytest.raises(ExportError, match=r"--decode_dtype=float64 .*float32, bfloat16"):
    export_from_settings(settings(model_dir, str(tmp_path / "export"),
                                  WeightsConfig(dtype="float64")))
  assert not (tmp_path / "export").exists()


def test_prefix_signature_translates_as_the_decode_path(model_dir, export_path, served):
  """translate_with_prefix, run as TF Serving runs it (session, tensors by name): each
  output starts with its prefix, equals eager `translate` with the same prefixes, an
  empty prefix gives serving_default's output, and a row count mismatch is refused."""
  from t2t_keras.inference import translate  # pylint: disable=import-outside-toplevel
  sentences = SENTENCES[:4]
  prefixes = ["der Mann", "", "Hund", ""]  # words of the tiny vocabulary
  out = served.run("translate_with_prefix", inputs=np.array(sentences, object),
                   target_prefix=np.array(prefixes, object))
  texts = [t.decode() for t in out["outputs"]]
  loaded = loading.load(model_dir)
  config = dataclasses.replace(DECODE, max_input_length=MAX_INPUT)
  eager = translate.translate(decoding.make_decode_fn(loaded.model, config), loaded.tokenizer,
                              sentences, config, progress=False, target_prefixes=prefixes)
  assert texts == [t.texts[0] for t in eager]
  np.testing.assert_allclose(out["scores"], [t.scores[0] for t in eager], rtol=1e-4,
                             atol=1e-5)
  assert texts[0].startswith("der Mann") and texts[2].startswith("Hund"), texts
  free = served.run(inputs=np.array(sentences, object))["outputs"]
  assert texts[1] == free[1].decode() and texts[3] == free[3].decode()
  with pytest.raises(tf.errors.InvalidArgumentError, match="2 inputs but 1 target_prefix"):
    served.run("translate_with_prefix", inputs=np.array(sentences[:2], object),
               target_prefix=np.array([""], object))


def test_a_request_decodes_its_own_rows_only(tiny_model_dir, monkeypatch):
  """An empty sentence rode along with every request (so that an empty request needed
  no graph of its own); the minimum length kept it from ending at once, so in a weak
  model it ran to its length limit and the whole search with it. Now a request of B
  rows decodes B rows, and an empty request one stand-in row, in every signature."""
  from t2t_keras.trained import modeldir  # pylint: disable=import-outside-toplevel
  from t2t_keras.export import saved_model  # pylint: disable=import-outside-toplevel
  loaded = loading.load(tiny_model_dir)
  translator = saved_model.Translator(
      loaded.model, loaded.tokenizer, DecodeConfig(beam_size=2, extra_decode_length=3,
                                                   max_input_length=24),
      vocab_file=modeldir.vocab_path(tiny_model_dir))
  rows, search = [], saved_model.Translator._search  # pylint: disable=protected-access

  def counting(self, ids, **options):
    rows.append(int(tf.shape(ids)[0]))
    return search(self, ids, **options)
  monkeypatch.setattr(saved_model.Translator, "_search", counting)
  for sentences in (["a the man", "dog runs in the park"], ["red"], []):
    out = translator._serve(tf.constant(sentences, tf.string))  # pylint: disable=protected-access
    assert out["outputs"].shape == (len(sentences),)
    ids = tf.constant([[5, 6, EOS_ID]] * len(sentences), tf.int32, shape=[len(sentences), 3])
    out = translator._translate_ids(ids)  # pylint: disable=protected-access
    assert out["output_ids"].shape[0] == len(sentences)
    prefixes = tf.constant([""] * len(sentences), tf.string)
    out = translator._serve_with_prefix(tf.constant(sentences, tf.string), prefixes)  # pylint: disable=protected-access
    assert out["outputs"].shape == (len(sentences),)
  # Graph mode searches a request as two halves (`_decode_in_halves`): their rows add up
  # to the request's, or to the one stand-in row of an empty request.
  assert [rows[i] + rows[i + 1] for i in range(0, len(rows), 2)] == [2, 2, 2, 1, 1, 1, 1, 1,
                                                                      1], rows
  assert rows[:2] == [1, 1] and rows[6:8] == [1, 0], rows
  # Every half of every signature called one search function per set of options, each
  # traced once (the SavedModel holds it once).
  traces = {names: search.experimental_get_tracing_count()
            for names, search in translator._searches.functions.items()}  # pylint: disable=protected-access
  assert traces == {(): 1, ("target_prefix",): 1}, traces


def test_the_two_halves_of_a_request_translate_as_one_search(tiny_model_dir):
  """A request's rows, in no particular length order, searched as two halves in length
  order (graph mode) and put back in request order: ids and scores those of one search
  over all rows."""
  from t2t_keras.trained import modeldir  # pylint: disable=import-outside-toplevel
  from t2t_keras.export import saved_model  # pylint: disable=import-outside-toplevel
  loaded = loading.load(tiny_model_dir)
  config = DecodeConfig(beam_size=3, extra_decode_length=4, max_input_length=24)
  translator = saved_model.Translator(loaded.model, loaded.tokenizer, config,
                                      vocab_file=modeldir.vocab_path(tiny_model_dir))
  rng = np.random.default_rng(5)
  lengths = [7, 2, 9, 4, 1, 6, 3]
  ids = np.zeros([len(lengths), 10], np.int32)
  for row, n in enumerate(lengths):
    ids[row, :n] = rng.integers(3, loaded.model_config.vocab_size, n)
    ids[row, n] = EOS_ID
  out = translator._translate_ids(tf.constant(ids))  # pylint: disable=protected-access
  expected_ids, expected_scores = decoding.decode_ids(loaded.model, tf.constant(ids), config)
  got = out["output_ids"].numpy()[:, 0]
  want = expected_ids.numpy()[:, 0]
  width = max(got.shape[1], want.shape[1])
  np.testing.assert_array_equal(np.pad(got, [[0, 0], [0, width - got.shape[1]]]),
                                np.pad(want, [[0, 0], [0, width - want.shape[1]]]))
  np.testing.assert_allclose(out["scores"].numpy()[:, 0], expected_scores.numpy()[:, 0],
                             atol=1e-5)
