"""Tests of envs_jax Sokoban: dynamics, rewards, text, jit/vmap, reproducibility.

Hand-built levels use Boxoban characters ('#' wall, ' ' floor, '.' target,
'$' box, '*' box on target, '@' player, '+' player on target). Expected values
are hand-computed from gym-sokoban's rules (``gym_sokoban/envs/sokoban_env.py``), and the
property tests compare every step with a small pure-Python reference step.
"""

import doctest
import os
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from envs_jax._src import sokoban
from envs_jax._src import sokoban_solver
from envs_jax._src import wrappers
from tests import testenv

UP, DOWN, LEFT, RIGHT = 0, 1, 2, 3


def make_level(*rows: str) -> sokoban.SokobanState:
  """One level (jax arrays) from equal-length rows of Boxoban characters."""
  grid = np.asarray([[ord(c) for c in r] for r in rows], np.uint8)
  table = sokoban.levels_from_ascii(grid)
  return jax.tree.map(lambda x: jnp.asarray(x[0]), table)


ENV = sokoban.Sokoban()  # default symbols; the level comes from the state.
PARAMS = ENV.default_params
_step = jax.jit(ENV.step)
ENV8, PARAMS8 = envs_jax.make("Sokoban-8x8-2box-v0")
RESET8 = jax.jit(jax.vmap(ENV8.reset, in_axes=(0, None)))  # one compile, shared


def run(state, actions):
  """Steps through ``actions``; returns lists of (state, reward, term, info)."""
  out = []
  for a in actions:
    _, state, reward, term, trunc, info = _step(
        jax.random.key(0), state, jnp.int32(a), PARAMS)
    assert not bool(trunc)
    out.append((state, float(reward), bool(term), info))
  return out


# ------------------------------------------------ pure-Python reference step
def reference_step(fixed, boxes, player, action):
  """gym-sokoban push semantics on numpy arrays; returns the new state + reward."""
  h, w = fixed.shape
  dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[action]
  r, c = int(player[0]), int(player[1])

  def inside(rr, cc):
    return 0 <= rr < h and 0 <= cc < w

  def wall(rr, cc):
    return not inside(rr, cc) or fixed[rr, cc] == sokoban.WALL

  boxes = boxes.copy()
  before = int(np.sum(boxes & (fixed == sokoban.TARGET)))
  r1, c1, r2, c2 = r + dr, c + dc, r + 2 * dr, c + 2 * dc
  moved = False
  if not wall(r1, c1):
    if not boxes[r1, c1]:
      r, c, moved = r1, c1, True
    elif not wall(r2, c2) and not boxes[r2, c2]:
      boxes[r1, c1], boxes[r2, c2] = False, True
      r, c, moved = r1, c1, True
  after = int(np.sum(boxes & (fixed == sokoban.TARGET)))
  solved = after == int(boxes.sum())
  reward = -0.1 + (1.0 if after > before else 0.0) - (1.0 if after < before else 0.0)
  reward += 10.0 if solved else 0.0
  return boxes, np.asarray([r, c]), reward, solved, moved


