"""Peer environments adapted to our levels, for differential tests and benchmarks.

Peers are optional (the ``test`` extra installs jumanji and gymnasium; the
``bench`` extra adds gym-sokoban): every adapter raises ``ImportError`` with
an install hint when its peer is absent, and ``HAVE_JUMANJI`` tells tests
whether to skip.
"""

from __future__ import annotations

import importlib.util
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

import envs_jax

try:
  import jumanji  # pylint: disable=g-import-not-at-top
  from jumanji.environments.routing.sokoban import constants as jconst  # pylint: disable=g-import-not-at-top
  from jumanji.environments.routing.sokoban import env as jenv_lib  # pylint: disable=g-import-not-at-top
  from jumanji.environments.routing.sokoban import generator as jgen  # pylint: disable=g-import-not-at-top
  from jumanji.environments.routing.sokoban import types as jtypes  # pylint: disable=g-import-not-at-top
  from jumanji.environments.logic.game_2048 import env as j2048_lib  # pylint: disable=g-import-not-at-top
  from jumanji.environments.logic.rubiks_cube import env as jcube_lib  # pylint: disable=g-import-not-at-top
  from jumanji.environments.logic.rubiks_cube import generator as jcube_gen  # pylint: disable=g-import-not-at-top
except ImportError:  # pragma: no cover
  jumanji = None



def missing(modules: Sequence[str], extra: str) -> str | None:
  """Why a peer cannot run: its modules that are not installed, and the extra that installs them.

  Args:
    modules: the peer's top-level module names (e.g. ``("torch", "transformers")``).
    extra: the pyproject extra that installs them (e.g. ``"hf"``).

  Returns:
    E.g. ``"torch is not installed: pip install -e .[hf]"``, or None when
    every module is importable.
  """
  absent = [m for m in modules if importlib.util.find_spec(m) is None]
  if not absent:
    return None
  verb = "is" if len(absent) == 1 else "are"
  return f"{' and '.join(absent)} {verb} not installed: pip install -e .[{extra}]"


# Our action a -> Jumanji's action with the same move.
ACTION_TO_JUMANJI = np.asarray([0, 2, 3, 1], np.int32)  # Up, Down, Left, Right
# Our observation code -> Jumanji's combined grid code (env.grid_combine).
OBS_TO_JUMANJI = np.asarray([1, 0, 2, 6, 4, 3, 5], np.uint8)


def jumanji_state(level: envs_jax.SokobanState, key: jax.Array):
  """Jumanji ``State`` of one of our levels (jittable, vmappable).

  Args:
    level: a :class:`SokobanState` (fixed int8 [10, 10], boxes bool [10, 10],
      player int32 [2]).
    key: stored as Jumanji's ``State.key``.

  Returns:
    ``jumanji.environments.routing.sokoban.types.State`` with step_count 0.
  """
  fixed = jnp.where(level.fixed == envs_jax.Sokoban.WALL, jconst.WALL,
                    jnp.where(level.fixed == envs_jax.Sokoban.TARGET, jconst.TARGET,
                              jconst.EMPTY)).astype(jnp.uint8)
  variable = jnp.where(level.boxes, jconst.BOX, jconst.EMPTY).astype(jnp.uint8)
  variable = variable.at[level.player[0], level.player[1]].set(jconst.AGENT)
  return jtypes.State(key=key, fixed_grid=fixed, variable_grid=variable,
                      agent_location=level.player.astype(jnp.int32),
                      step_count=jnp.zeros((), jnp.int32))


def make_jumanji_boxoban(subset: str = "unfiltered-test", time_limit: int = 120):
  """A Jumanji ``Sokoban`` that samples uniformly from our Boxoban levels.

  Offline replacement for Jumanji's downloading default generator.

  Args:
    subset: "unfiltered-test", "medium-valid" or "hard".
    time_limit: Jumanji's episode step limit (its default 120).

  Returns:
    ``jumanji.environments.Sokoban``; ``reset(key)`` picks one of the 1000
    levels uniformly.

  Raises:
    ImportError: when jumanji is not installed.
  """
  if jumanji is None:
    raise ImportError("make_jumanji_boxoban needs jumanji (pip install jumanji)")
  table = jax.tree.map(jnp.asarray, envs_jax.sokoban_levels_from_ascii(
      envs_jax.load_boxoban_levels(subset)))

  class _LevelTable(jgen.Generator):
    """Jumanji generator over a fixed table of our levels."""

    def __call__(self, rng_key):
      k_idx, k_state = jax.random.split(rng_key)
      i = jax.random.randint(k_idx, (), 0, table.player.shape[0])
      return jumanji_state(jax.tree.map(lambda x: x[i], table), k_state)

  return jenv_lib.Sokoban(generator=_LevelTable(), time_limit=time_limit)


