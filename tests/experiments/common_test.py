"""experiments.common: validate's errors named as config fields; SFT rows in each history mode.

ValidateTest builds no model and compiles nothing: validate only reads the config.
"""

from absl import app
from absl import flags
from absl import logging
from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from experiments import common
from experiments.configs import ragen
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


  def test_empty_stop_steps(self):
    self.assertEqual(_config()["rl"]["empty_stop_steps"], 0)  # never
    self.assertEqual(ragen.get_config("Sokoban-6x6-1box-v0,starpo_s").rl.empty_stop_steps, 5)
    common.validate(_config(**{"rl.empty_stop_steps": 3}))
    old = _config()
    del old.rl["empty_stop_steps"]  # a run saved before the field: never
    common.validate(old)
    for value in (-1, 2.5, True, "5"):
      c = _config()
      with c.rl.ignore_type():
        c.rl.empty_stop_steps = value
      with self.assertRaisesRegex(
          ValueError, rf"^config\.rl\.empty_stop_steps={value!r}: must be an int >= 0"):
        common.validate(c)


class WilsonIntervalTest(absltest.TestCase):

  def test_by_hand(self):
    z2 = 1.959963984540054 ** 2
    # No success in 10: [0, z^2 / (n + z^2)]; all 10: [n / (n + z^2), 1].
    lo, hi = common.wilson_interval(0.0, 10)
    self.assertAlmostEqual(lo, 0.0, places=12)
    self.assertAlmostEqual(hi, z2 / (10 + z2), places=12)
    self.assertAlmostEqual(hi, 0.27753, places=5)
    lo, hi = common.wilson_interval(1.0, 10)
    self.assertAlmostEqual(lo, 10 / (10 + z2), places=12)
    self.assertAlmostEqual(hi, 1.0, places=12)
    # Half of 512 levels: centred on 0.5, half width
    # 1.96 sqrt(0.25/512 + 3.8415/(4 * 512^2)) / (1 + 3.8415/512) = 0.04315
    # (the normal approximation's 0.04331).
    lo, hi = common.wilson_interval(0.5, 512)
    self.assertAlmostEqual((lo + hi) / 2, 0.5, places=12)
    self.assertAlmostEqual(hi - 0.5, 0.04315, places=5)
    # 0.479 of 512 (the main job's): centre pulled towards 0.5.
    lo, hi = common.wilson_interval(0.479, 512)
    self.assertAlmostEqual(lo, 0.43606, places=4)
    self.assertAlmostEqual(hi, 0.52227, places=4)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "n=0"):
      common.wilson_interval(0.5, 0)
    with self.assertRaisesRegex(ValueError, "rate=1.5"):
      common.wilson_interval(1.5, 10)


class QuietLogsTest(absltest.TestCase):
  """absl INFO messages are off under app.run unless --verbosity is given."""

  def test_warning_unless_the_flag_is_given(self):
    self.assertIn(common.quiet_logs, app._init_callbacks)  # pylint: disable=protected-access
    flag = flags.FLAGS["verbosity"]
    present, level = flag.present, logging.get_verbosity()
    self.addCleanup(setattr, flag, "present", present)
    self.addCleanup(logging.set_verbosity, level)
    for given, want in ((0, logging.WARNING), (1, logging.INFO)):
      flag.present = given
      logging.set_verbosity(logging.INFO)  # what app.run sets without the flag
      common.quiet_logs()
      self.assertEqual(logging.get_verbosity(), want, given)


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
