"""Exports appear whole or not at all (t2t_keras/export/publish.py), on local disk and on an
object store (TensorFlow's `ram://` file system stands in for gs://: Python's open()
fails there as on gs://), and checkpoint averaging works on such paths too."""
# pylint: disable=redefined-outer-name  (pytest fixtures)

import dataclasses
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.trained import modeldir
from t2t_keras.inference import loading
from t2t_keras.export import ctranslate2 as ct2_export
from t2t_keras.export import publish, saved_model
from t2t_keras.configs import DecodeConfig
from t2t_keras.trained import averaging
from tests.conftest import SessionModel

DECODE = DecodeConfig(beam_size=2, alpha=0.6, extra_decode_length=3)


@pytest.fixture(scope="module")
def translator(tiny_model_dir):
  loaded = loading.load(tiny_model_dir)
  return saved_model.Translator(loaded.model, loaded.tokenizer,
                                dataclasses.replace(DECODE, max_input_length=24),
                                vocab_file=modeldir.vocab_path(tiny_model_dir))


def ram_dir(name):
  return f"ram://{name}-{uuid.uuid4().hex[:8]}"


def files_under(root):
  return publish._files(root)  # pylint: disable=protected-access


class CopyWatcher:
  """Wraps tf.io.gfile.copy: after every copy into `final`, a reader that finds the
  marker must find every file of the finished export; optionally crashes after
  `crash_after` copies into `final`."""

  def __init__(self, monkeypatch, final, marker, expected, crash_after=None):
    self.final, self.marker, self.expected = final, marker, expected
    self.crash_after, self.copies = crash_after, 0
    self._copy = tf.io.gfile.copy
    monkeypatch.setattr(tf.io.gfile, "copy", self.copy)

  def copy(self, src, dst, overwrite=False):
    if dst.startswith(self.final + "/") and self.crash_after is not None \
        and self.copies >= self.crash_after:
      raise tf.errors.UnavailableError(None, None, "simulated crash")
    self._copy(src, dst, overwrite=overwrite)
    if dst.startswith(self.final + "/"):
      self.copies += 1
      if tf.io.gfile.exists(os.path.join(self.final, self.marker)):
        assert files_under(self.final) == self.expected, "marker before the other files"


@pytest.mark.slow
def test_saved_model_on_an_object_store_appears_with_saved_model_pb_last(
    translator, monkeypatch, tmp_path):
  local = saved_model.export(translator, str(tmp_path), version=1)
  expected = files_under(local)
  assert "saved_model.pb" in expected and len(expected) > 3
  base = ram_dir("export")
  watcher = CopyWatcher(monkeypatch, f"{base}/2", "saved_model.pb", expected)
  path = saved_model.export(translator, base, version=2)
  assert path == f"{base}/2" and watcher.copies == len(expected)
  assert files_under(path) == expected
  assert tf.io.gfile.listdir(base) == ["2/"] or tf.io.gfile.listdir(base) == ["2"]
  assert saved_model.read_limits(path)["max_rows"] == 256
  # What a reader loads from the object store translates like the local export.
  served = tf.saved_model.load(path)
  text = np.array(["a small dog"], object)
  np.testing.assert_array_equal(served.signatures["serving_default"](tf.constant(text))[
      "outputs"], SessionModel(local).run(inputs=text)["outputs"])


@pytest.mark.slow
def test_a_crash_while_copying_to_an_object_store_leaves_no_loadable_version(
    translator, monkeypatch, tmp_path):
  expected = files_under(saved_model.export(translator, str(tmp_path), version=1))
  base = ram_dir("crash")
  watcher = CopyWatcher(monkeypatch, f"{base}/3", "saved_model.pb", expected,
                        crash_after=2)
  with pytest.raises(tf.errors.UnavailableError):
    saved_model.export(translator, base, version=3)
  assert watcher.copies == 2
  assert not tf.io.gfile.exists(f"{base}/3/saved_model.pb")  # no reader loads it
  monkeypatch.undo()
  with pytest.raises(FileExistsError, match=rf"{base}/3 exists but has no saved_model.pb: "
                     "it is what an interrupted export left"):
    saved_model.export(translator, base, version=3)


