"""The paper's second task, English constituency parsing (section 6.3), in one package.

- `trees` (re-exported here): read Penn Treebank trees, clean, linearize, rebuild and
  repair decoder outputs. Pure Python.
- `evalb`: labeled bracketing precision, recall and F1 as the EVALB program scores them.
  Pure Python.
- `constraint`: `TreeConstraint`, the beam-search constraint that writes only trees
  over the input's words (decode --constrain_trees). Imports TensorFlow, so it is not
  imported here: `python -m t2t_keras.evaluate` and tools/linearize_trees.py start
  without TensorFlow.

The data source for treebanks is `t2t_keras.data.sources.sources` (--data_source=parsing).
"""

from t2t_keras.errors import TreeError
from t2t_keras.parsing.trees import (LINEARIZATION_VERSION, LINEARIZATIONS, NONE_TAG,
                                     PLACEHOLDER_TAG, PTB_TAGS, ROOT_LABELS, TOP, Rebuilt,
                                     Tree, clean, decode_utf8, detect_linearization,
                                     example, linearize, parse_trees, read_examples,
                                     rebuild, strip_label, token_kind)

__all__ = ["LINEARIZATION_VERSION", "LINEARIZATIONS", "NONE_TAG", "PLACEHOLDER_TAG",
           "PTB_TAGS", "ROOT_LABELS", "TOP", "Rebuilt", "Tree", "TreeError", "clean",
           "decode_utf8", "detect_linearization", "example", "linearize", "parse_trees",
           "read_examples", "rebuild", "strip_label", "token_kind"]
