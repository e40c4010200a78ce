"""The contract every registered environment satisfies (jumanji-style shared suite).

For each id in ``envs_jax.registered()``: reset/step are pure, jittable and
vmappable over keys and params; shapes, dtypes and pytree structure are stable
across steps (so ``lax.scan`` works); same key gives the same result; the
device rendering equals the host text; the step is traced once.
"""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax

BATCH = 4
STEPS = 6
ENV_IDS = envs_jax.registered()


def _shapes(tree):
  return jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), tree)


@pytest.mark.heavy
class ContractTest(parameterized.TestCase):

  def test_something_is_registered(self):
    self.assertNotEmpty(ENV_IDS)

  @parameterized.parameters(*ENV_IDS)
  def test_contract(self, env_id):
    env, params = envs_jax.make(env_id)
    self.assertIsInstance(env, envs_jax.Environment)
    self.assertEqual(env.symbols[0], envs_jax.PAD_SYMBOL)
    self.assertLen(set(env.symbols), len(env.symbols), "symbols must be distinct")

    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))

    def batched_step(keys, state, actions, params):
      return jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, actions, params)

    chex.clear_trace_counter()
    step = jax.jit(chex.assert_max_traces(batched_step, n=1))
    render = jax.jit(jax.vmap(env.render_symbols))

    keys = jax.random.split(jax.random.key(0), BATCH)
    obs, state = reset(keys, params)
    obs2, state2 = reset(keys, params)
    chex.assert_trees_all_equal((obs, state), (obs2, state2))  # same key, same state
    state_shapes = _shapes(state)

    key = jax.random.key(1)
    for _ in range(STEPS):
      key, k_act, k_step = jax.random.split(key, 3)
      actions = jax.vmap(env.sample_action)(jax.random.split(k_act, BATCH))
      out = step(jax.random.split(k_step, BATCH), state, actions, params)
      obs, new_state, reward, terminated, truncated, info = out
      self.assertEqual(_shapes(new_state), state_shapes)
      chex.assert_shape([reward, terminated, truncated], (BATCH,))
      self.assertEqual(reward.dtype, jnp.float32)
      self.assertEqual(terminated.dtype, jnp.bool_)
      self.assertEqual(truncated.dtype, jnp.bool_)
      self.assertFalse(bool(jnp.any(terminated & truncated)))
      self.assertIsInstance(info, dict)
      chex.assert_tree_all_finite(reward)
      state = new_state

      ids = np.asarray(render(state))
      self.assertEqual(ids.dtype, np.int32)
      self.assertTrue(((ids >= 0) & (ids < len(env.symbols))).all())
      for b in range(BATCH):
        one = jax.tree.map(lambda x, b=b: x[b], state)
        self.assertEqual(env.render_text(one), "".join(env.symbols[i] for i in ids[b]))

    # vmap over params as well as keys.
    stacked = jax.tree.map(lambda x: jnp.stack([x] * BATCH), params)
    obs_p, state_p = jax.jit(jax.vmap(env.reset))(keys, stacked)
    chex.assert_trees_all_equal((obs_p, state_p), (obs2, state2))

  @parameterized.parameters(*ENV_IDS)
  def test_scan_with_auto_reset(self, env_id):
    env, params = envs_jax.make(env_id)
    env = envs_jax.AutoReset(env)

    def body(state, key):
      k_act, k_step = jax.random.split(key)
      _, state, reward, terminated, truncated, _ = env.step(
          k_step, state, env.sample_action(k_act), params)
      return state, (reward, terminated | truncated)

    @jax.jit
    def run(key):
      _, state = env.reset(key, params)
      return jax.lax.scan(body, state, jax.random.split(key, 16))[1]

    rewards, done = run(jax.random.key(2))
    chex.assert_shape([rewards, done], (16,))
    chex.assert_tree_all_finite(rewards)


if __name__ == "__main__":
  absltest.main()
