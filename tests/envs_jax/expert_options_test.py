"""Each game takes and checks its own expert options (``expert_defaults`` / ``expert_options``)."""

from absl.testing import absltest
from absl.testing import parameterized

import envs_jax

# Boxoban ids build Sokoban over a level table; one procedural id covers the class.
ENV_IDS = tuple(i for i in envs_jax.registered() if not i.startswith("Boxoban"))


class ExpertOptionsTest(parameterized.TestCase):

  @parameterized.parameters(*ENV_IDS)
  def test_defaults_and_an_unknown_option(self, env_id):
    env, _ = envs_jax.make(env_id)  # most are wrapped in TimeLimit, which forwards the hooks
    self.assertEqual(env.expert_options({}), dict(env.expert_defaults))
    pattern = rf"^{env.name}: unknown expert option 'no_such_option' \({env.name}'s expert takes: "
    with self.assertRaisesRegex(ValueError, pattern):
      env.expert_options({"no_such_option": 1})
    with self.assertRaisesRegex(ValueError, pattern):
      env.expert_answers([], [], no_such_option=1)

  def test_the_games_with_options(self):
    takes = {i: tuple(sorted(envs_jax.make(i)[0].expert_defaults)) for i in ENV_IDS}
    self.assertEqual(takes["Sokoban-6x6-1box-v0"], ("max_nodes", "reuse_plans"))
    self.assertEqual(takes["FrozenLake-4x4-v0"], ("frozen_lake_policy", "gamma"))
    self.assertEqual(takes["RubiksCube-2x2-v0"], ("cube_max_depth",))
    for env_id in ("Bandit-v0", "Countdown-v0", "Sudoku-4x4-v0", "Game2048-4x4-v0"):
      self.assertEqual(takes[env_id], (), env_id)
    self.assertEqual(envs_jax.make("Sokoban-6x6-1box-v0")[0].expert_defaults["max_nodes"],
                     envs_jax.SOKOBAN_MAX_NODES)

  @parameterized.parameters(
      ("Sokoban-6x6-1box-v0", {"max_nodes": 0}, "^Sokoban: max_nodes must be an int >= 1, got 0$"),
      ("Sokoban-6x6-1box-v0", {"reuse_plans": 1}, "^Sokoban: reuse_plans must be a bool, got 1$"),
      ("FrozenLake-4x4-v0", {"frozen_lake_policy": "greedy"},
       r"^FrozenLake: frozen_lake_policy='greedy'; use one of \('shortest', 'max_success'\)$"),
      ("FrozenLake-4x4-v0", {"gamma": 1.0}, r"^FrozenLake: gamma=1.0 must be in \(0, 1\)$"),
      ("RubiksCube-2x2-v0", {"cube_max_depth": 15},
       r"^RubiksCube: cube_max_depth must be an int in \[0, 14\], got 15$"),
  )
  def test_bad_values(self, env_id, options, pattern):
    env, _ = envs_jax.make(env_id)
    with self.assertRaisesRegex(ValueError, pattern):
      env.expert_options(options)

  def test_given_options_override_the_defaults(self):
    env, _ = envs_jax.make("FrozenLake-4x4-v0")
    self.assertEqual(env.expert_options({"gamma": 0.5}),
                     {"frozen_lake_policy": "shortest", "gamma": 0.5})


if __name__ == "__main__":
  absltest.main()
