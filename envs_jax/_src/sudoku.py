"""Sudoku in pure JAX: RAGEN-2's ``SudokuEnv`` with its ``with_feedback`` text.

Ids (registered on import): ``Sudoku-4x4-v0`` (6 empty cells of 16, RAGEN's
``easy`` share of 40% on a 4x4 grid), ``Sudoku-9x9-easy-v0`` (32 empty of 81,
49 givens; RAGEN-2's ``SimpleSudoku``) and ``Sudoku-9x9-medium-v0`` (40 empty,
41 givens; ``MediumSudoku``). Puzzles come from
:func:`~envs_jax._src.sudoku_generator.generate_puzzle` (unique solution,
exact count); RAGEN's own generator does not check uniqueness.

Rules (RAGEN's ``ragen/env/sudoku/env.py``): one move per step, the answer
``place N at row R col C`` or ``R,C,N`` (1-based; other forms in
:mod:`~envs_jax._src.sudoku_parser`). Every step counts. An unparseable
answer, a number out of range, a given cell, or a number already in the
cell's row, column or box is invalid: -0.1, grid unchanged. A valid move
writes the number (a number the player wrote earlier may be overwritten):
+1.0 when it is the solution's, else +0.5; solving adds +10.

The episode terminates when the grid is solved; it is truncated on a valid
move that reaches ``max_steps`` (``n * n``, one step per cell as RAGEN's
``max_steps=81`` for 9x9) unsolved; as in RAGEN, an invalid move never ends
it. RAGEN-2 plays 20 (easy) or 30 (medium) moves an episode
(``config/envs.yaml``), fewer than the empty cells: solving is out of reach,
the reward counts correct placements.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax._src import checks
from envs_jax._src import environment
from envs_jax._src import registration
from envs_jax._src import sudoku_generator
from envs_jax._src import sudoku_parser

# Feedback codes of ``SudokuState.feedback[0]``: parser kinds 1-4, then RAGEN's others.
NONE, UNPARSED, BAD_ROW, BAD_COL, BAD_NUM, GIVEN, CONFLICT, CORRECT, PLACED = range(9)
_RANGE_CODES = (BAD_ROW, BAD_COL, BAD_NUM)


@struct.dataclass
class SudokuParams:
  """Tunable parameters of :class:`Sudoku` (vmappable).

  Attributes:
    num_empty: empty cells of a generated puzzle (RAGEN: 40% of the cells
      for easy, 50% for medium, rounded down).
    correct_reward: a valid move with the solution's number (RAGEN 1.0); a
      valid move with another number earns half of it.
    invalid_reward: an invalid move (RAGEN -0.1).
    completion_bonus: added on the move that solves the grid (RAGEN 10.0).
  """

  num_empty: jax.Array  # shape=(), dtype=int32
  correct_reward: jax.Array  # shape=(), dtype=float32
  invalid_reward: jax.Array  # shape=(), dtype=float32
  completion_bonus: jax.Array  # shape=(), dtype=float32


@struct.dataclass
class SudokuState:
  """State of :class:`Sudoku`.

  Attributes:
    grid: the current values, 0 empty.
    givens: the initial cells (RAGEN's ``initial_grid != 0``).
    solution: the puzzle's (unique) solution.
    steps: moves made (valid or not).
    feedback: the last move: ``(code, R, C, N)``, ``code`` one of ``NONE``
      (after a reset), ``UNPARSED``, ``BAD_ROW``, ``BAD_COL``, ``BAD_NUM``,
      ``GIVEN``, ``CONFLICT``, ``CORRECT``, ``PLACED``; R, C, N as written.
  """

  grid: jax.Array  # shape=(n, n), dtype=int8
  givens: jax.Array  # shape=(n, n), dtype=bool
  solution: jax.Array  # shape=(n, n), dtype=int8
  steps: jax.Array  # shape=(), dtype=int32
  feedback: jax.Array  # shape=(4,), dtype=int32


def unit_flags(grid: jax.Array, row: jax.Array, col: jax.Array, num: jax.Array) -> jax.Array:
  """bool [3]: ``num`` is in the row, the column, the box of (row, col) (RAGEN's conflicts).

  Args:
    grid: int [n, n] values.
    row: int32 scalar, zero-indexed.
    col: int32 scalar, zero-indexed.
    num: int32 scalar.
  """
  n = grid.shape[0]
  b = math.isqrt(n)
  r, c = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
  box = (r // b == row // b) & (c // b == col // b)
  here = grid == num
  return jnp.stack([jnp.any(here[row]), jnp.any(here[:, col]), jnp.any(here & box)])


def conflicts(grid: jax.Array) -> jax.Array:
  """bool [n, n]: non-empty cells whose value repeats in their row, column or box."""
  n = grid.shape[0]
  b = math.isqrt(n)
  g = grid.astype(jnp.int32)
  boxes = g.reshape(b, b, b, b).transpose(0, 2, 1, 3).reshape(n, n)  # [box, cell in box]
  unbox = lambda x: x.reshape(b, b, b, b).transpose(0, 2, 1, 3).reshape(n, n)
  same = lambda lines: jnp.sum(lines[:, :, None] == lines[:, None, :], -1) > 1
  return (g > 0) & (same(g) | same(g.T).T | unbox(same(boxes)))


def candidates(grid: jax.Array) -> jax.Array:
  """bool [n, n, n]: digit ``d + 1`` fits empty cell (r, c) (RAGEN's valid numbers)."""
  n = grid.shape[0]
  b = math.isqrt(n)
  one = jax.nn.one_hot(grid.astype(jnp.int32) - 1, n, dtype=jnp.bool_)  # 0 -> all False
  rows, cols = jnp.any(one, 1), jnp.any(one, 0)
  boxes = jnp.any(one.reshape(b, b, b, b, n), axis=(1, 3))
  box_of = boxes[jnp.arange(n)[:, None] // b, jnp.arange(n)[None, :] // b]
  return (grid == 0)[..., None] & ~(rows[:, None] | cols[None] | box_of)


def is_solved(grid: jax.Array) -> jax.Array:
  """bool scalar: every cell filled and no conflict (RAGEN's ``is_solved``)."""
  return jnp.all(grid != 0) & ~jnp.any(conflicts(grid))


# ------------------------------------------------------------------ text
_RULE = "=" * 50
_HEADER = f"{_RULE}\nSUDOKU PUZZLE\n{_RULE}\n"
_LEGEND = "\nLegend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"
_FORMAT = "\n\n❌ Invalid action format: "
_UNPARSED_TEXT = (_FORMAT + "Could not parse action. Expected format: "
                  "'place 5 at row 2 col 3' or '2,3,5'")
_RANGE_LEADS = tuple(_FORMAT + w + " " for w in ("Row", "Column", "Number"))
_GIVEN_TEXT = "\n\n❌ Cannot modify initial cell at ("
_CONFLICT_TEXT = "\n\n❌ Invalid placement: "
_FIRST_UNIT = (" conflicts with row ", " conflicts with column ", " conflicts with box (")
_NEXT_UNIT = ("", ", column ", ", box (")
_VALID_FOR = "\n   Valid numbers for ("
_CORRECT_TEXT = "\n\n✓ Correct! Placed "
_PLACED_TEXT = "\n\n⚠ Placed "
_NOT_OPTIMAL = ") - Valid but not optimal"
_SOLVED_TEXT = "\n🎉 Congratulations! Puzzle solved!"
_CONFLICTS_HEAD = "\n\n⚠ CONFLICTS DETECTED:"
_CONFLICT_CELL = "\n  - Cell ("
_VALID_HEAD = "\n\n💡 VALID NUMBERS FOR EMPTY CELLS:"
_VALID_CELL = "\n  - ("
_PROGRESS = "\n\nProgress: "
_MAX_LISTED = 10  # RAGEN lists valid numbers once at most 10 cells are empty
# A cell as (opening, closing) around its digit (RAGEN's " . ", "[N]", "*N*", " N ").
_EMPTY, _GIVEN, _CONFLICTING, _WRITTEN = range(4)
_OPEN = (" .", "[", "*", " ")
_CLOSE = (" ", "]", "*", " ")


def _segments(n: int) -> dict[tuple[int, int, int], str]:
  """Text from one cell's digit to the next: (previous kind or -1, box border, kind) -> text.

  The pieces of a row are these segments and the digits: each segment
  starts after a digit, after an empty cell's ``" ."`` (then with a space)
  or at a line start, and ends before a digit or a space, so tokenizing the
  pieces one by one equals tokenizing the row.
  """
  out = {(-1, 0, k): _OPEN[k] for k in range(4)}
  for prev in range(4):
    for border in (0, 1):
      for k in range(4):
        out[(prev, border, k)] = _CLOSE[prev] + ("| " if border else "") + _OPEN[k]
  return out


class Sudoku(environment.Environment[SudokuState, SudokuParams]):
  """RAGEN-2's Sudoku on an ``n x n`` grid (n = 4 or 9), one placement a step.

  Reset: :func:`~envs_jax._src.sudoku_generator.generate_puzzle` with
  ``params.num_empty``.

  Action: uint8 [``max_answer_bytes``], the answer text zero padded (the
  inside of ``<answer>``; :func:`envs_jax.encode_countdown_answer` builds it),
  parsed on device by :func:`~envs_jax._src.sudoku_parser.parse_move`.

  Observation: int8 [n, n], the current grid (0 empty).

  Reward, termination, truncation: module docstring.

  info: ``success`` (bool, a valid move solved the grid), ``action_effective``
  and ``action_valid`` (bool, the move was valid: RAGEN's
  ``action_is_effective`` / ``action_is_valid``), ``correct_placement``
  (bool, a valid move with the solution's number).

  Text: RAGEN's ``render_format="with_feedback"`` (conflicts and valid
  numbers shown): the header, the grid with ``[N]`` givens, ``N`` written,
  ``*N*`` conflicting and ``.`` empty cells and ``|``/``---`` box borders,
  the legend, the last move's feedback, any conflicts, the valid numbers of
  each empty cell once at most 10 are empty, then ``Progress: 49/81 cells
  filled (49 initial, 0 placed)`` and ``Steps: 0/81``. One difference: an
  unparseable answer's feedback does not quote the answer (RAGEN's
  ``Could not parse action: '<answer>'.``), whose arbitrary bytes would not
  tokenize piece by piece. Moves cannot create conflicts (a conflicting move
  is invalid), so ``*N*`` and the conflicts list only show for states built
  by hand.

  Raises:
    ValueError: on a bad ``size``, ``num_empty`` or ``max_answer_bytes``.
  """

  action_names = ()
  expert_think_text = "I place a number that the rules force."

  def __init__(self, size: int = 9, num_empty: int = 32, max_answer_bytes: int = 128,
               max_actions: int = 20):
    """Builds the env.

    Args:
      size: static side n, 4 or 9.
      num_empty: default ``params.num_empty``, in ``[0, n * n]``.
      max_answer_bytes: static length of the action buffer (16..4096).
      max_actions: the agent's moves per episode (RAGEN-2's
        ``max_actions_per_traj``), for :attr:`agent_defaults`.

    Raises:
      ValueError: naming the bad argument.
    """
    for name, value, low, high in (("size", size, 4, 9), ("num_empty", num_empty, 0, size ** 2),
                                   ("max_answer_bytes", max_answer_bytes, 16, 4096),
                                   ("max_actions", max_actions, 1, 10_000)):
      checks.check_int("Sudoku", name, value, low, high)
    if size not in (4, 9):
      raise ValueError(f"Sudoku: size must be 4 or 9, got {size!r}")
    self.size = n = size
    self.box = math.isqrt(n)
    self.max_steps = n * n
    self.max_answer_bytes = max_answer_bytes
    self._num_empty = num_empty
    self._segments = _segments(n)
    pieces = (tuple(str(d) for d in range(10)) + ("\n", _HEADER, "-" * (3 * n + self.box - 1)
                                                 + "\n", _LEGEND)
              + tuple(self._segments.values()) + ("]", "*", _UNPARSED_TEXT)
              + _RANGE_LEADS + (f" is out of range (1-{n})", _GIVEN_TEXT, ",", ")",
                                _CONFLICT_TEXT) + _FIRST_UNIT + _NEXT_UNIT[1:]
              + (_VALID_FOR, "): [", ", ", _CORRECT_TEXT, _PLACED_TEXT, " at (", _NOT_OPTIMAL,
                 _SOLVED_TEXT, _CONFLICTS_HEAD, _CONFLICT_CELL, "): ", _VALID_HEAD,
                 _VALID_CELL, _PROGRESS, f"/{n * n} cells filled (", " initial, ",
                 " placed)\nSteps: ", f"/{self.max_steps}"))
    self.symbols = tuple(dict.fromkeys((environment.PAD_SYMBOL,) + pieces))
    self._id = {s: i for i, s in enumerate(self.symbols)}
    self.agent_defaults = environment.AgentDefaults(
        max_turns=max_actions, max_actions_per_traj=max_actions,
        # The expert's "<answer>2,3,5</answer>" + EOS is 8 tokens of the tiny
        # tokenizer, + 2 of slack. "place 5 at row 2 col 3" (19) also parses: a
        # model that writes it needs rollout.max_tokens_per_turn >= 21. Every
        # reply token of every turn is a decode step (docs/results.md, Sudoku).
        max_tokens_per_turn=10, system="You play Sudoku.")

  @property
  def default_params(self) -> SudokuParams:
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return SudokuParams(num_empty=jnp.asarray(self._num_empty, jnp.int32),
                        correct_reward=f32(1.0), invalid_reward=f32(-0.1),
                        completion_bonus=f32(10.0))

  @property
  def instructions(self) -> str:
    """Our rules text: RAGEN-2's content (rules, notation, answer formats, feedback)."""
    n, b = self.size, self.box
    return (f"You play Sudoku. Fill the grid so that every row, every column and every "
            f"{b}x{b} box holds each number from 1 to {n} exactly once. Cells given at the "
            "start are shown in [brackets] and cannot be changed; empty cells are shown as "
            "dots. Place one number per answer, rows and columns counted from 1, for "
            "example <answer>place 5 at row 2 col 3</answer> or <answer>2,3,5</answer>. "
            "After each move you are told whether it was valid and which rules it broke.")

  # --------------------------------------------------------------- dynamics
  def reset_env(self, key, params):
    puzzle, solution, _ = sudoku_generator.generate_puzzle(key, self.size, params.num_empty)
    state = SudokuState(grid=puzzle.astype(jnp.int8), givens=puzzle != 0,
                        solution=solution.astype(jnp.int8), steps=jnp.zeros((), jnp.int32),
                        feedback=jnp.zeros((4,), jnp.int32))
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    """One move (module docstring).

    Raises:
      ValueError: ``action`` is not uint8 [max_answer_bytes] (static check).
    """
    del key
    action = jnp.asarray(action)
    if action.shape != (self.max_answer_bytes,) or action.dtype != jnp.uint8:
      raise ValueError(f"{self.name}: action must be uint8 [{self.max_answer_bytes}] (the "
                       "answer bytes, zero padded), got shape "
                       f"{action.shape} dtype {action.dtype}")
    kind, rcn = sudoku_parser.parse_move(action, self.size)
    parsed = kind == sudoku_parser.OK
    r, c = jnp.clip(rcn[0] - 1, 0, self.size - 1), jnp.clip(rcn[1] - 1, 0, self.size - 1)
    num = rcn[2]
    given = parsed & state.givens[r, c]
    valid = parsed & ~given & ~jnp.any(unit_flags(state.grid, r, c, num))
    grid = jnp.where(valid, state.grid.at[r, c].set(num.astype(jnp.int8)), state.grid)
    correct = valid & (num == state.solution[r, c])
    solved = valid & is_solved(grid)
    steps = state.steps + 1
    reward = jnp.where(valid, jnp.where(correct, 1.0, 0.5) * params.correct_reward
                       + jnp.where(solved, params.completion_bonus, 0.0),
                       params.invalid_reward).astype(jnp.float32)
    code = jnp.where(~parsed, kind, jnp.where(given, GIVEN, jnp.where(
        ~valid, CONFLICT, jnp.where(correct, CORRECT, PLACED))))
    new_state = state.replace(grid=grid, steps=steps,
                              feedback=jnp.concatenate([code[None], rcn]).astype(jnp.int32))
    truncated = valid & (steps >= self.max_steps) & ~solved
    info = {"success": solved, "action_effective": valid, "action_valid": valid,
            "correct_placement": correct}
    return self.observation(new_state), new_state, reward, solved, truncated, info

  def sample_action(self, key: jax.Array) -> jax.Array:
    """A random well-formed move ``"R,C,N"`` with R, C, N uniform in 1..n (uint8 buffer).

    Exercises the rules (most such moves are invalid), unlike random bytes.
    """
    digits = jax.random.randint(key, (3,), 1, self.size + 1).astype(jnp.uint8) + ord("0")
    text = jnp.stack([digits[0], jnp.uint8(ord(",")), digits[1], jnp.uint8(ord(",")),
                      digits[2]])
    return jnp.zeros((self.max_answer_bytes,), jnp.uint8).at[:5].set(text)

  def text_sizing_state(self, key, params):
    """A reset, or (half the draws) its solution with 1-10 cells emptied, plus 0-3 random moves.

    The longest texts are a move's feedback (conflicts, the cell's valid
    numbers) and the valid-number listing of a board with at most 10 empty
    cells, which random moves from a reset never reach; both are drawn here
    so that ``jagent.rollout.TextEnv`` sizes the prompt for them.
    """
    k0, k1, k2, k3, k4 = jax.random.split(key, 5)
    _, state = self.reset(k0, params)
    n = self.size
    open_cells = ~state.givens.reshape(-1)
    num_empty = jnp.minimum(jax.random.randint(k1, (), 1, _MAX_LISTED + 1), jnp.sum(open_cells))
    order = jnp.argsort(jnp.where(open_cells, jax.random.uniform(k2, (n * n,)), 2.0))
    empty = jnp.zeros((n * n,), bool).at[order].set(jnp.arange(n * n) < num_empty)
    near = state.replace(grid=jnp.where(empty.reshape(n, n), 0, state.solution).astype(jnp.int8))
    state = environment.tree_select(jax.random.bernoulli(k3), near, state)
    return environment.random_steps(self, k4, state, params)

  # ----------------------------------------------------------------- expert
  def expert_answers(self, states, params, *, actions_per_turn=1, **options):
    """A forced correct move for each state, as ``"R,C,N"`` (host side).

    The solution comes from :func:`envs_jax.solve_sudoku` on the givens (the
    puzzles have one); the move is the first cell in reading order whose
    value differs from it and whose solution number is valid now. A state
    without one (solved, or every wrong cell blocked) answers the first
    differing cell anyway, or ``"1,1,1"``.

    Args:
      states: unbatched :class:`SudokuState` s with numpy leaves.
      params: their params (unused).
      actions_per_turn: unused (one move an answer).
      **options: none (this expert has no settings; any is refused).

    Returns:
      One answer text per state.

    Raises:
      ValueError: any option (:meth:`expert_options`).
    """
    del params, actions_per_turn
    self.expert_options(options)
    from envs_jax._src import sudoku_solver  # pylint: disable=g-import-not-at-top
    out = []
    for s in states:
      grid = np.asarray(s.grid, np.int64)
      sols = sudoku_solver.solve_sudoku(np.where(np.asarray(s.givens), grid, 0))
      if not sols:
        out.append("1,1,1")
        continue
      todo = [(r, c) for r, c in zip(*np.nonzero(grid != sols[0]))]
      ok = [(r, c) for r, c in todo
            if sudoku_solver.is_valid_placement(grid, r, c, int(sols[0][r, c]))]
      r, c = (ok or todo or [(0, 0)])[0]
      out.append(f"{r + 1},{c + 1},{int(sols[0][r, c])}")
    return out

  def random_answers(self, states, rng, *, actions_per_turn=1):
    """Uniformly random moves ``"R,C,N"`` (the reply format only); one draw per state."""
    del actions_per_turn
    picks = rng.integers(1, self.size + 1, size=(len(states), 3))
    return [f"{r},{c},{v}" for r, c, v in picks]

  # ------------------------------------------------------------------- text
  def observation(self, state):
    """int8 [n, n]: the current grid (0 empty)."""
    return state.grid

  @environment.compiled_render
  def render_symbols(self, state):
    """int32 vector: RAGEN's ``with_feedback`` text (class docstring)."""
    ids, n, b = self._id, self.size, self.box
    digit0 = ids["0"]
    i32 = lambda x: jnp.asarray(x, jnp.int32)
    const = lambda *texts: i32([ids[t] for t in texts])
    show = lambda cond, x: jnp.where(cond, i32(x), 0)
    digit = lambda x: digit0 + i32(x)
    grid = state.grid.astype(jnp.int32)
    bad = conflicts(grid)
    kinds = jnp.where(grid == 0, _EMPTY, jnp.where(state.givens, _GIVEN, jnp.where(
        bad, _CONFLICTING, _WRITTEN)))
    seg_table = np.zeros((5, 2, 4), np.int32)  # [previous kind + 1, border, kind]
    for (prev, border, k), text in self._segments.items():
      seg_table[prev + 1, border, k] = ids[text]
    border = np.array([j > 0 and j % b == 0 for j in range(n)], np.int32)
    prev = jnp.concatenate([jnp.full((n, 1), -1), kinds[:, :-1]], axis=1)
    segs = jnp.asarray(seg_table)[prev + 1, border[None, :], kinds]
    cells = jnp.stack([segs, jnp.where(grid > 0, digit(grid), 0)], -1).reshape(n, -1)
    closer = jnp.asarray([0, ids["]"], ids["*"], 0])[kinds[:, -1]]
    rows = jnp.concatenate([cells, closer[:, None], jnp.full((n, 1), ids["\n"])], 1)
    sep = ids["-" * (3 * n + b - 1) + "\n"]
    parts = [const(_HEADER)]
    for r in range(n):
      if r and r % b == 0:
        parts.append(i32([sep]))
      parts.append(rows[r])
    parts.append(const(_LEGEND))

    # The last move's feedback.
    code, fr, fc, fn = state.feedback[0], state.feedback[1], state.feedback[2], state.feedback[3]
    r0, c0 = jnp.clip(fr - 1, 0, n - 1), jnp.clip(fc - 1, 0, n - 1)
    lead = jnp.asarray([0, ids[_UNPARSED_TEXT]] + [ids[t] for t in _RANGE_LEADS]
                       + [ids[_GIVEN_TEXT], ids[_CONFLICT_TEXT], ids[_CORRECT_TEXT],
                          ids[_PLACED_TEXT]])[jnp.clip(code, 0, PLACED)]
    parts.append(lead[None])
    in_range = (code >= BAD_ROW) & (code <= BAD_NUM)
    wrong = state.feedback[1 + jnp.clip(code - BAD_ROW, 0, 2)]
    parts.append(show(in_range, environment.number_symbols(
        jnp.clip(wrong, 0, sudoku_parser.MAX_VALUE), digit0, int_digits=9)))
    parts.append(show(in_range, [ids[f" is out of range (1-{n})"]]))
    cell = lambda: [digit(fr), ids[","], digit(fc)]
    parts.append(show(code == GIVEN, cell() + [ids[")"]]))
    is_conflict = code == CONFLICT
    flags = unit_flags(grid, r0, c0, fn) & is_conflict
    parts.append(show(is_conflict, [digit(fn)]))
    first = jnp.argmax(flags)
    unit_text = lambda u: jnp.where(first == u, ids[_FIRST_UNIT[u]],
                                    ids[_NEXT_UNIT[u]] if u else 0)
    parts.append(show(flags[0], [unit_text(0), digit(fr)]))
    parts.append(show(flags[1], [unit_text(1), digit(fc)]))
    parts.append(show(flags[2], [unit_text(2), digit(r0 // b + 1), ids[","],
                                 digit(c0 // b + 1), ids[")"]]))
    valid_here = candidates(grid)[r0, c0] & is_conflict
    parts.append(show(jnp.any(valid_here), [ids[_VALID_FOR]] + cell() + [ids["): ["]]))
    parts.append(self._number_list(valid_here))
    placed = (code == CORRECT) | (code == PLACED)
    parts.append(show(placed, [digit(fn), ids[" at ("]] + cell()))
    parts.append(show(placed, [jnp.where(code == CORRECT, ids[")"], ids[_NOT_OPTIMAL])]))
    parts.append(show(placed & is_solved(grid), [ids[_SOLVED_TEXT]]))

    # Conflicts, then valid numbers of the empty cells.
    parts.append(show(jnp.any(bad), [ids[_CONFLICTS_HEAD]]))
    rr, cc = np.divmod(np.arange(n * n), n)
    listed = jnp.stack([jnp.full((n * n,), ids[_CONFLICT_CELL]), digit(rr + 1),
                        jnp.full((n * n,), ids[","]), digit(cc + 1),
                        jnp.full((n * n,), ids["): "]), digit(grid.reshape(-1))], 1)
    parts.append(jnp.where(bad.reshape(-1, 1), listed, 0).reshape(-1))
    empty = (grid == 0).reshape(-1)
    num_empty = jnp.sum(empty)
    listing = (num_empty > 0) & (num_empty <= _MAX_LISTED)
    parts.append(show(listing, [ids[_VALID_HEAD]]))
    first_empty = jnp.nonzero(empty, size=_MAX_LISTED, fill_value=-1)[0]
    cand = candidates(grid).reshape(n * n, n)
    for k in range(_MAX_LISTED):
      at = jnp.maximum(first_empty[k], 0)
      nums = cand[at] & listing & (first_empty[k] >= 0) & ~state.givens.reshape(-1)[at]
      parts.append(show(jnp.any(nums), [ids[_VALID_CELL], digit(at // n + 1), ids[","],
                                        digit(at % n + 1), ids["): ["]]))
      parts.append(self._number_list(nums))

    # Progress and steps.
    filled, initial = jnp.sum(grid != 0), jnp.sum(state.givens)
    count = lambda x, k: environment.number_symbols(i32(x), digit0, int_digits=k)
    parts += [const(_PROGRESS), count(filled, 2), const(f"/{n * n} cells filled ("),
              count(initial, 2), const(" initial, "), count(filled - initial, 2),
              const(" placed)\nSteps: "), count(state.steps, 3), const(f"/{self.max_steps}")]
    return jnp.concatenate([i32(p).reshape(-1) for p in parts])

  def _number_list(self, present: jax.Array) -> jax.Array:
    """int32 [2n + 1]: ``"1, 3, 4]"`` for digits ``present`` (bool [n]); all 0 if none."""
    ids = self._id
    first = jnp.argmax(present)
    k = jnp.arange(self.size)
    seps = jnp.where(present & (k > first), ids[", "], 0)
    pairs = jnp.stack([seps, jnp.where(present, ids["1"] + k, 0)], 1).reshape(-1)
    return jnp.concatenate([pairs, jnp.where(jnp.any(present), ids["]"], 0)[None]])

  def __repr__(self) -> str:
    return (f"Sudoku(size={self.size}, num_empty={self._num_empty}, "
            f"max_answer_bytes={self.max_answer_bytes})")


# RAGEN's empty-cell counts: int(n * n * 0.4) for easy, int(n * n * 0.5) for medium.
registration.register(
    "Sudoku-4x4-v0", lambda **kw: Sudoku(**{"size": 4, "num_empty": 6, "max_actions": 10, **kw}))
registration.register(
    "Sudoku-9x9-easy-v0", lambda **kw: Sudoku(**{"num_empty": 32, "max_actions": 20, **kw}))
registration.register(
    "Sudoku-9x9-medium-v0", lambda **kw: Sudoku(**{"num_empty": 40, "max_actions": 30, **kw}))
