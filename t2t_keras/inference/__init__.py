"""Inference: everything that turns a trained model into outputs.

Read top-down: `decoding` (ids -> ids in the graph: the encoder once, then a search
over the key/value cache), `search` (the searches: beam, greedy, sampling),
`processors` (decoding options composed around the model's step), `loading` (a
restored model for inference), `translate` (host side: strings in, translations out),
`ensemble`, `scoring` (teacher-forced scores and alignments) and `attention_maps`.

The commands that use it (`decode`, `score`, `export`) stay at the package root, where
users call them. Nothing here is imported on `import t2t_keras.inference`: the
commands check their flags before TensorFlow loads.
"""
