"""Decoder-only transformer (Qwen2 / Llama 3) as a pair of pure functions.

``init(config, key) -> Params`` and ``apply(params, tokens, positions, cache,
config=...) -> (logits, cache)``, which is ``hidden_states`` (the trunk, also
public for value heads) followed by ``output_logits``. Parameters and the KV cache
are ``flax.struct.dataclass`` pytrees of plain arrays, so both functions work under
``jax.jit``, ``jax.grad``, ``jax.vmap`` and any sharding; ``param_axes`` and
``cache_axes`` return the same pytrees with a ``PartitionSpec`` of logical axis
names in place of every array, for sharding by rules (``jagent.sharding``:
``tree_shardings(param_axes(config), params, mesh, rules)``, ``param_shardings``).

Layers are a tuple (one ``LayerParams`` per layer, unrolled in ``apply``) rather
than stacked arrays: each decode step then updates each layer's cache buffer in
place, and no step slices a layer's weights or cache out of a stacked array.

Shape letters (jagent._src.types): B batch, T new tokens, S cache slots,
D width, H query heads, K key/value heads, G = H // K, Dh head width,
F MLP width, V vocab.
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jagent.models import _attention
from jagent.models import _lora
from jagent.models._config import ModelConfig

# Logical axis names (constants so sharding rules can refer to them).
VOCAB = "vocab"
EMBED = "embed"
Q_HEADS = "q_heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"
BATCH = "batch"
CACHE_SEQ = "cache_seq"


@flax.struct.dataclass
class LayerParams:
  """Parameters of one decoder layer (axis names in brackets)."""
  attn_norm: jax.Array  # shape=[D], dtype=param_dtype  (embed)
  wq: jax.Array  # shape=[D, H, Dh]  (embed, q_heads, head_dim)
  wk: jax.Array  # shape=[D, K, Dh]  (embed, kv_heads, head_dim)
  wv: jax.Array  # shape=[D, K, Dh]  (embed, kv_heads, head_dim)
  bq: jax.Array | None  # shape=[H, Dh] or None without qkv_bias  (q_heads, head_dim)
  bk: jax.Array | None  # shape=[K, Dh] or None  (kv_heads, head_dim)
  bv: jax.Array | None  # shape=[K, Dh] or None  (kv_heads, head_dim)
  wo: jax.Array  # shape=[H, Dh, D]  (q_heads, head_dim, embed)
  mlp_norm: jax.Array  # shape=[D]  (embed)
  w_gate: jax.Array  # shape=[D, F]  (embed, mlp)
  w_up: jax.Array  # shape=[D, F]  (embed, mlp)
  w_down: jax.Array  # shape=[F, D]  (mlp, embed)


@flax.struct.dataclass
class Params:
  """All parameters of a decoder-only transformer."""
  embed: jax.Array  # shape=[V, D], dtype=param_dtype  (vocab, embed)
  layers: tuple[LayerParams, ...]  # L entries
  final_norm: jax.Array  # shape=[D]  (embed)
  lm_head: jax.Array | None  # shape=[D, V], None when embeddings are tied  (embed, vocab)


@flax.struct.dataclass
class KVCache:
  """Per-layer key/value cache; slot s of row b holds that row's token s.

  Rotary embeddings are already applied to the cached keys. Keys are stored
  transposed, slots last ([B, K, Dh, S]), so that the scores of the G query
  heads of a key/value head are one [G, Dh] x [Dh, S] product per row, which
  made a decode step's attention faster on XLA:CPU than keys laid out
  [B, K, S, Dh] (those [S, Dh] x [Dh] products reduce over the short minor
  axis; measured in docs/results.md, "Model kernels on XLA:CPU"). Values stay
  [B, K, S, Dh]. Slots at or past ``lengths[b]`` hold garbage and are never
  attended to by valid queries.
  """
  k: tuple[jax.Array, ...]  # L x shape=[B, K, Dh, S], dtype=dtype  (batch, kv_heads, head_dim, cache_seq)
  v: tuple[jax.Array, ...]  # L x shape=[B, K, S, Dh]  (batch, kv_heads, cache_seq, head_dim)
  lengths: jax.Array  # shape=[B], dtype=int32: filled slots per row  (batch)

  @property
  def max_length(self) -> int:
    """S, the number of slots per row."""
    return self.v[0].shape[2]


def param_axes(config: ModelConfig) -> Params:
  """Logical axis names of every parameter: ``Params`` with PartitionSpec leaves."""
  bias = config.qkv_bias
  layer = LayerParams(
      attn_norm=P(EMBED),
      wq=P(EMBED, Q_HEADS, HEAD_DIM), wk=P(EMBED, KV_HEADS, HEAD_DIM),
      wv=P(EMBED, KV_HEADS, HEAD_DIM),
      bq=P(Q_HEADS, HEAD_DIM) if bias else None,
      bk=P(KV_HEADS, HEAD_DIM) if bias else None,
      bv=P(KV_HEADS, HEAD_DIM) if bias else None,
      wo=P(Q_HEADS, HEAD_DIM, EMBED), mlp_norm=P(EMBED),
      w_gate=P(EMBED, MLP), w_up=P(EMBED, MLP), w_down=P(MLP, EMBED))
  return Params(
      embed=P(VOCAB, EMBED), layers=(layer,) * config.num_layers, final_norm=P(EMBED),
      lm_head=None if config.tie_embeddings else P(EMBED, VOCAB))


def cache_axes(config: ModelConfig) -> KVCache:
  """Logical axis names of every KV-cache array: ``KVCache`` with PartitionSpec leaves."""
  k = (P(BATCH, KV_HEADS, HEAD_DIM, CACHE_SEQ),) * config.num_layers
  v = (P(BATCH, KV_HEADS, CACHE_SEQ, HEAD_DIM),) * config.num_layers
  return KVCache(k=k, v=v, lengths=P(BATCH))


@functools.partial(jax.jit, static_argnames=("config",))
def init(config: ModelConfig, key: jax.Array) -> Params:
  """Random parameters (one jit-compiled program per config).

  Matrices are N(0, 0.02^2) (the Hugging Face ``initializer_range`` default),
  biases zero, RMSNorm scales one. All matrices come from one normal draw of
  ``num_params`` values (a transient float32 vector that size). For a sharded
  init, wrap it:
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
  d, h, k, dh, f = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim
  matrices = [(c.vocab_size, d)] + [
      (d, h, dh), (d, k, dh), (d, k, dh), (h, dh, d), (d, f), (d, f), (f, d)] * c.num_layers
  if not c.tie_embeddings:
    matrices.append((d, c.vocab_size))
  # One draw for all matrices, then slices: each separate jax.random call
  # adds its own threefry code, and compile time grew with their number.
  sizes = [math.prod(shape) for shape in matrices]
  flat = 0.02 * jax.random.normal(key, (sum(sizes),), jnp.float32)
  offsets = np.cumsum([0] + sizes)
  pieces = iter(flat[o:o + n].reshape(shape).astype(dt)
                for o, n, shape in zip(offsets, sizes, matrices))

  def zeros(shape):
    return jnp.zeros(shape, dt) if c.qkv_bias else None

  embed = next(pieces)
  layers = []
  for _ in range(c.num_layers):
    wq, wk, wv, wo, w_gate, w_up, w_down = (next(pieces) for _ in range(7))
    layers.append(LayerParams(
        attn_norm=jnp.ones((d,), dt), wq=wq, wk=wk, wv=wv, bq=zeros((h, dh)),
        bk=zeros((k, dh)), bv=zeros((k, dh)), wo=wo, mlp_norm=jnp.ones((d,), dt),
        w_gate=w_gate, w_up=w_up, w_down=w_down))
  lm_head = None if c.tie_embeddings else next(pieces)
  return Params(embed=embed, layers=tuple(layers), final_norm=jnp.ones((d,), dt),
                lm_head=lm_head)


