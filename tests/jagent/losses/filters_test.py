"""Tests for jagent.losses rollout filters (StarPO-S / RAGEN-2)."""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses

# Six groups of G = 4 raw scores. Unbiased stds (x 1/sqrt(12)):
#   g0 [1,0,0,0] -> sqrt(3)   g1 [0,0,1,0] -> sqrt(3) (same multiset as g0)
#   g2 [2,0,0,0] -> 2 sqrt(3) g3 [5,5,5,5] -> 0
#   g4 [1,1,0,0] -> 2         g5 [0,0,0,0] -> 0
_SCORES = np.array([[1, 0, 0, 0], [0, 0, 1, 0], [2, 0, 0, 0], [5, 5, 5, 5],
                    [1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
_STD = np.array([np.sqrt(3), np.sqrt(3), 2 * np.sqrt(3), 0, 2, 0]) / np.sqrt(12)
# Order by std desc, ties by index: g2, g4, g0, g1, g3, g5.


def _filter(mode, value, include_zero=True):
  return jax.jit(functools.partial(losses.filter_groups, mode=mode,
                                   value=value, include_zero=include_zero))


class FilterTest(chex.TestCase, parameterized.TestCase):

  def test_equal_scores_have_zero_std(self):
    # float32 mean of eight 10.7s rounds; equal scores must still count as
    # zero-variance groups (include_zero=False drops them).
    std = jax.jit(losses.group_std)(jnp.full((2, 8), 10.7, jnp.float32))
    np.testing.assert_array_equal(std, [0.0, 0.0])

  def test_group_std_is_order_invariant(self):
    std = jax.jit(losses.group_std)(_SCORES)
    np.testing.assert_allclose(std, _STD, rtol=1e-6)
    self.assertEqual(float(std[0]), float(std[1]))  # bit-identical tie
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 16)).astype(np.float32)
    perm = np.concatenate([x, x[:, rng.permutation(16)]])
    std = jax.jit(losses.group_std)(perm)
    self.assertEqual(float(std[0]), float(std[1]))

  @parameterized.parameters(
      # top_fraction: k = int(value * 6), at least 1.
      ("top_fraction", 0.25, True, [0, 0, 1, 0, 0, 0]),
      ("top_fraction", 0.5, True, [1, 0, 1, 0, 1, 0]),  # tie g0/g1 -> g0
      ("top_fraction", 0.1, True, [0, 0, 1, 0, 0, 0]),
      ("top_fraction", 1.0, True, [1, 1, 1, 1, 1, 1]),
      ("top_fraction", 1.0, False, [1, 1, 1, 0, 1, 0]),
      ("top_k", 4, True, [1, 1, 1, 0, 1, 0]),
      ("top_k", 5, True, [1, 1, 1, 1, 1, 0]),  # zero-std tie g3/g5 -> g3
      ("top_k", 5, False, [1, 1, 1, 0, 1, 0]),
      ("top_k", 99, True, [1, 1, 1, 1, 1, 1]),
      # top_p: stds 2s3, 2, s3, s3 in rank order, total 4s3 + 2 = 8.93
      # (s3 = sqrt 3); share kept before each: 0, .388, .612, .806.
      ("top_p", 0.3, True, [0, 0, 1, 0, 0, 0]),
      ("top_p", 0.5, True, [0, 0, 1, 0, 1, 0]),
      ("top_p", 0.6, True, [0, 0, 1, 0, 1, 0]),
      ("top_p", 0.7, True, [1, 0, 1, 0, 1, 0]),
      ("top_p", 0.9, True, [1, 1, 1, 0, 1, 0]),
      ("top_p", 1.0, True, [1, 1, 1, 1, 1, 1]),
      # min_p: keep std >= value * max.
      ("min_p", 0.5, True, [1, 1, 1, 0, 1, 0]),
      ("min_p", 0.55, True, [0, 0, 1, 0, 1, 0]),
      ("min_p", 0.6, True, [0, 0, 1, 0, 0, 0]),
      ("min_p", 0.0, True, [1, 1, 1, 1, 1, 1]),
      ("min_p", 0.0, False, [1, 1, 1, 0, 1, 0]),
  )
  def test_keeps_intended_groups(self, mode, value, include_zero, expect):
    out = _filter(mode, value, include_zero)(_SCORES)
    np.testing.assert_array_equal(out.keep, np.array(expect, bool))
    np.testing.assert_array_equal(out.keep_rows,
                                  np.repeat(np.array(expect, bool), 4))
    self.assertAlmostEqual(float(out.kept_ratio), sum(expect) / 6, places=6)
    self.assertTrue(bool(out.any_kept))
    kept = _STD[np.array(expect, bool)]
    self.assertAlmostEqual(float(out.kept_std_mean), kept.mean(), places=5)
    self.assertAlmostEqual(float(out.std_mean), _STD.mean(), places=5)

  def test_ties_break_by_index_under_permutation(self):
    # Groups 0..3 all have the same multiset in different orders.
    s = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0]], np.float32)
    out = _filter("top_k", 2)(s)
    np.testing.assert_array_equal(out.keep, [1, 1, 0, 0])

  @parameterized.parameters(("top_p", 0.9, True), ("top_k", 2, False),
                            ("min_p", 0.5, False), ("top_fraction", 0.5, False))
  def test_nothing_kept_signal(self, mode, value, include_zero):
    out = _filter(mode, value, include_zero)(np.ones((3, 4), np.float32))
    self.assertFalse(bool(out.any_kept))
    self.assertEqual(float(out.kept_ratio), 0.0)
    self.assertEqual(float(out.kept_std_mean), 0.0)

  def test_groups_of_one(self):
    out = _filter("top_fraction", 0.5)(np.arange(4, dtype=np.float32)[:, None])
    np.testing.assert_array_equal(out.group_std, np.zeros(4))
    np.testing.assert_array_equal(out.keep, [1, 1, 0, 0])

  def test_vmap_over_batches(self):
    fn = jax.jit(jax.vmap(functools.partial(losses.filter_groups,
                                            mode="top_k", value=1)))
    out = fn(jnp.stack([_SCORES, _SCORES[::-1]]))
    np.testing.assert_array_equal(out.keep[0], [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(out.keep[1], [0, 0, 0, 1, 0, 0])

  def test_non_finite_scores_rank_by_the_finite_members(self):
    nan, inf, neg_nan = np.nan, np.inf, np.copysign(np.nan, -1.0)
    s = np.array([[1, nan, 0, 1],         # members [1, 0, 1]: sqrt(1/3)
                  [nan, nan, nan, nan],   # no member: 0
                  [0, 0, 5, 5],           # sqrt(25/3)
                  [1, 0, 0, 0],           # 1/2
                  [-inf, 2, inf, 2],      # members [2, 2]: 0
                  [3e38, -3e38, 0, 0],    # finite, but the std overflows: 0
                  [neg_nan, 2, 0, nan]],  # members [2, 0]: sqrt(2)
                 np.float32)
    want = np.array([np.sqrt(1 / 3), 0, np.sqrt(25 / 3), 0.5, 0, 0, np.sqrt(2)])
    std = np.asarray(jax.jit(losses.group_std)(s))
    np.testing.assert_allclose(std, want, rtol=1e-6)
    # Order: g2, g6, g0, g3, then the zero-spread groups by index (1, 4, 5).
    for mode, value, include_zero, expect in (
        ("top_k", 3, True, [1, 0, 1, 0, 0, 0, 1]),
        ("top_k", 5, True, [1, 1, 1, 1, 0, 0, 1]),
        ("top_k", 6, False, [1, 0, 1, 1, 0, 0, 1]),
        ("top_p", 0.9, True, [1, 0, 1, 0, 0, 0, 1]),  # shares before: 0, .54, .80, .91
        ("min_p", 0.3, True, [0, 0, 1, 0, 0, 0, 1])):
      out = _filter(mode, value, include_zero)(s)
      np.testing.assert_array_equal(out.keep, np.array(expect, bool), err_msg=(mode, value))
      self.assertAlmostEqual(float(out.std_mean), want.mean(), places=5)
      self.assertTrue(np.isfinite(float(out.kept_std_mean)))
    # The same result whatever the NaNs' signs and positions (bit for bit).
    moved = np.array([[nan, 1, 1, 0], [neg_nan, nan, neg_nan, nan]], np.float32)
    got = np.asarray(jax.jit(losses.group_std)(moved))
    np.testing.assert_array_equal(got, std[:2])
    # valid_ng leaves members out as a NaN does; finite input is unchanged.
    valid = np.ones((7, 4), bool)
    valid[3, 0] = False  # g3 keeps [0, 0, 0]: 0
    valid[2, 1] = False  # g2 keeps [0, 5, 5]
    got = np.asarray(losses.group_std(s, valid))
    np.testing.assert_allclose(got[[0, 1, 4, 5, 6]], std[[0, 1, 4, 5, 6]], rtol=1e-6)
    self.assertEqual(float(got[3]), 0.0)
    self.assertAlmostEqual(float(got[2]), np.std([0, 5, 5], ddof=1), places=5)
    np.testing.assert_array_equal(losses.group_std(_SCORES, np.ones((6, 4), bool)),
                                  losses.group_std(_SCORES))
    with self.assertRaisesRegex(ValueError, "valid_ng"):
      losses.filter_groups(_SCORES, valid_ng=np.ones((6, 3), bool))

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "mode"):
      losses.filter_groups(_SCORES, "top")
    with self.assertRaisesRegex(ValueError, "value"):
      losses.filter_groups(_SCORES, "top_fraction", 0.0)
    with self.assertRaisesRegex(ValueError, "value"):
      losses.filter_groups(_SCORES, "min_p", 1.5)
    with self.assertRaisesRegex(ValueError, "value"):
      losses.filter_groups(_SCORES, "top_k", 0)
    with self.assertRaisesRegex(ValueError, "rank 2"):
      losses.filter_groups(_SCORES[0])



class FilterConfigTest(parameterized.TestCase):

  @parameterized.parameters(
      ({"mode": "top_half"}, r"FilterConfig\.mode='top_half': must be one of"),
      ({"value": 0.0}, r"FilterConfig\.value=0\.0: invalid for mode 'top_fraction'"),
      ({"mode": "top_k", "value": 0.5}, r"FilterConfig\.value=0\.5: .*'top_k'"),
      ({"mode": "min_p", "value": 1.5}, r"FilterConfig\.value=1\.5"),
      ({"value": "0.5"}, r"FilterConfig\.value='0\.5'"),
      ({"include_zero": 1}, r"FilterConfig\.include_zero=1: must be a bool"),
  )
  def test_errors_name_the_field(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      losses.FilterConfig(**kwargs)

  def test_defaults_hashable_and_fixed_count(self):
    f = losses.FilterConfig()
    self.assertEqual((f.mode, f.value, f.include_zero), ("top_fraction", 0.25, True))
    self.assertEqual(hash(f), hash(losses.FilterConfig("top_fraction", 0.25, True)))
    self.assertTrue(f.fixed_count)
    self.assertTrue(losses.FilterConfig("top_k", 2).fixed_count)
    self.assertFalse(losses.FilterConfig("top_p", 0.9).fixed_count)
    self.assertFalse(losses.FilterConfig("min_p", 0.0).fixed_count)
    with self.assertRaises(dataclasses.FrozenInstanceError):
      f.value = 0.5  # pytype: disable=not-writable


if __name__ == "__main__":
  absltest.main()
