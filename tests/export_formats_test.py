"""What each export format carries (t2t_keras/export/__init__.py), and the export
command's refusal of the decoding flags a format would drop silently."""


import numpy as np
import pytest

from t2t_keras import export
from t2t_keras import flags as t2t_flags
from t2t_keras.errors import ExportError
from tests import inprocess
from tests.conftest import SessionModel

# Flags that choose the weights: every format exports the weights they choose.
WEIGHT_FLAGS = {"checkpoint_path", "average_last_n"}
MIN_LENGTH = 6  # --min_decode_length of the export that must honour it


def test_every_format_declares_every_decoding_flag_of_the_command():
  """A new decoding option must say, per format, whether the export carries it."""
  decoding = set(t2t_flags.decoding_flags("export")) - WEIGHT_FLAGS
  for export_format in export.FORMATS.values():
    declared = set(export_format.carries) | set(export_format.instead)
    assert declared == decoding, (export_format.name, declared ^ decoding)
    assert not set(export_format.carries) & set(export_format.instead)


@pytest.mark.parametrize("name,instead", [
    ("beam_size", "tools/ct2_translate.py --beam_size, or translate_batch(beam_size="),
    ("alpha", "tools/ct2_translate.py --length_penalty, or translate_batch(length_penalty="),
    ("max_input_length", "tools/ct2_translate.py --max_input_length, or "
                         "translate_batch(max_input_length="),
    ("extra_decode_length", "tools/ct2_translate.py --extra_decode_length, or "
                            "translate_batch(max_decoding_length="),
    ("decode_dtype", "--quantization"),
    ("return_beams", "num_hypotheses"),
])
def test_ctranslate2_refuses_each_setting_it_drops_naming_where_it_goes(name, instead):
  with pytest.raises(ExportError) as raised:
    export.CTRANSLATE2.check_flags({name: 5, "quantization": "int8"})
  message = str(raised.value)
  assert f"--{name} (ctranslate2 does not carry it)" in message
  assert instead in message
  assert "quantization" not in message.split(":", 1)[0]


def test_saved_model_refuses_what_it_drops_and_carries_the_rest():
  export.SAVED_MODEL.check_flags({name: 1 for name in export.SAVED_MODEL.carries})
  with pytest.raises(ExportError, match=r"--decode_batch_size .*--max_request_rows"):
    export.SAVED_MODEL.check_flags({"decode_batch_size": 8})
  with pytest.raises(ExportError, match=r"--decode_jit_compile .*--export_jit_compile"):
    export.SAVED_MODEL.check_flags({"decode_jit_compile": True})


def test_flags_of_another_format_and_settings_turned_off():
  with pytest.raises(ExportError, match="--quantization is for --format=ctranslate2"):
    export.SAVED_MODEL.check_flags({"quantization": "int8"})
  with pytest.raises(ExportError, match="--max_request_rows is for --format=saved_model"):
    export.CTRANSLATE2.check_flags({"max_request_rows": 3})
  # --noconstrain_trees asks for no constraint: a CTranslate2 model has none.
  export.CTRANSLATE2.check_flags({"constrain_trees": False, "decode_dtype": None})


def _export(*args):
  """`python -m t2t_keras.export ARGS`, its main in this process (tests/inprocess.py)."""
  return inprocess.run("export", *args)


@pytest.mark.slow
def test_export_command_refuses_typed_settings_but_not_a_recipes(tiny_model_dir, tmp_path):
  """Typed on the command line, --beam_size & co. with --format=ctranslate2 are refused
  before anything is written; a recipe flagfile that sets them still exports."""
  refused = _export(f"--model_dir={tiny_model_dir}", f"--export_dir={tmp_path / 'a'}",
                    "--format=ctranslate2", "--beam_size=2", "--alpha=0",
                    "--max_input_length=64", "--extra_decode_length=3")
  assert refused.returncode == 2, refused.stderr[-3000:]
  for name in ("beam_size", "alpha", "max_input_length", "extra_decode_length"):
    assert f"--{name} (ctranslate2 does not carry it)" in refused.stderr
  assert not (tmp_path / "a").exists()
  recipe = tmp_path / "recipe.cfg"
  recipe.write_text("--beam_size=2\n--alpha=0.6\n--extra_decode_length=3\n"
                    "--max_input_length=64\n", encoding="utf-8")
  written = _export(f"--flagfile={recipe}", f"--model_dir={tiny_model_dir}",
                    f"--export_dir={tmp_path / 'b'}", "--format=ctranslate2")
  assert written.returncode == 0, written.stderr[-3000:]
  assert (tmp_path / "b" / "model.bin").exists()


@pytest.mark.slow
def test_saved_model_honours_min_decode_length(trained_reverse_dir, tmp_path):
  """--min_decode_length, carried by the SavedModel (loaded as TF Serving loads it):
  its translations are the decode command's with the same setting, which differ from
  those without it. The reverse model ends a translation after as many tokens as its
  source: MIN_LENGTH = 6 makes the short ones longer."""
  sentences = ["5 9 12", "7 4", "10 11 12 13 14 15 16", "20"]
  (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
  flags = ["--beam_size=2", "--extra_decode_length=8", f"--min_decode_length={MIN_LENGTH}"]

  def decode(*extra):
    result = inprocess.run("decode", f"--model_dir={trained_reverse_dir}",
                           f"--input_file={tmp_path / 'in.txt'}", *extra)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split("\n")[:-1]

  at_least, unbounded = decode(*flags), decode(*flags[:-1])
  assert [len(line.split()) for line in unbounded][:2] == [3, 2], unbounded  # reversed
  assert all(len(line.split()) >= MIN_LENGTH for line in at_least), at_least
  written = _export(f"--model_dir={trained_reverse_dir}", f"--export_dir={tmp_path / 'e'}",
                    "--export_version=1", *flags)
  assert written.returncode == 0, written.stderr[-3000:]
  served = SessionModel(str(tmp_path / "e" / "1"))
  out = served.run(inputs=np.array(sentences, object))["outputs"]
  assert [t.decode("utf-8") for t in out] == at_least
