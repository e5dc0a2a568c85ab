"""What users type that the code must not misread (issue: the user's path).

Every flag a message or a document names exists; a flag typed for a run that would
ignore it is refused or named; decode and export refuse model flags that disagree with
the model directory; a checkpoint of another model is refused, not half-restored; a
vocabulary too small for the corpus's characters says which flag to raise and to what.
"""

import ast
import glob
import os
import re

import keras
import pytest
import tensorflow as tf
from absl import flags

from t2t_keras import flags as t2t_flags
from t2t_keras.trained import modeldir
from t2t_keras import errors
from t2t_keras.inference import loading
from t2t_keras.configs import DecodeConfig, ModelConfig
from t2t_keras.data.sources import sources
from t2t_keras.data.tokens import tokenizer as tokenizer_lib
from t2t_keras.model import create_model
from tests import inprocess
from tests.conftest import REPO_ROOT

# Flags of other programs that the documents and messages name on purpose.
OTHER_PROGRAMS = {
    "flagfile", "verbosity", "v", "help", "helpfull",  # absl's own
    "port", "rest_api_port", "model_name", "model_base_path", "model_config_file",
    "enable_batching", "batching_parameters_file", "file_system_poll_wait_seconds",
    "tensorflow_session_parallelism", "xla_cpu_compilation_enabled",  # tensorflow_model_server
    "tensorflow_intra_op_parallelism", "tensorflow_inter_op_parallelism",  # (its threads)
    "dir", "all", "tag_set", "signature_def", "input_exprs",  # saved_model_cli
    "logdir",  # tensorboard
    "no",  # pip's --no-deps (the hyphen ends the match)
    "max",  # fairseq's --max-tokens (docs/decoding.md; the hyphen ends the match)
    "mode", "ffn_dropout",  # bench/peers (OpenNMT-tf's names)
    "select", "line",  # ruff (CONTRIBUTING.md: --select, --line-length)
    "dist", "durations",  # pytest and pytest-xdist (README's test command, CONTRIBUTING.md)
    "tf_xla_persistent_cache_directory", "tf_xla_persistent_cache_read_only",
    "tf_xla_persistent_cache_prefix",  # TensorFlow's TF_XLA_FLAGS (docs/training.md)
    "xla_cpu_use_thunk_runtime", "xla_cpu_enable_xprof_traceme",  # XLA_FLAGS (docs/benchmarks.md)
    "xla_backend_optimization_level",  # XLA_FLAGS (docs/benchmarks.md, tests/conftest.py)
    "xla_cpu_multi_thread_eigen",  # XLA_FLAGS (docs/benchmarks.md)
    "xla_cpu_use_onednn", "xla_cpu_experimental_xnn_graph_fusion_mode",  # XLA_FLAGS
    "xla_cpu_use_xnnpack", "xla_cpu_experimental_xnn_fusion_type",  # XLA_FLAGS
    "xla_cpu_experimental_ynn_fusion_type", "xla_cpu_experimental_onednn_fusion_type",
    "xla_cpu_experimental_onednn_custom_call",  # XLA_FLAGS (docs/benchmarks.md)
    "zone", "worker", "command",  # gcloud compute tpus tpu-vm ssh (docs/training.md)
    "force",  # wget's --force-directories (a datagen mirror's layout; the hyphen ends it)
    "runner", "project", "region", "temp_location", "setup_file", "requirements_file",
    "sdk_container_image", "max_num_workers",  # Beam's pipeline options (docs/decoding.md)
}
_FLAG_NAME = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)")


