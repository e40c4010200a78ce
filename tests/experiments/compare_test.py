"""experiments.compare: config overrides and the comparison table."""

import json
import os
import tempfile
from unittest import mock

from absl import flags
from absl.testing import absltest
import numpy as np

from experiments import compare
from experiments import fields
from experiments.configs import tiny


class CompareTest(absltest.TestCase):

  def test_overrides_scoped_by_algorithm_or_cell(self):
    overrides = ["starpo_s:rl.filter_value=0.25", "Bandit-v0,ppo:rl.steps=3"]
    default_steps = tiny.get_config("Bandit-v0,starpo_s").rl.steps
    s = compare.apply_overrides(tiny.get_config("Bandit-v0,starpo_s"), "Bandit-v0", overrides)
    self.assertEqual((s.rl.filter_value, s.rl.steps), (0.25, default_steps))
    p = compare.apply_overrides(tiny.get_config("Bandit-v0,ppo"), "Bandit-v0", overrides)
    self.assertEqual((p.rl.filter_value, p.rl.steps), (1.0, 3))
    lake = compare.apply_overrides(tiny.get_config("FrozenLake-4x4-v0,ppo"),
                                   "FrozenLake-4x4-v0", overrides)
    self.assertEqual(lake.rl.steps, default_steps)

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
        fields.ConfigError,
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


  def test_tail_mean_skips_steps_without_a_value(self):
    self.assertEqual(compare.tail_mean([9.0] * 8 + [1.0, float("nan")]), 1.0)
    self.assertEqual(compare.tail_mean([1.0, 2.0, 3.0, 4.0, 5.0]), 5.0)
    self.assertTrue(np.isnan(compare.tail_mean([1.0, float("nan")], 0.5)))


def _seed_summary(algorithm, sft, rl, stds, tokens=None):
  """A sweep summary of len(sft) seeds whose reward std curves are ``stds``
  (and sampled-token curves ``tokens``, if given)."""
  runs = [{"seed": i, "sft": {"success": a}, "rl": {"success": b, "greedy_success": b},
           "curves": {"rollout/success": [a, b] * 5, "filter/reward_std_before": c,
                      "actor/entropy": [0.5] * 10, "rollout/format_valid_frac": [1.0] * 10}}
          for i, (a, b, c) in enumerate(zip(sft, rl, stds))]
  for run, t in zip(runs, tokens or ()):
    run["curves"]["rollout/sampled_tokens"] = t
  return {"env": "Bandit-v0", "algorithm": algorithm, "runs": runs,
          "seconds": {"total": 120.0}}


class SeedGridTest(absltest.TestCase):

  def test_seed_table_by_hand(self):
    summaries = [
        _seed_summary("starpo_s", [0.5, 0.5, 0.25], [0.75, 0.5, 0.5], [[1.0] * 10] * 3,
                      tokens=[[1000.0] * 10, [2000.0] * 10, [3000.0] * 9 + [float("nan")]]),
        _seed_summary("grpo", [0.5, 0.5, 0.25], [0.0, 0.0, 0.0], [[1.0] * 8 + [0.0] * 2] * 3)]
    lines = compare.seed_table(summaries).splitlines()
    self.assertLen(lines, 4)
    # SFT mean 0.417, std 0.144; RL mean 0.583, std 0.144; gains +25, 0, +25;
    # sampled tokens 0.010, 0.020 and 0.027 M (a NaN step counts none).
    self.assertEqual(lines[2], "| Bandit-v0 | starpo_s | 3 | 0.417 ± 0.144 | 0.583 ± 0.144 | "
                     "0.583 ± 0.144 | +16.7 ± 14.4 | +25.0, +0.0, +25.0 | 1.000 ± 0.000 | "
                     "0.02 ± 0.01 | 2.0 |")
    # The last 20% of grpo's steps had no reward spread: the Echo Trap's sign.
    # No sampled-token curves (a summary from before they were kept): NaN.
    self.assertEqual(lines[3], "| Bandit-v0 | grpo | 3 | 0.417 ± 0.144 | 0.000 ± 0.000 | "
                     "0.000 ± 0.000 | -41.7 ± 14.4 | -50.0, -50.0, -25.0 | 0.000 ± 0.000 | "
                     "nan ± nan | 2.0 |")

  def test_plot_comparison_writes_a_png(self):
    tmp = self.enterContext(tempfile.TemporaryDirectory())
    png = os.path.join(tmp, "comparison_Bandit-v0.png")
    compare.plot_comparison(
        [_seed_summary(a, [0.5, 0.25], [0.75, 0.5], [[1.0] * 10] * 2)
         for a in ("starpo_s", "ppo")], png)
    with open(png, "rb") as fh:
      self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")

  def test_plot_comparison_is_against_sampled_tokens_when_every_cell_has_them(self):
    tmp = self.enterContext(tempfile.TemporaryDirectory())
    png = os.path.join(tmp, "comparison.png")
    chain = _seed_summary("starpo_s", [0.5, 0.25], [0.75, 0.5], [[1.0] * 10] * 2,
                          tokens=[[100.0] * 10] * 2)
    tree = _seed_summary("tree_grpo", [0.5, 0.25], [0.75, 0.5], [[1.0] * 10] * 2,
                         tokens=[[50.0] * 10] * 2)
    with mock.patch.object(compare.train, "plot_seed_curves") as plot:
      compare.plot_comparison([chain, tree], png)
      self.assertEqual(plot.call_args.kwargs["x_key"], "rollout/sampled_tokens")
      compare.plot_comparison([chain, _seed_summary("ppo", [0.5], [0.5], [[1.0] * 10])], png)
      self.assertIsNone(plot.call_args.kwargs["x_key"])
    compare.plot_comparison([chain, tree], png)
    with open(png, "rb") as fh:
      self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")

  def test_seed_grid_cells_share_the_sft_directory_and_reread_finished_cells(self):
    tmp = self.enterContext(tempfile.TemporaryDirectory())
    finished = _seed_summary("starpo_s", [0.5, 0.25], [0.75, 0.5], [[1.0] * 10] * 2)
    os.makedirs(os.path.join(tmp, "Bandit-v0_starpo_s"))
    with open(os.path.join(tmp, "Bandit-v0_starpo_s", "sweep_summary.json"), "w") as f:
      json.dump(finished, f)

    def fake_sweep(config, workdir, **kwargs):
      del workdir
      summary = _seed_summary(config.algorithm, [0.5, 0.25], [0.5, 0.5], [[1.0] * 10] * 2)
      return {**summary, "sft_params": {}, "params": {}, "frozen": []}

    with mock.patch.object(compare.sweep, "sweep", side_effect=fake_sweep) as run, \
         mock.patch.object(compare, "plot_comparison"):
      text = compare._run_seeds(["Bandit-v0"], ["starpo_s", "ppo", "grpo"], [], tmp, 2)
    # The finished cell is only re-read; the others run from <runs_dir>/<env>_sft.
    self.assertEqual([c.args[0].algorithm for c in run.call_args_list], ["ppo", "grpo"])
    for c in run.call_args_list:
      self.assertEqual(c.kwargs["sft_dir"], os.path.join(tmp, "Bandit-v0_sft"))
      self.assertNotIn("sft_params", c.kwargs)
      # Evaluated on levels held out of the other cells' training levels too.
      self.assertEqual(sorted(o.algorithm for o in c.kwargs["also_held_out"]),
                       sorted({"starpo_s", "ppo", "grpo"} - {c.args[0].algorithm}))
    self.assertEqual([line.split(" | ")[1] for line in text.splitlines()[2:]],
                     ["starpo_s", "ppo", "grpo"])


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
