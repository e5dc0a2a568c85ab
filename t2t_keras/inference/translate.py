"""Host-side decoding: strings in, translations out, in input order, with progress.

`t2t_keras.inference.decoding` holds what runs in the graph (ids -> ids with the cache); this
module feeds it: it tokenizes, sorts sentences by length into batches (little
padding), pads batches to few shapes under XLA (`decoding.padded_width`), detokenizes and puts
the results back in input order. It also decodes a dev set for the exact-match report
that training prints. The decode command uses it (the score command only its truncation
note); the exported SavedModel does the same steps in its graph.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import sys
import time
from typing import Callable, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from t2t_keras import BOS_ID, EOS_ID, PAD_ID, console
from t2t_keras.inference import decoding
from t2t_keras.configs import DecodeConfig

def strip_ids(ids: Sequence[int]) -> List[int]:
  """Ids before the first EOS, without PAD or BOS."""
  out = []
  for i in ids:
    i = int(i)
    if i == EOS_ID:
      break
    if i not in (PAD_ID, BOS_ID):
      out.append(i)
  return out


@dataclasses.dataclass
class Translation:
  """The best translation of one input; every beam, best first, with `return_beams`;
  the samples in drawing order when sampling.

  `source_ids` are the input's ids as decoded (EOS included, after truncation to
  `max_input_length`); `ids` each beam's output ids without EOS or PAD; `truncated`
  whether the input was longer than `max_input_length` and cut (callers report it:
  `truncation_note`).
  """

  texts: List[str]
  scores: List[float]
  ids: List[List[int]] = dataclasses.field(default_factory=list)
  source_ids: List[int] = dataclasses.field(default_factory=list)
  truncated: bool = False


def truncation_note(cut: int, total: int, max_input_length: int, what: str = "input "
                    "sentences", doing: str = "translate") -> Optional[str]:
  """One line saying how many inputs were cut to max_input_length, or None if none was."""
  if not cut:
    return None
  return (f"note: {cut} of {total} {what} were longer than --max_input_length="
          f"{max_input_length} subwords (EOS included) and were cut to it; raise "
          f"--max_input_length to {doing} them whole.")


def translate(decode_fn: Union[Callable, Sequence[Callable]], tokenizer,
              sentences: Sequence[str], config: DecodeConfig, *,
              target_prefixes: Optional[Sequence[str]] = None, progress=True,
              first_key: int = 0) -> List[Translation]:
  """Translates strings; the result is in input order.

  Sentences are tokenized in the graph (a multilingual model's sources start with the
  tag of `config.target_language`, language_tags.py), cut to `config.max_input_length`
  tokens (EOS and tag included; 0 = no cut), sorted by length and decoded in batches
  of `config.batch_size` sentences, and of `config.batch_tokens` source tokens when set
  (`batches`; little of each batch is padding), then put back in input order. With
  `config.jit_compile` (XLA) every batch is padded to `config.batch_size` rows (with a
  token cap, to the next power of two rows; filler rows are PAD alone, end at step 0
  and are discarded) and to `decoding.padded_width` columns, so XLA compiles once per width
  bucket, not per batch. `config.parallel_batches` > 1 decodes that many batches at a
  time, from as many threads; the caller sets TensorFlow's threads per op before its
  runtime starts, as `translator.Translator` does (`translator.choose_parallel_batches`).
  Given a list of N functions (one per device), batch i is decoded by the i-th mod N,
  `config.parallel_batches` at a time on each: the same batches, the same results.

  Args:
    decode_fn: `decoding.make_decode_fn(model, config, ...)`: the model, and the tree
      constraint of a parsing model, are its; or a list of them, one per device
      (`make_decode_fn(..., device=...)` over the model's copy on that device).
    tokenizer: the data tokenizer (tokenize/detokenize).
    sentences: source strings.
    config: the settings `decode_fn` was made with.
    target_prefixes: one string per sentence (may be empty) that its translation
      must start with (`processors.TargetPrefix`).
    progress: print a progress line to stderr; or a `console.Progress` to update
      (the decode command's, over all its windows).
    first_key: the line number of `sentences[0]` in the whole input: sampling keys
      are line numbers, so a window or shard of a file samples as the whole file.
  """
  if not sentences:
    return []
  decode_fns = list(decode_fn) if isinstance(decode_fn, (list, tuple)) else [decode_fn]
  if target_prefixes is not None and len(target_prefixes) != len(sentences):
    raise ValueError(f"{len(target_prefixes)} target prefixes for {len(sentences)} "
                     "sentences: give one per sentence (an empty one decodes freely)")
  prefixes = None
  if target_prefixes is not None:
    prefixes = [list(p) for p in tokenizer.target.tokenize(tf.constant(list(target_prefixes),
                                                                tf.string)).to_list()]
  sources, truncated = _sources(tokenizer, sentences, config)
  results: List[Optional[Translation]] = [None] * len(sources)
  meter = progress if isinstance(progress, console.Progress) else (
      console.Progress(len(sources)) if progress else None)

  def decode_batch(chunk, decode_fn):
    out_ids, scores = decode_fn(*_decode_args(chunk, sources, prefixes, config, first_key))
    # Only the search's final results: without return_beams it stops once each row's
    # best beam is final, and the other beams may be unfinished.
    if not (config.return_beams or config.sampling):
      out_ids, scores = out_ids[:, :1], scores[:, :1]
    texts = tokenizer.detokenize(out_ids).numpy()  # (B, K)
    scores, out_ids = scores.numpy(), out_ids.numpy()
    for row, i in enumerate(chunk):
      results[i] = Translation([t.decode("utf-8") for t in texts[row]],
                               [float(s) for s in scores[row]],
                               [strip_ids(beam) for beam in out_ids[row]], sources[i],
                               truncated[i])
    return len(chunk)

  chunks = batches([len(s) for s in sources], config)
  # Batches side by side (--decode_parallel_batches; TensorFlow frees the GIL while
  # it decodes), on each device; results and progress in batch order. Batch i goes to
  # device i mod N: the batches do not depend on N, so neither do the translations.
  devices = len(decode_fns)
  workers = min(config.parallel_batches, math.ceil(len(chunks) / devices))
  with contextlib.ExitStack() as stack:
    if devices == 1 and workers <= 1:  # one batch at a time, in this thread
      counts = (decode_batch(chunk, decode_fns[0]) for chunk in chunks)
    else:  # a pool of threads per device
      pools = [stack.enter_context(concurrent.futures.ThreadPoolExecutor(max(workers, 1)))
               for _ in decode_fns]
      futures = [pools[i % devices].submit(decode_batch, chunk, decode_fns[i % devices])
                 for i, chunk in enumerate(chunks)]
      counts = (future.result() for future in futures)
    for count in counts:
      if meter:
        meter.update(count)
  return results


def _sources(tokenizer, sentences: Sequence[str], config: DecodeConfig) -> tuple:
  """The source ids of `sentences` (tag, pieces, EOS), cut to `config.max_input_length`,
  and whether each was cut."""
  ids = tokenizer.tokenize(tf.constant(list(sentences))).to_list()
  tag = [tokenizer.tag_id(config.target_language)] if config.target_language else []
  limit = config.max_input_length
  sources, truncated = [], []
  for seq in ids:
    seq = tag + list(seq) + [EOS_ID]
    truncated.append(bool(limit) and len(seq) > limit)
    if truncated[-1]:
      seq = seq[:limit - 1] + [EOS_ID]
    sources.append(seq)
  return sources, truncated


def _decode_args(chunk: List[int], sources: List[List[int]],
                 prefixes: Optional[List[List[int]]], config: DecodeConfig,
                 first_key: int = 0) -> list:
  """The arguments of a `make_decode_fn` function for the sentences `chunk`: their
  padded ids, keys when sampling (line numbers: `first_key` + index), padded prefixes
  when given. Under XLA the batch is
  padded to few shapes (see `translate`); filler rows are PAD alone (`decode_ids` ends
  them at step 0)."""
  width = max(len(sources[i]) for i in chunk)
  rows = len(chunk)
  if config.jit_compile:
    width = decoding.padded_width(width)
    rows = config.batch_size if not config.batch_tokens else min(
        config.batch_size, decoding.padded_width(rows, minimum=1))
  batch = np.full((rows, width), PAD_ID, np.int32)
  for row, i in enumerate(chunk):
    batch[row, :len(sources[i])] = sources[i]
  args = [tf.constant(batch)]
  if config.sampling:  # filler rows (XLA) get key -1
    keys = np.full([rows], -1, np.int32)
    keys[:len(chunk)] = np.asarray(chunk) + first_key
    args.append(tf.constant(keys))
  if prefixes is not None:
    longest = max(len(prefixes[i]) for i in chunk)
    if config.jit_compile:
      longest = decoding.padded_width(longest, minimum=1)
    prefix = np.full((rows, longest), PAD_ID, np.int32)
    for row, i in enumerate(chunk):
      prefix[row, :len(prefixes[i])] = prefixes[i]
    args.append(tf.constant(prefix))
  return args


def batches(lengths: Sequence[int], config: DecodeConfig) -> List[List[int]]:
  """The decoding batches of sources of these lengths (EOS included): indices in
  length order, at most `config.batch_size` per batch and, with
  `config.batch_tokens`, at most that many tokens (rows x the longest source;
  under XLA rows x its padded width)."""
  order = np.argsort(lengths, kind="stable")
  chunks: List[List[int]] = []
  for i in order:
    if chunks and len(chunks[-1]) < config.batch_size:
      width = lengths[i]  # the longest so far: lengths ascend
      if config.jit_compile:
        width = decoding.padded_width(width)
      if not config.batch_tokens or (len(chunks[-1]) + 1) * width <= config.batch_tokens:
        chunks[-1].append(int(i))
        continue
    chunks.append([int(i)])
  return chunks


def exact_match(model, dataset: tf.data.Dataset, config: DecodeConfig,
                max_batches: int = 0):
  """Sequence exact-match accuracy of the best beam on a one-pass dataset.

  Returns:
    (accuracy, number of sequences, list of (input ids, target ids, output ids)).
  """
  decode_fn = decoding.make_decode_fn(model, config)
  correct = total = 0
  examples = []
  for n, batch in enumerate(dataset):
    if max_batches and n >= max_batches:
      break
    out_ids, _ = decode_fn(tf.cast(batch["inputs"], tf.int32))
    for src, tgt, out in zip(batch["inputs"].numpy(), batch["targets"].numpy(),
                             out_ids[:, 0].numpy()):
      if not np.any(tgt != PAD_ID):
        continue  # an all-PAD filler row of a static-shape batch
      expected, got = strip_ids(tgt), strip_ids(out)
      correct += expected == got
      total += 1
      examples.append((strip_ids(src), expected, got))
  return correct / max(total, 1), total, examples


def report_examples(model, datasets, decode_config: DecodeConfig, n: int,
                    whole_dev_set: bool = False, stream=None) -> Optional[float]:
  """Prints `n` dev examples decoded with `model`, spread over the dev lengths.

  Only the shown pairs are decoded (one batch of `n` rows), so printing five lines
  costs five sentences on any device; `whole_dev_set` (--dev_exact_match) decodes
  every dev pair instead and prints the exact-match accuracy of the best beam too.

  Returns:
    The sequence exact-match accuracy over the dev set with `whole_dev_set`, else None.
  """
  stream = stream or sys.stdout
  start = time.time()
  accuracy = None
  if whole_dev_set:
    accuracy, total, examples = exact_match(model, datasets.eval_fn(None), decode_config)
    shown = _spread(examples, n)
  else:
    # The dev pairs as the dev batches hold them (no decoding: reading them is cheap).
    pairs = [(src[:np.flatnonzero(src != PAD_ID).max(initial=-1) + 1], tgt)
             for batch in datasets.eval_fn(None)
             for src, tgt in zip(batch["inputs"].numpy(), batch["targets"].numpy())
             if np.any(tgt != PAD_ID)]  # not an all-PAD filler row of a static batch
    pairs = _spread(pairs, n)
    outputs = []
    if pairs:  # the shown sources as they are in the dev batches, in one batch
      inputs = np.full((len(pairs), max(len(src) for src, _ in pairs)), PAD_ID, np.int32)
      for row, (src, _) in enumerate(pairs):
        inputs[row, :len(src)] = src
      out_ids, _ = decoding.make_decode_fn(model, decode_config)(tf.constant(inputs))
      outputs = [strip_ids(out) for out in out_ids[:, 0].numpy()]
    shown = [(strip_ids(src), strip_ids(tgt), out) for (src, tgt), out in zip(pairs, outputs)]
  tokenizer = datasets.tokenizer

  def text(ids):
    return tokenizer.detokenize(tf.constant([ids or [EOS_ID]], tf.int32)).numpy()[0].decode(
        "utf-8", "replace")

  for src, tgt, out in shown:
    mark = "ok " if tgt == out else "BAD"
    print(f"{mark} input:     {text(src)}\n    reference: {text(tgt)}\n"
          f"    output:    {text(out)}", file=stream)
  settings = (f"beam {decode_config.beam_size}, alpha {decode_config.alpha}; "
              f"{time.time() - start:.1f}s")
  if accuracy is not None:
    print(f"dev exact match: {accuracy:.2%} of {total} sequences ({settings})",
          file=stream, flush=True)
  else:
    print(f"{len(shown)} dev examples ({settings}; --dev_exact_match decodes the whole "
          "dev set for its exact-match accuracy)", file=stream, flush=True)
  return accuracy


def _spread(items: list, n: int) -> list:
  """`n` of `items` at even intervals: dev batches come sorted by length, so the
  examples span all lengths."""
  if not items or n <= 0:
    return []
  return [items[i] for i in np.linspace(0, len(items) - 1, min(n, len(items)), dtype=int)]