def _defined_flags():
  names = set()
  for path in glob.glob(os.path.join(REPO_ROOT, "**", "*.py"), recursive=True):
    if "/.venv/" in path:
      continue
    with open(path, encoding="utf-8") as f:
      text = f.read()
    names |= set(re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", text))
    names |= set(re.findall(r"(?:add_argument|add)\(\s*[\"']--(\w+)[\"']", text))
  # The shared flags are generated from the config fields (t2t_flags.define_settings).
  generated = flags.FlagValues()
  t2t_flags.define_all(generated)
  t2t_flags.define_settings(DecodeConfig, flag_values=generated)
  return names | set(generated)


def _unknown(names, defined):
  return {n for n in names if n not in defined and n not in OTHER_PROGRAMS
          and not (n.startswith("no") and n[2:] in defined)}


@pytest.mark.slow
def test_every_flag_named_in_code_and_documents_exists():
  defined = _defined_flags()
  assert {"data_source", "model_dir", "vocab_size", "tfds_data_dir"} <= defined
  bad = []
  for pattern in ("t2t_keras/**/*.py", "tools/*.py", "bench/**/*.py"):
    for path in glob.glob(os.path.join(REPO_ROOT, pattern), recursive=True):
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):  # every string literal: messages, help, docstrings
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
          for name in _unknown(_FLAG_NAME.findall(node.value), defined):
            bad.append(f"{os.path.relpath(path, REPO_ROOT)}:{node.lineno}: --{name}")
  documents = set()
  for pattern in ("*.md", "docs/*.md", "flags/*.cfg"):
    for path in glob.glob(os.path.join(REPO_ROOT, pattern)):
      documents.add(os.path.relpath(path, REPO_ROOT))
      with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
          for name in _unknown(_FLAG_NAME.findall(line), defined):
            bad.append(f"{os.path.relpath(path, REPO_ROOT)}:{number}: --{name}")
  assert not bad, "flags that do not exist:\n" + "\n".join(bad)
  # The topic pages BUILD.md links to are read too (they hold most of the flags).
  assert {"README.md", "BUILD.md", "docs/training.md", "docs/serving.md"} <= documents
  # The check can fail: the old message's flag is not a flag.
  assert _unknown(["source"], defined) == {"source"}


def _parsed(*args):
  fv = flags.FlagValues()
  t2t_flags.define_all(fv)
  argv = ["train", *args]
  cwd = os.getcwd()
  os.chdir(REPO_ROOT)  # flagfile paths resolve from the repository root
  try:
    fv(argv)
  finally:
    os.chdir(cwd)
  return argv, fv


def test_flags_typed_for_another_data_source_are_refused():
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--train_src=a.en", "--train_tgt=a.de")
  assert t2t_flags.command_line_flags(argv, fv) == ["train_src", "train_tgt"]
  with pytest.raises(flags.ValidationError) as error:
    t2t_flags.check_train_flags(argv, fv)
  message = str(error.value)
  assert "--train_src=a.en is set but --data_source=synthetic does not read it" in message
  assert "--train_tgt=a.de" in message and "add --data_source=files" in message
  # Switching the source on the command line is what the user meant: the preset's
  # synthetic flags came from the flagfile and pass silently.
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--data_source=files",
                     "--train_src=a.en", "--train_tgt=a.de")
  t2t_flags.check_train_flags(argv, fv)
  argv, fv = _parsed("--flagfile=flags/base_en_de.cfg", "--synthetic_task=copy",
                     "--tpu=local", "--nopre_norm")
  with pytest.raises(flags.ValidationError, match=r"--synthetic_task=copy .* "
                     r"--data_source=tfds .* add --data_source=synthetic.*--tpu is set"):
    t2t_flags.check_train_flags(argv, fv)


def test_tpu_strategy_needs_static_shapes():
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--strategy=tpu", "--tpu=local")
  with pytest.raises(flags.ValidationError, match="--strategy=tpu needs --static_shapes"
                     ".*add --static_shapes"):
    t2t_flags.check_train_flags(argv, fv)
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--strategy=tpu", "--tpu=local",
                     "--static_shapes", "--tpu_zone=us-central1-b", "--gcp_project=p")
  t2t_flags.check_train_flags(argv, fv)
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--tpu_zone=us-central1-b")
  with pytest.raises(flags.ValidationError, match="--tpu_zone is set but "
                     "--strategy=default does not use it: add --strategy=tpu, or drop"):
    t2t_flags.check_train_flags(argv, fv)


def test_old_shuffle_buffer_flag_warns_and_is_otherwise_harmless():
  argv, fv = _parsed("--flagfile=flags/demo.cfg")
  assert t2t_flags.check_train_flags(argv, fv) == []
  argv, fv = _parsed("--flagfile=flags/demo.cfg", "--shuffle_buffer=100000")
  (warning,) = t2t_flags.check_train_flags(argv, fv)
  assert "--shuffle_buffer is ignored" in warning and "drop the flag" in warning
  t2t_flags.data_config(fv)  # builds without it


def test_dry_run_reads_only_model_flags():
  argv, fv = _parsed("--dry_run", "--vocab_size=37000", "--hidden_size=1024")
  t2t_flags.check_train_flags(argv, fv)  # the default source is synthetic: no matter
  argv, fv = _parsed("--vocab_size=37000", "--", "--train_src=x")
  assert t2t_flags.command_line_flags(argv, fv) == ["vocab_size"]


