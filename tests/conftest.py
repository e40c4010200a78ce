"""Test-wide JAX configuration and scheduling.

- 8 fake CPU devices for multi-device tests (set before jax is imported) and
  the fast-compile XLA flags of ``tests/testenv.py``.
- The persistent compilation cache off unless asked for (``tests/testenv.py``).
- ``jax_numpy_rank_promotion='raise'`` to catch silent broadcasting bugs.
- Classes marked ``@pytest.mark.heavy`` run first: with ``pytest -n 2`` the
  two workers then fill in with the many short classes and finish together
  (longest-first scheduling) instead of one of them starting a whole training
  job when the other has nothing left.
- Compiled programs are freed after a test module once the worker holds over
  20,000 memory mappings: an XLA:CPU executable holds its own, and a worker
  that kept every program of the suite alive neared the kernel's
  ``vm.max_map_count`` (65,530) and segfaulted inside the compiler when the
  next mapping failed. Below the threshold later modules reuse the programs.
"""

import gc
import os

from tests import testenv  # imports no jax

os.environ.setdefault("XLA_FLAGS", testenv.xla_flags(8))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = testenv.CACHE_ENABLED

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_compilation_cache_dir", testenv.CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", testenv.CACHE_MIN_COMPILE_SECONDS)
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_collection_modifyitems(config, items):
  """Heavy classes first, otherwise collection order (a stable sort)."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


_MAX_MAPPINGS = 20_000


def _num_mappings() -> int:
  """This process's memory mappings (0 where /proc is not available)."""
  try:
    with open(f"/proc/{os.getpid()}/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return 0


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drops every jit cache (and so its executables) when a module ends with many mappings."""
  yield
  if _num_mappings() > _MAX_MAPPINGS:
    jax.clear_caches()
    gc.collect()
