"""Tests of the Sudoku ids: generator, parser, rules and text against RAGEN's rules in plain Python.

The plain-Python reference below is written from RAGEN-2's
``ragen/env/sudoku`` (``parse_action``, ``step``, ``_render_with_feedback``):
bytes regexes (ASCII ``\\d``/``\\s``, as the device parser), the validity
rules, the rewards and the text. Each id's reset and step compile once
(batch ``BATCH``).
"""

import math
import re

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import sudoku
from envs_jax._src import sudoku_parser
from envs_jax._src import sudoku_solver
from jagent import rollout
from jagent import tokenizers

IDS = ("Sudoku-4x4-v0", "Sudoku-9x9-easy-v0", "Sudoku-9x9-medium-v0")
GIVENS = {"Sudoku-4x4-v0": 10, "Sudoku-9x9-easy-v0": 49, "Sudoku-9x9-medium-v0": 41}
BATCH = 48
TOK = tokenizers.load_tiny_tokenizer()

# ---------------------------------------------------------------- reference
_PATTERNS = (rb"place\s+(\d+)\s+at\s+row\s+(\d+)\s+col\s+(\d+)",
             rb"place\s+(\d+)\s+at\s+\((\d+),\s*(\d+)\)",
             rb"place\s+(\d+)\s+at\s+(\d+),\s*(\d+)",
             rb"(\d+)\s+at\s+(\d+),\s*(\d+)",
             rb"\((\d+),\s*(\d+),\s*(\d+)\)",
             rb"(\d+),\s*(\d+),\s*(\d+)")


def ref_parse(answer: bytes, n: int):
  """RAGEN's parse_action: ``(code, R, C, N)`` with R, C, N as written (1-based)."""
  text = answer.split(b"\0")[0].strip().lower()
  for pattern in _PATTERNS:
    m = re.search(pattern, text)
    if m:
      a, b, c = (min(int(g), sudoku_parser.MAX_VALUE) for g in m.groups())
      r, col, num = (b, c, a) if (b"place" in text or b"at" in text) else (a, b, c)
      for code, v in ((sudoku.BAD_ROW, r), (sudoku.BAD_COL, col), (sudoku.BAD_NUM, num)):
        if not 1 <= v <= n:
          return code, r, col, num
      return sudoku_parser.OK, r, col, num
  return sudoku.UNPARSED, 0, 0, 0


def ref_unit_flags(grid, r, c, num):
  b = math.isqrt(len(grid))
  r0, c0 = r // b * b, c // b * b
  return [num in grid[r], num in grid[:, c], num in grid[r0:r0 + b, c0:c0 + b]]


def ref_valid_numbers(grid, r, c):
  if grid[r, c]:
    return []
  return [v for v in range(1, len(grid) + 1) if not any(ref_unit_flags(grid, r, c, v))]


