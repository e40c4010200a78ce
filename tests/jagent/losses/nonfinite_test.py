"""Non-finite scores leave their group's statistics instead of poisoning them."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses

NAN = float("nan")


class NonFiniteGroupTest(absltest.TestCase):

  def test_grpo_leaves_the_nan_member_out(self):
    got = np.asarray(jax.jit(losses.grpo_advantages)(
        jnp.array([1.0, NAN, 0.0, 1.0])))
    # Over the three finite members [1, 0, 1]: mean 2/3, unbiased std
    # sqrt(1/3); the NaN one gets 0.
    std = np.sqrt(1.0 / 3.0)
    want = np.array([1 / 3, 0.0, -2 / 3, 1 / 3]) / (std + 1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    dr = np.asarray(jax.jit(losses.dr_grpo_advantages)(
        jnp.array([1.0, jnp.inf, 0.0, 1.0])))
    np.testing.assert_allclose(dr, [1 / 3, 0.0, -2 / 3, 1 / 3], rtol=1e-5)
    # RLOO over 3 members: n / (n - 1) times the centred score.
    rl = np.asarray(jax.jit(losses.rloo_advantages)(
        jnp.array([1.0, -jnp.inf, 0.0, 1.0])))
    np.testing.assert_allclose(rl, [0.5, 0.0, -1.0, 0.5], rtol=1e-5)

  def test_valid_mask_and_degenerate_groups(self):
    s = jnp.array([1.0, 5.0, 0.0, 1.0])
    v = jnp.array([True, False, True, True])
    got = losses.grpo_advantages(s, valid_g=v)
    want = losses.grpo_advantages(jnp.array([1.0, NAN, 0.0, 1.0]))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # One member left: no comparison, 0 everywhere; all equal: 0.
    one = losses.grpo_advantages(jnp.array([NAN, 2.0, NAN, NAN]))
    np.testing.assert_array_equal(one, np.zeros(4))
    np.testing.assert_array_equal(
        losses.rloo_advantages(jnp.array([NAN, 2.0, NAN, NAN])), np.zeros(4))
    eq = losses.grpo_advantages(jnp.array([0.7, NAN, 0.7, 0.7]))
    np.testing.assert_array_equal(eq, np.zeros(4))

  def test_finite_input_is_unchanged_bit_for_bit(self):
    s = jnp.array([0.3, 1.7, -2.1, 0.9, 0.9, 4.0])
    c = s - jnp.mean(s)
    c = c - jnp.mean(c)
    std = jnp.sqrt(jnp.sum(jnp.square(c)) / 5)
    np.testing.assert_array_equal(losses.grpo_advantages(s), c / (std + 1e-6))
    np.testing.assert_array_equal(losses.rloo_advantages(s), c * (6 / 5))

  def test_gigpo_drops_an_episode_with_a_nan_turn_reward(self):
    scores = jnp.array([1.0, 0.0, 1.0])
    rewards = jnp.array([[0.0, 1.0], [NAN, 0.0], [0.5, 0.5]])
    anchors = jnp.array([[1, 2], [1, 3], [1, 2]], jnp.int32)
    mask = jnp.ones((3, 2))
    out = losses.gigpo_advantages(scores, rewards, anchors, mask)
    self.assertTrue(np.all(np.isfinite(np.asarray(out.advantages))))
    np.testing.assert_array_equal(out.advantages[1], [0.0, 0.0])
    # The others are computed as if the bad episode were not there.
    keep = jnp.array([0, 2])
    want = losses.gigpo_advantages(scores[keep], rewards[keep], anchors[keep],
                                   mask[keep])
    np.testing.assert_allclose(out.advantages[keep], want.advantages,
                               rtol=1e-6)
    np.testing.assert_array_equal(out.anchor_group_size[1], [0, 0])


if __name__ == "__main__":
  absltest.main()
