"""Pins the public surface of jagent.losses (docstrings: tests/api_test.py)."""

from absl.testing import absltest

from jagent import losses

_EXPECTED = {
    "AGGREGATION_MODES", "Aggregate", "AdvantagesAndReturns", "FILTER_MODES",
    "FORMAT_PENALTY", "FilterConfig", "FilterResult", "GigpoAdvantages", "KL_ESTIMATORS",
    "PolicyLoss", "RunningNormState", "ValueLoss", "aggregate", "as_groups",
    "bilevel_gae", "clipped_value_loss", "discounted_returns",
    "dr_grpo_advantages", "entropy_from_logits", "filter_groups",
    "format_penalty", "gae", "gigpo_advantages", "group_std",
    "grpo_advantages", "gspo_loss", "importance_ratio", "kl_penalty",
    "masked_whiten", "policy_gradient_loss", "ppo_clip_loss",
    "reinforce_pp_advantages", "reinforce_pp_baseline_advantages",
    "rloo_advantages", "running_norm_apply", "running_norm_init",
    "running_norm_update", "safe_ratio", "seq_mean_token_mean",
    "seq_mean_token_sum", "seq_mean_token_sum_norm", "token_mean",
    "token_to_turn_rewards", "truncated_importance_weights", "turn_ends",
    "turn_mask", "turn_to_token_rewards",
}


class ApiTest(absltest.TestCase):

  def test_surface(self):
    self.assertEqual(set(losses.__all__), _EXPECTED)
    for name in losses.__all__:
      self.assertTrue(hasattr(losses, name), name)



if __name__ == "__main__":
  absltest.main()
