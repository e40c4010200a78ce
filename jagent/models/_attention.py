"""Softmax attention of the decoder: with a KV cache (prefill, decode) and without (training).

Pure functions over query/key/value arrays; :mod:`jagent.models._transformer`
calls them from each decoder block.

Shape letters (jagent._src.types): B batch, T new tokens, S cache slots,
K key/value heads, G = H // K query heads per key/value head, Dh head width.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


# Key blocks of the cached attention. A multi-token prefill into a cache reads
# keys in blocks and stops after the highest filled slot; a decode step (one
# query per head) reads all slots at once up to _MAX_DECODE_BLOCK slots: there
# the per-block work of the online softmax cost more than the unfilled slots
# it skips (XLA:CPU, 64 rows, S = 160 and 318).
_MIN_KEY_BLOCK = 64
_MAX_KEY_BLOCKS = 16
_MAX_DECODE_BLOCK = 1024


def _key_block(num_slots: int, num_queries: int) -> int:
  """Keys per block of :func:`cached_attention` (``num_slots`` = one block)."""
  if num_queries == 1:
    return num_slots if num_slots <= _MAX_DECODE_BLOCK else _MAX_DECODE_BLOCK // 2
  return min(num_slots, max(_MIN_KEY_BLOCK, -(-num_slots // _MAX_KEY_BLOCKS)))


def cached_attention(q_btkgh, k_bkhs, v_bksh, slots_bt, needed, dtype):
  """Softmax attention of queries [B,T,K,G,Dh] over a KV cache.

  Query t of row b sees cache slots ``<= slots_bt[b, t]``. The G query heads
  of a key/value head and the T queries form one [G*T, Dh] x [Dh, S] product
  per row and head (keys are cached transposed). When the cache is longer
  than one key block (:func:`_key_block`; a prefill of T > 1 tokens), keys
  are read block by block with an online softmax (Milakov & Gimelshein 2018,
  https://arxiv.org/abs/1805.02867, the FlashAttention recurrence) in a
  ``while_loop`` that stops after the block holding slot ``needed - 1``, so a
  prefill costs the filled part of the cache, not all S slots (under ``vmap``
  the loop runs to the largest ``needed``).

  Args:
    q_btkgh: queries [B, T, K, G, Dh] (rotary embeddings applied).
    k_bkhs, v_bksh: the updated cache, keys [B, K, Dh, S] and values
      [B, K, S, Dh] (this call's tokens written).
    slots_bt: int32 [B, T], the last visible slot of each query (its own slot).
    needed: int32 scalar in [1, S]: no query whose output is used sees a slot
      ``>= needed`` (the others may lose those slots).
    dtype: the output dtype.

  Returns:
    [B, T, K, G, Dh] attention outputs in ``dtype``.
  """
  b, t, nk, g, dh = q_btkgh.shape
  s_len = v_bksh.shape[2]
  block = _key_block(s_len, t)
  neg = jnp.finfo(jnp.float32).min
  q = (q_btkgh.astype(jnp.float32) * (1.0 / math.sqrt(dh))).astype(dtype)
  q = q.transpose(0, 2, 3, 1, 4).reshape(b, nk, g * t, dh)  # [B, K, M=G*T, Dh]
  limit = jnp.tile(slots_bt, (1, g))[:, None, :, None]  # [B, 1, M, 1]: m = g*T + t

  def scores(kb, start, lo):
    s = jnp.einsum("bkmh,bkhs->bkms", q, kb, preferred_element_type=jnp.float32)
    slot = (start + jnp.arange(kb.shape[3], dtype=jnp.int32))[None, None, None, :]
    return jnp.where((slot >= lo) & (slot <= limit), s, neg)

  def weighted(p, vb):
    return jnp.einsum("bkms,bksh->bkmh", p.astype(dtype), vb, preferred_element_type=jnp.float32)

  if block == s_len:
    o = weighted(jax.nn.softmax(scores(k_bkhs, 0, 0), axis=-1), v_bksh)
  else:
    def body(carry):
      j, m_old, l_old, acc = carry
      lo = j * block
      start = jnp.minimum(lo, s_len - block)  # the last block may overlap the one before
      s = scores(jax.lax.dynamic_slice_in_dim(k_bkhs, start, block, axis=3), start, lo)
      m_new = jnp.maximum(m_old, jnp.max(s, axis=-1))
      # Masked scores give exp(neg - m_new) = 0: block 0 holds slot 0, which
      # every query sees, so m_new is a real score from the first block on.
      p = jnp.exp(s - m_new[..., None])
      alpha = jnp.exp(m_old - m_new)
      pv = weighted(p, jax.lax.dynamic_slice_in_dim(v_bksh, start, block, axis=2))
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


def causal_attention(q_btkgh, k_btkh, v_btkh, mask_btt, dtype):
  """Causal softmax attention without a cache, in query blocks.

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