class DynamicsTest(parameterized.TestCase):

  def test_walk_and_push(self):
    s0 = make_level(
        "#######",
        "#@ $ .#",
        "#######")
    (s1, r1, t1, i1), (s2, r2, t2, i2) = run(s0, [RIGHT, RIGHT])
    np.testing.assert_array_equal(s1.player, [1, 2])
    np.testing.assert_array_equal(s1.boxes, s0.boxes)  # a plain walk
    self.assertTrue(bool(i1["action_effective"]))
    self.assertFalse(bool(i1["box_pushed"]))
    np.testing.assert_array_equal(s2.player, [1, 3])
    self.assertTrue(bool(s2.boxes[1, 4]))
    self.assertFalse(bool(s2.boxes[1, 3]))
    self.assertTrue(bool(i2["box_pushed"]))
    self.assertAlmostEqual(r1, -0.1, places=6)
    self.assertAlmostEqual(r2, -0.1, places=6)
    self.assertFalse(t1 or t2)

  @parameterized.named_parameters(
      ("into_wall", ("#####", "#@$.#", "#####"), UP),
      ("box_into_wall", ("######", "# @$#.", "######"), RIGHT),
      ("box_into_box", ("#######", "#@$$ .#", "#    .#", "#######"), RIGHT),
      ("off_grid_move", ("@ $.",), LEFT),
      ("box_off_grid", (" @$", "  .",), RIGHT),
  )
  def test_blocked_moves_are_noops_that_cost_a_step(self, rows, action):
    s0 = make_level(*rows)
    ((s1, reward, term, info),) = run(s0, [action])
    chex.assert_trees_all_equal(s1, s0)
    self.assertAlmostEqual(reward, -0.1, places=6)
    self.assertFalse(term)
    self.assertFalse(bool(info["action_effective"]))
    self.assertFalse(bool(info["box_pushed"]))

  def test_reward_bookkeeping_on_off_and_solve(self):
    # Two boxes: one onto a target (+1), back off (-1), then both on (+1 +10).
    s0 = make_level(
        "########",
        "#@$. $.#",
        "########")
    steps = run(s0, [RIGHT, RIGHT, RIGHT, RIGHT])
    rewards = [r for _, r, _, _ in steps]
    # Right: box 1 onto its target (+1). Right: box 1 off the target onto
    # floor (-1). Right, Right: box 1 (col 4) is stuck against box 2 (col 5):
    # blocked no-ops.
    np.testing.assert_allclose(rewards, [0.9, -1.1, -0.1, -0.1], atol=1e-6)
    s1 = make_level(
        "########",
        "#@$.$ .#",
        "########")
    # One box onto a target (+0.9); no termination while a box is off.
    ((s, r, t, info),) = run(s1, [RIGHT])
    self.assertAlmostEqual(r, 0.9, places=6)
    self.assertFalse(t)
    self.assertEqual(int(info["boxes_on_target"]), 1)
    self.assertFalse(bool(info["success"]))

  def test_solve_gives_plus_ten(self):
    s0 = make_level(
        "######",
        "#*@$.#",
        "######")
    ((s1, r, t, info),) = run(s0, [RIGHT])
    self.assertAlmostEqual(r, 10.9, places=5)  # -0.1 + 1 + 10
    self.assertTrue(t)
    self.assertTrue(bool(info["success"]))
    self.assertEqual(int(info["boxes_on_target"]), 2)

  @pytest.mark.smoke
  def test_reference_three_step_example(self):
    # gym-sokoban's rewards: solved in 3 steps = -0.1, -0.1, +10.9.
    s0 = make_level(
        "######",
        "#@   #",
        "#  $ #",
        "#  . #",
        "######")
    steps = run(s0, [RIGHT, RIGHT, DOWN])
    np.testing.assert_allclose([r for _, r, _, _ in steps], [-0.1, -0.1, 10.9],
                               atol=1e-5)
    self.assertEqual([t for _, _, t, _ in steps], [False, False, True])

  def test_box_off_target_penalty(self):
    s0 = make_level(
        "#####",
        "#@* #",
        "#   #",
        "#####")
    ((_, r, t, info),) = run(s0, [RIGHT])
    self.assertAlmostEqual(r, -1.1, places=6)
    self.assertFalse(t)
    self.assertEqual(int(info["boxes_on_target"]), 0)

  def test_params_are_used(self):
    s0 = make_level("#####", "#@$.#", "#####")
    params = sokoban.SokobanParams(
        step_reward=jnp.float32(-1.0), box_on_target_reward=jnp.float32(2.0),
        box_off_target_reward=jnp.float32(-3.0), solved_reward=jnp.float32(5.0))
    _, _, reward, term, _, _ = ENV.step(jax.random.key(0), s0, RIGHT, params)
    self.assertAlmostEqual(float(reward), -1.0 + 2.0 + 5.0)
    self.assertTrue(bool(term))

  def test_bad_concrete_action_raises(self):
    s0 = make_level("#####", "#@$.#", "#####")
    with self.assertRaisesRegex(ValueError, "out of range"):
      ENV.step(jax.random.key(0), s0, 4, PARAMS)

  def test_info_structure_is_fixed(self):
    s0 = make_level("#####", "#@$.#", "#####")
    _, _, _, _, _, info = ENV.step(jax.random.key(0), s0, UP, PARAMS)
    self.assertEqual(sorted(info),
                     ["action_effective", "box_pushed", "boxes_on_target", "success"])
    self.assertEqual(info["boxes_on_target"].dtype, jnp.int32)


