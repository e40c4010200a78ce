"""Tests of ``experiments.benchmarks.ceilings`` on cases with known answers (no timing)."""

import types

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import frozen_lake_solver
from envs_jax._src import game_2048
from experiments.benchmarks import ceilings


class CeilingTest(absltest.TestCase):

  def test_deterministic_lake_ceiling_is_the_share_of_short_enough_paths(self):
    # On deterministic ice the shortest-path expert succeeds exactly on the levels
    # whose BFS path fits the moves: 5 turns of 1 action, or 5 x 2 (10 moves).
    env_id, n = "FrozenLake-4x4-det-v0", 16
    env, params = envs_jax.make(env_id)
    keys = jax.random.split(jax.random.key(123), n)
    states = jax.device_get(jax.vmap(lambda k: env.reset(k, params)[1])(keys))
    while hasattr(states, "env_state"):
      states = states.env_state
    lengths = np.array([len(frozen_lake_solver.solve_frozen_lake(states.tiles[i],
                                                                 states.player[i]))
                        for i in range(n)])
    self.assertTrue(0 < np.mean(lengths <= 5) < np.mean(lengths <= 10))  # the case tells
    for k, moves in ((1, 5), (2, 10)):
      out = ceilings.measure(env_id, num_levels=n, actions_per_turn=k,
                             options={"frozen_lake_policy": "shortest"})
      self.assertAlmostEqual(out["success"], np.mean(lengths <= moves), places=6)
      self.assertEqual((out["max_turns"], out["actions_per_turn"]), (5, k))
      self.assertEqual(out["format_valid_frac"], 1.0)

  def test_random_valid_2048_moves_only_validly(self):
    # First board: only Down changes it; second (a 2 in the top row): all but Up.
    only_down = np.zeros((4, 4), np.int32)
    only_down[0] = [2, 4, 2, 4]
    boards = [only_down, np.array([[0, 2, 0, 0]] + [[0] * 4] * 3, np.int32)]
    hosts = [types.SimpleNamespace(state=game_2048.Game2048State(
        board=jnp.asarray(b), score=jnp.int32(0))) for b in boards]
    expert = ceilings.Random2048Valid(actions_per_turn=1, seed=0)
    picks = [expert([0, 1], hosts, ["", ""]) for _ in range(40)]
    self.assertEqual({p[0] for p in picks}, {"<answer>Down</answer>"})
    self.assertEqual({p[1] for p in picks},
                     {f"<answer>{a}</answer>" for a in ("Right", "Down", "Left")})
    self.assertEqual(expert([], [], []), [])

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "actions_per_turn=11"):
      ceilings.ceiling_config("Sokoban-6x6-1box-v0", actions_per_turn=11)
    with self.assertRaisesRegex(ValueError, "num_levels"):
      ceilings.ceiling_config("Sokoban-6x6-1box-v0", num_levels=0)
    env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
    with self.assertRaisesRegex(ValueError, "random_valid"):
      ceilings.expert(env, "random_valid", 1)
    with self.assertRaisesRegex(ValueError, "policy='best'"):
      ceilings.expert(env, "best", 1)


if __name__ == "__main__":
  absltest.main()
