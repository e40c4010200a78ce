"""experiments.spec.validate's errors named as config fields; SFT rows in each history mode.

ValidateTest, AlgorithmKwargsTest and ConfigFieldTest build no model and compile
nothing: validate only reads the config.
"""

from absl import app
from absl import flags
from absl import logging
from absl.testing import absltest
from absl.testing import parameterized
import ml_collections
import numpy as np

from experiments import common
from experiments import experiment
from experiments import fields
from experiments import hyperparameters
from experiments import spec
from experiments import stats
from experiments.configs import ragen
from experiments.configs import tiny
from jagent import transforms


def _config(**changes):
  """The tiny Bandit config with ``{"dotted.field": value}`` changes."""
  c = tiny.get_config("Bandit-v0,starpo_s")
  c.update_from_flattened_dict(changes)
  return c


class ValidateTest(parameterized.TestCase):

  def test_tiny_config_is_valid(self):
    spec.validate(_config())

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
      ("rl.weight_decay", -0.1, "OptimizerConfig"),
      ("rl.max_grad_norm", 0.0, "OptimizerConfig"),
      ("rollout.num_groups", 0, "RolloutConfig"),
      ("rollout.group_size", 0, "RolloutConfig"),
      ("rollout.max_turns", -2, "RolloutConfig"),
      ("rollout.max_tokens_per_turn", 0, "RolloutConfig"),
      ("rollout.max_actions_per_traj", 0, "RolloutConfig"),
      ("rollout.history_turns", -2, "RolloutConfig"),
      ("eval.num_groups", 0, "RolloutConfig"),
      ("sft.learning_rate", 0.0, "OptimizerConfig"),
      ("sft.warmup_steps", -1, "OptimizerConfig"),
      ("rl.filter_mode", "top_half", "FilterConfig"),
      ("rl.include_zero", None, "FilterConfig"),
      ("prompt.max_actions_per_turn", 0, "PromptConfig"),
      ("compute_dtype", "bf16", "ModelConfig"),
      ("attention_impl", "flash", "ModelConfig"),
      ("cache_dtype", "int8", "ModelConfig"),
  )
  def test_reraises_the_dataclass_error_naming_the_field(self, field, value, owner):
    with self.assertRaisesRegex(fields.ConfigError, rf"^config\.{field}={value!r}: ") as cm:
      spec.validate(_config(**{field: value}))
    # The dataclass's own error, chained: validate does not re-check by hand.
    self.assertIsInstance(cm.exception.__cause__, ValueError)
    self.assertTrue(str(cm.exception.__cause__).startswith(owner), cm.exception.__cause__)
    self.assertEqual(str(cm.exception).partition(": ")[2],
                     str(cm.exception.__cause__).partition(": ")[2])
    self.assertNotIn(owner, str(cm.exception))  # the user's terms only

  @parameterized.parameters(
      # The dataclass says "(use greedy=True for argmax)": neither config block has
      # a greedy field that would make the rollout greedy.
      ("rollout.temperature", 0.0, "(the train rollout samples; greedy evaluation is "
       "config.eval.greedy)"),
      ("rollout.temperature", float("inf"), "(the train rollout samples; greedy "
       "evaluation is config.eval.greedy)"),
      ("eval.temperature", -1.0, "(config.eval.greedy=True adds a greedy evaluation)"),
  )
  def test_temperature_says_what_to_set_in_the_config(self, field, value, hint):
    with self.assertRaises(fields.ConfigError) as cm:
      spec.validate(_config(**{field: value}))
    self.assertEqual(str(cm.exception),
                     f"config.{field}={value!r}: must be a positive finite float {hint}")
    self.assertIn("greedy=True for argmax", str(cm.exception.__cause__))

  def test_prompt_fields_are_named(self):
    with self.assertRaisesRegex(
        fields.ConfigError, r"^config\.prompt\.first_turn='\{board\}\\n': uses \{board\}; "
        r"allowed fields"):
      spec.validate(_config(**{"prompt.first_turn": "{board}\n"}))
    with self.assertRaisesRegex(
        fields.ConfigError, r"^config\.prompt\.chat_template='chat_ml': unknown; known: "
        r"\['chatml', 'llama3', 'plain'\]"):
      spec.validate(_config(**{"prompt.chat_template": "chat_ml"}))

  @parameterized.parameters("rl.steps", "sft.steps", "eval.every", "eval.samples")
  def test_counts_are_ints_at_least_0(self, field):
    # rl.steps=-5 used to train 0 steps and exit 0.
    with self.assertRaisesRegex(fields.ConfigError, rf"^config\.{field}=-5: must be an int >= 0$"):
      spec.validate(_config(**{field: -5}))
    spec.validate(_config(**{field: 0}))

  def test_group_relative_objectives_reject_groups_of_one(self):
    # Hand list: a baseline taken from the group (GRPO, Dr.GRPO, RLOO, DAPO,
    # GiGPO, Tree-GRPO; StarPO(-S) with the tiny config's advantage="grpo") makes every
    # advantage 0 with one rollout a group; GAE and REINFORCE++ have their own.
    group_relative = {"grpo", "dr_grpo", "rloo", "dapo", "gigpo", "starpo", "starpo_s",
                      "tree_grpo"}
    for algorithm in transforms.registered():
      c = tiny.get_config(f"Bandit-v0,{algorithm}")
      c.rollout.group_size = 1
      with self.subTest(algorithm):
        if algorithm in group_relative:
          with self.assertRaisesRegex(
              fields.ConfigError, rf"^config\.rollout\.group_size=1: the objective "
              rf"'{algorithm}' compares the rollouts of a group, .* set "
              r"config\.rollout\.group_size >= 2$"):
            spec.validate(c)
        else:
          spec.validate(c)
    c = tiny.get_config("Bandit-v0,starpo_s")
    c.rollout.group_size = 1
    c.algorithm_kwargs.advantage = "gae"  # a critic's baseline
    c.algorithm_kwargs.advantage_kwargs = {}
    spec.validate(c)


