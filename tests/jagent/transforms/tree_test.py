"""Tree-rollout objectives: Tree-GRPO and the exact step baseline, by hand.

The group below: two trees of four episodes over two turns (fork at turn 0
and turn 1, K = 2), node ids as a tree rollout writes them (``owner * T +
t``):

    tree 0: turn 0 nodes A = 0 (episodes 0, 2), B = 2 (episodes 1, 3);
            turn 1 leaves 1 (ep 0), 3 (ep 1), 5 (ep 2), 7 (ep 3).
    tree 1: turn 0 nodes 8 (episodes 4, 6), 10 (episodes 5, 7); leaves 9 .. 15.

Scores: tree 0 = [1, 0, 0, 0], tree 1 = [1, 1, 1, 1].
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import transforms

NODES = np.array([[0, 1], [2, 3], [0, 5], [2, 7], [8, 9], [10, 11], [8, 13], [10, 15]])
SCORES = np.array([1, 0, 0, 0, 1, 1, 1, 1], np.float32)

# Exact step baseline of tree 0 alone (a group of 4):
# V(A) = mean(1, 0) = 0.5, V(B) = 0; roots A, B are siblings: mean 0.25.
# Turn 1 under A: leaves 1 (V=1), 5 (V=0), mean 0.5; under B: 3, 7 (0, 0).
STEP_TREE0 = np.array([[0.25, 0.5], [-0.25, 0.0], [0.25, -0.5], [-0.25, 0.0]])

# Tree-GRPO (sum): inter over the 8 scores: mean 5/8, unbiased std
# sqrt((5 * 0.375^2 + 3 * 0.625^2) / 7) = sqrt(1.875 / 7); intra tree 0: mean
# 0.25, std sqrt(0.75 / 3) = 0.5 -> [1.5, -0.5, -0.5, -0.5]; tree 1: std 0 -> 0.
_STD = np.sqrt(1.875 / 7)
_INTER = np.where(SCORES == 1, 0.375, -0.625) / (_STD + 1e-6)
_INTRA = np.array([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]) * 0.5 / (0.5 + 1e-6)
LEAF = _INTER + _INTRA
# A turn-0 node's advantage: the mean over its two leaves.
TREE_GRPO = np.stack([np.array([(LEAF[0] + LEAF[2]) / 2, (LEAF[1] + LEAF[3]) / 2] * 2
                               + [(LEAF[4] + LEAF[6]) / 2, (LEAF[5] + LEAF[7]) / 2] * 2), LEAF],
                     axis=1)


class TreeAdvantagesByHandTest(absltest.TestCase):

  def test_node_values(self):
    v = losses.tree_node_values(SCORES[:4], NODES[:4])
    np.testing.assert_allclose(v, [[0.5, 1], [0, 0], [0.5, 0], [0, 0]])

  def test_step_baseline(self):
    np.testing.assert_allclose(losses.tree_step_advantages(SCORES[:4], NODES[:4]), STEP_TREE0,
                               atol=1e-7)

  def test_step_baseline_roots_of_trees_are_siblings(self):
    a = np.asarray(losses.tree_step_advantages(SCORES, NODES))
    # Turn 0: node values 0.5, 0 (tree 0), 1, 1 (tree 1): mean 0.625.
    np.testing.assert_allclose(a[:, 0], [-0.125, -0.625, -0.125, -0.625, .375, .375, .375, .375])
    np.testing.assert_allclose(a[:4, 1], STEP_TREE0[:, 1], atol=1e-7)
    np.testing.assert_allclose(a[4:, 1], 0.0)

  def test_step_baseline_without_a_fork_is_zero_and_chain_is_dr_grpo(self):
    # Four independent roots, no fork: turn 0 is Dr.GRPO's s - mean, turn 1 has one child.
    nodes = np.array([[0, 1], [2, 3], [4, 5], [6, -1]])
    s = np.array([1.0, 0.0, 0.0, 3.0])
    a = np.asarray(losses.tree_step_advantages(s, nodes))
    np.testing.assert_allclose(a[:, 0], s - 1.0)
    np.testing.assert_allclose(a[:, 1], 0.0)

  def test_invalid_episode_is_no_leaf(self):
    valid = np.array([True, True, False, True])
    a = np.asarray(losses.tree_step_advantages(SCORES[:4], NODES[:4], valid))
    # V(A) = 1 (episode 2 left out), V(B) = 0: roots +-0.5; A has one child left.
    np.testing.assert_allclose(a, [[0.5, 0], [-0.5, 0], [0, 0], [-0.5, 0]], atol=1e-7)

  def test_tree_grpo_sum(self):
    np.testing.assert_allclose(losses.tree_grpo_advantages(SCORES, NODES, 4), TREE_GRPO,
                               rtol=1e-5)

  def test_tree_grpo_nested_and_node_sum(self):
    nested = np.asarray(losses.tree_grpo_advantages(SCORES, NODES, 4, combine="nested"))
    # Tree 0's inter-normalised scores are 2 values (one high, three low):
    # normalised within the tree they are again [1.5, -.5, -.5, -.5]; tree 1: 0.
    leaf = np.array([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0])
    np.testing.assert_allclose(nested[:, 1], leaf, atol=1e-5)
    np.testing.assert_allclose(nested[:4, 0], [0.5, -0.5, 0.5, -0.5], atol=1e-5)
    summed = np.asarray(losses.tree_grpo_advantages(SCORES, NODES, 4, node_reduce="sum"))
    np.testing.assert_allclose(summed[0, 0], LEAF[0] + LEAF[2], rtol=1e-5)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "tree_size"):
      losses.tree_grpo_advantages(SCORES, NODES, 3)
    with self.assertRaisesRegex(ValueError, "combine"):
      losses.tree_grpo_advantages(SCORES, NODES, 4, combine="max")


def _full_batch(tree_size=4):
  """One row per episode: turn 0 on tokens 0-1, turn 1 on tokens 2-3 (owned rows only)."""
  turn_ids = np.tile(np.array([0, 0, 1, 1, -1]), (8, 1))
  owner = NODES // 2
  own = np.take_along_axis(owner, np.clip(turn_ids, 0, 1), axis=1) == np.arange(8)[:, None]
  mask = own & (turn_ids >= 0)
  return transforms.Batch(loss_mask=jnp.asarray(mask), turn_ids=jnp.asarray(turn_ids),
                          scores=jnp.asarray(SCORES), tree_nodes=jnp.asarray(NODES),
                          group_size=8, tree_size=tree_size), mask, turn_ids


class TreeStagesTest(absltest.TestCase):

  def test_loss_masks_and_token_advantages_full_rows(self):
    batch, mask, ids = _full_batch()
    # Each node's tokens trained once: rows 2, 3 hold turn 0 of rows 0, 1.
    np.testing.assert_array_equal(mask[:4, :2], [[1, 1], [1, 1], [0, 0], [0, 0]])
    self.assertTrue(mask[:, 2:4].all())
    out = jax.jit(transforms.compute_tree_grpo().update)(batch, ())[0]
    want = np.where(mask, np.take_along_axis(TREE_GRPO, np.clip(ids, 0, 1), axis=1), 0.0)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5)
    step = transforms.compute_tree_step().update(batch.replace(scores=jnp.asarray(
        np.concatenate([SCORES[:4], SCORES[:4]]))), ())[0]
    # Both trees score like tree 0; turn-0 roots of all 4 nodes are siblings: same mean.
    want = np.where(mask, np.take_along_axis(np.tile(STEP_TREE0, (2, 1)), np.clip(ids, 0, 1),
                                             axis=1), 0.0)
    np.testing.assert_allclose(step.advantages, want, atol=1e-6)

  def test_turn_rows(self):
    # Row r = turn r % 2 of episode r // 2; a row trains iff its episode owns the turn.
    owner = NODES // 2
    own = (owner == np.arange(8)[:, None]).reshape(-1)
    mask = np.repeat(own[:, None], 3, axis=1)
    batch = transforms.Batch(
        loss_mask=jnp.asarray(mask), scores=jnp.asarray(np.repeat(SCORES, 2)),
        row_valid=jnp.asarray(own), tree_nodes=jnp.asarray(np.repeat(NODES, 2, axis=0)),
        group_size=8, turns_per_episode=2, tree_size=4)
    out = transforms.compute_tree_grpo().update(batch, ())[0]
    want = np.where(mask, TREE_GRPO.reshape(-1)[:, None], 0.0)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-5)

  def test_missing_tree_fields_name_them(self):
    batch, _, _ = _full_batch()
    with self.assertRaisesRegex(ValueError, "tree_size"):
      transforms.compute_tree_step().update(batch.replace(tree_size=0), ())
    with self.assertRaisesRegex(ValueError, "Batch.tree_nodes"):
      transforms.compute_tree_grpo().update(batch.replace(tree_nodes=None), ())

  def test_registered_objectives_clip_and_filter(self):
    batch, mask, _ = _full_batch()
    self.assertIn("tree_grpo", transforms.registered())
    logp = jnp.full(mask.shape, -1.0)
    old = logp - 0.5  # ratio e^0.5 > 1 + eps_high: the clipped branch
    for obj in (transforms.make("tree_grpo"), transforms.make("tree_grpo", advantage="tree_step"),
                transforms.starpo_s(advantage="tree_step"),
                transforms.starpo_s(advantage="tree_grpo")):
      b = batch.replace(old_logprobs=old, ref_logprobs=logp)
      b, _ = jax.jit(obj.update)(b, obj.init(b))
      out = obj.loss(transforms.ModelOutputs(logp, entropy=jnp.zeros(mask.shape)), b)
      self.assertTrue(np.isfinite(float(out.loss_sum)))
      self.assertEqual(float(out.denominator), float(mask.sum()))
    # StarPO-S's filter ranks groups by their score std: a group of equal scores drops.
    flat = batch.replace(scores=jnp.ones(8), group_size=4, tree_size=4)
    two = transforms.Batch(
        loss_mask=jnp.concatenate([batch.loss_mask, flat.loss_mask]),
        turn_ids=jnp.concatenate([batch.turn_ids, batch.turn_ids]),
        scores=jnp.concatenate([jnp.asarray(SCORES), jnp.ones(8)]),
        tree_nodes=jnp.concatenate([batch.tree_nodes, batch.tree_nodes + 16]),
        group_size=8, tree_size=4)
    obj = transforms.starpo_s(advantage="tree_step")
    filtered = transforms.with_filter_stage(obj)
    kept, _ = filtered.update(two, filtered.init(two))
    np.testing.assert_array_equal(kept.keep, [True] * 8 + [False] * 8)
    self.assertEqual(float(jnp.abs(kept.advantages[8:]).sum()), 0.0)


if __name__ == "__main__":
  absltest.main()