HAVE_JUMANJI = jumanji is not None

# The 2x2 cube. Both read each face in the same net (U with Back at the top,
# D with Front at the top, side faces with Up at the top, each seen from
# outside), so stickers map face to face in place; only the face order differs.
# Our face f (Up, Left, Front, Right, Back, Down) -> Jumanji's face index
# (UP 0, FRONT 1, RIGHT 2, BACK 3, LEFT 4, DOWN 5).
CUBE_FACE_TO_JUMANJI = np.asarray([0, 4, 1, 2, 3, 5], np.int32)
# Our action a (U U' D D' L L' R R' F F' B B') -> Jumanji's flat action for
# cube_size 2 (face * 3 + amount; amount 0 clockwise, 1 anticlockwise, both
# seen looking at the face, as ours).
CUBE_ACTION_TO_JUMANJI = np.asarray(
    [3 * CUBE_FACE_TO_JUMANJI[envs_jax.RubiksCube.FACES.index(face)] + amount
     for face in ("Up", "Down", "Left", "Right", "Front", "Back") for amount in (0, 1)],
    np.int32)


def cube_to_jumanji(stickers: jax.Array) -> jax.Array:
  """Our int [24] stickers as Jumanji's [6, 2, 2] cube (values kept)."""
  faces = jnp.reshape(stickers, (6, 2, 2))
  return jnp.zeros_like(faces).at[jnp.asarray(CUBE_FACE_TO_JUMANJI)].set(faces)


def make_jumanji_game_2048():
  """Jumanji's ``Game2048`` (4x4; board of exponents, actions Up, Right, Down, Left).

  Raises:
    ImportError: when jumanji is not installed.
  """
  if jumanji is None:
    raise ImportError("make_jumanji_game_2048 needs jumanji (pip install jumanji)")
  return j2048_lib.Game2048(board_size=4)


def make_jumanji_rubiks_cube(scramble_depth: int = envs_jax.RubiksCube.SCRAMBLE_DEPTH,
                             time_limit: int = envs_jax.RubiksCube.MAX_STEPS):
  """Jumanji's ``RubiksCube`` with ``cube_size=2`` and our scramble depth and limit.

  Raises:
    ImportError: when jumanji is not installed.
  """
  if jumanji is None:
    raise ImportError("make_jumanji_rubiks_cube needs jumanji (pip install jumanji)")
  gen = jcube_gen.ScramblingGenerator(cube_size=2, num_scrambles_on_reset=scramble_depth)
  return jcube_lib.RubiksCube(generator=gen, time_limit=time_limit)


def gymnasium_frozen_lake():
  """gymnasium FrozenLake-v1 (4x4, slippery) and a step function for loops.

  Returns:
    ``(env, step)`` where ``step(env, action) -> done``.

  Raises:
    ImportError: when gymnasium is not installed.
  """
  import gymnasium  # pylint: disable=g-import-not-at-top

  env = gymnasium.make("FrozenLake-v1", map_name="4x4", is_slippery=True)
  env.reset(seed=0)

  def step(e, action: int) -> bool:
    _, _, terminated, truncated, _ = e.step(action)
    return terminated or truncated

  return env, step


def gym_sokoban(dim: int, num_boxes: int):
  """gym-sokoban (RAGEN's Sokoban backend) stepped the way RAGEN steps it.

  RAGEN's Sokoban env subclasses gym-sokoban's and, instead of its RGB
  rendering, pushes/moves with the parent's ``_push`` / ``_move``, computes
  the reward and done flag, and renders the grid as text each step. This
  peer does the same per step (text built with numpy from ``room_state``).
  Our actions 0..3 (Up, Down, Left, Right) map to gym-sokoban's 1..4 (push
  up/down/left/right).

  Returns:
    ``(env, step)`` where ``step(env, action) -> done``.

  Raises:
    ImportError: when gym-sokoban is not installed (``pip install -e .[bench]``).
  """
  from gym_sokoban.envs.sokoban_env import SokobanEnv  # pylint: disable=g-import-not-at-top

  env = SokobanEnv(dim_room=(dim, dim), num_boxes=num_boxes, max_steps=100)
  env.reset()
  # gym-sokoban room_state codes 0..5 -> RAGEN's text symbols.
  chars = np.asarray(["#", "_", "O", "\u221a", "X", "P"])

  def step(e, action: int) -> bool:
    e.num_env_steps += 1
    e.new_box_position = None
    e.old_box_position = None
    e._push(action + 1)  # pylint: disable=protected-access
    e._calc_reward()  # pylint: disable=protected-access
    done = e._check_if_done()  # pylint: disable=protected-access
    text = "\n".join("".join(row) for row in chars[e.room_state.astype(np.int64)])
    del text
    return done

  return env, step
