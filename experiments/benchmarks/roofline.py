"""Roofline arithmetic of the benchmarks: copy bandwidth, matmul rate, step FLOPs, chip peaks.

Flag-free, so tests can import it (the benchmark entry points define absl
flags, and two of them in one process collide).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import timing


def copy_bandwidth(nbytes: int = 256 << 20) -> float:
  """Bytes/s of a large host memory copy (``np.copyto``), best of 5."""
  src = np.ones(nbytes // 4, np.float32)
  dst = np.empty_like(src)
  return nbytes / timing.best_seconds(lambda: np.copyto(dst, src), 5, warmup=False,
                                      sync=lambda _: None)


def device_copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 10) -> float:
  """Bytes/s moved by a jitted elementwise op on the default device, best of ``repeats``.

  ``-x`` of a float32 array of ``nbytes`` reads and writes it once, so
  ``2 x nbytes`` bytes move per call (STREAM's copy convention; an
  accelerator's datasheet HBM bandwidth counts reads and writes alike).
  Unlike :func:`copy_bandwidth` (host memory, ``nbytes`` per copy), this is
  the device memory an accelerator's decode step reads from.
  """
  x = jnp.ones((nbytes // 4,), jnp.float32)
  neg = jax.jit(jnp.negative)
  return 2.0 * nbytes / timing.best_seconds(lambda: neg(x), repeats)


def decode_step_bytes(params, config, batch: int, slots: int) -> tuple[int, int]:
  """Bytes one decode step must read: every weight plus the whole K/V cache.

  Every decode step attends over all ``slots`` of the cache, stored in the
  activation dtype ``config.dtype`` (keys and values: 2 x L x B x K x S x Dh
  x itemsize bytes; 4 for float32, 2 for bfloat16).

  Args:
    params: the model's parameter pytree.
    config: its ``jagent.models.ModelConfig``.
    batch: B, rows decoded together.
    slots: S, cache slots attended over.

  Returns:
    (weight bytes, K/V cache bytes).
  """
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  kv_bytes = (2 * config.num_layers * batch * config.num_kv_heads * slots * config.head_dim
              * jnp.dtype(config.dtype).itemsize)
  return weight_bytes, kv_bytes


def decode_step_flops(config, batch: int, slots: int) -> float:
  """FLOPs of one decode step (one token per row), 2 per multiply-add.

  Every matmul (q/k/v, output, gate/up, down projections of each layer and
  the vocabulary projection) plus cached attention over all ``slots``
  (scores and weighted values: 2 x H x S x Dh multiply-adds per layer);
  norms, RoPE, softmax and sampling are left out (a few % at most; within
  1.3% of XLA's cost analysis for ``tiny`` and ``small-10m``).

  Args:
    config: a ``jagent.models.ModelConfig``.
    batch: B, rows decoded together.
    slots: S, cache slots attended over.

  Returns:
    FLOPs (float).
  """
  d, h, nk, dh = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
  per_layer = d * (h + 2 * nk) * dh + h * dh * d + 3 * d * config.mlp_dim + 2 * h * slots * dh
  return 2.0 * batch * (config.num_layers * per_layer + d * config.vocab_size)


def matmul_flops_per_s(n: int = 1024, repeats: int = 5) -> float:
  """Measured float32 FLOP/s of a jitted [n, n] x [n, n] matmul, best of ``repeats``."""
  x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  mm = jax.jit(jnp.dot)
  return 2.0 * n ** 3 / timing.best_seconds(lambda: mm(x, x), repeats)


def train_step_flops(config, batch: int, seq: int, *, attention: bool = True) -> float:
  """FLOPs of one training step (forward and backward) on ``batch`` x ``seq`` tokens.

  ``6 x N x T`` (Kaplan et al. 2020, https://arxiv.org/abs/2001.08361: 2 per
  parameter and token forward, 4 backward; ``N = config.num_params()``,
  ``T = batch x seq``) plus, with ``attention``, the attention scores and
  weighted values, ``12 x L x H x Dh x seq`` per token (PaLM's model FLOPs,
  Chowdhery et al. 2022, https://arxiv.org/abs/2204.02311, appendix B: the
  full ``seq x seq`` product, causal masking not subtracted). Rematerialised
  forwards are not counted (model FLOPs, not hardware FLOPs).

  Args:
    config: a ``jagent.models.ModelConfig``.
    batch: B, rows.
    seq: S, tokens per row.
    attention: add the attention term.

  Returns:
    FLOPs (float).
  """
  tokens = batch * seq
  flops = 6.0 * config.num_params() * tokens
  if attention:
    flops += 12.0 * config.num_layers * config.num_heads * config.head_dim * seq * tokens
  return flops


# Dense (no sparsity) bfloat16 peak TFLOP/s of one device from the vendors'
# datasheets, matched in order against ``jax.Device.device_kind`` (lower case,
# first substring wins: "h100 pcie" before "h100", "l40s" before "l4"). jax's
# TPU kinds: "TPU v4", "TPU v5 lite" (v5e), "TPU v5" / "TPU v5p", "TPU v6 lite"
# (v6e).
PEAK_BF16_TFLOPS = (
    ("h100 pcie", 756.0), ("h100 nvl", 835.0), ("h100", 989.0), ("h200", 989.0),
    ("a100", 312.0), ("l40s", 362.0), ("l40", 181.0), ("l4", 121.0),
    ("tpu v4", 275.0), ("tpu v5 lite", 197.0), ("tpu v5e", 197.0), ("tpu v5p", 459.0),
    ("tpu v5", 459.0), ("tpu v6 lite", 918.0), ("tpu v6e", 918.0),
)


def peak_tflops(device_kind: str) -> float | None:
  """The dense bfloat16 peak TFLOP/s of one ``device_kind`` device (:data:`PEAK_BF16_TFLOPS`).

  Args:
    device_kind: ``jax.devices()[0].device_kind``, e.g. "NVIDIA H100 80GB
      HBM3" or "TPU v5 lite".

  Returns:
    The peak, or None for a kind not in the table (a CPU, an older GPU).
  """
  kind = device_kind.lower()
  for pattern, peak in PEAK_BF16_TFLOPS:
    if pattern in kind:
      return peak
  return None
