"""tools/query_serving.py against in-process stand-ins for TensorFlow Serving.

No tensorflow_model_server binary here, so this module serves the exported
SavedModel the way the server does: the highest version under the model base path,
REST `POST /v1/models/<name>[/versions/<v>]:predict` with the row ("instances" ->
"predictions") and columnar ("inputs" -> "outputs") JSON formats and errors as
{"error": ...} with HTTP 400/404, and gRPC PredictionService.Predict from
tensorflow-serving-api with TF Serving's status codes. The client, run as a
subprocess, must print what calling the signature directly gives.
"""
# pylint: disable=redefined-outer-name  (pytest fixtures)

import base64
import contextlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from unittest import mock
from concurrent import futures

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  pylint: disable=unused-import  (SentencePiece ops)

from t2t_keras.configs import DecodeConfig
from tests import inprocess
from tests.conftest import REPO_ROOT, TINY_EXPORT_DECODE, SessionModel

grpc = pytest.importorskip("grpc")
pytest.importorskip("tensorflow_serving.apis", reason="pip install -e '.[test]'")
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

TOOL = os.path.join(REPO_ROOT, "tools", "query_serving.py")
MODEL_NAME = "transformer"
DECODE = DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=5, return_beams=True)
SENTENCES = ["a small dog runs on the grass .", "Zwei Männer spielen Fußball.", "",
             "the man is smiling", "über"]


class StatusError(Exception):
  """A TF Serving error: its canonical code, as an HTTP status and a gRPC code."""

  HTTP = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400}

  def __init__(self, code: str, message: str):
    super().__init__(message)
    self.code, self.message = code, message
    self.http_status = self.HTTP[code]
    self.grpc_code = getattr(grpc.StatusCode, code)


def invalid(message: str) -> StatusError:
  return StatusError("INVALID_ARGUMENT", message)


class Servable:
  """The highest version under a model base path, as tensorflow_model_server loads it:
  into a session, signature tensors fed and fetched by name (conftest.SessionModel)."""

  def __init__(self, name: str, base_path: str):
    self.name = name
    self.version = max(int(d) for d in os.listdir(base_path) if d.isdigit())
    self.loaded = SessionModel(os.path.join(base_path, str(self.version)))
    self._lock = threading.Lock()

  def check_spec(self, name: str, version=None):
    if name != self.name or version not in (None, self.version):
      request = f"Specific({name}, {version})" if version else f"Latest({name})"
      raise StatusError("NOT_FOUND", f"Servable not found for request: {request}")

  def signature(self, signature_name: str):
    """The SignatureDef (inputs and outputs are TensorInfos keyed by name)."""
    signature_name = signature_name or "serving_default"
    if signature_name not in self.loaded.signatures:
      raise invalid(f'Serving signature name: "{signature_name}" not '
                    "found in signature def")
    return self.loaded.signatures[signature_name]

  def run(self, signature_name: str, inputs: dict) -> dict:
    """Named inputs (nested lists or arrays) -> named numpy outputs."""
    specs = self.signature(signature_name).inputs
    if set(inputs) != set(specs):
      raise invalid("input size does not match signature: "
                    f"{len(inputs)}!={len(specs)} len({sorted(inputs)}) != "
                    f"len({sorted(specs)}). Sent extra: {sorted(set(inputs) - set(specs))}. "
                    f"Missing but required: {sorted(set(specs) - set(inputs))}.")
    try:
      arrays = {k: np.asarray(v, dtype=tf.as_dtype(specs[k].dtype).as_numpy_dtype)
                for k, v in inputs.items()}
      with self._lock:
        return self.loaded.run(signature_name or "serving_default", **arrays)
    except (TypeError, ValueError, tf.errors.OpError) as error:
      raise invalid(str(getattr(error, "message", error))) from None


def _from_json(value):
  """JSON value -> tensor value: strings as bytes, {"b64": ...} decoded."""
  if _is_b64(value):
    return base64.b64decode(value["b64"])
  if isinstance(value, list):
    return [_from_json(v) for v in value]
  return value.encode("utf-8") if isinstance(value, str) else value


def _is_b64(value) -> bool:
  return isinstance(value, dict) and list(value) == ["b64"] and isinstance(value["b64"], str)


