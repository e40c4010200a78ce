"""FrozenLake in pure JAX: RAGEN's random 4x4 lakes, slippery or deterministic.

Ids (registered on import, each wrapped in :class:`~envs_jax.TimeLimit` with
100 steps, gymnasium's ``FrozenLake-v1`` 4x4 episode limit; RAGEN itself sets
no env step limit for FrozenLake, only the agent budget
``max_actions_per_traj=10``, which the agent layer applies as its own
``TimeLimit``):

* ``FrozenLake-4x4-v0``: slippery as RAGEN v1 / gymnasium (intended move with
  probability 1/3, each perpendicular move 1/3, never backwards).
* ``FrozenLake-4x4-det-v0``: deterministic moves (RAGEN-2's main table).

RAGEN-2's ``success_rate=0.8`` is ``params.replace(success_rate=0.8)``.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax._src import checks
from envs_jax._src import environment
from envs_jax._src import frozen_lake_solver
from envs_jax._src import registration
from envs_jax._src import wrappers
# Tile codes and moves (their home is the rules module, which the solver shares).
from envs_jax._src.frozen_lake_rules import DELTAS
from envs_jax._src.frozen_lake_rules import FROZEN
from envs_jax._src.frozen_lake_rules import GOAL
from envs_jax._src.frozen_lake_rules import HOLE

# The expert's answer policies (expert_answers' frozen_lake_policy).
_EXPERT_POLICIES = ("shortest", "max_success")

# Observation codes (RAGEN's grid lookup), and the symbol of each (id = code+1).
_OBS_TEXT = ("P", "_", "O", "G", "X", "√")
_OBS_PLAYER, _OBS_FROZEN, _OBS_HOLE, _OBS_GOAL = 0, 1, 2, 3
_OBS_PLAYER_IN_HOLE, _OBS_PLAYER_ON_GOAL = 4, 5

# RAGEN v1 "FrozenLake" episode limit: none in RAGEN; gymnasium 4x4 uses 100.
MAX_STEPS = 100
# RAGEN's FrozenLakeEnvConfig.p, the chance that a generated tile is frozen:
# 0.8 in RAGEN v1, 0.9 since RAGEN commit b45d28c (2025-11-13, "Extensive
# updates (#140)"), which RAGEN-2's config/envs.yaml FrozenLake and
# CoordFrozenLake tags run with (neither overrides p).
FROZEN_PROB = 0.8
RAGEN2_FROZEN_PROB = 0.9


@struct.dataclass
class FrozenLakeParams:
  """Tunable parameters of :class:`FrozenLake` (vmappable).

  Attributes:
    success_rate: probability that the intended move happens; the remainder
      is split equally between the two perpendicular moves (never backwards),
      as gymnasium's ``FrozenLake(success_rate=...)``. 1/3 = RAGEN v1 slippery,
      1.0 = deterministic, 0.8 = RAGEN-2.
    frozen_prob: probability that a generated tile is frozen (else a hole);
      RAGEN v1's ``p=0.8`` (``FROZEN_PROB``; RAGEN-2's is 0.9,
      ``RAGEN2_FROZEN_PROB``). Start and goal tiles are never holes.
  """

  success_rate: jax.Array  # shape=(), dtype=float32, in [0, 1]
  frozen_prob: jax.Array  # shape=(), dtype=float32, in [0, 1]


@struct.dataclass
class FrozenLakeState:
  """State of :class:`FrozenLake`.

  Attributes:
    tiles: the lake; ``FROZEN`` (0), ``HOLE`` (1) or ``GOAL`` (2) per tile.
      The start tile is frozen (RAGEN renders it as ``_`` once left).
    player: ``(row, col)`` of the player, row 0 at the top.
  """

  tiles: jax.Array  # shape=(size, size), dtype=int8
  player: jax.Array  # shape=(2,), dtype=int32


def flood_fill(passable: jax.Array, start: jax.Array) -> jax.Array:
  """Tiles reachable from ``start`` through 4-connected ``passable`` tiles.

  A fixed ``size * size`` iterations of one-step dilation (enough for any
  simple path on the grid), so it is bounded, jittable and vmappable.

  Args:
    passable: bool [N, N], tiles that can be stepped on.
    start: int32 [2], ``(row, col)``; counts as reachable even if not passable.

  Returns:
    bool [N, N], True where reachable.
  """
  n = passable.shape[0]
  reach = jnp.zeros_like(passable).at[start[0], start[1]].set(True)

  def body(_, r):
    p = jnp.pad(r, 1)
    grown = (r | p[:-2, 1:-1] | p[2:, 1:-1] | p[1:-1, :-2] | p[1:-1, 2:])
    return r | (grown & passable)

  return jax.lax.fori_loop(0, n * n, body, reach)


class FrozenLake(environment.Environment[FrozenLakeState, FrozenLakeParams]):
  """RAGEN's FrozenLake on random ``size x size`` lakes (default 4x4).

  Map generation (RAGEN ``generate_random_map``): each tile is frozen with
  probability ``params.frozen_prob`` (0.8, RAGEN v1's ``p``), else a hole; start and goal are
  uniform over distinct tiles (not gymnasium's corners) and are never holes;
  a map is rejected until a hole-free 4-connected path joins start and goal.
  Here the rejection loop is bounded: ``num_candidates`` i.i.d. candidates are
  drawn in parallel and the first valid one is kept, which has exactly the
  distribution of RAGEN's unbounded loop conditioned on one of them being
  valid. If none is valid (a candidate is valid with probability about 0.95
  at the defaults, so all 32 fail with probability about 1e-41), the
  first candidate's start/goal on a hole-free lake is used (see
  :meth:`generate_map`, which reports it).

  Dynamics (gymnasium ``FrozenLake-v1``): actions 0..3 = Left, Down, Right,
  Up. With probability ``success_rate`` the intended move happens, otherwise
  one of the two perpendicular moves, each with probability
  ``(1 - success_rate) / 2``. Moving off the grid leaves the player in place.
  A step from a hole or the goal is absorbing (player stays, reward 0,
  terminated), as in gymnasium's transition table.

  Observation: int8 [size, size] of RAGEN grid codes: 0 ``P`` player,
  1 ``_`` frozen, 2 ``O`` hole, 3 ``G`` goal, 4 ``X`` player in hole,
  5 ``√`` player on goal.

  Action: int32 scalar in [0, 4) (traced out-of-range values are clipped).

  Reward: float32 1.0 on the step that enters the goal, else 0.0.

  Termination: the player is in a hole or on the goal. No truncation here
  (see the registered ids' ``TimeLimit``).

  info: ``success`` (bool, player on the goal after the step, RAGEN's
  ``success``), ``action_effective`` (bool, the position changed, RAGEN's
  ``action_is_effective``), ``executed_action`` (int32, the move actually
  made after slipping).

  Text: rows of ``P _ O G X √`` joined by ``"\\n"``, no spaces, exactly
  RAGEN's ``render()``; the start tile is shown as ``_``.

  Raises:
    ValueError: on a bad ``size``, probability or ``num_candidates``.
  """

  action_names = ("Left", "Down", "Right", "Up")
  symbols = (environment.PAD_SYMBOL,) + _OBS_TEXT + ("\n",)
  FROZEN = FROZEN
  HOLE = HOLE
  GOAL = GOAL

  def __init__(
      self,
      size: int = 4,
      success_rate: float = 1.0 / 3.0,
      frozen_prob: float = FROZEN_PROB,
      num_candidates: int = 32,
  ):
    """Builds the env.

    Args:
      size: static side length of the lake (>= 2).
      success_rate: default ``params.success_rate`` in [0, 1].
      frozen_prob: default ``params.frozen_prob`` in (0, 1].
      num_candidates: static number of candidate maps drawn per reset (>= 1).

    Raises:
      ValueError: naming the bad argument.
    """
    size = checks.check_int("FrozenLake", "size", size, 2)
    if not 0.0 <= float(success_rate) <= 1.0:
      raise ValueError(
          f"FrozenLake: success_rate must be in [0, 1], got {success_rate!r}")
    if not 0.0 < float(frozen_prob) <= 1.0:
      raise ValueError(
          f"FrozenLake: frozen_prob must be in (0, 1], got {frozen_prob!r}")
    num_candidates = checks.check_int("FrozenLake", "num_candidates", num_candidates, 1)
    self.size = size
    self.num_candidates = num_candidates
    self._success_rate = float(success_rate)
    self._frozen_prob = float(frozen_prob)

  @property
  def default_params(self) -> FrozenLakeParams:
    return FrozenLakeParams(
        success_rate=jnp.asarray(self._success_rate, jnp.float32),
        frozen_prob=jnp.asarray(self._frozen_prob, jnp.float32),
    )

  @property
  def legend(self) -> str:
    """RAGEN's prompt text explaining the grid symbols."""
    return ("The meaning of each symbol in the state is:\n"
            "P: player, _: empty, O: hole, G: goal, X: player in hole, "
            "√: player on goal")

  # RAGEN's 5 turns and 10 actions; "<answer>Right</answer>" + EOS is 4 tokens.
  agent_defaults = environment.AgentDefaults(
      max_turns=5, max_actions_per_traj=10, max_tokens_per_turn=6,
      system="You play FrozenLake.")
  expert_think_text = "I take a shortest safe path to the goal."

  @property
  def instructions(self) -> str:
    """Our rules text: the goal, the slipping, :attr:`legend` and the actions."""
    return ("You play FrozenLake. Walk from the player to the goal without stepping into a "
            "hole. The ice may be slippery: a move can slide you sideways instead.\n"
            f"{self.legend}\n{environment.actions_sentence(self.action_names)}")

  # The expert's settings (see expert_answers).
  expert_defaults = types.MappingProxyType({"frozen_lake_policy": "shortest", "gamma": 0.9})

  def expert_options(self, options):
    """:meth:`envs_jax.Environment.expert_options`; checks the policy name and ``gamma``."""
    opts = super().expert_options(options)
    if opts["frozen_lake_policy"] not in _EXPERT_POLICIES:
      raise ValueError(f"FrozenLake: frozen_lake_policy={opts['frozen_lake_policy']!r}; use "
                       f"one of {_EXPERT_POLICIES}")
    gamma = opts["gamma"]
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 < gamma < 1.0:
      raise ValueError(f"FrozenLake: gamma={gamma!r} must be in (0, 1)")
    return dict(opts, gamma=float(gamma))

  def expert_answers(self, states, params, *, actions_per_turn=1, **options):
    """Replans from each state (host side; see ``jagent.rollout.make_expert``).

    Args:
      states: unbatched :class:`FrozenLakeState` s with numpy leaves.
      params: their :class:`FrozenLakeParams` (``success_rate`` is read by
        ``"max_success"``).
      actions_per_turn: moves per answer.
      **options: ``frozen_lake_policy`` (default ``"shortest"``): the first
        moves of a shortest hole-free path, slips ignored (RAGEN's BFS
        demonstrations; the first action when there is none); or
        ``"max_success"``: open-loop actions maximising the discounted
        probability of reaching the goal under ``success_rate`` (value
        iteration on the map), later actions of an answer for the belief
        over positions after the earlier ones. A shortest path on
        deterministic ice; on slippery 4x4 ice with 5 turns x 2 actions it
        succeeds about 48% of episodes where ``"shortest"`` succeeds 36%
        (and random actions 21%). ``gamma`` (default 0.9): the discount of
        ``"max_success"``, in (0, 1); smaller prefers shorter routes.

    Returns:
      Action names joined by ``" || "``, one text per state.

    Raises:
      ValueError: another option, an unknown ``frozen_lake_policy`` or
        ``gamma`` outside (0, 1) (:meth:`expert_options`).
    """
    opts = self.expert_options(options)
    frozen_lake_policy, gamma = opts["frozen_lake_policy"], opts["gamma"]
    out = []
    for s, p in zip(states, params):
      tiles, player = np.asarray(s.tiles, np.int8), np.asarray(s.player)
      if frozen_lake_policy == "shortest":
        path = frozen_lake_solver.solve_frozen_lake(tiles, player)
        path = path[:actions_per_turn] if path else (0,)
      else:
        n = tiles.shape[0]
        rate = float(np.asarray(p.success_rate))
        trans, q = frozen_lake_solver.reach_model(tiles.tobytes(), n, rate, gamma)
        belief = np.zeros(n * n)
        belief[player[0] * n + player[1]] = 1.0
        path = []
        for _ in range(actions_per_turn):  # open loop: best action for the belief
          a = int(np.argmax(belief @ q))
          path.append(a)
          belief = belief @ trans[:, a]
      out.append(" || ".join(self.action_names[a] for a in path))
    return out

  # -------------------------------------------------------------- generator
  def generate_map(
      self, key: jax.Array, params: FrozenLakeParams
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Samples a solvable lake (RAGEN's generator, bounded).

    Args:
      key: a PRNG key; the map is a deterministic function of it.
      params: uses ``params.frozen_prob``.

    Returns:
      ``(tiles, start, found)``: int8 [size, size] tile codes, int32 [2]
      start ``(row, col)`` and a bool scalar that is False only when no
      candidate was valid and the hole-free fallback was used.
    """
    n = self.size
    cells = n * n
    c = self.num_candidates
    k_tiles, k_start, k_goal = jax.random.split(key, 3)
    # Batched draws (one threefry call each) compile much faster than a vmap
    # over per-candidate keys; the candidates are i.i.d. either way.
    frozen = jax.random.bernoulli(k_tiles, params.frozen_prob, (c, cells))
    start = jax.random.randint(k_start, (c,), 0, cells)
    goal = (start + jax.random.randint(k_goal, (c,), 1, cells)) % cells

    def candidate(frozen, start, goal):
      tiles = jnp.where(frozen, FROZEN, HOLE).astype(jnp.int8)
      tiles = tiles.at[start].set(FROZEN).at[goal].set(GOAL).reshape(n, n)
      start_rc = jnp.stack([start // n, start % n]).astype(jnp.int32)
      reach = flood_fill(tiles != HOLE, start_rc)
      return tiles, start_rc, reach[goal // n, goal % n]

    tiles, starts, valid = jax.vmap(candidate)(frozen, start, goal)
    found = jnp.any(valid)
    i = jnp.argmax(valid)
    fallback = jnp.where(tiles[0] == GOAL, GOAL, FROZEN).astype(jnp.int8)
    chosen = jnp.where(found, tiles[i], fallback)
    return chosen, starts[i], found

  # --------------------------------------------------------------- dynamics
  def reset_env(self, key, params):
    tiles, start, _ = self.generate_map(key, params)
    state = FrozenLakeState(tiles=tiles, player=start)
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    environment.check_discrete_action(self, action)
    a = jnp.clip(jnp.asarray(action, jnp.int32), 0, 3)
    u = jax.random.uniform(key, (), jnp.float32)
    side = params.success_rate + 0.5 * (1.0 - params.success_rate)
    executed = jnp.where(
        u < params.success_rate, a,
        jnp.where(u < side, (a + 3) % 4, (a + 1) % 4)).astype(jnp.int32)
    delta = jnp.asarray(DELTAS, jnp.int32)[executed]
    tile_before = state.tiles[state.player[0], state.player[1]]
    was_terminal = tile_before != FROZEN
    moved = jnp.clip(state.player + delta, 0, self.size - 1)
    player = jnp.where(was_terminal, state.player, moved)
    tile = state.tiles[player[0], player[1]]
    new_state = state.replace(player=player)
    reward = jnp.where((tile == GOAL) & ~was_terminal, 1.0, 0.0).astype(
        jnp.float32)
    terminated = tile != FROZEN
    truncated = jnp.zeros((), jnp.bool_)
    info = {
        "success": tile == GOAL,
        "action_effective": jnp.any(player != state.player),
        "executed_action": executed,
    }
    return (self.observation(new_state), new_state, reward, terminated,
            truncated, info)

  # ------------------------------------------------------------------- text
  def observation(self, state):
    """int8 [size, size] RAGEN grid codes (see the class docstring)."""
    base = jnp.asarray([_OBS_FROZEN, _OBS_HOLE, _OBS_GOAL], jnp.int8)
    over = jnp.asarray([_OBS_PLAYER, _OBS_PLAYER_IN_HOLE, _OBS_PLAYER_ON_GOAL],
                       jnp.int8)
    r, c = state.player[0], state.player[1]
    grid = base[state.tiles]
    return grid.at[r, c].set(over[state.tiles[r, c]])

  def render_symbols(self, state):
    """int32 [size * (size + 1) - 1]: grid symbols, rows joined by newline."""
    ids = self.observation(state).astype(jnp.int32) + 1
    return environment.grid_render_symbols(ids, len(self.symbols) - 1)

  def __repr__(self) -> str:
    return (f"FrozenLake(size={self.size}, success_rate={self._success_rate:.4g}"
            f", frozen_prob={self._frozen_prob:.4g})")


def _make_slippery(**kwargs) -> environment.Environment:
  kwargs.setdefault("success_rate", 1.0 / 3.0)
  return wrappers.TimeLimit(FrozenLake(**kwargs), MAX_STEPS)


def _make_det(**kwargs) -> environment.Environment:
  kwargs.setdefault("success_rate", 1.0)
  return wrappers.TimeLimit(FrozenLake(**kwargs), MAX_STEPS)


registration.register("FrozenLake-4x4-v0", _make_slippery)
registration.register("FrozenLake-4x4-det-v0", _make_det)
