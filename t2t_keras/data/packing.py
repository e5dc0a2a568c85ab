"""Packed rows (--packed_length=L): several training pairs side by side in one row of L
tokens a side, as tensor2tensor's `_packed` problems (its TPU default) and Flax's WMT
example train.

Why: with static shapes (TPU, XLA) an unpacked run compiles one program per length
bucket (21 at max_length 40, 42 at 256) and pads every pair to its bucket. A packed
batch always has the shape [R, L], R = batch_size // L, so a run compiles one program.

Within the batch plan. Packing changes only how many pairs a batch of a bucket holds,
not how the plan picks them (plan.py: its seeded shuffle, resume at any step, shares
per host and replica, corpus weights): a batch of bucket b (pairs of at most len_b
tokens with EOS, on both sides) holds k_b x R pairs, k_b = L // len_b, and row r
concatenates the pairs r k_b ... r k_b + k_b - 1, at most k_b x len_b <= L tokens a
side. So a row never overflows, every pair of the batch is in it exactly once, and no
pair is ever split or dropped for lack of room. Pairs of one bucket have nearly equal
lengths (buckets grow by --length_bucket_step), so k_b same-length pairs are most of
what a row can take; the rest (L mod len_b, and short rows where the last pairs are
shorter) is the padding left. The unpacked plan's batch of bucket b holds
batch_size // len_b pairs, about as many tokens: the token budget keeps its meaning.

Features. Besides "inputs" and "targets" [R, L] (PAD_ID between and after the pairs),
a packed batch carries t2t's names: "inputs_segmentation" / "targets_segmentation",
int32 [R, L], the pair's number in its row from 1 (0 at padding), and "inputs_position"
/ "targets_position", each token's position within its pair (from 0). The model reads
them (model.py): attention stays within a segment (encoder, causal decoder and
encoder-decoder attention), positions restart at each segment, and each segment's
first decoder input is BOS. The loss already counts real tokens only (PAD excluded),
each once.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import tensorflow as tf

from t2t_keras import PAD_ID

SEGMENTS = {"inputs": "inputs_segmentation", "targets": "targets_segmentation"}
POSITIONS = {"inputs": "inputs_position", "targets": "targets_position"}
FEATURES = tuple(SEGMENTS.values()) + tuple(POSITIONS.values())


def rows(batch_size: int, packed_length: int) -> int:
  """R: packed rows per batch (at least 1)."""
  return max(1, batch_size // packed_length)


def pairs_per_row(boundaries: Sequence[int], packed_length: int) -> List[int]:
  """k_b: pairs of each bucket (padded length len_b <= L) a packed row holds."""
  return [max(1, packed_length // length) for length in boundaries]


def pairs_per_batch(boundaries: Sequence[int], batch_size: int, packed_length: int
                    ) -> List[int]:
  """The batch plan's pairs per batch of each bucket when packing: k_b x R."""
  return [k * rows(batch_size, packed_length)
          for k in pairs_per_row(boundaries, packed_length)]


def pack(sides: Dict[str, tf.RaggedTensor], per_row, shape: Sequence[int]
         ) -> Dict[str, tf.Tensor]:
  """Packs a batch's pairs, `per_row` consecutive pairs a row.

  Args:
    sides: {"inputs": ids, "targets": ids}, int ragged [N, None] with EOS, N a
      multiple of per_row, and per_row pairs of each side fitting `shape[1]` tokens.
    per_row: scalar int (a tensor is fine: the bucket's k_b).
    shape: [R, L] of every output, R = N // per_row.

  Returns:
    {"inputs", "targets", "inputs_segmentation", "targets_segmentation",
     "inputs_position", "targets_position"}: int32 [R, L].
  """
  out = {}
  for key, ids in sides.items():
    lengths = ids.row_lengths()  # [N]
    k = tf.cast(per_row, lengths.dtype)
    segment = tf.range(tf.size(lengths, lengths.dtype)) % k + 1  # [N], from 1
    features = {key: ids.values,
                SEGMENTS[key]: tf.repeat(segment, lengths),
                POSITIONS[key]: tf.ragged.range(lengths).flat_values}
    for name, values in features.items():
      pairs = tf.RaggedTensor.from_row_lengths(tf.cast(values, tf.int32), lengths,
                                               validate=False)
      packed = tf.RaggedTensor.from_uniform_row_length(pairs, k, validate=False)
      row = packed.merge_dims(1, 2)  # [R, None]: a row's pairs, one after the other
      fits = tf.debugging.assert_less_equal(  # to_tensor would cut a longer row
          row.row_lengths(), tf.cast(shape[1], lengths.dtype),
          message=f"packed {key} longer than the row (a bug: see packing.py)")
      with tf.control_dependencies([fits]):
        out[name] = tf.ensure_shape(row.to_tensor(PAD_ID, shape=shape), shape)
  return out
