"""Translates a file with a CTranslate2 export of a t2t_keras model.

The code is t2t_keras/tools/ct2_translate.py (its docstring has the usage); after
`pip install`, `t2t-ct2-translate` runs the same with the same flags.
"""

from t2t_keras.tools.ct2_translate import console_main

if __name__ == "__main__":
  console_main()
