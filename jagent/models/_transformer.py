"""Decoder-only transformer (Qwen2 / Llama 3) as a pair of pure functions.

``init(config, key) -> Params`` and ``apply(params, tokens, positions, cache,
config=...) -> (logits, cache)``, which is ``hidden_states`` (the trunk, also
public for value heads) followed by ``output_logits``. Parameters and the KV cache
are ``flax.struct.dataclass`` pytrees of plain arrays, so both functions work under
``jax.jit``, ``jax.grad``, ``jax.vmap`` and any sharding; ``param_axes`` and
``cache_axes`` return the same pytrees with a ``PartitionSpec`` of logical axis
names in place of every array, for sharding by rules (``jagent.sharding``:
``tree_shardings(param_axes(config), params, mesh, rules)``, ``param_shardings``).

The decoder layers are one block scanned over stacked weights (every
``LayerParams`` leaf and the KV cache have a leading ``[L]`` axis, logical
name ``layers``), as in MaxText, levanter and Tunix: the rollout, prefill and
train-step programs compile one block whatever the depth, so compile time and
the compiled buffers do not grow with L the way an unrolled Python loop's do.

Shape letters (jagent._src.types): L layers, B batch, T new tokens, S cache
slots, D width, H query heads, K key/value heads, G = H // K, Dh head width,
F MLP width, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jagent.models import _attention
from jagent.models import _lora
from jagent.models import _partitioning
from jagent.models._axes import BATCH
from jagent.models._axes import CACHE_SEQ
from jagent.models._axes import EMBED
from jagent.models._axes import HEAD_DIM
from jagent.models._axes import KV_HEADS
from jagent.models._axes import LAYERS
from jagent.models._axes import MLP
from jagent.models._axes import Q_HEADS
from jagent.models._axes import VOCAB
from jagent.models._config import ModelConfig


@flax.struct.dataclass
class LayerParams:
  """Parameters of all L decoder layers, stacked on a leading layer axis.

  Entry ``[i]`` of every leaf is layer i's (axis names in brackets; every
  leaf starts with ``layers``).
  """
  attn_norm: jax.Array  # shape=[L, D], dtype=param_dtype  (layers, embed)
  wq: jax.Array  # shape=[L, D, H, Dh]  (layers, embed, q_heads, head_dim)
  wk: jax.Array  # shape=[L, D, K, Dh]  (layers, embed, kv_heads, head_dim)
  wv: jax.Array  # shape=[L, D, K, Dh]  (layers, embed, kv_heads, head_dim)
  bq: jax.Array | None  # shape=[L, H, Dh] or None without qkv_bias  (layers, q_heads, head_dim)
  bk: jax.Array | None  # shape=[L, K, Dh] or None  (layers, kv_heads, head_dim)
  bv: jax.Array | None  # shape=[L, K, Dh] or None  (layers, kv_heads, head_dim)
  wo: jax.Array  # shape=[L, H, Dh, D]  (layers, q_heads, head_dim, embed)
  mlp_norm: jax.Array  # shape=[L, D]  (layers, embed)
  w_gate: jax.Array  # shape=[L, D, F]  (layers, embed, mlp)
  w_up: jax.Array  # shape=[L, D, F]  (layers, embed, mlp)
  w_down: jax.Array  # shape=[L, F, D]  (layers, mlp, embed)

  @property
  def num_layers(self) -> int:
    """L, the length of the leading layer axis."""
    return self.attn_norm.shape[0]


# The order of LayerParams' fields (and of HF's per-layer tensors).
LAYER_FIELDS = tuple(f.name for f in dataclasses.fields(LayerParams))


@flax.struct.dataclass
class Params:
  """All parameters of a decoder-only transformer."""
  embed: jax.Array  # shape=[V, D], dtype=param_dtype  (vocab, embed)
  layers: LayerParams  # every leaf [L, ...]
  final_norm: jax.Array  # shape=[D]  (embed)
  lm_head: jax.Array | None  # shape=[D, V], None when embeddings are tied  (embed, vocab)


@flax.struct.dataclass
class KVCache:
  """Key/value cache of every layer; slot s of row b holds that row's token s.

  Rotary embeddings are already applied to the cached keys. Keys are stored
  transposed, slots last ([L, B, K, Dh, S]), so that the scores of the G
  query heads of a key/value head are one [G, Dh] x [Dh, S] product per row,
  which made a decode step's attention faster on XLA:CPU than keys laid out
  [B, K, S, Dh] (those [S, Dh] x [Dh] products reduce over the short minor
  axis; measured in docs/results.md, "Model kernels on XLA:CPU"). Values
  are [L, B, K, S, Dh]. Slots at or past ``lengths[b]`` hold garbage and are
  never attended to by valid queries. Inside a decode loop ``k`` and ``v``
  may be tuples of L per-layer arrays (:func:`per_layer_form`).
  """
  k: jax.Array  # shape=[L, B, K, Dh, S], dtype=dtype  (layers, batch, kv_heads, head_dim, cache_seq)
  v: jax.Array  # shape=[L, B, K, S, Dh]  (layers, batch, kv_heads, cache_seq, head_dim)
  lengths: jax.Array  # shape=[B], dtype=int32: filled slots per row  (batch)

  @property
  def max_length(self) -> int:
    """S, the number of slots per row."""
    return self.v[0].shape[2] if isinstance(self.v, tuple) else self.v.shape[3]


def param_axes(config: ModelConfig) -> Params:
  """Logical axis names of every parameter: ``Params`` with PartitionSpec leaves."""
  bias = config.qkv_bias
  layer = LayerParams(
      attn_norm=P(LAYERS, EMBED),
      wq=P(LAYERS, EMBED, Q_HEADS, HEAD_DIM), wk=P(LAYERS, EMBED, KV_HEADS, HEAD_DIM),
      wv=P(LAYERS, EMBED, KV_HEADS, HEAD_DIM),
      bq=P(LAYERS, Q_HEADS, HEAD_DIM) if bias else None,
      bk=P(LAYERS, KV_HEADS, HEAD_DIM) if bias else None,
      bv=P(LAYERS, KV_HEADS, HEAD_DIM) if bias else None,
      wo=P(LAYERS, Q_HEADS, HEAD_DIM, EMBED), mlp_norm=P(LAYERS, EMBED),
      w_gate=P(LAYERS, EMBED, MLP), w_up=P(LAYERS, EMBED, MLP), w_down=P(LAYERS, MLP, EMBED))
  return Params(
      embed=P(VOCAB, EMBED), layers=layer, final_norm=P(EMBED),
      lm_head=None if config.tie_embeddings else P(EMBED, VOCAB))


def cache_axes(config: ModelConfig) -> KVCache:
  """Logical axis names of every KV-cache array: ``KVCache`` with PartitionSpec leaves."""
  del config  # every config's cache has the same axes
  return KVCache(k=P(LAYERS, BATCH, KV_HEADS, HEAD_DIM, CACHE_SEQ),
                 v=P(LAYERS, BATCH, KV_HEADS, CACHE_SEQ, HEAD_DIM), lengths=P(BATCH))


@functools.partial(jax.jit, static_argnames=("config",))
def init(config: ModelConfig, key: jax.Array) -> Params:
  """Random parameters (one jit-compiled program per config).

  Matrices are N(0, 0.02^2) (the Hugging Face ``initializer_range`` default),
  biases zero, RMSNorm scales one. All matrices come from one normal draw of
  ``num_params`` values (a transient float32 vector that size), in the order
  of a Hugging Face checkpoint (embeddings, then each layer's q, k, v, o,
  gate, up, down, then the untied head). For a sharded init, wrap it:
  ``jax.jit(init, static_argnums=0,
  out_shardings=jagent.sharding.param_shardings(jax.eval_shape(init, config, key), mesh))``.

  Args:
    config: the model config.
    key: a PRNG key.

  Returns:
    ``Params`` in ``config.param_dtype`` with the shapes listed on the class.
  """
  c = config
  dt = c.jnp_param_dtype
  n = c.num_layers
  d, h, k, dh, f = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim
  per_layer = [(d, h, dh), (d, k, dh), (d, k, dh), (h, dh, d), (d, f), (d, f), (f, d)]
  # One draw for all matrices, then slices: each separate jax.random call
  # adds its own threefry code, and compile time grew with their number.
  # Layer i's matrices are consecutive, so the strided view below picks each
  # kind's L matrices without a per-layer slice.
  v_size, layer_size = c.vocab_size * d, sum(math.prod(s) for s in per_layer)
  head = 0 if c.tie_embeddings else d * c.vocab_size
  flat = 0.02 * jax.random.normal(key, (v_size + n * layer_size + head,), jnp.float32)
  embed = flat[:v_size].reshape(c.vocab_size, d).astype(dt)
  stacked = flat[v_size:v_size + n * layer_size].reshape(n, layer_size)
  offsets = np.cumsum([0] + [math.prod(s) for s in per_layer])
  wq, wk, wv, wo, w_gate, w_up, w_down = (
      stacked[:, o:o + math.prod(s)].reshape(n, *s).astype(dt)
      for o, s in zip(offsets, per_layer))
  lm_head = None if c.tie_embeddings else flat[v_size + n * layer_size:].reshape(
      d, c.vocab_size).astype(dt)

  def zeros(shape):
    return jnp.zeros((n, *shape), dt) if c.qkv_bias else None

  ones = jnp.ones((n, d), dt)
  layers = LayerParams(attn_norm=ones, wq=wq, wk=wk, wv=wv, bq=zeros((h, dh)),
                       bk=zeros((k, dh)), bv=zeros((k, dh)), wo=wo, mlp_norm=ones,
                       w_gate=w_gate, w_up=w_up, w_down=w_down)
  return Params(embed=embed, layers=layers, final_norm=jnp.ones((d,), dt), lm_head=lm_head)


def init_cache(config: ModelConfig, batch_size: int, max_length: int,
               lengths: jax.typing.ArrayLike | None = None) -> KVCache:
  """An empty KV cache of ``max_length`` slots per row.

  Args:
    config: the model config (the cache's dtype is ``config.jnp_cache_dtype``).
    batch_size: B.
    max_length: S, slots per row (prompt plus every token to be generated).
    lengths: optional int32 [B] initial fill (default zeros).

  Returns:
    ``KVCache`` of zeros: keys [L, B, K, Dh, S], values [L, B, K, S, Dh].

  Raises:
    ValueError: non-positive ``batch_size`` or ``max_length``.
  """
  if batch_size <= 0 or max_length <= 0:
    raise ValueError(f"init_cache needs positive batch_size and max_length, got "
                     f"{batch_size}, {max_length}")
  c = config
  shape_k = (c.num_layers, batch_size, c.num_kv_heads, c.head_dim, max_length)
  shape_v = (c.num_layers, batch_size, c.num_kv_heads, max_length, c.head_dim)
  lengths = jnp.zeros((batch_size,), jnp.int32) if lengths is None else jnp.asarray(
      lengths, jnp.int32)
  return KVCache(k=jnp.zeros(shape_k, c.jnp_cache_dtype),
                 v=jnp.zeros(shape_v, c.jnp_cache_dtype), lengths=lengths)


# Deepest stack whose decode loop on XLA:CPU carries one buffer per layer.
_PER_LAYER_MAX_LAYERS = 8


def _layer_slices(tree, num_layers: int) -> tuple:
  """The L per-layer trees of a tree whose leaves are stacked ``[L, ...]``."""
  return tuple(jax.tree.map(lambda a, i=i: a[i], tree) for i in range(num_layers))


def per_layer_form(params, cache: KVCache):
  """``(params, cache)`` in the form a decode loop carries: per layer on short CPU stacks.

  XLA:CPU copies a sliced operand before a dot, so a decode step over
  stacked ``[L, ...]`` weights and cache copies every layer's weights and
  what it reads of its cache, at every step. On the CPU backend, for stacks
  of at most ``_PER_LAYER_MAX_LAYERS`` layers, the loop carries them as
  tuples of L per-layer arrays instead: ``params.layers`` (of a ``Params``,
  or of a ``LoraParams``' base) becomes a tuple of L ``LayerParams``, and
  ``cache.k`` / ``cache.v`` tuples of [B, K, Dh, S] / [B, K, S, Dh] arrays;
  :func:`hidden_states` then runs the layers one by one, writing and reading
  each buffer in place. Split once before the loop and stacked once after
  it (:func:`stacked_cache`); a caller that runs several loops in a row
  (a rollout's turns) splits the cache once and passes it on as it is.
  Deeper stacks and other backends keep the stack and the scan, so compile
  time does not grow with L. The values are the same either way.

  Args:
    params: ``Params`` or ``LoraParams``, stacked or already per layer.
    cache: a ``KVCache``, stacked or already per layer.

  Returns:
    ``(params, cache)``, unchanged or in per-layer form (what is already
    per layer stays as it is).
  """
  if isinstance(cache.k, tuple):
    num_layers = len(cache.k)
  else:
    num_layers = cache.k.shape[0]
    if jax.default_backend() != "cpu" or num_layers > _PER_LAYER_MAX_LAYERS:
      return params, cache
    cache = KVCache(k=tuple(cache.k), v=tuple(cache.v), lengths=cache.lengths)
  split = lambda layers: (layers if isinstance(layers, tuple)  # noqa: E731
                          else _layer_slices(layers, num_layers))
  if _lora.is_lora(params):
    if params.base is not None:
      params = params.replace(base=params.base.replace(layers=split(params.base.layers)))
  else:
    params = params.replace(layers=split(params.layers))
  return params, cache


def stacked_cache(cache: KVCache) -> KVCache:
  """The stacked ``[L, ...]`` form of a cache :func:`per_layer_form` split."""
  if not isinstance(cache.k, tuple):
    return cache
  return KVCache(k=jnp.stack(cache.k), v=jnp.stack(cache.v), lengths=cache.lengths)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
  """float32 [Dh / 2] rotary inverse frequencies, with "llama3" scaling if set.

  ``inv_freq_i = theta^(-2i / Dh)``; the "llama3" rule (Llama 3.1 release)
  divides low frequencies (wavelength above ``original_max / low_freq_factor``)
  by ``factor``, keeps high frequencies (wavelength below
  ``original_max / high_freq_factor``) and interpolates smoothly between.
  """
  c = config
  exps = np.arange(0, c.head_dim, 2, dtype=np.int64).astype(np.float32) / c.head_dim
  inv = (1.0 / (np.float32(c.rope_theta) ** exps)).astype(np.float32)
  if c.rope_type == "llama3":
    old = float(c.rope_original_max_position)
    low_wl = old / c.rope_low_freq_factor
    high_wl = old / c.rope_high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wl, inv / c.rope_factor, inv)
    smooth = (old / wavelen - c.rope_low_freq_factor) / (
        c.rope_high_freq_factor - c.rope_low_freq_factor)
    smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled
    medium = (wavelen >= high_wl) & (wavelen <= low_wl)
    inv = np.where(medium, smoothed, scaled).astype(np.float32)
  return inv


def _rope(x_bt_dh: jax.Array, cos_btf: jax.Array, sin_btf: jax.Array) -> jax.Array:
  """Rotates halves of the last axis (the Hugging Face Llama/Qwen2 convention).

  ``x_bt_dh`` is [B, T, ..., Dh] (any head axes between T and Dh); ``cos_btf``
  and ``sin_btf`` are [B, T, Dh/2], broadcast over the head axes.
  """
  half = x_bt_dh.shape[-1] // 2
  x1, x2 = x_bt_dh[..., :half].astype(jnp.float32), x_bt_dh[..., half:].astype(jnp.float32)
  heads = (1,) * (x_bt_dh.ndim - 3)
  cos = cos_btf.reshape(*cos_btf.shape[:2], *heads, half)
  sin = sin_btf.reshape(*sin_btf.shape[:2], *heads, half)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_bt_dh.dtype)


def _materialized(xs):
  """``xs`` (a tuple of arrays of rank >= 1), computed once and stored.

  XLA:CPU fuses a cheap-to-index producer into every consumer fusion and,
  inside a fusion, evaluates it once per consumer element: the rotary cos/sin
  of [B, T, Dh/2] were recomputed per query/key element in every layer's
  projection fusions (4 transcendentals per element pair and head; a
  noticeable share of a rollout, measured in docs/results.md, "Model kernels
  on XLA:CPU"). Writing one element of each array onto itself with a
  ``dynamic_update_slice`` (an in-place update, which needs its operand in
  memory) makes XLA materialize them once; the values are unchanged.
  """
  return tuple(jax.lax.dynamic_update_slice(x, x[(slice(0, 1),) * x.ndim], (0,) * x.ndim)
               for x in xs)


def _on_rows(x_btd: jax.Array) -> jax.Array:
  """Hidden states with their rows over the mesh's row axes while a sharded
  step traces (see jagent.models._partitioning); the identity elsewhere."""
  return _partitioning.constrain(x_btd, P(BATCH))


def _rms_norm(x_btd: jax.Array, scale_d: jax.Array, eps: float) -> jax.Array:
  """RMSNorm (Zhang & Sennrich, https://arxiv.org/abs/1910.07467), in float32."""
  x = x_btd.astype(jnp.float32)
  x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  return scale_d.astype(x_btd.dtype)[None, None, :] * x.astype(x_btd.dtype)


def _dense(x: jax.Array, w: jax.Array) -> jax.Array:
  """``x [..., D_in] @ w [D_in, *out] -> [..., *out]`` as one 2-D matmul.

  Equal to the einsum; flattening the leading axes first matters on XLA:CPU,
  where the weight gradient of a 3-D einsum (a contraction over batch and
  time) is several times slower than that of the 2-D matmul (measured in
  docs/results.md, "Model kernels on XLA:CPU").
  """
  lead = x.shape[:-1]
  # The weight keeps its output axes (no reshape), so a sharded minor output
  # axis (e.g. the MLP axis of the stacked [D, 2, F] gate/up) stays local.
  y = jax.lax.dot_general(x.reshape(-1, x.shape[-1]), w, (((1,), (0,)), ((), ())),
                          preferred_element_type=x.dtype)
  return y.reshape(*lead, *w.shape[1:])


class _BlockWeights(flax.struct.PyTreeNode):
  """One or all layers' weights in the layout and dtype the block computes with.

  Leaves carry the leading axes of the ``LayerParams`` they came from
  (``[L]`` for the whole stack, none for one layer).
  """
  attn_norm: jax.Array  # [..., D]
  w_qkv: jax.Array  # [..., D, K, G + 2, Dh]: each K head's G queries, its key, its value
  b_qkv: jax.Array | None  # [..., K, G + 2, Dh]
  wo: jax.Array  # [..., H * Dh, D]
  mlp_norm: jax.Array  # [..., D]
  w_gate_up: jax.Array  # [..., D, 2, F]
  w_down: jax.Array  # [..., F, D]


def _block_weights(lp: LayerParams, dtype=None) -> _BlockWeights:
  """The compute layout of ``lp`` (one layer or the ``[L]`` stack), in ``dtype``
  (None: the weights' own dtype).

  The weights of each key/value head's G query heads, its key and its value
  are stacked ``[D, K, G + 2, Dh]`` (query head ``h = k * G + g`` uses
  key/value head ``k``, as in grouped-query attention, Ainslie et al. 2023,
  https://arxiv.org/abs/2305.13245), so the three projections are one
  [B*T, D] x [D, K*(G+2)*Dh] product, faster on XLA:CPU than three products;
  likewise the MLP's gate and up as one ``[D, 2, F]`` product (measured in
  docs/results.md, "Model kernels on XLA:CPU"). The stacking keeps the K
  axis leading, so a ``KV_HEADS``-sharded layout stays local.
  """
  *lead, d, nk, dh = lp.wk.shape
  g = lp.wq.shape[-2] // nk
  cast = (lambda x: x) if dtype is None else (lambda x: x.astype(dtype))  # noqa: E731
  w_qkv = cast(jnp.concatenate([lp.wq.reshape(*lead, d, nk, g, dh), lp.wk[..., None, :],
                                lp.wv[..., None, :]], axis=-2))
  b_qkv = None
  if lp.bq is not None:
    b_qkv = cast(jnp.concatenate([lp.bq.reshape(*lead, nk, g, dh), lp.bk[..., None, :],
                                  lp.bv[..., None, :]], axis=-2))
  wo = cast(lp.wo.reshape(*lead, nk * g * dh, lp.wo.shape[-1]))
  w_gate_up = cast(jnp.stack([lp.w_gate, lp.w_up], axis=-2))
  return _BlockWeights(attn_norm=lp.attn_norm, w_qkv=w_qkv, b_qkv=b_qkv, wo=wo,
                       mlp_norm=lp.mlp_norm, w_gate_up=w_gate_up, w_down=cast(lp.w_down))


def _is_half(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize == 2


def _as_bits(tree):
  """16-bit float leaves of ``tree`` as their ``uint16`` bits; other leaves as they are.

  The stacked weights enter the layer loop this way and each layer is cast
  to the compute dtype inside it (:func:`_from_bits`): given bfloat16
  weights, XLA:CPU computes the loop's slice of them in float32 and hoists
  that cast out of the loop, holding a float32 copy of the whole stack
  (Qwen2.5-3B's bfloat16 LoRA base: 11.5 GiB, docs/scaling.md); integer bits
  are sliced as they are. Bit casts copy nothing.
  """
  return jax.tree.map(
      lambda x: jax.lax.bitcast_convert_type(x, jnp.uint16) if _is_half(x) else x, tree)


def _from_bits(bits, like, dtype):
  """:func:`_as_bits`' inverse for one layer, float leaves cast to ``dtype``.

  ``like`` is the original tree (its leaves' dtypes are read).
  """
  def one(b, x):
    if _is_half(x):
      b = jax.lax.bitcast_convert_type(b, x.dtype)
    return b.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else b
  return jax.tree.map(one, bits, like)


def _write_layer(cache: jax.Array, i, index, update: jax.Array):
  """Writes ``update`` at ``index`` of layer ``i`` of a stacked cache.

  ``cache`` is ``[L, ...]``; ``index`` indexes one layer's ``[...]`` (advanced
  indices on non-adjacent axes come first: the updates are ``[B, T, K, Dh]``);
  slots past the end are dropped. Returns ``(cache, layer)``.

  A float32 cache is written in place in the stack, and ``layer`` is None:
  the attention reads its key blocks from the stack (``cached_attention``'s
  ``layer``). A 16-bit float cache is written in its layer, which then goes
  back into the stack, and ``layer`` is that written layer, which the
  attention reads: XLA:CPU computes bfloat16 slices and scatters in float32,
  so a scatter into, or block reads from, the stack made float32 copies of
  the whole cache (for Qwen2.5-3B's 36 layers in RAGEN's rollout, 12.8 GiB
  each: docs/scaling.md); on one layer they cost a layer's worth. The values
  are the same either way.
  """
  update = update.astype(cache.dtype)
  if not (jnp.issubdtype(cache.dtype, jnp.floating) and cache.dtype.itemsize == 2):
    return cache.at[(i, *index)].set(update, mode="drop"), None
  layer = jax.lax.dynamic_index_in_dim(cache, i, keepdims=False)
  layer = layer.at[index].set(update, mode="drop")
  return jax.lax.dynamic_update_index_in_dim(cache, layer, i, 0), layer


def _qkv_projection(h_btd, w: _BlockWeights, cos_btf, sin_btf, dtype, delta=None):
  """Queries [B,T,K,G,Dh], keys and values [B,T,K,Dh] (rotary applied) in one matmul.

  ``w`` is one layer's :func:`_block_weights`. ``delta``
  (``[B, T, K, G + 2, Dh]``, LoRA's additions) is added before the biases.
  """
  g = w.w_qkv.shape[-2] - 2
  y = _dense(h_btd, w.w_qkv)  # [B, T, K, G + 2, Dh]
  if delta is not None:
    y = y + delta
  if w.b_qkv is not None:
    y = y + w.b_qkv[None, None]
  qk = _rope(y[..., :g + 1, :], cos_btf, sin_btf)
  return qk[..., :g, :], qk[..., g, :], y[..., g + 1, :]


def hidden_states(
    params: Params,
    tokens: jax.typing.ArrayLike,
    positions: jax.typing.ArrayLike,
    cache: KVCache | None = None,
    *,
    config: ModelConfig,
    num_tokens: jax.typing.ArrayLike | None = None,
    attention_mask: jax.typing.ArrayLike | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[jax.Array, KVCache | None]:
  """The decoder trunk: final hidden states after the final RMSNorm.

  Everything :func:`apply` computes except the output projection, so a value
  head or any other readout can share one forward pass with the policy
  (``apply`` is exactly ``hidden_states`` followed by the tied or untied
  projection to the vocabulary). Masking, caching and padding rules are those
  of :func:`apply`.

  Args:
    params: from :func:`init` or a checkpoint loader, or a
      :class:`jagent.models.LoraParams` (a base with LoRA adapters, applied
      unmerged).
    tokens: int32 [B, T] token ids.
    positions: int32 [B, T] RoPE positions.
    cache: optional ``KVCache`` (see :func:`apply`).
    config: the model config (static under jit).
    num_tokens: optional int32 [B], valid tokens per row (with a cache only).
    attention_mask: optional bool [B, T] key validity (without a cache only).
    dropout_key: optional PRNG key of the LoRA adapters' input dropout
      (``LoraConfig.dropout``); None (the default, and always when sampling):
      no dropout.

  Returns:
    ``(h, cache)``: hidden states [B, T, D] in ``config.dtype`` after the
    final RMSNorm, and the updated cache (None without one).

  Raises:
    ValueError: tokens/positions not rank 2 or of different shapes; per-layer
      params (:func:`per_layer_form`) without its per-layer cache.
  """
  c = config
  tokens = jnp.asarray(tokens, jnp.int32)
  positions = jnp.asarray(positions, jnp.int32)
  if tokens.ndim != 2 or positions.shape != tokens.shape:
    raise ValueError(f"apply/hidden_states need tokens and positions of one shape "
                     f"[B, T]; got {tokens.shape} and {positions.shape}")
  b, t = tokens.shape
  dt = c.jnp_dtype
  adapters = None
  if _lora.is_lora(params):
    lora_config, adapters = params.config, params.adapters
    params = params.base
  per_layer = isinstance(params.layers, tuple)
  num_layers = len(params.layers) if per_layer else params.layers.num_layers
  if per_layer and cache is None:
    raise ValueError("per-layer params (per_layer_form) run only with its per-layer cache; "
                     "got cache=None")

  x = _on_rows(jnp.take(params.embed, tokens, axis=0).astype(dt))  # [B, T, D]
  inv = jnp.asarray(rope_inv_freq(c))
  ang = positions.astype(jnp.float32)[..., None] * inv[None, None, :]  # [B, T, Dh/2]
  cos, sin = _materialized((jnp.cos(ang), jnp.sin(ang)))

  if cache is None:
    mask = jnp.tril(jnp.ones((t, t), bool))[None]  # [1, T, T]
    if attention_mask is not None:
      mask = mask & jnp.asarray(attention_mask, bool)[:, None, :]
    mask = jnp.broadcast_to(mask, (b, t, t))
  else:
    slots = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B, T]
    rows = jnp.arange(b, dtype=jnp.int32)[:, None]
    # Where a layer's keys [B, K, Dh, S] and values [B, K, S, Dh] take this
    # call's tokens (advanced indices first: the updates are [B, T, K, Dh]).
    k_at = (rows, slice(None), slice(None), slots)
    v_at = (rows, slice(None), slots, slice(None))
    n = jnp.full((b,), t, jnp.int32) if num_tokens is None else jnp.asarray(num_tokens, jnp.int32)
    # Slots any used query reads: rows with no valid token read none.
    needed = jnp.clip(jnp.max(jnp.where(n > 0, cache.lengths + n, 0)), 1, cache.max_length)

  def block(x, w, la, key):
    """One pre-norm decoder block, split around its attention.

    ``w``: the layer's :func:`_block_weights`; ``la``: its LoRA pairs (a dict
    by module name, empty without LoRA); ``key``: its dropout key or None.
    Returns ``((q, k, v), finish)``: the attention's inputs and a function
    from the attention output ``[B, T, K, G, Dh]`` to the block's output.
    """

    def delta(name, inp, in_axes=1):
      """LoRA's addition to projection ``name`` (None when not adapted)."""
      if name not in la:
        return None
      sub = None if key is None else jax.random.fold_in(key, _lora.LORA_MODULES.index(name))
      return _lora.lora_delta(inp, la[name], lora_config.scale, dt, rate=lora_config.dropout,
                              key=sub, in_axes=in_axes)

    h_btd = _rms_norm(x, w.attn_norm, c.norm_eps)
    qkv_delta = None
    if any(n in la for n in ("q", "k", "v")):
      nk, g = c.num_kv_heads, c.num_heads // c.num_kv_heads
      dq, dk, dv = delta("q", h_btd), delta("k", h_btd), delta("v", h_btd)
      zero = lambda *s: jnp.zeros((b, t, nk, *s, c.head_dim), dt)  # noqa: E731
      qkv_delta = jnp.concatenate([
          zero(g) if dq is None else dq.reshape(b, t, nk, g, c.head_dim),
          zero(1) if dk is None else dk[:, :, :, None],
          zero(1) if dv is None else dv[:, :, :, None]], axis=3)
    q, k, v = _qkv_projection(h_btd, w, cos, sin, dt, qkv_delta)

    def finish(o):
      o = o.reshape(b, t, c.num_heads, c.head_dim)
      attn_out = _dense(o.reshape(b, t, c.num_heads * c.head_dim), w.wo)
      d_o = delta("o", o, in_axes=2)
      y = x + (attn_out if d_o is None else attn_out + d_o)
      h_btd = _rms_norm(y, w.mlp_norm, c.norm_eps)
      gate_up = _dense(h_btd, w.w_gate_up)
      gate, up = gate_up[..., 0, :], gate_up[..., 1, :]
      d_gate, d_up = delta("gate", h_btd), delta("up", h_btd)
      gate = gate if d_gate is None else gate + d_gate
      up = up if d_up is None else up + d_up
      act = jax.nn.silu(gate) * up  # [B, T, F]
      out = _dense(act, w.w_down)
      d_down = delta("down", act)
      return y + (out if d_down is None else out + d_down)

    return (q, k, v), finish

  def layer_key(i):
    return None if dropout_key is None else jax.random.fold_in(dropout_key, i)

  xs_adapters = {} if adapters is None else adapters
  index = jnp.arange(num_layers, dtype=jnp.int32)
  if cache is None:
    def body(x, xs):
      x = _on_rows(x)
      lp, la, i = xs
      lp = _from_bits(lp, params.layers, dt)
      (q, k, v), finish = block(x, _block_weights(lp, dt), la, layer_key(i))
      return finish(_attention.causal_attention(q, k, v, mask, dt, c.attention_impl)), None

    # config.remat: a backward pass keeps only each block's input and
    # recomputes the block (prevent_cse=False: the scan already keeps XLA from
    # merging the recomputation into the forward).
    if c.remat:
      body = jax.checkpoint(body, prevent_cse=False)
    x, _ = jax.lax.scan(body, x, (_as_bits(params.layers), xs_adapters, index))
    return _rms_norm(x, params.final_norm, c.norm_eps), None

  # With a cache the compute layout is built for the whole stack before the
  # scan (in the weights' own dtype; each layer is cast in the loop): inside
  # a decode loop it is then loop-invariant and XLA hoists it out of the loop
  # instead of rebuilding each layer's weights at every step.
  def body(carry, xs):
    x, k_cache, v_cache = carry
    x = _on_rows(x)
    w, la, i = xs
    (q, k, v), finish = block(x, _from_bits(w, stack, dt), la, layer_key(i))
    k_cache, k_layer = _write_layer(k_cache, i, k_at, k)
    v_cache, v_layer = _write_layer(v_cache, i, v_at, v)
    if k_layer is None:
      o = _attention.cached_attention(q, k_cache, v_cache, slots, needed, dt, c.attention_impl,
                                      layer=i)
    else:
      o = _attention.cached_attention(q, k_layer, v_layer, slots, needed, dt, c.attention_impl)
    return (finish(o), k_cache, v_cache), None

  if per_layer or isinstance(cache.k, tuple):  # per-layer buffers: see per_layer_form
    if not isinstance(cache.k, tuple):
      raise ValueError("per-layer params (per_layer_form) need the per-layer cache it returns")
    ks, vs = list(cache.k), list(cache.v)
    if not per_layer:
      stack = _block_weights(params.layers)
      bits = _as_bits(stack)
    for i in range(num_layers):
      if per_layer:
        w = _block_weights(params.layers[i], dt)
      else:
        w = _from_bits(jax.tree.map(lambda a, i=i: a[i], bits), stack, dt)
      la = jax.tree.map(lambda a, i=i: a[i], xs_adapters)
      (q, k, v), finish = block(_on_rows(x), w, la, layer_key(i))
      ks[i] = ks[i].at[k_at].set(k.astype(ks[i].dtype), mode="drop")
      vs[i] = vs[i].at[v_at].set(v.astype(vs[i].dtype), mode="drop")
      x = finish(_attention.cached_attention(q, ks[i], vs[i], slots, needed, dt,
                                             c.attention_impl))
    x = _rms_norm(x, params.final_norm, c.norm_eps)
    return x, KVCache(k=tuple(ks), v=tuple(vs), lengths=cache.lengths + n)
  stack = _block_weights(params.layers)
  (x, k_cache, v_cache), _ = jax.lax.scan(
      body, (x, cache.k, cache.v), (_as_bits(stack), xs_adapters, index))
  x = _rms_norm(x, params.final_norm, c.norm_eps)
  return x, KVCache(k=k_cache, v=v_cache, lengths=cache.lengths + n)


def output_logits(params: Params, h: jax.Array, config: ModelConfig) -> jax.Array:
  """float32 logits ``[..., V]`` of hidden states ``h [..., D]`` (tied or untied head).

  The output projection of :func:`apply`: ``h @ embed.T`` with tied
  embeddings, else ``h @ lm_head``; accumulated in float32. A
  :class:`jagent.models.LoraParams` projects with its base (the output head
  is never adapted).
  """
  params = _lora.base_of(params)
  dt = config.jnp_dtype
  h2 = h.reshape(-1, h.shape[-1])  # 2-D: see _dense
  if params.lm_head is None:
    y = jax.lax.dot_general(h2, params.embed.astype(dt), (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32)
  else:
    y = jnp.dot(h2, params.lm_head.astype(dt), preferred_element_type=jnp.float32)
  return y.reshape(*h.shape[:-1], y.shape[-1])


def apply(
    params: Params,
    tokens: jax.typing.ArrayLike,
    positions: jax.typing.ArrayLike,
    cache: KVCache | None = None,
    *,
    config: ModelConfig,
    num_tokens: jax.typing.ArrayLike | None = None,
    attention_mask: jax.typing.ArrayLike | None = None,
    logits_at: jax.typing.ArrayLike | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[jax.Array, KVCache | None]:
  """Forward pass: logits of the next token after each input token.

  Without a cache, a causal forward over ``tokens`` (key t' visible to query t
  iff t' <= t and ``attention_mask[b, t']``). With a cache, token t of row b is
  written to slot ``cache.lengths[b] + t`` and attends to slots
  ``<= cache.lengths[b] + t``; this one path does both a multi-token prefill
  into an existing cache (a later turn prefills only its new tokens) and a
  single-token decode step (T = 1). Rows may carry fewer valid tokens than T
  (right padding, ``num_tokens``): their padded positions produce unused
  logits and write slots that the next call overwrites.

  Args:
    params: from :func:`init` or a checkpoint loader, or a
      :class:`jagent.models.LoraParams`.
    tokens: int32 [B, T] token ids.
    positions: int32 [B, T] RoPE positions (normally ``cache.lengths[:, None]
      + arange(T)``, or ``arange(T)`` without a cache).
    cache: optional ``KVCache`` with S >= max(lengths + T) slots; slots past S
      are dropped, so size it for prompt plus generation.
    config: the model config (static under jit).
    num_tokens: optional int32 [B], valid tokens per row (default T); the
      returned cache has ``lengths + num_tokens``. Only used with a cache.
    attention_mask: optional bool [B, T] key validity (e.g. left padding);
      only used without a cache.
    logits_at: optional int32 [B]; if given, return logits only at token
      index ``logits_at[b]`` of each row ([B, V]), skipping the output
      projection elsewhere (e.g. the last prompt token of a prefill).
    dropout_key: optional PRNG key of LoRA dropout (see :func:`hidden_states`).

  Returns:
    ``(logits, cache)``: float32 logits [B, T, V] (or [B, V] with
    ``logits_at``) and the updated cache (None without one).

  Raises:
    ValueError: from :func:`hidden_states`.
  """
  x, cache = hidden_states(params, tokens, positions, cache, config=config,
                           num_tokens=num_tokens, attention_mask=attention_mask,
                           dropout_key=dropout_key)
  if logits_at is not None:
    idx = jnp.asarray(logits_at, jnp.int32)
    x = jnp.take_along_axis(x, idx[:, None, None], axis=1)[:, 0]  # [B, D]
  return output_logits(params, x, config), cache
