"""Test-wide JAX configuration.

- 8 fake CPU devices for multi-device tests (set before jax is imported) and
  the fast-compile XLA flags of ``tests/testenv.py``.
- A persistent compilation cache so repeated runs skip XLA compiles.
- ``jax_numpy_rank_promotion='raise'`` to catch silent broadcasting bugs.
"""

import os

from tests import testenv  # imports no jax

os.environ.setdefault("XLA_FLAGS", testenv.xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", testenv.CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", testenv.CACHE_MIN_COMPILE_SECONDS)
jax.config.update("jax_numpy_rank_promotion", "raise")
