"""Tests for loss terms and make_loss: sums, metrics, gradients, accumulation."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import transforms

_MASK = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]],
                 np.float32)


def _setup():
  rng = np.random.default_rng(1)
  old = -rng.uniform(0.5, 2.0, size=(4, 4)).astype(np.float32)
  batch = transforms.Batch(
      loss_mask=_MASK, old_logprobs=old,
      ref_logprobs=old + rng.normal(0, 0.2, (4, 4)).astype(np.float32),
      advantages=rng.normal(size=(4, 4)).astype(np.float32) * _MASK,
      values=rng.normal(size=(4, 4)).astype(np.float32),
      returns=rng.normal(size=(4, 4)).astype(np.float32),
      is_weights=rng.uniform(0.5, 2.0, (4, 4)).astype(np.float32))
  outputs = transforms.ModelOutputs(
      logprobs=old + rng.normal(0, 0.3, (4, 4)).astype(np.float32),
      values=rng.normal(size=(4, 4)).astype(np.float32),
      entropy=rng.uniform(0, 2, (4, 4)).astype(np.float32))
  return batch, outputs


class MakeLossTest(absltest.TestCase):

  def test_nonfinite_values_at_masked_positions_reach_no_total_or_metric(self):
    batch, out = _setup()
    loss = transforms.make_loss(
        transforms.ppo_clip_term(0.2, 0.28), transforms.kl_term(0.1),
        transforms.entropy_term(0.01), transforms.value_term(0.5, 0.2))
    clean = jax.jit(loss)(out, batch)
    masked = _MASK == 0
    poison = lambda x, v: np.where(masked, np.float32(v), x)
    dirty_out = transforms.ModelOutputs(
        logprobs=poison(out.logprobs, np.nan), values=poison(out.values, np.inf),
        entropy=poison(out.entropy, -np.inf))
    dirty_batch = batch.replace(old_logprobs=poison(batch.old_logprobs, -np.inf),
                                ref_logprobs=poison(batch.ref_logprobs, np.nan))
    dirty = jax.jit(loss)(dirty_out, dirty_batch)
    np.testing.assert_allclose(dirty.loss_sum, clean.loss_sum, rtol=1e-6)
    self.assertEqual(set(dirty.metrics), set(clean.metrics))
    for key, value in clean.metrics.items():
      np.testing.assert_allclose(dirty.metrics[key], value, rtol=1e-6, err_msg=key)
    grad = jax.grad(lambda lp: jax.jit(loss)(
        dirty_out._replace(logprobs=lp) if hasattr(dirty_out, "_replace")
        else dirty_out.replace(logprobs=lp), dirty_batch).loss_sum)(dirty_out.logprobs)
    self.assertTrue(np.all(np.isfinite(grad)))
    np.testing.assert_array_equal(np.asarray(grad)[masked], 0.0)

  def test_sum_of_terms_aggregated_once(self):
    batch, out = _setup()
    loss = transforms.make_loss(
        transforms.ppo_clip_term(0.2, 0.28, 3.0), transforms.kl_term(0.1),
        transforms.entropy_term(0.01), transforms.value_term(0.5, 0.2),
        aggregation="seq-mean-token-mean")
    res = jax.jit(loss)(out, batch)
    pg = losses.ppo_clip_loss(out.logprobs, batch.old_logprobs,
                              batch.advantages, 0.2, 0.28, 3.0)
    per_token = (pg.loss * batch.is_weights
                 + 0.1 * losses.kl_penalty(out.logprobs, batch.ref_logprobs)
                 - 0.01 * out.entropy
                 + 0.5 * losses.clipped_value_loss(out.values, batch.values,
                                                   batch.returns, 0.2).loss)
    agg = losses.seq_mean_token_mean(per_token, _MASK)
    np.testing.assert_allclose(res.loss_sum, agg.total, rtol=1e-5)
    self.assertEqual(float(res.denominator), 3.0)
    m = res.metrics
    np.testing.assert_allclose(m["loss/total"], agg.total / 3, rtol=1e-5)
    np.testing.assert_allclose(
        m["policy/clip_frac"], (pg.clipped * _MASK).sum() / _MASK.sum(),
        rtol=1e-6)
    np.testing.assert_allclose(
        m["policy/entropy"], (out.entropy * _MASK).sum() / _MASK.sum(),
        rtol=1e-5)
    self.assertEqual(float(m["loss/tokens"]), 8.0)
    for key in ("loss/policy", "loss/kl", "loss/entropy", "loss/value",
                "kl/mean", "value/clip_frac", "policy/approx_kl"):
      self.assertIn(key, m)

  def test_micro_batches_accumulate_exactly_in_value_and_gradient(self):
    batch, out = _setup()
    loss = transforms.make_loss(transforms.ppo_clip_term(),
                                transforms.entropy_term(0.01))

    def full(logp):
      r = loss(out._replace(logprobs=logp), batch)
      return r.loss_sum / r.denominator

    def accumulated(logp):
      parts = []
      for start in (0, 2):
        mb = batch.select_rows(start, start + 2)
        mo = jax.tree.map(lambda x: x[start:start + 2],
                          out._replace(logprobs=logp))
        parts.append(loss(mo, mb))
      return sum(p.loss_sum for p in parts) / sum(p.denominator for p in parts)

    v1, g1 = jax.jit(jax.value_and_grad(full))(out.logprobs)
    v2, g2 = jax.jit(jax.value_and_grad(accumulated))(out.logprobs)
    np.testing.assert_allclose(v1, v2, rtol=1e-6)
    np.testing.assert_allclose(g1, g2, rtol=1e-6, atol=1e-8)

  def test_on_policy_without_old_logprobs_and_other_terms(self):
    batch, out = _setup()
    batch = batch.replace(old_logprobs=None, is_weights=None)
    loss = transforms.make_loss(transforms.ppo_clip_term())
    grad = jax.jit(jax.grad(lambda lp: loss(out._replace(logprobs=lp),
                                            batch).loss_sum))(out.logprobs)
    # ratio == 1: gradient of -A rho is -A on trained tokens.
    np.testing.assert_allclose(grad, -batch.advantages * _MASK, atol=1e-6)
    pg = jax.jit(transforms.make_loss(transforms.pg_term()))(out, batch)
    np.testing.assert_allclose(
        pg.loss_sum, np.sum(-batch.advantages * out.logprobs * _MASK),
        rtol=1e-5)
    gspo = jax.jit(transforms.make_loss(
        transforms.gspo_term(), aggregation="seq-mean-token-mean"))(out, batch)
    ref = jax.vmap(losses.gspo_loss)(out.logprobs, out.logprobs,
                                     batch.advantages, _MASK)
    np.testing.assert_allclose(
        gspo.loss_sum, losses.seq_mean_token_mean(ref.loss, _MASK).total,
        rtol=1e-5)

  def test_errors(self):
    batch, out = _setup()
    with self.assertRaisesRegex(ValueError, "at least one"):
      transforms.make_loss()
    with self.assertRaisesRegex(ValueError, "unique"):
      transforms.make_loss(transforms.pg_term(), transforms.ppo_clip_term())
    with self.assertRaisesRegex(ValueError, "aggregation"):
      transforms.make_loss(transforms.pg_term(), aggregation="mean")
    with self.assertRaisesRegex(ValueError, "entropy"):
      transforms.make_loss(transforms.entropy_term())(
          out._replace(entropy=None), batch)
    with self.assertRaisesRegex(ValueError, "values"):
      transforms.make_loss(transforms.value_term())(
          out._replace(values=None), batch)
    with self.assertRaisesRegex(ValueError, "ModelOutputs"):
      transforms.make_loss(transforms.pg_term())(out.logprobs, batch)
    with self.assertRaisesRegex(ValueError, "shape"):
      transforms.make_loss(transforms.pg_term())(
          out._replace(logprobs=jnp.zeros((4, 5))), batch)
    with self.assertRaisesRegex(ValueError, "dual_clip"):
      transforms.ppo_clip_term(dual_clip=0.5)


if __name__ == "__main__":
  absltest.main()
