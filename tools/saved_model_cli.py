"""TensorFlow's saved_model_cli with TensorFlow Text's ops registered, and the model card.

The code is t2t_keras/tools/saved_model_cli.py (its docstring has the usage); after
`pip install`, `t2t-saved-model-cli` runs the same with the same flags.
"""

from t2t_keras.tools.saved_model_cli import console_main

if __name__ == "__main__":
  console_main()
