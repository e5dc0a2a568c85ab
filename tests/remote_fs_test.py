"""Model directories and data that are not on local disk, as on gs://.

Two stand-ins for Cloud Storage, each failing wherever a Python `open()`, `os.path` or
`os.makedirs` call would fail (or silently write elsewhere) on gs://:
- TensorFlow's in-memory `ram://` filesystem, which lives inside one process: the
  training entry point runs there on data staged in memory;
- `file://` URLs, which TensorFlow's filesystems read and write like gs:// paths and
  Python's `open` cannot (`os.makedirs("file:///x")` would create a `file:` folder in
  the working directory, which the test checks stays empty): the whole path across
  processes, train -> average -> decode -> score -> export (SavedModel and CTranslate2).
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests import inprocess, reported_scores
from tests.conftest import REPO_ROOT

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def slice_of(shared_data, split, lang, lines):
  with open(os.path.join(shared_data, "multi30k", f"{split}.{lang}"), encoding="utf-8") as f:
    return "".join(next(f) for _ in range(lines))


TRAIN_FLAGS = [
    "--data_source=files", "--vocab_size=200", "--hidden_size=32", "--filter_size=64",
    "--num_heads=2", "--num_hidden_layers=1", "--max_length=48", "--batch_size=256",
    "--train_steps=12", "--log_every=4", "--eval_every=6", "--save_checkpoint_steps=4",
    "--keep_checkpoint_max=5", "--learning_rate_warmup_steps=8", "--eval_bleu_sentences=8",
    "--keep_best_checkpoint", "--beam_size=2", "--extra_decode_length=4",
    "--show_examples=2", "--export"]


@pytest.mark.slow
def test_training_entry_point_on_ram_filesystem(tmp_path, shared_data):
  """`python -m t2t_keras.train` with --model_dir, --data_dir and the data files on
  ram://: it failed at start (absl wrote flags.txt with open())."""
  staged = {name: slice_of(shared_data, split, lang, lines)
            for name, split, lang, lines in (("train.en", "train", "en", 400),
                                             ("train.de", "train", "de", 400),
                                             ("valid.en", "valid", "en", 30),
                                             ("valid.de", "valid", "de", 30))}
  script = textwrap.dedent(f"""
      import runpy, sys
      import tensorflow as tf
      for name, text in {staged!r}.items():
        tf.io.gfile.makedirs("ram://corpus")
        with tf.io.gfile.GFile("ram://corpus/" + name, "w") as f:
          f.write(text)
      sys.argv = ["t2t_keras.train", "--model_dir=ram://run/m", "--data_dir=ram://run/data",
                  "--train_src=ram://corpus/train.en", "--train_tgt=ram://corpus/train.de",
                  "--dev_src=ram://corpus/valid.en", "--dev_tgt=ram://corpus/valid.de"
                  ] + {TRAIN_FLAGS!r}
      try:
        runpy.run_module("t2t_keras.train", run_name="__main__", alter_sys=True)
      except SystemExit as e:
        if e.code:
          raise
      for path in sorted(tf.io.gfile.glob("ram://run/m/*")):
        print("LISTED", path)
      print("VERSIONS", tf.io.gfile.listdir("ram://run/m/export"))
      print("BEST", tf.train.latest_checkpoint("ram://run/m/best"))
      with tf.io.gfile.GFile("ram://run/m/dev_bleu.json") as f:
        print("DEV_BLEU", f.read().replace("\\n", " "))
  """)
  work = tmp_path / "cwd"
  work.mkdir()
  result = subprocess.run([sys.executable, "-c", script], cwd=work, env=ENV,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  listed = {line.split()[1].rsplit("/", 1)[1] for line in result.stdout.splitlines()
            if line.startswith("LISTED")}
  for name in ("config.json", "flags.txt", "vocab.model", "checkpoint", "ckpt-12.index",
               "best_eval.json", "data_plan.json", "train", "eval", "export", "best"):
    assert name in listed, (name, sorted(listed))
  assert "exported ram://run/m/export/" in result.stdout
  # The dev BLEU printed at the last eval is the one recorded on ram:// for its step.
  (record,) = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
               if line.startswith("DEV_BLEU ")]
  assert record["step"] == 12 and record["sentences"] == 8, record
  assert re.search(rf"eval at step 12: .* \| bleu {record['bleu']:.2f}(\s|$)",
                   result.stdout), (record, result.stdout[-3000:])
  assert "BEST ram://run/m/best/ckpt-" in result.stdout
  assert not os.listdir(work)  # nothing went to a local "ram:" folder


def tf_latest(directory):
  """The checkpoint a directory's `checkpoint` file names (read as text: no TensorFlow)."""
  text = (directory / "checkpoint").read_text(encoding="utf-8")
  return text.split('model_checkpoint_path: "', 1)[1].split('"', 1)[0]


