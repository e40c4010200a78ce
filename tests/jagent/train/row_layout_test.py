"""One row layout: consumers read a Trajectory's rows through row_episode / row_turn / row_valid.

The same hand-made episodes are laid out both ways the rollout can fill the
rows (one row per episode, and one row per turn), and every consumer is
checked against a copy of its former per-layout code (the oracle) and, where
the two layouts mean the same thing, against the other layout.
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import models
from jagent import rollout
from jagent import sharding
from jagent import train
from jagent import transforms
from jagent.rollout import _trajectory
from jagent.train import _collapse
from jagent.train import _rl

B, G, T = 6, 3, 3  # 6 episodes in 2 groups, at most 3 turns
W = 4  # tokens per turn: 2 prompt tokens, then a reply of 1 or 2 tokens
S = T * W
TURNS = np.array([1, 2, 3, 3, 1, 2], np.int32)
TURN_R = np.array([[1.0, 0, 0], [0.5, 0.0, 0], [0.0, 0.25, 1.0],
                   [0.0, 0.0, 0.0], [2.0, 0, 0], [1.0, -0.5, 0]], np.float32)


def _episodes():
  """(one row per episode, one row per turn) of the same six episodes.

  Turn t of episode b fills positions [t*W, (t+1)*W): two prompt tokens, then
  a reply of 1 + (b + t) % 2 tokens (padding after it). The turn row (b, t)
  holds the whole conversation up to reply t with only reply t trained.
  """
  taken = np.arange(T)[None] < TURNS[:, None]  # [B, T]
  rng = np.random.default_rng(0)
  tokens = np.zeros((B, S), np.int32)
  turn = np.full((B, S), -1, np.int32)
  logp = np.zeros((B, S), np.float32)
  rew = np.zeros((B, S), np.float32)
  end = np.zeros((B, T), np.int32)  # one past turn t's last token
  for b in range(B):
    for t in range(TURNS[b]):
      n = 1 + (b + t) % 2
      tokens[b, t * W:t * W + 2 + n] = rng.integers(1, 50, 2 + n)
      turn[b, t * W + 2:t * W + 2 + n] = t
      logp[b, t * W + 2:t * W + 2 + n] = -rng.random(n)
      rew[b, t * W + 1 + n] = TURN_R[b, t]
      end[b, t] = t * W + 2 + n
  z = lambda *shape: jnp.zeros(shape, jnp.int32)  # noqa: E731
  episode = dict(
      turn_rewards=jnp.asarray(TURN_R), scores=jnp.asarray(TURN_R.sum(1)),
      num_turns=jnp.asarray(TURNS), reply_lengths=z(B, T), format_valid=jnp.asarray(taken),
      num_pieces=z(B, T), num_valid=z(B, T), num_executed=z(B, T), num_effective=z(B, T),
      anchor_hashes=jnp.asarray(np.arange(B * T, dtype=np.int32).reshape(B, T) % 4 + 100),
      num_actions=jnp.asarray(TURNS), success=jnp.asarray(TURN_R.sum(1) > 0.9),
      terminated=jnp.asarray(TURNS < T), truncated=jnp.asarray(TURNS == T), end_reason=z(B),
      overflow=jnp.zeros((B,), bool), group_ids=jnp.arange(B, dtype=jnp.int32) // G)
  full = rollout.Trajectory(
      tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(turn >= 0), logprobs=jnp.asarray(logp),
      turn_ids=jnp.asarray(turn), token_rewards=jnp.asarray(rew),
      length=jnp.asarray(end[np.arange(B), TURNS - 1]),
      **rollout.Trajectory.one_row_per_episode(B), **episode, group_size=G, history_turns=-1)
  r = B * T
  pos = np.arange(S)[None, None]
  upto = pos < np.where(taken, end, 0)[..., None]  # [B, T, S]
  own = (turn[:, None] == np.arange(T)[None, :, None]) & taken[..., None]
  rows = lambda x, keep: np.where(keep, x[:, None], 0).reshape(r, S)  # noqa: E731
  turns = rollout.Trajectory(
      tokens=jnp.asarray(rows(tokens, upto)), loss_mask=jnp.asarray(own.reshape(r, S)),
      logprobs=jnp.asarray(rows(logp, own)),
      turn_ids=jnp.asarray(np.where(own, turn[:, None], -1).reshape(r, S)),
      token_rewards=jnp.asarray(rows(rew, own)),
      length=jnp.asarray(np.where(taken, end, 0).reshape(r)),
      row_valid=jnp.asarray(taken.reshape(r)),
      row_episode=jnp.arange(r, dtype=jnp.int32) // T,
      row_turn=jnp.arange(r, dtype=jnp.int32) % T, **episode, group_size=G, history_turns=T)
  return full, turns


def _as_tree(traj):
  """``traj`` as a tree rollout's (tree_size G, every turn its own node)."""
  node = jnp.where(jnp.asarray(traj.format_valid),
                   jnp.arange(B)[:, None] * T + jnp.arange(T)[None, :], -1)
  return traj.replace(tree_node=node, tree_parent=node, tree_depth=node, tree_size=G)


