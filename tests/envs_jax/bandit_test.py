"""Tests of the RAGEN two-arm bandit: payouts, shuffling, success, text."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import bandit as bandit_lib

ENV = bandit_lib.Bandit()
PARAMS = ENV.default_params
N = 40_000


def _prompt(a, b):
  """RAGEN's bandit prompt with arms a, b in display order (written by hand)."""
  return (
      "You are playing a bandit game. Goal: Maximize your total reward by choosing "
      "which arm to pull. \n"
      "Game Rules: \n"
      f"1. There are 2 arms, named {a} and {b}\n"
      "2. Each arm has its own reward distribution, related to their names. \n"
      "3. Analyze the symbolic meaning of each arm's name to guess how their reward "
      "distribution might behave.\n"
      "4. Based on the symbolic meaning of their names, which arm do you think is more "
      "likely to give higher rewards on average? Choose between "
      f"{a} and {b}, and output like <answer> {a} </answer> or <answer> {b} </answer>.\n")


@jax.jit
def _episodes(keys, action, params):
  """Reset + one pull per key. Returns (reset state, step outputs)."""
  def one(key):
    k_reset, k_step = jax.random.split(key)
    _, state = ENV.reset(k_reset, params)
    return state, ENV.step(k_step, state, action, params)
  return jax.vmap(one)(keys)


class BanditTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.keys = jax.random.split(jax.random.key(0), N)

  def test_low_arm_pays_exactly(self):
    _, (_, state, reward, term, trunc, info) = _episodes(self.keys, 0, PARAMS)
    np.testing.assert_array_equal(reward, np.float32(0.1))
    np.testing.assert_array_equal(term, True)
    np.testing.assert_array_equal(trunc, False)
    np.testing.assert_array_equal(info["success"], False)
    np.testing.assert_array_equal(state.pulled, 0)

  def test_high_arm_statistics(self):
    _, (_, _, reward, term, _, info) = _episodes(self.keys, 1, PARAMS)
    reward = np.asarray(reward)
    self.assertTrue(np.isin(reward, [0.0, 1.0]).all())
    tol = 5 * np.sqrt(0.25 * 0.75 / N)  # 5 sigma of a binomial proportion
    self.assertAlmostEqual(reward.mean(), 0.25, delta=tol)
    np.testing.assert_array_equal(term, True)
    np.testing.assert_array_equal(info["success"], True)
    np.testing.assert_array_equal(info["action_effective"], True)

  def test_order_shuffle(self):
    state, (_, _, reward, _, _, _) = _episodes(self.keys, 1, PARAMS)
    order = np.asarray(state.order)
    self.assertTrue(((order == [0, 1]) | (order == [1, 0])).all(1).all())
    swapped = order[:, 0] == 1
    self.assertAlmostEqual(swapped.mean(), 0.5, delta=5 * np.sqrt(0.25 / N))
    # Display order and payout are independent.
    hit = np.asarray(reward) == 1.0
    self.assertAlmostEqual(hit[swapped].mean(), hit[~swapped].mean(),
                           delta=5 * np.sqrt(0.25 * 0.75 * 4 / N))
    again, _ = _episodes(self.keys[:100], 1, PARAMS)
    np.testing.assert_array_equal(again.order, order[:100])  # deterministic per key

  def test_payout_fixed_at_reset(self):
    # As RAGEN (per-seed generator): same initial state, same outcome,
    # whatever the step key.
    _, state = ENV.reset(jax.random.key(3), PARAMS)
    rewards = jax.vmap(lambda k: ENV.step(k, state, 1, PARAMS)[2])(
        jax.random.split(jax.random.key(4), 64))
    np.testing.assert_array_equal(rewards, rewards[0])

  def test_batched_params(self):
    b = 4
    params = jax.tree.map(lambda x: jnp.stack([x] * b), PARAMS)
    params = params.replace(high_prob=jnp.asarray([0.0, 1.0, 0.0, 1.0], jnp.float32),
                            low_reward=jnp.asarray([0.15, 0.15, 0.2, 0.2], jnp.float32))
    step = jax.jit(chex.assert_max_traces(
        lambda k, s, a, p: jax.vmap(ENV.step)(k, s, a, p), n=1))
    keys = jax.random.split(jax.random.key(1), b)
    _, state = jax.jit(jax.vmap(ENV.reset))(keys, params)
    high = step(keys, state, jnp.ones((b,), jnp.int32), params)[2]
    low = step(keys, state, jnp.zeros((b,), jnp.int32), params)[2]
    np.testing.assert_array_equal(high, [0.0, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(low, np.float32([0.15, 0.15, 0.2, 0.2]))

  def test_prompt_text(self):
    seen = set()
    reset = jax.jit(ENV.reset)
    for i in range(8):
      _, state = reset(jax.random.key(i), PARAMS)
      names = tuple(ENV.action_names[a] for a in np.asarray(state.order))
      seen.add(names)
      self.assertEqual(ENV.render_text(state), _prompt(*names))
    self.assertEqual(seen, {("Phoenix", "Dragon"), ("Dragon", "Phoenix")})

  @parameterized.named_parameters(
      ("low", 0, True, "Phoenix: 0.1 points"),
      ("high_hit", 1, True, "Dragon: 1.0 points"),
      ("high_miss", 1, False, "Dragon: 0.0 points"),
  )
  def test_pull_text(self, action, hit, text):
    state = bandit_lib.BanditState(
        order=jnp.asarray([1, 0], jnp.int32), high_hit=jnp.asarray(hit),
        pulled=jnp.asarray(-1, jnp.int32), reward=jnp.zeros((), jnp.float32))
    _, state, _, _, _, _ = jax.jit(ENV.step)(jax.random.key(0), state, action, PARAMS)
    self.assertEqual(ENV.render_text(state), text)
    ids = np.asarray(jax.jit(ENV.render_symbols)(state))
    self.assertEqual(ids.shape, (13,))
    self.assertEqual("".join(ENV.symbols[i] for i in ids), text)

  @parameterized.parameters(0.1, 1.0, 0.0, 0.15, 0.25, 2.5, -0.1, -3.0, 12.25, 999.9999,
                            0.0001, 100.0, 7.125)
  def test_number_text(self, x):
    ids = jax.jit(lambda v: envs_jax.number_symbols(
        v, ENV.symbol_id("0"), int_digits=4, frac_digits=4, dot_id=ENV.symbol_id("."),
        minus_id=ENV.symbol_id("-")))(jnp.float32(x))
    self.assertEqual("".join(ENV.symbols[i] for i in np.asarray(ids)),
                     str(round(float(x), 4)))

  def test_registered(self):
    env, params = envs_jax.make("Bandit-v0")
    self.assertIsInstance(env.unwrapped, envs_jax.Bandit)
    self.assertEqual(env.action_names, ("Phoenix", "Dragon"))
    self.assertEqual(env.max_steps, 1)
    chex.assert_trees_all_equal(params, PARAMS)
    test_env, _ = envs_jax.make("BanditTest-v0")
    self.assertEqual(test_env.action_names, ("Trader", "Librarian"))
    _, state = test_env.reset(jax.random.key(1), params)
    names = tuple(test_env.action_names[a] for a in np.asarray(state.env_state.order))
    self.assertEqual(test_env.render_text(state), _prompt(*names))
    _, state, reward, term, trunc, info = test_env.step(jax.random.key(2), state, 1, params)
    self.assertTrue(bool(term))
    self.assertFalse(bool(trunc))  # termination wins over the 1-step limit
    self.assertTrue(bool(info["success"]))
    self.assertEqual(test_env.render_text(state), f"Librarian: {float(reward)} points")

  def test_metadata(self):
    self.assertEqual(ENV.symbols[0], "")
    self.assertLen(set(ENV.symbols), len(ENV.symbols))
    self.assertEqual(ENV.num_actions, 2)
    obs, _ = ENV.reset(jax.random.key(0), PARAMS)
    self.assertEqual(obs.dtype, jnp.int32)
    chex.assert_shape(obs, (2,))

  @parameterized.named_parameters(
      ("empty", dict(low_name=""), "low_name"),
      ("not_str", dict(high_name=3), "high_name"),
      ("same", dict(low_name="Dragon", high_name="dragon"), "differ"),
      ("collides", dict(low_name=" and "), "collides"),
  )
  def test_bad_config(self, kwargs, msg):
    with self.assertRaisesRegex(ValueError, msg):
      bandit_lib.Bandit(**kwargs)

  def test_bad_action(self):
    _, state = ENV.reset(jax.random.key(0), PARAMS)
    with self.assertRaisesRegex(ValueError, "out of range"):
      ENV.step(jax.random.key(0), state, 2, PARAMS)


if __name__ == "__main__":
  absltest.main()