def _float_json(value: float) -> float:
  """A float32 as TF Serving writes it: 6 significant digits, 9 if 6 do not round-trip."""
  if not np.isfinite(value):
    return float(value)  # json writes NaN / Infinity, as TF Serving does
  text = f"{value:g}"
  return float(text if np.float32(text) == value else f"{value:.9g}")


def _to_json(name: str, array: np.ndarray):
  """numpy -> JSON value: bytes as text (base64 objects for names ending `_bytes`)."""
  if array.dtype == object:
    if name.endswith("_bytes"):
      encode = lambda b: {"b64": base64.b64encode(b).decode()}  # noqa: E731
    else:
      encode = lambda b: b.decode("utf-8", errors="replace")  # noqa: E731
    return np.frompyfunc(encode, 1, 1)(array).tolist()
  if array.dtype == np.float32:
    return np.frompyfunc(_float_json, 1, 1)(array).tolist()
  return array.tolist()


def rest_predict(servable: Servable, body: dict) -> dict:
  """The body of TF Serving's reply to a :predict request (row or columnar format)."""
  signature_name = body.get("signature_name", "")
  input_names = sorted(servable.signature(signature_name).inputs)
  if "instances" in body and "inputs" in body:
    raise invalid("Not formatted correctly expecting only one of "
                  "'inputs' or 'instances' keys to exist")
  if "inputs" in body:  # columnar: one tensor, or {name: tensor} for several inputs
    columns = body["inputs"]
    if not isinstance(columns, dict) or _is_b64(columns):
      if len(input_names) > 1:
        raise invalid("inputs is a plain value/list, but expecting an "
                      "object as multiple input tensors required as per tensorinfo_map")
      columns = {input_names[0]: columns}
    for name in input_names:
      if name not in columns:
        raise invalid(f"Missing named input: {name} in 'inputs' object.")
    outputs = servable.run(signature_name, {k: _from_json(v) for k, v in columns.items()})
    named = {k: _to_json(k, v) for k, v in outputs.items()}
    return {"outputs": next(iter(named.values())) if len(named) == 1 else named}
  if "instances" not in body:
    raise invalid("Missing 'inputs' or 'instances' key")
  instances = body["instances"]
  if not isinstance(instances, list) or not instances:
    raise invalid("Expecting 'instances' to be a non-empty list/array")
  if isinstance(instances[0], dict) and not _is_b64(instances[0]):  # named inputs
    for i, instance in enumerate(instances):
      if not isinstance(instance, dict) or sorted(instance) != input_names:
        raise invalid(f"Failed to process element: {i} of 'instances' "
                      f"list. JSON object: {json.dumps(instance)} keys must be equal to: "
                      f"{','.join(input_names)}")
    inputs = {k: [_from_json(i[k]) for i in instances] for k in input_names}
  elif len(input_names) > 1:
    raise invalid("instances is a plain list, but expecting list of "
                  "objects as multiple input tensors required as per tensorinfo_map")
  else:
    inputs = {input_names[0]: _from_json(instances)}
  outputs = servable.run(signature_name, inputs)
  for name, array in outputs.items():  # every output must be batched like the input
    if array.ndim == 0:
      raise invalid(f"Tensor name: {name} has no shape information ")
    if array.shape[0] != len(instances):
      raise invalid(f"Tensor name: {name} has inconsistent batch size: "
                    f"{array.shape[0]} expecting: {len(instances)}")
  rows = {k: _to_json(k, v) for k, v in outputs.items()}
  if len(rows) == 1:
    return {"predictions": next(iter(rows.values()))}
  return {"predictions": [{k: rows[k][i] for k in rows} for i in range(len(instances))]}