class TextTest(parameterized.TestCase):

  def test_exact_ragen_text(self):
    s = make_level(
        "######",
        "#+ $ #",
        "#.* $#",
        "######")
    expected = "######\n#S_X_#\n#O√_X#\n######"
    self.assertEqual(ENV.render_text(s), expected)
    ids = np.asarray(ENV.render_symbols(s))
    self.assertEqual("".join(ENV.symbols[i] for i in ids), expected)
    obs = np.asarray(ENV.observation(s))
    self.assertEqual(obs.dtype, np.int8)
    np.testing.assert_array_equal(
        obs[1:3], [[0, 6, 1, 4, 1, 0], [0, 2, 3, 1, 4, 0]])

  def test_player_not_on_target(self):
    s = make_level("####", "#@$.", "####")
    self.assertEqual(ENV.render_text(s), "####\n#PXO\n####")

  def test_alt_symbols_and_legends(self):
    alt = sokoban.Sokoban(symbol_set="alt")
    s = make_level(
        "######",
        "#+ $ #",
        "#.* $#",
        "######")
    self.assertEqual(alt.render_text(s), "WWWWWW\nW@.B.W\nWGC.BW\nWWWWWW")
    self.assertEqual(
        ENV.legend,
        "The meaning of each symbol in the state is:\n#: wall, _: empty, "
        "O: target, √: box on target, X: box, P: player, S: player on target")
    self.assertEqual(
        alt.legend,
        "The meaning of each symbol in the state is:\nW: wall, .: empty, "
        "G: target, C: box on target, B: box, A: player, @: player on target")
    for env in (ENV, alt):
      self.assertEqual(env.symbols[0], "")
      self.assertEqual(env.symbols[-1], "\n")
      self.assertLen(set(env.symbols), len(env.symbols))

  def test_render_text_matches_symbols_for_random_levels(self):
    env = ENV8
    _, states = RESET8(jax.random.split(jax.random.key(3), 8), PARAMS8)
    ids = np.asarray(jax.vmap(env.render_symbols)(states))
    self.assertEqual(ids.shape, (8, 8 * 9 - 1))
    for b in range(8):
      one = jax.tree.map(lambda x, b=b: x[b], states)
      text = env.render_text(one)
      self.assertEqual(text, "".join(env.symbols[i] for i in ids[b]))
      rows = text.split("\n")
      self.assertLen(rows, 8)
      self.assertTrue(all(len(r) == 8 for r in rows))
      self.assertEqual(sum(r.count("P") + r.count("S") for r in rows), 1)
      self.assertEqual(sum(r.count("X") for r in rows), 2)  # none on target


