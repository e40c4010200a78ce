"""Tests of the Sokoban level generator and the host BFS solver.

Generator statistics on 10,000 levels per procedural id: every level solvable
(BFS, and the BFS plan replayed in the JAX env solves it exactly on its last
step), the optimal-length distribution (printed; RAGEN's SimpleSokoban has
median about 3-4 and range 1-11), distinct levels, fallback count. BFS
optimality is checked against an independent plain-Python BFS on a subsample.
"""

import collections
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import boxoban_levels
from envs_jax._src import sokoban
from envs_jax._src import sokoban_solver

N_LEVELS = 10_000


@functools.lru_cache(maxsize=None)
def generated(env_id):
  """(env, levels, info) for N_LEVELS keys; one compile and run per id."""
  env = envs_jax.make(env_id)[0].unwrapped
  keys = jax.random.split(jax.random.key(2026), N_LEVELS)
  levels, info = jax.device_get(jax.jit(jax.vmap(env.generate))(keys))
  return env, levels, info


def python_bfs_length(fixed, boxes, player):
  """Independent reference: plain BFS over (player, frozenset(boxes))."""
  h, w = fixed.shape
  targets = frozenset(zip(*np.nonzero(fixed == sokoban.TARGET)))
  start = ((int(player[0]), int(player[1])), frozenset(zip(*np.nonzero(boxes))))
  seen = {start}
  queue = collections.deque([(start, 0)])
  while queue:
    (p, bs), d = queue.popleft()
    if bs <= targets:
      return d
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
      one = (p[0] + dr, p[1] + dc)
      if not (0 <= one[0] < h and 0 <= one[1] < w) or fixed[one] == sokoban.WALL:
        continue
      nbs = bs
      if one in bs:
        two = (one[0] + dr, one[1] + dc)
        if (not (0 <= two[0] < h and 0 <= two[1] < w) or fixed[two] == sokoban.WALL
            or two in bs):
          continue
        nbs = (bs - {one}) | {two}
      nxt = (one, nbs)
      if nxt not in seen:
        seen.add(nxt)
        queue.append((nxt, d + 1))
  return None


def replay(env, levels, actions, lengths):
  """Plays padded plans; returns (solved exactly at the end, solved earlier)."""
  params = env.default_params

  def one(state, acts, n):
    def body(carry, xs):
      state, done_early = carry
      t, a = xs
      _, new, _, term, _, _ = env.step(jax.random.key(0), state, a, params)
      live = t < n
      state = envs_jax.tree_select(live, new, state)
      done_early = done_early | (live & term & (t < n - 1))
      return (state, done_early), None

    (state, early), _ = jax.lax.scan(
        body, (state, jnp.zeros((), jnp.bool_)),
        (jnp.arange(acts.shape[0]), acts))
    solved = jnp.all(~state.boxes | (state.fixed == sokoban.TARGET))
    return solved, early

  return jax.jit(jax.vmap(one))(levels, actions, lengths)


class GeneratorStatisticsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("simple_6x6_1box", "Sokoban-6x6-1box-v0", (3, 5), 0.60, 300),
      ("larger_8x8_2box", "Sokoban-8x8-2box-v0", None, 0.95, 100),
  )
  def test_statistics(self, env_id, median_range, min_distinct, n_reference):
    env, levels, info = generated(env_id)
    nb = env.num_boxes

    # Well-formed: walls on the border, nb boxes off targets, player free.
    self.assertTrue(np.all(levels.fixed[:, [0, -1], :] == sokoban.WALL))
    self.assertTrue(np.all(levels.fixed[:, :, [0, -1]] == sokoban.WALL))
    np.testing.assert_array_equal(levels.boxes.sum(axis=(1, 2)), nb)
    np.testing.assert_array_equal((levels.fixed == sokoban.TARGET).sum(axis=(1, 2)), nb)
    self.assertFalse(np.any(levels.boxes & (levels.fixed != sokoban.EMPTY)))
    idx = np.arange(N_LEVELS)
    pr, pc = levels.player[:, 0], levels.player[:, 1]
    self.assertTrue(np.all(levels.fixed[idx, pr, pc] != sokoban.WALL))
    self.assertFalse(np.any(levels.boxes[idx, pr, pc]))

    sols = sokoban_solver.solve_sokoban_batch(levels.fixed, levels.boxes, levels.player)
    statuses = collections.Counter(s.status for s in sols)
    self.assertEqual(statuses, {"solved": N_LEVELS})
    lengths = np.asarray([s.length for s in sols])
    hist = np.bincount(lengths)
    distinct = len({levels.fixed[i].tobytes() + levels.boxes[i].tobytes()
                    + levels.player[i].tobytes() for i in range(N_LEVELS)}) / N_LEVELS
    fallbacks = int(info.fallback.sum())
    print(f"\n{env_id}: optimal lengths over {N_LEVELS} levels: median "
          f"{np.median(lengths)}, mean {lengths.mean():.2f}, range "
          f"{lengths.min()}-{lengths.max()}, histogram {dict(enumerate(hist.tolist()))}; "
          f"distinct {distinct:.4f}; fallbacks {fallbacks}; rounds "
          f"{np.bincount(info.rounds).tolist()}")
    self.assertGreaterEqual(lengths.min(), 1)  # never solved at reset
    self.assertEqual(fallbacks, 0)
    self.assertTrue(np.all(info.score > 0))
    self.assertTrue(np.all((info.rounds >= 1)
                           & (info.rounds <= env.generator_config.max_rounds)))
    self.assertTrue(np.all(info.displacement >= nb))
    if nb == 1:  # score = box_swaps (1) * displacement
      np.testing.assert_array_equal(info.score, info.displacement)
    if median_range is not None:
      self.assertBetween(float(np.median(lengths)), *median_range)
    self.assertGreaterEqual(distinct, min_distinct)

    # Every BFS plan solves its level in the env, exactly on its last step.
    plans = np.zeros((N_LEVELS, lengths.max()), np.int32)
    for i, s in enumerate(sols):
      plans[i, :len(s.actions)] = s.actions
    solved, early = replay(env, jax.tree.map(jnp.asarray, levels),
                           jnp.asarray(plans), jnp.asarray(lengths))
    self.assertTrue(bool(jnp.all(solved)))
    self.assertFalse(bool(jnp.any(early)))

    # Optimality against an independent BFS on a subsample.
    for i in range(n_reference):
      self.assertEqual(
          python_bfs_length(levels.fixed[i], levels.boxes[i], levels.player[i]),
          lengths[i], f"level {i}")


class GeneratorTest(absltest.TestCase):

  def test_fallback_is_used_and_solvable(self):
    # A 5x5 room with one 3x3 stamp has at most 4 floor cells: never enough
    # for 3 boxes + player, so every round fails.
    cfg = sokoban.GeneratorConfig(height=5, width=5, num_boxes=3, topology_steps=1,
                                  max_rounds=2)
    level, info = jax.jit(lambda k: sokoban.generate_level(k, cfg))(jax.random.key(0))
    self.assertTrue(bool(info.fallback))
    self.assertEqual(int(info.rounds), 2)
    chex.assert_trees_all_equal(jax.device_get(level),
                                sokoban.fallback_level(5, 5, 3))
    sol = sokoban_solver.solve_sokoban(level.fixed, level.boxes, level.player)
    self.assertEqual(sol.status, "solved")
    self.assertLen(sol.actions, 7)  # D; U,R,D; U,R,D

  def test_config_errors(self):
    with self.assertRaisesRegex(ValueError, "width must be an int >= 5"):
      sokoban.GeneratorConfig(width=3)
    with self.assertRaisesRegex(ValueError, "max_rounds"):
      sokoban.GeneratorConfig(max_rounds=0)
    with self.assertRaisesRegex(ValueError, "player_move_prob"):
      sokoban.GeneratorConfig(player_move_prob=(0.5,))
    self.assertEqual(sokoban.GeneratorConfig(height=6, width=6).num_topology_steps, 20)
    self.assertEqual(sokoban.GeneratorConfig(height=8, width=8).num_topology_steps, 27)


def _level(*rows):
  t = sokoban.levels_from_ascii(np.asarray([[ord(c) for c in r] for r in rows], np.uint8))
  return t.fixed[0], t.boxes[0], t.player[0]