class RestHandler(http.server.BaseHTTPRequestHandler):
  """TF Serving's REST predict endpoint over `self.server.servable`."""

  PATH = re.compile(r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict")

  def do_POST(self):  # noqa: N802  (http.server's name)
    try:
      match = self.PATH.fullmatch(self.path)
      if not match:
        raise invalid(f"Malformed request: POST {self.path}")
      version = match["version"] and int(match["version"])
      self.server.servable.check_spec(match["name"], version)
      length = int(self.headers.get("Content-Length", 0))
      try:
        body = json.loads(self.rfile.read(length))
      except ValueError as error:
        raise invalid(f"JSON Parse error: {error}") from None
      if not isinstance(body, dict):
        raise invalid("JSON Value: is not an object")
      status, reply = 200, rest_predict(self.server.servable, body)
    except StatusError as error:
      status, reply = error.http_status, {"error": error.message}
    data = json.dumps(reply).encode()
    self.send_response(status)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args  # quiet test output


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
  """TF Serving's gRPC PredictionService.Predict over a Servable."""

  def __init__(self, servable: Servable):
    self.servable = servable

  def Predict(self, request, context):  # noqa: N802  (the proto's name)
    spec = request.model_spec
    try:
      self.servable.check_spec(spec.name,
                               spec.version.value if spec.HasField("version") else None)
      inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
      outputs = self.servable.run(spec.signature_name, inputs)
      unknown = set(request.output_filter) - set(outputs)
      if unknown:
        raise invalid(f"output tensor alias not found in signature: "
                      f"{sorted(unknown)}")
    except StatusError as error:
      context.abort(error.grpc_code, error.message)
    reply = predict_pb2.PredictResponse()
    reply.model_spec.name = self.servable.name
    reply.model_spec.version.value = self.servable.version
    reply.model_spec.signature_name = spec.signature_name or "serving_default"
    for name, array in outputs.items():
      if not request.output_filter or name in request.output_filter:
        reply.outputs[name].CopyFrom(tf.make_tensor_proto(array))
    return reply


@pytest.fixture(scope="module")
def export_base(tiny_export):
  """A model base path holding version 1 (TF Serving's layout) of conftest's model:
  conftest's shared export, whose settings DECODE repeats."""
  assert DECODE == DecodeConfig(**TINY_EXPORT_DECODE)
  return tiny_export[0]


@pytest.fixture(scope="module")
def servable(export_base):
  return Servable(MODEL_NAME, export_base)


@pytest.fixture(scope="module")
def rest_server(servable):
  """host:port of the REST stand-in."""
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RestHandler)
  httpd.servable = servable
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  yield f"127.0.0.1:{httpd.server_address[1]}"
  httpd.shutdown()
  httpd.server_close()
  thread.join()


@pytest.fixture(scope="module")
def grpc_server(servable):
  """host:port of the gRPC stand-in."""
  server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
  prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
      PredictionServicer(servable), server)
  port = server.add_insecure_port("127.0.0.1:0")
  server.start()
  yield f"127.0.0.1:{port}"
  server.stop(grace=None)


@contextlib.contextmanager
def unused_port():
  """A port nobody listens on, for the `with` block: bound by the test and not
  listening, so connections are refused and no other process (a server of another
  test) can take it meanwhile, as it could once a released port is reused."""
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]


def query(*args, process=False):
  """t2t-query-server ARGS (tools/query_serving.py): its main in this process
  (tests/inprocess.py), or with `process` a process as a user starts it; returns the
  CompletedProcess. Proxies are left out: the stand-ins listen on 127.0.0.1."""
  env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
  if not process:
    with mock.patch.dict(os.environ, env, clear=True):
      return inprocess.run("query_serving", "--timeout=120", *args)
  env["PYTHONIOENCODING"] = "utf-8"
  return subprocess.run([sys.executable, TOOL, "--timeout=120", *args], capture_output=True,
                        text=True, encoding="utf-8", env=env, cwd=REPO_ROOT, timeout=300,
                        check=False)