def ref_conflicts(grid):
  n, b = len(grid), math.isqrt(len(grid))
  out = set()
  for r in range(n):
    for c in range(n):
      v = grid[r, c]
      if v and (sum(grid[r] == v) > 1 or sum(grid[:, c] == v) > 1 or np.sum(
          grid[r // b * b:r // b * b + b, c // b * b:c // b * b + b] == v) > 1):
        out.add((r, c))
  return out


def ref_step(grid, givens, solution, answer: bytes):
  """RAGEN's step: ``(grid, reward, solved, feedback text, feedback code)``."""
  n = len(grid)
  code, r, c, num = ref_parse(answer, n)
  if code == sudoku.UNPARSED:
    return grid, -0.1, False, ("❌ Invalid action format: Could not parse action. Expected "
                               "format: 'place 5 at row 2 col 3' or '2,3,5'"), (code, r, c, num)
  if code != sudoku_parser.OK:
    what, v = {sudoku.BAD_ROW: ("Row", r), sudoku.BAD_COL: ("Column", c),
               sudoku.BAD_NUM: ("Number", num)}[code]
    return grid, -0.1, False, (f"❌ Invalid action format: {what} {v} is out of range "
                               f"(1-{n})"), (code, r, c, num)
  r0, c0 = r - 1, c - 1
  if givens[r0, c0]:
    return grid, -0.1, False, f"❌ Cannot modify initial cell at ({r},{c})", (sudoku.GIVEN, r, c,
                                                                            num)
  flags = ref_unit_flags(grid, r0, c0, num)
  if any(flags):
    b = math.isqrt(n)
    names = [f"row {r}", f"column {c}", f"box ({r0 // b + 1},{c0 // b + 1})"]
    text = f"❌ Invalid placement: {num} conflicts with " + ", ".join(
        x for x, f in zip(names, flags) if f)
    valid = ref_valid_numbers(grid, r0, c0)
    if valid:
      text += f"\n   Valid numbers for ({r},{c}): {valid}"
    return grid, -0.1, False, text, (sudoku.CONFLICT, r, c, num)
  grid = grid.copy()
  grid[r0, c0] = num
  correct = num == solution[r0, c0]
  text = (f"✓ Correct! Placed {num} at ({r},{c})" if correct
          else f"⚠ Placed {num} at ({r},{c}) - Valid but not optimal")
  reward = 1.0 if correct else 0.5
  solved = bool(np.all(grid) and not ref_conflicts(grid))
  if solved:
    text += "\n🎉 Congratulations! Puzzle solved!"
    reward += 10.0
  return grid, reward, solved, text, (sudoku.CORRECT if correct else sudoku.PLACED, r, c, num)


def ref_render(grid, givens, steps, feedback: str) -> str:
  """RAGEN's ``_render_with_feedback`` (conflicts and valid numbers shown)."""
  n, b = len(grid), math.isqrt(len(grid))
  bad = ref_conflicts(grid)
  lines = []
  for i in range(n):
    if i and i % b == 0:
      lines.append("-" * (3 * n + b - 1))
    row = ""
    for j in range(n):
      if j and j % b == 0:
        row += "| "
      v = grid[i, j]
      row += (" . " if not v else f"[{v}]" if givens[i, j] else f"*{v}*" if (i, j) in bad
              else f" {v} ")
    lines.append(row.rstrip())
  out = ["=" * 50, "SUDOKU PUZZLE", "=" * 50] + lines + [
      "", "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty"]
  if feedback:
    out += ["", feedback]
  if bad:
    out += ["", "⚠ CONFLICTS DETECTED:"] + [f"  - Cell ({r + 1},{c + 1}): {grid[r, c]}"
                                          for r, c in sorted(bad)]
  empty = list(zip(*np.nonzero(grid == 0)))
  if empty and len(empty) <= 10:
    out += ["", "💡 VALID NUMBERS FOR EMPTY CELLS:"]
    for r, c in empty[:10]:
      valid = ref_valid_numbers(grid, r, c)
      if not givens[r, c] and valid:
        out.append(f"  - ({r + 1},{c + 1}): {valid}")
  filled, initial = int(np.sum(grid != 0)), int(np.sum(givens))
  out += ["", f"Progress: {filled}/{n * n} cells filled ({initial} initial, "
              f"{filled - initial} placed)", f"Steps: {steps}/{n * n}"]
  return "\n".join(out)


# --------------------------------------------------- shared test functions
_ENVS = {}


def compiled(env_id):
  """(env, params, batched reset, batched step), built once per id."""
  if env_id not in _ENVS:
    env, params = envs_jax.make(env_id)
    _ENVS[env_id] = (env, params, jax.jit(jax.vmap(env.reset, in_axes=(0, None))),
                     jax.jit(jax.vmap(env.step, in_axes=(None, 0, 0, None))))
  return _ENVS[env_id]


def encode(texts, env):
  return jnp.asarray(np.stack([envs_jax.encode_countdown_answer(t, env.max_answer_bytes)
                               for t in texts]))


def row(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


def random_answer(rng, n, expert):
  """A mix of expert moves, in-range and out-of-range moves in every format, and junk."""
  r, c, v = rng.integers(0, n + 2, 3)
  choice = rng.integers(0, 10)
  return [expert, expert, f"{r},{c},{v}", f"place {v} at row {r} col {c}",
          f"PLACE {v} AT ({r}, {c})", f"{v} at {r},{c}", f"({r},{c},{v})",
          f"I think that {r}, {c},{v}", "no idea", f"place {v}  at\trow {r} col   {c} || 1,1,1",
          ][choice]


class GeneratorTest(parameterized.TestCase):

  @parameterized.parameters(*IDS)
  def test_unique_exact_and_distinct(self, env_id):
    # 1,000 resets per id (10,000 per id were checked once outside the
    # suite): one solution each (the host solver counts up to 2), the
    # registered number of givens, the givens agree with the stored
    # solution, and at least 95% of the puzzles are distinct.
    env, params, reset, _ = compiled(env_id)
    states = [jax.device_get(reset(jax.random.split(jax.random.key(k), BATCH), params)[1])
              for k in range(1000 // BATCH + 1)]
    grid = np.concatenate([s.grid for s in states])[:1000].astype(np.int64)
    solution = np.concatenate([s.solution for s in states])[:1000]
    givens = np.concatenate([s.givens for s in states])[:1000]
    self.assertTrue(np.all((grid != 0) == givens))
    self.assertTrue(np.all(givens.sum((1, 2)) == GIVENS[env_id]))
    self.assertTrue(np.all(np.where(givens, grid == solution, True)))
    for g, s in zip(grid, solution):
      sols = sudoku_solver.solve_sudoku(g, limit=2)
      self.assertLen(sols, 1)
      np.testing.assert_array_equal(sols[0], s)
    self.assertGreaterEqual(len({g.tobytes() for g in grid}), 950)
    self.assertEqual(env.max_steps, env.size ** 2)

  def test_same_key_same_puzzle(self):
    _, params, reset, _ = compiled("Sudoku-4x4-v0")
    keys = jax.random.split(jax.random.key(5), BATCH)
    a, b = reset(keys, params)[1], reset(keys, params)[1]
    jax.tree.map(np.testing.assert_array_equal, a, b)


class ParserTest(absltest.TestCase):

  def test_good_and_malformed_by_hand(self):
    cases = {  # answer -> (code, R, C, N)
        "place 5 at row 2 col 3": (0, 2, 3, 5),
        "2,3,5": (0, 2, 3, 5),
        "  2, 3,   5  ": (0, 2, 3, 5),
        "Place 7 AT (1, 9)": (0, 1, 9, 7),
        "place 4 at 6,8": (0, 6, 8, 4),
        "9 at 1,2": (0, 1, 2, 9),
        "(3,4,5)": (0, 3, 4, 5),
        "that is 2,3,5": (0, 3, 5, 2),  # "at" anywhere: read as N, R, C (RAGEN)
        "place 5 at row 10 col 3": (sudoku.BAD_ROW, 10, 3, 5),
        "0,1,1": (sudoku.BAD_ROW, 0, 1, 1),
        "1,0,1": (sudoku.BAD_COL, 1, 0, 1),
        "1,1,0": (sudoku.BAD_NUM, 1, 1, 0),
        "1,1,123456789012": (sudoku.BAD_NUM, 1, 1, sudoku_parser.MAX_VALUE),
        "1,1,0000000000007": (0, 1, 1, 7),
        "place five at row 2 col 3": (sudoku.UNPARSED, 0, 0, 0),
        "2 3 5": (sudoku.UNPARSED, 0, 0, 0),
        "": (sudoku.UNPARSED, 0, 0, 0),
        "1,2": (sudoku.UNPARSED, 0, 0, 0),
        "row 2 col 3: 5": (sudoku.UNPARSED, 0, 0, 0),
        "ünïcode ☃ 1,2,3": (0, 1, 2, 3),
        "1,2\x003": (sudoku.UNPARSED, 0, 0, 0),  # bytes after a NUL are ignored
    }
    parse = jax.jit(jax.vmap(lambda a: sudoku_parser.parse_move(a, 9)))
    answers = np.stack([envs_jax.encode_countdown_answer(t, 64) for t in cases])
    kind, rcn = map(np.asarray, parse(jnp.asarray(answers)))
    for (text, want), k, x in zip(cases.items(), kind, rcn):
      self.assertEqual((int(k), *x.tolist()), want, text)
      self.assertEqual(ref_parse(text.encode(), 9), want, text)

  def test_fuzz_against_reference(self):
    # 4,096 answers: RAGEN's six forms with random numbers, spacing and
    # case, some with a character dropped or junk around them, and pieces
    # glued at random: the device parser equals the bytes-regex reference.
    rng = np.random.default_rng(0)
    pick = lambda xs: xs[rng.integers(len(xs))]
    ws = lambda: pick(["", " ", "  ", "\t", "\n "])
    num = lambda: pick(["0", "1", "5", "9", "10", "05", "12345678901"])
    forms = [lambda: f"place{ws()}{num()}{ws()}at{ws()}row{ws()}{num()}{ws()}col{ws()}{num()}",
             lambda: f"place{ws()}{num()}{ws()}at{ws()}({num()},{ws()}{num()})",
             lambda: f"place{ws()}{num()}{ws()}at{ws()}{num()},{ws()}{num()}",
             lambda: f"{num()}{ws()}at{ws()}{num()},{ws()}{num()}",
             lambda: f"({num()},{ws()}{num()},{ws()}{num()})",
             lambda: f"{num()},{ws()}{num()},{ws()}{num()}"]
    pieces = ["place", "at", "row", "col", "(", ")", ",", " ", "1", "10", "that", "x", "||", "é"]
    texts = []
    for _ in range(4096):
      t = pick(forms)() if rng.random() < 0.7 else "".join(rng.choice(pieces, 8))
      if rng.random() < 0.3:
        t = t.upper() if rng.random() < 0.5 else t.title()
      if rng.random() < 0.3 and t:
        i = rng.integers(len(t))
        t = t[:i] + t[i + 1:]
      if rng.random() < 0.3:
        t = pick(["I think ", "that ", "x", "1,"]) + t + pick([" || 2,2,2", ".", " at"])
      texts.append(t)
    parse = jax.jit(jax.vmap(lambda a: sudoku_parser.parse_move(a, 9)))
    answers = np.stack([envs_jax.encode_countdown_answer(t, 64) for t in texts])
    kind, rcn = map(np.asarray, parse(jnp.asarray(answers)))
    got = [(int(k), *x.tolist()) for k, x in zip(kind, rcn)]
    want = [ref_parse(bytes(a), 9) for a in answers]
    self.assertEqual(got, want)
    for code in range(5):  # every outcome is common
      self.assertGreater(np.mean(kind == code), 0.03, code)


class RulesTest(parameterized.TestCase):

  @parameterized.parameters(*IDS)
  def test_episodes_equal_reference(self, env_id):
    # 48 episodes x 14 moves mixing expert moves with valid, invalid,
    # out-of-range, given-cell and malformed answers in every format: each
    # move's grid, reward, ends, info and text equal the reference's, and the
    # text's symbols tokenize as the whole text (the tiny tokenizer).
    env, params, reset, step = compiled(env_id)
    n = env.size
    _, state = reset(jax.random.split(jax.random.key(1), BATCH), params)
    rng = np.random.default_rng(2)
    host = jax.device_get(state)
    grids = [np.asarray(host.grid[i], np.int64) for i in range(BATCH)]
    seen = set()
    for t in range(14):
      states = [row(host, i) for i in range(BATCH)]
      experts = env.expert_answers(states, [params] * BATCH)
      texts = [random_answer(rng, n, e) for e in experts]
      _, state, reward, term, trunc, info = step(jax.random.key(0), state, encode(texts, env),
                                                 params)
      host, reward, term, trunc, info = jax.device_get((state, reward, term, trunc, info))
      for i in range(BATCH):
        grids[i], r, solved, fb, code = ref_step(grids[i], np.asarray(host.givens[i]),
                                                 np.asarray(host.solution[i]), texts[i].encode())
        np.testing.assert_array_equal(host.grid[i], grids[i], texts[i])
        self.assertAlmostEqual(float(reward[i]), r, places=5, msg=texts[i])
        self.assertEqual((bool(term[i]), bool(info["success"][i])), (solved, solved))
        self.assertEqual(bool(info["action_valid"][i]), code[0] in (sudoku.CORRECT,
                                                                     sudoku.PLACED))
        self.assertEqual(bool(info["correct_placement"][i]), code[0] == sudoku.CORRECT)
        self.assertFalse(trunc[i])  # 14 moves < n * n
        self.assertEqual(tuple(host.feedback[i]), code)
        seen.add(code[0])
        s = row(host, i)
        text = env.render_text(s)
        self.assertEqual(text, ref_render(grids[i], np.asarray(s.givens), t + 1, fb))
        if i % 8 == 0:
          ids = np.asarray(env.render_symbols(s))
          self.assertEqual(TOK.encode(text),
                           [x for k in ids if k for x in TOK.encode(env.symbols[k])])
    self.assertContainsSubset({sudoku.UNPARSED, sudoku.BAD_ROW, sudoku.GIVEN, sudoku.CONFLICT,
                               sudoku.CORRECT, sudoku.PLACED}, seen)
    if n == 4:
      self.assertGreater(int(np.sum(info["success"])) + sum(
          np.all(g != 0) for g in grids), 0)  # some puzzles solved

  def test_hand_state_with_conflicts_and_text(self):
    env, params, _, _ = compiled("Sudoku-4x4-v0")
    grid = np.array([[1, 0, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 0]])
    givens = np.array([[1, 0, 1, 1], [1, 1, 1, 1], [1, 0, 0, 1], [1, 1, 1, 0]], bool)
    grid[2, 1] = 3  # a written 3 clashing with a given 3 in its row and one in its column
    state = sudoku.SudokuState(
        grid=jnp.asarray(grid, jnp.int8), givens=jnp.asarray(givens),
        solution=jnp.asarray([[1, 2, 3, 4], [3, 4, 1, 2], [2, 1, 4, 3], [4, 3, 2, 1]], jnp.int8),
        steps=jnp.int32(7), feedback=jnp.asarray([sudoku.PLACED, 3, 2, 3], jnp.int32))
    want = ("=" * 50 + "\nSUDOKU PUZZLE\n" + "=" * 50 + "\n"
            "[1] . | [3][4]\n[3][4]| [1][2]\n-------------\n[2]*3*|  4 [3]\n[4][3]| [2] .\n\n"
            "Legend: [N]=initial cell, N=user-placed, *N*=conflict, .=empty\n\n"
            "⚠ Placed 3 at (3,2) - Valid but not optimal\n\n⚠ CONFLICTS DETECTED:\n"
            "  - Cell (3,2): 3\n  - Cell (3,4): 3\n  - Cell (4,2): 3\n\n"
            "💡 VALID NUMBERS FOR EMPTY CELLS:\n  - (1,2): [2]\n  - (4,4): [1]\n\n"
            "Progress: 14/16 cells filled (12 initial, 2 placed)\nSteps: 7/16")
    self.assertEqual(env.render_text(state), want)
    self.assertEqual(ref_render(grid, givens, 7, "⚠ Placed 3 at (3,2) - Valid but not optimal"),
                     want)
    del params

  @parameterized.parameters(*IDS)
  def test_prompts_agree_with_the_tokenizer(self, env_id):
    rollout.TextEnv(compiled(env_id)[0], TOK, verify_states=16)

  @parameterized.parameters("Sudoku-4x4-v0", "Sudoku-9x9-easy-v0")
  def test_prompt_width_holds_feedback_and_listings(self, env_id):
    # The states that size the prompt include a move's feedback and boards of
    # at most 10 empty cells (the valid-number listing): before they did,
    # every turn after the first overflowed the prompt (only resets were
    # drawn). The states of a moved or near-solved board from other keys fit.
    env, params, _, _ = compiled(env_id)
    draw = jax.jit(jax.vmap(lambda k: env.text_sizing_state(k, params)))
    states = jax.device_get(draw(jax.random.split(jax.random.key(3), 256)))
    empty = (states.grid == 0).sum((1, 2))
    self.assertTrue(np.any(states.feedback[:, 0] != sudoku.NONE))
    self.assertTrue(np.any((empty >= 1) & (empty <= 10) & (states.feedback[:, 0] != sudoku.NONE)))
    self.assertTrue(np.all(np.where(states.givens, states.grid == states.solution, True)))
    text_env = rollout.TextEnv(env, TOK, verify_states=8)
    longest = max(len(TOK.encode(env.render_text(jax.tree.map(lambda x, i=i: x[i], states))))
                  for i in range(0, 256, 4))
    self.assertLessEqual(longest, text_env._state_len)  # pylint: disable=protected-access

  def test_expert_solves_and_earns_the_bonus(self):
    env, params, reset, step = compiled("Sudoku-4x4-v0")
    _, state = reset(jax.random.split(jax.random.key(3), BATCH), params)
    total = np.zeros(BATCH)
    for _ in range(6):
      host = jax.device_get(state)
      answers = env.expert_answers([row(host, i) for i in range(BATCH)], [params] * BATCH)
      _, state, reward, term, _, info = step(jax.random.key(0), state, encode(answers, env),
                                             params)
      total += np.asarray(reward)
    np.testing.assert_array_equal(np.asarray(term), True)
    np.testing.assert_allclose(total, 16.0, rtol=1e-5)  # 6 correct moves and the bonus
    self.assertTrue(np.all(np.asarray(info["success"])))

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "size"):
      sudoku.Sudoku(size=6)
    with self.assertRaisesRegex(ValueError, "num_empty"):
      sudoku.Sudoku(size=4, num_empty=17)
    with self.assertRaisesRegex(ValueError, "uint8"):
      env, params, _, _ = compiled("Sudoku-4x4-v0")
      env.step(jax.random.key(0), env.reset(jax.random.key(0), params)[1],
               jnp.zeros((3,), jnp.uint8), params)
    with self.assertRaisesRegex(ValueError, "square"):
      sudoku_solver.solve_sudoku(np.zeros((3, 4)))


if __name__ == "__main__":
  absltest.main()