class AlgorithmKwargsTest(parameterized.TestCase):
  """config.algorithm_kwargs: every hyperparameter, its errors named."""

  def test_objective_errors_name_the_key_to_blame(self):
    cases = [
        ("entropy_coef", -1.0, r"coef must lie in \[0\.0, inf\]"),
        ("eps_low", -0.1, r"eps_low must lie in \[0\.0, 1\.0\)"),
        ("dual_clip", 0.5, r"dual_clip must lie in \(1\.0, inf\]"),
        ("aggregation", "mean", r"aggregation must be one of"),
        # kl_coef is 0 in the tiny config: the estimator is checked all the same.
        ("kl_estimator", "k9", r"kl_estimator must be one of"),
    ]
    for key, value, why in cases:
      with self.subTest(key):
        with self.assertRaisesRegex(
            fields.ConfigError, rf"^config\.algorithm_kwargs\.{key}={value!r}: {why}"):
          spec.validate(_config(**{f"algorithm_kwargs.{key}": value}))

  def test_unknown_keys_name_the_known_ones(self):
    c = _config()
    c.algorithm_kwargs.entropy = 0.01
    with self.assertRaisesRegex(
        fields.ConfigError, r"^config\.algorithm_kwargs\.entropy=0\.01: not a hyperparameter "
        r"of the objective 'starpo_s' \(closest: entropy_coef\); its hyperparameters: "
        r"\['advantage', 'advantage_kwargs', 'aggregation', 'critic', 'dual_clip', "
        r"'entropy_coef', 'eps_high', 'eps_low', 'kl_coef', 'kl_estimator', "
        r"'turn_weighting', 'value_clip', 'value_coef'\]"):
      spec.validate(c)
    # --config.algorithm=grpo on a starpo_s config file: its keys are StarPO-S's.
    c = _config(algorithm="grpo")
    with self.assertRaisesRegex(fields.ConfigError,
                                r"^config\.algorithm_kwargs\.advantage='grpo': not a "
                                r"hyperparameter of the objective 'grpo'.*--config=<file>:"):
      spec.validate(c)

  def test_advantage_and_its_kwargs(self):
    with self.assertRaisesRegex(fields.ConfigError,
                                r"^config\.algorithm_kwargs\.advantage='gea': unknown; known: "):
      spec.validate(_config(**{"algorithm_kwargs.advantage": "gea"}))
    # The advantage alone switches the estimator (its own defaults)...
    for advantage in ("gigpo", "gae"):
      c = _config(**{"algorithm_kwargs.advantage": advantage})
      spec.validate(c)
      self.assertEqual(hyperparameters.objective(c).needs.critic, advantage == "gae")
    # ...whose hyperparameters are a dict, checked against its signature.
    c.algorithm_kwargs.advantage_kwargs = {"lambda_": 0.95}
    spec.validate(c)
    self.assertEqual(hyperparameters.objective_kwargs(c)["advantage_kwargs"], {"lambda_": 0.95})
    c.algorithm_kwargs.advantage_kwargs = {"eps": 1e-5}
    with self.assertRaisesRegex(
        fields.ConfigError, r"^config\.algorithm_kwargs\.advantage_kwargs\.eps=1e-05: not a "
        r"hyperparameter of the advantage 'gae'; its hyperparameters: \['gamma', 'lambda_', "
        r"'whiten'\]$"):
      spec.validate(c)
    # Each estimator's hyperparameter is its own field; the run passes the
    # chosen estimator only its own, and one set for another is an error.
    c = _config(**{"algorithm_kwargs.advantage": "gigpo",
                   "algorithm_kwargs.advantage_kwargs.step_gamma": 0.9})
    spec.validate(c)
    self.assertEqual(hyperparameters.objective_kwargs(c)["advantage_kwargs"], {
        "step_gamma": 0.9, "step_weight": 1.0, "eps": 1e-6, "normalize_std": True})
    c.algorithm_kwargs.advantage = "grpo"
    with self.assertRaisesRegex(
        fields.ConfigError, r"^config\.algorithm_kwargs\.advantage_kwargs\.step_gamma=0\.9: "
        r"not a hyperparameter of the advantage 'grpo'; its hyperparameters: \['eps', "
        r"'normalize_std'\]$"):
      spec.validate(c)
    with self.assertRaisesRegex(
        fields.ConfigError, r"^config\.algorithm_kwargs\.advantage_kwargs\.lamda=0\.9: not a "
        r"hyperparameter of any named advantage; known: \['combine', 'eps', 'gamma', "):
      hyperparameters.algorithm_kwargs("starpo_s", advantage_kwargs={"lamda": 0.9})
    c = _config()
    c.algorithm_kwargs.advantage_kwargs = {"eps": -1.0}
    with self.assertRaisesRegex(fields.ConfigError,
                                r"^config\.algorithm_kwargs\.advantage_kwargs=\{'eps': -1\.0\}: "
                                r"eps must lie in"):
      spec.validate(c)

  def test_the_run_sets_the_filter(self):
    with self.assertRaisesRegex(fields.ConfigError,
                                r"^config\.algorithm_kwargs\.filter_config=0\.25: the run sets "
                                r"it: config\.rl\.filter_mode, config\.rl\.filter_value"):
      hyperparameters.algorithm_kwargs("starpo_s", filter_config=0.25)

  def test_configs_saved_with_fewer_keys_stay_valid(self):
    c = _config()
    c.algorithm_kwargs = ml_collections.ConfigDict({"kl_coef": 0.0, "advantage": "grpo"})
    spec.validate(c)
    self.assertEqual(hyperparameters.objective_kwargs(c), {"kl_coef": 0.0, "advantage": "grpo"})


