"""Tests for jagent.losses policy losses: hand values and clipped gradients."""

import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jagent import losses


def _jit(fn, **static):
  return jax.jit(functools.partial(fn, **static))


# Ratios 0.5, 0.9, 1.0, 1.1, 1.5 against eps_low = 0.2, eps_high = 0.28.
_RATIOS = np.array([0.5, 0.9, 1.0, 1.1, 1.5], np.float32)
_OLD = np.full(5, -1.0, np.float32)
_NEW = _OLD + np.log(_RATIOS)


@pytest.mark.smoke
class PpoClipTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_values_positive_and_negative_advantages(self):
    fn = self.variant(functools.partial(losses.ppo_clip_loss, eps_low=0.2,
                                        eps_high=0.28))
    pos = fn(_NEW, _OLD, np.full(5, 2.0, np.float32))
    # A > 0: -A min(rho, clip(rho)) -> rho capped at 1.28 from above only.
    np.testing.assert_allclose(pos.loss, -2 * np.array([0.5, 0.9, 1.0, 1.1,
                                                        1.28]), rtol=1e-5)
    np.testing.assert_array_equal(pos.clipped, [0, 0, 0, 0, 1])
    neg = fn(_NEW, _OLD, np.full(5, -1.0, np.float32))
    # A < 0: -A max(rho, clip(rho)) -> rho floored at 0.8 from below only.
    np.testing.assert_allclose(neg.loss, [0.8, 0.9, 1.0, 1.1, 1.5], rtol=1e-5)
    np.testing.assert_array_equal(neg.clipped, [1, 0, 0, 0, 0])
    np.testing.assert_allclose(pos.ratio, _RATIOS, rtol=1e-5)

  def test_dual_clip(self):
    ratios = np.array([1.0, 2.9, 3.5, 10.0], np.float32)
    new = np.log(ratios)
    old = np.zeros(4, np.float32)
    adv = np.array([-1.0, -1.0, -1.0, 2.0], np.float32)
    out = _jit(losses.ppo_clip_loss, dual_clip=3.0)(new, old, adv)
    # A<0: min(max(rho, .8) * 1, 3); A>0 (last): -2 * 1.2.
    np.testing.assert_allclose(out.loss, [1.0, 2.9, 3.0, -2.4], rtol=1e-5)
    np.testing.assert_array_equal(out.dual_clipped, [0, 0, 1, 0])

  def test_clipped_regions_have_zero_gradient(self):
    adv = np.array([2.0, 2.0, 2.0, -1.0, -1.0, -1.0, -1.0], np.float32)
    ratios = np.array([0.5, 1.0, 1.5, 0.5, 1.0, 2.0, 4.0], np.float32)
    old = np.zeros(7, np.float32)
    new = np.log(ratios)

    def total(logp):
      out = losses.ppo_clip_loss(logp, old, adv, 0.2, 0.28, 3.0)
      return jnp.sum(out.loss), out

    grad, out = jax.jit(jax.grad(total, has_aux=True))(new)
    # d/dlogp of -A rho = -A rho where unclipped; 0 where a clip is active.
    active = np.array([0, 0, 1, 1, 0, 0, 1], bool)
    np.testing.assert_array_equal(out.clipped | out.dual_clipped, active)
    np.testing.assert_array_equal(grad[active], 0.0)
    np.testing.assert_allclose(grad[~active], (-adv * ratios)[~active],
                               rtol=1e-5)

  def test_bad_arguments(self):
    x = np.zeros(3, np.float32)
    with self.assertRaisesRegex(ValueError, "dual_clip"):
      losses.ppo_clip_loss(x, x, x, dual_clip=1.0)
    with self.assertRaisesRegex(ValueError, "eps_low"):
      losses.ppo_clip_loss(x, x, x, eps_low=1.0)
    with self.assertRaisesRegex(ValueError, "shape"):
      losses.ppo_clip_loss(x, np.zeros(4, np.float32), x)

  def test_log_ratio_clamped(self):
    out = jax.jit(losses.importance_ratio)(np.array([100.0, -100.0]),
                                           np.zeros(2))
    np.testing.assert_allclose(out, [np.exp(20.0), np.exp(-20.0)], rtol=1e-5)


