"""Decoding on every device of a host (--decode_devices, `translator.choose_devices`):
batch i on device i mod N, each device over its own copy of the weights, the output
byte for byte that of one device. There is no GPU here: conftest splits the CPU into
2 logical devices before TensorFlow starts, and the tests decode on those."""

import dataclasses
import logging

import numpy as np
import pytest
import tensorflow as tf

from t2t_keras.configs import DecodeConfig
from t2t_keras.errors import ConfigError
from t2t_keras.inference import decoding, loading
from t2t_keras.inference import translator as translator_lib
from tests import inprocess
from tests.bulk_decode_test import interrupted_run

TWO = ("CPU:0", "CPU:1")


def reverse_lines(n, seed=11):
  """`n` sentences of the reverse task's words (ids 4..23 written as numbers)."""
  rng = np.random.default_rng(seed)
  return [" ".join(str(w) for w in rng.integers(4, 24, rng.integers(1, 9)))
          for _ in range(n)]


def record_devices(monkeypatch):
  """Every decode function's calls from now on: (the device it was made for, the
  device its output ids are on)."""
  calls = []
  make = decoding.make_decode_fn

  def recording(*args, **kwargs):
    decode = make(*args, **kwargs)

    def call(*inputs):
      ids, scores = decode(*inputs)
      calls.append((decode.device, tf.DeviceSpec.from_string(ids.device)))
      return ids, scores
    return call
  monkeypatch.setattr(decoding, "make_decode_fn", recording)
  return calls


def short(spec):
  return f"{spec.device_type}:{spec.device_index}"


def test_two_logical_cpus_are_the_devices_this_process_decodes_on():
  """The test's premise (conftest's split), and what each value of the flag names."""
  assert [d.name for d in tf.config.list_logical_devices("CPU")] == [
      "/device:CPU:0", "/device:CPU:1"]

  def choose(value):
    return translator_lib.choose_devices(DecodeConfig(devices=value))
  assert choose("auto") == ()  # no GPU: TensorFlow's default device, as without the flag
  assert choose("all") == TWO  # no GPU: every CPU device
  assert choose(" cpu:1 , /device:CPU:0") == ("CPU:1", "CPU:0")
  with pytest.raises(ConfigError, match="names a device twice"):
    choose("CPU:1,cpu:1")


def test_a_device_the_host_lacks_is_refused_naming_the_flag(tiny_model_dir):
  """Before the model loads: the flag, the device and the host's devices."""
  result = inprocess.run("decode", f"--model_dir={tiny_model_dir}",
                         "--decode_devices=CPU:0,GPU:3", stdin="a dog\n")
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert result.returncode == 1 and errors == [
      "error: --decode_devices=CPU:0,GPU:3: this host has no GPU:3; its devices are "
      "CPU:0, CPU:1. Name some of them, or use 'auto' (every GPU when there are several) "
      "or 'all'."], result.stderr[-2000:]
  result = inprocess.run("decode", f"--model_dir={tiny_model_dir}", "--decode_devices=GPU0",
                         stdin="a dog\n")
  assert result.returncode == 1 and ("--decode_devices must be auto, all or devices such "
                                     "as GPU:0,GPU:1") in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_decode_on_two_devices_writes_one_devices_bytes(trained_reverse_dir, tmp_path,
                                                        monkeypatch):
  """40 lines in 2 windows of 5 batches of 4: batches run on each device (the output
  ids are there), and the output (every beam and its score) is the one-device run's,
  byte for byte; the first line and the progress name the devices; a run interrupted
  on one device resumes on two."""
  source = tmp_path / "in.txt"
  source.write_text("".join(line + "\n" for line in reverse_lines(40)), encoding="utf-8")
  common = (f"--model_dir={trained_reverse_dir}", f"--input_file={source}",
            "--beam_size=3", "--return_beams", "--extra_decode_length=4",
            "--decode_batch_size=4", "--decode_buffer_lines=20")
  calls = record_devices(monkeypatch)
  one = inprocess.run("decode", *common, f"--output_file={tmp_path / 'one.txt'}")
  assert one.returncode == 0, one.stderr[-3000:]
  assert {(made, short(ran)) for made, ran in calls} == {(None, "CPU:0")}
  del calls[:]
  two = inprocess.run("decode", *common, "--decode_devices=CPU:0,CPU:1",
                      f"--output_file={tmp_path / 'two.txt'}")
  assert two.returncode == 0, two.stderr[-3000:]
  assert len(calls) == 10
  assert all(made == short(ran) for made, ran in calls), calls
  # Each window of 5 batches starts on CPU:0.
  assert sorted(made for made, _ in calls) == ["CPU:0"] * 6 + ["CPU:1"] * 4
  expected = (tmp_path / "one.txt").read_bytes()
  assert (tmp_path / "two.txt").read_bytes() == expected and expected.count(b"\n\n") == 40
  first = next(line for line in two.stderr.splitlines() if line.startswith("decoding "))
  assert "2 batches at a time on each of 2 devices (CPU:0, CPU:1)" in first, first
  assert "decoded 40/40 sentences on CPU:0, CPU:1 (" in two.stderr, two.stderr[-2000:]

  # A run interrupted on one device resumes on two (a VM with other GPUs): the same file.
  resumed = tmp_path / "resumed.txt"
  interrupted_run(monkeypatch, trained_reverse_dir, 1, *common[1:],
                  f"--output_file={resumed}")
  again = inprocess.run("decode", *common, "--decode_devices=all", f"--output_file={resumed}")
  assert again.returncode == 0 and "resuming" in again.stderr, again.stderr[-2000:]
  assert resumed.read_bytes() == expected


