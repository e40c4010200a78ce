"""Tests of Countdown: hand-computed rewards, rendering, API, jit/vmap, errors."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import countdown
from envs_jax._src import countdown_reference as ref

L = 64
ENV = countdown.Countdown(max_answer_bytes=L)
PARAMS = ENV.default_params


def _state(numbers, target):
  padded = list(numbers) + [0] * (4 - len(numbers))
  return countdown.CountdownState(
      numbers=jnp.asarray(padded, jnp.int32), count=jnp.int32(len(numbers)),
      target=jnp.int32(target), done=jnp.bool_(False))


@jax.jit
def _step(state, action, params):
  return ENV.step(jax.random.key(0), state, action, params)


_render = jax.jit(ENV.render_symbols)


# Instance [25, 5, 3] -> 23 (25 - 5 + 3), rewards worked out by hand.
HAND_CASES = (
    ("correct", "25 - 5 + 3", 1.0),
    ("correct_reordered", "3 + 25 - 5", 1.0),
    ("wrong_value", "25 + 5 - 3", 0.1),
    ("wrong_number", "25 - 5 + 4", 0.0),
    ("repeated_number", "25 - 5 + 3 + 3 - 3", 0.0),
    ("missing_number", "25 - 2", 0.0),
    ("extra_unknown_number", "25 - 5 + 3 * 1", 0.0),
    ("nested_parentheses", "((25 - (5 - 3)))", 1.0),
    ("parenthesised_literals", "((25)) - (5) + ((3))", 1.0),
    ("unbalanced_open", "(25 - 5 + 3", 0.1),
    ("unbalanced_close", "25 - 5 + 3)", 0.1),
    ("empty", "", 0.0),
    ("spaces_only", "     ", 0.0),
    ("spaces", "   25-5 +3   ", 1.0),
    ("tab_newline", "25\t-\n5\r\n+ 3", 1.0),
    ("leading_unary_minus", "-5 + 25 + 3", 1.0),
    ("double_minus", "3 - -25 - 5", 1.0),
    ("unary_minus_on_group", "-(5 - 25) + 3", 1.0),
    ("unary_plus_chain", "+-+-25 - 5 + 3", 1.0),
    ("unicode_minus", "25 \u2212 5 + 3", 0.1),
    ("fullwidth_digit", "\uff12\uff15 - 5 + 3", 0.0),
    ("trailing_garbage", "25 - 5 + 3 abc", 0.1),
    ("equals_with_result", "25 - 5 + 3 = 23", 0.0),
    ("equals_without_result", "25 - 5 + 3 =", 0.1),
    ("equals_leading", "23 = 25 - 5 + 3", 0.0),
    ("huge_integer", "25 - 5 + 300000000000000000000000", 0.0),
    ("huge_integer_only", "9" * 60, 0.0),
    ("leading_zero", "025 - 5 + 3", 0.1),
    ("decimal_point", "25 - 5 + 3.0", 0.0),
    ("power", "25 ** 5 + 3", 0.1),
    ("floor_division", "25 // 5 + 3", 0.1),
    ("implicit_multiplication", "(25 - 5)(3)", 0.1),
    ("adjacent_numbers", "25 5 3", 0.1),
    ("empty_parentheses", "()25 - 5 + 3", 0.1),
    ("trailing_operator", "25 - 5 + 3 +", 0.1),
    ("leading_binary_operator", "* 25 - 5 + 3", 0.1),
    ("nul_terminates", "25 - 5 + 3\0 + 99", 1.0),
    ("bytes_after_truncation", "25 - 5 + 3" + " " * (L - 10) + "+ 1", 1.0),
)


class RewardTest(parameterized.TestCase):

  @parameterized.named_parameters(*HAND_CASES)
  def test_hand_computed(self, answer, want):
    state = _state([25, 5, 3], 23)
    _, _, reward, term, trunc, info = _step(
        state, countdown.encode_answer(answer, L), PARAMS)
    self.assertEqual(float(reward), float(np.float32(want)))
    self.assertEqual(bool(info["success"]), want == 1.0)
    self.assertEqual(bool(info["numbers_ok"]), want > 0)
    self.assertTrue(bool(term))
    self.assertFalse(bool(trunc))
    # The host reference agrees (on the same, possibly truncated, bytes).
    r = ref.reference_reward(countdown.encode_answer(answer, L), [25, 5, 3], 23)
    self.assertEqual(r.reward, want)

  @parameterized.named_parameters(
      ("zero_divisor", [6, 6, 2], 4, "2 / (6 - 6)", 0.1, False),
      ("zero_over_zero", [0, 7, 7], 0, "0 / (7 - 7)", 0.1, False),
      ("zero_times_zero_divisor", [2, 6, 6, 0], 0, "0 * (2 / (6 - 6))", 0.1, False),
      ("exact_fraction", [6, 4, 3], 8, "4 / 3 * 6", 1.0, True),
      ("fraction_not_integer", [7, 2, 1], 3, "7 / 2 * 1", 0.1, True),
      ("four_numbers", [4, 4, 6, 2], 10, "(4 + 4) * 2 - 6", 1.0, True),
      ("four_numbers_fraction", [4, 4, 6, 2], 3, "(4 * 6) / (4 * 2)", 1.0, True),
      ("four_numbers_divide", [4, 4, 6, 2], 4, "4 / (6 - 4) * 2", 1.0, True),
      ("four_numbers_zero_divisor", [4, 4, 6, 2], 4, "(6 - 2) / (4 - 4)", 0.1, False),
      ("four_numbers_extra", [4, 4, 6, 2], 2, "(4 + 4 - 6) / 2 * 2", 0.0, True),
      ("same_count_other_multiset", [4, 4, 6, 2], 14, "4 + 6 + 2 + 2", 0.0, True),
      ("repeated_right", [4, 4, 6, 2], 12, "4 + 4 + 6 - 2", 1.0, True),
  )
  def test_more_hand_computed(self, numbers, target, answer, want, evaluates):
    _, _, reward, _, _, info = _step(
        _state(numbers, target), countdown.encode_answer(answer, L), PARAMS)
    self.assertEqual(float(reward), float(np.float32(want)))
    if bool(info["numbers_ok"]):
      self.assertEqual(bool(info["evaluates"]), evaluates)
    r = ref.reference_reward(answer, numbers, target)
    self.assertEqual(r.reward, want)

  def test_zero_divisor_flags(self):
    _, _, _, _, _, info = _step(
        _state([6, 6, 2], 4), countdown.encode_answer("2 / (6 - 6)", L), PARAMS)
    self.assertTrue(bool(info["numbers_ok"]))
    self.assertTrue(bool(info["well_formed"]))
    self.assertFalse(bool(info["evaluates"]))
    self.assertFalse(bool(info["overflow"]))

  def test_huge_integer_flags(self):
    _, _, reward, _, _, info = _step(
        _state([25, 5, 3], 23),
        countdown.encode_answer("25 - 5 + 3" + "0" * 30, L), PARAMS)
    self.assertEqual(float(reward), 0.0)
    self.assertTrue(bool(info["overflow"]))
    self.assertFalse(bool(info["numbers_ok"]))
    # 2**31 - 1 still parses; 2**31 is "huge" (matches no number).
    for text, ok in (("2147483647", True), ("2147483648", False)):
      state = _state([2147483647, 0, 0], 0)
      _, _, _, _, _, info = _step(state, countdown.encode_answer(text + "-0-0", L), PARAMS)
      self.assertEqual(bool(info["numbers_ok"]), ok, text)

  @parameterized.named_parameters(
      # value 7/2 against targets 3 and 4 with tolerance 1/K (strict).
      ("k1_below", 3, 1, 1.0), ("k1_above", 4, 1, 1.0), ("k2", 3, 2, 0.1),
      ("k3", 4, 3, 0.1), ("default", 3, 100_000, 0.1), ("far", 5, 1, 0.1))
  def test_tolerance(self, target, inv_tolerance, want):
    params = PARAMS.replace(inv_tolerance=jnp.int32(inv_tolerance))
    _, _, reward, _, _, _ = _step(
        _state([7, 2, 1], target), countdown.encode_answer("7 / 2 * 1", L), params)
    self.assertEqual(float(reward), float(np.float32(want)))

  def test_tolerance_within_one_part_in_100000(self):
    # |100001/100000 - 1| = 1e-5 is not < 1e-5; |200001/200000 - 1| is. (Such
    # numbers are never generated; the state is set by hand, count 2.)
    params = PARAMS
    for num, den, want in ((100001, 100000, 0.1), (200001, 200000, 1.0)):
      text = f"{num} / {den}"
      _, _, reward, _, _, _ = _step(
          _state([num, den], 1), countdown.encode_answer(text, L), params)
      self.assertEqual(float(reward), float(np.float32(want)), text)
      self.assertEqual(ref.reference_reward(text, [num, den], 1).reward, want)

  def test_reward_values_come_from_params(self):
    params = PARAMS.replace(reward_correct=jnp.float32(2.0),
                            reward_format=jnp.float32(-0.5),
                            reward_wrong_numbers=jnp.float32(-1.0))
    state = _state([25, 5, 3], 23)
    got = [float(_step(state, countdown.encode_answer(a, L), params)[2])
           for a in ("25 - 5 + 3", "25 + 5 - 3", "1 + 2")]
    self.assertEqual(got, [2.0, -0.5, -1.0])

  def test_info_structure(self):
    _, state, reward, term, trunc, info = _step(
        _state([25, 5, 3], 23), countdown.encode_answer("25-5+3", L), PARAMS)
    self.assertEqual(sorted(info), ["evaluates", "numbers_ok", "overflow",
                                    "success", "well_formed"])
    for v in info.values():
      self.assertEqual(v.dtype, jnp.bool_)
      self.assertEqual(v.shape, ())
    self.assertEqual(reward.dtype, jnp.float32)
    self.assertEqual((term.dtype, trunc.dtype), (jnp.bool_, jnp.bool_))
    self.assertTrue(bool(state.done))

  def test_countdown_reward_function_directly(self):
    reward, info = jax.jit(countdown.countdown_reward)(
        countdown.encode_answer("-5+25+3", 16), jnp.array([25, 5, 3, 0], jnp.int32),
        jnp.int32(3), jnp.int32(23), PARAMS)
    self.assertEqual(float(reward), 1.0)
    self.assertTrue(bool(info["success"]))

  def test_step_traces_once(self):
    step = jax.jit(chex.assert_max_traces(ENV.step, n=1))
    state = _state([25, 5, 3], 23)
    for text in ("25-5+3", "1", "((((", "25 - 5 + 3 = 23"):
      step(jax.random.key(0), state, countdown.encode_answer(text, L), PARAMS)


class RenderTest(parameterized.TestCase):

  @parameterized.parameters(
      ([12, 5, 39], 42), ([4, 4, 6, 2], 100), ([1, 2, 3], 0),
      ([2147483647, 0, 7, 100], -2147483648), ([-5, 99, 10], 7))
  def test_render_matches_ragen_wording(self, numbers, target):
    state = _state(numbers, target)
    text = ENV.render_text(state)
    self.assertEqual(text, f"Target: {target}, nums: {numbers}")  # RAGEN's f-string
    ids = np.asarray(_render(state))
    self.assertEqual(ids.shape, (ENV.render_length,))
    self.assertEqual(ids.dtype, np.int32)
    self.assertEqual("".join(ENV.symbols[i] for i in ids), text)
    n = len([i for i in ids if i != 0])
    np.testing.assert_array_equal(ids[n:], 0)  # padding at the end only

  def test_render_hand_written_ids(self):
    ids = np.asarray(_render(_state([12, 5, 3], 9)))
    sym = [ENV.symbols[i] for i in ids if i]
    self.assertEqual(sym, ["Target: ", "9", ", nums: [", "1", "2", ", ", "5", ", ", "3",
                           "]"])

  def test_symbols(self):
    self.assertEqual(ENV.symbols[0], "")
    self.assertLen(set(ENV.symbols), len(ENV.symbols))
    self.assertEqual(ENV.action_names, ())
    self.assertEqual(ENV.num_actions, 0)


class EnvApiTest(parameterized.TestCase):

  def test_registered_default(self):
    self.assertIn("Countdown-v0", envs_jax.registered())
    env, params = envs_jax.make("Countdown-v0")
    self.assertIsInstance(env, envs_jax.Countdown)
    self.assertTrue(env.plus_minus_only)
    self.assertEqual(env.max_answer_bytes, 128)
    chex.assert_trees_all_equal(params, countdown.make_params())
    env, _ = envs_jax.make("Countdown-v0", plus_minus_only=False, max_answer_bytes=32)
    self.assertFalse(env.plus_minus_only)
    self.assertEqual(env.sample_action(jax.random.key(0)).shape, (32,))

  def test_reset_shapes_and_values(self):
    obs, state = jax.jit(ENV.reset)(jax.random.key(3), PARAMS)
    chex.assert_shape(obs, (6,))
    self.assertEqual(obs.dtype, jnp.int32)
    chex.assert_shape(state.numbers, (4,))
    self.assertEqual(state.numbers.dtype, jnp.int32)
    self.assertIn(int(state.count), (3, 4))
    np.testing.assert_array_equal(
        obs, np.r_[np.asarray(state.numbers), int(state.count), int(state.target)])
    self.assertFalse(bool(state.done))
    numbers = [int(x) for x in state.numbers[:int(state.count)]]
    self.assertIsNotNone(ref.solve(numbers, int(state.target), plus_minus_only=True))

  def test_docstring_example(self):
    obs, state = jax.jit(ENV.reset)(jax.random.key(0), PARAMS)
    self.assertEqual(ENV.render_text(state), "Target: 60, nums: [46, 39, 84, 59]")
    _, _, reward, _, _, _ = _step(state, countdown.encode_answer("46 + 39 - 84 + 59", L),
                                  PARAMS)
    self.assertEqual(float(reward), 1.0)
    np.testing.assert_array_equal(obs, [46, 39, 84, 59, 4, 60])

  def test_reproducible_and_key_dependent(self):
    reset = jax.jit(ENV.reset)
    a = reset(jax.random.key(11), PARAMS)
    b = reset(jax.random.key(11), PARAMS)
    chex.assert_trees_all_equal(a, b)
    keys = jax.random.split(jax.random.key(12), 64)
    _, states = jax.jit(jax.vmap(ENV.reset, in_axes=(0, None)))(keys, PARAMS)
    rows = {tuple(np.r_[n, t]) for n, t in zip(np.asarray(states.numbers),
                                                np.asarray(states.target))}
    self.assertGreater(len(rows), 60)
    raw = jax.random.PRNGKey(11)  # raw uint32[2] keys work as well
    chex.assert_trees_all_equal(reset(raw, PARAMS), reset(raw, PARAMS))

  def test_vmap_over_keys_and_params(self):
    n = 8
    params = jax.tree.map(lambda x: jnp.stack([x] * n), PARAMS)
    params = params.replace(
        min_target=jnp.array([10, 50, 0, 90, 10, 50, 0, 90], jnp.int32),
        max_target=jnp.array([20, 60, 5, 100, 20, 60, 5, 100], jnp.int32),
        prob_four=jnp.array([0, 1, 0, 1, 0, 1, 0, 1], jnp.float32),
        max_number=jnp.array([99, 99, 30, 99, 10, 99, 30, 99], jnp.int32),
        reward_correct=jnp.arange(n, dtype=jnp.float32))
    keys = jax.random.split(jax.random.key(5), n)
    obs, state = jax.jit(jax.vmap(ENV.reset))(keys, params)
    count = np.asarray(state.count)
    np.testing.assert_array_equal(count, [3, 4, 3, 4, 3, 4, 3, 4])
    t = np.asarray(state.target)
    self.assertTrue(((t >= params.min_target) & (t <= params.max_target)).all(), t)
    nums = np.asarray(state.numbers)
    for i in range(n):
      real = nums[i, :count[i]]
      self.assertTrue((real >= 1).all() and (real <= int(params.max_number[i])).all())
      np.testing.assert_array_equal(nums[i, count[i]:], 0)
    answers = np.stack([
        countdown.encode_answer(ref.solve(nums[i, :count[i]], t[i], plus_minus_only=True), L)
        for i in range(n)])
    step = jax.jit(jax.vmap(ENV.step))
    _, _, reward, term, _, info = step(keys, state, answers, params)
    np.testing.assert_array_equal(reward, np.arange(n, dtype=np.float32))
    self.assertTrue(np.asarray(term).all() and np.asarray(info["success"]).all())
    chex.assert_shape(obs, (n, 6))

  def test_auto_reset(self):
    env = envs_jax.AutoReset(ENV)
    state = _state([25, 5, 3], 23)
    _, new_state, reward, term, _, info = jax.jit(env.step)(
        jax.random.key(1), state, countdown.encode_answer("25-5+3", L), PARAMS)
    self.assertEqual(float(reward), 1.0)
    self.assertTrue(bool(term))
    self.assertFalse(bool(new_state.done))  # a fresh instance
    np.testing.assert_array_equal(info["final_observation"], [25, 5, 3, 0, 3, 23])

  def test_encode_answer(self):
    np.testing.assert_array_equal(countdown.encode_answer("1+2", 5), [49, 43, 50, 0, 0])
    np.testing.assert_array_equal(countdown.encode_answer(b"12345678", 4), list(b"1234"))
    self.assertEqual(countdown.encode_answer("\u00e9", 4).tolist(), [0xC3, 0xA9, 0, 0])
    self.assertEqual(countdown.encode_answer("x", 3).dtype, np.uint8)

  def test_sample_action(self):
    a = jax.jit(ENV.sample_action)(jax.random.key(0))
    self.assertEqual((a.shape, a.dtype), ((L,), jnp.uint8))


class ErrorTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("zero_bytes", dict(max_answer_bytes=0), "max_answer_bytes"),
      ("float_bytes", dict(max_answer_bytes=64.0), "max_answer_bytes"),
      ("too_many_bytes", dict(max_answer_bytes=5000), "max_answer_bytes"),
      ("mode_not_bool", dict(plus_minus_only="yes"), "plus_minus_only"))
  def test_bad_config(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      countdown.Countdown(**kwargs)

  @parameterized.named_parameters(
      ("number_too_big", dict(max_number=128), "max_number"),
      ("number_zero", dict(min_number=0), "min_number"),
      ("number_range_empty", dict(min_number=50, max_number=40), "min_number"),
      ("target_range_empty", dict(min_target=50, max_target=10), "min_target"),
      ("target_too_big", dict(max_target=5000), "max_target"),
      ("tolerance", dict(inv_tolerance=0), "inv_tolerance"),
      ("prob_four", dict(prob_four=1.5), "prob_four"),
      ("unknown_field", dict(reward=1.0), "reward"))
  def test_bad_params(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      countdown.make_params(**kwargs)

  def test_reset_checks_concrete_params(self):
    with self.assertRaisesRegex(ValueError, "max_number"):
      ENV.reset(jax.random.key(0), PARAMS.replace(max_number=jnp.int32(500)))

  @parameterized.named_parameters(
      ("wrong_length", np.zeros(L + 1, np.uint8)),
      ("wrong_dtype", np.zeros(L, np.int32)),
      ("batched", np.zeros((2, L), np.uint8)))
  def test_bad_action(self, action):
    with self.assertRaisesRegex(ValueError, "uint8"):
      ENV.step(jax.random.key(0), _state([1, 2, 3], 6), action, PARAMS)

  def test_bad_encode_and_reference_inputs(self):
    with self.assertRaisesRegex(ValueError, "max_answer_bytes"):
      countdown.encode_answer("1", 0)
    with self.assertRaisesRegex(ValueError, "inv_tolerance"):
      ref.reference_reward("1", [1], 1, inv_tolerance=0)
    with self.assertRaisesRegex(ValueError, "255"):
      ref.answer_bytes([1, 300])


if __name__ == "__main__":
  absltest.main()