class GspoTest(chex.TestCase):

  def test_value_and_gradient_match_sequence_level_objective(self):
    rng = np.random.default_rng(0)
    logp = rng.normal(size=6).astype(np.float32) * 0.01 - 1.0
    old = logp + rng.normal(size=6).astype(np.float32) * 0.01
    mask = np.array([1, 1, 1, 1, 0, 0], np.float32)
    eps_low, eps_high = 0.05, 0.05

    for a in (1.5, -0.5):
      adv = np.full(6, a, np.float32)

      def token_form(lp, adv=adv):
        out = losses.gspo_loss(lp, old, adv, mask, eps_low, eps_high)
        agg = losses.seq_mean_token_mean(out.loss[None], mask[None])
        return agg.total / agg.denominator

      def sequence_form(lp, a=a):
        s = jnp.exp(jnp.sum(mask * (lp - old)) / jnp.sum(mask))
        return jnp.maximum(-a * s, -a * jnp.clip(s, 1 - eps_low, 1 + eps_high))

      v1, g1 = jax.jit(jax.value_and_grad(token_form))(logp)
      v2, g2 = jax.jit(jax.value_and_grad(sequence_form))(logp)
      np.testing.assert_allclose(v1, v2, rtol=1e-5)
      np.testing.assert_allclose(g1, g2, rtol=1e-4, atol=1e-7)

  def test_ratio_is_sequence_level_and_clipping_kills_gradient(self):
    logp = np.array([0.0, 0.0, 0.0], np.float32)
    old = np.array([-0.3, -0.3, 5.0], np.float32)  # masked token ignored
    mask = np.array([1, 1, 0], np.float32)
    adv = np.ones(3, np.float32)

    def total(lp):
      out = losses.gspo_loss(lp, old, adv, mask)
      return jnp.sum(out.loss * mask), out

    grad, out = jax.jit(jax.grad(total, has_aux=True))(logp)
    np.testing.assert_allclose(out.ratio, np.exp(0.3), rtol=1e-5)
    self.assertTrue(bool(out.clipped[0]))
    np.testing.assert_array_equal(grad, 0.0)
    with self.assertRaisesRegex(ValueError, "rank 1"):
      losses.gspo_loss(logp[None], old[None], adv[None], mask[None])


class PlainPgAndTisTest(chex.TestCase):

  def test_policy_gradient_loss(self):
    logp = np.array([-1.0, -2.0], np.float32)
    adv = np.array([0.5, -1.0], np.float32)
    loss, grad = jax.jit(jax.value_and_grad(
        lambda lp: jnp.sum(losses.policy_gradient_loss(lp, adv))))(logp)
    self.assertAlmostEqual(float(loss), 0.5 - 2.0)
    np.testing.assert_allclose(grad, -adv)

  def test_truncated_importance_weights(self):
    old = np.log(np.array([0.5, 0.2, 0.9], np.float32))
    sampler = np.log(np.array([0.5, 0.4, 0.1], np.float32))
    fn = jax.jit(functools.partial(losses.truncated_importance_weights,
                                   cap=2.0))
    np.testing.assert_allclose(fn(old, sampler), [1.0, 0.5, 2.0], rtol=1e-5)
    grad = jax.jit(jax.grad(lambda o: jnp.sum(fn(o, sampler))))(old)
    np.testing.assert_array_equal(grad, 0.0)
    with self.assertRaisesRegex(ValueError, "cap"):
      losses.truncated_importance_weights(old, sampler, cap=0.0)


if __name__ == "__main__":
  absltest.main()