def rest_post(server: str, body: dict, model: str = MODEL_NAME):
  """(HTTP status, JSON reply) of a raw :predict request, bypassing any proxy."""
  opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
  request = urllib.request.Request(f"http://{server}/v1/models/{model}:predict",
                                   data=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json"})
  try:
    with opener.open(request, timeout=120) as response:
      return response.status, json.load(response)
  except urllib.error.HTTPError as error:
    return error.code, json.load(error)


def direct(servable, sentences):
  """(translation, score) per sentence from the serving_default signature itself."""
  out = servable.loaded.run(inputs=np.array([s.encode() for s in sentences], object))
  return [(t.decode("utf-8"), float(s)) for t, s in zip(out["outputs"], out["scores"])]


def assert_printed(stdout, expected):
  lines = stdout.split("\n")[:-1]  # one line per sentence, each ending with \n
  assert len(lines) == len(expected), stdout
  for line, (text, score) in zip(lines, expected):
    printed_score, printed_text = line.split("\t", 1)
    assert printed_text == text
    assert abs(float(printed_score) - score) <= 1e-4, (line, score)


@pytest.mark.slow
def test_rest_prints_the_signatures_translations(servable, rest_server):
  result = query("--protocol=rest", f"--server={rest_server}", "--batch_size=2", *SENTENCES,
                 process=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert_printed(result.stdout, direct(servable, SENTENCES))


def test_grpc_prints_the_signatures_translations(servable, grpc_server, tmp_path):
  source = tmp_path / "src.txt"
  source.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
  result = query("--protocol=grpc", f"--server={grpc_server}", f"--input_file={source}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert_printed(result.stdout, direct(servable, SENTENCES))


def test_rest_row_format_carries_every_output(servable, rest_server):
  """The body BUILD.md documents: one object per sentence, beams as lists of K."""
  status, reply = rest_post(rest_server, {"instances": SENTENCES[:2]})
  assert status == 200, reply
  predictions = reply["predictions"]
  assert [sorted(p) for p in predictions] == [["beam_scores", "beams", "outputs",
                                               "scores"]] * 2
  assert [len(p["beams"]) for p in predictions] == [DECODE.beam_size] * 2
  assert [p["outputs"] for p in predictions] == [t for t, _ in direct(servable,
                                                                      SENTENCES[:2])]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_unreachable_server_is_a_clear_error(protocol):
  with unused_port() as port:
    server = f"127.0.0.1:{port}"
    result = query(f"--protocol={protocol}", f"--server={server}", "a dog")
  assert result.returncode == 1, result.stderr[-3000:]
  assert result.stdout == ""
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: cannot reach {'http://' if protocol == 'rest' else ''}"
                         f"{server}"), result.stderr[-3000:]
  assert "Traceback" not in result.stderr


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_wrong_model_name_is_a_clear_error(protocol, rest_server, grpc_server):
  server = rest_server if protocol == "rest" else grpc_server
  result = query(f"--protocol={protocol}", f"--server={server}", "--model_name=nosuch",
                 "a dog")
  assert result.returncode == 1, result.stderr[-3000:]
  assert result.stdout == ""
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: "), result.stderr[-3000:]
  assert "Servable not found for request: Latest(nosuch)" in last
  assert "--model_name" in last
  assert ("HTTP 404" if protocol == "rest" else "NOT_FOUND") in last


def test_wrong_signature_is_a_clear_error(rest_server):
  result = query("--protocol=rest", f"--server={rest_server}", "--signature_name=nosuch",
                 "a dog")
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "HTTP 400" in last, result.stderr[-3000:]
  assert 'Serving signature name: "nosuch" not found' in last


class FakeReplyHandler(http.server.BaseHTTPRequestHandler):
  """Answers every :predict with `self.server.reply` (bytes), as a broken or hostile
  server might."""

  def do_POST(self):  # noqa: N802  (http.server's name)
    self.rfile.read(int(self.headers.get("Content-Length", 0)))
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(self.server.reply)))
    self.end_headers()
    self.wfile.write(self.server.reply)

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args


@pytest.mark.parametrize("reply, args, message", [
    ({"predictions": [{"outputs": "ein Hund", "scores": "high"}]}, [],
     "sent a score that is not a number for sentence 1: 'high'"),
    ({"predictions": [{"outputs": "ein Hund", "scores": None}]}, [],
     "sent a score that is not a number for sentence 1: 'None'"),
    ({"predictions": [{"outputs": ["x"], "scores": 1.0}]}, [],
     "sent a translation that is not text for sentence 1"),
    ({"predictions": [{"outputs": "x" * 3000, "scores": 1.0}]}, ["--max_reply_bytes=2000"],
     "sent a reply of more than --max_reply_bytes=2000 bytes"),
], ids=["text_score", "null_score", "list_output", "too_long"])
def test_odd_replies_are_clear_errors(reply, args, message):
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeReplyHandler)
  httpd.reply = json.dumps(reply).encode()
  thread = threading.Thread(target=httpd.serve_forever, daemon=True)
  thread.start()
  try:
    result = query("--protocol=rest", f"--server=127.0.0.1:{httpd.server_address[1]}",
                   *args, "a dog")
  finally:
    httpd.shutdown()
    httpd.server_close()
    thread.join()
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert result.stdout == ""
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and message in last, last
