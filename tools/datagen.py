"""Downloads and prepares the public corpora the recipes read into a data directory.

The code is t2t_keras/tools/datagen.py (its docstring has the usage); after
`pip install`, `t2t-datagen` runs the same with the same flags.
"""

from t2t_keras.tools.datagen import console_main

if __name__ == "__main__":
  console_main()