# ---- The former per-layout code (the oracles), as it was before one layout.

def _old_trajectory_batch(traj):
  if getattr(traj, "history_turns", -1) >= 0:
    return _old_turn_rows_batch(traj)
  tree = getattr(traj, "tree_size", 0)
  return transforms.Batch(
      tokens=traj.tokens, loss_mask=traj.loss_mask, sampler_logprobs=traj.logprobs,
      rewards=traj.token_rewards, scores=traj.scores, terminated=traj.terminated,
      turn_ids=traj.turn_ids, anchor_hashes=traj.anchor_hashes,
      group_size=traj.group_size, **(dict(
          tree_nodes=traj.tree_node, tree_size=tree, row_valid=traj.row_valid) if tree else {}))


def _old_turn_rows_batch(traj):
  b, t = traj.anchor_hashes.shape
  ep = jnp.asarray(traj.row_episode, jnp.int32)
  valid = jnp.asarray(traj.row_valid, jnp.bool_)
  turns = jnp.sum(valid.reshape(b, t).astype(jnp.float32), axis=1)
  return transforms.Batch(
      tokens=traj.tokens, loss_mask=traj.loss_mask,
      sampler_logprobs=traj.logprobs, rewards=traj.token_rewards,
      scores=traj.scores[ep],
      terminated=traj.terminated[ep], turn_ids=traj.turn_ids,
      anchor_hashes=traj.anchor_hashes[ep, traj.row_turn][:, None],
      row_valid=valid, episode_turns=turns[ep], group_size=traj.group_size,
      turns_per_episode=t, **(dict(tree_nodes=traj.tree_node[ep], tree_size=traj.tree_size)
                              if getattr(traj, "tree_size", 0) else {}))


def _old_pick_rows(traj, key, n):
  r = traj.tokens.shape[0]
  if traj.history_turns < 0:
    reply = traj.loss_mask & (traj.turn_ids == 0)
    candidate = jnp.any(reply, axis=1)
    log_weight = jnp.zeros((r,), jnp.float32)
  else:
    reply = jnp.asarray(traj.loss_mask, bool)
    candidate = traj.row_valid & jnp.any(reply, axis=1)
    turns = jnp.asarray(traj.num_turns)[traj.row_episode]
    log_weight = -jnp.log(jnp.maximum(turns, 1).astype(jnp.float32))
  score = jnp.where(candidate, log_weight + jax.random.gumbel(key, (r,)), -jnp.inf)
  _, rows = jax.lax.top_k(score, n)
  return rows, candidate[rows], reply