class LevelsTest(parameterized.TestCase):

  def test_levels_from_ascii(self):
    rows = ["#####", "#+*$#", "#   #", "#####"]
    grid = np.asarray([[ord(c) for c in r] for r in rows], np.uint8)
    t = sokoban.levels_from_ascii(np.stack([grid, grid]))
    self.assertEqual(t.fixed.shape, (2, 4, 5))
    self.assertEqual(t.fixed.dtype, np.int8)
    self.assertEqual(t.boxes.dtype, np.bool_)
    self.assertEqual(t.player.dtype, np.int32)
    np.testing.assert_array_equal(t.player, [[1, 1], [1, 1]])
    np.testing.assert_array_equal(t.fixed[0, 1], [0, 2, 2, 1, 0])
    np.testing.assert_array_equal(t.fixed[0, 2], [0, 1, 1, 1, 0])
    np.testing.assert_array_equal(t.boxes[0, 1], [0, 0, 1, 1, 0])

  @parameterized.named_parameters(
      ("unknown_char", ["#####", "#@$x#", "#####"], "unknown character 'x'"),
      ("two_players", ["#####", "#@$@#", "# . #"], "2 players"),
      ("no_player", ["#####", "# $.#", "#####"], "0 players"),
      ("box_target_mismatch", ["#####", "#@$$#", "# . #"], "2 boxes and 1 targets"),
      ("no_boxes", ["#####", "#@  #", "#####"], "0 boxes"),
  )
  def test_levels_from_ascii_errors(self, rows, message):
    grid = np.asarray([[ord(c) for c in r] for r in rows], np.uint8)
    with self.assertRaisesRegex(ValueError, message):
      sokoban.levels_from_ascii(grid)

  def test_level_table_reset_samples_uniformly_by_key(self):
    table = sokoban.levels_from_ascii(np.stack([
        np.asarray([[ord(c) for c in r] for r in rows], np.uint8)
        for rows in (["#####", "#@$.#", "#####"], ["#####", "#.$@#", "#####"])]))
    env = sokoban.Sokoban(levels=table)
    self.assertEqual((env.num_levels, env.height, env.width, env.num_boxes),
                     (2, 3, 5, 1))
    keys = jax.random.split(jax.random.key(0), 400)
    _, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, env.default_params)
    first = np.asarray(states.player[:, 1]) == 1
    self.assertBetween(first.mean(), 0.4, 0.6)
    chex.assert_trees_all_equal(env.level(1), jax.tree.map(lambda x: x[1], table))

  def test_constructor_errors(self):
    with self.assertRaisesRegex(ValueError, "symbol_set"):
      sokoban.Sokoban(symbol_set="emoji")
    with self.assertRaisesRegex(ValueError, "height must be an int >= 5"):
      sokoban.Sokoban(height=4)
    with self.assertRaisesRegex(ValueError, "num_boxes=5 must be <= width - 2"):
      sokoban.Sokoban(width=6, num_boxes=5)
    with self.assertRaisesRegex(ValueError, "reverse_steps"):
      sokoban.Sokoban(reverse_steps=0)
    with self.assertRaisesRegex(ValueError, "probabilities"):
      sokoban.Sokoban(pull_bias=1.5)
    rows = ["#####", "#@$.#", "#####"]
    table = sokoban.levels_from_ascii(np.asarray([[ord(c) for c in r] for r in rows], np.uint8))
    with self.assertRaisesRegex(ValueError, "do not apply to a level table"):
      sokoban.Sokoban(levels=table, reverse_steps=3)
    with self.assertRaisesRegex(ValueError, "no level table"):
      ENV.level(0)
    with self.assertRaisesRegex(ValueError, "level table"):
      sokoban.Sokoban(levels=table).generate(jax.random.key(0))


class RegistrationTest(parameterized.TestCase):

  @parameterized.parameters(
      ("Sokoban-6x6-1box-v0", 6, 1, "default"),
      ("Sokoban-8x8-2box-v0", 8, 2, "default"),
      ("Sokoban-6x6-1box-altsym-v0", 6, 1, "alt"),
  )
  def test_procedural_ids(self, env_id, size, boxes, symbol_set):
    env, params = envs_jax.make(env_id)
    self.assertIsInstance(env, wrappers.TimeLimit)
    self.assertEqual(env.max_steps, 100)
    inner = env.unwrapped
    self.assertIsInstance(inner, envs_jax.Sokoban)
    self.assertEqual((inner.height, inner.width, inner.num_boxes, inner.symbol_set),
                     (size, size, boxes, symbol_set))
    self.assertEqual(env.action_names, ("Up", "Down", "Left", "Right"))
    self.assertEqual(env.legend, inner.legend)
    chex.assert_trees_all_equal(params, inner.default_params)
    self.assertEqual(float(params.step_reward), np.float32(-0.1))

  def test_boxoban_ids_load_lazily(self):
    from envs_jax._src import boxoban_data  # pylint: disable=g-import-not-at-top
    real = boxoban_data.load_levels
    sokoban.boxoban_levels.cache_clear()
    with mock.patch.object(boxoban_data, "load_levels", side_effect=real) as load:
      self.assertEqual(load.call_count, 0)
      env, _ = envs_jax.make("Boxoban-hard-v0")
      load.assert_called_once_with("hard")
      envs_jax.make("Boxoban-hard-v0")  # cached
      self.assertEqual(load.call_count, 1)
    inner = env.unwrapped
    self.assertEqual((inner.num_levels, inner.height, inner.width, inner.num_boxes),
                     (1000, 10, 10, 4))
    text = real("hard")[0].tobytes().decode()
    first = sokoban.levels_from_ascii(real("hard")[:1])
    expect = jax.tree.map(lambda x: x[0], first)
    chex.assert_trees_all_equal(jax.device_get(inner.level(0)), expect)
    self.assertEqual(text[:10], "##########")
    for env_id in ("Boxoban-unfiltered-test-v0", "Boxoban-medium-v0"):
      self.assertIn(env_id, envs_jax.registered())

  def test_import_prepares_no_dataset(self):
    code = ("import os; import envs_jax; "
            "print(sorted(os.listdir(os.environ['JAGENT_DATA_DIR'])))")
    with tempfile.TemporaryDirectory() as tmp:
      env = dict(os.environ, JAGENT_DATA_DIR=tmp, JAX_PLATFORMS="cpu")
      out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                           capture_output=True, text=True).stdout
    self.assertEqual(out.strip(), "[]")


