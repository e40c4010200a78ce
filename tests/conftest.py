"""Test-wide JAX configuration.

- 8 fake CPU devices for multi-device tests (set before jax is imported) and
  the fast-compile XLA flags of ``tests/testenv.py``.
- A persistent compilation cache so repeated runs skip XLA compiles.
- ``jax_numpy_rank_promotion='raise'`` to catch silent broadcasting bugs.
"""

import os

from tests import testenv  # noqa: E402  (no jax import)

os.environ.setdefault("XLA_FLAGS", testenv.xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

_CACHE = os.environ.get(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".jax_cache"),
)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_numpy_rank_promotion", "raise")