def _run(module, *args):
  """`python -m t2t_keras.<module> ARGS` from the repository root, in this process
  (tests/inprocess.py: the messages and exit codes are the command's `main`'s)."""
  return inprocess.run(module, *args)


def test_train_cli_refuses_ignored_files(tmp_path):
  result = _run("train", "--flagfile=flags/tiny.cfg", f"--model_dir={tmp_path / 'm'}",
                "--train_src=x.en", "--train_tgt=x.de")
  assert result.returncode == 2, result.stderr[-2000:]
  assert _error(result).startswith("error: --train_src=x.en is set but "
                                   "--data_source=synthetic does not read it")
  assert not (tmp_path / "m").exists()


def test_source_pointer_without_copied_words_is_refused(tmp_path):
  result = _run("train", "--data_source=parsing", "--parsing_linearization=tags",
                "--train_src=train.mrg", "--source_pointer",
                f"--model_dir={tmp_path / 'm'}")
  assert result.returncode == 2, result.stderr[-2000:]
  assert "--parsing_linearization=words, or drop --source_pointer" in _error(result)
  assert not (tmp_path / "m").exists()


def _error(result) -> str:
  """The one `error:` line of a command's stderr (other lines may be the environment's
  TensorFlow log lines, e.g. with TF_CPP_MIN_LOG_LEVEL=2 set by the caller)."""
  lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1, result.stderr[-2000:]
  return lines[0]


def _decode(model_dir, *args, flagfile=None, tmp_path=None):
  source = tmp_path / "src.txt"
  source.write_text("a small dog runs\n", encoding="utf-8")
  recipe = [f"--flagfile={flagfile}"] if flagfile else []
  return _run("decode", *recipe, f"--model_dir={model_dir}", f"--input_file={source}",
              "--beam_size=1", "--extra_decode_length=2", *args)


