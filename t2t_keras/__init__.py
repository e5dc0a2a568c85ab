"""t2t_keras: the Transformer of "Attention Is All You Need" in TensorFlow 2 / Keras 3."""

import importlib.util as _importlib_util

__version__ = "0.1.0"

# Token ids shared by every vocabulary, the data pipeline, the model and decoding.
PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BOS_ID = 3  # first decoder input (targets are shifted right by one and start with it)
NUM_RESERVED_IDS = 4


def require_tensorflow() -> None:
  """Raises ImportError saying how to install TensorFlow when it is not installed.

  TensorFlow is an extra of the package (setup.py says why), and the bottom layer
  (`configs`, `errors`, `console`, `textio`, `metrics`, `parsing`: CONTRIBUTING.md's
  map) imports without it. So the check is not made here, on import, but where a
  command first needs TensorFlow: `console.quiet_tensorflow()`, which the commands
  call before importing it. A user without TensorFlow is told how to install it
  rather than shown a bare ModuleNotFoundError.
  """
  if _importlib_util.find_spec("tensorflow") is None:
    raise ImportError(
        "t2t_keras needs TensorFlow, which is not installed in this environment "
        "(pip installs it only when asked): pip install 't2t_keras[tensorflow]' "
        "(or, in a checkout, pip install -e '.[tensorflow]'); on a Cloud TPU VM follow "
        "BUILD.md's 'On a Cloud TPU VM', which keeps the VM's tensorflow-tpu.")
