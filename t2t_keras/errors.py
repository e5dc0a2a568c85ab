"""The exceptions entry points report as one clear line instead of a stack trace.

Each carries a message that names the file, line, flag or step and says what to do.
"""

from t2t_keras.data.sources import DataError
from t2t_keras.training.checkpoints import CheckpointError, ModelDirError
from t2t_keras.training.trainer import TrainingError

USER_ERRORS = (DataError, CheckpointError, ModelDirError, TrainingError)
