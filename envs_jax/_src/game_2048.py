"""2048 in pure JAX: RAGEN-2's ``Game2048-4x4-v0``.

Ids (registered on import): ``Game2048-4x4-v0``, the 4x4 board wrapped in
:class:`~envs_jax.TimeLimit` with 700 steps (RAGEN's ``config/envs.yaml``
``max_actions_per_traj`` for ``game_2048``; RAGEN's env itself never
truncates), with RAGEN's success (the game over with a 2048 tile, out of
reach of a 10-move agent budget); ``Game2048-4x4-tile16-v0``, the same with
``target_tile=16``: making a 16 is success and ends the episode. Within 10
moves the greedy expert makes a 16 in about half the games and random valid
moves in about one in eight; 32 is almost never reachable and 64 never (10
spawns of at most 4 on two tiles of at most 4 sum to at most 48):
docs/results.md, "2048's success threshold".

Rules (RAGEN's ``ragen/env/game_2048``, the usual 2048): a move slides every
tile as far as it goes towards one side; two equal tiles that meet merge into
one of twice the value, each tile merging at most once per move, pairs taken
from the side moved to. A move that changes nothing is invalid. After a valid
move one tile spawns on a uniformly random empty cell: 2 with probability
``two_prob`` (0.9), else 4; a reset spawns two. The game ends when no move
changes the board.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax._src import checks
from envs_jax._src import environment
from envs_jax._src import registration
from envs_jax._src import wrappers

# Actions in RAGEN's (and Jumanji's) order.
UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3
ACTION_NAMES = ("Up", "Right", "Down", "Left")
MAX_STEPS = 700  # RAGEN's max_actions_per_traj for game_2048
AGENT_TARGET_TILE = 16  # Game2048-4x4-tile16-v0's target: reachable in 10 moves
_TILE_DIGITS = 6  # a 4x4 board's largest tile is 2**17 = 131072
_SCORE_DIGITS = 8  # a 4x4 game scores below 4 million


@struct.dataclass
class Game2048Params:
  """Tunable parameters of :class:`Game2048` (vmappable).

  Attributes:
    two_prob: probability that a spawned tile is 2 (else 4); RAGEN's 0.9.
    log_reward: True: a valid move earns ``0.1 * log2(m + 1)`` for merged
      value ``m > 0`` (0 without a merge), RAGEN's default
      ``use_log_reward``; False: ``m`` itself (the game's score).
    invalid_reward: the reward of a move that changes nothing (RAGEN's
      ``invalid_act_score`` -0.1). RAGEN's code applies its log transform
      after this penalty and so pays 0.0 for an invalid move under the log
      reward; ``params.replace(invalid_reward=0.0)`` reproduces that.
  """

  two_prob: jax.Array  # shape=(), dtype=float32, in [0, 1]
  log_reward: jax.Array  # shape=(), dtype=bool
  invalid_reward: jax.Array  # shape=(), dtype=float32


@struct.dataclass
class Game2048State:
  """State of :class:`Game2048`.

  Attributes:
    board: tile values (0 = empty, else 2, 4, 8, ...), row 0 at the top.
    score: sum of the merged values so far (RAGEN's ``score``).
  """

  board: jax.Array  # shape=(size, size), dtype=int32
  score: jax.Array  # shape=(), dtype=int32


def _compact_left(rows: jax.Array) -> jax.Array:
  """The non-zero entries of each row moved to its front, order kept: int32 [..., n].

  Unrolled over the static row length (elementwise selects only: no running
  sum, gather or scatter, which XLA:CPU runs several times slower).
  """
  n = rows.shape[-1]
  out = [jnp.zeros_like(rows[..., 0]) for _ in range(n)]
  before = jnp.zeros_like(rows[..., 0])  # tiles left of cell i
  for i in range(n):
    tile = rows[..., i]
    for j in range(i + 1):  # tile i lands on cell ``before``; an empty one adds 0
      out[j] = out[j] + jnp.where(before == j, tile, 0)
    before = before + (tile != 0)
  return jnp.stack(out, axis=-1)


def slide_left(rows: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Rows moved left with merges: ``(new rows, merged value per row)``.

  Tiles close up; then equal neighbours merge pairwise from the left (in a
  run of equal tiles the first two merge, then the next two, ...); the gaps
  close again. Elementwise over a static row length, so it batches freely.

  Args:
    rows: int32 [..., n] tile values (0 empty).

  Returns:
    int32 [..., n] rows and int32 [...] sums of the new merged tiles.
  """
  c = _compact_left(rows)
  equal = (c[..., :-1] == c[..., 1:]) & (c[..., :-1] != 0)  # [..., n - 1]
  starts = [equal[..., 0]]
  for i in range(1, equal.shape[-1]):  # a tile merged with its left neighbour starts none
    starts.append(equal[..., i] & ~starts[-1])
  start = jnp.stack(starts, axis=-1)
  no = jnp.zeros_like(start[..., :1])
  first = jnp.concatenate([start, no], axis=-1)  # the left tile of a merging pair
  second = jnp.concatenate([no, start], axis=-1)  # the right tile, absorbed
  merged = jnp.where(first, 2 * c, jnp.where(second, 0, c))
  return _compact_left(merged), jnp.sum(jnp.where(first, 2 * c, 0), axis=-1)


def _turns(board: jax.Array) -> tuple[jax.Array, ...]:
  """Each move as the left move of turned rows: ``board`` turned for Up, Right, Down, Left.

  Up: the columns top first; Right: the rows reversed; Down: the columns
  bottom first; Left: the rows.
  """
  return board.T, board[:, ::-1], board[::-1].T, board


def _turns_back(rows: jax.Array) -> tuple[jax.Array, ...]:
  """The inverses of :func:`_turns`, in the same order."""
  return rows.T, rows[:, ::-1], rows.T[::-1], rows


def move(board: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One move of ``board`` without the spawn.

  Only the chosen direction is slid: the board is turned (a select among its
  four static turns) so that the move is a left move, slid, and turned back.

  Args:
    board: int32 [n, n] tile values.
    action: int32 scalar in [0, 4): Up, Right, Down, Left.

  Returns:
    ``(board, merged)``: int32 [n, n] the board after the move and int32
    scalar its merged value. The move is valid (RAGEN's valid action) iff
    the board changed.
  """
  action = jnp.asarray(action, jnp.int32)
  action = jnp.clip(jnp.where(action < 0, action + 4, action), 0, 3)  # as indexing: -1 is Left
  slid, merged = slide_left(jax.lax.select_n(action, *_turns(board)))
  return jax.lax.select_n(action, *_turns_back(slid)), jnp.sum(merged)


def valid_moves(board: jax.Array) -> jax.Array:
  """bool [4]: which of Up, Right, Down, Left change ``board`` (no slide needed).

  A move changes the board iff some row, turned as that move's left move,
  has a tile right of an empty cell or two equal tiles side by side.

  Args:
    board: int32 [n, n] tile values.
  """
  rows = jnp.stack(_turns(board))
  left, right = rows[..., :-1], rows[..., 1:]
  return jnp.any(((left == 0) & (right != 0)) | ((left == right) & (left != 0)), axis=(1, 2))


def can_move(board: jax.Array) -> jax.Array:
  """bool scalar: some move changes ``board`` (an empty cell or equal neighbours).

  Args:
    board: int32 [n, n] tile values.
  """
  return (jnp.any(board == 0) | jnp.any(board[:, 1:] == board[:, :-1])
          | jnp.any(board[1:] == board[:-1]))


def move_all(board: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Every move of ``board`` without the spawn (the greedy expert's look-ahead).

  Args:
    board: int32 [n, n] tile values.

  Returns:
    ``(boards, merged, moved)``: int32 [4, n, n] the board after Up, Right,
    Down, Left; int32 [4] the merged value of each move; bool [4] whether
    the move changes the board (RAGEN's valid actions).
  """
  boards, merged = jax.vmap(move, in_axes=(None, 0))(board, jnp.arange(4))
  return boards, merged, jnp.any(boards != board[None], axis=(1, 2))


def spawn_tile(u: jax.Array, board: jax.Array, two_prob: jax.Array) -> jax.Array:
  """``board`` with a 2 (probability ``two_prob``) or a 4 on a uniform empty cell.

  The randomness comes in as uniform draws (one ``jax.random.uniform`` call
  serves every spawn of a step or reset: each call compiles its own
  threefry kernel).

  Args:
    u: float32 [n * n + 1] independent U[0, 1) draws: the first n * n pick
      the cell (the empty cell with the largest draw, uniform over the empty
      cells), the last one the value.
    board: int32 [n, n] tile values.
    two_prob: float32 scalar.

  Returns:
    int32 [n, n]; a full board unchanged.
  """
  empty = (board == 0).reshape(-1)
  draws = jnp.where(empty, u[:-1], -1.0)
  cells = jnp.arange(draws.shape[0])
  # argmax (the first largest draw) as a max and a min: XLA:CPU's argmax is slow.
  cell = jnp.min(jnp.where(draws == jnp.max(draws), cells, draws.shape[0]))
  value = jnp.where(u[-1] < two_prob, 2, 4).astype(board.dtype)
  flat = board.reshape(-1)
  return jnp.where(jnp.any(empty) & (cells == cell), value, flat).reshape(board.shape)


# ------------------------------------------------------------------ rendering
_DIGITS = tuple(str(d) for d in range(10))
_SEP = ", "
_VALID_NAMES = tuple(f"{a}({name})" for a, name in enumerate(ACTION_NAMES))
_GRID_HEAD = "Current 2048 Grid:\nRow 1: ["
_AFTER_GRID = "]\n\nValid Actions: "
_NONE = "None"
_AFTER_ACTIONS = ".\nGoal: Merge same numbers to reach {goal}.\nCurrent Score: "
RAGEN_GOAL = 2048  # RAGEN's success: the game over with a tile of at least this
_TAIL = "\nWhat is your next move?"


class Game2048(environment.Environment[Game2048State, Game2048Params]):
  """RAGEN-2's 2048 on a ``size x size`` board (default 4x4).

  Observation: int32 [size, size], the tile values (0 empty).

  Action: int32 scalar in [0, 4): Up, Right, Down, Left (traced out-of-range
  values are clipped).

  Reward: float32. A valid move: its merged value ``m`` (the sum of the new
  merged tiles), or ``0.1 * log2(m + 1)`` (0 without a merge) under
  ``params.log_reward`` (default, RAGEN's). A move that changes nothing:
  ``params.invalid_reward`` (-0.1), board unchanged, no spawn.

  Termination: after a valid move and its spawn, no move changes the board
  (RAGEN checks only after valid moves, as here); with ``target_tile`` set,
  also a valid move that makes a tile of at least ``target_tile``. No
  truncation here (see the registered id's ``TimeLimit``).

  info: ``success`` (bool; ``target_tile`` None: terminated with a tile of
  at least 2048, RAGEN's ``success``; else: a valid move left a tile of at
  least ``target_tile``, in play the move that made the first one), ``action_effective`` (bool, the move was valid),
  ``merged`` (int32, the move's merged value, RAGEN's ``raw_reward`` when
  valid).

  Text: RAGEN's ``render()`` exactly: ``Current 2048 Grid:``, ``Row i: [a, b,
  c, d]`` per row, a blank line, ``Valid Actions: 0(Up), 2(Down).`` (or
  ``None.``), the goal line (``reach 2048``, or ``reach <target_tile>``),
  ``Current Score: s`` and ``What is your next move?``.

  Raises:
    ValueError: on a bad ``size``, ``two_prob`` or ``target_tile``.
  """

  action_names = ACTION_NAMES
  # Every move's result from a board (host-side players plan with it).
  move_all = staticmethod(move_all)

  def __init__(self, size: int = 4, two_prob: float = 0.9, log_reward: bool = True,
               invalid_reward: float = -0.1, target_tile: int | None = None):
    """Builds the env.

    Args:
      size: static side length of the board (2..9).
      two_prob: default ``params.two_prob`` in [0, 1].
      log_reward: default ``params.log_reward``.
      invalid_reward: default ``params.invalid_reward``.
      target_tile: None: RAGEN's success (the game over with a 2048 tile);
        a power of two >= 8: making a tile that large is success and ends
        the episode (a short agent budget can reach it; a spawn, 2 or 4,
        never counts). Static.

    Raises:
      ValueError: naming the bad argument.
    """
    size = checks.check_int("Game2048", "size", size, 2, 9)
    if not 0.0 <= float(two_prob) <= 1.0:
      raise ValueError(f"Game2048: two_prob must be in [0, 1], got {two_prob!r}")
    if target_tile is not None and (
        not isinstance(target_tile, (int, np.integer)) or isinstance(target_tile, bool)
        or target_tile < 8 or target_tile & (target_tile - 1)):
      raise ValueError(f"Game2048: target_tile must be None or a power of two >= 8 (a "
                       f"tile only merges make), got {target_tile!r}")
    self.target_tile = None if target_tile is None else int(target_tile)
    self.size = size
    self._two_prob = float(two_prob)
    self._log_reward = bool(log_reward)
    self._invalid_reward = float(invalid_reward)
    rows = tuple(f"]\nRow {r + 1}: [" for r in range(1, size))
    self._after_actions = _AFTER_ACTIONS.format(goal=self.target_tile or RAGEN_GOAL)
    self.symbols = ((environment.PAD_SYMBOL,) + _DIGITS
                    + (_SEP, _GRID_HEAD) + rows
                    + (_AFTER_GRID,) + _VALID_NAMES + (_NONE, self._after_actions, _TAIL))
    self._id = {s: i for i, s in enumerate(self.symbols)}

  @property
  def default_params(self) -> Game2048Params:
    return Game2048Params(two_prob=jnp.asarray(self._two_prob, jnp.float32),
                          log_reward=jnp.asarray(self._log_reward, jnp.bool_),
                          invalid_reward=jnp.asarray(self._invalid_reward, jnp.float32))

  # RAGEN plays up to 800 turns (700 actions), one action a turn; configs start
  # from a short window of the game. "<answer>Right</answer>" + EOS is 4 tokens.
  agent_defaults = environment.AgentDefaults(
      max_turns=10, max_actions_per_traj=10, max_tokens_per_turn=6,
      system="You play 2048.")
  expert_think_text = "I keep the board open and merge when I can."

  @property
  def instructions(self) -> str:
    """Our rules text: the goal, the merge rule, the penalty and the actions."""
    goal = (f" You win when a tile reaches {self.target_tile}." if self.target_tile else "")
    return ("You play 2048 on a 4x4 grid. A move slides every tile to one side; two equal "
            "tiles that meet merge into their sum, which is added to your score. A move "
            "that changes nothing costs a small penalty. After each move a 2 or a 4 "
            f"appears on an empty cell.{goal}\n"
            f"{environment.actions_sentence(self.action_names)}")

  @functools.cached_property
  def _moves_batch(self):
    return jax.jit(jax.vmap(move_all))

  def expert_answers(self, states, params, *, actions_per_turn=1, **options):
    """A greedy expert's moves (host side; no 2048 solver exists).

    Each move is the valid one that leaves the most empty cells, then the
    largest merged value, ties broken in the order Down, Left, Right, Up
    (which keeps large tiles in the bottom-left corner). Later moves of one
    answer plan on the board without the spawns, which are unknown; a board
    with no valid move answers ``Up``.

    Args:
      states: unbatched :class:`Game2048State` s with numpy leaves.
      params: their params (unused).
      actions_per_turn: moves per answer.
      **options: none (this expert has no settings; any is refused).

    Returns:
      Action names joined by ``" || "``, one text per state.

    Raises:
      ValueError: any option (:meth:`expert_options`).
    """
    del params
    self.expert_options(options)
    if not states:
      return []
    boards = np.stack([np.asarray(s.board, np.int32) for s in states])
    plans = [[] for _ in states]
    done = np.zeros(len(states), bool)
    preference = np.array([3, 1, 2, 0])[None]  # tie-break rank of Up, Right, Down, Left
    for _ in range(actions_per_turn):
      after, merged, moved = map(np.asarray, self._moves_batch(boards))
      empty = np.sum(after == 0, axis=(2, 3))
      key = np.where(moved, (empty * 10_000_000 + merged) * 4 + preference, -1)
      best = np.argmax(key, axis=1)
      for i, a in enumerate(best):
        if not done[i]:
          if moved[i, a]:
            plans[i].append(int(a))
          else:
            done[i] = True
      boards = after[np.arange(len(states)), best]
    return [" || ".join(self.action_names[a] for a in (p or [UP])) for p in plans]

  # --------------------------------------------------------------- dynamics
  def reset_env(self, key, params):
    u = jax.random.uniform(key, (2, self.size ** 2 + 1))
    board = jnp.zeros((self.size, self.size), jnp.int32)
    board = spawn_tile(u[1], spawn_tile(u[0], board, params.two_prob), params.two_prob)
    state = Game2048State(board=board, score=jnp.zeros((), jnp.int32))
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    environment.check_discrete_action(self, action)
    a = jnp.clip(jnp.asarray(action, jnp.int32), 0, 3)
    slid, m = move(state.board, a)
    valid = jnp.any(slid != state.board)
    u = jax.random.uniform(key, (self.size ** 2 + 1,))
    board = jnp.where(valid, spawn_tile(u, slid, params.two_prob), state.board)
    stuck = valid & ~can_move(board)
    if self.target_tile is None:  # RAGEN's rule
      terminated = stuck
      success = stuck & (jnp.max(board) >= RAGEN_GOAL)
    else:  # only merges make the target (a spawn is 2 or 4 < 8 <= target)
      success = valid & (jnp.max(slid) >= self.target_tile)
      terminated = stuck | success
    log_r = jnp.where(m > 0, 0.1 * jnp.log2(m.astype(jnp.float32) + 1.0), 0.0)
    reward = jnp.where(valid, jnp.where(params.log_reward, log_r, m.astype(jnp.float32)),
                       params.invalid_reward).astype(jnp.float32)
    new_state = Game2048State(board=board, score=state.score + jnp.where(valid, m, 0))
    info = {"success": success, "action_effective": valid,
            "merged": jnp.where(valid, m, 0)}
    return (self.observation(new_state), new_state, reward, terminated,
            jnp.zeros((), jnp.bool_), info)

  # ------------------------------------------------------------------- text
  def observation(self, state):
    """int32 [size, size]: the tile values."""
    return state.board

  @environment.compiled_render
  def render_symbols(self, state):
    """int32 vector: RAGEN's text of the board, valid actions and score."""
    ids = self._id
    digit0 = ids["0"]
    n = self.size
    # The text before each cell: the grid head, a row's opening or ", ".
    before = np.full((n, n), ids[_SEP], np.int32)
    before[:, 0] = [ids[_GRID_HEAD]] + [ids[f"]\nRow {r + 1}: ["] for r in range(1, n)]
    # All cells in one vmapped renderer: one copy of its ops, not n * n.
    cells = jax.vmap(lambda v: environment.number_symbols(v, digit0, int_digits=_TILE_DIGITS))(
        state.board.reshape(-1))
    parts = [jnp.concatenate([jnp.asarray(before).reshape(-1, 1), cells], axis=1).reshape(-1)]
    parts.append(jnp.asarray([ids[_AFTER_GRID]], jnp.int32))
    valid = valid_moves(state.board)
    # "0(Up), 2(Down)": a separator before every valid action but the first.
    first = jnp.argmax(valid)
    for a in range(4):
      sep = jnp.where(valid[a] & (a > first), ids[_SEP], 0)
      parts.append(jnp.stack([sep, jnp.where(valid[a], ids[_VALID_NAMES[a]], 0)]))
    parts.append(jnp.where(jnp.any(valid), 0, ids[_NONE])[None])
    parts.append(jnp.asarray([ids[self._after_actions]], jnp.int32))
    parts.append(environment.number_symbols(state.score, digit0, int_digits=_SCORE_DIGITS))
    parts.append(jnp.asarray([ids[_TAIL]], jnp.int32))
    return jnp.concatenate([jnp.asarray(p, jnp.int32) for p in parts])

  def __repr__(self) -> str:
    return (f"Game2048(size={self.size}, two_prob={self._two_prob:.4g}, "
            f"log_reward={self._log_reward}, invalid_reward={self._invalid_reward:.4g}, "
            f"target_tile={self.target_tile})")


registration.register(
    "Game2048-4x4-v0", lambda **kw: wrappers.TimeLimit(Game2048(**kw), MAX_STEPS))
registration.register(
    "Game2048-4x4-tile16-v0",
    lambda **kw: wrappers.TimeLimit(Game2048(**{"target_tile": AGENT_TARGET_TILE, **kw}),
                                    MAX_STEPS))
