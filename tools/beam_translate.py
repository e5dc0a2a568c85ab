"""Translates files on many machines with Apache Beam (RunInference over the SavedModel).

The code is t2t_keras/tools/beam_translate.py (its docstring has the usage); after
`pip install`, `t2t-beam-translate` runs the same with the same flags.
"""

from t2t_keras.tools.beam_translate import console_main

if __name__ == "__main__":
  console_main()