def _old_compacted(traj, num_keep, filter_config):
  """The former compact_groups' trajectory."""
  g = traj.group_size
  n = traj.scores.shape[0] // g
  scores = traj.scores.reshape(n, g)
  res = losses.filter_groups(scores, filter_config.mode, filter_config.value,
                             filter_config.include_zero, valid_ng=traj.played().reshape(n, g))
  keep, std = res.keep, res.group_std
  order = jnp.lexsort((jnp.arange(n), -std, ~keep))[:num_keep]
  rows = (order[:, None] * g + jnp.arange(g)[None]).reshape(-1)
  row_keep = jnp.repeat(keep[order], g)
  if traj.history_turns < 0:
    out = jax.tree.map(lambda x: x[rows], traj)
    out = out.replace(loss_mask=out.loss_mask & row_keep[:, None],
                      group_ids=jnp.arange(num_keep * g, dtype=jnp.int32) // g)
  else:
    t = traj.tokens.shape[0] // traj.scores.shape[0]
    token_rows = (rows[:, None] * t + jnp.arange(t)[None]).reshape(-1)
    by_row = {f: getattr(traj, f)[token_rows] for f in _trajectory.ROW_FIELDS}
    out = jax.tree.map(lambda x: x[rows], traj.replace(**{f: None for f in by_row}))
    by_row["loss_mask"] = by_row["loss_mask"] & jnp.repeat(row_keep, t)[:, None]
    by_row["row_episode"] = jnp.arange(num_keep * g * t, dtype=jnp.int32) // t
    out = out.replace(group_ids=jnp.arange(num_keep * g, dtype=jnp.int32) // g, **by_row)
  return out


def _old_texts(traj, tokenizer, num):
  out = []
  t_max = traj.turn_rewards.shape[1]
  text = lambda r: tokenizer.decode(  # noqa: E731
      np.asarray(traj.tokens[r, :int(traj.length[r])]).tolist())
  for b in range(min(num, traj.scores.shape[0])):
    turns = int(traj.num_turns[b])
    if traj.history_turns < 0:
      out.append(text(b))
    else:
      out.append("\n".join(f"=== turn {t + 1} ===\n{text(b * t_max + t)}"
                            for t in range(turns)))
  return out


class _Digits:
  """A tokenizer stand-in: token ids as text."""

  def decode(self, ids):
    return " ".join(map(str, ids))


def _assert_same_batch(test, got, want):
  """Equal field by field, but for ``row_valid``: None before meant every row valid."""
  test.assertEqual((got.group_size, got.turns_per_episode, got.tree_size),
                   (want.group_size, want.turns_per_episode, want.tree_size))
  for f in ("tokens", "loss_mask", "sampler_logprobs", "rewards", "scores", "terminated",
            "turn_ids", "anchor_hashes", "episode_turns", "tree_nodes"):
    g, w = getattr(got, f), getattr(want, f)
    test.assertEqual(g is None, w is None, f)
    if w is not None:
      test.assertEqual(np.asarray(g).dtype, np.asarray(w).dtype, f)
      np.testing.assert_array_equal(g, w, f)
  want_valid = np.ones(got.tokens.shape[0], bool) if want.row_valid is None else want.row_valid
  np.testing.assert_array_equal(got.row_valid, want_valid)


class TrajectoryBatchTest(absltest.TestCase):

  def test_equals_the_former_branch_in_both_layouts(self):
    for traj in _episodes():
      for t in (traj, _as_tree(traj)):
        _assert_same_batch(self, train.trajectory_batch(t), _old_trajectory_batch(t))

  def test_row_valid_in_place_of_none_trains_bit_for_bit(self):
    # One row per episode: the old batch had row_valid None, the new one all
    # True; a train step on either gives the same parameters, bit for bit.
    cfg = models.ModelConfig(vocab_size=64, embed_dim=16, num_layers=1, num_heads=2,
                             num_kv_heads=1, head_dim=8, mlp_dim=32)
    config = train.TrainConfig(
        model=cfg, actor_optimizer=train.OptimizerConfig(learning_rate=1e-2),
        ppo_epochs=1, num_minibatches=1, num_microbatches=2)
    obj = transforms.grpo(kl_coef=0.0)
    params = models.init(cfg, jax.random.key(0))
    full, _ = _episodes()
    out = []
    for batch in (train.trajectory_batch(full), _old_trajectory_batch(full)):
      state = train.init_train_state(params, jax.random.key(0), config=config, objective=obj)
      out.append(train.train_step(state, batch, objective=obj, config=config))
    (new, m_new), (old, m_old) = out
    for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(old.params)):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(float(m_new["loss/total"]), float(m_old["loss/total"]))

  def test_both_layouts_give_each_reply_the_same_advantage(self):
    # GRPO's advantage is the episode's: every reply token gets it, whichever
    # row holds the reply.
    obj = transforms.grpo(kl_coef=0.0)
    adv = []
    for traj in _episodes():
      batch = train.trajectory_batch(traj)
      batch, _ = jax.jit(obj.update)(batch, obj.init(batch))
      a = np.asarray(batch.advantages)
      m = np.asarray(traj.loss_mask)
      ids = np.asarray(traj.turn_ids)
      ep = np.asarray(traj.row_episode)
      per_turn = np.full((B, T), np.nan, np.float32)
      for r, t in zip(*np.nonzero(m)):
        per_turn[ep[r], ids[r, t]] = a[r, t]
      adv.append(per_turn)
    np.testing.assert_array_equal(adv[0], adv[1])
    self.assertFalse(np.all(np.nan_to_num(adv[0]) == 0))


class CollapsePairsTest(absltest.TestCase):

  def test_rows_drawn_equal_the_former_branch_in_both_layouts(self):
    full, turns = _episodes()
    # A slot never played (a tree's row never forked into): no row, no reply.
    unplayed = full.replace(row_valid=full.row_valid.at[4].set(False),
                            loss_mask=full.loss_mask.at[4].set(False))
    candidates = (B, int(TURNS.sum()), B - 1, int(TURNS.sum()))
    for traj, count in zip((full, turns, unplayed, _as_tree(turns)), candidates):
      r = traj.tokens.shape[0]
      for seed in range(5):
        for n in (3, r):
          key = jax.random.key(seed)
          got = jax.jit(_collapse._pick_rows, static_argnums=2)(  # pylint: disable=protected-access
              traj, key, n)
          want = jax.jit(_old_pick_rows, static_argnums=2)(traj, key, n)
          for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
      # Drawing every row picks each row that holds a reply once.
      self.assertEqual(int(np.sum(got[1])), count)

class DecodeSamplesTest(absltest.TestCase):

  def test_texts_equal_the_former_branch_in_both_layouts(self):
    full, turns = _episodes()
    for traj in (full, turns, full.replace(num_turns=full.num_turns.at[1].set(0))):
      got = [s["text"] for s in train.decode_samples(traj, _Digits(), num=B)]
      self.assertEqual(got, _old_texts(traj, _Digits(), B))
    # Turn rows: one headed text per taken turn, the last one the whole episode's.
    got = train.decode_samples(turns, _Digits(), num=B)
    self.assertEqual([s["text"].count("=== turn ") for s in got], TURNS.tolist())
    self.assertTrue(got[2]["text"].endswith(
        train.decode_samples(full, _Digits(), num=3)[2]["text"]))


class CompactTest(absltest.TestCase):

  # Group 0's scores (1, 0.5, 1.25) and group 1's (0, 2, 0.5); three filters:
  # keep one, keep one of two slots without zero-std groups, keep both.
  FILTERS = ((1, losses.FilterConfig("top_fraction", 0.5)),
             (2, losses.FilterConfig("top_k", 1, False)),
             (2, losses.FilterConfig("top_fraction", 1.0)))

  def test_equals_the_former_branch_in_both_layouts(self):
    full, turns = _episodes()
    for traj in (full, turns, _as_tree(turns)):
      for k, fc in self.FILTERS:
        got, _ = jax.jit(_rl.compact_groups, static_argnums=(1, 2))(traj, k, fc)
        want = _old_compacted(traj, k, fc)
        if traj.history_turns < 0:
          # The former gathered row_episode (the old episode numbers); now
          # renumbered to the kept episodes, as with turn rows.
          np.testing.assert_array_equal(np.asarray(want.row_episode)[:G], [3, 4, 5])  # group 1
          np.testing.assert_array_equal(got.row_episode, np.arange(k * G))
          want = want.replace(row_episode=got.row_episode)
        self.assertEqual(jax.tree.structure(got), jax.tree.structure(want))
        for path, g, w in zip(*zip(*jax.tree_util.tree_flatten_with_path(got)[0]),
                              jax.tree.leaves(want)):
          np.testing.assert_array_equal(g, w, err_msg=jax.tree_util.keystr(path))

  def test_both_layouts_keep_the_same_episodes(self):
    full, turns = _episodes()
    for k, fc in self.FILTERS:
      a, ma = _rl.compact_groups(full, k, fc)
      b, mb = _rl.compact_groups(turns, k, fc)
      self.assertEqual(jax.tree.map(float, ma), jax.tree.map(float, mb))
      for f in ("scores", "num_turns", "turn_rewards", "anchor_hashes", "group_ids"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), f)
      # Each kept episode's trained tokens: its row's in one layout, the
      # union of its rows' in the other.
      per_episode = np.asarray(b.loss_mask).reshape(k * G, T, S).sum(axis=1)
      np.testing.assert_array_equal(per_episode, np.asarray(a.loss_mask))
      ba, bb = train.trajectory_batch(a), train.trajectory_batch(b)
      np.testing.assert_array_equal(np.asarray(bb.scores).reshape(k * G, T)[:, 0], ba.scores)


class RowsShardingTest(absltest.TestCase):

  def test_episodes_and_rows_split_in_both_layouts(self):
    mesh = sharding.make_mesh("data:2", devices=jax.devices()[:2])
    for traj in _episodes():
      placed = sharding.shard_rows(traj, mesh)
      for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(traj)):
        np.testing.assert_array_equal(a, b)
      # Each device holds half the episodes and half the rows.
      r = traj.tokens.shape[0]
      self.assertEqual({s.data.shape[0] for s in placed.tokens.addressable_shards}, {r // 2})
      self.assertEqual({s.data.shape[0] for s in placed.scores.addressable_shards}, {B // 2})
    full, turns = _episodes()
    with self.assertRaisesRegex(ValueError, r"disagree on the leading dimension B: \[6, 18\]"):
      sharding.rows_shardings(full.replace(length=turns.length), mesh)
    with self.assertRaisesRegex(ValueError, r"disagree on the leading dimension B: \[6, 18\]"):
      sharding.rows_shardings(turns.replace(num_turns=turns.length), mesh)


if __name__ == "__main__":
  absltest.main()
