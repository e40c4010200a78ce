"""Roofline arithmetic of the benchmarks: measured copy bandwidth, matmul rate, step FLOPs.

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


def decode_step_bytes(params, config, batch: int, slots: int) -> tuple[int, int]:
  """Bytes one decode step must read: every weight plus the whole K/V cache.

  Every decode step attends over all ``slots`` of the float32 cache
  (keys and values: 2 x L x B x K x S x Dh x 4 bytes).

  Args:
    params: the model's parameter pytree.
    config: its ``jagent.models.ModelConfig``.
    batch: B, rows decoded together.
    slots: S, cache slots attended over.

  Returns:
    (weight bytes, K/V cache bytes).
  """
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  kv_bytes = 2 * config.num_layers * batch * config.num_kv_heads * slots * config.head_dim * 4
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
