"""Builds the shared subword vocabulary, and the tokenized caches, ahead of training.

The code is t2t_keras/tools/build_vocab.py (its docstring has the usage); after
`pip install`, `t2t-build-vocab` runs the same with the same flags.
"""

from t2t_keras.tools.build_vocab import console_main

if __name__ == "__main__":
  console_main()
