"""transformers' generate beside the decode command, on a trained model and real sentences.

  .venv/bin/pip install -e ".[huggingface]"
  .venv/bin/python bench/huggingface_real.py --model_dir=/tmp/m30k \
      --src=../shared/data/multi30k/test2016.en --sentences=1000

Exports the model with `--format=huggingface` (into --export_dir, default a temporary
directory), then translates the first --sentences lines of --src twice with the same
search: beam --beam_size, plain log probabilities (the decode command's --alpha=0,
transformers' length_penalty=0):

  decode        `python -m t2t_keras.decode` (a process: its decoding time is its own
                progress line's, without TensorFlow's start and the restore)
  transformers  AutoTokenizer + AutoModelForSeq2SeqLM.generate, batches of at most
                --batch_size sentences of one source length, so that each sentence's
                limit is the decode command's (source + EOS + --extra_decode_length,
                EOS forced at it); timed from the text in to the text out, on
                --torch_threads threads

Prints the share of identical translations and each engine's sentences/s. Indicative
only on a shared host: run it alone for figures to keep.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args):
  """Runs `python -m args`; returns (wall seconds, its stderr)."""
  start = time.perf_counter()
  result = subprocess.run([sys.executable, "-m", *args], cwd=REPO,
                          stderr=subprocess.PIPE, text=True, check=False)
  if result.returncode:
    sys.exit(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
  return time.perf_counter() - start, result.stderr


def _decoding_seconds(stderr: str) -> float:
  """The decode command's own time (its last progress line's elapsed), start excluded."""
  found = re.findall(r"decoded \d+/\d+ sentences \([^)]*elapsed (\d+)s", stderr)
  return float(found[-1]) if found else float("nan")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--src", required=True)
  parser.add_argument("--sentences", type=int, default=1000)
  parser.add_argument("--beam_size", type=int, default=4)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--extra_decode_length", type=int, default=50)
  parser.add_argument("--export_dir", default=None)
  # One: PyTorch's OpenMP threads spin while they wait, and on a host that other
  # processes load, 2 threads ran generate 25 times slower than 1.
  parser.add_argument("--torch_threads", type=int, default=1)
  # Any other flag (--average_last_n=1, --checkpoint_path=...) goes to both commands.
  args, weights = parser.parse_known_args()

  work = tempfile.mkdtemp(prefix="hf_bench_")
  export_dir = args.export_dir or os.path.join(work, "hf")
  with open(args.src, encoding="utf-8") as f:
    lines = [line.rstrip("\n") for _, line in zip(range(args.sentences), f)]
  source = os.path.join(work, "src.txt")
  with open(source, "w", encoding="utf-8") as f:
    f.write("".join(line + "\n" for line in lines))
  if not os.path.exists(os.path.join(export_dir, "model.safetensors")):
    _run(["t2t_keras.export", f"--model_dir={args.model_dir}", f"--export_dir={export_dir}",
          "--format=huggingface", "--alpha=0", f"--beam_size={args.beam_size}",
          f"--extra_decode_length={args.extra_decode_length}", *weights])

  common = [f"--model_dir={args.model_dir}", f"--beam_size={args.beam_size}", "--alpha=0",
            f"--extra_decode_length={args.extra_decode_length}",
            f"--decode_batch_size={args.batch_size}", *weights]
  ours_file = os.path.join(work, "decode.txt")
  decode_wall, stderr = _run(["t2t_keras.decode", *common, f"--input_file={source}",
                              f"--output_file={ours_file}"])
  decode_seconds = _decoding_seconds(stderr)
  with open(ours_file, encoding="utf-8") as f:
    ours = f.read().splitlines()

  # pylint: disable=import-outside-toplevel
  import torch
  import transformers
  torch.set_num_threads(args.torch_threads)
  tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
  model = transformers.AutoModelForSeq2SeqLM.from_pretrained(export_dir).eval()
  start = time.perf_counter()
  encoded = [tokenizer(line)["input_ids"] for line in lines]
  # Batches of sources of one length: each sentence's limit is then the decode
  # command's (transformers takes one max_new_tokens per batch), and no padding.
  by_length = {}
  for i, ids in enumerate(encoded):
    by_length.setdefault(len(ids), []).append(i)
  batches = [group[first:first + args.batch_size] for _, group in sorted(by_length.items())
             for first in range(0, len(group), args.batch_size)]
  theirs = [None] * len(lines)
  with torch.inference_mode():
    for rows in batches:
      batch = tokenizer([lines[i] for i in rows], return_tensors="pt", padding=True)
      limit = batch["input_ids"].shape[1] + args.extra_decode_length
      generated = model.generate(**batch, num_beams=args.beam_size, length_penalty=0.0,
                                 max_new_tokens=limit, early_stopping=False)
      for i, text in zip(rows, tokenizer.batch_decode(generated, skip_special_tokens=True)):
        theirs[i] = text
  hf_seconds = time.perf_counter() - start

  same = sum(a == b for a, b in zip(ours, theirs))
  print(f"sentences: {len(lines)} of {args.src}; beam {args.beam_size}, no length penalty")
  print(f"identical translations: {same}/{len(lines)} ({100.0 * same / len(lines):.1f}%)")
  print(f"decode command: {decode_seconds:.0f} s decoding by its progress line "
        f"({len(lines) / decode_seconds:.1f} sentences/s); {decode_wall:.1f} s with "
        "TensorFlow's start and the restore")
  print(f"transformers generate (torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads): {hf_seconds:.1f} s ({len(lines) / hf_seconds:.1f} sentences/s)")
  for a, b, src in list((a, b, s) for a, b, s in zip(ours, theirs, lines) if a != b)[:5]:
    print(f"  differs: {src!r}\n    decode:       {a!r}\n    transformers: {b!r}")


if __name__ == "__main__":
  main()
