"""experiments.common.validate: the config dataclasses' own checks, named as config fields.

Nothing here builds a model or compiles: validate only reads the config.
"""

from absl.testing import absltest
from absl.testing import parameterized

from experiments import common
from experiments.configs import tiny


def _config(**changes):
  """The tiny Bandit config with ``{"dotted.field": value}`` changes."""
  c = tiny.get_config("Bandit-v0,starpo_s")
  c.update_from_flattened_dict(changes)
  return c


class ValidateTest(parameterized.TestCase):

  def test_tiny_config_is_valid(self):
    common.validate(_config())

  @parameterized.parameters(
      # (config field, its bad value, the dataclass whose check raises)
      ("rl.learning_rate", 0.0, "OptimizerConfig"),
      ("rl.critic_learning_rate", -1.0, "OptimizerConfig"),
      ("rl.decay", "stepwise", "OptimizerConfig"),
      ("rl.warmup_steps", -1, "OptimizerConfig"),
      ("rl.ppo_epochs", 0, "TrainConfig"),
      ("rl.num_minibatches", 0, "TrainConfig"),
      ("rl.num_microbatches", 0, "TrainConfig"),
      ("rl.old_logprobs", "cached", "TrainConfig"),
      ("rollout.group_size", 0, "RolloutConfig"),
      ("rollout.max_turns", -2, "RolloutConfig"),
      ("rollout.temperature", -1.0, "SamplingConfig"),
      ("eval.num_groups", 0, "RolloutConfig"),
      ("eval.temperature", 0.0, "SamplingConfig"),
      ("sft.learning_rate", 0.0, "OptimizerConfig"),
  )
  def test_reraises_the_dataclass_error_naming_the_field(self, field, value, owner):
    with self.assertRaisesRegex(ValueError, rf"^config\.{field}={value!r}: ") as cm:
      common.validate(_config(**{field: value}))
    # The dataclass's own error, chained: validate does not re-check by hand.
    self.assertIsInstance(cm.exception.__cause__, ValueError)
    self.assertTrue(str(cm.exception.__cause__).startswith(owner), cm.exception.__cause__)
    self.assertEqual(str(cm.exception).partition(": ")[2],
                     str(cm.exception.__cause__).partition(": ")[2])

  def test_cross_field_checks_stay(self):
    with self.assertRaisesRegex(ValueError, r"^config\.rl\.num_minibatches=3: does not divide"):
      common.validate(_config(**{"rl.num_minibatches": 3}))
    with self.assertRaisesRegex(ValueError, r"^config\.eval\.num_levels=33: must be a multiple"):
      common.validate(_config(**{"eval.num_levels": 33}))


if __name__ == "__main__":
  absltest.main()
