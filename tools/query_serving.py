"""Sends sentences to a running TensorFlow Serving and prints the translations.

The code is t2t_keras/tools/query_serving.py (its docstring has the usage); after
`pip install`, `t2t-query-server` runs the same with the same flags.
"""

from t2t_keras.tools.query_serving import console_main

if __name__ == "__main__":
  console_main()
