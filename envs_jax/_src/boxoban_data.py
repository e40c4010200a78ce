"""Boxoban levels as uint8 ASCII grids, stored and read through tfds array_record.

The shipped level files and their format are in ``boxoban_levels``; the tfds
builder ``envs_jax.datasets.boxoban`` turns them into array_record files, and
:func:`load_levels` prepares that builder and reads the files back without
TensorFlow. Imports run one way: this module -> the builder ->
``boxoban_levels`` (the builder never imports this module).

On-disk layout: ``<data_dir>/boxoban/<subset>/<version>/`` (tfds convention).
Safety:
- Interruption: tfds prepares into ``<subset>/incomplete.XXXXXX_<version>/`` and
  renames it to ``<version>/`` only when complete, so a killed preparation never
  leaves a readable-but-partial dataset. Stale ``incomplete.*`` folders are
  deleted by the next :func:`load_levels` that prepares the subset.
- Concurrency: preparation holds an exclusive ``fcntl.flock`` on
  ``<data_dir>/boxoban/.<subset>.lock``; a second process waits, then reuses
  the prepared files. (POSIX only; the lock is advisory and only taken here.)

``tensorflow_datasets`` and the builder are imported lazily, so
``import envs_jax`` stays cheap.
"""

from __future__ import annotations

import fcntl
import os
import shutil

import numpy as np

from envs_jax._src import boxoban_levels
from envs_jax._src.boxoban_levels import SUBSETS  # noqa: F401  (envs_jax.BOXOBAN_SUBSETS)

DATA_DIR_ENV = "JAGENT_DATA_DIR"
_DEFAULT_DATA_DIR = os.path.join("~", ".cache", "jagent", "tensorflow_datasets")

# (subset, absolute data_dir) -> read-only uint8 [N, 10, 10].
_CACHE: dict[tuple[str, str], np.ndarray] = {}


def default_data_dir() -> str:
  """``$JAGENT_DATA_DIR`` if set, else ``~/.cache/jagent/tensorflow_datasets``."""
  return os.environ.get(DATA_DIR_ENV) or os.path.expanduser(_DEFAULT_DATA_DIR)


def _is_prepared(builder) -> bool:
  # tfds' is_prepared() logs a warning for a missing folder; skip that case.
  return builder.data_path.exists() and builder.is_prepared()


def _prepared_builder(subset: str, data_dir: str):
  """Returns a tfds builder for ``subset`` whose array_record files exist."""
  from envs_jax.datasets.boxoban import boxoban_dataset_builder  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  builder_cls = boxoban_dataset_builder.Builder
  builder = builder_cls(config=subset, data_dir=data_dir)
  if _is_prepared(builder):
    # Built anew: a builder made while another process was still preparing the
    # files holds the code's default info (file format TFRECORD), not theirs.
    return builder_cls(config=subset, data_dir=data_dir)
  lock_dir = os.path.join(data_dir, builder_cls.name)
  os.makedirs(lock_dir, exist_ok=True)
  with open(os.path.join(lock_dir, f".{subset}.lock"), "w") as lock_file:
    fcntl.flock(lock_file, fcntl.LOCK_EX)  # Released when the file closes.
    # Another process may have prepared it while we waited.
    builder = builder_cls(config=subset, data_dir=data_dir)
    if _is_prepared(builder):
      return builder
    # We hold the lock, so any incomplete.* folder is left by a killed run.
    variant_parent = os.path.dirname(os.fspath(builder.data_path))
    if os.path.isdir(variant_parent):
      for name in os.listdir(variant_parent):
        if name.startswith("incomplete."):
          shutil.rmtree(os.path.join(variant_parent, name), ignore_errors=True)
    mode = tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS
    if os.path.exists(builder.data_path):  # Exists but invalid: rebuild it.
      mode = tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS
    builder.download_and_prepare(
        file_format="array_record",
        download_config=tfds.download.DownloadConfig(download_mode=mode),
    )
  return builder


def load_levels(subset: str, data_dir: str | None = None) -> np.ndarray:
  """Loads the shipped Boxoban levels of ``subset`` as ASCII grids.

  Prepares the tfds dataset ``boxoban/<subset>`` (array_record) on first use
  from the files shipped in ``envs_jax/data/boxoban`` (never downloads), then
  reads it with ``builder.as_data_source()`` (no TensorFlow). Results are cached
  per process, keyed by ``(subset, data_dir)``.

  Args:
    subset: one of ``SUBSETS``: "unfiltered-test", "medium-valid", "hard".
    data_dir: tfds data directory; default ``$JAGENT_DATA_DIR`` if set, else
      ``~/.cache/jagent/tensorflow_datasets``.

  Returns:
    shape=[N, 10, 10], dtype=uint8, read-only: ASCII codes of each level's rows
    ('#' wall, '@' player, '$' box, '.' goal, ' ' floor), in file order (level
    0 first). N = 1000 for every shipped subset.

  Raises:
    ValueError: naming ``subset`` and listing ``SUBSETS`` when unknown, or when
      the stored level indices are not 0..N-1.
  """
  boxoban_levels.check_subset(subset)
  data_dir = os.path.abspath(os.path.expanduser(data_dir or default_data_dir()))
  key = (subset, data_dir)
  if key in _CACHE:
    return _CACHE[key]
  builder = _prepared_builder(subset, data_dir)
  source = builder.as_data_source(split="test")
  examples = source.__getitems__(range(len(source)))
  index = np.asarray([int(ex["level_index"]) for ex in examples])
  if not np.array_equal(np.sort(index), np.arange(len(examples))):
    raise ValueError(
        f"Boxoban subset {subset!r} at {builder.data_dir}: level indices are not "
        f"0..{len(examples) - 1}; delete that folder to rebuild it"
    )
  grid = boxoban_levels.GRID_SIZE
  levels = np.zeros((len(examples), grid, grid), np.uint8)
  levels[index] = np.stack([np.asarray(ex["grid"], np.uint8) for ex in examples])
  levels.setflags(write=False)
  _CACHE[key] = levels
  return levels