def init_cache(config: ModelConfig, batch_size: int, max_length: int,
               lengths: jax.typing.ArrayLike | None = None) -> KVCache:
  """An empty KV cache of ``max_length`` slots per row.

  Args:
    config: the model config (cache dtype is ``config.dtype``).
    batch_size: B.
    max_length: S, slots per row (prompt plus every token to be generated).
    lengths: optional int32 [B] initial fill (default zeros).

  Returns:
    ``KVCache`` with zero arrays per layer: keys [B, K, Dh, S], values
    [B, K, S, Dh].

  Raises:
    ValueError: non-positive ``batch_size`` or ``max_length``.
  """
  if batch_size <= 0 or max_length <= 0:
    raise ValueError(f"init_cache needs positive batch_size and max_length, got "
                     f"{batch_size}, {max_length}")
  shape_k = (batch_size, config.num_kv_heads, config.head_dim, max_length)
  shape_v = (batch_size, config.num_kv_heads, max_length, config.head_dim)
  lengths = jnp.zeros((batch_size,), jnp.int32) if lengths is None else jnp.asarray(
      lengths, jnp.int32)
  return KVCache(k=tuple(jnp.zeros(shape_k, config.jnp_dtype) for _ in range(config.num_layers)),
                 v=tuple(jnp.zeros(shape_v, config.jnp_dtype) for _ in range(config.num_layers)),
                 lengths=lengths)


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


