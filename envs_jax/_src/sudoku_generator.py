"""In-JAX Sudoku generator: puzzles with a unique solution and an exact number of givens.

1. A solved grid: a base pattern relabelled by a random digit permutation,
   with rows permuted within bands and bands permuted, columns within stacks
   and stacks permuted, and a transpose with probability 1/2 (all of these
   keep a grid valid). A 9x9 grid is uniform over the one orbit of the base
   (about 1.2e12 grids); a 4x4 grid starts from one of the two 4x4 orbits'
   bases, weighted by their sizes (192 and 96), so it is uniform over all 288
   4x4 grids.
2. Cells are visited in a random order and each is emptied when the puzzle
   stays solvable by singles alone (naked singles: a cell with one candidate
   left; hidden singles: a digit with one possible cell in a row, column or
   box), until ``num_empty`` cells are empty. Singles are forced moves, so
   a puzzle they solve has exactly one solution; the check is a bounded
   fixed-point loop (each round fills at least one cell). It is a sufficient
   test only: a removal it cannot prove safe is skipped, so every puzzle is
   unique and also solvable without guessing.

RAGEN's generator (``ragen/env/sudoku/utils.py``) empties a random 40% (easy)
or 50% (medium) of the cells without checking uniqueness; here the same
counts are reached with uniqueness kept.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


def _base_grids(n: int) -> np.ndarray:
  """int32 [k, n, n] base solutions, one per orbit used (see the module docstring)."""
  b = math.isqrt(n)
  r, c = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
  pattern = (b * (r % b) + r // b + c) % n + 1
  if n != 4:
    return pattern[None].astype(np.int32)
  other = np.array([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]])
  return np.stack([pattern, other]).astype(np.int32)


def _unit_index(n: int) -> np.ndarray:
  """int32 [3, n * n]: the row, column and box of each cell (row-major)."""
  b = math.isqrt(n)
  r, c = np.divmod(np.arange(n * n), n)
  return np.stack([r, c, (r // b) * b + c // b]).astype(np.int32)


def random_solution(key: jax.Array, n: int) -> jax.Array:
  """A random solved grid (step 1 of the module docstring).

  Args:
    key: a PRNG key; the grid is a deterministic function of it.
    n: static side, 4 or 9.

  Returns:
    int32 [n, n] with values 1..n.
  """
  b = math.isqrt(n)
  k_base, k_digits, k_rows, k_bands, k_cols, k_stacks, k_t = jax.random.split(key, 7)
  bases = jnp.asarray(_base_grids(n))
  # The 4x4 orbits hold 192 and 96 grids: base 0 with probability 2/3.
  which = jnp.where(jax.random.uniform(k_base) < 2 / 3, 0, 1) if n == 4 else 0
  digits = jax.random.permutation(k_digits, n) + 1

  def lines(k_in, k_out):
    within = jax.vmap(lambda k: jax.random.permutation(k, b))(jax.random.split(k_in, b))
    outer = jax.random.permutation(k_out, b)
    return (outer[:, None] * b + within).reshape(-1)

  grid = digits[bases[which] - 1][lines(k_rows, k_bands)][:, lines(k_cols, k_stacks)]
  return jnp.where(jax.random.bernoulli(k_t), grid.T, grid)


def singles_solve(known: jax.Array, solution: jax.Array) -> jax.Array:
  """Whether singles alone fill every unknown cell of a puzzle with that solution.

  Every single is forced, so a puzzle consistent with ``solution`` gets the
  solution's value wherever a single applies: the state is only the known
  mask.

  Args:
    known: bool [n * n], the givens (row-major).
    solution: int32 [n * n], a solution of the puzzle (1..n).

  Returns:
    bool scalar: True when the fixed point knows every cell (then the
    puzzle's only solution is ``solution``).
  """
  nn = known.shape[0]
  n = math.isqrt(nn)
  units = jnp.asarray(_unit_index(n))
  digit = jax.nn.one_hot(solution - 1, n, dtype=jnp.bool_)  # [nn, n]

  def has(known, u):  # [n units, n digits]: the digits present in each unit
    present = (digit & known[:, None]).astype(jnp.int32)
    return jax.ops.segment_max(present, units[u], num_segments=n) > 0

  def round_(carry):
    known, _ = carry
    blocked = has(known, 0)[units[0]] | has(known, 1)[units[1]] | has(known, 2)[units[2]]
    cand = ~blocked & ~known[:, None]  # [nn, n]
    found = jnp.sum(cand, -1) == 1  # naked singles
    for u in range(3):  # hidden singles
      count = jax.ops.segment_sum(cand.astype(jnp.int32), units[u], num_segments=n)
      found |= jnp.any(cand & (count[units[u]] == 1), -1)
    new = known | found
    return new, jnp.any(new != known)

  known, _ = jax.lax.while_loop(lambda c: c[1] & ~jnp.all(c[0]), round_,
                                (known, jnp.bool_(True)))
  return jnp.all(known)


def generate_puzzle(key: jax.Array, n: int, num_empty: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A puzzle with a unique solution and ``num_empty`` empty cells (module docstring).

  Args:
    key: a PRNG key; the puzzle is a deterministic function of it.
    n: static side, 4 or 9.
    num_empty: int32 scalar, cells to empty (clipped to ``[0, n * n]``).

  Returns:
    ``(puzzle, solution, exact)``: int32 [n, n] givens (0 empty), int32 [n, n]
    the solution, and a bool scalar that is False when the visit ended with
    fewer empty cells than asked (every further removal left a puzzle that
    singles do not solve; not seen for the registered counts, see
    tests/envs_jax/sudoku_test.py).
  """
  nn = n * n
  k_grid, k_order = jax.random.split(key)
  solution = random_solution(k_grid, n).reshape(-1)
  order = jax.random.permutation(k_order, nn)
  target = jnp.clip(num_empty, 0, nn)

  def body(carry):
    i, known, empty = carry
    trial = known.at[order[i]].set(False)
    take = singles_solve(trial, solution)
    return i + 1, jnp.where(take, trial, known), empty + take.astype(jnp.int32)

  _, known, empty = jax.lax.while_loop(
      lambda c: (c[0] < nn) & (c[2] < target), body,
      (jnp.int32(0), jnp.ones((nn,), jnp.bool_), jnp.int32(0)))
  puzzle = jnp.where(known, solution, 0)
  return puzzle.reshape(n, n), solution.reshape(n, n), empty == target