@pytest.mark.slow
def test_each_device_decodes_over_its_own_copy_of_the_weights(trained_reverse_dir):
  """The weights are copied once onto each device where they are not (the loaded model
  is on CPU:0 and serves it; not for scoring, which runs on one device), and XLA's
  greedy search on both devices (a program compiled for each) gives one device's ids
  and scores exactly."""
  config = DecodeConfig(beam_size=1, batch_size=4, extra_decode_length=4)
  lines = reverse_lines(24, seed=12)
  one = translator_lib.Translator.load(trained_reverse_dir, config, xla=True)
  both = translator_lib.Translator.load(trained_reverse_dir,
                                        dataclasses.replace(config, devices="all"), xla=True)
  assert one.devices == () and one.replicas == [one.model]
  pairs = [(line, " ".join(line.split()[::-1])) for line in lines[:3]]
  assert [f.total for f in both.score(pairs)] == [f.total for f in one.score(pairs)]
  assert "replicas" not in vars(both)  # scoring runs on one device: no copy made for it
  assert both.devices == TWO and both.replicas[0] is both.model
  copy = both.replicas[1]
  assert copy is not both.model
  for original, copied in zip(both.model.weights, copy.weights):
    assert short(tf.DeviceSpec.from_string(copied.value.device)) == "CPU:1"
    assert short(tf.DeviceSpec.from_string(original.value.device)) == "CPU:0"
    np.testing.assert_array_equal(copied.numpy(), original.numpy())
  expected, got = one.translations(lines), both.translations(lines)
  assert [(r.ids, r.scores) for r in got] == [(r.ids, r.scores) for r in expected]
  assert sum(r.texts[0] == " ".join(line.split()[::-1])
             for r, line in zip(got, lines)) > 12  # a model that reverses, not noise


@pytest.mark.slow
def test_a_function_per_device_sets_off_no_retracing_warning(tiny_model_dir, caplog):
  """One decode function per device, each traced once: TensorFlow's warning about
  frequent retracing (5 traces of one code within 10 calls, as 8 GPUs would make) is
  not printed."""
  model, loaded = loading.load_ensemble([tiny_model_dir])
  config = DecodeConfig(beam_size=1, batch_size=2, parallel_batches=1, extra_decode_length=2)
  translator = translator_lib.Translator(model, loaded, config, devices=TWO * 3)
  with caplog.at_level(logging.WARNING, logger="tensorflow"):
    assert len(translator.translate(["a dog"] * 12)) == 12
  assert not [r for r in caplog.records if "retracing" in r.getMessage()], caplog.text
