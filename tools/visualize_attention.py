"""Draws the attention of a trained model on one sentence (the paper's Figures 3-5).

The code is t2t_keras/tools/visualize_attention.py (its docstring has the usage); after
`pip install`, `t2t-visualize-attention` runs the same with the same flags.
"""

from t2t_keras.tools.visualize_attention import console_main

if __name__ == "__main__":
  console_main()
