"""Data: sources (files, TFDS, synthetic, treebanks for parsing), in-graph tokenizers,
tf.data pipelines.

Four packages by job:
- `fetch/`: getting corpora onto disk (`public_corpora`, `fetch`: checked downloads;
  `tfds_reader`: offline-first TFDS loading; `leftovers`: sweeping killed builds' files).
- `sources/`: reading sentence pairs (`sources`: one object per kind of source;
  `textfiles`: text-file checks; `corpora`: several corpora mixed by weights).
- `tokens/`: pairs as ids (`tokenizer`, `cache`: the tokenized cache, `alignments`:
  guided alignment's links, `words`: which pieces start a word).
- `batching/`: ids as batches (`plan`: the batch plan, `packing`, `pipeline`: the train
  and eval pipelines, `dev_batches`: the dev split as evaluation reads it, `buckets`:
  what both share, `service`: tf.data service).

The trainer needs one call, `make_datasets(config)`; decoding and export need
`load_or_build_tokenizer(config)` or `load_tokenizer(vocab_file)`.
"""

import warnings

from t2t_keras.data.batching.pipeline import (Datasets, SplitStats, bucket_boundaries,
                                     eval_dataset, make_datasets, train_dataset)
from t2t_keras.data.sources.sources import DataError
from t2t_keras.data.tokens.tokenizer import (IntegerTokenizer, SentencePieceTokenizer,
                                      build_vocab, data_vocab_path,
                                      load_or_build_tokenizer, load_tokenizer)

__all__ = [
    "DataError", "Datasets", "IntegerTokenizer", "SentencePieceTokenizer", "SplitStats",
    "bucket_boundaries", "build_vocab", "data_vocab_path", "eval_dataset",
    "load_or_build_tokenizer", "load_tokenizer", "make_datasets", "train_dataset",
]

# Old names, kept one release: `vocab_path` is now only a model directory's vocab.model
# (t2t_keras.trained.modeldir.vocab_path).
_RENAMED = {"vocab_path": "data_vocab_path"}


def __getattr__(name):
  if name in _RENAMED:
    warnings.warn(f"t2t_keras.data.{name} is renamed {_RENAMED[name]}; the old name "
                  "goes in the next release.", DeprecationWarning, stacklevel=2)
    return globals()[_RENAMED[name]]
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