class JitVmapTest(absltest.TestCase):

  @pytest.mark.smoke
  def test_vmap_over_keys_and_params_and_scan(self):
    env, params = envs_jax.make("Sokoban-6x6-1box-v0")
    batch = 16
    keys = jax.random.split(jax.random.key(1), batch)
    stacked = jax.tree.map(lambda x: jnp.stack([x] * batch), params)
    stacked = stacked.replace(step_reward=jnp.linspace(-1.0, 0.0, batch))

    @jax.jit
    def rollout(keys, params):
      obs, state = jax.vmap(env.reset)(keys, params)

      def body(state, key):
        actions = jax.random.randint(key, (batch,), 0, 4)
        out = jax.vmap(env.step)(jax.random.split(key, batch), state, actions, params)
        return out[1], (out[2], out[3], out[5]["action_effective"])

      return obs, jax.lax.scan(body, state, jax.random.split(keys[0], 12))

    obs, (state, (rewards, term, effective)) = rollout(keys, stacked)
    chex.assert_shape(obs, (batch, 6, 6))
    chex.assert_shape(rewards, (12, batch))
    # Each env pays its own step reward plus 0 (nothing), +1 (box on), -1
    # (box off), +11 (last box on: +1 +10) or +10 (stepping on in a solved
    # state: this scan does not reset).
    extra = np.asarray(rewards) - np.asarray(stacked.step_reward)[None, :]
    nearest = np.asarray([0.0, 1.0, -1.0, 10.0, 11.0])
    gap = np.min(np.abs(extra[..., None] - nearest), axis=-1)
    np.testing.assert_array_less(gap, 1e-5)
    np.testing.assert_array_equal(extra > 9.0, np.asarray(term))
    self.assertEqual(state.env_state.fixed.dtype, jnp.int8)

  def test_same_key_same_level_different_keys_differ(self):
    keys = jnp.stack([jax.random.key(7)] * 2 + [jax.random.key(i) for i in range(6)])
    obs, states = RESET8(keys, PARAMS8)
    chex.assert_trees_all_equal(jax.tree.map(lambda x: x[0], (obs, states)),
                                jax.tree.map(lambda x: x[1], (obs, states)))
    texts = {ENV8.render_text(jax.tree.map(lambda x, i=i: x[i], states))
             for i in range(1, 8)}
    self.assertLen(texts, 7)

  def test_reproducible_in_fresh_process(self):
    keys = jax.random.split(jax.random.key(123), 8)
    here = [ENV8.render_text(jax.tree.map(lambda x, i=i: x[i], RESET8(keys, PARAMS8)[1]))
            for i in range(8)]
    code = ("import jax, envs_jax; env, p = envs_jax.make('Sokoban-8x8-2box-v0'); "
            "s = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))("
            "jax.random.split(jax.random.key(123), 8), p)[1]; "
            "print(repr([env.render_text(jax.tree.map(lambda x: x[i], s)) "
            "for i in range(8)]))")
    out = subprocess.run([sys.executable, "-c", code], env=testenv.subprocess_env(8), check=True,
                         capture_output=True, text=True).stdout.strip()
    self.assertEqual(out, repr(here))


class DocstringTest(absltest.TestCase):

  def test_docstring_examples(self):
    for module in (sokoban, sokoban_solver):
      result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
      self.assertGreater(result.attempted, 0, module.__name__)
      self.assertEqual(result.failed, 0, module.__name__)


