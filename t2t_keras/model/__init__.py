"""The Transformer (`transformer.py`) beside its layers (`layers/`).

`from t2t_keras.model import Transformer, create_model` reads the model's public names
from here; the layers are `t2t_keras.model.layers`.
"""

from t2t_keras.model.transformer import (Transformer, advance_pointer, causal_mask,
                                         create_model, dtype_policy, padding_mask,
                                         segment_mask, shift_right)

__all__ = ["Transformer", "advance_pointer", "causal_mask", "create_model", "dtype_policy",
           "padding_mask", "segment_mask", "shift_right"]
