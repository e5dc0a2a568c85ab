"""Data: sources (files, TFDS, synthetic, treebanks for parsing), in-graph tokenizers,
tf.data pipelines.

The trainer needs one call, `make_datasets(config)`; decoding and export need
`load_or_build_tokenizer(config)` or `load_tokenizer(vocab_file)`.
"""

from t2t_keras.data.pipeline import (Datasets, SplitStats, bucket_boundaries,
                                     eval_dataset, make_datasets, train_dataset)
from t2t_keras.data.sources import DataError
from t2t_keras.data.tokenizer import (IntegerTokenizer, SentencePieceTokenizer,
                                      build_vocab, load_or_build_tokenizer,
                                      load_tokenizer, vocab_path)

__all__ = [
    "DataError", "Datasets", "IntegerTokenizer", "SentencePieceTokenizer", "SplitStats",
    "bucket_boundaries", "build_vocab", "eval_dataset", "load_or_build_tokenizer",
    "load_tokenizer", "make_datasets", "train_dataset", "vocab_path",
]
