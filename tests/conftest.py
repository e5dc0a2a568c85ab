"""Test setup: quiet TensorFlow logs and make ../shared/data reachable."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data")


@pytest.fixture
def shared_data():
  """Path of ../shared/data; skips the test with a clear message when it is absent."""
  if not os.path.isdir(SHARED_DATA):
    pytest.skip(f"real corpora not found at {SHARED_DATA} (../shared/data beside the repo)")
  return SHARED_DATA


def _split_cpu(num_devices=2):
  """Splits the CPU into logical devices before TensorFlow initialises its runtime,
  so distribution tests can compare 1 and 2 replicas on one machine."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  cpus = tf.config.list_physical_devices("CPU")
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_devices)
  except RuntimeError:  # already initialised (e.g. a plugin imported TF first)
    pass


_split_cpu()
