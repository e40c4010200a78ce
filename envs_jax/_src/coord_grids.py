"""RAGEN-2's coordinate observations: ``CoordSokoban-6x6-1box-v0``, ``CoordFrozenLake-4x4-v0``.

The games are our Sokoban and FrozenLake, unchanged (subclasses that only
add text; the CoordFrozenLake id's default lakes are RAGEN-2's, see below):
RAGEN-2's ``observation_format: grid_coord``
(``config/envs.yaml`` tags ``CoordSokoban`` and ``CoordFrozenLake``) shows
the zero-indexed ``(row, col)`` coordinates of the game's pieces above the
usual symbol grid. Text layout (RAGEN's ``format_coordinate_render``)::

    Coordinates: \\n
    Board size: 6 rows x 6 cols (zero-indexed).
    Targets: (1, 2)
    Boxes: (2, 3)
    Player: (3, 3)
    Grid Map: \\n
    ######
    ...

(``\\n`` marks the space that ends those two lines.) A line whose list is
empty is left out; each list is in row-major order. Sokoban's lines:
Targets (every target cell, covered or not), Boxes (off target), Boxes on
target, Player, Player on target. FrozenLake's: Start, Goal, Player, Player on
goal, Player in hole, Holes.

Ids (registered on import, with the base ids' step limits):

* ``CoordSokoban-6x6-1box-v0``: ``Sokoban-6x6-1box-v0`` (RAGEN-2's default
  training env).
* ``CoordFrozenLake-4x4-v0``: ``FrozenLake-4x4-v0`` (slippery, success rate
  1/3) on RAGEN-2's lakes: a generated tile is frozen with probability 0.9
  (``frozen_prob``), not FrozenLake-4x4-v0's 0.8 (RAGEN v1's). RAGEN changed
  ``FrozenLakeEnvConfig.p`` from 0.8 to 0.9 in commit b45d28c (2025-11-13),
  and RAGEN-2's ``CoordFrozenLake`` tag keeps that default; as the parity
  target of this id we follow it. Other values:
  ``envs_jax.make("CoordFrozenLake-4x4-v0", frozen_prob=0.8)`` or
  ``params.replace(frozen_prob=0.8)``. RAGEN-2's tag runs ``success_rate``
  0.8: ``params.replace(success_rate=0.8)``.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import struct

from envs_jax._src import environment
from envs_jax._src import frozen_lake
from envs_jax._src import registration
from envs_jax._src import sokoban
from envs_jax._src import wrappers

_DIGITS = tuple(str(d) for d in range(10))
_COMMA, _NEXT, _CLOSE = ", ", "), (", ")"
_GRID_HEAD = "\nGrid Map: \n"
SOKOBAN_LABELS = ("Targets", "Boxes", "Boxes on target", "Player", "Player on target")
FROZEN_LAKE_LABELS = ("Start", "Goal", "Player", "Player on goal", "Player in hole", "Holes")


def _head(height: int, width: int) -> str:
  return f"Coordinates: \nBoard size: {height} rows x {width} cols (zero-indexed)."


def _coord_symbols(grid_symbols: Sequence[str], height: int, width: int,
                   labels: Sequence[str]) -> tuple[str, ...]:
  """The symbol table: the grid's own symbols first (ids unchanged), then the text pieces.

  Every piece starts at a newline or after a digit and ends before a digit
  or a newline, so tokenizing the pieces one by one equals tokenizing the
  text (digits and the newline are always tokens of their own).
  """
  return (tuple(grid_symbols) + _DIGITS
          + (_head(height, width), _COMMA, _NEXT, _CLOSE, _GRID_HEAD) + tuple(f"\n{label}: (" for label in labels))


def coordinate_symbols(env: environment.Environment, masks: Sequence[jax.Array],
                       counts: Sequence[int], grid_ids: jax.Array, height: int,
                       width: int, labels: Sequence[str]) -> jax.Array:
  """Device rendering of the coordinate lines above a grid (``grid_coord``).

  Args:
    env: the env whose ``symbols`` come from :func:`_coord_symbols`.
    masks: one bool [H, W] per label: the cells listed on that line.
    counts: static number of slots per line (the most cells it can list).
    grid_ids: int32 [H * (W + 1) - 1], the grid's own rendering.
    height: H.
    width: W.
    labels: the line labels, in ``masks`` order.

  Returns:
    int32 vector: the header, the non-empty lines, ``Grid Map:`` and the
    grid; unused slots hold 0 (the empty symbol).
  """
  sid = env.symbol_id
  digit0 = sid("0")
  parts = [jnp.asarray([sid(_head(height, width))], jnp.int32)]
  for mask, count, label in zip(masks, counts, labels):
    idx = jnp.nonzero(mask.reshape(-1), size=count, fill_value=-1)[0]
    shown = idx >= 0
    lead = jnp.where(jnp.arange(count) == 0, sid(f"\n{label}: ("), sid(_NEXT))
    slots = jnp.stack([lead, digit0 + idx // width, jnp.full((count,), sid(_COMMA)),
                       digit0 + idx % width], axis=1)
    parts.append(jnp.where(shown[:, None], slots, 0).reshape(-1))
    parts.append(jnp.where(shown[0], sid(_CLOSE), 0)[None])
  parts += [jnp.asarray([sid(_GRID_HEAD)], jnp.int32), grid_ids]
  return jnp.concatenate([jnp.asarray(p, jnp.int32) for p in parts])


def _check_size(name: str, height: int, width: int) -> None:
  if not (1 <= height <= 10 and 1 <= width <= 10):
    raise ValueError(f"{name}: coordinates are single digits; height and width must be "
                     f"in [1, 10], got {height}x{width}")


def _corner(height: int, width: int) -> str:
  return (f"from (0, 0) at the top-left corner to ({height - 1}, {width - 1}) at the "
          "bottom-right")


class CoordSokoban(sokoban.Sokoban):
  """:class:`~envs_jax.Sokoban` whose text lists the coordinates of the pieces.

  Dynamics, state, observation array, rewards, levels and expert are the
  base class's; only :meth:`render_symbols` (module docstring layout) and the
  instructions differ. Targets, boxes and box-on-target lines hold up to
  ``num_boxes`` entries each.

  Raises:
    ValueError: a side longer than 10, or the base class's errors.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    _check_size("CoordSokoban", self.height, self.width)
    self.symbols = _coord_symbols(self.symbols, self.height, self.width, SOKOBAN_LABELS)

  @property
  def instructions(self) -> str:
    """Our rules text: the base's, with what the coordinates list (RAGEN-2's content)."""
    return ("You play Sokoban. You are the player; push every box onto a target. Walking "
            "into a box pushes it one cell; a box cannot be pulled, and cannot be pushed "
            "into a wall or another box.\nThe state lists the zero-indexed (row, column) "
            "coordinates of the player, every box and every target, "
            f"{_corner(self.height, self.width)}, then shows the grid.\n{self.legend}\n"
            f"{environment.actions_sentence(self.action_names)}")

  @environment.compiled_render
  def render_symbols(self, state):
    """int32 vector: the coordinate lines, then the base grid (module docstring)."""
    target = state.fixed == sokoban.TARGET
    h, w = state.fixed.shape
    at_player = ((jnp.arange(h)[:, None] == state.player[0])
                 & (jnp.arange(w)[None, :] == state.player[1]))
    grid = environment.grid_render_symbols(self.observation(state).astype(jnp.int32) + 1,
                                           self.symbol_id("\n"))
    k = self.num_boxes
    return coordinate_symbols(
        self, (target, state.boxes & ~target, state.boxes & target, at_player & ~target,
               at_player & target), (k, k, k, 1, 1), grid, h, w, SOKOBAN_LABELS)


