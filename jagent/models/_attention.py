"""Softmax attention of the decoder: with a KV cache (prefill, decode) and without (training).

Pure functions over query/key/value arrays; :mod:`jagent.models._transformer`
calls :func:`causal_attention` (no cache) and :func:`cached_attention` (a KV
cache) from each decoder block, with ``impl=ModelConfig.attention_impl``.

Implementations (:func:`select_impl` resolves "auto" at trace time from
``jax.default_backend()``):

- "reference": jagent's own XLA code (:func:`_causal_reference`,
  :func:`_cached_reference`), tuned on XLA:CPU; "auto" on CPU.
- "xla" / "cudnn": ``jax.nn.dot_product_attention`` with that
  ``implementation`` (cuDNN's fused flash attention, Dao et al. 2022,
  https://arxiv.org/abs/2205.14135, on NVIDIA GPUs). "auto" on GPU is "cudnn"
  where its dtype and shape limits allow, else "xla".
- "pallas": the Pallas TPU flash-attention kernel
  (``jax.experimental.pallas.ops.tpu.flash_attention``, imported only when
  used) for the cache-free path; "auto" on TPU where the sequence length is a
  multiple of its 128-token blocks, else "xla". The cached path has no Pallas
  kernel here (the TPU paged-attention kernels need a paged cache) and runs
  "xla" under "pallas".

Shape letters (jagent._src.types): B batch, T new tokens, S cache slots,
K key/value heads, G = H // K query heads per key/value head, Dh head width.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jagent.models._config import ATTENTION_IMPLS

# The dtypes, head widths and (with a mask, which cuDNN takes as an additive
# bias) even sequence lengths that jax's cuDNN flash attention accepts on
# every supported GPU (jax._src.cudnn.fused_attention_stablehlo.
# check_is_flash_attention; Hopper also takes head widths up to 256).
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
_CUDNN_MAX_HEAD_DIM = 128
# Block length of the Pallas TPU flash kernel's default BlockSizes: the key
# length must be a multiple of it.
_PALLAS_BLOCK = 128
_PLATFORM_IMPLS = {"cudnn": "gpu", "pallas": "tpu"}


def _bad_impl(impl, why):
  return ValueError(f"ModelConfig.attention_impl={impl!r}: {why}")


def select_impl(impl: str, *, cached: bool, dtype, head_dim: int, num_queries: int,
                num_keys: int, platform: str | None = None) -> str:
  """The attention implementation that runs for ``impl`` on ``platform``.

  Called at trace time, so an impossible request fails before compiling.

  Args:
    impl: one of ``ATTENTION_IMPLS`` ("auto", "reference", "xla", "cudnn",
      "pallas"), normally ``ModelConfig.attention_impl``.
    cached: the KV-cache path (:func:`cached_attention`) or not
      (:func:`causal_attention`).
    dtype: the activation dtype of queries, keys and values.
    head_dim: Dh.
    num_queries: T, queries per row.
    num_keys: keys per row (T without a cache, S slots with one).
    platform: "cpu", "gpu" or "tpu"; default ``jax.default_backend()``.

  Returns:
    "reference", "xla", "cudnn" or "pallas": "auto" resolved as described
    in the module docstring; "pallas" on the cached path gives "xla".

  Raises:
    ValueError: naming ``ModelConfig.attention_impl``: an unknown value,
      "cudnn" off GPU or "pallas" off TPU, or a dtype/shape the requested
      kernel does not take.
  """
  if impl not in ATTENTION_IMPLS:
    raise _bad_impl(impl, f"must be one of {ATTENTION_IMPLS}")
  platform = platform or jax.default_backend()
  dtype = jnp.dtype(dtype)
  # cuDNN takes the causal-and-padding mask of the cache-free path and of a
  # multi-token prefill as a bias; a decode step passes key lengths instead.
  uses_bias = not cached or num_queries > 1
  cudnn_why = None
  if dtype not in _CUDNN_DTYPES:
    cudnn_why = f"cuDNN attention needs bfloat16 or float16 activations, not {dtype.name}"
  elif head_dim % 8 or head_dim > _CUDNN_MAX_HEAD_DIM:
    cudnn_why = (f"cuDNN attention needs a head_dim that is a multiple of 8 and at most "
                 f"{_CUDNN_MAX_HEAD_DIM}, not {head_dim}")
  elif uses_bias and (num_queries % 2 or num_keys % 2):
    cudnn_why = (f"cuDNN attention with a mask needs even query and key lengths, not "
                 f"{num_queries} and {num_keys}")
  pallas_why = None
  if not cached and num_keys % _PALLAS_BLOCK:
    pallas_why = (f"the Pallas TPU flash kernel needs a sequence length that is a multiple of "
                  f"{_PALLAS_BLOCK}, not {num_keys}")

  if impl == "auto":
    if platform == "gpu":
      return "xla" if cudnn_why else "cudnn"
    if platform == "tpu":
      return "xla" if cached or pallas_why else "pallas"
    return "reference"
  if impl in _PLATFORM_IMPLS and platform != _PLATFORM_IMPLS[impl]:
    raise _bad_impl(impl, f"runs only on the {_PLATFORM_IMPLS[impl]!r} backend; this one is "
                          f"{platform!r} (use 'auto', 'reference' or 'xla')")
  if impl == "cudnn" and cudnn_why:
    raise _bad_impl(impl, cudnn_why)
  if impl == "pallas":
    if cached:
      return "xla"
    if pallas_why:
      raise _bad_impl(impl, pallas_why)
  return impl


# Key blocks of the cached attention: a call reads keys in blocks and stops
# after the highest filled slot. A decode step (one query per head) over one
# layer's own buffer reads all its slots at once up to _MAX_DECODE_BLOCK: there
# the per-block work of the online softmax cost more than the unfilled slots
# it skips (XLA:CPU, 64 rows, S = 160 and 318). Over a stacked [L, ...] cache
# it reads blocks of _STACKED_DECODE_BLOCK slots: XLA:CPU copies a sliced
# operand before a dot, so reading the whole layer would copy all of it at
# every step (the block size: docs/scaling.md, "CPU speed of the scanned block").
_MIN_KEY_BLOCK = 64
_MAX_KEY_BLOCKS = 16
_MAX_DECODE_BLOCK = 1024
_STACKED_DECODE_BLOCK = 128


def _key_block(num_slots: int, num_queries: int, stacked: bool) -> int:
  """Keys per block of :func:`cached_attention` (``num_slots`` = one block)."""
  if num_queries == 1:
    if stacked:
      return min(num_slots, _STACKED_DECODE_BLOCK)
    return num_slots if num_slots <= _MAX_DECODE_BLOCK else _MAX_DECODE_BLOCK // 2
  return min(num_slots, max(_MIN_KEY_BLOCK, -(-num_slots // _MAX_KEY_BLOCKS)))


def _cached_reference(q_btkgh, k_lbkhs, v_lbksh, layer, slots_bt, needed, dtype, stacked):
  """The reference of :func:`cached_attention`: softmax attention over a KV cache.

  Query t of row b sees cache slots ``<= slots_bt[b, t]``. The G query heads
  of a key/value head and the T queries form one [G*T, Dh] x [Dh, S] product
  per row and head (keys are cached transposed). When the cache is longer
  than one key block (:func:`_key_block`), keys are read block by block with
  an online softmax (Milakov & Gimelshein 2018,
  https://arxiv.org/abs/1805.02867, the FlashAttention recurrence) in a
  ``while_loop`` that stops after the block holding slot ``needed - 1``, so a
  call costs the filled part of the cache, not all S slots (under ``vmap``
  the loop runs to the largest ``needed``). Each block is sliced from the
  ``[L, ...]`` cache itself: XLA:CPU copies a sliced operand before a dot,
  so slicing the whole layer first would copy all of it at every step.

  Args:
    q_btkgh: queries [B, T, K, G, Dh] (rotary embeddings applied).
    k_lbkhs, v_lbksh: the updated stacked cache, keys [L, B, K, Dh, S] and
      values [L, B, K, S, Dh] (this call's tokens written).
    layer: int32 scalar, the layer read.
    slots_bt: int32 [B, T], the last visible slot of each query (its own slot).
    needed: int32 scalar in [1, S]: no query whose output is used sees a slot
      ``>= needed`` (the others may lose those slots).
    dtype: the output dtype.
    stacked: whether the cache is a stacked one (decode steps then read it in
      blocks; a one-layer cache, ``L = 1``, is read whole).

  Returns:
    [B, T, K, G, Dh] attention outputs in ``dtype``.
  """
  b, t, nk, g, dh = q_btkgh.shape
  s_len = v_lbksh.shape[3]
  block = _key_block(s_len, t, stacked)
  neg = jnp.finfo(jnp.float32).min
  q = (q_btkgh.astype(jnp.float32) * (1.0 / math.sqrt(dh))).astype(dtype)
  q = q.transpose(0, 2, 3, 1, 4).reshape(b, nk, g * t, dh)  # [B, K, M=G*T, Dh]
  limit = jnp.tile(slots_bt, (1, g))[:, None, :, None]  # [B, 1, M, 1]: m = g*T + t

  def read(cache, start, axis):
    """Slots [start, start + block) of the layer, [B, K, ...] in ``dtype``."""
    sizes = list(cache.shape)
    sizes[0], sizes[axis] = 1, block
    starts = [layer] + [0] * (cache.ndim - 1)
    starts[axis] = start
    return jax.lax.dynamic_slice(cache, starts, sizes)[0].astype(dtype)

  def scores(kb, start, lo):
    s = jnp.einsum("bkmh,bkhs->bkms", q, kb, preferred_element_type=jnp.float32)
    slot = (start + jnp.arange(kb.shape[3], dtype=jnp.int32))[None, None, None, :]
    return jnp.where((slot >= lo) & (slot <= limit), s, neg)

  def weighted(p, vb):
    return jnp.einsum("bkms,bksh->bkmh", p.astype(dtype), vb, preferred_element_type=jnp.float32)

  if block == s_len:
    o = weighted(jax.nn.softmax(scores(read(k_lbkhs, 0, 4), 0, 0), axis=-1),
                 read(v_lbksh, 0, 3))
  else:
    def body(carry):
      j, m_old, l_old, acc = carry
      lo = j * block
      start = jnp.minimum(lo, s_len - block)  # the last block may overlap the one before
      s = scores(read(k_lbkhs, start, 4), start, lo)
      m_new = jnp.maximum(m_old, jnp.max(s, axis=-1))
      # Masked scores give exp(neg - m_new) = 0: block 0 holds slot 0, which
      # every query sees, so m_new is a real score from the first block on.
      p = jnp.exp(s - m_new[..., None])
      alpha = jnp.exp(m_old - m_new)
      pv = weighted(p, read(v_lbksh, start, 3))
      return j + 1, m_new, l_old * alpha + jnp.sum(p, axis=-1), acc * alpha[..., None] + pv

    init = (jnp.int32(0), jnp.full((b, nk, g * t), neg, jnp.float32),
            jnp.zeros((b, nk, g * t), jnp.float32),
            jnp.zeros((b, nk, g * t, dh), jnp.float32))
    num_blocks = (needed + block - 1) // block
    _, _, l_sum, acc = jax.lax.while_loop(lambda c: c[0] < num_blocks, body, init)
    o = acc / l_sum[..., None]
  o = o.astype(dtype).reshape(b, nk, g, t, dh)
  return o.transpose(0, 3, 1, 2, 4)  # [B, T, K, G, Dh]


# Query block of the cache-free (training / full forward) attention: block i
# attends only to keys [0, end_i), skipping the causally masked upper blocks.
_MIN_QUERY_BLOCK = 64
_MAX_QUERY_BLOCKS = 16


def _causal_reference(q_btkgh, k_btkh, v_btkh, mask_btt, dtype):
  """The reference of :func:`causal_attention`: causal attention in query blocks.

  Softmax attention over all T keys (the mask must be causal:
  ``mask[b, t, s]`` false for ``s > t``), computed per block of queries
  against only the keys up to the block's end, with heads leading
  ([B, H, T, Dh], K/V heads repeated over their G query heads). On XLA:CPU
  this is several times faster than the [B, K, G, T, S] form (measured in
  docs/results.md, "Model kernels on XLA:CPU").

  Args:
    q_btkgh: queries [B, T, K, G, Dh].
    k_btkh, v_btkh: keys and values [B, T, K, Dh].
    mask_btt: bool [B, T, T] causal key validity.
    dtype: the output dtype.

  Returns:
    [B, T, K, G, Dh] attention outputs.
  """
  b, t, nk, g, dh = q_btkgh.shape
  scale = 1.0 / math.sqrt(dh)
  q = q_btkgh.reshape(b, t, nk * g, dh).transpose(0, 2, 1, 3)  # [B, H, T, Dh]
  k = jnp.repeat(k_btkh.transpose(0, 2, 1, 3), g, axis=1)  # [B, H, T, Dh]
  v = jnp.repeat(v_btkh.transpose(0, 2, 1, 3), g, axis=1)
  block = max(_MIN_QUERY_BLOCK, -(-t // _MAX_QUERY_BLOCKS))
  outs = []
  for start in range(0, t, block):
    end = min(t, start + block)
    s = jnp.einsum("bhtd,bhsd->bhts", q[:, :, start:end], k[:, :, :end],
                   preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask_btt[:, None, start:end, :end], s, jnp.finfo(jnp.float32).min)
    p = jax.nn.softmax(s, axis=-1).astype(dtype)
    outs.append(jnp.einsum("bhts,bhsd->bhtd", p, v[:, :, :end],
                           preferred_element_type=jnp.float32).astype(dtype))
  o = jnp.concatenate(outs, axis=2)  # [B, H, T, Dh]
  return o.transpose(0, 2, 1, 3).reshape(b, t, nk, g, dh)


def _causal_fused(q_btkgh, k_btkh, v_btkh, mask_btt, dtype, implementation):
  """:func:`causal_attention` by ``jax.nn.dot_product_attention`` ("xla" or "cudnn")."""
  b, t, nk, g, dh = q_btkgh.shape
  # Heads n = k * G + g, the grouping dot_product_attention uses for K < H.
  # is_causal (already in the mask) lets cuDNN skip the masked key blocks.
  o = jax.nn.dot_product_attention(
      q_btkgh.reshape(b, t, nk * g, dh).astype(dtype), k_btkh.astype(dtype),
      v_btkh.astype(dtype), mask=mask_btt[:, None], is_causal=True,
      implementation=implementation)
  return o.astype(dtype).reshape(b, t, nk, g, dh)


def _causal_pallas(q_btkgh, k_btkh, v_btkh, mask_btt, dtype):
  """:func:`causal_attention` by the Pallas TPU flash-attention kernel.

  The kernel has no GQA (K/V heads are repeated over their G query heads)
  and no mask argument: the key validity of a causal-and-padding mask (its
  last row: the last query sees every valid key) becomes segment ids, so a
  valid query sees the valid keys up to itself, as with the mask (padded
  queries see padded keys; their outputs are unused).
  """
  # Imported here: the TPU kernels need not load (or exist) on CPU or GPU.
  from jax.experimental.pallas.ops.tpu import flash_attention as fa  # pylint: disable=g-import-not-at-top
  b, t, nk, g, dh = q_btkgh.shape
  q = q_btkgh.reshape(b, t, nk * g, dh).transpose(0, 2, 1, 3).astype(dtype)  # [B, H, T, Dh]
  k = jnp.repeat(k_btkh.transpose(0, 2, 1, 3), g, axis=1).astype(dtype)
  v = jnp.repeat(v_btkh.transpose(0, 2, 1, 3), g, axis=1).astype(dtype)
  valid = mask_btt[:, -1, :].astype(jnp.int32)  # [B, T]
  o = fa.flash_attention(q, k, v, segment_ids=fa.SegmentIds(q=valid, kv=valid), causal=True,
                         sm_scale=1.0 / math.sqrt(dh))
  return o.astype(dtype).transpose(0, 2, 1, 3).reshape(b, t, nk, g, dh)


def causal_attention(q_btkgh, k_btkh, v_btkh, mask_btt, dtype, impl="auto"):
  """Causal softmax attention without a cache (the training forward).

  ``softmax(q k^T / sqrt(Dh) + mask) v`` (Vaswani et al. 2017,
  https://arxiv.org/abs/1706.03762) with grouped-query heads, by the
  implementation :func:`select_impl` picks for ``impl``.

  Args:
    q_btkgh: queries [B, T, K, G, Dh].
    k_btkh, v_btkh: keys and values [B, T, K, Dh].
    mask_btt: bool [B, T, T] key validity, causal and padding:
      ``tril(T, T) & key_valid[:, None, :]`` (what
      :func:`jagent.models.hidden_states` builds; the "pallas" path reads
      ``key_valid`` from its last row).
    dtype: the activation and output dtype.
    impl: ``ModelConfig.attention_impl`` (see :func:`select_impl`).

  Returns:
    [B, T, K, G, Dh] attention outputs in ``dtype``; rows of queries that
    are not valid keys themselves (padding) are unspecified.

  Raises:
    ValueError: from :func:`select_impl`, at trace time.
  """
  b, t, nk, g, dh = q_btkgh.shape
  chosen = select_impl(impl, cached=False, dtype=dtype, head_dim=dh, num_queries=t,
                       num_keys=t)
  if chosen == "reference":
    return _causal_reference(q_btkgh, k_btkh, v_btkh, mask_btt, dtype)
  if chosen == "pallas":
    return _causal_pallas(q_btkgh, k_btkh, v_btkh, mask_btt, dtype)
  return _causal_fused(q_btkgh, k_btkh, v_btkh, mask_btt, dtype, chosen)


def _cached_fused(q_btkgh, k_bkhs, v_bksh, slots_bt, dtype, implementation):
  """:func:`cached_attention` by ``jax.nn.dot_product_attention`` ("xla" or "cudnn").

  The cache is transposed to the [B, S, K, Dh] layout the call takes (a copy
  of the cache per layer and call). A decode step (T = 1) passes each row's
  visible slots as key lengths (cuDNN's padding mask, no bias); a prefill
  passes the [B, 1, T, S] mask ``slot <= slots_bt[b, t]``.
  """
  b, t, nk, g, dh = q_btkgh.shape
  s_len = v_bksh.shape[2]
  q = q_btkgh.reshape(b, t, nk * g, dh).astype(dtype)
  k = k_bkhs.transpose(0, 3, 1, 2).astype(dtype)  # [B, S, K, Dh]
  v = v_bksh.transpose(0, 2, 1, 3).astype(dtype)
  if t == 1:
    kv_len = jnp.clip(slots_bt[:, 0] + 1, 1, s_len).astype(jnp.int32)
    o = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=kv_len,
                                     implementation=implementation)
  else:
    slot = jnp.arange(s_len, dtype=jnp.int32)
    mask = slot[None, None, None, :] <= slots_bt[:, None, :, None]  # [B, 1, T, S]
    o = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation)
  return o.astype(dtype).reshape(b, t, nk, g, dh)


def cached_attention(q_btkgh, k_cache, v_cache, slots_bt, needed, dtype, impl="auto",
                     layer=None):
  """Softmax attention of queries [B,T,K,G,Dh] over a KV cache (prefill, decode).

  Query t of row b sees cache slots ``<= slots_bt[b, t]`` (for a call that
  wrote its T tokens at slots ``lengths[b] + t``: causal attention with a
  per-row offset), by the implementation :func:`select_impl` picks for
  ``impl``.

  Args:
    q_btkgh: queries [B, T, K, G, Dh] (rotary embeddings applied).
    k_cache, v_cache: the updated cache (this call's tokens written): one
      layer's keys [B, K, Dh, S] and values [B, K, S, Dh], or with ``layer``
      the stacked cache, [L, B, K, Dh, S] and [L, B, K, S, Dh].
    slots_bt: int32 [B, T], the last visible slot of each query (its own slot).
    needed: int32 scalar in [1, S]: no query whose output is used sees a slot
      ``>= needed`` (the reference reads only those slots; the fused calls
      read all S).
    dtype: the activation and output dtype.
    impl: ``ModelConfig.attention_impl`` (see :func:`select_impl`).
    layer: None, or an int32 scalar: the layer of a stacked cache to read
      (the reference then slices its key blocks from the stack, never the
      whole layer).

  Returns:
    [B, T, K, G, Dh] attention outputs in ``dtype``.

  Raises:
    ValueError: from :func:`select_impl`, at trace time; a cache whose rank
      does not match ``layer`` (4 without it, 5 with it).
  """
  b, t, nk, g, dh = q_btkgh.shape
  rank = 4 if layer is None else 5
  if k_cache.ndim != rank or v_cache.ndim != rank:
    raise ValueError(f"cached_attention needs rank-{rank} keys and values with layer={layer!r}; "
                     f"got shapes {k_cache.shape} and {v_cache.shape}")
  stacked = layer is not None
  if layer is None:
    k_cache, v_cache, layer = k_cache[None], v_cache[None], 0
  chosen = select_impl(impl, cached=True, dtype=dtype, head_dim=dh, num_queries=t,
                       num_keys=v_cache.shape[3])
  if chosen == "reference":
    return _cached_reference(q_btkgh, k_cache, v_cache, layer, slots_bt, needed, dtype, stacked)
  k_bkhs = jax.lax.dynamic_index_in_dim(k_cache, layer, keepdims=False)
  v_bksh = jax.lax.dynamic_index_in_dim(v_cache, layer, keepdims=False)
  return _cached_fused(q_btkgh, k_bkhs, v_bksh, slots_bt, dtype, chosen)
