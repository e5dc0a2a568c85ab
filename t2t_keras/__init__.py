"""t2t_keras: the Transformer of "Attention Is All You Need" in TensorFlow 2 / Keras 3."""

__version__ = "0.1.0"

# Token ids shared by every vocabulary, the data pipeline, the model and decoding.
PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
BOS_ID = 3  # first decoder input (targets are shifted right by one and start with it)
NUM_RESERVED_IDS = 4
