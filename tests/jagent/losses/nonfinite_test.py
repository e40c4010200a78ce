"""Non-finite values leave the statistics they should not reach.

Non-finite scores leave their group's statistics; non-finite values where the
mask is 0 reach no total, denominator or gradient.
"""

from absl.testing import absltest
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses

NAN = float("nan")
_BAD = (NAN, float("inf"), -float("inf"))


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


@st.composite
def _poisoned_batches(draw):
  """A ``[B, T]`` loss and mask (weights 0, 0.5, 1, 2), the loss with NaN,
  inf or -inf at some mask-0 positions, and optional row weights."""
  b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
  finite = st.floats(-100.0, 100.0, width=32)
  loss = np.asarray(draw(st.lists(finite, min_size=b * t, max_size=b * t)),
                    np.float32).reshape(b, t)
  mask = np.asarray(draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0]),
                                  min_size=b * t, max_size=b * t)),
                    np.float32).reshape(b, t)
  bad = np.asarray(draw(st.lists(st.sampled_from((0.0,) + _BAD),
                                 min_size=b * t, max_size=b * t)),
                   np.float32).reshape(b, t)
  clean = np.where(mask == 0, 0.0, loss).astype(np.float32)
  poisoned = np.where(mask == 0, bad, loss).astype(np.float32)
  weights = draw(st.none() | st.lists(st.sampled_from([0.25, 1.0, 3.0]),
                                      min_size=b, max_size=b))
  return clean, poisoned, mask, weights


def _total_and_grad(mode, loss, mask, weights):
  def total(x):
    return losses.aggregate(x, mask, mode, row_weights=weights).total
  den = losses.aggregate(loss, mask, mode, row_weights=weights).denominator
  value, grad = jax.value_and_grad(total)(jnp.asarray(loss))
  return np.asarray(value), np.asarray(den), np.asarray(grad)


class MaskedNonFiniteTest(absltest.TestCase):

  def test_token_mean_of_a_masked_nan(self):
    out = losses.token_mean(jnp.array([[1.0, NAN]]), jnp.array([[1.0, 0.0]]))
    self.assertEqual((float(out.total), float(out.denominator)), (1.0, 1.0))

  @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
  @hypothesis.given(_poisoned_batches())
  def test_every_mode_ignores_non_finite_values_under_mask_zero(self, batch):
    clean, poisoned, mask, weights = batch
    w = None if weights is None else np.asarray(weights, np.float32)
    for mode in losses.AGGREGATION_MODES:
      want = _total_and_grad(mode, clean, mask, w)
      got = _total_and_grad(mode, poisoned, mask, w)
      for name, g, e in zip(("total", "denominator", "grad"), got, want):
        self.assertTrue(np.all(np.isfinite(g)), (mode, name, g))
        np.testing.assert_array_equal(g, e, err_msg=f"{mode} {name}")
      # Nothing flows back to a masked position.
      np.testing.assert_array_equal(got[2][mask == 0], 0.0)

  def test_gspo_gradient_ignores_masked_log_probs(self):
    # The double where: the loss is computed from the log-probs, so they must
    # be selected before the arithmetic, not only the loss after it.
    m = jnp.array([1.0, 1.0, 0.0, 0.0])
    adv = jnp.full((4,), 0.5)
    old = jnp.array([-1.0, -2.0, NAN, -jnp.inf])

    def total(logp, old):
      loss = losses.gspo_loss(logp, old, adv, m).loss
      return losses.seq_mean_token_mean(loss[None], m[None]).total

    clean = jax.value_and_grad(total)(jnp.array([-1.1, -1.9, 0.0, 0.0]),
                                      old.at[2:].set(0.0))
    bad = jax.value_and_grad(total)(jnp.array([-1.1, -1.9, NAN, -jnp.inf]),
                                    old)
    np.testing.assert_array_equal(bad[0], clean[0])
    np.testing.assert_array_equal(bad[1], clean[1])
    np.testing.assert_array_equal(bad[1][2:], [0.0, 0.0])
    # exp(mean(0.1 - 0.1)) = 1 (unclipped): loss -0.5 on both tokens; the
    # gradient of -A * s_t w.r.t. logp_t is -A * s / |y| = -0.25.
    self.assertAlmostEqual(float(clean[0]), -0.5, places=6)
    np.testing.assert_allclose(bad[1][:2], [-0.25, -0.25], rtol=1e-6)

  def test_whiten_and_running_norm_ignore_masked_values(self):
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    x = jnp.array([[1.0, 2.0, 0.0], [3.0, 0.0, 4.0]])
    bad = jnp.where(m > 0, x, jnp.array([[0.0, 0.0, NAN], [0.0, jnp.inf, 0.0]]))

    def whiten_sum(v):
      return jnp.sum(losses.masked_whiten(v, m) * jnp.arange(6.0).reshape(2, 3))

    for f in (lambda v: losses.masked_whiten(v, m), jax.grad(whiten_sum)):
      np.testing.assert_array_equal(f(bad), f(x))
    # Mean 2.5, unbiased var 5/3 over [1, 2, 3, 4].
    np.testing.assert_allclose(
        losses.masked_whiten(bad, m),
        [[-1.5, -0.5, 0.0], [0.5, 0.0, 1.5]] / np.sqrt(5 / 3 + 1e-8),
        rtol=1e-6)
    state = losses.running_norm_init()
    got = losses.running_norm_update(bad, state, m)
    np.testing.assert_array_equal(
        jax.tree.leaves(got), jax.tree.leaves(losses.running_norm_update(x, state, m)))
    np.testing.assert_allclose([got.count, got.mean, got.m2], [4.0, 2.5, 5.0])

  def test_bilevel_gae_ignores_a_masked_reward(self):
    m = jnp.array([1.0, 1.0, 0.0, 1.0])
    v = jnp.zeros(4)
    ids = jnp.array([0, 0, 0, 1], jnp.int32)
    r = jnp.array([0.0, 1.0, 0.0, 2.0])
    got = losses.bilevel_gae(r.at[2].set(NAN), v, m, ids, turn_gamma=0.5)
    want = losses.bilevel_gae(r, v, m, ids, turn_gamma=0.5)
    np.testing.assert_array_equal(got.advantages, want.advantages)
    # Turn rewards 1 and 2, turn discount 0.5, lambda 1: A = 1 + 0.5 * 2 on
    # turn 0's tokens, 2 on turn 1's.
    np.testing.assert_allclose(got.advantages, [2.0, 2.0, 0.0, 2.0])


if __name__ == "__main__":
  absltest.main()
