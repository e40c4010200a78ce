"""Every tiny config (registered env x registered algorithm) is valid and fits its replies."""

import json

from absl.testing import absltest
from absl.testing import parameterized
import jax

import envs_jax
from experiments import experiment
from experiments import fields
from experiments import hyperparameters
from experiments import spec
from experiments.configs import ragen
from experiments.configs import tiny
from jagent import tokenizers
from jagent import transforms

# Every named advantage estimator's hyperparameters, by hand from the
# signatures in jagent/transforms/_stages.py (GAE, bi-level GAE, GRPO,
# REINFORCE++, GiGPO): StarPO's config lists them all.
_ADVANTAGE_DEFAULTS = {"gamma": 1.0, "lambda_": 1.0, "whiten": True, "turn_gamma": 0.95,
                       "eps": 1e-6, "normalize_std": True, "step_gamma": 0.95,
                       "step_weight": 1.0, "combine": "sum", "node_reduce": "mean"}

TOK = tokenizers.load_tiny_tokenizer()


class TinyConfigsTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(envs_jax.registered()))
  def test_every_algorithm_validates_and_builds(self, env_id):
    for algorithm in transforms.registered():
      c = tiny.get_config(f"{env_id},{algorithm}")
      spec.validate(c)
      transforms.make(algorithm, **hyperparameters.objective_kwargs(c))

  @parameterized.parameters(*sorted(envs_jax.registered()))
  def test_expert_answers_fit_a_turn(self, env_id):
    c = tiny.get_config(f"{env_id},starpo_s")
    env, params = envs_jax.make(env_id)
    # Every action name; free text: the expert's answers on 8 levels (Countdown: and
    # a long expression).
    answers = list(env.action_names)
    if not answers:
      batch = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(
          jax.random.split(jax.random.key(0), 8), params)[1]
      batch = jax.device_get(getattr(batch, "env_state", batch))
      states = [jax.tree.map(lambda x, i=i: x[i], batch) for i in range(8)]
      answers = env.expert_answers(states, [params] * 8)
      self.assertLen(answers, 8)
      if env_id == "Countdown-v0":
        answers.append("(99 - 98) + (97 - 96)")
    for a in answers:
      n = len(TOK.encode(f"<answer>{a}</answer>")) + 1  # + EOS
      self.assertLessEqual(n, c.rollout.max_tokens_per_turn, f"{env_id}: {a}")

  def test_default_is_the_main_job(self):
    c = tiny.get_config()
    self.assertEqual((c.env, c.algorithm), ("Sokoban-6x6-1box-v0", "starpo_s"))
    self.assertGreaterEqual(c.eval.num_levels, 128)

  def test_a_bad_argument_names_itself_and_the_known_names(self):
    where = r"config argument '{}' \(<env id>,<algorithm> after the config file's ':'\): "
    with self.assertRaisesRegex(
        fields.ConfigError, "^" + where.format("CartPole-v1,grpo") + "unknown environment "
        "'CartPole-v1'; registered: " + ", ".join(sorted(envs_jax.registered())) + "$"):
      tiny.get_config("CartPole-v1,grpo")
    with self.assertRaisesRegex(
        fields.ConfigError, "^" + where.format("Bandit-v0,grpo2") + "unknown algorithm "
        "'grpo2'; registered: " + ", ".join(transforms.registered()) + "$"):
      tiny.get_config("Bandit-v0,grpo2")
    with self.assertRaisesRegex(fields.ConfigError,
                                "^" + where.format("Bandit-v0") + "expected two names separated "
                                "by a comma, e.g. 'Sokoban-6x6-1box-v0,starpo_s'$"):
      tiny.get_config("Bandit-v0")
    with self.assertRaisesRegex(fields.ConfigError, r"unknown environment 'Sokoban-6x6-v0' "
                                r"\(closest: Sokoban-6x6-1box-v0, "):
      ragen.get_config("Sokoban-6x6-v0,starpo_s")

  def test_algorithm_kwargs_list_every_hyperparameter(self):
    # Each objective's keywords (hand lists from jagent/transforms/_aliases.py),
    # the tiny config's own values where it sets one (kl_coef 0; StarPO: GRPO
    # advantages, seq-mean-token-mean); filter_config is the run's (rl.filter_*).
    loss = {"eps_low", "eps_high", "dual_clip", "entropy_coef", "aggregation",
            "turn_weighting"}
    kl = {"kl_coef", "kl_estimator"}
    starpo = loss | kl | {"advantage", "advantage_kwargs", "critic", "value_coef",
                          "value_clip"}
    want = {
        "ppo": loss | kl | {"gamma", "lambda_", "whiten", "value_coef", "value_clip"},
        "grpo": loss | kl | {"eps"}, "dr_grpo": loss | kl, "rloo": loss | kl,
        "dapo": loss | kl | {"eps", "dynamic_sampling"},
        "gigpo": loss | kl | {"step_gamma", "step_weight", "normalize_std"},
        "tree_grpo": loss | kl | {"advantage", "eps", "combine", "node_reduce"},
        "reinforce_pp": loss | {"gamma", "baseline", "kl_reward_coef", "kl_reward_estimator"},
        "starpo": starpo, "starpo_s": starpo}
    self.assertEqual(set(want), set(transforms.registered()))
    for algorithm, keys in want.items():
      with self.subTest(algorithm):
        kw = tiny.get_config(f"Bandit-v0,{algorithm}").algorithm_kwargs
        self.assertEqual(set(kw.keys()), keys)
        if algorithm != "reinforce_pp":
          self.assertEqual(kw.kl_coef, 0.0)
    kw = tiny.get_config("Bandit-v0,starpo_s").algorithm_kwargs.to_dict()
    self.assertEqual(kw, {
        "advantage": "grpo", "advantage_kwargs": _ADVANTAGE_DEFAULTS,
        "critic": None, "eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0, "kl_coef": 0.0,
        "kl_estimator": "k3", "entropy_coef": 0.001, "value_coef": 1.0, "value_clip": 0.5,
        "aggregation": "seq-mean-token-mean", "turn_weighting": "episode"})
    # The defaults are in the written config.json (critic: null until set).
    written = json.loads(tiny.get_config().to_json_best_effort())["algorithm_kwargs"]
    self.assertEqual((written["entropy_coef"], written["critic"]), (0.001, None))
    self.assertEqual(written["advantage_kwargs"]["step_gamma"], 0.95)