class ConfigFieldTest(absltest.TestCase):

  def test_closest_fields(self):
    c = _config()
    self.assertEqual(fields.config_field(c, "rl.learning_rate"), 1e-4)
    cases = {
        # The field's own group first.
        "rl.lr": "closest: config.rl.learning_rate, config.rl.critic_learning_rate, "
                 "config.sft.learning_rate",
        "rollout.temprature": "closest: config.rollout.temperature, config.eval.temperature",
        "rollout.greedy": "closest: config.eval.greedy",
        "rollouts.group_size": "closest: config.rollout, config.lora.dropout",
        "algorithm_kwargs.entropy": "closest: config.algorithm_kwargs.entropy_coef, "
                                    "config.diagnostics.min_entropy",
    }
    for path, near in cases.items():
      with self.subTest(path):
        first = path.split(".")[0] if path.startswith("rollouts") else path
        with self.assertRaises(fields.ConfigError) as cm:
          fields.config_field(c, path)
        self.assertEqual(str(cm.exception), f"the config has no field config.{first}; {near}")
    with self.assertRaisesRegex(fields.ConfigError,
                                r"^the config has no field config\.rl\.zzz; config\.rl has: "
                                r"critic, critic_learning_rate, decay, "):
      fields.config_field(c, "rl.zzz")
    with self.assertRaisesRegex(fields.ConfigError,
                                r"^config\.rl\.steps is a value, not a group of fields"):
      fields.config_field(c, "rl.steps.x")

  def test_cross_field_checks_stay(self):
    with self.assertRaisesRegex(ValueError, r"^config\.rl\.num_minibatches=3: does not divide"):
      spec.validate(_config(**{"rl.num_minibatches": 3}))
    with self.assertRaisesRegex(ValueError, r"^config\.eval\.num_levels=33: must be a multiple"):
      spec.validate(_config(**{"eval.num_levels": 33}))


  def test_sft_batch_size_counts_turn_rows_in_a_window(self):
    # 8 demonstrations are 8 rows in the full history, up to 8 x max_turns in a window.
    with self.assertRaisesRegex(ValueError, r"^config\.sft\.batch_size=9: is larger than the 8 "):
      spec.validate(_config(**{"sft.num_demos": 8, "sft.batch_size": 9}))
    spec.validate(_config(**{"sft.num_demos": 8, "sft.batch_size": 9,
                             "rollout.history_turns": 0, "rollout.max_turns": 2}))


  def test_empty_stop_steps(self):
    self.assertEqual(_config()["rl"]["empty_stop_steps"], 0)  # never
    self.assertEqual(ragen.get_config("Sokoban-6x6-1box-v0,starpo_s").rl.empty_stop_steps, 5)
    spec.validate(_config(**{"rl.empty_stop_steps": 3}))
    old = _config()
    del old.rl["empty_stop_steps"]  # a run saved before the field: never
    spec.validate(old)
    for value in (-1, 2.5, True, "5"):
      c = _config()
      with c.rl.ignore_type():
        c.rl.empty_stop_steps = value
      with self.assertRaisesRegex(
          ValueError, rf"^config\.rl\.empty_stop_steps={value!r}: must be an int >= 0"):
        spec.validate(c)


