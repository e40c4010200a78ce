"""Pins the public surface of jagent.transforms (docstrings: tests/api_test.py)."""

from absl.testing import absltest

from jagent import transforms

_EXPECTED = {
    "ADVANTAGE_ESTIMATORS", "Batch", "EmptyState", "KlControllerState",
    "LossOutput", "LossTerm", "ModelOutputs", "Objective", "ObjectiveNeeds",
    "Transform",
    "chain", "compute_bilevel_gae", "compute_dr_grpo", "compute_gae",
    "compute_gigpo", "compute_grpo", "compute_reinforce_pp",
    "compute_reinforce_pp_baseline", "compute_rloo", "dapo", "dr_grpo",
    "entropy_term", "filter_rollouts", "gigpo", "grpo", "gspo_term",
    "identity", "kl_reward_penalty", "kl_term", "make", "make_advantage",
    "make_loss", "normalize_rewards", "objective", "penalize_format",
    "pg_term", "ppo", "ppo_clip_term", "register", "registered",
    "reinforce_pp", "rloo", "starpo", "starpo_s", "stateless",
    "trajectory_scores", "truncate_importance_weights", "value_term",
    "whiten_advantages",
}


class ApiTest(absltest.TestCase):

  def test_surface(self):
    self.assertEqual(set(transforms.__all__), _EXPECTED)
    for name in transforms.__all__:
      self.assertTrue(hasattr(transforms, name), name)

  def test_advantage_names(self):
    self.assertEqual(set(transforms.ADVANTAGE_ESTIMATORS), {
        "gae", "bilevel_gae", "grpo", "dr_grpo", "rloo", "reinforce_pp",
        "reinforce_pp_baseline", "gigpo"})


if __name__ == "__main__":
  absltest.main()
