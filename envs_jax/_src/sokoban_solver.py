"""Host-side optimal Sokoban solver: batched breadth-first search in numpy.

Finds a fewest-moves action sequence (actions 0..3 = Up, Down, Left, Right,
as :class:`~envs_jax.Sokoban`) for many levels at once. Each BFS layer is
expanded for all levels together with vectorised numpy: a state is the
player cell plus the sorted box cells, renumbered over each level's non-wall
cells, and encoded as one integer ``player * C(P, nb) + rank(boxes)``
(combinatorial number system), so duplicate detection is a bitmap lookup
(or a sorted-array search when the state space is too large for a bitmap).

RAGEN uses a BFS of the same kind (``get_shortest_action_path``) to make SFT
demonstrations; this one adds a per-level node cap and reports why a search
stopped.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from envs_jax._src import checks

WALL = 0
TARGET = 2
_DELTAS = ((-1, 0), (1, 0), (0, -1), (0, 1))  # Up, Down, Left, Right

# The default per-level node cap of a search (distinct states visited; RAGEN's
# BFS has none). A few Boxoban levels need 2-5M states.
MAX_NODES = 1_000_000

SOLVED = "solved"
UNSOLVABLE = "unsolvable"
CAPPED = "capped"

_DENSE_BUDGET = 1 << 26  # bitmap entries per chunk of levels
_KEY_LIMIT = 1 << 62


@dataclasses.dataclass(frozen=True)
class SokobanSolution:
  """Result of one search.

  Attributes:
    status: ``"solved"`` (``actions`` is optimal), ``"unsolvable"`` (every
      reachable state was searched; no solution exists) or ``"capped"`` (the
      node or depth cap stopped the search first).
    actions: the fewest-moves action sequence (ints in 0..3) when solved,
      else ``()``. ``()`` with status solved means already solved.
    nodes: distinct states visited for this level.
  """

  status: str
  actions: tuple[int, ...]
  nodes: int

  @property
  def solved(self) -> bool:
    return self.status == SOLVED

  @property
  def length(self) -> int | None:
    """Optimal number of moves, or None when not solved."""
    return len(self.actions) if self.solved else None


class _DenseVisited:
  """Visited set over keys in [0, size) as a bitmap."""

  def __init__(self, size: int):
    self.bits = np.zeros(size, np.bool_)

  def add(self, keys: np.ndarray) -> np.ndarray:
    """Marks unique ``keys``; returns bool, True where a key was new."""
    fresh = ~self.bits[keys]
    self.bits[keys[fresh]] = True
    return fresh


class _SortedVisited:
  """Visited set as a sorted int64 array (for huge state spaces)."""

  def __init__(self):
    self.keys = np.empty(0, np.int64)

  def add(self, keys: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(self.keys, keys)
    found = np.zeros(keys.shape, np.bool_)
    inside = pos < len(self.keys)
    found[inside] = self.keys[pos[inside]] == keys[inside]
    fresh = ~found
    self.keys = np.union1d(self.keys, keys[fresh])
    return fresh


def _binomials(n: int, k: int) -> np.ndarray:
  """int64 [n + 1, k + 1]: C(i, j) (0 when j > i)."""
  table = np.zeros((n + 1, k + 1), np.int64)
  for i in range(n + 1):
    for j in range(min(i, k) + 1):
      table[i, j] = math.comb(i, j)
  return table


def solve_sokoban_batch(
    fixed: np.ndarray,
    boxes: np.ndarray,
    player: np.ndarray,
    *,
    max_nodes: int = MAX_NODES,
    max_depth: int | None = None,
    dense: bool | None = None,
) -> list[SokobanSolution]:
  """Optimal (fewest moves) solutions of N levels by batched BFS.

  Moves as :class:`~envs_jax.Sokoban` (gym-sokoban): the player steps to a
  free cell or pushes one box into a free cell; off-grid cells count as wall.
  Solved = every box on a target.

  Args:
    fixed: int [N, H, W] cell codes (0 wall, 1 empty, 2 target), e.g.
      ``SokobanState.fixed`` with a batch axis.
    boxes: bool [N, H, W]; every level must have the same number of boxes.
    player: int [N, 2] ``(row, col)``.
    max_nodes: per-level cap on distinct states visited (>= 1).
    max_depth: optional cap on the solution length in moves.
    dense: force the bitmap (True) or sorted-array (False) visited set; None
      picks the bitmap when a level's state space has at most 2**26 states.

  Returns:
    One :class:`SokobanSolution` per level, in order.

  Raises:
    ValueError: on inconsistent shapes, differing box counts, a player or box
      on a wall, a bad cap, or a state space too large to encode in int64.
  """
  fixed = np.asarray(fixed)
  boxes = np.asarray(boxes, np.bool_)
  player = np.asarray(player, np.int64)
  if fixed.ndim != 3 or boxes.shape != fixed.shape or player.shape != (fixed.shape[0], 2):
    raise ValueError(
        "solve_sokoban_batch: need fixed [N, H, W], boxes [N, H, W], player "
        f"[N, 2]; got {fixed.shape}, {boxes.shape}, {player.shape}")
  max_nodes = checks.check_int("solve_sokoban_batch", "max_nodes", max_nodes, 1)
  if max_depth is not None:
    max_depth = checks.check_int("solve_sokoban_batch", "max_depth", max_depth, 0)
  n, h, w = fixed.shape
  if n == 0:
    return []
  counts = boxes.sum(axis=(1, 2))
  if np.any(counts != counts[0]):
    raise ValueError(
        "solve_sokoban_batch: every level needs the same number of boxes, got "
        f"{sorted(set(counts.tolist()))}")
  nb = int(counts[0])
  open_ = fixed.reshape(n, -1) != WALL
  if np.any(boxes.reshape(n, -1) & ~open_):
    raise ValueError(
        f"solve_sokoban_batch: level {int(np.argmax(np.any(boxes.reshape(n, -1) & ~open_, 1)))} "
        "has a box on a wall")
  pflat = player[:, 0] * w + player[:, 1]
  inside = (player[:, 0] >= 0) & (player[:, 0] < h) & (player[:, 1] >= 0) & (player[:, 1] < w)
  ok = inside & open_[np.arange(n), np.clip(pflat, 0, h * w - 1)]
  if not np.all(ok):
    raise ValueError(
        f"solve_sokoban_batch: level {int(np.argmax(~ok))} has its player off "
        "the grid or on a wall")

  # Compact numbering of each level's non-wall cells.
  num_open = open_.sum(axis=1)
  p_eff = int(num_open.max())
  compact = np.where(open_, np.cumsum(open_, axis=1) - 1, -1)  # [N, HW]
  order = np.argsort(~open_, axis=1, kind="stable")[:, :p_eff]  # flat cell of compact i
  valid_cell = np.arange(p_eff)[None, :] < num_open[:, None]
  rr, cc = order // w, order % w
  nxt = np.full((n, p_eff, 4), -1, np.int64)
  for a, (dr, dc) in enumerate(_DELTAS):
    r2, c2 = rr + dr, cc + dc
    ins = (r2 >= 0) & (r2 < h) & (c2 >= 0) & (c2 < w) & valid_cell
    flat2 = np.clip(r2, 0, h - 1) * w + np.clip(c2, 0, w - 1)
    nb_idx = np.take_along_axis(compact, flat2, axis=1)
    nxt[:, :, a] = np.where(ins, nb_idx, -1)
  is_target = np.take_along_axis(fixed.reshape(n, -1) == TARGET, order, axis=1) & valid_cell
  player_c = compact[np.arange(n), pflat]
  box_flat = np.sort(np.argsort(~boxes.reshape(n, -1), axis=1, kind="stable")[:, :nb], axis=1)
  boxes_c = np.take_along_axis(compact, box_flat, axis=1)  # sorted (compact is monotone)

  binom = _binomials(p_eff, nb)
  ranks = int(math.comb(p_eff, nb))
  space = p_eff * ranks
  if space >= _KEY_LIMIT:
    raise ValueError(
        f"solve_sokoban_batch: {space} states per level do not fit int64 keys")
  if dense is None:
    dense = space <= _DENSE_BUDGET
  if dense:
    chunk = max(1, _DENSE_BUDGET // space)
  else:
    chunk = max(1, _KEY_LIMIT // space)
  results: list[SokobanSolution] = []
  for start in range(0, n, chunk):
    sl = slice(start, min(n, start + chunk))
    results.extend(_bfs(nxt[sl], is_target[sl], player_c[sl], boxes_c[sl],
                        binom, ranks, space, max_nodes, max_depth, dense))
  return results


def _bfs(nxt, is_target, player, boxes, binom, ranks, space, max_nodes,
         max_depth, dense):
  """BFS for one chunk of levels (compact cell numbering)."""
  n, _, _ = nxt.shape
  nb = boxes.shape[1]
  cols = np.arange(1, nb + 1)

  def encode(lvl, p, b):
    return lvl * space + p * ranks + binom[b, cols].sum(axis=1)

  visited = _DenseVisited(n * space) if dense else _SortedVisited()
  lvl = np.arange(n, dtype=np.int64)
  visited.add(encode(lvl, player, boxes))
  nodes = np.ones(n, np.int64)
  status = np.full(n, "", object)
  goal = {}  # level -> (depth, index in that layer)
  layers = []  # per depth >= 1: (parent index into previous layer, action)

  def solved_mask(lv, b):
    return np.all(is_target[lv[:, None], b], axis=1)

  done0 = solved_mask(lvl, boxes)
  for i in np.nonzero(done0)[0]:
    status[i] = SOLVED
    goal[i] = (0, 0)
  keep = ~done0
  f_lvl, f_p, f_b, f_idx = lvl[keep], player[keep], boxes[keep], np.nonzero(keep)[0]
  depth = 0
  while len(f_lvl) and (max_depth is None or depth < max_depth):
    depth += 1
    m = len(f_lvl)
    src = np.repeat(np.arange(m), 4)
    act = np.tile(np.arange(4), m)
    c_lvl, c_p, c_b = f_lvl[src], f_p[src], f_b[src]
    one = nxt[c_lvl, c_p, act]
    ok = one >= 0
    one_s = np.where(ok, one, 0)
    hit = c_b == one_s[:, None]  # [4m, nb]
    push = ok & hit.any(axis=1)
    two = np.where(push, nxt[c_lvl, one_s, act], -1)
    two_free = (two >= 0) & ~np.any(c_b == two[:, None], axis=1)
    ok &= ~push | two_free
    new_b = np.where(hit & push[:, None], two[:, None], c_b)
    sel = np.nonzero(ok)[0]
    c_lvl, c_p, c_b, src, act = c_lvl[sel], one[sel], np.sort(new_b[sel], axis=1), src[sel], act[sel]
    keys = encode(c_lvl, c_p, c_b)
    uniq, first = np.unique(keys, return_index=True)
    fresh = visited.add(uniq)
    take = np.sort(first[fresh])
    c_lvl, c_p, c_b, src, act = c_lvl[take], c_p[take], c_b[take], src[take], act[take]
    layers.append((f_idx[src], act))
    nodes += np.bincount(c_lvl, minlength=n)
    # Goals first: a level solved in this layer counts as solved.
    hit_goal = solved_mask(c_lvl, c_b)
    g_lvl, g_first = np.unique(c_lvl[hit_goal], return_index=True)
    g_idx = np.nonzero(hit_goal)[0][g_first]
    for lv_i, idx in zip(g_lvl.tolist(), g_idx.tolist()):
      status[lv_i] = SOLVED
      goal[lv_i] = (depth, idx)
    over = (nodes > max_nodes) & (status == "")
    status[over] = CAPPED
    alive = status[c_lvl] == ""
    f_idx = np.nonzero(alive)[0]
    f_lvl, f_p, f_b = c_lvl[alive], c_p[alive], c_b[alive]
  # Unresolved with an empty frontier: exhausted. Otherwise a cap stopped it.
  pending = np.bincount(f_lvl, minlength=n) > 0
  open_end = status == ""
  status[open_end & ~pending] = UNSOLVABLE
  status[open_end & pending] = CAPPED
  out = []
  for i in range(n):
    actions: tuple[int, ...] = ()
    if status[i] == SOLVED:
      d, idx = goal[i]
      seq = []
      for k in range(d, 0, -1):
        parent, act = layers[k - 1]
        seq.append(int(act[idx]))
        idx = parent[idx]
      actions = tuple(reversed(seq))
    out.append(SokobanSolution(status=str(status[i]), actions=actions,
                               nodes=int(nodes[i])))
  return out


def solve_sokoban(fixed, boxes, player, **kwargs) -> SokobanSolution:
  """Optimal solution of one level; see :func:`solve_sokoban_batch`.

  Args:
    fixed: int [H, W] cell codes. boxes: bool [H, W]. player: int [2].
    **kwargs: ``max_nodes``, ``max_depth``, ``dense``.

  Returns:
    A :class:`SokobanSolution`.

  Examples:
    >>> import numpy as np
    >>> fixed = np.asarray([[0, 0, 0, 0, 0],
    ...                     [0, 1, 1, 1, 0],
    ...                     [0, 1, 1, 2, 0],
    ...                     [0, 0, 0, 0, 0]])   # 0 wall, 1 floor, 2 target
    >>> boxes = np.zeros((4, 5), bool); boxes[2, 2] = True
    >>> sol = solve_sokoban(fixed, boxes, np.asarray([2, 1]))
    >>> sol.status, sol.actions   # one push Right
    ('solved', (3,))
  """
  return solve_sokoban_batch(np.asarray(fixed)[None], np.asarray(boxes)[None],
                             np.asarray(player)[None], **kwargs)[0]


def apply_move(fixed: np.ndarray, boxes: np.ndarray, player: np.ndarray,
               action: int) -> tuple[np.ndarray, np.ndarray]:
  """One move on the host with :class:`~envs_jax.Sokoban`'s rules.

  The player steps to a free cell or pushes one box into a free cell;
  anything else (a wall, off the grid, two boxes in a row) leaves the state
  as it is.

  Args:
    fixed: int [H, W] cell codes. boxes: bool [H, W]. player: int [2].
    action: 0..3 (Up, Down, Left, Right).

  Returns:
    ``(boxes, player)`` after the move (new arrays).

  Raises:
    ValueError: an action outside 0..3.
  """
  if isinstance(action, bool) or action not in range(4):
    raise ValueError(f"apply_move: action must be 0..3 (Up, Down, Left, Right), got {action!r}")
  h, w = fixed.shape
  dr, dc = _DELTAS[action]
  boxes, player = np.array(boxes, np.bool_), np.array(player, np.int64)

  def free(r, c):
    return 0 <= r < h and 0 <= c < w and fixed[r, c] != WALL and not boxes[r, c]

  r, c = int(player[0]) + dr, int(player[1]) + dc
  if 0 <= r < h and 0 <= c < w and boxes[r, c] and free(r + dr, c + dc):
    boxes[r, c], boxes[r + dr, c + dc] = False, True
  elif not free(r, c):
    return boxes, player
  player[:] = (r, c)
  return boxes, player


class PlanCache:
  """Fewest-moves plans by state, stored for every state along each plan found.

  A suffix of a shortest plan is a shortest plan from the state it starts in,
  so an expert that follows its own plan needs one search per episode instead
  of one per turn (a 10x10 Boxoban level takes up to ~5M BFS states a search
  and ~30 moves). A plan read from the cache may break ties between equally
  short plans differently from a fresh search. Searches that found no plan are
  cached per ``max_nodes``. Host-side and not thread-safe.

  Args:
    max_states: entries kept before the cache is cleared (bounds memory).

  Raises:
    ValueError: ``max_states`` not an int >= 1.
  """

  def __init__(self, max_states: int = 1_000_000):
    self.max_states = checks.check_int("PlanCache", "max_states", max_states, 1)
    self._plans: dict[bytes, tuple[int, ...]] = {}
    self._failed: dict[tuple[bytes, int], SokobanSolution] = {}

  @staticmethod
  def _key(fixed, boxes, player) -> bytes:
    return (np.asarray(fixed.shape, np.int64).tobytes() + np.asarray(fixed, np.int8).tobytes()
            + np.asarray(boxes, np.bool_).tobytes() + np.asarray(player, np.int64).tobytes())

  def solve(self, fixed: np.ndarray, boxes: np.ndarray, player: np.ndarray, *,
            max_nodes: int = MAX_NODES) -> list[SokobanSolution]:
    """:func:`solve_sokoban_batch` of the levels the cache cannot answer.

    Args and errors as :func:`solve_sokoban_batch` (``fixed`` [N, H, W],
    ``boxes`` [N, H, W], ``player`` [N, 2]); a cached answer reports
    ``nodes=0``.

    Returns:
      One :class:`SokobanSolution` per level, in order.
    """
    fixed, boxes, player = np.asarray(fixed), np.asarray(boxes, np.bool_), np.asarray(player)
    if len(self._plans) + len(self._failed) > self.max_states:
      self._plans.clear()
      self._failed.clear()
    keys = [self._key(f, b, p) for f, b, p in zip(fixed, boxes, player)]
    miss = [i for i, k in enumerate(keys)
            if k not in self._plans and (k, max_nodes) not in self._failed]
    if miss:
      for i, sol in zip(miss, solve_sokoban_batch(fixed[miss], boxes[miss], player[miss],
                                                  max_nodes=max_nodes)):
        if not sol.solved:
          self._failed[(keys[i], max_nodes)] = sol
          continue
        b, p = boxes[i], player[i]
        for t in range(len(sol.actions)):
          self._plans[self._key(fixed[i], b, p)] = sol.actions[t:]
          b, p = apply_move(fixed[i], b, p, sol.actions[t])
        self._plans[self._key(fixed[i], b, p)] = ()
    return [SokobanSolution(SOLVED, self._plans[k], 0) if k in self._plans
            else self._failed[(k, max_nodes)] for k in keys]
