"""Draws a run's learning curves from its TensorBoard logs into a PNG.

The code is t2t_keras/tools/plot_learning_curve.py (its docstring has the usage); after
`pip install`, `t2t-plot-learning-curve` runs the same with the same flags.
"""

from t2t_keras.tools.plot_learning_curve import console_main

if __name__ == "__main__":
  console_main()