class WilsonIntervalTest(absltest.TestCase):

  def test_by_hand(self):
    z2 = 1.959963984540054 ** 2
    # No success in 10: [0, z^2 / (n + z^2)]; all 10: [n / (n + z^2), 1].
    lo, hi = stats.wilson_interval(0.0, 10)
    self.assertAlmostEqual(lo, 0.0, places=12)
    self.assertAlmostEqual(hi, z2 / (10 + z2), places=12)
    self.assertAlmostEqual(hi, 0.27753, places=5)
    lo, hi = stats.wilson_interval(1.0, 10)
    self.assertAlmostEqual(lo, 10 / (10 + z2), places=12)
    self.assertAlmostEqual(hi, 1.0, places=12)
    # Half of 512 levels: centred on 0.5, half width
    # 1.96 sqrt(0.25/512 + 3.8415/(4 * 512^2)) / (1 + 3.8415/512) = 0.04315
    # (the normal approximation's 0.04331).
    lo, hi = stats.wilson_interval(0.5, 512)
    self.assertAlmostEqual((lo + hi) / 2, 0.5, places=12)
    self.assertAlmostEqual(hi - 0.5, 0.04315, places=5)
    # 0.479 of 512 (the main job's): centre pulled towards 0.5.
    lo, hi = stats.wilson_interval(0.479, 512)
    self.assertAlmostEqual(lo, 0.43606, places=4)
    self.assertAlmostEqual(hi, 0.52227, places=4)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "n=0"):
      stats.wilson_interval(0.5, 0)
    with self.assertRaisesRegex(ValueError, "rate=1.5"):
      stats.wilson_interval(1.5, 10)


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
      exp = experiment.Experiment(c)
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

  def test_expert_node_cap_and_plan_reuse(self):
    def demos(max_nodes, reuse=False):
      c = tiny.get_config("Sokoban-6x6-1box-v0,starpo_s")
      c.sft.update(dict(num_demos=8, batch_size=8, steps=3, expert_max_nodes=max_nodes,
                        expert_reuse_plans=reuse))
      return experiment.Experiment(c).demonstrations()

    # Following the first search's plan plays equally short episodes.
    reused, full = demos(1_000_000, reuse=True), demos(1_000_000)
    np.testing.assert_array_equal(reused.success, full.success)
    np.testing.assert_array_equal(reused.num_turns, full.num_turns)

    # A cap of 1 state leaves the solver without a solution, so the expert
    # replies its arbitrary first move ("Up") every turn: it solves only a level
    # whose solution is all Up moves.
    capped = demos(1)
    self.assertLess(int(np.sum(capped.success)), int(np.sum(full.success)))
    self.assertGreaterEqual(int(np.sum(full.success)), 4)
    with self.assertRaisesRegex(ValueError, r"^config\.sft\.expert_max_nodes=0: "):
      demos(0)


if __name__ == "__main__":
  absltest.main()
