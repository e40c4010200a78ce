"""Tests for jagent.losses reward shaping and turn/token functions."""

import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses

# Tokens: prompt, turn 0 (3 tokens), observation, turn 1 (2 tokens), pad.
_IDS = np.array([-1, 0, 0, 0, -1, 1, 1, -1], np.int32)
_MASK = (_IDS >= 0).astype(np.float32)


class TurnFunctionsTest(chex.TestCase):

  def test_format_penalty(self):
    out = jax.jit(losses.format_penalty)(np.array([True, False, True, False]))
    np.testing.assert_allclose(out, [0, -0.1, 0, -0.1], rtol=1e-6)
    with self.assertRaisesRegex(ValueError, "penalty"):
      losses.format_penalty(np.array([True]), 1.0)

  def test_turn_rewards_round_trip(self):
    to_tokens = jax.jit(losses.turn_to_token_rewards)
    tok = to_tokens(np.array([0.5, -0.1, 9.0], np.float32), _MASK, _IDS)
    np.testing.assert_allclose(tok, [0, 0, 0, 0.5, 0, 0, -0.1, 0], rtol=1e-6)
    to_turns = jax.jit(functools.partial(losses.token_to_turn_rewards,
                                         num_turns=3))
    np.testing.assert_allclose(to_turns(tok, _MASK, _IDS), [0.5, -0.1, 0.0],
                               rtol=1e-6)
    np.testing.assert_array_equal(
        losses.turn_mask(_MASK, _IDS, 3), [True, True, False])

  def test_bad_turn_ids(self):
    with self.assertRaisesRegex(ValueError, "integer"):
      losses.turn_mask(_MASK, _IDS.astype(np.float32), 2)
    with self.assertRaisesRegex(ValueError, "num_turns"):
      losses.turn_mask(_MASK, _IDS, 0)


class RunningNormTest(chex.TestCase):

  def test_matches_numpy_over_masked_updates(self):
    rng = np.random.default_rng(0)
    update = jax.jit(losses.running_norm_update)
    state = losses.running_norm_init()
    seen = []
    for _ in range(3):
      x = rng.normal(2.0, 3.0, size=8).astype(np.float32)
      m = rng.random(8) > 0.3
      state = update(x, state, m)
      seen.extend(x[m])
    seen = np.array(seen)
    self.assertEqual(float(state.count), len(seen))
    self.assertAlmostEqual(float(state.mean), seen.mean(), places=4)
    self.assertAlmostEqual(float(state.m2), ((seen - seen.mean())**2).sum(),
                           places=2)
    x = np.array([1.0, -2.0], np.float32)
    apply = jax.jit(functools.partial(losses.running_norm_apply, center=True))
    np.testing.assert_allclose(apply(x, state),
                               (x - seen.mean()) / (seen.std() + 1e-8),
                               rtol=1e-4)
    np.testing.assert_allclose(losses.running_norm_apply(x, state),
                               x / (seen.std() + 1e-8), rtol=1e-4)

  def test_identity_before_two_samples(self):
    state = losses.running_norm_update(jnp.array([5.0]),
                                       losses.running_norm_init())
    np.testing.assert_allclose(
        losses.running_norm_apply(jnp.array([3.0]), state, center=True), [3.0])


if __name__ == "__main__":
  absltest.main()
