"""The advantage estimators of jagent.transforms (surface: tests/public_api_test.py)."""

from absl.testing import absltest

from jagent import transforms


class ApiTest(absltest.TestCase):

  def test_advantage_names(self):
    self.assertEqual(set(transforms.ADVANTAGE_ESTIMATORS), {
        "gae", "bilevel_gae", "grpo", "dr_grpo", "rloo", "reinforce_pp",
        "reinforce_pp_baseline", "gigpo", "tree_grpo", "tree_step"})


if __name__ == "__main__":
  absltest.main()
