"""What every ``experiments`` program sets up: its default workdir, the XLA cache, quiet logs.

A run's pieces live in their own modules: the config's errors and field
names in ``experiments.fields``, the jagent dataclass of each config block
in ``experiments.blocks``, the objective's hyperparameters in
``experiments.hyperparameters``, what a config means and its checks
(``RunSpec``) in ``experiments.spec``, the run itself in
``experiments.experiment``, the programs runs share in
``experiments.programs`` and the statistics a run reports in
``experiments.stats``.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags
from absl import logging
import jax

# Where experiments.train writes a run and experiments.eval reads it by default.
DEFAULT_WORKDIR = os.path.join(os.path.expanduser("~"), "jagent_runs", "default")


def setup_compilation_cache(path: str | None = None) -> None:
  """Persists XLA compilations across runs (``$JAX_COMPILATION_CACHE_DIR`` wins)."""
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or path or os.path.join(
      os.path.expanduser("~"), ".cache", "jagent", "jax")
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def quiet_logs() -> None:
  """Sets absl's verbosity to WARNING unless ``-v``/``--verbosity`` was passed.

  absl's ``app.run`` raises the verbosity from WARNING to INFO when the flag
  is not given; orbax's checkpoint messages (absl logging) and jax's backend
  probes (python logging, e.g. "Unable to initialize backend 'tpu'") then
  put ~450 INFO lines a run on stderr, between the progress bars. absl's
  handler sits on the root logger, whose level this sets, so both are
  quieted; ``--verbosity=0`` (or ``-v 0``) brings them back.

  Runs once flags are parsed (``app.call_after_init``, registered when this
  module is imported): every ``experiments`` entry point (train, eval,
  sweep, compare) imports it and runs under ``app.run``.
  """
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


app.call_after_init(quiet_logs)