@struct.dataclass
class CoordFrozenLakeState(frozen_lake.FrozenLakeState):
  """:class:`~envs_jax.FrozenLakeState` plus the start tile (RAGEN's ``Start`` line).

  Attributes:
    start: ``(row, col)`` of the episode's first position.
  """

  start: jax.Array  # shape=(2,), dtype=int32


class CoordFrozenLake(frozen_lake.FrozenLake):
  """:class:`~envs_jax.FrozenLake` whose text lists the coordinates of the tiles.

  Dynamics, observation array, rewards, map generator and expert are the
  base class's; the state adds the start tile (set at reset, carried
  unchanged by the base step's ``state.replace``). Text: module docstring.

  Raises:
    ValueError: a size above 10, or the base class's errors.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    _check_size("CoordFrozenLake", self.size, self.size)
    self.symbols = _coord_symbols(self.symbols, self.size, self.size, FROZEN_LAKE_LABELS)

  @property
  def instructions(self) -> str:
    """Our rules text: the base's, with what the coordinates list (RAGEN-2's content)."""
    n = self.size
    return ("You play FrozenLake. Walk from the player to the goal without stepping into a "
            "hole. The ice may be slippery: a move can slide you sideways instead.\nThe "
            "state lists the zero-indexed (row, column) coordinates of the start, the goal, "
            f"the player and the holes, {_corner(n, n)}, then shows the grid.\n"
            f"{self.legend}\n{environment.actions_sentence(self.action_names)}")

  def reset_env(self, key, params):
    _, base = super().reset_env(key, params)
    state = CoordFrozenLakeState(tiles=base.tiles, player=base.player, start=base.player)
    return self.observation(state), state

  @environment.compiled_render
  def render_symbols(self, state):
    """int32 vector: the coordinate lines, then the base grid (module docstring)."""
    n = self.size
    cells = jnp.arange(n * n).reshape(n, n)
    at = lambda rc: cells == rc[0] * n + rc[1]
    player = at(state.player)
    tile = state.tiles[state.player[0], state.player[1]]
    holes = state.tiles == frozen_lake.HOLE
    grid = environment.grid_render_symbols(self.observation(state).astype(jnp.int32) + 1,
                                           self.symbol_id("\n"))
    return coordinate_symbols(
        self, (at(state.start), state.tiles == frozen_lake.GOAL,
               player & (tile == frozen_lake.FROZEN), player & (tile == frozen_lake.GOAL),
               player & (tile == frozen_lake.HOLE), holes),
        (1, 1, 1, 1, 1, n * n), grid, n, n, FROZEN_LAKE_LABELS)


def _coord_sokoban(max_steps: int = sokoban.MAX_STEPS, **kwargs) -> environment.Environment:
  defaults = dict(height=6, width=6, num_boxes=1, **sokoban.SIMPLE_GENERATOR)
  return wrappers.TimeLimit(CoordSokoban(**{**defaults, **kwargs}), max_steps)


def _coord_frozen_lake(**kwargs) -> environment.Environment:
  kwargs.setdefault("success_rate", 1.0 / 3.0)
  kwargs.setdefault("frozen_prob", frozen_lake.RAGEN2_FROZEN_PROB)
  return wrappers.TimeLimit(CoordFrozenLake(**kwargs), frozen_lake.MAX_STEPS)


registration.register("CoordSokoban-6x6-1box-v0", _coord_sokoban)
registration.register("CoordFrozenLake-4x4-v0", _coord_frozen_lake)
