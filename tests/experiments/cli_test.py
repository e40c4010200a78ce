"""experiments.cli: a bad --config ends the program with one line; overrides parse as before.

In-process on fresh FlagValues (nothing compiles), plus one run of the
``experiments.train`` program that stops at its flags. ``OneLineErrorsTest``
walks the bad inputs of the four programs (train and eval in-process, sweep
and compare as programs: their flags are defined only when run as one).
"""

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver

from experiments import cli
from experiments import common
from experiments import eval as eval_job
from experiments import fields
from experiments import hyperparameters
from experiments import spec
from experiments import train as train_job
from experiments.configs import tiny
from tests import testenv

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
    spec.validate(holder.value, num_devices=1)
    self.assertEqual(
        hyperparameters.objective_kwargs(holder.value)["advantage_kwargs"]["step_gamma"], 0.9)
    with self.assertRaisesRegex(SystemExit, r"--config\.rl\.steps=None: .*instead: set it in "
                                r"a config file$"):
      _define("--config.rl.steps=None")

  def test_a_bad_config_argument_names_the_flag(self):
    with self.assertRaisesRegex(fields.ConfigError,
                                rf"^--config={_TINY}:CartPole-v1,grpo: config argument "
                                r"'CartPole-v1,grpo' .*unknown environment 'CartPole-v1'; "
                                r"registered: Bandit-v0, "):
      cli.check_config_argv(["prog", f"--config={_TINY}:CartPole-v1,grpo"])
    with self.assertRaisesRegex(fields.ConfigError,
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
    self.assertEqual(hyperparameters.objective_kwargs(c)["advantage_kwargs"], {"lambda_": 0.95})
    self.assertEqual((c.algorithm_kwargs.entropy_coef, c.algorithm_kwargs.critic), (0.01, True))
    spec.validate(c, num_devices=1)
    self.assertTrue(hyperparameters.objective(c).needs.critic)
    # No --config flag: the default config, nothing loaded twice.
    _, holder = _define()
    self.assertEqual(holder.value.env, "Sokoban-6x6-1box-v0")

  def test_checked_main_exits_on_config_errors_only(self):
    def main(argv):
      del argv
      raise fields.ConfigError("config.rl.steps=-5: must be an int >= 0")

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


def _tiny_config():
  """A run config that builds fast (nothing here trains or compiles a step)."""
  c = testenv.without_extras(tiny.get_config("Bandit-v0,grpo"))
  c.model = "nano"
  c.rollout.update(dict(num_groups=2, group_size=2, max_tokens_per_turn=12))
  c.sft.update(dict(expert="random", num_demos=4, steps=2, batch_size=4, warmup_steps=1))
  c.rl.update(dict(steps=3, warmup_steps=0, num_microbatches=1, num_minibatches=1))
  c.eval.update(dict(num_levels=2, num_groups=2, every=0, greedy=False, samples=1))
  return c


class OneLineErrorsTest(absltest.TestCase):
  """Each bad input of experiments.train, eval, sweep and compare: one ``error:`` line, exit 1."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    cls.root = tempfile.mkdtemp(prefix="cli_errors_")
    cls.config = _tiny_config()
    # A run directory whose one checkpoint lost its files (listed, unreadable).
    cls.damaged = os.path.join(cls.root, "damaged")
    os.makedirs(os.path.join(cls.damaged, "checkpoints", "0"))
    with open(os.path.join(cls.damaged, "config.json"), "w") as f:
      f.write(cls.config.to_json_best_effort(indent=2))
    cls.a_file = os.path.join(cls.root, "a_file")
    open(cls.a_file, "w").close()

  def _one_line(self, main, **flag_values) -> str:
    """Runs ``cli.checked(main)`` in-process; asserts one error line, exit 1, no traceback."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), flagsaver.flagsaver(**flag_values), \
         mock.patch.dict(os.environ, {"JAX_COMPILATION_CACHE_DIR": testenv.CACHE_DIR}), \
         self.assertRaises(SystemExit) as cm:
      cli.checked(main)(["prog"])
    code = cm.exception.code
    self.assertIsInstance(code, str)  # sys.exit(<str>): printed, exit status 1
    self.assertTrue(code.startswith("error: "), code)
    self.assertNotIn("\n", code)
    self.assertNotIn("Traceback", err.getvalue())
    return code

  def _train(self, config=None, **flag_values) -> str:
    with mock.patch.object(train_job, "_CONFIG", mock.Mock(value=config or self.config)):
      return self._one_line(train_job.main, **flag_values)

  def test_train(self):
    no_base = self.config.copy_and_resolve_references()
    no_base.model_dir = "/nonexistent"
    self.assertEqual(self._train(no_base, workdir=os.path.join(self.root, "t1")),
                     "error: config.model_dir='/nonexistent': no config.json there: a Hugging "
                     "Face model directory is needed (e.g. a run's <workdir>/policy)")
    under_file = os.path.join(self.a_file, "run")
    self.assertEqual(self._train(workdir=under_file),
                     f"error: --workdir={under_file}: cannot write the run there: {self.a_file} "
                     "is not a directory; pass a writable --workdir")
    read_only = os.path.join(self.root, "ro", "run")
    with mock.patch.object(cli.os, "access", return_value=False):  # root writes anywhere
      self.assertEqual(self._train(workdir=read_only),
                       f"error: --workdir={read_only}: cannot write the run there: {self.root} "
                       "is not writable (a read-only file system or no permission); pass a "
                       "writable --workdir")
    self.assertRegex(self._train(workdir=self.damaged), "^" + re.escape(
        f"error: --workdir={self.damaged}: no checkpoint in {self.damaged}/checkpoints reads "
        "back (checkpoint 0: ") + r".+\)\. " + re.escape(
            f"Remove {self.damaged}/checkpoints to start the run over (its config.json "
            "stays), or pass a new --workdir.") + "$")
    self.assertEqual(self._train(workdir=self.damaged, num_processes=2),
                     "error: --num_processes=2 needs --distributed.")

  def test_eval(self):
    missing = os.path.join(self.root, "missing")
    self.assertEqual(self._one_line(eval_job.main, workdir=missing),
                     f"error: --workdir={missing!r} is not a directory (a run directory of "
                     "experiments.train is needed).")
    self.assertRegex(self._one_line(eval_job.main, workdir=self.damaged, env="Nope-v0"),
                     r"^error: --env='Nope-v0' is not a registered environment; known: ")
    self.assertEqual(self._one_line(eval_job.main, workdir=self.damaged, num_levels=0),
                     "error: --num_levels=0: must be an int >= 1")
    out = os.path.join(self.a_file, "eval.json")
    self.assertEqual(self._one_line(eval_job.main, workdir=self.damaged, output=out),
                     f"error: --output={self.a_file}: cannot write the run there: "
                     f"{self.a_file} is not a directory; pass a writable --output")
    self.assertRegex(self._one_line(eval_job.main, workdir=self.damaged),
                     "^" + re.escape(f"error: --workdir={self.damaged}: no checkpoint in "
                                     f"{self.damaged}/checkpoints reads back (checkpoint 0: "))

  def test_sigterm_says_which_checkpoint_a_rerun_resumes_from(self):
    def killed(*args, **kwargs):
      del args, kwargs
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(30)  # interrupted by the handler's exception

    err = io.StringIO()
    previous = signal.getsignal(signal.SIGTERM)
    with mock.patch.object(train_job, "_CONFIG", mock.Mock(value=self.config)), \
         mock.patch.object(train_job, "run", side_effect=killed), \
         mock.patch.object(common, "setup_compilation_cache"), \
         flagsaver.flagsaver(workdir=self.damaged), contextlib.redirect_stderr(err), \
         self.assertRaises(SystemExit) as cm:
      cli.checked(train_job.main)(["prog"])
    self.assertEqual(cm.exception.code, 143)
    self.assertEqual(err.getvalue().splitlines(), [
        "stopped by SIGTERM; rerunning the same command resumes from checkpoint 0 of 3 RL "
        f"steps in {self.damaged}"])
    self.assertEqual(signal.getsignal(signal.SIGTERM), previous)  # put back

  def _program(self, module, *args) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=_ROOT, capture_output=True, text=True,
        timeout=300, env={**testenv.subprocess_env(1), "PYTHONPATH": _ROOT,
                          "JAGENT_HUGE_PAGES": "0"}, check=False)
    self.assertEqual(proc.returncode, 1, proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    self.assertLen(lines, 1, proc.stderr)
    self.assertEqual(proc.stderr.strip().splitlines()[-1], lines[0])
    return lines[0]

  def test_sweep_and_compare_programs(self):
    self.assertRegex(self._program("experiments.sweep", "--sweep=rl.steps=1,2",
                                   f"--workdir={self.root}/sweep"),
                     r"^error: --sweep='rl\.steps=1,2': 'rl\.steps' cannot be vmapped: ")
    self.assertEqual(self._program("experiments.sweep", "--config.model_dir=/nonexistent",
                                   f"--workdir={self.root}/sweep"),
                     "error: config.model_dir='/nonexistent': no config.json there: a Hugging "
                     "Face model directory is needed (e.g. a run's <workdir>/policy)")
    self.assertEqual(self._program("experiments.compare", "--set=foo",
                                   f"--runs_dir={self.root}/compare"),
                     "error: --set='foo': expected [<scope>:]<field>=<value>")
    runs_dir = os.path.join(self.a_file, "compare")
    self.assertEqual(self._program("experiments.compare", f"--runs_dir={runs_dir}"),
                     f"error: --runs_dir={runs_dir}: cannot write the run there: {self.a_file} "
                     "is not a directory; pass a writable --runs_dir")


if __name__ == "__main__":
  absltest.main()
