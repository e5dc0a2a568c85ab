"""Sentence pairs as ids: vocabularies and in-graph tokenizers (`tokenizer`), the
tokenized cache (`cache`), guided alignment's links mapped to pieces (`alignments`) and
which pieces start a word (`words`)."""
