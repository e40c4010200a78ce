"""trajectory_batch of turn rows (history_turns >= 0) and a train step on them."""

import types

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import models
from jagent import rollout
from jagent import train
from jagent import transforms

CFG = models.ModelConfig(vocab_size=32, embed_dim=16, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32)
PARAMS = models.init(CFG, jax.random.key(0))
B, T, S, G = 6, 3, 6, 3  # 6 episodes in 2 groups, 3 turns max: 18 rows
R = B * T
TURNS = np.array([1, 2, 3, 3, 1, 2])
OBJ = transforms.grpo(kl_coef=0.0)


def _traj(turn_rewards=None):
  """A hand-made turn-row trajectory in the rollout's layout (r = b * T + t)."""
  if turn_rewards is None:
    turn_rewards = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0],
                             [0, 0, 0], [0, 0.5, 0]], np.float32)
  valid = (np.arange(T)[None] < TURNS[:, None]).reshape(R)
  mask = np.zeros((R, S), bool)
  mask[:, 3:] = valid[:, None]
  rewards = np.zeros((R, S), np.float32)
  rewards[:, -1] = turn_rewards.reshape(R) * valid
  tokens = jax.random.randint(jax.random.key(1), (R, S), 1, CFG.vocab_size)
  return types.SimpleNamespace(
      history_turns=0, tokens=tokens, loss_mask=mask,
      logprobs=np.where(mask, -1.0, 0.0).astype(np.float32),
      turn_ids=np.where(mask, np.arange(R)[:, None] % T, -1).astype(np.int32),
      token_rewards=rewards, scores=turn_rewards.sum(1),
      terminated=np.array([True, False, True, True, False, True]),
      anchor_hashes=np.arange(B * T, dtype=np.int32).reshape(B, T) + 100,
      row_valid=valid, row_episode=(np.arange(R) // T).astype(np.int32),
      row_turn=(np.arange(R) % T).astype(np.int32), group_size=G)


def _config(k):
  return train.TrainConfig(
      model=CFG, actor_optimizer=train.OptimizerConfig(learning_rate=1e-2),
      ppo_epochs=1, num_minibatches=1, num_microbatches=k)


class TurnRowsBatchTest(absltest.TestCase):

  def test_fields(self):
    traj = _traj()
    batch = train.trajectory_batch(traj)
    self.assertEqual(batch.turns_per_episode, T)
    self.assertEqual(batch.group_size, G)
    np.testing.assert_array_equal(batch.scores, np.repeat(traj.scores, T))
    np.testing.assert_array_equal(batch.terminated,
                                  np.repeat(traj.terminated, T))
    np.testing.assert_array_equal(batch.anchor_hashes[:, 0],
                                  np.arange(R) + 100)
    np.testing.assert_array_equal(batch.episode_turns, np.repeat(TURNS, T))
    np.testing.assert_array_equal(batch.row_valid, traj.row_valid)
    # One row per episode (each episode's first row standing for it): no
    # turn rows, whatever history_turns says.
    first = {k: np.asarray(v)[::T] for k, v in vars(traj).items()
             if k in ("tokens", "loss_mask", "logprobs", "turn_ids", "token_rewards")}
    one = train.trajectory_batch(types.SimpleNamespace(**dict(
        vars(traj), **first, row_valid=np.ones(B, bool), row_episode=np.arange(B),
        row_turn=np.zeros(B, np.int32))))
    self.assertEqual(one.turns_per_episode, 1)
    self.assertIsNone(one.episode_turns)
    np.testing.assert_array_equal(one.row_valid, np.ones(B, bool))
    np.testing.assert_array_equal(one.anchor_hashes, traj.anchor_hashes)


class TurnRowsTrainStepTest(absltest.TestCase):

  def test_micro_batches_equal_the_whole_and_nan_episodes_train_the_rest(self):
    batch = train.trajectory_batch(_traj())
    states, metrics = {}, {}
    for k in (1, 3):
      state = train.init_train_state(PARAMS, jax.random.key(0),
                                     config=_config(k), objective=OBJ)
      states[k], metrics[k] = train.train_step(state, batch, objective=OBJ,
                                               config=_config(k))
      self.assertEqual(float(metrics[k]["train/updates_applied"]), 1.0)
    for key in ("loss/total", "train/grad_norm"):
      self.assertAlmostEqual(float(metrics[1][key]), float(metrics[3][key]),
                             places=6)
    # atol 1e-5: Adam's normalisation scales float rounding up on near-zero
    # gradients (as in step_test).
    chex.assert_trees_all_close(states[1].params, states[3].params, atol=1e-5)
    # A NaN reward in episode 4's only turn: it is dropped, the rest update.
    bad = _traj()
    bad.token_rewards = np.array(bad.token_rewards)
    bad.token_rewards[4 * T, -1] = np.nan
    bad.scores = np.array(bad.scores)
    bad.scores[4] = np.nan
    state = train.init_train_state(PARAMS, jax.random.key(0),
                                   config=_config(3), objective=OBJ)
    new, m = train.train_step(state, train.trajectory_batch(bad),
                              objective=OBJ, config=_config(3))
    self.assertEqual(float(m["rollout/nonfinite_episodes"]), 1.0)
    self.assertEqual(float(m["train/updates_applied"]), 1.0)
    for leaf in jax.tree.leaves(new.params):
      self.assertTrue(np.all(np.isfinite(np.asarray(leaf))))


def _trajectory(ns) -> rollout.Trajectory:
  """The namespace of :func:`_traj` as a Trajectory (other fields: per-turn / episode zeros)."""
  fields = {k: jnp.asarray(v) for k, v in vars(ns).items()
            if k not in ("history_turns", "group_size")}
  zeros_bt = jnp.zeros((B, T), jnp.int32)
  zeros_b = jnp.zeros((B,), jnp.int32)
  fields.update(
      length=jnp.where(fields["row_valid"], S, 0), turn_rewards=jnp.zeros((B, T)),
      num_turns=jnp.asarray(TURNS), reply_lengths=zeros_bt, format_valid=zeros_bt > 0,
      num_pieces=zeros_bt, num_valid=zeros_bt, num_executed=zeros_bt, num_effective=zeros_bt,
      num_actions=zeros_b, success=zeros_b > 0, truncated=~fields["terminated"],
      end_reason=zeros_b, overflow=zeros_b > 0, group_ids=jnp.arange(B) // G)
  return rollout.Trajectory(**fields, group_size=G, history_turns=0)


class TurnRowsCompactTest(absltest.TestCase):

  def test_compaction_keeps_whole_episodes_of_the_kept_groups(self):
    # Group 0 (scores 1, 1, 1: std 0) and group 1 (2, 0, 0.5): top_fraction 0.5
    # keeps group 1, whose episodes 3..5 own token rows 9..17.
    traj = _trajectory(_traj())
    kept, m = train.compact_groups(traj, 1, losses.FilterConfig("top_fraction", 0.5))
    self.assertEqual(float(m["filter/kept_groups"]), 1.0)
    rows = np.arange(3 * T, 6 * T)
    for f in ("tokens", "loss_mask", "token_rewards", "row_valid", "row_turn", "length"):
      np.testing.assert_array_equal(getattr(kept, f), np.asarray(getattr(traj, f))[rows], f)
    np.testing.assert_array_equal(kept.row_episode, np.arange(G * T) // T)
    np.testing.assert_array_equal(kept.scores, np.asarray(traj.scores)[3:])
    np.testing.assert_array_equal(kept.num_turns, TURNS[3:])
    np.testing.assert_array_equal(kept.group_ids, np.zeros(G))
    # Its batch is the batch of those episodes alone.
    want = train.trajectory_batch(_trajectory(_traj()).replace(group_size=G))
    got = train.trajectory_batch(kept)
    np.testing.assert_array_equal(got.scores, np.asarray(want.scores)[rows])
    np.testing.assert_array_equal(got.episode_turns, np.asarray(want.episode_turns)[rows])
    # A slot whose group the filter does not keep trains nothing.
    kept2, _ = train.compact_groups(traj, 2, losses.FilterConfig("top_fraction", 0.5, False))
    self.assertFalse(np.any(np.asarray(kept2.loss_mask)[G * T:]))
    self.assertTrue(np.any(np.asarray(kept2.loss_mask)[:G * T]))


if __name__ == "__main__":
  absltest.main()
