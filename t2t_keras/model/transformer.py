"""The Transformer encoder-decoder (paper section 3) as a Keras 3 Model.

Shapes: B batch, S source length, T target length, L cache length, D d_model, V vocab.

Data convention (shared with the data pipeline): `inputs` are source ids + EOS and
`targets` are target ids + EOS, both padded with PAD_ID = 0. The model shifts targets
right itself (decoder inputs are BOS followed by targets[:, :-1]), so the logits at
position t predict targets[:, t].

Besides `call` (teacher forcing), the model exposes the pieces decoding needs:
`encode`, `cross_key_values` (encoder keys/values projected once per source),
`init_cache` (fixed-size self-attention caches) and `decode_step` (one token for
every sequence, returning the updated cache). decoding.py drives them (beam search,
greedy search and sampling).

With `source_pointer` (ModelConfig), for targets that copy their source in order
between tokens of their own (parsing's "words" linearization), each decoder input
also gets the (projected) encoder output at the source position the target has copied
up to: the pointer starts at 0 and moves on by one whenever a decoder input is the
source token it points at (`advance_pointer`), so "(NP , , (NP ..." moves it past the
source's "," once, at the word, and not at the tag "," that follows; it stops at the
source's EOS. No vocabulary knowledge is needed. Teacher forcing computes the pointers
from the targets (`source_pointers`); incremental decoding carries them (`decode_step`).
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf
from keras import ops

from t2t_keras import BOS_ID, PAD_ID
from t2t_keras.configs import ModelConfig
from t2t_keras.model.layers import (DecoderLayer, Dropout, EncoderLayer, LearnedPosition,
                              SharedEmbedding, SinusoidalPosition, decoder_step)
from t2t_keras.model.layers.position import sinusoid

_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16",
             "mixed_bfloat16": "mixed_bfloat16", "mixed_float16": "mixed_float16"}


def dtype_policy(dtype: str) -> str:
  """Keras policy for a --dtype value: variables stay float32 under bf16/fp16."""
  return _POLICIES[dtype]


def padding_mask(ids):
  """(B, S) ids -> boolean (B, 1, 1, S), True at real (non-PAD) positions."""
  return ops.not_equal(ids, PAD_ID)[:, None, None, :]


def causal_mask(length):
  """Boolean (1, 1, T, T): position t may attend to positions <= t."""
  positions = ops.arange(length)
  return (positions[None, :] <= positions[:, None])[None, None]


def segment_mask(query_segments, key_segments):
  """Packed rows: segment ids (B, T) of the queries and (B, S) of the keys (0 at
  padding) -> boolean (B, 1, T, S), True where the key is a real token of the query's
  segment (pair)."""
  same = ops.equal(query_segments[:, :, None], key_segments[:, None, :])
  return ops.logical_and(same, ops.not_equal(key_segments, 0)[:, None, :])[:, None]


def advance_pointer(pointer, ids, inputs):
  """The source pointer after decoder input `ids`: pointer (R,), ids (R,), source ids
  inputs (R, S) -> pointer + 1 where ids is the source token at the pointer (capped at
  the last position)."""
  pointer = ops.cast(pointer, "int32")
  last = ops.shape(inputs)[1] - 1
  at = ops.take_along_axis(ops.cast(inputs, "int32"),
                           ops.minimum(pointer, last)[:, None], axis=1)[:, 0]
  return pointer + ops.cast(ops.equal(ops.cast(ids, "int32"), at), "int32")


def shift_right(targets):
  """(B, T) targets -> (B, T) decoder inputs: BOS, targets[:, :-1]."""
  bos = ops.full_like(targets[:, :1], BOS_ID)
  return ops.concatenate([bos, targets[:, :-1]], axis=1)


@keras.saving.register_keras_serializable(package="t2t_keras")
class Transformer(keras.Model):
  """Encoder-decoder Transformer with shared embeddings and float32 logits.

  Args:
    config: a ModelConfig (or its dict form, as stored by get_config).

  Call arguments:
    inputs: dict with "inputs" (B, S) and "targets" (B, T) int ids; for packed rows
      (several pairs a row, --packed_length) also their segment ids and positions
      (`t2t_keras.data.batching.packing.FEATURES`).
    training: whether dropout is active.

  Returns:
    float32 logits (B, T, V).
  """

  def __init__(self, config, **kwargs):
    if isinstance(config, dict):
      config = ModelConfig(**config)
    config.validate()
    kwargs.setdefault("dtype", dtype_policy(config.dtype))
    kwargs.setdefault("name", "transformer")
    super().__init__(**kwargs)
    self.model_config = config

  # ---------------------------------------------------------------- building
  def build(self, input_shape=None):
    c = self.model_config
    policy = self.dtype_policy
    if c.shared_embeddings:
      shared = SharedEmbedding(c.vocab_size, c.hidden_size, dtype=policy, name="embedding")
      self.source_embedding = self.target_embedding = self.softmax_embedding = shared
      embeddings = [shared]
    else:
      self.source_embedding = SharedEmbedding(
          c.vocab_size, c.hidden_size, dtype=policy, name="source_embedding")
      # Sized by the target vocabulary, which may be the target's own
      # (--separate_vocabularies).
      self.target_embedding = SharedEmbedding(
          c.output_vocab_size, c.hidden_size, dtype=policy, name="target_embedding")
      embeddings = [self.source_embedding, self.target_embedding]
      if c.shared_decoder_embeddings:  # the decoder's input and output share one matrix
        self.softmax_embedding = self.target_embedding
      else:
        self.softmax_embedding = SharedEmbedding(
            c.output_vocab_size, c.hidden_size, dtype=policy, name="softmax")
        embeddings.append(self.softmax_embedding)
    for embedding in embeddings:
      embedding.build()
    if c.position_embedding == "learned":
      self.encoder_position = LearnedPosition(c.max_position, c.hidden_size, dtype=policy,
                                              name="encoder_position")
      self.decoder_position = LearnedPosition(c.max_position, c.hidden_size, dtype=policy,
                                              name="decoder_position")
    elif c.position_embedding == "sinusoid":
      self.encoder_position = SinusoidalPosition(dtype=policy, name="encoder_position")
      self.decoder_position = SinusoidalPosition(dtype=policy, name="decoder_position")
    else:  # relative: in self-attention (the layers' max_relative_position), not added
      self.encoder_position = self.decoder_position = None
    for position in (self.encoder_position, self.decoder_position):
      if position is not None:
        position.build((None, None, c.hidden_size))
    self.encoder_dropout = Dropout(c.layer_prepostprocess_dropout, dtype=policy,
                                   name="encoder_embedding_dropout")
    self.decoder_dropout = Dropout(c.layer_prepostprocess_dropout, dtype=policy,
                                   name="decoder_embedding_dropout")
    layer_args = dict(hidden_size=c.hidden_size, filter_size=c.filter_size,
                      num_heads=c.num_heads, key_size=c.head_key_size,
                      value_size=c.head_value_size, dropout=c.layer_prepostprocess_dropout,
                      attention_dropout=c.attention_dropout, relu_dropout=c.relu_dropout,
                      pre_norm=c.pre_norm, norm_epsilon=c.norm_epsilon, dtype=policy,
                      max_relative_position=(c.max_relative_position
                                             if c.position_embedding == "relative" else 0))
    shape = (None, None, c.hidden_size)
    self.encoder_layers = [EncoderLayer(name=f"encoder_layer_{i}", **layer_args)
                           for i in range(c.encoder_layers)]
    self.decoder_layers = [DecoderLayer(name=f"decoder_layer_{i}", **layer_args)
                           for i in range(c.decoder_layers)]
    for layer in self.encoder_layers + self.decoder_layers:
      layer.build(shape)
      # Keras tracks the lists for `weights`, but tf.train.Checkpoint does not see
      # into them: an attribute per layer puts it in checkpoints under a stable name.
      setattr(self, layer.name, layer)
    if c.source_pointer:
      self.source_pointer_projection = keras.layers.Dense(
          c.hidden_size, use_bias=False, dtype=policy, name="source_pointer_projection")
      self.source_pointer_projection.build(shape)
    if c.pre_norm:  # pre-norm stacks end with a norm; post-norm ones already did
      self.encoder_norm = keras.layers.LayerNormalization(
          epsilon=c.norm_epsilon, dtype=policy, name="encoder_norm")
      self.decoder_norm = keras.layers.LayerNormalization(
          epsilon=c.norm_epsilon, dtype=policy, name="decoder_norm")
      self.encoder_norm.build(shape)
      self.decoder_norm.build(shape)
    self.built = True

  @staticmethod
  def _add_position(position, x, start=0, positions=None):
    """x plus its absolute position encoding; x itself with relative positions.

    Relative positions need nothing for packed rows: a pair's tokens are consecutive
    in its row, so the distances between them are those of the pair alone, and the
    segment masks keep attention within the pair."""
    return x if position is None else position(x, start=start, positions=positions)

  # ---------------------------------------------------------------- teacher forcing
  def encode(self, inputs, training=None, return_attention=False, packed=None):
    """Encodes source ids (B, S).

    `packed`: for packed rows (data/batching/packing.py), a dict with at least
    "inputs_segmentation" and "inputs_position" (B, S): attention stays within each
    pair and positions restart at each; None for one pair per row.

    Returns:
      (encoded (B, S, D), memory_mask (B, 1, 1, S), or (B, 1, S, S) when packed);
      plus a list of per-layer self-attention probabilities (B, H, S, S) if
      `return_attention`.
    """
    if packed is None:
      mask, positions = padding_mask(inputs), None
    else:
      segments = packed["inputs_segmentation"]
      mask, positions = segment_mask(segments, segments), packed["inputs_position"]
    x = self._add_position(self.encoder_position, self.source_embedding(inputs),
                           positions=positions)
    x = self.encoder_dropout(x, training=training)
    maps = []
    for layer in self.encoder_layers:
      x, probs = layer(x, attention_mask=mask, training=training, return_attention=True)
      maps.append(probs)
    if self.model_config.pre_norm:
      x = self.encoder_norm(x)
    return (x, mask, maps) if return_attention else (x, mask)

  def decode(self, targets, encoded, memory_mask, training=None, return_attention=False,
             inputs=None, packed=None):
    """Teacher-forced decoder pass over targets (B, T) given the encoder output
    (and the source ids `inputs` (B, S), which models with a source pointer need).

    `packed`: for packed rows, the four segment and position features
    (data/batching/packing.py): each pair's first decoder input is BOS, positions restart at
    each pair, self-attention is causal within the pair, and encoder-decoder attention
    reads the source of the same pair only (`memory_mask` is then unused).

    Returns:
      float32 logits (B, T, V); plus a list of per-layer (self, cross) probabilities
      if `return_attention`.
    """
    decoder_inputs = shift_right(targets)
    self_mask, positions = causal_mask(ops.shape(targets)[1]), None
    if packed is not None:
      if self.model_config.source_pointer:
        raise ValueError("a source pointer (--source_pointer) reads one source per row: "
                         "it cannot train on packed rows (drop --packed_length)")
      segments, positions = packed["targets_segmentation"], packed["targets_position"]
      decoder_inputs = ops.where(ops.equal(positions, 0),
                                 ops.cast(BOS_ID, decoder_inputs.dtype), decoder_inputs)
      self_mask = ops.logical_and(self_mask, segment_mask(segments, segments))
      memory_mask = segment_mask(segments, packed["inputs_segmentation"])
    x = self._add_position(self.decoder_position, self.target_embedding(decoder_inputs),
                           positions=positions)
    if self.model_config.source_pointer:
      if inputs is None:
        raise ValueError("this model has a source pointer (--source_pointer): decode "
                         "needs the source ids (inputs=)")
      pointer = self.source_pointers(inputs, decoder_inputs)
      x = x + self.pointed_source(encoded, memory_mask, pointer)
    x = self.decoder_dropout(x, training=training)
    maps = []
    for layer in self.decoder_layers:
      x, probs = layer(x, self_mask=self_mask, memory_mask=memory_mask, memory=encoded,
                       training=training, return_attention=True)
      maps.append(probs)
    logits = self._logits(x)
    return (logits, maps) if return_attention else logits

  def call(self, inputs, training=None):
    packed = inputs if "inputs_segmentation" in inputs else None  # data/batching/packing.py
    encoded, memory_mask = self.encode(inputs["inputs"], training=training, packed=packed)
    return self.decode(inputs["targets"], encoded, memory_mask, training=training,
                       inputs=inputs["inputs"], packed=packed)

  # ---------------------------------------------------------------- source pointer
  @property
  def uses_source_pointer(self) -> bool:
    return self.model_config.source_pointer

  @staticmethod
  def source_pointers(inputs, decoder_inputs):
    """Source ids (B, S), decoder inputs (B, T) -> (B, T) int32: the pointer at each
    position after its input (`advance_pointer` from 0, one step per position)."""
    def step(pointer, ids):
      pointer = advance_pointer(pointer, ids, inputs)
      return pointer, pointer
    start = ops.zeros(ops.shape(decoder_inputs)[:1], "int32")
    _, pointers = ops.scan(step, start, ops.transpose(decoder_inputs))
    return ops.transpose(pointers)

  def pointed_source(self, encoded, memory_mask, pointer):
    """The source pointer's decoder input: encoded (B, S, D), memory_mask (B, 1, 1, S),
    pointer (B * G, T) int -> (B * G, T, D), the projected encoder output at each
    pointer (capped at the source's EOS); G consecutive pointer rows (the beams of a
    sentence) share a sentence's encoder output."""
    rows, length = ops.shape(pointer)[0], ops.shape(pointer)[1]
    sentences = ops.shape(encoded)[0]
    last = ops.sum(ops.cast(memory_mask[:, 0, 0, :], "int32"), axis=1) - 1  # EOS
    pointer = ops.minimum(ops.reshape(ops.cast(pointer, "int32"), (sentences, -1)),
                          last[:, None])  # (B, G * T)
    picked = ops.matmul(ops.one_hot(pointer, ops.shape(encoded)[1], dtype=encoded.dtype),
                        encoded)  # (B, G * T, S) @ (B, S, D)
    return self.source_pointer_projection(ops.reshape(picked, (rows, length, -1)))

  def _logits(self, x, output_kernel=None):
    if self.model_config.pre_norm:
      x = self.decoder_norm(x)
    return self.softmax_embedding.logits(x, output_kernel)

  def output_kernel(self):
    """The (D, V) pre-softmax projection that `step_weights` hands the decoding step:
    computed once per decoded batch, not once per step (see
    `SharedEmbedding.output_kernel`)."""
    return self.softmax_embedding.output_kernel()

  # ---------------------------------------------------------------- incremental decoding
  def cross_key_values(self, encoded):
    """Projects the encoder output once per source: a (key, value) pair per layer,
    keys and values in one matmul (`decoder_step.cross_key_value`)."""
    return [decoder_step.cross_key_value(layer.cross_attention, encoded)
            for layer in self.decoder_layers]

  def init_cache(self, batch_size, max_length, beam_size=1):
    """Zero self-attention caches, per layer {"key": (B, H, K * L, Dk), "value": ...}
    (max_length 0: an empty cache that `decode_step(..., grow=True)` grows).

    B = batch_size sentences, K = beam_size slots of L = max_length positions each
    (see `MultiHeadAttention._call_cached`).
    """
    c = self.model_config
    dtype = self.compute_dtype
    size = beam_size * max_length
    return [{"key": ops.zeros((batch_size, c.num_heads, size, c.head_key_size), dtype),
             "value": ops.zeros((batch_size, c.num_heads, size, c.head_value_size), dtype)}
            for _ in self.decoder_layers]

  def step_weights(self, max_length=None, beams=None):
    """The decoder's weights in the form `decode_step(..., weights=)` reads them
    (`decoder_step.py`): taken once per decoded batch, outside the search loop.

    Args:
      max_length: the positions the decoding may reach: the sinusoid of positions
        0 .. max_length - 1 is computed here once (None: in each step).
      beams: the hypotheses per sentence of the decoding, when known (shapes are then
        known while tracing); None: read at run time.
    """
    c = self.model_config
    dtype = self.compute_dtype
    stored = self.__dict__.get("_stored_step_weights")
    layers = [decoder_step.layer_weights(layer, dtype) for layer in self.decoder_layers]
    if stored is not None:  # `store_step_weights`: read in the step, made by no request
      for layer, qkv in zip(layers, stored["qkv"]):
        layer["self"]["qkv"] = qkv
    return {
        "positions": (None if max_length is None else decoder_step.position_table(
            self.decoder_position, max_length, c.hidden_size, dtype)),
        "layers": layers,
        "final_norm": decoder_step.norm_weights(self.decoder_norm) if c.pre_norm else None,
        "output_kernel": (self.output_kernel() if stored is None
                          else stored["output_kernel"]),  # (D, V)
        "beams": beams,
    }

  def store_step_weights(self) -> list:
    """Keeps the weights the decoding step reads in another layout than the layers' in
    variables of their own: the transposed output embedding (D, V) and each decoder
    layer's fused self-attention kernel (`decoder_step.attention_weights`), in the
    compute dtype. `step_weights` then reads them instead of making them for every
    decoded batch, which for a SavedModel is every request (transposing an 8k x 256
    embedding alone takes about a millisecond). For an export, whose weights never
    change: the copies do not follow later changes of the model's weights, and they
    hold the embedding a second time. Returns the variables, for the caller to track
    (kept out of Keras' own tracking, so checkpoints never see them)."""
    stored = self.__dict__.get("_stored_step_weights")
    if stored is None:
      dtype = self.compute_dtype
      with tf.init_scope():
        stored = {
            "output_kernel": tf.Variable(self.output_kernel(), trainable=False,
                                         name="step_output_kernel"),
            "qkv": [tf.Variable(decoder_step.attention_weights(
                layer.self_attention, True, dtype)["qkv"], trainable=False,
                name=f"step_qkv_{i}") for i, layer in enumerate(self.decoder_layers)],
        }
      object.__setattr__(self, "_stored_step_weights", stored)
    return [stored["output_kernel"], *stored["qkv"]]

  def decode_step(self, ids, index, cache, cross_key_values, memory_mask, slots=None,
                  source_pointer=None, grow=False, weights=None):
    """Decodes one position for every sequence (`decoder_step.py`: 2-D rows, fused
    weights).

    Args:
      ids: (B * K,) the previous token of each hypothesis (BOS at index 0), the K
        hypotheses of a sentence consecutive (K = 1 outside beam search).
      index: scalar int, the position being decoded (0-based).
      cache: list of per-layer caches from `init_cache` (or a previous step).
      cross_key_values: from `cross_key_values(encoded)`, a row per sentence (the K
        hypotheses of sentence b are rows b * K ... b * K + K - 1 of `ids`).
      memory_mask: (B, 1, 1, S) source padding mask, a row per sentence.
      slots: beam search only, int (B, K, L): slots[b, j, t] is the beam slot of
        sentence b whose cache holds position t of hypothesis j's history, for
        t <= index; slots[b, j, index] must be j (the new position is written into
        the hypothesis' own slot). Beam search reorders this table, never the cache.
      source_pointer: models with `source_pointer` only: (encoded (B, S, D), the
        encoder output per sentence; pointer (B * K,) int, each hypothesis'
        pointer after `ids`: the caller applies `advance_pointer` to the previous
        step's, starting from 0).
      grow: the cache grows (`init_cache(B, 0)`, one position appended per step;
        graph mode only: XLA needs the fixed size); not with `slots`.
      weights: `step_weights()`, taken once before the loop (faster); None takes
        them in the step. With an entry `attention_by_size` true, attention is chosen
        by size (`_few_rows`).

    Returns:
      (float32 logits (B * K, V) for position `index`, updated cache).
    """
    weights = self.step_weights() if weights is None else weights
    x = self.target_embedding(ids)  # (B*K, D)
    x = self._step_position(x, index, weights["positions"])
    if self.model_config.source_pointer:
      if source_pointer is None:
        raise ValueError("this model has a source pointer (--source_pointer): decode_step "
                         "needs source_pointer=(encoded rows, pointer)")
      encoded, pointer = source_pointer
      x = x + self.pointed_source(encoded, memory_mask, pointer[:, None])[:, 0]
    slots_per_row = 1 if slots is None else slots.shape[1]
    step = decoder_step.StepInputs(
        index, self._step_mask(index, cache, slots, grow), memory_mask, grow,
        slots=slots_per_row, beams=weights["beams"] or (None if slots is None else slots_per_row),
        few_rows=self._few_rows(x, index, cache, memory_mask, grow, weights))
    new_cache = []
    for layer_weights, layer_cache, key_value in zip(weights["layers"], cache,
                                                     cross_key_values):
      x, layer_cache = decoder_step.decoder_layer(x, layer_weights, layer_cache, key_value,
                                                  step, self.model_config.pre_norm)
      new_cache.append(layer_cache)
    if weights["final_norm"] is not None:
      x = decoder_step.layer_norm(x, weights["final_norm"])
    return self.softmax_embedding.logits(x, weights["output_kernel"]), new_cache

  def _few_rows(self, x, index, cache, memory_mask, grow: bool, weights):
    """`StepInputs.few_rows` of a float32 step whose weights ask for attention by size
    (`DecodeConfig.attention_by_size`): self-attention over the index + 1 positions
    of a growing cache (chosen at run time) or over the whole fixed cache (under XLA
    its shape, and so the condition, is known when compiling); None otherwise
    (in half precision the two forms would round at different places)."""
    if not weights.get("attention_by_size") or x.dtype != tf.float32:
      return None
    # Keys per query: the positions so far, or the whole fixed cache (all its slots).
    positions = index + 1 if grow else tf.shape(cache[0]["key"])[2]
    return decoder_step.few_rows(x, positions, memory_mask, self.decoder_layers[0])

  def _step_position(self, x, index, table):
    """Rows x (R, D) plus the position encoding of `index` (a row of the sinusoid
    `table` when given; x itself with relative positions)."""
    position = self.decoder_position
    if position is None:
      return x
    if isinstance(position, LearnedPosition):
      row = ops.take(position.position_embeddings,
                     ops.minimum(index, position.max_position - 1), axis=0)
    elif table is not None:
      row = ops.take(table, index, axis=0)
    else:
      row = sinusoid(ops.convert_to_tensor(index)[None], self.model_config.hidden_size)[0]
    return x + ops.cast(row, x.dtype)[None]

  @staticmethod
  def _step_mask(index, cache, slots, grow):
    """The self-attention mask of a step: None for a growing cache (every cached
    position is an earlier one), the positions up to `index` of a fixed cache, and
    with `slots` each hypothesis' own slot per position (B, 1, K, K * L)."""
    if grow:
      if slots is not None:
        raise ValueError("decode_step: a growing cache has one slot per row (slots=None)")
      return None
    if slots is None:
      length = ops.shape(cache[0]["key"])[2]
      return (ops.arange(length) <= index)[None, None, None, :]  # (1, 1, 1, L)
    beam, length = slots.shape[1], ops.shape(slots)[2]
    seen = ops.arange(length) <= index  # (L,)
    # (B, K queries, K slots, L): position t of query j lives in slot slots[b, j, t].
    own = ops.equal(slots[:, :, None, :], ops.arange(beam, dtype=slots.dtype)[:, None])
    return ops.reshape(ops.logical_and(own, seen), (-1, 1, beam, beam * length))

  # ---------------------------------------------------------------- config
  def get_config(self):
    config = super().get_config()
    config["config"] = dataclasses.asdict(self.model_config)
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    return cls(config.pop("config"), **config)


def create_model(config: ModelConfig) -> Transformer:
  """Builds a Transformer with all variables created (call inside a strategy scope)."""
  model = Transformer(config)
  model.build()
  return model