class RagenConfigsTest(parameterized.TestCase):
  """RAGEN-scale configs: RAGEN v1's values, validated without any weights."""

  @parameterized.parameters(*sorted(envs_jax.registered()))
  def test_every_algorithm_validates(self, env_id):
    for algorithm in transforms.registered():
      c = ragen.get_config(f"{env_id},{algorithm}")
      c.model_dir = "/models/Qwen2.5-0.5B-Instruct"  # never read by validate
      spec.validate(c)
      transforms.make(algorithm, **hyperparameters.objective_kwargs(c))

  def test_ragen_v1_values(self):
    c = ragen.get_config("Sokoban-6x6-1box-v0,starpo_s")
    # The objectives' own defaults: RAGEN's (GAE, no KL, clip-higher 0.28,
    # entropy 0.001).
    self.assertEqual(c.algorithm_kwargs.to_dict(), {
        "advantage": "gae", "advantage_kwargs": _ADVANTAGE_DEFAULTS,
        "critic": None, "eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0, "kl_coef": 0.0,
        "kl_estimator": "k3", "entropy_coef": 0.001, "value_coef": 1.0, "value_clip": 0.5,
        "aggregation": "token-mean", "turn_weighting": "episode"})
    self.assertEqual((c.rollout.num_groups, c.rollout.group_size), (8, 16))
    self.assertEqual((c.rl.learning_rate, c.rl.critic_learning_rate), (1e-6, 1e-5))
    self.assertEqual((c.rl.filter_value, c.rl.weight_decay, c.rl.critic), (0.25, 0.01, "model"))
    # StarPO-S keeps 2 of 8 groups x 16 = one 32-row minibatch; PPO 4 of 32 rows.
    self.assertEqual(c.rl.num_minibatches, 1)
    self.assertEqual(ragen.get_config("Sokoban-6x6-1box-v0,ppo").rl.num_minibatches, 4)
    self.assertEqual((c.sft.steps, c.prompt.think, c.prompt.max_actions_per_turn), (0, True, 5))
    self.assertEqual(c.rollout.history_turns, -1)  # RAGEN v1: the whole conversation
    self.assertEqual((c.eval.num_levels, c.eval.seed, c.eval.temperature), (256, 123, 0.5))

  def test_without_a_model_directory_the_tokenizer_is_named(self):
    c = ragen.get_config("Sokoban-6x6-1box-v0,starpo_s")
    with self.assertRaisesRegex(ValueError, r"config\.tokenizer='': .*model_dir"):
      spec.validate(c)

  def test_builds_and_fits_the_context(self):
    # The Qwen2.5-0.5B architecture (no weights are loaded to build); the
    # shipped tiny tokenizer with ChatML stands in for Qwen's tokenizer.json.
    c = ragen.get_config("Sokoban-6x6-1box-v0,starpo_s")
    c.tokenizer, c.prompt.chat_template = "tiny", "chatml"
    exp = experiment.Experiment(c)
    # 5 turns of a ~100-token state prompt + 400-token replies: RAGEN's 3600.
    self.assertBetween(exp.context_size, 5 * 400, 3600)
    self.assertEqual(exp.rollout_config.batch_size, 128)
    # rl.num_microbatches=-1: one row per device; 2 kept groups x 16 = one
    # 32-row minibatch, so 32 micro-batches on one device.
    self.assertEqual(c.rl.num_microbatches, -1)
    self.assertEqual(exp.train_config.num_microbatches, 32)
    self.assertTrue(exp.model_config.remat)
    self.assertEqual((exp.model_config.dtype, exp.model_config.param_dtype,
                      exp.model_config.attention_impl), ("float32", "float32", "auto"))
    c.compute_dtype, c.attention_impl = "bfloat16", "xla"
    mc = experiment.Experiment(c).model_config
    # bfloat16 activations and KV cache over float32 weights (and moments).
    self.assertEqual((mc.dtype, mc.param_dtype, mc.attention_impl),
                     ("bfloat16", "float32", "xla"))
    c.compute_dtype, c.attention_impl = "float32", "auto"
    self.assertTrue(exp.rollout_config.merge_lora)
    c.rollout.merge_lora = False  # LoRA sampling without a merged copy of the weights
    self.assertFalse(experiment.Experiment(c).rollout_config.sampling().merge_lora)
    c.rollout.merge_lora = True
    c.mesh = "data:8"
    self.assertEqual(experiment.Experiment(c).train_config.num_microbatches, 4)  # 8 fake devices


if __name__ == "__main__":
  absltest.main()
