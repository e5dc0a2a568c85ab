"""Starts a tf.data service dispatcher, a worker, or both, for `train --data_service`.

  python -m t2t_keras.tools.data_service --dispatcher --worker --port=5050  # both
  python -m t2t_keras.tools.data_service --dispatcher --port=5050
  python -m t2t_keras.tools.data_service --worker --dispatcher_address=HOST:5050

then `python -m t2t_keras.train ... --data_service=grpc://HOST:5050`. The servers run
until the process is stopped. A worker runs the training input pipelines' TensorFlow
graphs, which the trainer sends it: it needs TensorFlow and TensorFlow Text (imported
here, so that their ops are registered), never the project's Python, and it must read
the tokenized caches at the path the trainer gives (--data_dir: gs:// on a pod).

One worker per dispatcher: a worker produces every batch of the jobs it serves, so a
second worker on the same dispatcher would give the trainer each batch twice. More
CPU hosts take more dispatcher+worker pairs, listed comma-separated in --data_service
(input pipeline i reads from the i-th mod their number; docs/training.md).

After `pip install`, `t2t-data-service` is this tool (same flags).
"""

import socket

from absl import app, flags, logging

from t2t_keras import console, errors  # noqa: E402

console.quiet_tensorflow()  # before TensorFlow is imported

flags.DEFINE_boolean("dispatcher", False, "Start a dispatcher on --port.")
flags.DEFINE_boolean("worker", False, "Start a worker that registers with "
                     "--dispatcher_address (default: this process's dispatcher).")
flags.DEFINE_integer("port", 5050, "The dispatcher's port (0 = any free port).",
                     lower_bound=0)
flags.DEFINE_integer("worker_port", 0, "The worker's port (0 = any free port).",
                     lower_bound=0)
flags.DEFINE_string("dispatcher_address", None,
                    "--worker: the dispatcher to register with, HOST:PORT.")
flags.DEFINE_string("host", None,
                    "The host name or IP the trainers reach this machine at (they fetch "
                    "batches from the worker directly); default: this machine's name.")
FLAGS = flags.FLAGS


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  if not FLAGS.dispatcher and not FLAGS.worker:
    raise app.UsageError("Give --dispatcher, --worker or both.")
  if FLAGS.worker and not FLAGS.dispatcher and not FLAGS.dispatcher_address:
    raise app.UsageError("--worker needs --dispatcher_address=HOST:PORT (or --dispatcher "
                         "to start one in this process).")
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf
  import tensorflow_text  # noqa: F401 (registers the ops a dataset graph may use)

  service = tf.data.experimental.service
  host = FLAGS.host or socket.getfqdn()
  servers = []
  dispatcher_address = (FLAGS.dispatcher_address or "").removeprefix("grpc://")
  if FLAGS.dispatcher:
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=FLAGS.port))
    dispatcher_address = dispatcher.target.split("://", 1)[1]
    print(f"dispatcher at grpc://{host}:{dispatcher_address.rsplit(':', 1)[1]}",
          flush=True)
    servers.append(dispatcher)
  if FLAGS.worker:
    worker = service.WorkerServer(service.WorkerConfig(
        dispatcher_address=dispatcher_address, worker_address=f"{host}:%port%",
        port=FLAGS.worker_port))
    print(f"worker at {host}:{worker._address.split(':')[-1]} registered with "  # pylint: disable=protected-access
          f"{dispatcher_address}", flush=True)
    servers.append(worker)
  servers[0].join()


def console_main():
  """The `t2t-data-service` command (setup.py) and `python tools/data_service.py`."""
  console.own_help(__name__)
  logging.set_verbosity(logging.INFO)
  app.run(errors.reporting_user_errors(main))


if __name__ == "__main__":
  console_main()
