"""Tests for the batch stages: each equals the pure functions applied by hand."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import transforms

_IDS = np.array([[-1, 0, 0, -1, 1, 1]] * 3 + [[-1, 0, 0, -1, -1, -1]],
                np.int32)
_MASK = (_IDS >= 0).astype(np.float32)


def _batch(**overrides):
  """B = 4 rows in 2 groups of 2, S = 6 tokens, T = 2 turns."""
  rng = np.random.default_rng(0)
  old = -rng.uniform(0.5, 2.0, size=(4, 6)).astype(np.float32)
  fields = dict(
      loss_mask=_MASK,
      rewards=np.array([[0, 0, 0.5, 0, 0, 1.0], [0] * 6,
                        [0, 0, -0.1, 0, 0, 2.0], [0, 0, 1.0, 0, 0, 0]],
                       np.float32),
      values=rng.normal(size=(4, 6)).astype(np.float32),
      old_logprobs=old,
      ref_logprobs=old + rng.normal(0, 0.2, size=(4, 6)).astype(np.float32),
      sampler_logprobs=old + rng.normal(0, 0.5, size=(4, 6)).astype(
          np.float32),
      turn_ids=_IDS,
      anchor_hashes=np.array([[1, 2], [1, 3], [5, 6], [5, 0]], np.int32),
      format_valid=np.array([[1, 0], [1, 1], [0, 1], [1, 1]], bool),
      terminated=np.array([True, True, True, False]),
      bootstrap_values=np.array([0, 0, 0, 0.7], np.float32),
      group_size=2)
  fields.update(overrides)
  return transforms.Batch(**fields)


def _run(transform, batch, state=None):
  state = transform.init(batch) if state is None else state
  return jax.jit(transform.update)(batch, state)


class AdvantageStagesTest(parameterized.TestCase):

  def test_gae_stage(self):
    b = _batch()
    out, _ = _run(transforms.compute_gae(0.9, 0.8), b)
    ref = jax.jit(jax.vmap(functools.partial(losses.gae, gamma=0.9,
                                             lambda_=0.8)))(
        b.rewards, b.values, b.loss_mask, b.terminated, b.bootstrap_values)
    np.testing.assert_allclose(out.returns, ref.returns, atol=1e-6)
    np.testing.assert_allclose(
        out.advantages, jax.jit(losses.masked_whiten)(ref.advantages, _MASK),
        atol=1e-5)
    self.assertIn("advantages/mean", out.metrics)
    # Without terminated/bootstrap fields every row is terminal.
    out2, _ = _run(transforms.compute_gae(whiten=False),
                   b.replace(terminated=None, bootstrap_values=None))
    ref2 = jax.jit(jax.vmap(losses.gae))(b.rewards, b.values, b.loss_mask)
    np.testing.assert_allclose(out2.advantages, ref2.advantages, atol=1e-6)

  def test_bilevel_gae_stage(self):
    b = _batch()
    out, _ = _run(transforms.compute_bilevel_gae(whiten=False), b)
    ref = jax.jit(jax.vmap(losses.bilevel_gae))(b.rewards, b.values, b.loss_mask,
                                       b.turn_ids, b.terminated,
                                       b.bootstrap_values)
    np.testing.assert_allclose(out.advantages, ref.advantages, atol=1e-6)
    # Without turn ids turns are runs of trained tokens: same here.
    out2, _ = _run(transforms.compute_bilevel_gae(whiten=False),
                   b.replace(turn_ids=None))
    np.testing.assert_allclose(out2.advantages, ref.advantages, atol=1e-6)

  @parameterized.named_parameters(
      ("grpo", transforms.compute_grpo, losses.grpo_advantages),
      ("dr_grpo", transforms.compute_dr_grpo, losses.dr_grpo_advantages),
      ("rloo", transforms.compute_rloo, losses.rloo_advantages))
  def test_group_stages_broadcast_over_tokens(self, stage, fn):
    b = _batch()
    out, _ = _run(stage(), b)
    scores = np.array([1.5, 0.0, 1.9, 1.0], np.float32)
    adv_b = jax.jit(jax.vmap(fn))(scores.reshape(2, 2)).reshape(4)
    np.testing.assert_allclose(out.advantages, adv_b[:, None] * _MASK,
                               atol=1e-6)
    # Explicit scores take precedence over rewards.
    out2, _ = _run(stage(), b.replace(scores=jnp.array([1.0, 2.0, 3.0, 3.0])))
    adv2 = jax.jit(jax.vmap(fn))(
        jnp.array([[1.0, 2.0], [3.0, 3.0]])).reshape(4)
    np.testing.assert_allclose(out2.advantages, adv2[:, None] * _MASK,
                               atol=1e-6)

  def test_reinforce_pp_stages(self):
    b = _batch()
    out, _ = _run(transforms.compute_reinforce_pp(0.9), b)
    np.testing.assert_allclose(
        out.advantages,
        jax.jit(losses.reinforce_pp_advantages, static_argnums=2)(
            b.rewards, _MASK, 0.9), atol=1e-6)
    out, _ = _run(transforms.compute_reinforce_pp_baseline(), b)
    np.testing.assert_allclose(
        out.advantages,
        jax.jit(losses.reinforce_pp_baseline_advantages, static_argnums=2)(
            jnp.array([1.5, 0.0, 1.9, 1.0]), _MASK, 2), atol=1e-6)

  def test_gigpo_stage_maps_turn_advantages_to_tokens(self):
    b = _batch()
    out, _ = _run(transforms.compute_gigpo(), b)
    turn_r = np.array([[0.5, 1.0], [0, 0], [-0.1, 2.0], [1.0, 0]], np.float32)
    tmask = np.array([[1, 1], [1, 1], [1, 1], [1, 0]], bool)
    ref = jax.jit(jax.vmap(losses.gigpo_advantages))(
        jnp.array([[1.5, 0.0], [1.9, 1.0]]), turn_r.reshape(2, 2, 2),
        b.anchor_hashes.reshape(2, 2, 2), tmask.reshape(2, 2, 2))
    adv_turn = np.asarray(ref.advantages).reshape(4, 2)
    expect = np.where(_IDS >= 0, adv_turn[np.arange(4)[:, None],
                                          np.clip(_IDS, 0, 1)], 0.0)
    np.testing.assert_allclose(out.advantages, expect, atol=1e-6)
    # Anchors 1 and 5 are shared once each: sizes 2,1,2,1,2,2,2 over 7 turns.
    self.assertAlmostEqual(float(out.metrics["gigpo/anchor_group_size"]),
                           (2 + 1 + 2 + 1 + 2 + 1 + 2) / 7, places=5)

  def test_whiten_stage(self):
    b = _batch(advantages=jnp.arange(24.0).reshape(4, 6))
    out, _ = _run(transforms.whiten_advantages(), b)
    np.testing.assert_allclose(
        out.advantages, jax.jit(losses.masked_whiten)(b.advantages, _MASK),
        atol=1e-6)

  def test_missing_fields_are_named(self):
    with self.assertRaisesRegex(ValueError, "compute_gae needs Batch.values"):
      transforms.compute_gae().update(_batch(values=None), ())
    with self.assertRaisesRegex(ValueError, "anchor_hashes"):
      transforms.compute_gigpo().update(_batch(anchor_hashes=None), ())
    with self.assertRaisesRegex(ValueError, "whiten_advantages needs"):
      transforms.whiten_advantages().update(_batch(), ())
    with self.assertRaisesRegex(ValueError, "gamma"):
      transforms.compute_gae(gamma=2.0)
    with self.assertRaisesRegex(ValueError, "rank 2"):
      transforms.compute_gae().update(_batch(values=jnp.zeros(4)), ())


class FilterAndShapingStagesTest(absltest.TestCase):

  def test_filter_masks_dropped_groups(self):
    b = _batch()
    out, _ = _run(transforms.filter_rollouts("top_fraction", 0.25), b)
    # Group stds: g0 1.5/sqrt2 > g1 0.9/sqrt2 -> keep g0 only.
    np.testing.assert_array_equal(out.keep, [1, 1, 0, 0])
    np.testing.assert_array_equal(out.loss_mask[2:], 0.0)
    np.testing.assert_array_equal(out.loss_mask[:2], _MASK[:2])
    m = out.metrics
    self.assertEqual(float(m["filter/kept_ratio"]), 0.5)
    self.assertEqual(float(m["filter/any_kept"]), 1.0)
    self.assertAlmostEqual(float(m["filter/kept_reward_std"]),
                           1.5 / np.sqrt(2), places=5)
    # Chained filters AND their keep masks; nothing kept is reported.
    both = transforms.chain(transforms.filter_rollouts("top_k", 1),
                            transforms.filter_rollouts("top_k", 2,
                                                       include_zero=False))
    out, _ = _run(both, b.replace(
        rewards=jnp.zeros_like(b.rewards).at[2, 2].set(1.0)))
    np.testing.assert_array_equal(out.keep, [0, 0, 1, 1])
    out, _ = _run(transforms.filter_rollouts("top_p", 0.9),
                  b.replace(rewards=jnp.zeros_like(b.rewards)))
    self.assertEqual(float(out.metrics["filter/any_kept"]), 0.0)
    np.testing.assert_array_equal(out.loss_mask, 0.0)
    with self.assertRaisesRegex(ValueError, "mode"):
      transforms.filter_rollouts("best")

  def test_penalize_format(self):
    b = _batch()
    out, _ = _run(transforms.penalize_format(-0.1), b)
    expect = np.array(b.rewards)
    expect[0, 5] -= 0.1  # row 0 turn 1 invalid
    expect[2, 2] -= 0.1  # row 2 turn 0 invalid
    np.testing.assert_allclose(out.rewards, expect, atol=1e-6)
    self.assertAlmostEqual(float(out.metrics["format/invalid_turn_frac"]),
                           2 / 7, places=6)
    out, _ = _run(transforms.penalize_format(-0.1),
                  b.replace(scores=jnp.array([1.0, 1.0, 1.0, 1.0])))
    np.testing.assert_allclose(out.scores, [0.9, 1.0, 0.9, 1.0], atol=1e-6)
    with self.assertRaisesRegex(ValueError, "penalty"):
      transforms.penalize_format(0.1)  # one sign: the reward added, <= 0
    with self.assertRaisesRegex(ValueError, "format_valid"):
      transforms.penalize_format().update(b.replace(format_valid=None), ())

  def test_normalize_rewards_is_stateful(self):
    b = _batch()
    t = transforms.normalize_rewards()
    out1, state = _run(t, b)
    out2, state = _run(t, b, state)
    scores = np.array([1.5, 0.0, 1.9, 1.0])
    # After one batch the running std is that batch's population std.
    np.testing.assert_allclose(out1.rewards, b.rewards / (scores.std() + 1e-8),
                               rtol=1e-5)
    both = np.concatenate([scores, scores])
    np.testing.assert_allclose(out2.rewards, b.rewards / (both.std() + 1e-8),
                               rtol=1e-5)
    self.assertEqual(float(state.count), 8.0)

  def test_kl_reward_penalty_fixed_and_adaptive(self):
    b = _batch()
    kl = (b.old_logprobs - b.ref_logprobs) * _MASK
    out, state = _run(transforms.kl_reward_penalty(0.5), b)
    np.testing.assert_allclose(out.rewards, b.rewards - 0.5 * kl, atol=1e-6)
    self.assertEqual(float(state.coef), 0.5)
    per_seq = (kl.sum(1) / _MASK.sum(1)).mean()
    self.assertAlmostEqual(float(out.metrics["kl_reward/kl"]), per_seq,
                           places=5)
    t = transforms.kl_reward_penalty(0.5, target=abs(per_seq) * 2,
                                     horizon=40.0)
    _, state = _run(t, b)
    err = np.clip(per_seq / (abs(per_seq) * 2) - 1, -0.2, 0.2)
    self.assertAlmostEqual(float(state.coef), 0.5 * (1 + err * 4 / 40),
                           places=6)
    with self.assertRaisesRegex(ValueError, "ref_logprobs"):
      transforms.kl_reward_penalty().update(b.replace(ref_logprobs=None),
                                            state)
    with self.assertRaisesRegex(ValueError, "estimator"):
      transforms.kl_reward_penalty(estimator="kl")

  def test_truncated_importance_weights(self):
    b = _batch()
    out, _ = _run(transforms.truncate_importance_weights(1.5), b)
    expect = np.minimum(np.exp(b.old_logprobs - b.sampler_logprobs), 1.5)
    np.testing.assert_allclose(out.is_weights, expect, rtol=1e-5)
    self.assertAlmostEqual(float(out.metrics["tis/capped_frac"]),
                           float((expect * _MASK >= 1.5).sum() / _MASK.sum()),
                           places=5)


if __name__ == "__main__":
  absltest.main()
