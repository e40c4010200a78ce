"""Every tiny config (registered env x registered algorithm) is valid and fits its replies."""

from absl.testing import absltest
from absl.testing import parameterized

import envs_jax
from experiments import common
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


if __name__ == "__main__":
  absltest.main()
