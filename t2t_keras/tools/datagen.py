"""Downloads and prepares the public corpora the recipes (flags/*.cfg) read.

tensor2tensor's t2t-datagen, for the corpora of this project's CPU recipes: each is
fetched from its official public location (sacreBLEU's table for the WMT test sets),
prepared as the published figures (docs/results.md) were measured, and checked file by
file against the SHA-256 recorded in t2t_keras/data/fetch/public_corpora.py.

  python -m t2t_keras.tools.datagen                      # multi30k, wmt14, ptb_wsj_sample
  python -m t2t_keras.tools.datagen --corpora=multi30k --data_dir=data
  python -m t2t_keras.tools.datagen --corpora=tatoeba_deu_eng --tatoeba_file=deu-eng.zip

--data_dir defaults to `data`, where the recipes read (paths resolve from the current
directory: run from the repository root). A second run checks the files and downloads
nothing. An interrupted run leaves no file a later run would take for complete.
Downloads show progress (size, rate, ETA) on stderr. --mirror=URL fetches
`https://host/path` from `URL/host/path` (a `wget --force-directories` copy), for a
machine without internet and for the tests' loopback server.

The corpora (docs/data.md has where each comes from and its terms):
  multi30k         Multi30k task 1 EN-DE, train / valid / test2016
  wmt14            WMT newstest2013 (dev) and the full newstest2014 (test), via sacreBLEU
                   (tarballs cached where sacreBLEU keeps them, $SACREBLEU or ~/.sacrebleu)
  ptb_wsj_sample   NLTK's Penn Treebank WSJ sample, split by file (non-commercial)
  tatoeba_deu_eng  Tatoeba EN-DE from an export you give; not reproducible byte for byte

A thin CLI over t2t_keras.data.fetch.public_corpora (the downloads: t2t_keras.data.fetch.fetch).
After `pip install`, `t2t-datagen` is this tool (same flags).
"""

from absl import app, flags

from t2t_keras import console, errors

console.quiet_tensorflow()  # t2t_keras.data's package imports TensorFlow: quietly

from t2t_keras.data.fetch import public_corpora  # noqa: E402

flags.DEFINE_string("data_dir", "data",
                    "Where the corpora go, one folder each (the recipes read data/...).")
flags.DEFINE_list("corpora", list(public_corpora.DEFAULT),
                  "Which corpora to prepare, comma-separated: "
                  + ", ".join(public_corpora.CORPORA) + ".")
flags.DEFINE_string("mirror", None,
                    "For mirrors and tests: a base URL that serves each upstream file "
                    "https://host/path at <mirror>/host/path.")
flags.DEFINE_string("tatoeba_file", None,
                    "tatoeba_deu_eng: the export to prepare (manythings.org/anki "
                    "deu-eng.zip, or its deu.txt).")
FLAGS = flags.FLAGS


def main(argv):
  console.setup_logging()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected positional arguments: {argv[1:]}")
  bad = public_corpora.unknown(FLAGS.corpora)
  if bad:
    raise app.UsageError(f"--corpora: unknown {', '.join(bad)}; known: "
                         f"{', '.join(public_corpora.CORPORA)}.")
  options = public_corpora.Options(data_dir=FLAGS.data_dir, mirror=FLAGS.mirror,
                                   tatoeba_file=FLAGS.tatoeba_file)
  errors.exit_on_user_error(
      lambda: [public_corpora.CORPORA[name].prepare(options) for name in FLAGS.corpora])


def console_main():
  """The `t2t-datagen` command (setup.py) and `python tools/datagen.py`."""
  console.own_help(__name__)
  app.run(main)


if __name__ == "__main__":
  console_main()
