"""Host-side breadth-first solver for FrozenLake under deterministic moves.

Used for demonstrations (SFT on shortest solutions, as RAGEN's BFS baseline)
and for statistics of the map generator.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import numpy as np

from envs_jax._src import frozen_lake_rules as rules


def solve_frozen_lake(tiles: Any, player: Any) -> tuple[int, ...] | None:
  """Fewest-moves action sequence from ``player`` to the goal.

  Breadth-first search over positions with deterministic moves
  (``success_rate=1``): a move off the grid is a no-op (never on a shortest
  path), a move into a hole ends the episode (never taken), reaching the goal
  ends the search. Actions are tried in the order Left, Down, Right, Up, so
  ties are broken towards the lowest action id.

  Args:
    tiles: int [N, M] array-like of tile codes (``FrozenLake.FROZEN``,
      ``HOLE``, ``GOAL``), e.g. ``state.tiles`` of an unbatched state.
    player: int [2] array-like, ``(row, col)`` of the player.

  Returns:
    A tuple of action ids (0..3, ``FrozenLake.action_names`` order) whose
    length is the optimal number of moves; ``()`` when the player is already
    on the goal; ``None`` when the goal is unreachable or the player is in a
    hole.

  Raises:
    ValueError: if ``tiles`` is not 2-D, ``player`` is not a length-2 index
      inside the grid, or a tile code is unknown.
  """
  grid = np.asarray(tiles)
  pos = np.asarray(player)
  if grid.ndim != 2:
    raise ValueError(f"solve_frozen_lake: tiles must be 2-D, got shape {grid.shape}")
  if pos.shape != (2,):
    raise ValueError(f"solve_frozen_lake: player must have shape (2,), got {pos.shape}")
  rows, cols = grid.shape
  start = (int(pos[0]), int(pos[1]))
  if not (0 <= start[0] < rows and 0 <= start[1] < cols):
    raise ValueError(f"solve_frozen_lake: player {start} is outside a {grid.shape} grid")
  known = (rules.FROZEN, rules.HOLE, rules.GOAL)
  if not np.isin(grid, known).all():
    raise ValueError(
        f"solve_frozen_lake: unknown tile codes {sorted(set(np.unique(grid)) - set(known))}")

  if grid[start] == rules.GOAL:
    return ()
  if grid[start] == rules.HOLE:
    return None
  parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
  queue = collections.deque([start])
  while queue:
    r, c = queue.popleft()
    for action, (dr, dc) in enumerate(rules.DELTAS):
      nxt = (r + dr, c + dc)
      if not (0 <= nxt[0] < rows and 0 <= nxt[1] < cols) or nxt in parent:
        continue
      if grid[nxt] == rules.HOLE:
        continue
      parent[nxt] = ((r, c), action)
      if grid[nxt] == rules.GOAL:
        path = []
        node = nxt
        while parent[node] is not None:
          node, a = parent[node]
          path.append(a)
        return tuple(reversed(path))
      queue.append(nxt)
  return None


@functools.lru_cache(maxsize=4096)
def reach_model(tiles_bytes: bytes, n: int, success_rate: float, gamma: float
                ) -> tuple[np.ndarray, np.ndarray]:
  """The slippery-ice model of a map and its discounted goal-reach values.

  A move succeeds with ``success_rate`` and otherwise slides to either side
  with equal probability (gymnasium's and RAGEN's slipping); holes and the
  goal absorb. Value iteration (``gamma < 1`` contracts) gives, for each
  cell and action, the discounted probability of reaching the goal.

  Args:
    tiles_bytes: ``tiles.tobytes()`` of int8 [n, n] tile codes (hashable,
      so results are cached per map).
    n: the side of the map.
    success_rate: probability that a move goes where intended.
    gamma: the discount, in (0, 1).

  Returns:
    ``(P, Q)``: float64 [n * n, 4, n * n] transition probabilities and
    float64 [n * n, 4] action values.
  """
  tiles = np.frombuffer(tiles_bytes, np.int8).reshape(n, n)
  cells = n * n
  p = np.zeros((cells, 4, cells))
  slip = (1.0 - success_rate) / 2
  for r in range(n):
    for c in range(n):
      s = r * n + c
      for a in range(4):
        if tiles[r, c] != rules.FROZEN:  # absorbing
          p[s, a, s] = 1.0
          continue
        for move, prob in ((a, success_rate), ((a + 3) % 4, slip), ((a + 1) % 4, slip)):
          dr, dc = rules.DELTAS[move]
          rr, cc = min(max(r + dr, 0), n - 1), min(max(c + dc, 0), n - 1)
          p[s, a, rr * n + cc] += prob
  goal = (tiles.reshape(-1) == rules.GOAL).astype(np.float64)
  stop = tiles.reshape(-1) != rules.FROZEN
  v = goal
  for _ in range(1000):
    v_new = np.where(stop, goal, gamma * (p @ v).max(axis=1))
    if np.max(np.abs(v_new - v)) < 1e-12:
      break
    v = v_new
  return p, p @ v
