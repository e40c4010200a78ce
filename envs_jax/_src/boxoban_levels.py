"""The Boxoban level files shipped with ``envs_jax``: subsets, paths, text format.

Source: DeepMind's Boxoban levels (Guez, Mirza, Gregor, Kabra et al. 2018,
"An investigation of model-free planning"; github.com/deepmind/boxoban-levels),
Apache-2.0. ``envs_jax/data/boxoban`` ships 1000 levels of each subset in
``SUBSETS``.

This module imports neither tensorflow_datasets nor the builder: the tfds
builder ``envs_jax.datasets.boxoban`` reads the files through it, and the
loader ``boxoban_data`` prepares that builder, so the imports run one way
(``boxoban_data`` -> builder -> this module).
"""

from __future__ import annotations

import importlib.resources
from typing import Iterator

import numpy as np

GRID_SIZE = 10  # Boxoban levels are 10 x 10 cells.

# Subset name -> shipped level file, relative to the ``envs_jax`` package.
SUBSET_FILES: dict[str, tuple[str, ...]] = {
    "unfiltered-test": ("data", "boxoban", "unfiltered", "test", "000.txt"),
    "medium-valid": ("data", "boxoban", "medium", "valid", "000.txt"),
    "hard": ("data", "boxoban", "hard", "000.txt"),
}
SUBSETS: tuple[str, ...] = tuple(SUBSET_FILES)


def check_subset(subset: str) -> None:
  """Raises ValueError naming ``subset`` and listing ``SUBSETS`` when unknown."""
  if subset not in SUBSET_FILES:
    raise ValueError(
        f"unknown Boxoban subset {subset!r}; valid subsets: {', '.join(SUBSETS)}"
    )


def subset_file(subset: str) -> importlib.resources.abc.Traversable:
  """Returns the shipped level file of ``subset`` (an entry of ``SUBSETS``).

  Raises:
    ValueError: naming ``subset`` and listing ``SUBSETS`` when unknown.
  """
  check_subset(subset)
  path = importlib.resources.files("envs_jax")
  for part in SUBSET_FILES[subset]:
    path = path.joinpath(part)
  return path


def parse_levels(text: str) -> Iterator[tuple[int, np.ndarray]]:
  """Parses Boxoban level text into ``(level_index, grid)`` pairs.

  Format (envs_jax/data/boxoban/README.md): a line ``"; N"``, then 10 lines of
  10 characters, then a blank line.

  Args:
    text: the whole contents of one level file.

  Yields:
    ``(N, grid)`` in file order; ``grid`` has shape=(10, 10), dtype=uint8
    (ASCII codes of the 10 rows, top row first).

  Raises:
    ValueError: on a malformed header or a grid that is not 10 rows of 10
      ASCII characters.
  """
  lines = text.splitlines()
  i = 0
  while i < len(lines):
    line = lines[i]
    if not line.strip():
      i += 1
      continue
    if not line.startswith(";"):
      raise ValueError(f"line {i + 1}: expected a '; N' level header, got {line!r}")
    index = int(line[1:].strip())
    rows = lines[i + 1:i + 1 + GRID_SIZE]
    if len(rows) != GRID_SIZE or any(len(r) != GRID_SIZE for r in rows):
      raise ValueError(f"level {index}: expected {GRID_SIZE} rows of {GRID_SIZE} chars")
    grid = np.frombuffer("".join(rows).encode("ascii"), dtype=np.uint8)
    yield index, grid.reshape(GRID_SIZE, GRID_SIZE).copy()
    i += 1 + GRID_SIZE
