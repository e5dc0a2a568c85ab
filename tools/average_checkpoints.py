"""Averages the model weights of the last N checkpoints into a new model directory.

The code is t2t_keras/tools/average_checkpoints.py (its docstring has the usage); after
`pip install`, `t2t-average-checkpoints` runs the same with the same flags.
"""

from t2t_keras.tools.average_checkpoints import console_main

if __name__ == "__main__":
  console_main()
