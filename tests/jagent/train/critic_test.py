"""The critic: value alignment and shapes, and value learning through train_step."""

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import models
from jagent import train
from jagent import transforms

CFG = models.ModelConfig(vocab_size=32, embed_dim=16, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32)
B, S = 8, 8
PARAMS = models.init(CFG, jax.random.key(0))
TOKENS = jax.random.randint(jax.random.key(1), (B, S), 1, CFG.vocab_size)


def _hidden(params, tokens):
  pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return models.hidden_states(params, tokens, pos, config=CFG)[0]


class CriticTest(chex.TestCase):

  def test_value_alignment_and_shapes(self):
    crit = train.init_critic(CFG, jax.random.key(0), kind="head")
    self.assertIsNone(crit.trunk)
    chex.assert_shape(crit.head.w, (CFG.embed_dim,))
    w = jax.random.normal(jax.random.key(5), (CFG.embed_dim,))
    crit = crit.replace(head=train.ValueHead(w=w, b=jnp.float32(0.5)))
    h = _hidden(PARAMS, TOKENS)
    values = train.critic_values(crit, TOKENS, config=CFG, policy_hidden=h)
    chex.assert_shape(values, (B, S))
    self.assertEqual(values.dtype, jnp.float32)
    # values[:, s] is the value of the context before token s: h[:, s-1].
    want = np.asarray(h, np.float64)[:, :-1] @ np.asarray(w, np.float64) + 0.5
    np.testing.assert_allclose(np.asarray(values)[:, 1:], want, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(np.asarray(values)[:, 0], 0.0)
    # Changing token 4 changes the values of positions 5.. only.
    other = TOKENS.at[:, 4].set((TOKENS[:, 4] + 1) % CFG.vocab_size)
    v2 = train.critic_values(crit, other, config=CFG,
                             policy_hidden=_hidden(PARAMS, other))
    np.testing.assert_array_equal(np.asarray(values)[:, :5],
                                  np.asarray(v2)[:, :5])
    self.assertTrue(np.all(np.asarray(values)[:, 5:] != np.asarray(v2)[:, 5:]))

  def test_head_reads_detached_policy_and_model_has_its_own_trunk(self):
    head = train.init_critic(CFG, jax.random.key(0), kind="head")
    w = jax.random.normal(jax.random.key(5), (CFG.embed_dim,))
    head = head.replace(head=head.head.replace(w=w))
    # No value gradient reaches the policy through a head critic.
    g = jax.grad(lambda p: jnp.sum(train.critic_values(
        head, TOKENS, config=CFG, policy_hidden=_hidden(p, TOKENS))))(PARAMS)
    self.assertTrue(all(float(jnp.max(jnp.abs(x))) == 0.0
                        for x in jax.tree.leaves(g)))
    # A "model" critic starts as a copy of the policy: same values.
    model = train.init_critic(CFG, jax.random.key(0), kind="model",
                              policy_params=PARAMS)
    model = model.replace(head=head.head)
    np.testing.assert_allclose(
        np.asarray(train.critic_values(model, TOKENS, config=CFG)),
        np.asarray(train.critic_values(head, TOKENS, config=CFG,
                                       policy_hidden=_hidden(PARAMS, TOKENS))),
        rtol=1e-6, atol=1e-6)
    with self.assertRaisesRegex(ValueError, "policy_hidden"):
      train.critic_values(head, TOKENS, config=CFG)
    with self.assertRaisesRegex(ValueError, "critic kind"):
      train.init_critic(CFG, jax.random.key(0), kind="shared")

  def test_objective_needs(self):
    # (critic, reference, entropy, groups)
    self.assertEqual(train.objective_needs("ppo"), (True, False, True, False))
    self.assertEqual(train.objective_needs("starpo_s"), (True, False, True, False))
    self.assertEqual(train.objective_needs("starpo_s", advantage="grpo"),
                     (False, False, True, True))
    self.assertEqual(train.objective_needs("starpo"), (True, True, True, False))
    self.assertEqual(train.objective_needs("starpo", kl_coef=0.0,
                                           critic=False), (False, False, True, False))
    self.assertEqual(train.objective_needs("reinforce_pp"), (False, True, False, False))
    self.assertEqual(train.objective_needs("dapo"), (False, False, False, True))
    with self.assertRaisesRegex(ValueError, "unknown objective 'my_algo'"):
      train.objective_needs("my_algo")
    with self.assertRaisesRegex(ValueError, "ppo"):
      train.objective_needs("ppo", eps_hi=0.3)

  def test_ppo_and_starpo_s_train_the_critic(self):
    mask = jnp.zeros((B, S)).at[:, 4:].set(1.0)
    scores = np.array([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.2], np.float32)
    rewards = jnp.zeros((B, S)).at[:, -1].set(scores)
    batch = transforms.Batch(tokens=TOKENS, loss_mask=mask, rewards=rewards,
                             group_size=4)
    tc = train.TrainConfig(
        model=CFG, actor_optimizer=train.OptimizerConfig(learning_rate=1e-6),
        critic_optimizer=train.OptimizerConfig(learning_rate=1e-2))
    # Values start at 0 and gamma = lambda = 1, so every trained token's
    # return is its row's score: value loss 0.5 * mean(score^2).
    first_loss = 0.5 * np.mean(scores ** 2)
    cases = (("ppo", transforms.ppo(), "model", 0.05),
             ("starpo_s", transforms.starpo_s(
                 filter_config=losses.FilterConfig(value=1.0)), "head", 0.6))
    for name, obj, kind, ratio in cases:
      self.assertTrue(train.objective_needs(name).critic)
      state = train.init_train_state(PARAMS, jax.random.key(0), config=tc,
                                     critic=kind, objective=obj)
      value_losses = []
      for _ in range(30):
        state, m = train.train_step(state, batch, objective=obj, config=tc)
        value_losses.append(float(m["loss/value"]))
      np.testing.assert_allclose(value_losses[0], first_loss, rtol=1e-5)
      # Measured after 30 steps: model ~0.003 / 0.206, head ~0.09 / 0.206.
      self.assertLess(value_losses[-1], ratio * value_losses[0], (name, kind, value_losses))
      self.assertGreater(float(m["train/critic_grad_norm"]), 0.0)
      self.assertAlmostEqual(float(m["train/critic_lr"]), 1e-2, delta=1e-9)


if __name__ == "__main__":
  absltest.main()