# ---------------------------------------------------- hypothesis properties
SIZE = 6
T = 24


@jax.jit
def _rollout(state, actions):
  def body(s, a):
    _, s2, r, term, _, info = ENV.step(jax.random.key(0), s, a, PARAMS)
    return s2, (s2, r, term, info["action_effective"], info["boxes_on_target"])
  return jax.lax.scan(body, state, actions)[1]


@st.composite
def levels_and_actions(draw):
  """Random 6x6 rooms (walls anywhere, no forced border) with 1-3 boxes."""
  n_boxes = draw(st.integers(1, 3))
  cells = draw(st.permutations(range(SIZE * SIZE)))
  density = draw(st.integers(0, 3))  # walls on about 0, 1/6, 1/3, 1/2 of cells
  noise = draw(st.lists(st.integers(0, 5), min_size=SIZE * SIZE, max_size=SIZE * SIZE))
  fixed = np.where(np.asarray(noise) < density, 0, 1)
  player = cells[0]
  box_cells = cells[1:1 + n_boxes]
  # Targets may coincide with boxes or the player (both legal).
  target_cells = draw(st.lists(st.sampled_from(cells[:12]), min_size=n_boxes,
                               max_size=n_boxes, unique=True))
  fixed[player] = 1
  fixed[list(box_cells)] = 1
  fixed[list(target_cells)] = 2
  boxes = np.zeros(SIZE * SIZE, bool)
  boxes[list(box_cells)] = True
  actions = draw(st.lists(st.integers(0, 3), min_size=T, max_size=T))
  state = sokoban.SokobanState(
      fixed=jnp.asarray(fixed.reshape(SIZE, SIZE), jnp.int8),
      boxes=jnp.asarray(boxes.reshape(SIZE, SIZE)),
      player=jnp.asarray([player // SIZE, player % SIZE], jnp.int32))
  return state, np.asarray(actions, np.int32)


class PropertyTest(absltest.TestCase):

  @hypothesis.settings(max_examples=120, deadline=None, derandomize=True)
  @hypothesis.given(levels_and_actions())
  def test_matches_reference_and_invariants(self, example):
    state, actions = example
    states, rewards, term, effective, on_target = jax.device_get(
        _rollout(state, jnp.asarray(actions)))
    fixed = np.asarray(state.fixed)
    boxes = np.asarray(state.boxes)
    player = np.asarray(state.player)
    n_boxes = boxes.sum()
    total = 0.0
    for t, a in enumerate(actions):
      host = sokoban_solver.apply_move(fixed, boxes, player, int(a))
      boxes, player, r, solved, moved = reference_step(fixed, boxes, player, int(a))
      np.testing.assert_array_equal(host[0], boxes)
      np.testing.assert_array_equal(host[1], player)
      np.testing.assert_array_equal(states.boxes[t], boxes)
      np.testing.assert_array_equal(states.player[t], player)
      self.assertAlmostEqual(float(rewards[t]), r, places=5)
      self.assertEqual(bool(term[t]), solved)
      self.assertEqual(bool(effective[t]), moved)
      # Invariants: boxes conserved; player never in a wall or a box.
      self.assertEqual(states.boxes[t].sum(), n_boxes)
      pr, pc = states.player[t]
      self.assertNotEqual(fixed[pr, pc], sokoban.WALL)
      self.assertFalse(states.boxes[t][pr, pc])
      self.assertEqual(int(on_target[t]),
                       int((states.boxes[t] & (fixed == sokoban.TARGET)).sum()))
      total += float(rewards[t])
    # Reward sum = steps * step + (on - off changes) + 10 * solved steps.
    on0 = int((np.asarray(state.boxes) & (fixed == sokoban.TARGET)).sum())
    on = np.concatenate([[on0], on_target]).astype(int)
    diffs = np.diff(on)
    expected = -0.1 * T + np.sum(diffs > 0) - np.sum(diffs < 0) + 10.0 * term.sum()
    self.assertAlmostEqual(total, expected, places=3)
    self.assertTrue(np.all(np.abs(diffs) <= 1))


if __name__ == "__main__":
  absltest.main()