@pytest.mark.parametrize("where", ["local", "ram"])
def test_a_leftover_temporary_directory_is_removed_not_reused(translator, tmp_path, capsys,
                                                             where):
  base = str(tmp_path) if where == "local" else ram_dir("leftover")
  stale = os.path.join(base, ".tmp-5")
  tf.io.gfile.makedirs(os.path.join(stale, "variables"))
  for name in ("stale.txt", "variables/variables.data-00000-of-00009"):
    with tf.io.gfile.GFile(os.path.join(stale, name), "w") as f:
      f.write("from a crashed export")
  path = saved_model.export(translator, base, version=5)
  assert f"removing {stale}: left by an interrupted export" in capsys.readouterr().err
  assert "stale.txt" not in tf.io.gfile.listdir(path)
  assert "variables.data-00000-of-00009" not in tf.io.gfile.listdir(
      os.path.join(path, "variables"))
  assert sorted(tf.io.gfile.listdir(base)) in (["5"], ["5/"])


def test_a_local_crash_leaves_only_the_hidden_directory(translator, tmp_path, monkeypatch):
  def crash(*args, **kwargs):
    del args, kwargs
    raise KeyboardInterrupt  # killed while writing
  monkeypatch.setattr(tf.io.gfile, "rename", crash)
  with pytest.raises(KeyboardInterrupt):
    saved_model.export(translator, str(tmp_path), version=6)
  assert os.listdir(tmp_path) == [".tmp-6"]  # TF Serving ignores non-integer names


@pytest.fixture(scope="module")
def ct2_model(tiny_model_dir):
  pytest.importorskip("ctranslate2")
  loaded = loading.load(tiny_model_dir, dtype="float32")
  return loaded, modeldir.vocab_path(tiny_model_dir)


def test_ctranslate2_export_on_an_object_store_writes_model_bin_last(
    ct2_model, tmp_path, monkeypatch):
  (loaded, vocab) = ct2_model
  args = (loaded.model, loaded.model_config, loaded.tokenizer)
  local = ct2_export.export(*args, str(tmp_path / "ct2"), vocab_file=vocab)
  expected = sorted(os.listdir(local))
  assert "model.bin" in expected and "sentencepiece.model" in expected
  assert sorted(os.listdir(tmp_path)) == ["ct2"]  # no temporary left
  target = ram_dir("ct2")
  assert publish.temp_path(target) == "ram://.tmp-" + target[len("ram://"):]
  assert publish.temp_path("gs://bucket/models/ct2/") == "gs://bucket/models/.tmp-ct2"
  watcher = CopyWatcher(monkeypatch, target, "model.bin", expected)
  assert ct2_export.export(*args, target, vocab_file=vocab) == target
  assert watcher.copies == len(expected) and files_under(target) == expected
  for name in expected:
    with tf.io.gfile.GFile(os.path.join(target, name), "rb") as f, \
        open(os.path.join(local, name), "rb") as g:
      assert f.read() == g.read(), name
  # A crash during the copy: no model.bin, and the next export says what happened.
  crashed = ram_dir("ct2_crash")
  CopyWatcher(monkeypatch, crashed, "model.bin", expected, crash_after=1)
  with pytest.raises(tf.errors.UnavailableError):
    ct2_export.export(*args, crashed, vocab_file=vocab)
  assert not tf.io.gfile.exists(os.path.join(crashed, "model.bin"))
  monkeypatch.undo()
  with pytest.raises(FileExistsError, match="has no model.bin: it is what an interrupted"):
    ct2_export.export(*args, crashed, vocab_file=vocab)


def test_averaging_reads_and_writes_object_store_paths(tiny_model_dir):
  model_dir = ram_dir("model")
  tf.io.gfile.makedirs(model_dir)
  for name in os.listdir(tiny_model_dir):  # its files (other tests may add folders)
    if os.path.isfile(os.path.join(tiny_model_dir, name)):
      tf.io.gfile.copy(os.path.join(tiny_model_dir, name), os.path.join(model_dir, name))
  with pytest.raises(averaging.ModelDirError, match="--output_dir is --model_dir"):
    averaging.write_averaged(model_dir, model_dir + "/", 1)
  written = averaging.write_averaged(model_dir, model_dir + "_avg", 1)
  assert written == model_dir + "_avg/ckpt-7"
  mean = averaging.average_checkpoints(model_dir + "_avg", 1)
  original = averaging.average_checkpoints(tiny_model_dir, 1)
  assert sorted(mean) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(mean[name], value)