class SolverTest(parameterized.TestCase):

  def test_hand_built_optimal(self):
    sol = sokoban_solver.solve_sokoban(*_level(
        "######",
        "#@   #",
        "#  $ #",
        "#  . #",
        "######"))
    self.assertEqual(sol.status, "solved")
    self.assertEqual(sol.actions, (3, 3, 1))  # Right, Right, Down
    self.assertEqual(sol.length, 3)
    self.assertTrue(sol.solved)

  def test_already_solved(self):
    sol = sokoban_solver.solve_sokoban(*_level("#####", "#@* #", "#####"))
    self.assertEqual((sol.status, sol.actions, sol.nodes), ("solved", (), 1))

  @parameterized.parameters(True, False)
  def test_unsolvable_box_in_corner(self, dense):
    sol = sokoban_solver.solve_sokoban(*_level(
        "#####",
        "#@ .#",
        "#  $#",
        "#####"), dense=dense)
    self.assertEqual(sol.status, "unsolvable")
    self.assertIsNone(sol.length)
    self.assertEqual(sol.actions, ())
    self.assertEqual(sol.nodes, 5)  # the player's 5 reachable cells

  def test_caps(self):
    level = _level(
        "######",
        "#@   #",
        "#  $ #",
        "#  . #",
        "######")
    self.assertEqual(sokoban_solver.solve_sokoban(*level, max_depth=2).status, "capped")
    self.assertEqual(sokoban_solver.solve_sokoban(*level, max_depth=3).status, "solved")
    capped = sokoban_solver.solve_sokoban(*level, max_nodes=3)
    self.assertEqual(capped.status, "capped")
    self.assertGreater(capped.nodes, 3)

  def test_dense_and_sorted_agree(self):
    _, levels, _ = generated("Sokoban-8x8-2box-v0")
    args = (levels.fixed[:300], levels.boxes[:300], levels.player[:300])
    dense = sokoban_solver.solve_sokoban_batch(*args, dense=True)
    sparse = sokoban_solver.solve_sokoban_batch(*args, dense=False)
    self.assertEqual([s.length for s in dense], [s.length for s in sparse])
    self.assertEqual([s.nodes for s in dense], [s.nodes for s in sparse])

  def test_boxoban_level_with_node_cap(self):
    text = boxoban_levels.subset_file("unfiltered-test").read_text()
    grid = next(iter(boxoban_levels.parse_levels(text)))[1]
    table = sokoban.levels_from_ascii(grid)
    sol = sokoban_solver.solve_sokoban_batch(table.fixed, table.boxes, table.player,
                                             max_nodes=2000)[0]
    self.assertEqual(sol.status, "capped")
    self.assertBetween(sol.nodes, 2001, 2000 * 5)

  def test_plan_cache_follows_optimal_plans(self):
    _, levels, _ = generated("Sokoban-8x8-2box-v0")
    fixed, boxes, player = (np.asarray(x[:40]) for x in (levels.fixed, levels.boxes,
                                                         levels.player))
    cache = sokoban_solver.PlanCache()
    first = cache.solve(fixed, boxes, player)
    fresh = sokoban_solver.solve_sokoban_batch(fixed, boxes, player)
    self.assertEqual([s.status for s in first], [s.status for s in fresh])
    self.assertEqual([s.actions for s in first], [s.actions for s in fresh])
    for i, sol in enumerate(fresh):
      if not sol.solved or len(sol.actions) < 2:
        continue
      # Two moves along the plan: the cache answers without a search (nodes
      # 0), with a plan as short as a fresh search's, that solves the level.
      b, p = boxes[i], player[i]
      for a in sol.actions[:2]:
        b, p = sokoban_solver.apply_move(fixed[i], b, p, a)
      cached = cache.solve(fixed[i][None], b[None], p[None])[0]
      searched = sokoban_solver.solve_sokoban(fixed[i], b, p)
      self.assertEqual((cached.status, cached.nodes), ("solved", 0))
      self.assertLen(cached.actions, searched.length)
      for a in cached.actions:
        b, p = sokoban_solver.apply_move(fixed[i], b, p, a)
      np.testing.assert_array_equal(b, b & (fixed[i] == sokoban.TARGET))
    # A failed search is cached per node cap; clearing bounds the memory.
    level = _level("#####", "#@ .#", "#  $#", "#####")
    small = sokoban_solver.PlanCache(max_states=1)
    for _ in range(2):
      (sol,) = small.solve(*(x[None] for x in level))
      self.assertEqual(sol.status, "unsolvable")
    self.assertLessEqual(len(small._plans) + len(small._failed), 2)  # pylint: disable=protected-access
    with self.assertRaisesRegex(ValueError, "max_states must be an int >= 1, got 0"):
      sokoban_solver.PlanCache(max_states=0)
    with self.assertRaisesRegex(ValueError, "action must be 0..3.*got -1"):
      sokoban_solver.apply_move(*level, -1)

  def test_errors(self):
    fixed, boxes, player = _level("#####", "#@$.#", "#####")
    with self.assertRaisesRegex(ValueError, "need fixed"):
      sokoban_solver.solve_sokoban_batch(fixed, boxes, player)
    with self.assertRaisesRegex(ValueError, "max_nodes"):
      sokoban_solver.solve_sokoban(fixed, boxes, player, max_nodes=0)
    with self.assertRaisesRegex(ValueError, "player off the grid or on a wall"):
      sokoban_solver.solve_sokoban(fixed, boxes, np.asarray([0, 0]))
    more = boxes.copy()
    more[1, 3] = True
    with self.assertRaisesRegex(ValueError, "same number of boxes"):
      sokoban_solver.solve_sokoban_batch(
          np.stack([fixed, fixed]), np.stack([boxes, more]), np.stack([player, player]))


if __name__ == "__main__":
  absltest.main()
