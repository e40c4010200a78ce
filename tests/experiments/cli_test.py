"""experiments.cli: a bad --config ends the program with one line; overrides parse as before.

In-process on fresh FlagValues (nothing compiles), plus one run of the
``experiments.train`` program that stops at its flags.
"""

import os
import subprocess
import sys
import tempfile

from absl import flags
from absl.testing import absltest

from experiments import cli
from experiments import common

_TINY = "experiments/configs/tiny.py"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _define(*args):
  """``(FlagValues, holder)`` of the config flag defined for the command line ``args``."""
  argv = ["prog", *args]
  fv = flags.FlagValues()
  holder = cli.define_config_flag(os.path.join(_ROOT, _TINY), flag_values=fv, argv=argv)
  fv(argv)
  return fv, holder


class ConfigFlagTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    cwd = os.getcwd()
    os.chdir(_ROOT)  # config paths as a user types them
    self.addCleanup(os.chdir, cwd)

  def test_a_misspelt_field_is_one_line_with_the_closest(self):
    want = ("error: --config.rl.lr=1e-4: the config has no field config.rl.lr; closest: "
            "config.rl.learning_rate, config.rl.critic_learning_rate, config.sft.learning_rate")
    # ml_collections parses the default config where the flag is defined...
    with self.assertRaises(SystemExit) as cm:
      _define("--config.rl.lr=1e-4")
    self.assertEqual(cm.exception.code, want)
    # ...and a given one when flags are parsed: checked first either way.
    with self.assertRaises(SystemExit) as cm:
      _define(f"--config={_TINY}:Bandit-v0,grpo", "--config.rl.lr=1e-4")
    self.assertEqual(cm.exception.code, want)
    with self.assertRaises(SystemExit) as cm:
      _define("--config", f"{_TINY}:Bandit-v0,grpo", "--noconfig.eval.gredy")
    self.assertEqual(cm.exception.code, "error: --noconfig.eval.gredy: the config has no field "
                                        "config.eval.gredy; closest: config.eval.greedy")

  def test_none_is_refused_with_what_to_set_and_estimator_fields_are_flags(self):
    with self.assertRaises(SystemExit) as cm:
      _define(f"--config={_TINY}:Bandit-v0,starpo_s", "--config.algorithm_kwargs.dual_clip=None")
    self.assertEqual(cm.exception.code,
                     "error: --config.algorithm_kwargs.dual_clip=None: a flag cannot set None "
                     "(ml_collections parses the field's type); instead: inf (no dual clip)")
    # inf is what turns it off, and it validates; an estimator's own
    # hyperparameter is a flag of its own.
    _, holder = _define(f"--config={_TINY}:Bandit-v0,starpo_s",
                        "--config.algorithm_kwargs.dual_clip=inf",
                        "--config.algorithm_kwargs.advantage=gigpo",
                        "--config.algorithm_kwargs.advantage_kwargs.step_gamma=0.9")
    self.assertEqual(holder.value.algorithm_kwargs.dual_clip, float("inf"))
    common.validate(holder.value, num_devices=1)
    self.assertEqual(common.objective_kwargs(holder.value)["advantage_kwargs"]["step_gamma"], 0.9)
    with self.assertRaisesRegex(SystemExit, r"--config\.rl\.steps=None: .*instead: set it in "
                                r"a config file$"):
      _define("--config.rl.steps=None")

  def test_a_bad_config_argument_names_the_flag(self):
    with self.assertRaisesRegex(common.ConfigError,
                                rf"^--config={_TINY}:CartPole-v1,grpo: config argument "
                                r"'CartPole-v1,grpo' .*unknown environment 'CartPole-v1'; "
                                r"registered: Bandit-v0, "):
      cli.check_config_argv(["prog", f"--config={_TINY}:CartPole-v1,grpo"])
    with self.assertRaisesRegex(common.ConfigError,
                                r"^--config=nowhere\.py: no config file 'nowhere\.py'$"):
      cli.check_config_argv(["prog", "--config=nowhere.py"])

  def test_overrides_parse_and_set_every_hyperparameter(self):
    fv, holder = _define(f"--config={_TINY}:Bandit-v0,starpo_s",
                         "--config.algorithm_kwargs.entropy_coef=0.01",
                         "--config.algorithm_kwargs.critic=True",
                         "--config.algorithm_kwargs.advantage=gae",
                         "--config.algorithm_kwargs.advantage_kwargs={'lambda_': 0.95}",
                         "--config.rl.steps=7")
    c = holder.value
    self.assertIs(fv.config, c)
    self.assertEqual((c.env, c.rl.steps), ("Bandit-v0", 7))
    self.assertEqual(common.objective_kwargs(c)["advantage_kwargs"], {"lambda_": 0.95})
    self.assertEqual((c.algorithm_kwargs.entropy_coef, c.algorithm_kwargs.critic), (0.01, True))
    common.validate(c, num_devices=1)
    self.assertTrue(common.objective(c).needs.critic)
    # No --config flag: the default config, nothing loaded twice.
    _, holder = _define()
    self.assertEqual(holder.value.env, "Sokoban-6x6-1box-v0")

  def test_checked_main_exits_on_config_errors_only(self):
    def main(argv):
      del argv
      raise common.ConfigError("config.rl.steps=-5: must be an int >= 0")

    with self.assertRaises(SystemExit) as cm:
      cli.checked(main)(["prog"])
    self.assertEqual(cm.exception.code, "error: config.rl.steps=-5: must be an int >= 0")

    def buggy(argv):
      raise ValueError(argv)

    with self.assertRaises(ValueError):  # a bug keeps its traceback
      cli.checked(buggy)(["prog"])

  def test_the_train_program_prints_one_line(self):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.train", "--config.rl.lr=1e-4",
         "--workdir=/nonexistent"], cwd=_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": _ROOT}, check=False)
    self.assertEqual(proc.returncode, 1, proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)
    self.assertEqual(proc.stderr.strip().splitlines()[-1],
                     "error: --config.rl.lr=1e-4: the config has no field config.rl.lr; closest: "
                     "config.rl.learning_rate, config.rl.critic_learning_rate, "
                     "config.sft.learning_rate")

  def test_the_eval_program_prints_one_line(self):
    missing = os.path.join(tempfile.mkdtemp(prefix="cli_test_"), "no_run")
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.eval", f"--workdir={missing}"], cwd=_ROOT,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": _ROOT}, check=False)
    self.assertEqual(proc.returncode, 1, proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)
    self.assertEqual(proc.stderr.strip().splitlines()[-1],
                     f"error: --workdir={missing!r} is not a directory (a run directory of "
                     "experiments.train is needed).")


if __name__ == "__main__":
  absltest.main()
