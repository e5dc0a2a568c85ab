"""Starts tf.data service servers (a dispatcher, a worker or both) for train --data_service.

The code is t2t_keras/tools/data_service.py (its docstring has the usage); after
`pip install`, `t2t-data-service` runs the same with the same flags.
"""

from t2t_keras.tools.data_service import console_main

if __name__ == "__main__":
  console_main()
