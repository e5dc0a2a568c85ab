"""Turns a treebank file into the parsing task's line-aligned text files.

The code is t2t_keras/tools/linearize_trees.py (its docstring has the usage); after
`pip install`, `t2t-linearize-trees` runs the same with the same flags.
"""

from t2t_keras.tools.linearize_trees import console_main

if __name__ == "__main__":
  console_main()
