"""train_step: PPO epochs/minibatches, non-finite skips, GRPO learning signal."""

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jagent import models
from jagent import train
from jagent import transforms

CFG = models.ModelConfig(vocab_size=32, embed_dim=16, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32)
B, S, G = 8, 8, 4
PARAMS = models.init(CFG, jax.random.key(0))
# Built once: the objective is a static argument of the jitted step.
OBJ = transforms.grpo(kl_coef=0.0)
TC = train.TrainConfig(
    model=CFG, actor_optimizer=train.OptimizerConfig(learning_rate=1e-2),
    temperature=0.9, ppo_epochs=2, num_minibatches=2, num_microbatches=2)


def _batch(rewards_row):
  tokens = jax.random.randint(jax.random.key(1), (B, S), 1, CFG.vocab_size)
  mask = jnp.zeros((B, S)).at[:, 4:].set(1.0)
  rewards = jnp.zeros((B, S)).at[:, -1].set(jnp.asarray(rewards_row))
  # Garbage old log-probs: the step must recompute them.
  return transforms.Batch(tokens=tokens, loss_mask=mask, rewards=rewards,
                          old_logprobs=jnp.full((B, S), -7.0), group_size=G)


REWARDS = np.array([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.2], np.float32)


def _leaves_equal(a, b):
  return all(np.array_equal(np.asarray(x), np.asarray(y))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


class TrainStepTest(chex.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.state = train.init_train_state(PARAMS, jax.random.key(0), config=TC,
                                       objective=OBJ)

  @pytest.mark.smoke
  def test_epochs_and_minibatches(self):
    state, m = train.train_step(self.state, _batch(REWARDS), objective=OBJ,
                                config=TC)
    for k, v in m.items():
      self.assertEqual((v.shape, v.dtype), ((), jnp.float32), k)
    # 2 epochs x 2 minibatches, all applied.
    self.assertEqual(int(state.num_updates), 4)
    self.assertEqual(int(state.step), 1)
    self.assertEqual(float(m["train/updates_applied"]), 4.0)
    # The first minibatch is exactly on-policy: ratio 1, nothing clipped.
    self.assertAlmostEqual(float(m["first_minibatch/policy/ratio"]), 1.0,
                           delta=1e-6)
    self.assertEqual(float(m["first_minibatch/policy/clip_frac"]), 0.0)
    # Later updates are off-policy: the mean ratio over all updates moved.
    self.assertGreater(abs(float(m["policy/ratio"]) - 1.0), 1e-4)
    self.assertGreater(float(m["train/grad_norm"]), 0.0)
    self.assertAlmostEqual(float(m["train/lr"]), 1e-2, delta=1e-9)
    self.assertFalse(_leaves_equal(state.params, self.state.params))
    # The rng advanced; the adam count equals the applied updates.
    self.assertFalse(np.array_equal(state.rng, self.state.rng))
    self.assertEqual(int(state.opt_state[1][0].count), 4)

  def test_nonfinite_rewards_drop_their_episodes_and_the_rest_trains(self):
    bad = REWARDS.copy()
    bad[0] = np.nan  # group 0 (rows 0-3)
    bad[5] = np.inf  # group 1 (rows 4-7)
    state, m = train.train_step(self.state, _batch(bad), objective=OBJ,
                                config=TC)
    # The two episodes are dropped (counted), the others update as usual.
    self.assertEqual(float(m["rollout/nonfinite_episodes"]), 2.0)
    self.assertEqual(int(state.num_updates), 4)
    self.assertEqual(int(state.skipped_nonfinite), 0)
    self.assertEqual(float(m["train/updates_applied"]), 4.0)
    self.assertFalse(_leaves_equal(state.params, self.state.params))
    for leaf in jax.tree.leaves(state.params):
      self.assertTrue(np.all(np.isfinite(np.asarray(leaf))))
    # The same update as marking those rows invalid by hand.
    by_hand = _batch(np.where(np.isfinite(bad), bad, 0.0))
    valid = np.isfinite(bad)
    by_hand = by_hand.replace(row_valid=valid,
                              loss_mask=by_hand.loss_mask * valid[:, None])
    want, _ = train.train_step(self.state, by_hand, objective=OBJ, config=TC)
    chex.assert_trees_all_close(state.params, want.params, atol=1e-6)

  def test_nonfinite_updates_are_skipped_and_counted(self):
    state = self.state
    # Only row 0 bad (a non-finite sampler log-prob, which no advantage
    # spreads to its group): its minibatch (strided: rows 0, 2, 4, 6) is
    # skipped in both epochs, the other (rows 1, 3, 5, 7) applies.
    old = np.full((B, S), -7.0, np.float32)
    old[0, 5] = np.nan
    state, m = train.train_step(
        state, _batch(REWARDS).replace(sampler_logprobs=old), objective=OBJ,
        config=TC.replace(old_logprobs="sampler"))
    self.assertEqual(int(state.skipped_nonfinite), 2)
    self.assertEqual(float(m["train/updates_nonfinite"]), 2.0)
    self.assertEqual(float(m["train/skipped_nonfinite_total"]), 2.0)
    self.assertEqual(int(state.num_updates), 2)
    self.assertTrue(np.isfinite(float(m["train/grad_norm"])))
    # The next finite step applies everything.
    state, m = train.train_step(state, _batch(REWARDS), objective=OBJ,
                                config=TC)
    self.assertEqual(int(state.num_updates), 6)
    self.assertEqual(float(m["train/updates_applied"]), 4.0)
    for leaf in jax.tree.leaves(state.params):
      self.assertTrue(np.all(np.isfinite(np.asarray(leaf))))

  def test_a_batch_without_trained_tokens_reports_no_update_metrics(self):
    # Every loss-mask entry 0 (a filter that kept no group): the 4 updates are
    # empty and skipped; what they would have measured is NaN, not 0 (an
    # entropy of 0 reads as a collapsed policy); the counts stay.
    batch = _batch(REWARDS)
    state, m = train.train_step(self.state, batch.replace(loss_mask=batch.loss_mask * 0.0),
                                objective=OBJ, config=TC)
    self.assertTrue(_leaves_equal(state.params, self.state.params))
    self.assertEqual(int(state.skipped_empty), 4)
    for k, want in (("train/updates_applied", 0.0), ("train/updates_empty", 4.0),
                    ("train/updates_nonfinite", 0.0), ("train/skipped_empty_total", 4.0),
                    ("train/trained_tokens", 0.0)):
      self.assertEqual(float(m[k]), want, k)
    self.assertAlmostEqual(float(m["train/lr"]), 1e-2, delta=1e-9)
    for k in ("actor/entropy", "train/grad_norm", "train/grad_norm_max", "loss/total",
              "policy/ratio", "policy/clip_frac", "first_minibatch/policy/ratio"):
      self.assertTrue(np.isnan(float(m[k])), (k, float(m[k])))

  def test_sampler_old_logprobs(self):
    # With the trainer's own log-probs as the sampler's, "sampler" mode gives
    # the same step as "recompute" (2 epochs x 2 minibatches: the old
    # log-probs set every ratio after the first update).
    batch = _batch(REWARDS)
    exact = train.token_logprobs(PARAMS, batch.tokens, config=CFG,
                                 temperature=TC.temperature).logprobs
    want, m_want = train.train_step(self.state, batch, objective=OBJ, config=TC)
    cfg = TC.replace(old_logprobs="sampler")
    got, m_got = train.train_step(
        self.state, batch.replace(sampler_logprobs=exact), objective=OBJ, config=cfg)
    # atol 1e-5: the two old log-probs differ by float rounding (~1e-7),
    # which Adam's normalisation scales up on near-zero gradients.
    chex.assert_trees_all_close(got.params, want.params, atol=1e-5)
    self.assertAlmostEqual(float(m_got["policy/ratio"]), float(m_want["policy/ratio"]),
                           places=5)
    # 4 updates: the entropy is measured in the loss passes (averaged), so
    # it is close to, not equal to, the pre-update entropy.
    self.assertAlmostEqual(float(m_got["actor/entropy"]),
                           float(m_want["actor/entropy"]), delta=0.05)
    self.assertGreater(float(m_got["actor/entropy"]), 0.5)
    # Other behaviour log-probs move the ratio: they are really used.
    _, m_off = train.train_step(
        self.state, batch.replace(sampler_logprobs=exact - 0.5), objective=OBJ, config=cfg)
    self.assertAlmostEqual(float(m_off["first_minibatch/policy/ratio"]),
                           float(np.exp(0.5)), places=4)
    with self.assertRaisesRegex(ValueError, "sampler_logprobs"):
      train.train_step(self.state, batch, objective=OBJ, config=cfg)
    with self.assertRaisesRegex(ValueError, "old_logprobs"):
      TC.replace(old_logprobs="vllm")

  def test_bad_batch_raises_before_compile(self):
    with self.assertRaisesRegex(ValueError, "divisible"):
      train.train_step(self.state, _batch(REWARDS).select_rows(0, 6),
                       objective=OBJ, config=TC)
    with self.assertRaisesRegex(ValueError, "loss_mask"):
      train.train_step(self.state, _batch(REWARDS).replace(loss_mask=None),
                       objective=OBJ, config=TC)
    with self.assertRaisesRegex(ValueError, "num_minibatches"):
      train.TrainConfig(model=CFG, num_minibatches=0)

  def test_grpo_raises_the_rewarded_token(self):
    # One prompt, two possible one-token replies: token 10 earns 1, token 11
    # earns 0. GRPO (with its default KL to the reference) must move
    # probability mass to token 10.
    obj = transforms.grpo()
    needs = train.objective_needs("grpo")
    self.assertEqual(needs, train.ObjectiveNeeds(critic=False, reference=True, entropy=True,
                                                 groups=True))
    cfg = TC.replace(ppo_epochs=1, num_minibatches=1, num_microbatches=1,
                     actor_optimizer=train.OptimizerConfig(learning_rate=1e-2))
    prompt = jnp.array([5, 6, 7], jnp.int32)
    reply = jnp.array([10, 10, 10, 10, 11, 11, 11, 11], jnp.int32)
    tokens = jnp.concatenate([jnp.tile(prompt, (8, 1)), reply[:, None]], 1)
    mask = jnp.zeros((8, 4)).at[:, 3].set(1.0)
    rewards = mask * (reply == 10)[:, None]
    batch = transforms.Batch(tokens=tokens, loss_mask=mask, rewards=rewards,
                             group_size=8)
    state = train.init_train_state(PARAMS, jax.random.key(1), config=cfg,
                                   reference=needs.reference, objective=obj)
    probe = jnp.array([[5, 6, 7, 10], [5, 6, 7, 11]], jnp.int32)

    def logp(params):
      lp = train.token_logprobs(params, probe, config=CFG, temperature=0.9)
      return np.asarray(lp.logprobs[:, 3])

    before = logp(state.params)
    for _ in range(5):
      state, m = train.train_step(state, batch, objective=obj, config=cfg)
    after = logp(state.params)
    # Measured: about +0.94 and -0.72 nats.
    self.assertGreater(after[0] - before[0], 0.6)  # token 10 up
    self.assertLess(after[1] - before[1], -0.4)  # token 11 down
    self.assertGreater(float(m["kl/mean"]), 0.0)  # moved away from the ref
    self.assertTrue(_leaves_equal(state.ref_params, PARAMS))


if __name__ == "__main__":
  absltest.main()
