"""Host-side Sudoku solver: solutions by backtracking over candidate bitmasks.

For tests (uniqueness of generated puzzles) and SFT demonstrations
(``Sudoku.expert_answers``). Plain Python: depth-first search that fills the
empty cell with the fewest candidates first (a 9x9 puzzle with 41 or more
givens takes about a millisecond).
"""

from __future__ import annotations

import math

import numpy as np


def _check(grid) -> np.ndarray:
  g = np.asarray(grid)
  n = g.shape[0] if g.ndim == 2 else 0
  b = math.isqrt(n)
  if g.ndim != 2 or g.shape != (n, n) or b * b != n or n < 1:
    raise ValueError(f"sudoku: grid must be [n, n] with n a square (4, 9), got shape {g.shape}")
  if g.min() < 0 or g.max() > n:
    raise ValueError(f"sudoku: values must be 0 (empty) .. {n}, got {g.min()} .. {g.max()}")
  return g.astype(np.int64)


def solve_sudoku(grid, limit: int = 1) -> list[np.ndarray]:
  """Up to ``limit`` solutions of a puzzle.

  Args:
    grid: int [n, n], 0 for an empty cell, else 1..n (n = 4 or 9, any square).
    limit: stop after this many solutions (>= 1); 2 decides uniqueness.

  Returns:
    int64 [n, n] solved grids, in search order; empty when the givens
    conflict or no completion exists.

  Raises:
    ValueError: a grid that is not square with a square side, or a value
      outside ``[0, n]``.
  """
  g = _check(grid).copy()
  n = g.shape[0]
  b = math.isqrt(n)
  full = (1 << n) - 1
  rows, cols, boxes = [0] * n, [0] * n, [0] * n
  empty = []
  for r in range(n):
    for c in range(n):
      v = int(g[r, c])
      if not v:
        empty.append((r, c))
        continue
      bit, k = 1 << (v - 1), (r // b) * b + c // b
      if (rows[r] | cols[c] | boxes[k]) & bit:
        return []  # the givens conflict
      rows[r] |= bit
      cols[c] |= bit
      boxes[k] |= bit
  out: list[np.ndarray] = []

  def search(left: list[tuple[int, int]]) -> None:
    if not left:
      out.append(g.copy())
      return
    best, best_free, best_count = 0, 0, n + 1
    for i, (r, c) in enumerate(left):  # the most constrained cell
      free = full & ~(rows[r] | cols[c] | boxes[(r // b) * b + c // b])
      count = bin(free).count("1")
      if count < best_count:
        best, best_free, best_count = i, free, count
        if count <= 1:
          break
    r, c = left[best]
    k = (r // b) * b + c // b
    rest = left[:best] + left[best + 1:]
    while best_free and len(out) < limit:
      bit = best_free & -best_free
      best_free ^= bit
      rows[r] |= bit
      cols[c] |= bit
      boxes[k] |= bit
      g[r, c] = bit.bit_length()
      search(rest)
      rows[r] ^= bit
      cols[c] ^= bit
      boxes[k] ^= bit
    g[r, c] = 0

  if limit < 1:
    raise ValueError(f"solve_sudoku: limit must be >= 1, got {limit!r}")
  search(empty)
  return out


def count_solutions(grid, limit: int = 2) -> int:
  """The number of solutions of a puzzle, counted up to ``limit``.

  Args:
    grid: as :func:`solve_sudoku`.
    limit: the count stops here (2: 0 none, 1 unique, 2 several).

  Returns:
    ``min(#solutions, limit)``.
  """
  return len(solve_sudoku(grid, limit))


def is_valid_placement(grid, row: int, col: int, num: int) -> bool:
  """RAGEN's rule: ``num`` is in none of the row, column and box of (row, col).

  Args:
    grid: int [n, n] current values (0 empty).
    row: zero-indexed row.
    col: zero-indexed column.
    num: 1..n.
  """
  g = np.asarray(grid)
  b = math.isqrt(g.shape[0])
  r0, c0 = row // b * b, col // b * b
  return not (num in g[row] or num in g[:, col] or num in g[r0:r0 + b, c0:c0 + b])
