r"""Sends sentences to a running TensorFlow Serving and prints the translations.

  # REST (port 8501): POST /v1/models/<name>:predict {"instances": [...]}
  python tools/query_serving.py --server=localhost:8501 --model_name=transformer \
      "A man is riding a bike." "Two dogs play in the snow."
  # gRPC (port 8500), needs tensorflow-serving-api (the [tensorflow] extra)
  python tools/query_serving.py --protocol=grpc --server=localhost:8500 ...
  # sentences from a file (one per line) instead of arguments
  python tools/query_serving.py --input_file=src.txt

Prints one line per sentence: `<score>\t<translation>`. Sentences that start with
`-` go after `--` (otherwise they are read as flags). On any failure (server down,
unknown model or signature, a reply that is not what serving_default sends, or one
longer than `--max_reply_bytes`) prints `error: ...` and exits with code 1.

The REST client needs only the standard library; the gRPC client imports TensorFlow
(for the tensor protos of tensorflow-serving-api), which takes a few seconds.

After `pip install`, `t2t-query-server` is this tool (same flags).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import List, Tuple

from absl import app
from absl import flags

from t2t_keras import console

DEFAULT_PORTS = {"rest": 8501, "grpc": 8500}  # tensorflow_model_server's usual ports

flags.DEFINE_string("server", None, "host:port of tensorflow_model_server (default "
                    "localhost:8501 for REST, localhost:8500 for gRPC).")
flags.DEFINE_string("model_name", "transformer", "--model_name given to the server.")
flags.DEFINE_enum("protocol", "rest", ["rest", "grpc"], "How to talk to the server.")
flags.DEFINE_string("signature_name", "serving_default",
                    "Signature to call; it must take `inputs` (strings) and return "
                    "`outputs` and `scores`, as serving_default does.")
flags.DEFINE_string("input_file", None, "Sentences, one per line (instead of arguments).")
flags.DEFINE_integer("batch_size", 64, "Sentences per request.", lower_bound=1)
flags.DEFINE_float("timeout", 300.0, "Seconds to wait for one request.")
flags.DEFINE_integer("max_reply_bytes", 64 << 20, "Longest reply read from the server "
                     "(bytes); a longer one is an error, not read into memory.",
                     lower_bound=1)
flags.register_validator("timeout", lambda v: v > 0, message="--timeout must be > 0 seconds.")
FLAGS = flags.FLAGS


class ServingError(RuntimeError):
  """The server could not be reached, refused the request or replied oddly."""


def _missing_outputs(signature: str, keys) -> ServingError:
  return ServingError(f"signature {signature!r} returned {sorted(keys)}, not `outputs` and "
                      "`scores`: query serving_default (or a signature shaped like it).")


def _read_limited(stream, limit: int, what: str) -> bytes:
  """At most `limit` bytes of `stream`; ServingError if it holds more."""
  data = stream.read(limit + 1)
  if len(data) > limit:
    raise ServingError(f"{what} sent a reply of more than --max_reply_bytes={limit} bytes; "
                       "send fewer sentences per request (--batch_size) or raise the limit.")
  return data


def _pairs(where: str, outputs, scores) -> List[Tuple[str, float]]:
  """(translation, score) pairs, or a ServingError naming what is not text / a number."""
  pairs = []
  for i, (text, score) in enumerate(zip(outputs, scores)):
    if isinstance(text, bytes):
      text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
      raise ServingError(f"{where} sent a translation that is not text for sentence "
                         f"{i + 1}: {str(text)[:200]!r}")
    try:
      if isinstance(score, (bool, str, bytes)):
        raise TypeError
      pairs.append((text, float(score)))
    except (TypeError, ValueError):
      raise ServingError(f"{where} sent a score that is not a number for sentence "
                         f"{i + 1}: {str(score)[:200]!r}") from None
  return pairs


def rest_predict(server: str, model: str, sentences: List[str], signature: str,
                 timeout: float, max_reply_bytes: int = 64 << 20) -> List[Tuple[str, float]]:
  """POSTs {"signature_name", "instances"} to /v1/models/<model>:predict.

  Args:
    server: host:port of the REST API (--rest_api_port).
    model: the served model's name.
    sentences: the source sentences (one request).
    signature: the signature to call.
    timeout: seconds to wait for the reply.
    max_reply_bytes: the longest reply read.

  Returns:
    (translation, score) per sentence.

  Raises:
    ServingError: with the server's own error message where it sent one.
  """
  url = f"http://{server}/v1/models/{model}:predict"
  body = json.dumps({"signature_name": signature, "instances": sentences}).encode()
  request = urllib.request.Request(url, data=body,
                                   headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response:
      text = _read_limited(response, max_reply_bytes, url).decode("utf-8", errors="replace")
  except urllib.error.HTTPError as error:
    # TF Serving answers {"error": "..."} with 404 (unknown model/version) or 400.
    detail = error.read(max_reply_bytes).decode("utf-8", errors="replace")
    try:
      detail = json.loads(detail)["error"]
    except (ValueError, KeyError, TypeError):
      detail = detail[:500]
    hint = " (is --model_name the server's --model_name?)" if error.code == 404 else ""
    raise ServingError(f"{url} answered HTTP {error.code}: {detail}{hint}") from None
  except TimeoutError:
    raise ServingError(f"{url} gave no reply within --timeout={timeout:g} s") from None
  except (urllib.error.URLError, OSError) as error:
    reason = getattr(error, "reason", error)
    raise ServingError(f"cannot reach {url} ({reason}); is tensorflow_model_server running "
                       "there with --rest_api_port?") from None
  try:
    rows = json.loads(text)["predictions"]
  except (ValueError, KeyError, TypeError):
    rows = None
  if not isinstance(rows, list) or len(rows) != len(sentences):
    raise ServingError(f"{url} sent an unexpected reply for {len(sentences)} sentence(s): "
                       f"{text[:500]}")
  if not all(isinstance(row, dict) and {"outputs", "scores"} <= row.keys() for row in rows):
    raise _missing_outputs(signature, rows[0].keys() if isinstance(rows[0], dict) else [])
  return _pairs(url, [row["outputs"] for row in rows], [row["scores"] for row in rows])


class GrpcClient:
  """PredictionService.Predict over one channel, with a string tensor `inputs`."""

  def __init__(self, server: str, model: str, signature: str, timeout: float,
               max_reply_bytes: int = 64 << 20):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no C++ start-up logs
    try:
      # pylint: disable=import-outside-toplevel
      import grpc
      import tensorflow as tf
      from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    except ImportError:
      raise ServingError("gRPC needs tensorflow-serving-api of TensorFlow's release line: "
                         "pip install 't2t_keras[tensorflow]' (BUILD.md: --no-deps on a "
                         "TPU VM)") \
          from None
    self._grpc, self._tf, self._predict_pb2 = grpc, tf, predict_pb2
    self.server, self.model, self.signature, self.timeout = server, model, signature, timeout
    self.max_reply_bytes = max_reply_bytes
    self._channel = grpc.insecure_channel(
        server, options=[("grpc.max_receive_message_length", max_reply_bytes)])
    self._stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)

  def close(self):
    self._channel.close()

  def predict(self, sentences: List[str]) -> List[Tuple[str, float]]:
    """(translation, score) per sentence; raises ServingError."""
    tf, grpc = self._tf, self._grpc
    request = self._predict_pb2.PredictRequest()
    request.model_spec.name = self.model
    request.model_spec.signature_name = self.signature
    request.inputs["inputs"].CopyFrom(tf.make_tensor_proto(sentences, dtype=tf.string))
    try:
      reply = self._stub.Predict(request, timeout=self.timeout)
    except grpc.RpcError as error:
      code, details = error.code(), error.details()
      if code == grpc.StatusCode.UNAVAILABLE:
        raise ServingError(f"cannot reach {self.server} over gRPC ({details}); is "
                           "tensorflow_model_server running there with --port?") from None
      if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        raise ServingError(f"{self.server} sent a reply of more than --max_reply_bytes="
                           f"{self.max_reply_bytes} bytes ({details}); send "
                           "fewer sentences per request (--batch_size) or raise the "
                           "limit.") from None
      if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        raise ServingError(f"{self.server} gave no reply within "
                           f"--timeout={self.timeout:g} s") from None
      hint = (" (is --model_name the server's --model_name?)"
              if code == grpc.StatusCode.NOT_FOUND else "")
      raise ServingError(f"{self.server} answered {code.name}: {details}{hint}") from None
    if "outputs" not in reply.outputs or "scores" not in reply.outputs:
      raise _missing_outputs(self.signature, reply.outputs.keys())
    try:
      outputs = tf.make_ndarray(reply.outputs["outputs"])
      scores = tf.make_ndarray(reply.outputs["scores"])
    except (TypeError, ValueError) as error:
      raise ServingError(f"{self.server} sent tensors that cannot be read: {error}") \
          from None
    if outputs.shape != (len(sentences),) or scores.shape != (len(sentences),):
      raise ServingError(f"{self.server} sent outputs {outputs.shape} and scores "
                         f"{scores.shape} for {len(sentences)} sentence(s)")
    if scores.dtype.kind not in "fiu":
      raise ServingError(f"{self.server} sent scores of type {scores.dtype}, not numbers")
    return _pairs(self.server, outputs.tolist(), scores.tolist())


def main(argv):
  sentences = argv[1:]
  if FLAGS.input_file:
    # Invalid UTF-8 becomes U+FFFD, as the exported model would do on its own.
    try:
      with open(FLAGS.input_file, encoding="utf-8", errors="replace") as f:
        sentences += [line.rstrip("\r\n") for line in f]
    except OSError as error:
      print(f"error: cannot read --input_file: {error}", file=sys.stderr)
      sys.exit(1)
  if not sentences:
    raise app.UsageError("Give sentences as arguments or --input_file.")
  server = FLAGS.server or f"localhost:{DEFAULT_PORTS[FLAGS.protocol]}"
  client = None
  try:
    if FLAGS.protocol == "grpc":
      client = GrpcClient(server, FLAGS.model_name, FLAGS.signature_name, FLAGS.timeout,
                          FLAGS.max_reply_bytes)
      predict = client.predict
    else:
      def predict(chunk):
        return rest_predict(server, FLAGS.model_name, chunk, FLAGS.signature_name,
                            FLAGS.timeout, FLAGS.max_reply_bytes)
    for start in range(0, len(sentences), FLAGS.batch_size):
      for text, score in predict(sentences[start:start + FLAGS.batch_size]):
        print(f"{score:.4f}\t{text}", flush=True)
  except ServingError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  finally:
    if client:
      client.close()


def console_main():
  """The `t2t-query-server` command (setup.py) and `python tools/query_serving.py`."""
  console.own_help(__name__)
  app.run(main)


if __name__ == "__main__":
  console_main()
