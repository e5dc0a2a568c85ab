"""Keras 3 layers of the Transformer."""

from t2t_keras.model.layers.attention import MultiHeadAttention
from t2t_keras.model.layers.dropout import Dropout
from t2t_keras.model.layers.embedding import SharedEmbedding
from t2t_keras.model.layers.feed_forward import FeedForward
from t2t_keras.model.layers.position import LearnedPosition, SinusoidalPosition
from t2t_keras.model.layers.transformer_layers import DecoderLayer, EncoderLayer, Residual

__all__ = ["MultiHeadAttention", "Dropout", "SharedEmbedding", "FeedForward", "LearnedPosition",
           "SinusoidalPosition", "DecoderLayer", "EncoderLayer", "Residual"]
