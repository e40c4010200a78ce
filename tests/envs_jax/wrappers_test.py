"""Tests of the Environment base class, wrappers and the registry on a toy env."""

from absl.testing import absltest
import chex
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import environment


@struct.dataclass
class CounterState:
  count: jax.Array  # shape=(), dtype=int32


@struct.dataclass
class CounterParams:
  goal: jax.Array  # shape=(), dtype=int32


class Counter(environment.Environment):
  """Counts up by the action (0 or 1); terminates when count reaches goal."""

  symbols = ("", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9")
  action_names = ("Stay", "Up")

  @property
  def default_params(self):
    return CounterParams(goal=jnp.int32(3))

  def reset_env(self, key, params):
    start = jax.random.randint(key, (), 0, 2, dtype=jnp.int32)
    state = CounterState(count=start)
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    del key
    state = CounterState(count=state.count + action)
    terminated = state.count >= params.goal
    return (self.observation(state), state, jnp.float32(action),
            terminated, jnp.bool_(False), {"count": state.count})

  def observation(self, state):
    return state.count

  def render_symbols(self, state):
    return (jnp.minimum(state.count, 9) + 1)[..., None].astype(jnp.int32)


class EnvironmentBaseTest(absltest.TestCase):

  def test_render_text_joins_symbols(self):
    env = Counter()
    state = CounterState(count=jnp.int32(7))
    self.assertEqual(env.render_text(state), "7")

  def test_render_text_rejects_batch(self):
    env = Counter()
    state = CounterState(count=jnp.zeros((2,), jnp.int32))
    with self.assertRaisesRegex(ValueError, "unbatched"):
      env.render_text(state)

  def test_symbol_id_error_names_symbol(self):
    with self.assertRaisesRegex(KeyError, "'x'"):
      Counter().symbol_id("x")

  def test_check_discrete_action(self):
    env = Counter()
    environment.check_discrete_action(env, 1)
    with self.assertRaisesRegex(ValueError, "out of range"):
      environment.check_discrete_action(env, 2)
    with self.assertRaisesRegex(ValueError, "integer"):
      environment.check_discrete_action(env, 0.5)

  def test_grid_render_symbols(self):
    grid = jnp.array([[1, 2], [3, 4]])
    np.testing.assert_array_equal(
        environment.grid_render_symbols(grid, newline_id=9), [1, 2, 9, 3, 4])

  def test_tree_select(self):
    a = {"x": jnp.ones((2,)), "y": jnp.int32(1)}
    b = {"x": jnp.zeros((2,)), "y": jnp.int32(2)}
    out = environment.tree_select(jnp.bool_(False), a, b)
    np.testing.assert_array_equal(out["x"], [0, 0])
    self.assertEqual(int(out["y"]), 2)

  def test_number_symbols(self):
    digits = [str(d) for d in range(10)]

    def text(ids):  # digit0_id 1, dot 11, minus 12; pads 0 and -1 dropped
      chars = ["", *digits, ".", "-"]
      return "".join(chars[i] for i in np.asarray(ids).tolist() if i >= 0)

    full = jax.jit(lambda x: environment.number_symbols(x, 1, int_digits=10, minus_id=12,
                                                        pad_id=-1))
    for x in (0, 7, -7, 1234567, 2**31 - 1, -2**31):
      ids = full(jnp.int32(x))
      self.assertEqual(ids.shape, (11,))
      self.assertEqual(text(ids), str(x))
    three = jax.jit(lambda x: environment.number_symbols(x, 1, int_digits=3))
    for x, want in ((0, "0"), (42, "42"), (999, "999"), (1000, "999"), (-5, "0")):
      self.assertEqual(text(three(jnp.int32(x))), want)
    dec = jax.jit(lambda x: environment.number_symbols(
        x, 1, int_digits=3, frac_digits=2, dot_id=11, minus_id=12))
    for x in (0.0, -0.1, 1.25, 12.5, -3.0):
      self.assertEqual(text(dec(jnp.float32(x))), str(round(x, 2)))
    with self.assertRaisesRegex(ValueError, "int_digits=11"):
      environment.number_symbols(jnp.int32(1), 1, int_digits=11)
    with self.assertRaisesRegex(ValueError, "frac_digits=2 needs a dot_id"):
      environment.number_symbols(jnp.float32(1), 1, int_digits=3, frac_digits=2)
    with self.assertRaisesRegex(ValueError, "frac_digits=1 for an integer"):
      environment.number_symbols(jnp.int32(1), 1, int_digits=3, frac_digits=1, dot_id=11)

  def test_actions_sentence(self):
    self.assertEqual(environment.actions_sentence(("Stay", "Up")),
                     "Your actions are Stay, Up; give one or more, separated by ||, for "
                     "example <answer>Stay || Up</answer>.")
    with self.assertRaisesRegex(ValueError, "no action names"):
      environment.actions_sentence(())

  def test_agent_hooks_default_to_none(self):
    env = Counter()
    self.assertIsNone(env.instructions)
    self.assertIsNone(env.agent_defaults)
    with self.assertRaisesRegex(NotImplementedError, "Counter has no expert"):
      env.expert_answers([], [])
    picks = env.random_answers([None] * 3, np.random.default_rng(0), actions_per_turn=2)
    self.assertLen(picks, 3)
    for p in picks:
      self.assertRegex(p, r"^(Stay|Up) \|\| (Stay|Up)$")

  def test_sample_action_in_range(self):
    env = Counter()
    actions = jax.vmap(env.sample_action)(jax.random.split(jax.random.key(0), 200))
    self.assertEqual(actions.dtype, jnp.int32)
    self.assertEqual(set(np.asarray(actions).tolist()), {0, 1})


class TimeLimitTest(absltest.TestCase):

  def test_truncates_not_terminates(self):
    env = envs_jax.TimeLimit(Counter(), max_steps=2)
    params = CounterParams(goal=jnp.int32(100))
    _, state = env.reset(jax.random.key(0), params)
    step = jax.jit(env.step)
    _, state, _, term, trunc, _ = step(jax.random.key(1), state, 1, params)
    self.assertFalse(bool(term))
    self.assertFalse(bool(trunc))
    _, state, _, term, trunc, _ = step(jax.random.key(2), state, 1, params)
    self.assertFalse(bool(term))
    self.assertTrue(bool(trunc))
    self.assertEqual(int(state.steps), 2)

  def test_termination_wins_on_last_step(self):
    env = envs_jax.TimeLimit(Counter(), max_steps=1)
    params = CounterParams(goal=jnp.int32(1))
    state = envs_jax.TimeLimitState(env_state=CounterState(count=jnp.int32(0)),
                                    steps=jnp.int32(0))
    _, _, _, term, trunc, _ = env.step(jax.random.key(0), state, 1, params)
    self.assertTrue(bool(term))
    self.assertFalse(bool(trunc))

  def test_bad_max_steps(self):
    for bad in (0, -1, 2.5, True):
      with self.assertRaisesRegex(ValueError, "max_steps"):
        envs_jax.TimeLimit(Counter(), max_steps=bad)

  def test_delegates_metadata_and_render(self):
    env = envs_jax.TimeLimit(Counter(), max_steps=3)
    self.assertEqual(env.action_names, ("Stay", "Up"))
    self.assertEqual(env.name, "Counter")
    self.assertIsInstance(env.unwrapped, Counter)
    _, state = env.reset(jax.random.key(3))
    self.assertEqual(env.render_text(state), str(int(state.env_state.count)))

  def test_forwards_agent_hooks(self):

    class Expert(Counter):
      agent_defaults = envs_jax.AgentDefaults(
          max_turns=2, max_actions_per_traj=3, max_tokens_per_turn=5, system="Count.")
      expert_think_text = "Up is the way."

      @property
      def instructions(self):
        return "Count up."

      def expert_answers(self, states, params, *, actions_per_turn=1, **options):
        return ["Up"] * len(states)

    for env in (envs_jax.TimeLimit(Expert(), 3), envs_jax.AutoReset(Expert()),
                envs_jax.AutoReset(envs_jax.TimeLimit(Expert(), 3))):
      self.assertEqual(env.instructions, "Count up.")
      self.assertEqual(env.agent_defaults.max_turns, 2)
      self.assertEqual(env.expert_think_text, "Up is the way.")
      self.assertEqual(env.expert_answers([None] * 2, [None] * 2), ["Up", "Up"])
      self.assertLen(env.random_answers([None], np.random.default_rng(0)), 1)


class AutoResetTest(absltest.TestCase):

  def test_resets_on_done_and_keeps_final_observation(self):
    env = envs_jax.AutoReset(envs_jax.TimeLimit(Counter(), max_steps=50))
    params = CounterParams(goal=jnp.int32(2))
    state = envs_jax.TimeLimitState(env_state=CounterState(count=jnp.int32(1)),
                                    steps=jnp.int32(7))
    obs, new_state, reward, term, trunc, info = jax.jit(env.step)(
        jax.random.key(0), state, 1, params)
    self.assertTrue(bool(term))
    self.assertFalse(bool(trunc))
    self.assertEqual(float(reward), 1.0)
    self.assertEqual(int(info["final_observation"]), 2)
    # Fresh episode: step counter back to 0, count in the reset range {0, 1}.
    self.assertEqual(int(new_state.steps), 0)
    self.assertIn(int(obs), (0, 1))
    self.assertEqual(int(obs), int(new_state.env_state.count))

  def test_scan_runs_many_episodes(self):
    env = envs_jax.AutoReset(envs_jax.TimeLimit(Counter(), max_steps=4))
    params = env.default_params

    def body(carry, key):
      state = carry
      _, state, reward, term, trunc, _ = env.step(key, state, 1, params)
      return state, (reward, term, trunc)

    _, state = env.reset(jax.random.key(0), params)
    _, (rewards, term, trunc) = jax.lax.scan(
        body, state, jax.random.split(jax.random.key(1), 30))
    chex.assert_shape(rewards, (30,))
    self.assertGreater(int(term.sum()), 5)  # an episode ends every 2-3 steps
    self.assertEqual(int(trunc.sum()), 0)   # goal 3 is reached before 4 steps


class RegistryTest(absltest.TestCase):

  def test_unknown_id_lists_registered(self):
    with self.assertRaisesRegex(ValueError, "unknown environment id 'Nope-v0'"):
      envs_jax.make("Nope-v0")

  def test_register_validates_and_never_overwrites(self):
    with self.assertRaisesRegex(ValueError, "must look like"):
      envs_jax.register("bad name", Counter)
    envs_jax.register("TestCounter-v0", Counter)
    try:
      with self.assertRaisesRegex(ValueError, "already registered"):
        envs_jax.register("TestCounter-v0", Counter)
      env, params = envs_jax.make("TestCounter-v0")
      self.assertIsInstance(env, Counter)
      self.assertEqual(int(params.goal), 3)
      self.assertIn("TestCounter-v0", envs_jax.registered())
    finally:
      envs_jax.unregister("TestCounter-v0")
    self.assertNotIn("TestCounter-v0", envs_jax.registered())
    with self.assertRaisesRegex(ValueError, "unknown environment id 'TestCounter-v0'"):
      envs_jax.make("TestCounter-v0")

  def test_unregister_frees_the_id_and_names_an_unknown_one(self):
    envs_jax.register("TestCounter-v1", Counter)
    envs_jax.unregister("TestCounter-v1")
    envs_jax.register("TestCounter-v1", Counter)  # free again
    envs_jax.unregister("TestCounter-v1")
    with self.assertRaisesRegex(ValueError,
                                "unknown environment id 'TestCounter-v1'; registered: "):
      envs_jax.unregister("TestCounter-v1")
    self.assertIn("Sokoban-6x6-1box-v0", envs_jax.registered())  # nothing else removed


if __name__ == "__main__":
  absltest.main()
