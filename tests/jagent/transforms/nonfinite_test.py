"""Every advantage stage drops an episode with a non-finite reward, trains the rest."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import transforms

# Two groups of four one-token episodes; episode 1 got a NaN reward.
_SCORES = np.array([1.0, np.nan, 0.0, 1.0, 0.5, 0.0, 2.0, 1.0], np.float32)


def _batch(scores=_SCORES):
  mask = np.zeros((8, 3), np.float32)
  mask[:, 1:] = 1.0
  rewards = np.zeros((8, 3), np.float32)
  rewards[:, 2] = scores
  ids = np.where(mask > 0, 0, -1).astype(np.int32)
  return transforms.Batch(
      loss_mask=mask, rewards=rewards, turn_ids=ids,
      values=np.linspace(-1, 1, 24, dtype=np.float32).reshape(8, 3),
      anchor_hashes=np.ones((8, 1), np.int32), group_size=4)


def _run(stage, batch):
  out, _ = jax.jit(stage.update)(batch, stage.init(batch))
  return out


class NonFiniteStagesTest(parameterized.TestCase):

  def test_grpo_stage_normalises_over_the_finite_members(self):
    out = _run(transforms.compute_grpo(), _batch())
    adv = np.asarray(out.advantages)
    std = np.sqrt(1.0 / 3.0)
    want0 = np.array([1 / 3, 0.0, -2 / 3, 1 / 3]) / (std + 1e-6)
    np.testing.assert_allclose(adv[:4, 2], want0, rtol=1e-5)
    np.testing.assert_allclose(
        adv[4:, 2], losses.grpo_advantages(jnp.asarray(_SCORES[4:])),
        rtol=1e-6)
    np.testing.assert_array_equal(adv[1], np.zeros(3))
    np.testing.assert_array_equal(out.loss_mask[1], np.zeros(3))
    np.testing.assert_array_equal(out.row_valid, np.arange(8) != 1)
    self.assertEqual(float(out.metrics["rollout/nonfinite_episodes"]), 1.0)

  @parameterized.parameters("grpo", "dr_grpo", "rloo", "reinforce_pp",
                            "reinforce_pp_baseline", "gigpo", "gae",
                            "bilevel_gae")
  def test_every_estimator_trains_the_rest(self, name):
    out = _run(transforms.make_advantage(name), _batch())
    adv = np.asarray(out.advantages)
    self.assertTrue(np.all(np.isfinite(adv)), name)
    np.testing.assert_array_equal(adv[1], np.zeros(3))
    np.testing.assert_array_equal(out.loss_mask[1], np.zeros(3))
    self.assertGreater(np.abs(adv).sum(), 0.0)
    self.assertEqual(float(out.metrics["rollout/nonfinite_episodes"]), 1.0)
    # The same as the episode marked invalid by hand.
    hand = _batch(np.where(np.isfinite(_SCORES), _SCORES, 0.0))
    valid = np.arange(8) != 1
    hand = hand.replace(row_valid=valid,
                        loss_mask=hand.loss_mask * valid[:, None])
    want = _run(transforms.make_advantage(name), hand)
    np.testing.assert_allclose(adv, want.advantages, rtol=1e-6, atol=1e-7)
    if out.returns is not None:
      self.assertTrue(np.all(np.isfinite(np.asarray(out.returns))))

  def test_filter_and_inf_scores(self):
    batch = _batch(np.zeros(8, np.float32)).replace(
        scores=np.where(np.arange(8) == 6, np.inf, 1.0).astype(np.float32))
    chain = transforms.chain(transforms.filter_rollouts("top_fraction", 1.0),
                             transforms.compute_grpo())
    out = _run(chain, batch)
    self.assertEqual(float(out.metrics["rollout/nonfinite_episodes"]), 1.0)
    self.assertTrue(np.all(np.isfinite(np.asarray(out.advantages))))
    self.assertEqual(float(out.scores[6]), 0.0)
    self.assertFalse(bool(out.row_valid[6]))

  def test_filter_ranks_a_group_by_its_finite_members(self):
    # Group 0's finite members agree ([1, 1, 1]: no spread); counting the
    # dropped episode's zeroed score would give it std 0.5 and rank it first.
    scores = np.array([1.0, np.nan, 1.0, 1.0, 0.0, 0.4, 0.0, 0.4], np.float32)
    out = _run(transforms.filter_rollouts("top_fraction", 0.5), _batch(scores))
    np.testing.assert_array_equal(out.keep, np.arange(8) >= 4)
    self.assertAlmostEqual(float(out.metrics["filter/reward_std"]),
                           np.std([0.0, 0.4, 0.0, 0.4], ddof=1) / 2, places=6)
    self.assertEqual(float(out.metrics["filter/kept_ratio"]), 0.5)

  def test_finite_batches_keep_their_values(self):
    finite = _batch(np.where(np.isfinite(_SCORES), _SCORES, 0.0))
    out = _run(transforms.compute_grpo(), finite)
    np.testing.assert_array_equal(out.loss_mask, finite.loss_mask)
    np.testing.assert_array_equal(out.rewards, finite.rewards)
    self.assertEqual(float(out.metrics["rollout/nonfinite_episodes"]), 0.0)


if __name__ == "__main__":
  absltest.main()