def run(args, cwd):
  result = subprocess.run([sys.executable] + args, cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
  return result


def here(command, args, cwd):
  """`command` in this process (tests/inprocess.py), in `cwd`; it must succeed."""
  result = inprocess.run(command, *args, cwd=str(cwd))
  assert result.returncode == 0, (command, args, result.stdout[-2000:], result.stderr[-3000:])
  return result


@pytest.mark.slow
def test_whole_path_on_file_urls(tmp_path, shared_data):
  """Every command a user runs after training, with every path a file:// URL (the
  commands' mains in this process; the saved_model_cli tool as a process)."""
  pytest.importorskip("ctranslate2")
  data = tmp_path / "data"
  data.mkdir()
  for name, split, lang, lines in (("train.en", "train", "en", 400),
                                   ("train.de", "train", "de", 400),
                                   ("valid.en", "valid", "en", 30),
                                   ("valid.de", "valid", "de", 30)):
    (data / name).write_text(slice_of(shared_data, split, lang, lines), encoding="utf-8")
  url = lambda path: "file://" + str(path)  # noqa: E731
  work = tmp_path / "cwd"  # every command runs here; nothing may be written here
  work.mkdir()
  m = tmp_path / "m"
  here("train", [f"--model_dir={url(m)}", f"--data_dir={url(tmp_path / 'd')}",
       f"--train_src={url(data / 'train.en')}", f"--train_tgt={url(data / 'train.de')}",
       f"--dev_src={url(data / 'valid.en')}", f"--dev_tgt={url(data / 'valid.de')}"]
      + TRAIN_FLAGS, work)
  assert (m / "flags.txt").exists() and (m / "best_eval.json").exists()
  assert len(os.listdir(m / "export")) == 1
  # The export's model card names the run's data and its last dev BLEU with the signature.
  (trained_export,) = os.listdir(m / "export")
  card = json.loads((m / "export" / trained_export / "assets.extra" / "model_card.json")
                    .read_text(encoding="utf-8"))
  assert card["training_data"]["train_src"] == url(data / "train.en")
  assert card["dev_bleu"]["step"] == 12 and card["dev_bleu"]["sentences"] == 8
  assert card["checkpoints"] == ["ckpt-12"] and card["step"] == 12
  assert card["dev_bleu"]["signature"].startswith("nrefs:1|case:mixed|")
  here("average_checkpoints", [f"--model_dir={url(m)}",
       f"--output_dir={url(tmp_path / 'avg')}", "--last_n=2"], work)
  assert (tmp_path / "avg" / "checkpoint").exists()
  decoded = here("decode", [f"--model_dir={url(m)}", "--average_last_n=2",
                 f"--input_file={url(data / 'valid.en')}",
                 f"--output_file={url(tmp_path / 'hyp.txt')}",
                 f"--reference_file={url(data / 'valid.de')}", "--beam_size=2"], work)
  hypotheses = (tmp_path / "hyp.txt").read_text(encoding="utf-8").splitlines()
  assert len(hypotheses) == 30
  # The scores printed: of the file written, against the reference read (file:// both).
  references = (data / "valid.de").read_text(encoding="utf-8").splitlines()
  assert reported_scores.printed(decoded.stderr) == reported_scores.recomputed(
      hypotheses, references), decoded.stderr[-2000:]
  here("score", [f"--model_dir={url(tmp_path / 'avg')}",
       f"--source_file={url(data / 'valid.en')}", f"--target_file={url(tmp_path / 'hyp.txt')}",
       f"--output_file={url(tmp_path / 'scores.txt')}"], work)
  assert len((tmp_path / "scores.txt").read_text().splitlines()) == 30
  here("export", [f"--model_dir={url(m)}", f"--checkpoint_path={url(m / 'best')}",
       f"--export_dir={url(tmp_path / 'exported')}"], work)
  (version,) = os.listdir(tmp_path / "exported")
  assert (tmp_path / "exported" / version / "saved_model.pb").exists()
  shown = run([os.path.join(REPO_ROOT, "tools", "saved_model_cli.py"), "card", "--dir",
               url(tmp_path / "exported" / version)], work)
  card = json.loads(shown.stdout)
  assert card["checkpoints"] == [os.path.basename(tf_latest(m / "best"))]
  assert card["dev_bleu"] == json.loads((m / "dev_bleu.json").read_text(encoding="utf-8"))
  here("export", [f"--model_dir={url(m)}", "--format=ctranslate2",
       f"--export_dir={url(tmp_path / 'ct2')}"], work)
  assert (tmp_path / "ct2" / "model.bin").exists()
  assert not os.listdir(work), os.listdir(work)
