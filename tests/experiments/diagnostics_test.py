"""config.diagnostics: validation, the steps it runs on, and the Echo Trap warning.

Nothing here builds a model or compiles (the end-to-end run with diagnostics
is tests/experiments/train_test.py's).
"""

from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from experiments import spec
from experiments import stats
from experiments import train as train_job
from experiments.configs import ragen
from experiments.configs import tiny


def _config(**changes):
  """The tiny Bandit config with ``{"dotted.field": value}`` changes."""
  c = tiny.get_config("Bandit-v0,starpo_s")
  c.update_from_flattened_dict(changes)
  return c


# A diagnosed step's metrics above every tiny floor.
_HEALTHY = {"filter/reward_std_before": 0.8, "actor/entropy": 0.3,
            "collapse/mutual_info": 0.9, "collapse/reply_entropy": 0.4}


class ValidateTest(parameterized.TestCase):

  def test_defaults_are_valid_and_runs_saved_before_the_block_are_off(self):
    spec.validate(_config())
    self.assertEqual(_config().diagnostics.every, 25)
    old = _config()
    del old["diagnostics"]
    spec.validate(old)
    old = spec.upgrade(old)  # as every program reads a saved config
    self.assertEqual(old.diagnostics.every, 0)
    self.assertIsNone(stats.collapse_alert(old, 1, {**_HEALTHY, "actor/entropy": 0.0}))
    spec.validate(_config(**{"diagnostics.every": 0, "diagnostics.min_mutual_info": 0.0}))

  @parameterized.parameters(
      ("diagnostics.every", -1), ("diagnostics.every", 2.5), ("diagnostics.every", True),
      ("diagnostics.num_rows", 1), ("diagnostics.num_rows", 0),
      ("diagnostics.min_reward_std", -0.1), ("diagnostics.min_entropy", float("inf")),
      ("diagnostics.min_mutual_info", float("nan")), ("diagnostics.min_mutual_info", "0.1"),
  )
  def test_bad_values_name_the_field(self, field, value):
    c = _config()
    *parents, name = field.split(".")
    node = c
    for part in parents:
      node = node[part]
    # Set around the ConfigDict's type check, as a config file could.
    with node.ignore_type():
      node[name] = value
    with self.assertRaisesRegex(ValueError, rf"^config\.{field}={value!r}: must be"):
      spec.validate(c)

  def test_ragen_config_inherits_them(self):
    c = ragen.get_config("Sokoban-6x6-1box-v0,starpo_s")
    self.assertEqual((c.diagnostics.every, c.diagnostics.num_rows), (5, 32))
    self.assertEqual(c.diagnostics.min_mutual_info, tiny.get_config().diagnostics.min_mutual_info)
    c.model_dir = "/nonexistent"  # validate reads no model directory
    spec.validate(c)


class StepsTest(absltest.TestCase):

  def test_first_step_and_every_nth(self):
    due = [s + 1 for s in range(100) if stats.diagnostics_due(s, 25)]
    self.assertEqual(due, [1, 25, 50, 75, 100])
    self.assertEqual([s + 1 for s in range(4) if stats.diagnostics_due(s, 1)], [1, 2, 3, 4])


