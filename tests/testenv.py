"""The XLA settings of the test suite: one home for the suite and its subprocesses.

The suite is compile-bound on a fresh clone (a cold compilation cache):
``--xla_backend_optimization_level=0`` runs LLVM at -O0 (measured ~25% less
wall time; XLA's HLO passes still run, so the numerics are unchanged).

Measured and rejected: ``--xla_cpu_use_fusion_emitters=false`` (XLA:CPU's
elemental IR emitters instead of its MLIR fusion emitters) cut the suite from
1,206 s to 857 s on 2 cores, but changes float rounding (a rollout's logprobs
differ in their last bits), so the suite would no longer test the numerics
users run: a ``batching="map"`` sweep stopped equalling its separate runs
(tests/experiments/sweep_test.py) and the Bandit run of train_test lost its
reply format.

No persistent compilation cache by default (``JAX_ENABLE_COMPILATION_CACHE``
is ``false`` unless already set): jaxlib 0.10's CPU client segfaulted twice in a
full run, once reading an entry and once serializing an executable to write one
(``compilation_cache.put_executable_and_time``), and a crashed pytest-xdist
worker then hung the run. ``JAX_ENABLE_COMPILATION_CACHE=true`` turns it back on
for local reruns; entries then go to ``CACHE_DIR`` (``$JAX_COMPILATION_CACHE_DIR``,
else ``.jax_cache/<xdist worker>`` at the repository root), never to the user's
``~/.cache``. Subprocess tests (entry points, benchmarks) run with the same flags
and cache settings through :func:`subprocess_env`.
"""

import os

FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0"
# One directory per pytest-xdist worker: jax writes a cache entry in place,
# so a worker reading an entry another worker is still writing read a
# truncated executable and crashed (a segfault in compilation_cache).
CACHE_DIR = os.environ.get(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".jax_cache",
                 os.environ.get("PYTEST_XDIST_WORKER", "main")))
CACHE_MIN_COMPILE_SECONDS = 0.0  # when enabled, every compile is cached
CACHE_ENABLED = os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "false")


def xla_flags(devices: int) -> str:
  """``XLA_FLAGS`` for ``devices`` host-platform (fake CPU) devices and fast compiles."""
  return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_FLAGS}"


def subprocess_env(devices: int) -> dict[str, str]:
  """The environment of a test's child Python process.

  Args:
    devices: CPU devices the child sees (``--xla_force_host_platform_device_count``).

  Returns:
    A copy of ``os.environ`` with JAX on CPU, rank promotion raising (as in
    the suite), the suite's XLA flags and compilation cache.
  """
  env = dict(os.environ)
  env.update(JAX_PLATFORMS="cpu", JAX_NUMPY_RANK_PROMOTION="raise", XLA_FLAGS=xla_flags(devices),
             JAX_COMPILATION_CACHE_DIR=CACHE_DIR, JAX_ENABLE_COMPILATION_CACHE=CACHE_ENABLED,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(CACHE_MIN_COMPILE_SECONDS))
  return env


# Config fields of the run features that have their own tests and only add
# compiles to the end-to-end tests of other things: RAGEN-2's collapse
# diagnostics (tests/jagent/train/diagnostics_test.py, the Bandit run of
# tests/experiments/train_test.py) and held-out evaluation levels
# (tests/jagent/train/held_out_test.py).
WITHOUT_EXTRAS = {"diagnostics.every": 0, "eval.held_out": False}


def without_extras(config):
  """``config`` (an ml_collections ConfigDict) with :data:`WITHOUT_EXTRAS` set, in place."""
  for path, value in WITHOUT_EXTRAS.items():
    block, field = path.split(".")
    if block in config:
      config[block][field] = value
  return config
