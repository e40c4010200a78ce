"""The 2x2 Rubik's cube (pocket cube) in pure JAX: RAGEN-2's ``RubiksCube-2x2-v0``.

Id (registered on import): ``RubiksCube-2x2-v0``: a solved cube scrambled by
``params.scramble_depth`` (5) uniformly random quarter turns, solved within
``max_steps`` (20) moves; the env counts the steps itself because RAGEN's
text shows them ("Step: 3/20"). RAGEN's ``config/envs.yaml`` tag
``rubikscube`` scrambles only 1 move: ``params.replace(scramble_depth=1)``.

Stickers (RAGEN's ``ragen/env/rubikscube``): 24 ints, face ``f`` holds
stickers ``4f .. 4f+3`` in reading order, faces in the order
Up, Left, Front, Right, Back, Down, each seen from outside with the usual
cube net: U with Back at the top and Left on the left, D with Front at the
top and Left on the left, the four side faces with Up at the top (L with
Back on its left, F with Left, R with Front, B with Right). A solved face
``f`` has colour ``f``: W(hite), O(range), G(reen), R(ed), B(lue), Y(ellow).

Moves are derived from the geometry in ``rubiks_cube_rules`` (a quarter turn
rotates the stickers of one layer by 90 degrees about the face's axis,
clockwise as seen looking at that face), so every move keeps each corner's three stickers
together. RAGEN's U, D, L, R, F are these exact permutations; its B is not a
cube move (``_move_B`` carries the Down strip to the Right face and the Left
strip to the Down face with their two stickers swapped, splitting corners),
so RAGEN's B-scrambled cubes are not real cube states; we do not copy that.
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax._src import checks
from envs_jax._src import environment
from envs_jax._src import registration
from envs_jax._src import rubiks_cube_solver
# Faces, colours, actions and moves (their home is the rules module, which the solver shares).
from envs_jax._src.rubiks_cube_rules import ACTION_NAMES
from envs_jax._src.rubiks_cube_rules import COLORS
from envs_jax._src.rubiks_cube_rules import FACES
from envs_jax._src.rubiks_cube_rules import MOVES
from envs_jax._src.rubiks_cube_rules import SOLVED

SCRAMBLE_DEPTH = 5  # RAGEN's RubiksCube2x2Config.scramble_depth
MAX_STEPS = 20  # RAGEN's max_steps (and envs.yaml max_actions_per_traj)


def is_solved(stickers: jax.Array) -> jax.Array:
  """True where every face shows one colour (any orientation of the cube).

  Args:
    stickers: int [..., 24] sticker colours.

  Returns:
    bool [...].
  """
  faces = jnp.reshape(stickers, stickers.shape[:-1] + (6, 4))
  return jnp.all(faces == faces[..., :1], axis=(-2, -1))


@struct.dataclass
class RubiksCubeParams:
  """Tunable parameters of :class:`RubiksCube` (vmappable).

  Attributes:
    scramble_depth: uniformly random quarter turns applied to the solved cube
      at reset (RAGEN's ``scramble_depth``); clipped to
      ``[0, RubiksCube.max_scramble_depth]``.
  """

  scramble_depth: jax.Array  # shape=(), dtype=int32


@struct.dataclass
class RubiksCubeState:
  """State of :class:`RubiksCube`.

  Attributes:
    stickers: colour (0..5, ``COLORS``) of each sticker, layout in the module
      docstring.
    steps: moves made since the reset (RAGEN's ``current_step``).
  """

  stickers: jax.Array  # shape=(24,), dtype=int8
  steps: jax.Array  # shape=(), dtype=int32


# ------------------------------------------------------------------ rendering
_DIGITS = tuple(str(d) for d in range(10))
_HEADER = "=== Rubik's Cube 2x2 State ===\nStep: "
# Text before each face's first row: the previous row's end, the face label.
_FACE_LABELS = ("Up (U):    ", "Left (L):  ", "Front (F): ", "Right (R): ",
                "Back (B):  ", "Down (D):  ")
_FACE_OPEN = tuple(("\n\n" if f == 0 else "]\n") + label + "["
                   for f, label in enumerate(_FACE_LABELS))
_ROW_BREAK = "]\n ["
_SEP = ", "
_ENDINGS = (  # playing, solved, out of steps
    "]\n\nAvailable Actions:\n" + ", ".join(ACTION_NAMES) + "\n\nWhat is your next move?",
    "]\n\n=== Game Over: Cube Solved! ===",
    "]\n\n=== Game Over: Max steps reached. ===",
)
_PIECES = (_HEADER,) + _DIGITS + ("/",) + COLORS + _FACE_OPEN + (_ROW_BREAK, _SEP) + _ENDINGS
_ID = {s: i + 1 for i, s in enumerate(_PIECES)}
_STEP_DIGITS = 3  # step counts below 1000 (saturating above)


class RubiksCube(environment.Environment[RubiksCubeState, RubiksCubeParams]):
  """RAGEN-2's 2x2 Rubik's cube: undo a random scramble in at most 20 moves.

  Reset: the solved cube (face ``f`` coloured ``f``) scrambled by
  ``params.scramble_depth`` moves drawn uniformly from the 12 actions
  (RAGEN's ``reset``: immediate cancellations such as ``U U'`` included, so
  depth 5 leaves cubes 1, 3 or 5 moves from solved; an even depth can leave
  it solved).

  Action: int32 scalar in [0, 12): ``U U' D D' L L' R R' F F' B B'``
  (clockwise quarter turn of that face seen from outside, ``'`` the inverse;
  traced out-of-range values are clipped).

  Observation: int8 [6, 2, 2], the sticker colours per face (module docstring).

  Reward: float32 1.0 on a step that leaves every face one colour (any
  orientation of the whole cube counts, as in RAGEN), else 0.0.

  Termination: solved. Truncation: ``max_steps`` moves made unsolved
  (RAGEN's ``truncated``); the count keeps going if stepped further.

  info: ``success`` (bool, solved after the step), ``action_effective``
  (bool, a sticker changed colour; RAGEN reports True always).

  Text: RAGEN's ``render()`` exactly: the header, ``Step: k/max``, each face
  as two rows ``[W, O]`` / `` [G, R]``, then the list of moves and "What is
  your next move?", or the game-over line once a move solved the cube or
  used the last step. A reset shows the moves even when the scramble left
  the cube solved (an even ``scramble_depth`` can): RAGEN's ``reset``
  renders with ``done=False`` whatever the cube.

  Raises:
    ValueError: on a bad ``scramble_depth``, ``max_steps`` or
      ``max_scramble_depth``.
  """

  action_names = ACTION_NAMES
  # The face order of the stickers and the defaults (module constants, for users of the class).
  FACES = FACES
  SCRAMBLE_DEPTH = SCRAMBLE_DEPTH
  MAX_STEPS = MAX_STEPS
  symbols = (environment.PAD_SYMBOL,) + _PIECES

  def __init__(self, scramble_depth: int = SCRAMBLE_DEPTH, max_steps: int = MAX_STEPS,
               max_scramble_depth: int = 32):
    """Builds the env.

    Args:
      scramble_depth: default ``params.scramble_depth`` in
        ``[0, max_scramble_depth]``.
      max_steps: static move limit (1..999; RAGEN: 20), shown in the text.
      max_scramble_depth: static bound of the scramble loop (>= 1).

    Raises:
      ValueError: naming the bad argument.
    """
    for name, value, low, high in (("max_scramble_depth", max_scramble_depth, 1, 10_000),
                                   ("max_steps", max_steps, 1, 999),
                                   ("scramble_depth", scramble_depth, 0, max_scramble_depth)):
      checks.check_int("RubiksCube", name, value, low, high)
    self.max_steps = max_steps
    self.max_scramble_depth = max_scramble_depth
    self._scramble_depth = scramble_depth

  @property
  def default_params(self) -> RubiksCubeParams:
    return RubiksCubeParams(scramble_depth=jnp.asarray(self._scramble_depth, jnp.int32))

  # RAGEN's budget is 20 moves (max_actions_per_traj); "<answer>U'</answer>" + EOS
  # is 5 tokens of the tiny tokenizer.
  agent_defaults = environment.AgentDefaults(
      max_turns=10, max_actions_per_traj=20, max_tokens_per_turn=7,
      system="You solve a 2x2 Rubik's cube.")
  expert_think_text = "I follow a shortest solution."

  @property
  def instructions(self) -> str:
    """Our rules text: the goal, the notation of the moves and the answer format."""
    return ("You solve a 2x2 Rubik's cube. Turn its faces until every face shows a "
            "single colour. Each face is shown as two rows of colours W, O, G, R, B, Y. "
            "A letter turns that face (U up, D down, L left, R right, F front, B back) a "
            "quarter turn clockwise as seen looking at the face; a letter with ' turns it "
            f"counter-clockwise.\n{environment.actions_sentence(self.action_names)}")

  # The expert's one setting: the solver's depth bound (see expert_answers).
  expert_defaults = types.MappingProxyType({"cube_max_depth": 10})

  def expert_options(self, options):
    """:meth:`envs_jax.Environment.expert_options`; ``cube_max_depth`` an int in [0, 14]."""
    opts = super().expert_options(options)
    checks.check_int("RubiksCube", "cube_max_depth", opts["cube_max_depth"], 0, 14)
    return opts

  def expert_answers(self, states, params, *, actions_per_turn=1, **options):
    """The first moves of a fewest-moves solution of each state (host side).

    Args:
      states: unbatched :class:`RubiksCubeState` s with numpy leaves.
      params: their params (unused: the solution does not depend on them).
      actions_per_turn: moves per answer.
      **options: ``cube_max_depth`` (default 10), the solver's depth bound
        (see :func:`envs_jax.solve_rubiks_cube`); a cube it cannot solve
        within it, or a solved one, gets the first action name (valid,
        arbitrary).

    Returns:
      Action names joined by ``" || "``, one text per state.

    Raises:
      ValueError: another option, or a bad value (:meth:`expert_options`).
    """
    del params
    max_depth = self.expert_options(options)["cube_max_depth"]
    out = []
    for s in states:
      path = rubiks_cube_solver.solve_rubiks_cube(np.asarray(s.stickers), max_depth=max_depth)
      path = path[:actions_per_turn] if path else (0,)
      out.append(" || ".join(self.action_names[a] for a in path))
    return out

  # --------------------------------------------------------------- dynamics
  def scramble(self, key: jax.Array, depth: jax.Array) -> jax.Array:
    """The solved cube after ``depth`` uniformly random actions.

    Args:
      key: a PRNG key; the scramble is a deterministic function of it.
      depth: int32 scalar, clipped to ``[0, max_scramble_depth]``.

    Returns:
      int8 [24] stickers.
    """
    moves = jnp.asarray(MOVES)
    actions = jax.random.randint(key, (self.max_scramble_depth,), 0, len(ACTION_NAMES))
    depth = jnp.clip(depth, 0, self.max_scramble_depth)

    def body(i, s):
      return jnp.where(i < depth, s[moves[actions[i]]], s)

    return jax.lax.fori_loop(0, self.max_scramble_depth, body, jnp.asarray(SOLVED))

  def reset_env(self, key, params):
    state = RubiksCubeState(stickers=self.scramble(key, params.scramble_depth),
                            steps=jnp.zeros((), jnp.int32))
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    del key, params  # deterministic moves
    environment.check_discrete_action(self, action)
    a = jnp.clip(jnp.asarray(action, jnp.int32), 0, len(ACTION_NAMES) - 1)
    stickers = state.stickers[jnp.asarray(MOVES)[a]]
    new_state = RubiksCubeState(stickers=stickers, steps=state.steps + 1)
    solved = is_solved(stickers)
    truncated = (new_state.steps >= self.max_steps) & ~solved
    info = {"success": solved, "action_effective": jnp.any(stickers != state.stickers)}
    return (self.observation(new_state), new_state, solved.astype(jnp.float32), solved,
            truncated, info)

  # ------------------------------------------------------------------- text
  def observation(self, state):
    """int8 [6, 2, 2]: the sticker colours of each face (FACES order)."""
    return state.stickers.reshape(6, 2, 2)

  @environment.compiled_render
  def render_symbols(self, state):
    """int32 [56]: RAGEN's text of the cube (header, faces, actions or game over)."""
    digit0 = _ID["0"]
    step = environment.number_symbols(state.steps, digit0, int_digits=_STEP_DIGITS)
    limit = [digit0 + int(d) for d in str(self.max_steps)]
    colors = _ID[COLORS[0]] + state.stickers.astype(jnp.int32)
    parts = [jnp.asarray([_ID[_HEADER]], jnp.int32), step,
             jnp.asarray([_ID["/"]] + limit, jnp.int32)]
    sep, row_break = _ID[_SEP], _ID[_ROW_BREAK]
    for f in range(6):
      c = colors[4 * f: 4 * f + 4]
      parts.append(jnp.stack([jnp.int32(_ID[_FACE_OPEN[f]]), c[0], jnp.int32(sep), c[1],
                              jnp.int32(row_break), c[2], jnp.int32(sep), c[3]]))
    # Game over only after a move (RAGEN's step passes done; its reset never does).
    solved = is_solved(state.stickers) & (state.steps > 0)
    ending = jnp.where(solved, 1, jnp.where(state.steps >= self.max_steps, 2, 0))
    parts.append((_ID[_ENDINGS[0]] + ending)[None].astype(jnp.int32))
    return jnp.concatenate(parts)

  def __repr__(self) -> str:
    return (f"RubiksCube(scramble_depth={self._scramble_depth}, max_steps={self.max_steps}"
            f", max_scramble_depth={self.max_scramble_depth})")


registration.register("RubiksCube-2x2-v0", RubiksCube)
