"""experiments.compare: config overrides and the comparison table."""

from absl import flags
from absl.testing import absltest

from experiments import common
from experiments import compare
from experiments.configs import tiny


class CompareTest(absltest.TestCase):

  def test_overrides_scoped_by_algorithm_or_cell(self):
    overrides = ["starpo_s:rl.filter_value=0.25", "Bandit-v0,ppo:rl.steps=3"]
    s = compare.apply_overrides(tiny.get_config("Bandit-v0,starpo_s"), "Bandit-v0", overrides)
    self.assertEqual((s.rl.filter_value, s.rl.steps), (0.25, 500))
    p = compare.apply_overrides(tiny.get_config("Bandit-v0,ppo"), "Bandit-v0", overrides)
    self.assertEqual((p.rl.filter_value, p.rl.steps), (1.0, 3))
    lake = compare.apply_overrides(tiny.get_config("FrozenLake-4x4-v0,ppo"),
                                   "FrozenLake-4x4-v0", overrides)
    self.assertEqual(lake.rl.steps, 500)

  def test_overrides_apply_globally_and_per_env(self):
    overrides = ["rl.steps=7", "Bandit-v0:sft.expert=random", "FrozenLake-4x4-v0:rl.steps=9",
                 "rl.learning_rate=2e-4", "prompt.system=Hello there"]
    bandit = compare.apply_overrides(tiny.get_config("Bandit-v0,grpo"), "Bandit-v0", overrides)
    self.assertEqual(bandit.rl.steps, 7)
    self.assertEqual(bandit.sft.expert, "random")
    self.assertEqual(bandit.rl.learning_rate, 2e-4)
    self.assertEqual(bandit.prompt.system, "Hello there")
    lake = compare.apply_overrides(tiny.get_config("FrozenLake-4x4-v0,ppo"),
                                   "FrozenLake-4x4-v0", overrides)
    self.assertEqual(lake.rl.steps, 9)  # the later, scoped override wins
    self.assertEqual(lake.sft.expert, "solver")

  def test_bad_overrides_name_the_item(self):
    c = tiny.get_config("Bandit-v0,grpo")
    with self.assertRaisesRegex(
        common.ConfigError,
        r"^--set='rl\.stepz=3': the config has no field config\.rl\.stepz; closest: "
        r"config\.rl\.steps, config\.sft\.steps$"):
      compare.apply_overrides(c, "Bandit-v0", ["rl.stepz=3"])
    with self.assertRaisesRegex(ValueError, r"--set='rl\.steps'"):
      compare.apply_overrides(c, "Bandit-v0", ["rl.steps"])

  def test_table_rows(self):
    summary = {"env": "Bandit-v0", "algorithm": "grpo", "sft": {"success": 0.5},
               "rl": {"success": 0.875, "greedy_success": 1.0}, "seconds": 90.0}
    self.assertEqual(compare.table([summary]).splitlines()[-1],
                     "| Bandit-v0 | grpo | 0.500 | 0.875 | 1.000 | +37.5 | 1.5 |")


class EntryPointsTest(absltest.TestCase):

  def test_importing_compare_defines_no_flags(self):
    # absl flags are process-global: a module that defines --envs or
    # --algorithms at import breaks any test process that also imports the
    # benchmarks defining them (CI failed so). compare defines its flags only
    # when run as a program.
    self.assertNotIn(compare.__name__, flags.FLAGS.flags_by_module_dict())
    for name in ("envs", "algorithms", "runs_dir", "set"):
      if name in flags.FLAGS:
        self.assertNotEqual(flags.FLAGS.find_module_defining_flag(name), compare.__name__)


if __name__ == "__main__":
  absltest.main()
