"""Tests of RubiksCube-2x2-v0: moves vs Jumanji, RAGEN's text and rules, scrambles, solver.

The tests share a few compiled programs (``STEP``, ``RESETS`` at batch
``N_LEVELS``; params are traced, so other depths do not recompile): compiles
are what these tests cost.
"""

import collections

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import rubiks_cube
from envs_jax._src import rubiks_cube_rules
from envs_jax._src import rubiks_cube_solver
from experiments.benchmarks import peers

ENV, PARAMS = envs_jax.make("RubiksCube-2x2-v0")
NAMES = ENV.action_names
STEP = jax.jit(ENV.step)
RESETS = jax.jit(jax.vmap(ENV.reset, in_axes=(0, None)))
N_LEVELS = 10_000


def act(name):
  return jnp.int32(NAMES.index(name))


def play(state, names):
  out = None
  for n in names:
    out = STEP(jax.random.key(0), state, act(n), PARAMS)
    state = out[1]
  return out


def state_of(stickers):
  return rubiks_cube.RubiksCubeState(stickers=jnp.asarray(stickers, jnp.int8),
                                     steps=jnp.int32(0))


def solved_state():
  return state_of(rubiks_cube.SOLVED)


def apply_host(stickers, actions):
  for a in actions:
    stickers = stickers[rubiks_cube.MOVES[a]]
  return stickers


def host_is_solved(stickers):
  f = np.asarray(stickers).reshape(6, 4)
  return bool(np.all(f == f[:, :1]))


@absltest.skipIf(not peers.HAVE_JUMANJI, "jumanji is not installed")
class JumanjiTest(absltest.TestCase):

  def test_state_after_every_move_equals_jumanji(self):
    # 1000 cubes x 10 random moves = 10,000 moves. Stickers carry their own
    # position labels 0..23 (both envs only permute them), so any mismatch
    # of a single sticker shows; the face/move mapping is documented in
    # experiments/benchmarks/peers.py.
    from jumanji.environments.logic.rubiks_cube import utils as jutils  # pylint: disable=g-import-not-at-top
    batch, steps = 1000, 10
    labels = jnp.broadcast_to(jnp.arange(24, dtype=jnp.int8), (batch, 24))
    ours = rubiks_cube.RubiksCubeState(stickers=labels, steps=jnp.zeros((batch,), jnp.int32))
    actions = np.asarray(jax.random.randint(jax.random.key(0), (steps, batch), 0, 12))
    to_j = peers.CUBE_ACTION_TO_JUMANJI
    ours_step = jax.jit(jax.vmap(ENV.step, in_axes=(None, 0, 0, None)))
    theirs_step = jax.jit(jax.vmap(jutils.rotate_cube))
    as_jumanji = jax.jit(jax.vmap(peers.cube_to_jumanji))
    theirs = as_jumanji(labels)
    for a in actions:
      ours = ours_step(jax.random.key(0), ours, a, PARAMS)[1]
      theirs = theirs_step(theirs, to_j[a])
      np.testing.assert_array_equal(np.asarray(as_jumanji(ours.stickers)), np.asarray(theirs))
    self.assertEqual(set(actions.ravel().tolist()), set(range(12)))


class MovesTest(absltest.TestCase):

  def test_u_from_solved_by_hand(self):
    # RAGEN's U: the top rows cycle Front <- Right <- Back <- Left <- Front.
    _, s, reward, terminated, truncated, info = play(solved_state(), ["U"])
    self.assertEqual(
        ENV.render_text(s),
        "=== Rubik's Cube 2x2 State ===\nStep: 1/20\n\n"
        "Up (U):    [W, W]\n [W, W]\nLeft (L):  [G, G]\n [O, O]\n"
        "Front (F): [R, R]\n [G, G]\nRight (R): [B, B]\n [R, R]\n"
        "Back (B):  [O, O]\n [B, B]\nDown (D):  [Y, Y]\n [Y, Y]\n\n"
        "Available Actions:\nU, U', D, D', L, L', R, R', F, F', B, B'\n\n"
        "What is your next move?")
    self.assertEqual((float(reward), bool(terminated), bool(truncated)), (0.0, False, False))
    self.assertTrue(bool(info["action_effective"]))

  def test_each_move_is_a_quarter_turn_that_keeps_corners_whole(self):
    geometry = rubiks_cube_rules._sticker_geometry()
    corners = collections.defaultdict(set)
    for i, (pos, _) in enumerate(geometry):
      corners[pos].add(i)
    triples = {frozenset(c) for c in corners.values()}
    for a, perm in enumerate(rubiks_cube.MOVES):
      dest = np.empty(24, int)
      dest[perm] = np.arange(24)
      self.assertTrue(all(frozenset(dest[list(t)]) in triples for t in triples), NAMES[a])
      self.assertEqual(int(np.sum(perm != np.arange(24))), 12, NAMES[a])  # 4 + 4 x 2 stickers
      once = apply_host(np.arange(24), [a])
      self.assertTrue(np.array_equal(apply_host(once, [a ^ 1]), np.arange(24)))  # X X' = id
      self.assertTrue(np.array_equal(apply_host(np.arange(24), [a] * 4), np.arange(24)))

  def test_ragen_b_differs_in_four_stickers(self):
    # RAGEN's _move_B writes D(22, 23) -> R(13, 15) and L(6, 4) -> D(22, 23);
    # the quarter turn sends D22 to R15, D23 to R13, L4 to D22, L6 to D23.
    b = rubiks_cube.MOVES[NAMES.index("B")]
    self.assertEqual([int(b[13]), int(b[15]), int(b[22]), int(b[23])], [23, 22, 4, 6])


