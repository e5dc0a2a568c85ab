"""Reading sentence pairs: one object per kind of source (`sources`: files, TFDS,
synthetic, treebanks) behind one protocol (`source`), text-file checks (`textfiles`),
several corpora mixed by weights (`corpora`)."""
