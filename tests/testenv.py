"""The XLA settings of the test suite: one home for the suite and its subprocesses.

The suite is compile-bound on a fresh clone (a cold compilation cache), so it
trades run time for compile time:

- ``--xla_backend_optimization_level=0``: LLVM at -O0 (measured ~25% less wall
  time; XLA's HLO passes still run, so the numerics are unchanged).
- ``--xla_cpu_use_fusion_emitters=false``: XLA:CPU's elemental IR emitters
  instead of its MLIR fusion emitters; the main job's rollout program compiled
  in 3.6 s instead of 7.0 s (jaxlib 0.10.2, 2-core Xeon), ran 0.12 s instead of
  0.09 s, and produced the same tokens.

Subprocess tests (entry points, benchmarks, the notebooks) run with the same
flags through :func:`subprocess_env`, so they compile as fast and share the
persistent compilation cache.
"""

import os

FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_flags(devices: int) -> str:
  """``XLA_FLAGS`` for ``devices`` host-platform (fake CPU) devices and fast compiles."""
  return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_FLAGS}"


def subprocess_env(devices: int, cache_dir: str | None) -> dict[str, str]:
  """The environment of a test's child Python process.

  Args:
    devices: CPU devices the child sees (``--xla_force_host_platform_device_count``).
    cache_dir: the persistent compilation cache to share (None or "": none).

  Returns:
    A copy of ``os.environ`` with JAX on CPU, rank promotion raising (as in
    the suite), the suite's XLA flags and the cache settings.
  """
  env = dict(os.environ)
  env.update(JAX_PLATFORMS="cpu", JAX_NUMPY_RANK_PROMOTION="raise", XLA_FLAGS=xla_flags(devices),
             JAX_COMPILATION_CACHE_DIR=cache_dir or "",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.5")
  return env
