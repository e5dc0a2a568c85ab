"""A trained model on disk: what a model directory holds and how it is read back.

- `modeldir`: the directory's layout and files (`config.json`, `flags.txt`, the batch
  plan's key, the vocabulary), every file through `tf.io.gfile` (gs://).
- `checkpoints`: choosing checkpoints (latest, `--checkpoint_path`, last N) and
  restoring them with clear errors.
- `averaging`: averaging the weights of several checkpoints.
- `model_card`: the model card an export carries.

`inference.loading` (a model restored for inference) and `training.init_from` (a run
that starts from another's weights) build on it. Nothing here is imported on
`import t2t_keras.trained`.
"""
