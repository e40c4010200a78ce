"""Host-side optimal solver of the 2x2 cube (bidirectional breadth-first search).

For tests and SFT demonstrations (``RubiksCube.expert_answers``). The cube is
solved when every face shows one colour, in any of the 24 orientations of the
whole cube, so the backward search starts from all 24 solved colourings at
once: a table of the distance to solved of every colouring within
``ceil(max_depth / 2)`` quarter turns (cached per radius), met by a forward
search of ``floor(max_depth / 2)`` turns from the cube. Every solution with
at most ``max_depth`` moves passes through a colouring in both balls, so the
shortest one found is optimal. Table sizes: 3,696 colourings for radius 3,
70,656 for radius 5 (24 x the 2,944 fixed-corner positions within 5 quarter
turns); the quarter-turn diameter of the 2x2 cube is 14.
"""

from __future__ import annotations

import functools

import numpy as np

from envs_jax._src import checks
from envs_jax._src import rubiks_cube_rules

_MOVES = rubiks_cube_rules.MOVES  # int32 [12, 24] gather indices


def _expand(states: np.ndarray) -> np.ndarray:
  """uint8 [N, 24] -> [N, 12, 24]: every action applied to every state."""
  return states[:, _MOVES]


@functools.lru_cache(maxsize=None)
def _solved_colourings() -> np.ndarray:
  """uint8 [24, 24]: the solved cube in each orientation of the whole cube.

  Whole-cube quarter rotations are U D', L R' and F B' (two opposite layers
  turned together); their closure from the solved cube has 24 elements.
  """
  rotations = [_MOVES[0][_MOVES[3]], _MOVES[4][_MOVES[7]], _MOVES[8][_MOVES[11]]]
  solved = rubiks_cube_rules.SOLVED.astype(np.uint8)
  seen = {solved.tobytes(): solved}
  frontier = list(seen.values())
  while frontier:
    nxt = []
    for s in frontier:
      for r in rotations:
        t = s[r]
        if t.tobytes() not in seen:
          seen[t.tobytes()] = t
          nxt.append(t)
    frontier = nxt
  return np.stack(list(seen.values()))


@functools.lru_cache(maxsize=4)
def distance_table(radius: int) -> dict[bytes, int]:
  """Quarter turns to solved of every colouring within ``radius`` of solved.

  Args:
    radius: the search radius (>= 0).

  Returns:
    ``{uint8[24].tobytes(): distance}`` (only the standard colour scheme,
    face ``f`` coloured ``f`` when solved).
  """
  solved = _solved_colourings()
  table = {s.tobytes(): 0 for s in solved}
  frontier = solved
  for d in range(1, radius + 1):
    children = _expand(frontier).reshape(-1, 24)
    keep = []
    for s in children:
      k = s.tobytes()
      if k not in table:
        table[k] = d
        keep.append(s)
    if not keep:
      break
    frontier = np.stack(keep)
  return table


def solve_rubiks_cube(stickers, max_depth: int = 10) -> tuple[int, ...] | None:
  """A shortest sequence of quarter turns that solves the cube.

  Args:
    stickers: int [24] or [6, 2, 2] sticker colours (``RubiksCubeState.stickers``;
      layout and colours as ``envs_jax.RubiksCube``).
    max_depth: the longest solution searched (0..14; larger takes longer:
      10 builds a 70,656-entry table once and searches at most ~47k
      colourings per cube).

  Returns:
    Action indices (``RubiksCube.action_names``) of an optimal solution,
    ``()`` for a solved cube, or None when every solution is longer than
    ``max_depth``. The same cube always gets the same solution.

  Raises:
    ValueError: a ``max_depth`` outside [0, 14], or ``stickers`` that are not
      24 colours 0..5 with four stickers of each.
  """
  max_depth = checks.check_int("solve_rubiks_cube", "max_depth", max_depth, 0, 14)
  s = np.asarray(stickers).reshape(-1)
  if s.shape != (24,) or not np.array_equal(np.bincount(s.astype(np.int64), minlength=6),
                                            np.full(6, 4)):
    raise ValueError("solve_rubiks_cube: stickers must be 24 colours 0..5, four of each, "
                     f"got {np.asarray(stickers).tolist()}")
  s = s.astype(np.uint8)
  table = distance_table((max_depth + 1) // 2)
  forward_radius = max_depth // 2
  # Forward BFS with parents; keep the meeting colouring of the shortest total.
  parents: dict[bytes, tuple[bytes, int] | None] = {s.tobytes(): None}
  layer = [s]
  best: tuple[int, np.ndarray] | None = None
  for k in range(forward_radius + 1):
    for x in layer:
      d = table.get(x.tobytes())
      if d is not None and (best is None or k + d < best[0]):
        best = (k + d, x)
    if best is not None and best[0] <= k + 1:
      break  # deeper forward layers cannot do better
    if k == forward_radius:
      break
    nxt = []
    for x in layer:
      kx = x.tobytes()
      for a, y in enumerate(x[_MOVES]):
        ky = y.tobytes()
        if ky not in parents:
          parents[ky] = (kx, a)
          nxt.append(y)
    layer = nxt
  if best is None:
    return None
  _, meet = best
  head = []
  key = meet.tobytes()
  while parents[key] is not None:
    key, a = parents[key]
    head.append(a)
  head.reverse()
  # Descend the table from the meeting colouring.
  tail = []
  x, d = meet, table[meet.tobytes()]
  while d > 0:
    for a, y in enumerate(x[_MOVES]):
      if table.get(y.tobytes()) == d - 1:
        tail.append(a)
        x, d = y, d - 1
        break
  return tuple(head + tail)