class RulesTest(absltest.TestCase):

  def test_solving_ends_with_reward_one(self):
    s = state_of(apply_host(rubiks_cube.SOLVED, [NAMES.index("F'")]))
    first = rubiks_cube_solver.solve_rubiks_cube(np.asarray(s.stickers))
    self.assertLen(first, 1)
    _, s2, reward, terminated, truncated, info = play(s, [NAMES[first[0]]])
    self.assertEqual((float(reward), bool(terminated), bool(truncated), bool(info["success"])),
                     (1.0, True, False, True))
    self.assertTrue(ENV.render_text(s2).endswith("]\n\n=== Game Over: Cube Solved! ==="))
    self.assertTrue(host_is_solved(s2.stickers))

  def test_a_cube_solved_at_reset_shows_the_moves(self):
    # Depth 2 scrambles such as U U' leave the cube solved; RAGEN's reset
    # renders with done=False: the moves and the question, not "Game Over".
    keys = jax.random.split(jax.random.key(3), 64)
    _, states = jax.vmap(ENV.reset, in_axes=(0, None))(
        keys, PARAMS.replace(scramble_depth=jnp.int32(2)))
    stickers = np.asarray(states.stickers)
    # The scrambles X X' (1/12 of depth-2 walks) give back the solved cube
    # itself; others (L R', ...) turn the whole cube and are solved too.
    solved = [i for i, s in enumerate(stickers) if np.array_equal(s, rubiks_cube.SOLVED)]
    self.assertNotEmpty(solved)
    s = jax.tree.map(lambda x: x[solved[0]], states)
    self.assertEqual(
        ENV.render_text(s),
        "=== Rubik's Cube 2x2 State ===\nStep: 0/20\n\n"
        "Up (U):    [W, W]\n [W, W]\nLeft (L):  [O, O]\n [O, O]\n"
        "Front (F): [G, G]\n [G, G]\nRight (R): [R, R]\n [R, R]\n"
        "Back (B):  [B, B]\n [B, B]\nDown (D):  [Y, Y]\n [Y, Y]\n\n"
        "Available Actions:\nU, U', D, D', L, L', R, R', F, F', B, B'\n\n"
        "What is your next move?")
    # A move that solves it again ends the game, as a move does in RAGEN.
    _, s2, reward, terminated, *_ = play(s, ["U", "U'"])
    self.assertEqual((float(reward), bool(terminated)), (1.0, True))
    self.assertTrue(ENV.render_text(s2).endswith("]\n\n=== Game Over: Cube Solved! ==="))

  def test_any_orientation_counts_as_solved(self):
    # U D' turns the whole cube: every face is still one colour.
    _, _, reward, terminated, _, _ = play(solved_state(), ["U", "D'"])
    self.assertEqual((float(reward), bool(terminated)), (1.0, True))

  def test_twenty_unsolving_moves_truncate(self):
    # (R U)^10: R U has order 15 on the 2x2 cube, and odd prefixes cannot be solved.
    out = play(solved_state(), ["R", "U"] * 10)
    _, s, reward, terminated, truncated, info = out
    self.assertEqual((float(reward), bool(terminated), bool(truncated), bool(info["success"])),
                     (0.0, False, True, False))
    self.assertIn("Step: 20/20\n", ENV.render_text(s))
    self.assertTrue(ENV.render_text(s).endswith("\n\n=== Game Over: Max steps reached. ==="))

  def test_bad_arguments_raise(self):
    for kw in ({"max_steps": 0}, {"scramble_depth": -1}, {"scramble_depth": 40},
               {"max_scramble_depth": 0}):
      with self.assertRaisesRegex(ValueError, list(kw)[0]):
        rubiks_cube.RubiksCube(**kw)
    with self.assertRaisesRegex(ValueError, "out of range"):
      ENV.step(jax.random.key(0), solved_state(), 12, PARAMS)
    with self.assertRaisesRegex(ValueError, "max_depth"):
      rubiks_cube_solver.solve_rubiks_cube(rubiks_cube.SOLVED, max_depth=15)
    with self.assertRaisesRegex(ValueError, "four of each"):
      rubiks_cube_solver.solve_rubiks_cube(np.zeros(24, np.int8))


