"""experiments.common: validate's errors named as config fields; SFT rows in each history mode.

ValidateTest builds no model and compiles nothing: validate only reads the config.
"""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

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


  def test_sft_batch_size_counts_turn_rows_in_a_window(self):
    # 8 demonstrations are 8 rows in the full history, up to 8 x max_turns in a window.
    with self.assertRaisesRegex(ValueError, r"^config\.sft\.batch_size=9: is larger than the 8 "):
      common.validate(_config(**{"sft.num_demos": 8, "sft.batch_size": 9}))
    common.validate(_config(**{"sft.num_demos": 8, "sft.batch_size": 9,
                               "rollout.history_turns": 0, "rollout.max_turns": 2}))


class DemonstrationsTest(absltest.TestCase):
  """The SFT demonstrations are rendered in the rollout's history mode."""

  def test_windowed_demonstrations_play_the_same_episodes(self):
    def demos(k):
      c = tiny.get_config("Sokoban-6x6-1box-v0,starpo_s")
      c.rollout.history_turns = k
      c.sft.update(dict(num_demos=8, batch_size=16 if k >= 0 else 8, steps=3))
      exp = common.Experiment(c)
      return exp, exp.demonstrations()

    _, full = demos(-1)
    exp, window = demos(0)
    # The window's context is far shorter than an episode: rendered without the
    # window, every episode would overflow after its first turn.
    self.assertEqual(window.history_turns, 0)
    self.assertLess(window.tokens.shape[1], full.tokens.shape[1])
    np.testing.assert_array_equal(window.num_turns, full.num_turns)
    np.testing.assert_array_equal(window.success, full.success)
    self.assertGreater(int(np.sum(full.num_turns)), 16)
    # One row per turn taken; SFT draws only those rows.
    valid = np.asarray(window.row_valid)
    self.assertEqual(int(valid.sum()), int(np.sum(full.num_turns)))
    idx = exp.sft_batch_indices(valid)
    self.assertEqual(idx.shape, (3, 16))
    self.assertTrue(valid[idx].all())
    self.assertTrue(all(len(set(row)) == 16 for row in idx.tolist()))
    with self.assertRaisesRegex(ValueError, r"^config\.sft\.batch_size=16: is larger than the 3 "):
      exp.sft_batch_indices(np.arange(valid.size) < 3)


if __name__ == "__main__":
  absltest.main()