def test_decode_refuses_model_flags_that_disagree(tiny_model_dir, tmp_path):
  saved = modeldir.load_model_config(tiny_model_dir)
  result = _decode(tiny_model_dir, "--hidden_size=64", "--nopre_norm",
                   "--learning_rate=3", tmp_path=tmp_path)
  assert result.returncode == 1, result.stderr[-2000:]
  assert (f"error: --hidden_size=64 but the model in --model_dir was trained with "
          f"{saved.hidden_size}") in result.stderr
  assert "--pre_norm" not in result.stderr  # agrees with config.json (post-norm)
  assert "Traceback" not in result.stderr
  # Agreeing model flags pass; a flag decode does not read gets a one-line warning; a
  # recipe flagfile shared with training may hold anything.
  recipe = tmp_path / "recipe.cfg"
  recipe.write_text("--hidden_size=999\n--learning_rate=5\n", encoding="utf-8")
  # The --vocab_size training was given (8000; SentencePiece built fewer pieces on
  # this small corpus) is accepted as well as the built size.
  assert saved.vocab_size < 8000
  result = _decode(tiny_model_dir, f"--hidden_size={saved.hidden_size}",
                   "--vocab_size=8000", "--learning_rate=3", "--relu_dropout=0.2",
                   flagfile=recipe, tmp_path=tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  # ("warning: --": TensorFlow's retracing notice joins them when commands share a process)
  warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: --")]
  assert warnings == [
      "warning: --learning_rate is not used by decode (the model directory's "
      "config.json and the decoding flags decide): ignored.",
      "warning: --relu_dropout is not used by decode (no dropout when decoding): "
      "ignored."]
  assert len(result.stdout.splitlines()) == 1


@pytest.mark.parametrize("changes,expected", [
    ({"filter_size": 48}, r"variable model/.*kernel has shape \(16, 48\) there but "
                          r"\(16, 32\) in the model built from config.json"),
    ({"num_hidden_layers": 1}, r"it lacks \d+ variable\(s\) that the model built from "
                               r"config.json has: model/decoder.*layer"),
])
def test_checkpoint_of_another_model_is_refused(tiny_model_dir, tmp_path, changes,
                                                expected):
  saved = modeldir.load_model_config(tiny_model_dir)
  other = ModelConfig(**{**saved.__dict__, **changes})
  keras.utils.set_random_seed(1)
  prefix = tf.train.CheckpointManager(tf.train.Checkpoint(model=create_model(other)),
                                      str(tmp_path / "other"), 1).save(3)
  with pytest.raises(errors.CheckpointError, match=expected) as error:
    loading.load(tiny_model_dir, checkpoint_path=prefix)
  assert prefix in str(error.value) and "ckpt-7" in str(error.value)
  # The model's own checkpoint still loads.
  assert loading.load(tiny_model_dir).checkpoints[0].endswith("ckpt-7")


def test_vocabulary_smaller_than_the_characters_names_the_flag(tmp_path):
  src, tgt = tmp_path / "train.en", tmp_path / "train.de"
  src.write_text("".join(f"the quick brown fox jumps {i}\n" for i in range(50)),
                 encoding="utf-8")
  tgt.write_text("".join(f"über den faulen hund {i}\n" for i in range(50)),
                 encoding="utf-8")
  result = _run("train", "--flagfile=flags/tiny.cfg", "--data_source=files",
                f"--train_src={src}", f"--train_tgt={tgt}", "--vocab_size=20",
                f"--model_dir={tmp_path / 'm'}", "--train_steps=1")
  assert result.returncode == 1, result.stderr[-2000:]
  match = re.search(r"error: --vocab_size=20 is too small for \S+: the training data has "
                    r"(\d+) distinct characters, which with the 4 reserved ids need at "
                    r"least (\d+) pieces\. Raise --vocab_size to \2 or more", result.stderr)
  assert match, result.stderr[-2000:]
  assert "Traceback" not in result.stderr and "RuntimeError" not in result.stderr
  minimum = int(match.group(2))
  sentences = [line for path in (src, tgt) for line in
               path.read_text(encoding="utf-8").splitlines()]
  # The advice works: the suggested size builds; one less does not.
  tokenizer_lib.train_sentencepiece(sentences, str(tmp_path / "ok.model"), minimum)
  with pytest.raises(sources.DataError, match=f"least {minimum} pieces"):
    tokenizer_lib.train_sentencepiece(sentences, str(tmp_path / "no.model"), minimum - 1)


def test_export_refuses_model_flags_that_disagree(tiny_model_dir, tmp_path):
  result = _run("export", f"--model_dir={tiny_model_dir}",
                f"--export_dir={tmp_path / 'export'}", "--num_heads=8", "--max_length=50")
  assert result.returncode == 1, result.stderr[-2000:]
  assert _error(result).startswith("error: --num_heads=8 but the model in --model_dir "
                                   "was trained with 2")
  assert not (tmp_path / "export").exists()


def test_the_entry_points_main_exits_1_for_user_errors_and_2_for_usage(monkeypatch, capsys):
  """console.Command, the main() of train, decode, score, evaluate and export."""
  from absl import app  # pylint: disable=import-outside-toplevel

  from t2t_keras import console  # pylint: disable=import-outside-toplevel
  from t2t_keras.errors import InputError  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(console, "setup_logging", lambda: None)
  runs = []
  command = console.Command(lambda: runs.append(1), model_dir=None)
  with pytest.raises(app.UsageError, match="positional"):
    command.main(["prog", "stray"])
  command.main(["prog"])
  assert runs == [1]

  def fail(message):
    def raise_():
      raise InputError(message)
    return raise_
  with pytest.raises(SystemExit) as exited:
    console.Command(runs.clear, check=fail("--x is wrong"), model_dir=None).main(["prog"])
  assert exited.value.code == 2 and runs == [1]  # refused before the work
  with pytest.raises(SystemExit) as exited:
    console.Command(fail("in.txt is missing"), model_dir=None).main(["prog"])
  assert exited.value.code == 1
  assert capsys.readouterr().err.splitlines() == ["error: --x is wrong",
                                                  "error: in.txt is missing"]


# A command's process, as `python -m t2t_keras.X` or a console script ends one
# (console.Command), without TensorFlow: what `sys.exit` promises still happens,
# Python's teardown does not, unless the process may go on after the command.
EXIT_SCRIPT = """
import atexit, concurrent.futures, sys, threading, time
from t2t_keras import console

class TornDown:
  def __del__(self):
    print("torn down", flush=True)

KEPT = TornDown()  # freed by Python's teardown only
atexit.register(lambda: print("atexit ran"))
POOL = concurrent.futures.ThreadPoolExecutor(1)  # left idle, as tensorflow-datasets' are

def run():
  if CODE == "pipe":  # a reader that goes away (`| head`)
    for _ in range(100_000):
      print("a line of output")
  POOL.submit(print, "", end="").result()
  print("buffered", end="")  # stdout is a pipe: block-buffered, not yet written
  threading.Thread(target=lambda: (time.sleep(0.5), print(" thread done"))).start()
  threading.Thread(target=time.sleep, args=(SLEEP,), name=console.FREES_MEMORY_ONLY).start()
  sys.exit(CODE if CODE != "3" else 3)

CODE, SLEEP, HOW, sys.argv = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[:1]
command = console.Command(run, model_dir=None)
if HOW == "launcher":  # pip's console script
  command.console_script_main()
elif HOW == "module":  # python -m: the module's __main__ guard
  command.console_main()
else:  # a script of the user's that goes on after the command
  try:
    command.console_main()
  except SystemExit as done:
    print(" caught", done.code)
"""


@pytest.mark.slow
def test_a_command_ends_as_sys_exit_does_without_pythons_teardown(tmp_path):
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  (tmp_path / "command.py").write_text(EXIT_SCRIPT, encoding="utf-8")

  # The thread that only frees memory sleeps an hour by default, far past the run's
  # timeout: a command that waited for it would time out (no wall-clock bound that a
  # busy host could break).
  def end(code, how, sleep=3600, **env):
    program = ["-m", "command"] if how == "module" else [str(tmp_path / "command.py")]
    result = subprocess.run([sys.executable, *program, code, str(sleep), how],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
                            check=False, stdin=subprocess.DEVNULL, env=dict(
                                os.environ, PYTHONPATH=os.pathsep.join(
                                    [str(tmp_path), REPO_ROOT]), **env))
    return result

  for how in ("launcher", "module"):
    result = end("3", how)
    assert result.returncode == 3, result.stderr[-2000:]
    # Output flushed, the worker thread waited for (the idle pool told to stop),
    # atexit run; no teardown, and the thread that only frees memory (an hour here)
    # not waited for.
    assert result.stdout == "buffered thread done\natexit ran\n", (how, result.stdout)
  result = end("stopped: see above", "launcher")  # sys.exit("message"): status 1
  assert result.returncode == 1 and result.stderr.strip() == "stopped: see above"
  assert "torn down" not in result.stdout
  # A script that catches the exit goes on, and its process ends as Python ends it;
  # so do `python -i` and one task of a cluster (TensorFlow's teardown is part of its
  # shutdown).
  result = end("3", "script", sleep=0)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout == "buffered caught 3\n thread done\natexit ran\ntorn down\n", (
      result.stdout)
  # A closed stdout ends the command quietly, status 1 (as Unix tools do).
  closed = subprocess.Popen([sys.executable, str(tmp_path / "command.py"), "pipe", "0",
                             "launcher"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                [str(tmp_path), REPO_ROOT])))
  closed.stdout.close()
  assert closed.wait(timeout=120) == 1 and closed.stderr.read() == b""
  closed.stderr.close()
  for env in ({"PYTHONINSPECT": "1"}, {"TF_CONFIG": '{"cluster": {}}'}):
    result = end("3", "launcher", sleep=0, **env)
    assert "torn down" in result.stdout, (env, result.stdout)