class GeneratorTest(absltest.TestCase):

  def test_scrambles_are_ragen_uniform_walks(self):
    n, depth = N_LEVELS, 5
    keys = jax.random.split(jax.random.key(0), n)
    stickers = np.asarray(RESETS(keys, PARAMS)[1].stickers)
    table = rubiks_cube_solver.distance_table(depth)
    dist = np.asarray([table.get(s.astype(np.uint8).tobytes(), -1) for s in stickers])
    # Solvable within the depth, and an odd number of quarter turns from solved.
    self.assertTrue(np.all(np.isin(dist, (1, 3, 5))), collections.Counter(dist.tolist()))
    # The exact distribution of the end of a uniform 5-move walk (all 12^5
    # walks): its expected number of distinct cubes in n draws, and the share
    # of cubes 1 move from solved (walks like U U' U' U X and X Y Y').
    walks = np.tile(rubiks_cube.SOLVED, (12 ** depth, 1))
    for a in np.indices((12,) * depth).reshape(depth, -1):
      walks = np.take_along_axis(walks, rubiks_cube.MOVES[a], axis=1)
    _, counts = np.unique(walks, axis=0, return_counts=True)
    p = counts / counts.sum()
    expected = float(np.sum(1.0 - (1.0 - p) ** n))
    distinct = len({s.tobytes() for s in stickers})
    self.assertAlmostEqual(distinct / n, expected / n, delta=0.015)
    walk_dist = collections.Counter(
        table[w.astype(np.uint8).tobytes()] for w in walks[::7])
    share1 = walk_dist[1] / sum(walk_dist.values())
    self.assertAlmostEqual(float(np.mean(dist == 1)), share1, delta=0.01)

  def test_deeper_scrambles_are_distinct(self):
    keys = jax.random.split(jax.random.key(1), N_LEVELS)
    s = RESETS(keys, PARAMS.replace(scramble_depth=jnp.int32(12)))[1].stickers
    self.assertGreaterEqual(len({r.tobytes() for r in np.asarray(s)}) / N_LEVELS, 0.95)


class SolverTest(absltest.TestCase):

  def test_table_counts_match_the_known_quarter_turn_distribution(self):
    # Positions of the 2x2 cube with one corner fixed, by quarter-turn
    # distance (OEIS A079761): 1, 6, 27, 120, 534, 2256; x24 orientations.
    dist = collections.Counter(rubiks_cube_solver.distance_table(5).values())
    self.assertEqual([dist[d] for d in range(6)],
                     [24 * c for c in (1, 6, 27, 120, 534, 2256)])

  def test_optimal_against_plain_bfs(self):
    rng = np.random.default_rng(0)
    for _ in range(12):
      cube = apply_host(rubiks_cube.SOLVED, rng.integers(0, 12, rng.integers(1, 8)))
      path = rubiks_cube_solver.solve_rubiks_cube(cube, max_depth=10)
      self.assertTrue(host_is_solved(apply_host(cube, path)))
      # Plain BFS on the solved predicate, up to 3 moves, as a lower bound.
      frontier, shortest = [cube], None
      for d in range(4):
        if any(host_is_solved(c) for c in frontier):
          shortest = d
          break
        frontier = [c[m] for c in frontier for m in rubiks_cube.MOVES]
      if shortest is not None:
        self.assertLen(path, shortest)
      else:
        self.assertGreater(len(path), 3)
    table = rubiks_cube_solver.distance_table(5)
    five = np.frombuffer(next(k for k, d in table.items() if d == 5), np.uint8)
    self.assertIsNone(rubiks_cube_solver.solve_rubiks_cube(five, max_depth=4))
    self.assertLen(rubiks_cube_solver.solve_rubiks_cube(five, max_depth=5), 5)

  def test_expert_solves_every_scramble_in_optimal_moves(self):
    keys = jax.random.split(jax.random.key(2), N_LEVELS)
    states = jax.tree.map(lambda x: x[:8], jax.device_get(RESETS(keys, PARAMS)[1]))
    step = STEP
    for i in range(8):
      s = jax.tree.map(lambda x, i=i: x[i], states)
      optimal = len(rubiks_cube_solver.solve_rubiks_cube(s.stickers))
      for _ in range(optimal):
        names = ENV.expert_answers([jax.device_get(s)], [PARAMS], actions_per_turn=1)[0]
        _, s, reward, terminated, _, _ = step(jax.random.key(0), s, act(names), PARAMS)
      self.assertTrue(bool(terminated) and float(reward) == 1.0)
    answer = ENV.expert_answers([jax.tree.map(lambda x: x[0], states)], [PARAMS],
                                actions_per_turn=4)[0]
    self.assertLessEqual(len(answer.split(" || ")), 4)


if __name__ == "__main__":
  absltest.main()
