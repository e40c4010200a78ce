"""Tests for jagent.losses advantage estimators (hand values and references)."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses

# Eager (without_jit) runs compile every primitive separately and dominate the
# runtime on 2 cores, so only a few tests run both; the rest run jitted.
_VARIANTS = dict(with_jit=True, without_jit=True)
_JIT = dict(with_jit=True)


def _jit(fn, **static):
  """jit with keyword hyperparameters bound (one compile instead of eager ops)."""
  return jax.jit(functools.partial(fn, **static))


def _np_gae(r, v, m, gamma, lam, terminated=True, boot=0.0):
  """Independent reference: explicit loop over the valid indices."""
  idx = [i for i in range(len(r)) if m[i] > 0]
  adv = np.zeros(len(r))
  next_v = 0.0 if terminated else boot
  next_a = 0.0
  for i in reversed(idx):
    delta = r[i] + gamma * next_v - v[i]
    next_a = delta + gamma * lam * next_a
    adv[i] = next_a
    next_v = v[i]
  return adv


def _np_bilevel(r, v, m, ids, gamma, lam, turn_gamma, terminated=True,
                boot=0.0):
  """Independent reference: explicit turns, then tokens inside each turn."""
  idx = [i for i in range(len(r)) if m[i] > 0]
  turns = []
  for i in idx:
    if turns and ids[turns[-1][-1]] == ids[i]:
      turns[-1].append(i)
    else:
      turns.append([i])
  ends = [t[-1] for t in turns]
  rho = [sum(r[i] for i in t) for t in turns]
  turn_adv = [0.0] * len(turns)
  next_v = 0.0 if terminated else boot
  next_a = 0.0
  for k in reversed(range(len(turns))):
    delta = rho[k] + turn_gamma * next_v - v[ends[k]]
    next_a = delta + turn_gamma * lam * next_a
    turn_adv[k] = next_a
    next_v = v[ends[k]]
  adv = np.zeros(len(r))
  for k, t in enumerate(turns):
    ret = turn_adv[k] + v[ends[k]]
    next_v, next_a = 0.0, 0.0
    for pos, i in enumerate(reversed(t)):
      reward = ret if pos == 0 else 0.0
      delta = reward + gamma * next_v - v[i]
      next_a = delta + gamma * lam * next_a
      adv[i] = next_a
      next_v = v[i]
  return adv


class GaeTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(**_VARIANTS)
  def test_hand_values_terminal_and_truncated(self):
    r = jnp.array([0.0, 0.0, 0.0, 1.0, 0.0])
    v = jnp.array([0.1, 0.2, 0.3, 0.4, 0.0])
    m = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
    fn = self.variant(losses.gae)
    out = fn(r, v, m, True, 0.0, 1.0, 1.0)
    np.testing.assert_allclose(out.advantages, [0.9, 0.8, 0.7, 0.6, 0.0],
                               atol=1e-6)
    np.testing.assert_allclose(out.returns, [1, 1, 1, 1, 0], atol=1e-6)
    # Truncated with bootstrap 2, gamma = lambda = 0.5 (worked by hand):
    # t3: 1 + .5*2 - .4 = 1.6; t2: -.1 + .25*1.6 = .3; t1: -.05 + .25*.3;
    # t0: 0 + .25 * .025.
    out = fn(r, v, m, False, 2.0, 0.5, 0.5)
    np.testing.assert_allclose(out.advantages,
                               [0.00625, 0.025, 0.3, 1.6, 0.0], atol=1e-6)

  @chex.variants(**_JIT)
  def test_masked_gap_is_skipped(self):
    # Observation tokens (mask 0) between two turns: values and rewards there
    # are ignored, the recursion links t=1 to t=4.
    r = jnp.array([0.0, 0.0, 5.0, 5.0, 0.0, 1.0])
    v = jnp.array([0.5, 0.25, 9.0, 9.0, 0.5, 0.75])
    m = jnp.array([1, 1, 0, 0, 1, 1], jnp.float32)
    out = self.variant(losses.gae)(r, v, m, True, 0.0, 0.5, 1.0)
    expect = _np_gae(np.asarray(r), np.asarray(v), np.asarray(m), 0.5, 1.0)
    np.testing.assert_allclose(out.advantages, expect, atol=1e-6)
    self.assertEqual(float(out.advantages[2]), 0.0)
    self.assertEqual(float(out.returns[3]), 0.0)

  @chex.variants(**_JIT)
  def test_gamma_lambda_one_terminal_reward_is_r_minus_v(self):
    # Ragged rows, reward R on the last valid token: A_t = R - V_t.
    rng = np.random.default_rng(0)
    lengths = np.array([1, 3, 6, 4])
    m = (np.arange(6)[None, :] < lengths[:, None]).astype(np.float32)
    v = rng.normal(size=(4, 6)).astype(np.float32)
    big_r = rng.normal(size=4).astype(np.float32)
    r = np.zeros((4, 6), np.float32)
    r[np.arange(4), lengths - 1] = big_r
    fn = self.variant(jax.vmap(lambda r, v, m: losses.gae(r, v, m).advantages))
    adv = fn(r, v, m)
    np.testing.assert_allclose(adv, (big_r[:, None] - v) * m, atol=1e-5)

  @chex.variants(**_JIT)
  @parameterized.parameters((0.9, 0.8, True), (1.0, 0.95, False),
                            (0.5, 0.0, False))
  def test_matches_reference(self, gamma, lam, terminated):
    rng = np.random.default_rng(1)
    r = rng.normal(size=7).astype(np.float32)
    v = rng.normal(size=7).astype(np.float32)
    m = (rng.random(7) > 0.3).astype(np.float32)
    out = self.variant(losses.gae, static_argnums=(5, 6))(
        r, v, m, terminated, 1.5, gamma, lam)
    expect = _np_gae(r, v, m, gamma, lam, terminated, 1.5)
    np.testing.assert_allclose(out.advantages, expect, atol=1e-5)
    np.testing.assert_allclose(out.returns, (expect + v) * m, atol=1e-5)

  def test_vmap_over_hyperparameters(self):
    rng = np.random.default_rng(5)
    r, v = rng.normal(size=(2, 5)).astype(np.float32)
    m = np.array([1, 1, 0, 1, 1], np.float32)
    gammas = jnp.array([0.5, 0.9, 1.0])
    fn = jax.jit(jax.vmap(
        lambda g: losses.gae(r, v, m, gamma=g, lambda_=0.7).advantages))
    out = fn(gammas)
    for i, g in enumerate([0.5, 0.9, 1.0]):
      np.testing.assert_allclose(out[i], _np_gae(r, v, m, g, 0.7), atol=1e-5)

  def test_bad_arguments(self):
    x = jnp.zeros(3)
    with self.assertRaisesRegex(ValueError, "gamma"):
      losses.gae(x, x, x, gamma=1.5)
    with self.assertRaisesRegex(ValueError, "rank 1"):
      losses.gae(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((2, 3)))
    with self.assertRaisesRegex(ValueError, "shape"):
      losses.gae(x, jnp.zeros(4), x)
    with self.assertRaisesRegex(ValueError, "terminated"):
      losses.gae(x, x, x, terminated=jnp.zeros(3, bool))

  def test_discounted_returns(self):
    out = _jit(losses.discounted_returns, gamma=0.5)(
        jnp.array([1.0, 0.0, 2.0, 4.0]), jnp.array([1.0, 1.0, 0.0, 1.0]))
    # t3: 4; t2 masked; t1: 0 + .5*4 = 2; t0: 1 + .5*2 = 2.
    np.testing.assert_allclose(out, [2.0, 2.0, 0.0, 4.0])


class BilevelGaeTest(chex.TestCase, parameterized.TestCase):

  def test_turn_ends(self):
    m = jnp.array([0, 1, 1, 0, 1, 1, 1, 0], jnp.float32)
    np.testing.assert_array_equal(
        losses.turn_ends(m), [0, 0, 1, 0, 0, 0, 1, 0])
    # With ids: a masked-out token inside turn 1 does not split it, and two
    # adjacent turns without a gap are told apart.
    ids = jnp.array([0, 0, 0, 1, 1, 1, 2, 2], jnp.int32)
    m = jnp.array([1, 1, 1, 1, 0, 1, 1, 0], jnp.float32)
    np.testing.assert_array_equal(
        losses.turn_ends(m, ids), [0, 0, 1, 0, 0, 1, 1, 0])

  @chex.variants(**_JIT)
  def test_ragen_example(self):
    # RAGEN core_algos' own example: rewards 1 at t=4 and t=9.
    r = jnp.zeros(10).at[4].set(1.0).at[9].set(1.0)
    v = jnp.arange(1, 11, dtype=jnp.float32) / 10
    ids = jnp.repeat(jnp.arange(2, dtype=jnp.int32), 5)
    out = self.variant(losses.bilevel_gae)(r, v, jnp.ones(10), ids)
    # Turn 2: 1 - 1.0 = 0 -> R = 1.0. Turn 1: 1 + .95*1.0 - .5 = 1.45 ->
    # R = 1.95. Tokens: R_k - V_t.
    expect = np.concatenate([1.95 - np.asarray(v[:5]), 1.0 - np.asarray(v[5:])])
    np.testing.assert_allclose(out.advantages, expect, atol=1e-6)
    np.testing.assert_allclose(out.returns[:5], 1.95, atol=1e-6)

  @chex.variants(**_JIT)
  @parameterized.parameters((1.0, 1.0, 0.95, True), (0.9, 0.7, 0.8, False))
  def test_matches_reference(self, gamma, lam, turn_gamma, terminated):
    rng = np.random.default_rng(2)
    # Three turns separated by observation tokens; turn 1 has reward 0
    # (RAGEN would merge it into turn 2).
    ids = np.array([0, 0, 0, -1, 1, 1, -1, -1, 2, 2, 2, -1], np.int32)
    m = (ids >= 0).astype(np.float32)
    r = np.zeros(12, np.float32)
    r[2], r[10], r[3] = 0.5, 1.0, 7.0  # r[3] is on an observation: ignored.
    v = rng.normal(size=12).astype(np.float32)
    fn = self.variant(losses.bilevel_gae, static_argnums=(6, 7, 8))
    out = fn(r, v, m, ids, terminated, 0.3, gamma, lam, turn_gamma)
    expect = _np_bilevel(r, v, m, ids, gamma, lam, turn_gamma, terminated, 0.3)
    np.testing.assert_allclose(out.advantages, expect, atol=1e-5)

  def test_single_turn_equals_token_gae(self):
    # One turn, turn-level discount irrelevant: identical to plain GAE.
    rng = np.random.default_rng(3)
    r = np.zeros(5, np.float32)
    r[3] = 2.0
    v = rng.normal(size=5).astype(np.float32)
    m = np.array([1, 1, 1, 1, 0], np.float32)
    a = _jit(losses.bilevel_gae, turn_ids_t=None, gamma=0.9, lambda_=0.8,
             turn_gamma=0.5)(r, v, m)
    b = _jit(losses.gae, gamma=0.9, lambda_=0.8)(r, v, m)
    np.testing.assert_allclose(a.advantages, b.advantages, atol=1e-6)


class GroupAdvantagesTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(**_VARIANTS)
  def test_grpo_hand_values_and_zero_sum(self):
    scores = jnp.array([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    out = self.variant(jax.vmap(losses.grpo_advantages))(scores)
    # Group 0: mean .5, unbiased std sqrt(1/3).
    a = 0.5 / (np.sqrt(1 / 3) + 1e-6)
    np.testing.assert_allclose(out[0], [a, -a, -a, a], rtol=1e-5)
    # Group 1: mean 2, unbiased std sqrt(2/3).
    b = 1 / (np.sqrt(2 / 3) + 1e-6)
    np.testing.assert_allclose(out[1], [b, -b, 0, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jnp.sum(out, axis=1), 0.0, atol=1e-5)

  def test_grpo_without_std_and_dr_grpo(self):
    s = jnp.array([1.0, 2.0, 6.0])
    np.testing.assert_allclose(losses.dr_grpo_advantages(s), [-2, -1, 3])
    np.testing.assert_allclose(
        losses.grpo_advantages(s, normalize_std=False), [-2, -1, 3])

  @parameterized.parameters(losses.grpo_advantages, losses.dr_grpo_advantages,
                            losses.rloo_advantages)
  def test_group_of_one_is_zero(self, fn):
    np.testing.assert_array_equal(fn(jnp.array([3.0])), [0.0])

  def test_constant_group_is_zero(self):
    np.testing.assert_array_equal(
        jax.jit(losses.grpo_advantages)(jnp.full((4,), 2.5)), np.zeros(4))

  @parameterized.parameters(losses.grpo_advantages, losses.dr_grpo_advantages,
                            losses.rloo_advantages)
  def test_equal_scores_whose_mean_rounds_are_exactly_zero(self, fn):
    # The float32 mean of eight 10.7s is 10.699999: a naive (s - mean) / (std
    # + 1e-6) gave 0.47 to every member of a group with no signal.
    s = jnp.full((8,), 10.7, jnp.float32)
    self.assertNotEqual(float(jnp.mean(s)), float(s[0]))
    np.testing.assert_array_equal(jax.jit(fn)(s), np.zeros(8))
    # Nearly equal scores keep their (small) signal and sum to ~0.
    out = np.asarray(jax.jit(fn)(jnp.array([10.7, 10.7, 10.6, 10.7], jnp.float32)))
    self.assertLess(out[2], 0.0)
    self.assertAlmostEqual(float(out.sum()), 0.0, places=4)

  @chex.variants(**_JIT)
  def test_rloo_is_leave_one_out(self):
    rng = np.random.default_rng(4)
    s = rng.normal(size=(3, 5)).astype(np.float32)
    out = self.variant(jax.vmap(losses.rloo_advantages))(s)
    for g in range(3):
      for i in range(5):
        others = np.delete(s[g], i)
        self.assertAlmostEqual(float(out[g, i]), s[g, i] - others.mean(),
                               places=5)

  def test_as_groups(self):
    x = jnp.arange(6)
    np.testing.assert_array_equal(losses.as_groups("x", x, 3),
                                  [[0, 1, 2], [3, 4, 5]])
    with self.assertRaisesRegex(ValueError, "group_size"):
      losses.as_groups("x", x, 4)
    with self.assertRaisesRegex(ValueError, "group_size"):
      losses.as_groups("x", x, 0)

  def test_group_rank_checked(self):
    with self.assertRaisesRegex(ValueError, "scores_g"):
      losses.grpo_advantages(jnp.zeros((2, 2)))
    with self.assertRaisesRegex(ValueError, "floating"):
      losses.rloo_advantages(jnp.zeros(3, jnp.int32))


class WhitenAndReinforceTest(chex.TestCase):

  @chex.variants(**_JIT)
  def test_masked_whiten(self):
    x = jnp.array([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    out = self.variant(losses.masked_whiten)(x, m)
    vals = np.array([1.0, 2.0, 3.0, 4.0])
    expect = (vals - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(out[:, :2].reshape(-1), expect, rtol=1e-5)
    np.testing.assert_array_equal(out[:, 2], [0.0, 0.0])
    unshifted = _jit(losses.masked_whiten, shift_mean=False)(x, m)
    np.testing.assert_allclose(unshifted[:, :2].reshape(-1), expect + 2.5,
                               rtol=1e-5)

  def test_reinforce_pp(self):
    r = np.array([[0, 0, 1, 0], [0, 2, 0, 0]], np.float32)
    m = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    out = _jit(losses.reinforce_pp_advantages, gamma=0.5)(r, m)
    ret = np.array([0.25, 0.5, 1.0, 1.0, 2.0])
    expect = (ret - ret.mean()) / np.sqrt(ret.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(out[m > 0], expect, rtol=1e-5)
    self.assertEqual(float(out[0, 3]), 0.0)

  def test_reinforce_pp_baseline(self):
    scores = np.array([1.0, 0.0, 2.0, 2.0], np.float32)
    m = np.array([[1, 1], [1, 0], [1, 0], [1, 1]], np.float32)
    out = _jit(losses.reinforce_pp_baseline_advantages, group_size=2)(
        scores, m)
    centred = np.array([0.5, 0.5, -0.5, 0.0, 0.0, 0.0])
    expect = (centred - centred.mean()) / np.sqrt(centred.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(out[m > 0], expect, rtol=1e-5)
    with self.assertRaisesRegex(ValueError, "group_size"):
      losses.reinforce_pp_baseline_advantages(scores, m, 3)


class GigpoTest(chex.TestCase):

  @chex.variants(**_JIT)
  def test_hand_values(self):
    scores = jnp.array([1.0, 0.0])
    step_r = jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    anchors = jnp.array([[1, 2, 3], [1, 4, 3]], jnp.int32)
    tmask = jnp.array([[1, 1, 1], [1, 1, 0]], bool)  # (1, 2) invalid.
    fn = self.variant(losses.gigpo_advantages, static_argnums=(4,))
    out = fn(scores, step_r, anchors, tmask, 0.5)
    s = 1 / np.sqrt(2)
    np.testing.assert_allclose(out.episode, [s, -s], rtol=1e-5)
    # Returns: traj 0 [.25, .5, 1], traj 1 [0, 0, -]. Anchor 1 holds
    # {.25, 0}: mean .125, unbiased std .1768 -> +-.7071. Others singleton.
    # Anchor 3 matches only the invalid turn (1, 2): still a singleton.
    np.testing.assert_allclose(out.step, [[s, 0, 0], [-s, 0, 0]], rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(out.advantages,
                               [[2 * s, s, s], [-2 * s, -s, 0]], rtol=1e-4)
    np.testing.assert_array_equal(out.anchor_group_size, [[2, 1, 1], [2, 1, 0]])

  def test_revisited_state_within_one_trajectory(self):
    # State 7 visited twice by trajectory 0 and once by trajectory 1.
    scores = jnp.array([0.0, 0.0])
    step_r = jnp.array([[1.0, 2.0], [3.0, 0.0]])
    anchors = jnp.array([[7, 7], [7, 8]], jnp.int32)
    out = _jit(losses.gigpo_advantages, step_gamma=1.0, normalize_std=False)(
        scores, step_r, anchors, jnp.ones((2, 2)))
    # Returns [[3, 2], [3, 0]]; anchor 7 mean 8/3.
    np.testing.assert_allclose(out.step, [[1 / 3, -2 / 3], [1 / 3, 0.0]],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.episode, [0.0, 0.0])

  def test_equal_step_returns_are_exactly_zero(self):
    # Both trajectories reach anchor 5 with return 0.7 (three 0.1-ish
    # rewards summed in float32): no step-level signal, so exactly 0.
    step_r = jnp.array([[0.1, 0.2, 0.4], [0.1, 0.2, 0.4]], jnp.float32)
    anchors = jnp.array([[5, 6, 7], [5, 6, 7]], jnp.int32)
    out = _jit(losses.gigpo_advantages, step_gamma=1.0)(
        jnp.array([0.7, 0.7]), step_r, anchors, jnp.ones((2, 3)))
    np.testing.assert_array_equal(out.step, np.zeros((2, 3)))
    np.testing.assert_array_equal(out.episode, np.zeros(2))

  def test_bad_anchor_dtype(self):
    with self.assertRaisesRegex(ValueError, "integer"):
      losses.gigpo_advantages(jnp.zeros(2), jnp.zeros((2, 2)),
                              jnp.zeros((2, 2)), jnp.ones((2, 2)))


if __name__ == "__main__":
  absltest.main()