def test_jit_compile_without_one_shape_per_program_warns_at_the_start():
  """XLA compiles once per batch shape: with dynamic shapes nearly every step. The
  warning names both ways to one shape per program and says why; either of them, or
  no XLA, is quiet."""
  argv, fv = _parsed("--flagfile=flags/tiny.cfg", "--jit_compile")
  (warning,) = t2t_flags.check_train_flags(argv, fv)
  assert "--static_shapes" in warning and "--packed_length" in warning
  assert "XLA compiles the train step once per batch shape" in warning
  for quiet in (["--static_shapes"], ["--packed_length=64"], ["--static_shapes",
                                                               "--packed_length=64"]):
    argv, fv = _parsed("--flagfile=flags/tiny.cfg", "--jit_compile", *quiet)
    assert t2t_flags.check_train_flags(argv, fv) == [], quiet
  argv, fv = _parsed("--flagfile=flags/tiny.cfg")
  assert t2t_flags.check_train_flags(argv, fv) == []


def test_collective_is_for_multi_worker_runs():
  argv, fv = _parsed("--flagfile=flags/tiny.cfg", "--collective=nccl")
  with pytest.raises(flags.ValidationError, match="--collective is set but "
                     "--strategy=default does not use it: add "
                     "--strategy=multi_worker_mirrored, or drop --collective"):
    t2t_flags.check_train_flags(argv, fv)
  argv, fv = _parsed("--flagfile=flags/tiny.cfg", "--collective=ring",
                     "--strategy=multi_worker_mirrored")
  assert t2t_flags.check_train_flags(argv, fv) == []