class AlertTest(absltest.TestCase):

  def test_names_each_metric_below_its_floor(self):
    c = _config()
    self.assertIsNone(stats.collapse_alert(c, 25, _HEALTHY))
    low = {**_HEALTHY, "filter/reward_std_before": 0.0, "collapse/mutual_info": 0.004}
    line = stats.collapse_alert(c, 25, low)
    self.assertEqual(line, "Echo Trap warning at step 25: filter/reward_std_before=0 < "
                     "diagnostics.min_reward_std=0.1; collapse/mutual_info=0.004 < "
                     "diagnostics.min_mutual_info=0.01")
    entropy = stats.collapse_alert(c, 50, {**_HEALTHY, "actor/entropy": 0.01})
    self.assertIn("actor/entropy=0.01 < diagnostics.min_entropy=0.02", entropy)
    # Only on diagnosed steps; a floor of 0 and a NaN check nothing.
    undiagnosed = {k: v for k, v in low.items() if not k.startswith("collapse/")}
    self.assertIsNone(stats.collapse_alert(c, 26, undiagnosed))
    off = _config(**{"diagnostics.min_reward_std": 0.0, "diagnostics.min_mutual_info": 0.0})
    self.assertIsNone(stats.collapse_alert(off, 25, low))
    self.assertIsNone(stats.collapse_alert(c, 25, {**_HEALTHY,
                                                   "collapse/mutual_info": float("nan")}))

  def test_per_step_floors_compare_the_mean_since_the_last_diagnosed_step(self):
    c = _config()  # min_reward_std 0.1, min_entropy 0.02
    steps = [{"filter/reward_std_before": 0.3, "actor/entropy": 0.05,
              "train/updates_applied": 1.0} for _ in range(3)]
    # One step with no reward variance among healthy ones: no warning (mean 0.225).
    low_step = {**_HEALTHY, "filter/reward_std_before": 0.0, "actor/entropy": 0.01}
    self.assertIsNone(stats.collapse_alert(c, 25, low_step, steps + [low_step]))
    # Without the window the same step warns.
    self.assertIsNotNone(stats.collapse_alert(c, 25, low_step))
    # A run of low steps: both means below their floors, the mean named.
    lows = [{"filter/reward_std_before": 0.04, "actor/entropy": 0.015,
             "train/updates_applied": 1.0}] * 3
    line = stats.collapse_alert(c, 25, lows[-1] | {"collapse/mutual_info": 0.9}, lows)
    self.assertEqual(line, "Echo Trap warning at step 25: filter/reward_std_before=0.04 "
                     "(mean of 3 steps) < diagnostics.min_reward_std=0.1; actor/entropy=0.015 "
                     "(mean of 3 steps) < diagnostics.min_entropy=0.02")
    # Steps that trained nothing measured no entropy (NaN in the loop, absent in
    # metrics.jsonl): they do not count for it, their reward std does.
    skipped = {"filter/reward_std_before": 0.3, "actor/entropy": float("nan"),
               "train/updates_applied": 0.0}
    window = [skipped] * 5 + [{**_HEALTHY, "train/updates_applied": 1.0}]
    self.assertIsNone(stats.collapse_alert(c, 25, window[-1], window))
    window[-1] = {**_HEALTHY, "actor/entropy": 0.01}
    line = stats.collapse_alert(c, 25, window[-1], window[:2] + window[-1:])
    self.assertEqual(line, "Echo Trap warning at step 25: actor/entropy=0.01 < "
                     "diagnostics.min_entropy=0.02")
    # A step whose diagnostics did not run (all their NaNs) is not a diagnosed step.
    nan = float("nan")
    undiagnosed = {**window[-1], "collapse/mutual_info": nan, "collapse/reply_entropy": nan,
                   "collapse/replies": nan}
    self.assertIsNone(stats.collapse_alert(c, 26, undiagnosed))
    # One that ran without a valid (prompt, reply) pair (I(X;Z) NaN) still checks the rest.
    no_pair = {**undiagnosed, "collapse/replies": 0.0}
    self.assertEqual(stats.collapse_alert(c, 27, no_pair),
                     "Echo Trap warning at step 27: actor/entropy=0.01 < "
                     "diagnostics.min_entropy=0.02")

  def test_the_train_loop_writes_it_once_under_the_bar(self):
    c = _config(**{"diagnostics.min_entropy": 0.5})
    with mock.patch.object(train_job.tqdm.tqdm, "write") as write:
      with self.assertLogs("absl", level="INFO") as logs:
        line = train_job.warn_collapse(c, 25, _HEALTHY)
    self.assertEqual(line, "Echo Trap warning at step 25: actor/entropy=0.3 < "
                     "diagnostics.min_entropy=0.5")
    # On the terminal once (the bar's line); the log has it at INFO, which
    # the default verbosity (WARNING) does not print.
    self.assertEqual(logs.output, [f"INFO:absl:{line}"])
    write.assert_called_once_with(line)
    with mock.patch.object(train_job.tqdm.tqdm, "write") as write:
      with self.assertNoLogs("absl", level="WARNING"):
        self.assertIsNone(train_job.warn_collapse(c, 26, {"actor/entropy": 0.1}))
      with self.assertLogs("absl", level="WARNING"):
        train_job.warn_collapse(c, 25, _HEALTHY, progress=False)  # no bar: the log only
    write.assert_not_called()


if __name__ == "__main__":
  absltest.main()
