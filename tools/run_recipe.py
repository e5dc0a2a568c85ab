"""Runs a translation recipe of flags/ end to end: train, decode the test set, score.

The code is t2t_keras/tools/run_recipe.py (its docstring has the usage); after
`pip install`, `t2t-run-recipe` runs the same with the same flags.
"""

from t2t_keras.tools.run_recipe import console_main

if __name__ == "__main__":
  console_main()
