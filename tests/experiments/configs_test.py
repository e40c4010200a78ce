"""Every tiny config (registered env x registered algorithm) is valid and fits its replies."""

from absl.testing import absltest
from absl.testing import parameterized

import envs_jax
from experiments import common
from experiments.configs import ragen
from experiments.configs import tiny
from jagent import tokenizers
from jagent import transforms

TOK = tokenizers.load_tiny_tokenizer()


class TinyConfigsTest(parameterized.TestCase):

  @parameterized.parameters(*sorted(envs_jax.registered()))
  def test_every_algorithm_validates_and_builds(self, env_id):
    for algorithm in transforms.registered():
      c = tiny.get_config(f"{env_id},{algorithm}")
      common.validate(c)
      transforms.make(algorithm, **dict(c.algorithm_kwargs))

  @parameterized.parameters(*sorted(envs_jax.registered()))
  def test_expert_answers_fit_a_turn(self, env_id):
    c = tiny.get_config(f"{env_id},starpo_s")
    env, _ = envs_jax.make(env_id)
    # The longest action name, or a long Countdown expression.
    answers = list(env.action_names) or ["(99 - 98) + (97 - 96)"]
    for a in answers:
      n = len(TOK.encode(f"<answer>{a}</answer>")) + 1  # + EOS
      self.assertLessEqual(n, c.rollout.max_tokens_per_turn, f"{env_id}: {a}")

  def test_default_is_the_main_job(self):
    c = tiny.get_config()
    self.assertEqual((c.env, c.algorithm), ("Sokoban-6x6-1box-v0", "starpo_s"))
    self.assertGreaterEqual(c.eval.num_levels, 128)


class RagenConfigsTest(parameterized.TestCase):
  """RAGEN-scale configs: RAGEN v1's values, validated without any weights."""

  @parameterized.parameters(*sorted(envs_jax.registered()))
  def test_every_algorithm_validates(self, env_id):
    for algorithm in transforms.registered():
      c = ragen.get_config(f"{env_id},{algorithm}")
      c.model_dir = "/models/Qwen2.5-0.5B-Instruct"  # never read by validate
      common.validate(c)
      transforms.make(algorithm, **dict(c.algorithm_kwargs))

  def test_ragen_v1_values(self):
    c = ragen.get_config("Sokoban-6x6-1box-v0,starpo_s")
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
      common.validate(c)

  def test_builds_and_fits_the_context(self):
    # The Qwen2.5-0.5B architecture (no weights are loaded to build); the
    # shipped tiny tokenizer with ChatML stands in for Qwen's tokenizer.json.
    c = ragen.get_config("Sokoban-6x6-1box-v0,starpo_s")
    c.tokenizer, c.prompt.chat_template = "tiny", "chatml"
    exp = common.Experiment(c)
    # 5 turns of a ~100-token state prompt + 400-token replies: RAGEN's 3600.
    self.assertBetween(exp.context_size, 5 * 400, 3600)
    self.assertEqual(exp.rollout_config.batch_size, 128)
    # rl.num_microbatches=-1: one row per device; 2 kept groups x 16 = one
    # 32-row minibatch, so 32 micro-batches on one device.
    self.assertEqual(c.rl.num_microbatches, -1)
    self.assertEqual(exp.train_config.num_microbatches, 32)
    self.assertTrue(exp.model_config.remat)
    c.mesh = "data:8"
    self.assertEqual(common.Experiment(c).train_config.num_microbatches, 4)  # 8 fake devices


if __name__ == "__main__":
  absltest.main()
