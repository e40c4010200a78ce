"""Tests of group compaction (StarPO-S filter before the update) and evaluation."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent.rollout import _trajectory
from jagent.train import _rl


def fake_trajectory(scores, group_size, s=6, t=2):
  b = len(scores)
  scores = jnp.asarray(scores, jnp.float32)
  z = lambda *shape: jnp.zeros(shape, jnp.int32)
  mask = jnp.ones((b, s), bool)
  return _trajectory.Trajectory(
      tokens=jnp.arange(b)[:, None] * 100 + jnp.arange(s)[None], loss_mask=mask,
      logprobs=jnp.zeros((b, s)), turn_ids=z(b, s), token_rewards=jnp.zeros((b, s)),
      length=jnp.full((b,), s), turn_rewards=jnp.zeros((b, t)), scores=scores,
      num_turns=jnp.ones((b,), jnp.int32), reply_lengths=z(b, t),
      format_valid=jnp.ones((b, t), bool), num_pieces=z(b, t), num_valid=z(b, t),
      num_executed=z(b, t), num_effective=z(b, t), anchor_hashes=z(b, t),
      num_actions=z(b), success=scores > 0, terminated=scores > 0, truncated=scores <= 0,
      end_reason=z(b), overflow=jnp.zeros((b,), bool),
      group_ids=jnp.arange(b) // group_size, group_size=group_size)


class CompactTest(absltest.TestCase):

  def test_keeps_highest_std_groups_first(self):
    # 4 groups of 2: stds (unbiased) 0, 1/sqrt(2)*2, 0, 1/sqrt(2)*1.
    traj = fake_trajectory([1, 1, 0, 2, 5, 5, 0, 1], 2)
    out, m = _rl.compact_groups(traj, 2, mode="top_fraction", value=0.5)
    # Group 1 (std of [0, 2]) then group 3 (std of [0, 1]).
    np.testing.assert_array_equal(out.tokens[:, 0], [200, 300, 600, 700])
    np.testing.assert_array_equal(out.scores, [0, 2, 0, 1])
    np.testing.assert_array_equal(out.group_ids, [0, 0, 1, 1])
    self.assertTrue(np.all(out.loss_mask))
    std = np.array([0, np.std([0, 2], ddof=1), 0, np.std([0, 1], ddof=1)])
    np.testing.assert_allclose(m["filter/reward_std_before"], std.mean(), rtol=1e-6)
    np.testing.assert_allclose(m["filter/reward_std_after"], (std[1] + std[3]) / 2, rtol=1e-6)
    self.assertEqual(float(m["filter/kept_groups"]), 2.0)
    self.assertEqual(float(m["filter/nonzero_std_frac"]), 0.5)

  def test_unkept_groups_fill_slots_with_zero_mask(self):
    # Only one group has variance; without zero-std groups the second slot trains nothing.
    traj = fake_trajectory([1, 1, 0, 2, 5, 5], 2)
    out, m = _rl.compact_groups(traj, 2, mode="top_fraction", value=0.7, include_zero=False)
    np.testing.assert_array_equal(out.scores[:2], [0, 2])
    np.testing.assert_array_equal(np.asarray(out.loss_mask).any(axis=1), [True, True, False,
                                                                          False])
    self.assertEqual(float(m["filter/kept_groups"]), 1.0)

  def test_jit_and_errors(self):
    traj = fake_trajectory([1, 1, 0, 2], 2)
    f = jax.jit(_rl.compact_groups, static_argnums=1)
    out, _ = f(traj, 1)
    np.testing.assert_array_equal(out.scores, [0, 2])
    with self.assertRaisesRegex(ValueError, "num_keep"):
      _rl.compact_groups(traj, 3)
    self.assertEqual(_rl.num_kept_groups(8, "top_fraction", 0.25), 2)
    self.assertEqual(_rl.num_kept_groups(8, "top_k", 3), 3)
    with self.assertRaisesRegex(ValueError, "data-dependent"):
      _rl.num_kept_groups(8, "top_p", 0.9)


if __name__ == "__main__":
  absltest.main()
