"""Builds the shared subword vocabulary, and the tokenized caches, ahead of training.

The t2t-datagen of t2t_keras: run it once with the same flags (or recipe) as
training, and training finds the vocabulary and caches in --data_dir and reuses them
instead of building them itself. Useful before multi-worker runs (workers must not
race to build the same files) and to inspect the vocabulary (the .vocab text file).

  python tools/build_vocab.py --flagfile=flags/base_en_de.cfg --data_dir=/data/ende

It is a thin CLI: the work is t2t_keras.data.build_vocab and make_datasets.

After `pip install`, `t2t-build-vocab` is this tool (same flags).
"""


from absl import app, flags, logging

from t2t_keras import console, errors  # noqa: E402

console.quiet_tensorflow()  # before TensorFlow is imported

from t2t_keras import flags as t2t_flags  # noqa: E402
from t2t_keras.data.sources import sources  # noqa: E402
from t2t_keras.data import build_vocab, make_datasets  # noqa: E402

flags.DEFINE_boolean("overwrite_vocab", False,
                     "Rebuild the vocabulary even if it exists (invalidates caches and "
                     "any model trained with the old one).")
flags.DEFINE_boolean("prepare_data", True,
                     "Also validate the files and write the tokenized caches.")
flags.DEFINE_boolean("spm_verbose", False, "Show SentencePiece's training log.")
FLAGS = flags.FLAGS


def main(argv):
  console.setup_logging()
  del argv
  errors.exit_on_user_error(lambda: _build(t2t_flags.data_config()))


def _build(config):
  """Builds (or finds) the vocabulary, then the caches; prints what was found."""
  if not sources.data_source(config).is_text:
    print(f"--data_source={config.source} needs no vocabulary (ids are the symbols).")
    return
  sides = ("source", "target") if config.separate_vocabularies else (None,)
  for side in sides:  # --separate_vocabularies: one per side
    path = build_vocab(config, overwrite=FLAGS.overwrite_vocab, verbose=FLAGS.spm_verbose,
                       side=side)
    print(f"Vocabulary{f' ({side})' if side else ''}: {path}")
  if FLAGS.prepare_data:
    data = make_datasets(config)
    print(f"Vocabulary size: {data.vocab_size}"
          + (f" (source), {data.target_vocab_size} (target)" if data.target_vocab_size
             else ""))
    print(data.train_stats.summary("train", config.max_length))
    if data.eval_stats is not None:
      print(data.eval_stats.summary("dev", config.max_length))


def console_main():
  """The `t2t-build-vocab` command (setup.py) and `python tools/build_vocab.py`."""
  t2t_flags.define_all()
  console.own_help(__name__)
  logging.set_verbosity(logging.INFO)
  app.run(main)


if __name__ == "__main__":
  console_main()