def _qkv_projection(h_btd, lp, cos_btf, sin_btf, dtype, delta=None):
  """Queries [B,T,K,G,Dh], keys and values [B,T,K,Dh] (rotary applied) in one matmul.

  The weights of each key/value head's G query heads, its key and its value
  are stacked ``[D, K, G + 2, Dh]`` (query head ``h = k * G + g`` uses
  key/value head ``k``, as in grouped-query attention, Ainslie et al. 2023,
  https://arxiv.org/abs/2305.13245), so the three projections are one
  [B*T, D] x [D, K*(G+2)*Dh] product, faster on XLA:CPU than three products
  (as is the gate/up pair of the MLP as one; measured in
  docs/results.md, "Model kernels on XLA:CPU"). The stacking keeps the K axis
  leading, so a ``KV_HEADS``-sharded layout stays local; inside a decode loop
  XLA hoists it out of the loop (the weights are loop-invariant). ``delta``
  (``[B, T, K, G + 2, Dh]``, LoRA's additions) is added before the biases.
  """
  d, nk, dh = lp.wk.shape
  g = lp.wq.shape[1] // nk
  w = jnp.concatenate([lp.wq.reshape(d, nk, g, dh), lp.wk[:, :, None], lp.wv[:, :, None]],
                      axis=2).astype(dtype)
  y = _dense(h_btd, w)  # [B, T, K, G + 2, Dh]
  if delta is not None:
    y = y + delta
  if lp.bq is not None:
    bias = jnp.concatenate([lp.bq.reshape(nk, g, dh), lp.bk[:, None], lp.bv[:, None]], axis=1)
    y = y + bias.astype(dtype)[None, None]
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
    ValueError: tokens/positions not rank 2 or of different shapes.
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
  if adapters is None:
    adapters = (None,) * len(params.layers)

  x = jnp.take(params.embed, tokens, axis=0).astype(dt)  # [B, T, D]
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
    n = jnp.full((b,), t, jnp.int32) if num_tokens is None else jnp.asarray(num_tokens, jnp.int32)
    # Slots any used query reads: rows with no valid token read none.
    needed = jnp.clip(jnp.max(jnp.where(n > 0, cache.lengths + n, 0)), 1, cache.max_length)
  def layer(x, lp, cos, sin, k_cache, v_cache, la, key):
    """One pre-norm decoder block; with a cache also its updated K/V.

    ``la``: the layer's LoRA pairs (a dict by module name) or None; ``key``
    its dropout key or None.
    """
    la = la or {}

    def delta(name, inp, in_axes=1):
      """LoRA's addition to projection ``name`` (None when not adapted)."""
      if name not in la:
        return None
      sub = None if key is None else jax.random.fold_in(key, _lora.LORA_MODULES.index(name))
      return _lora.lora_delta(inp, la[name], lora_config.scale, dt, rate=lora_config.dropout,
                              key=sub, in_axes=in_axes)

    h_btd = _rms_norm(x, lp.attn_norm, c.norm_eps)
    qkv_delta = None
    if any(n in la for n in ("q", "k", "v")):
      nk, g = c.num_kv_heads, c.num_heads // c.num_kv_heads
      dq, dk, dv = delta("q", h_btd), delta("k", h_btd), delta("v", h_btd)
      zero = lambda *s: jnp.zeros((b, t, nk, *s, c.head_dim), dt)  # noqa: E731
      qkv_delta = jnp.concatenate([
          zero(g) if dq is None else dq.reshape(b, t, nk, g, c.head_dim),
          zero(1) if dk is None else dk[:, :, :, None],
          zero(1) if dv is None else dv[:, :, :, None]], axis=3)
    q, k, v = _qkv_projection(h_btd, lp, cos, sin, dt, qkv_delta)
    if cache is None:
      o = _attention.causal_attention(q, k, v, mask, dt, c.attention_impl)
      k_all = v_all = None
    else:
      # Advanced indices on two axes put them first: updates are [B, T, K, Dh].
      k_all = k_cache.at[rows, :, :, slots].set(k.astype(k_cache.dtype), mode="drop")
      v_all = v_cache.at[rows, :, slots, :].set(v.astype(v_cache.dtype), mode="drop")
      o = _attention.cached_attention(q, k_all.astype(dt), v_all.astype(dt), slots, needed, dt,
                                      c.attention_impl)
    o = o.reshape(b, t, c.num_heads, c.head_dim)
    attn_out = _dense(o.reshape(b, t, c.num_heads * c.head_dim),
                      lp.wo.astype(dt).reshape(c.num_heads * c.head_dim, -1))
    d_o = delta("o", o, in_axes=2)
    x = x + (attn_out if d_o is None else attn_out + d_o)
    h_btd = _rms_norm(x, lp.mlp_norm, c.norm_eps)
    # Gate and up projections as one matmul over weights stacked [D, 2, F].
    gate_up = _dense(h_btd, jnp.stack([lp.w_gate, lp.w_up], axis=1).astype(dt))
    gate, up = gate_up[..., 0, :], gate_up[..., 1, :]
    d_gate, d_up = delta("gate", h_btd), delta("up", h_btd)
    gate = gate if d_gate is None else gate + d_gate
    up = up if d_up is None else up + d_up
    act = jax.nn.silu(gate) * up  # [B, T, F]
    out = _dense(act, lp.w_down.astype(dt))
    d_down = delta("down", act)
    return x + (out if d_down is None else out + d_down), k_all, v_all

  # config.remat: a backward pass keeps only each block's input and recomputes
  # the block (no cache: the training forward).
  block = jax.checkpoint(layer) if c.remat and cache is None else layer
  new_k, new_v = [], []
  for i, lp in enumerate(params.layers):
    key = None if dropout_key is None else jax.random.fold_in(dropout_key, i)
    x, k_all, v_all = block(x, lp, cos, sin, None if cache is None else cache.k[i],
                            None if cache is None else cache.v[i], adapters[i], key)
    new_k.append(k_all)
    new_v.append(v_all)

  x = _rms_norm(x, params.final_norm, c.norm_eps)
  if cache is None:
    return x, None
  return x, KVCache(k=tuple(new_k), v=tuple(new_v), lengths=cache.lengths + n)


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
    ValueError: tokens/positions not rank 2 or of different shapes.
  """
  x, cache = hidden_states(params, tokens, positions, cache, config=config,
                           num_tokens=num_tokens, attention_mask=attention_mask,
                           dropout_key=dropout_key)
  if logits_at is not None:
    idx = jnp.asarray(logits_at, jnp.int32)
    x = jnp.take_along_axis(x, idx[:, None, None], axis=1)[:, 0]  # [B, D]
  return output_logits(params, x, config), cache
