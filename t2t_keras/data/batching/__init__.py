"""Ids as batches: the batch plan (`plan`), packed rows (`packing`), the training and
eval pipelines (`pipeline`, `dev_batches`, and `buckets`, what both share) and the
training input served by tf.data service (`service`)."""
