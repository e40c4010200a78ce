"""Tests of tree rollouts: exact forks, the recorded tree, budgets, config errors.

A forked branch must equal, token for token, the rollout a row plays alone
from its parent's state, context and key: the independent program below
plays the first turns as a chain, copies the parent's row into every row
(in reversed order, so no row sits where the tree had it), gives each the
child's keys and plays on; it must match the tree rollout, which forks
inside one jitted program.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

import envs_jax
import jagent
from jagent import rollout
from jagent import sharding
from jagent import train
from jagent.rollout import _rollout
from jagent.rollout import _tree
from jagent import losses
from tests.jagent.rollout.rollout_test import bigram_params
from tests.jagent.rollout.rollout_test import MICRO
from tests.jagent.rollout.rollout_test import random_params
from tests.jagent.rollout.rollout_test import TOK

FORK = 1  # the fork turn of the exactness tests


def _text_env():
  env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
  return rollout.TextEnv(env, TOK, rollout.PromptConfig.compact(), verify_states=8)


def _config(history_turns=-1, greedy=False, tree=None, **kw):
  tree = tree or rollout.TreeConfig(fork_turns=(FORK,), branches=3)
  base = dict(num_groups=2, group_size=tree.group_size(), max_turns=3, max_tokens_per_turn=10,
              temperature=0.7, top_k=50, greedy=greedy, history_turns=history_turns, tree=tree)
  return rollout.RolloutConfig(**{**base, **kw})


def _independent(text_env, config, params, key, fork):
  """Every row b played alone from its parent's state at ``fork`` with child b's keys.

  Turns before ``fork`` run as a chain (per-row keys, every row alive); row
  b's parent is its tree's first row and it is child ``b % n`` (one fork
  round, K = n). Rows are laid out reversed after the copy.
  """
  prog = _rollout.make_program(text_env, MICRO, config)
  b, n = config.batch_size, config.tree.rows_per_tree()

  @jax.jit
  def run(params, key):
    carry, keys, aux = prog.start(params, key, None, row_keys=True)
    carry = jax.lax.fori_loop(0, fork, lambda t, c: prog.turn(params, c, t, keys, aux), carry)
    rows = np.arange(b)[::-1]  # the row that holds episode rows[i] is i
    parent = (rows // n) * n
    child = rows % n
    carry = _tree.gather_rows(carry, parent)
    carry = carry[:5] + (_tree.child_keys(carry[5], child),) + carry[6:]
    keys = _tree.child_keys(keys[parent], child)
    carry = jax.lax.fori_loop(fork, config.max_turns,
                              lambda t, c: prog.turn(params, c, t, keys, aux), carry)
    return prog.finish(carry)

  traj = run(params, key)
  inverse = np.argsort(np.arange(b)[::-1])
  t_max = config.max_turns
  if config.history_turns >= 0:  # turn rows: whole episodes move
    r_idx = (inverse[:, None] * t_max + np.arange(t_max)[None]).reshape(-1)
  else:
    r_idx = inverse
  return traj, inverse, r_idx


class TreeForkExactTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("sampled_full", -1, False), ("sampled_history1", 1, False), ("greedy_full", -1, True))
  def test_branch_equals_independent_rollout(self, history_turns, greedy):
    text_env = _text_env()
    config = _config(history_turns, greedy)
    params, key = random_params(2), jax.random.key(11)
    tree = rollout.make_rollout(text_env, MICRO, config)(params, key)
    ind, ep, rows = _independent(text_env, config, params, key, FORK)
    for f in ("tokens", "length", "logprobs"):
      a, b_ = np.asarray(getattr(tree, f)), np.asarray(getattr(ind, f))[rows]
      if f == "logprobs":  # the tree holds them on the tokens it sampled only
        a, b_ = a[np.asarray(tree.loss_mask)], b_[np.asarray(tree.loss_mask)]
      np.testing.assert_array_equal(a, b_, err_msg=f)
    for f in ("turn_rewards", "reply_lengths", "num_turns", "scores", "end_reason",
              "num_actions", "anchor_hashes"):
      np.testing.assert_array_equal(np.asarray(getattr(tree, f)),
                                    np.asarray(getattr(ind, f))[ep], err_msg=f)
    # The K children of a node differ after the fork (sampled), not before.
    reply = np.asarray(tree.reply_lengths)
    self.assertTrue(np.all(reply[0::3, 0] == reply[1::3, 0]))
    if not greedy:
      toks = np.asarray(tree.tokens).reshape(-1, 3, tree.tokens.shape[-1])
      self.assertTrue(any(not np.array_equal(g[0], g[1]) for g in toks))

  def test_greedy_tree_equals_chain(self):
    """Greedy, deterministic game: every branch is the chain episode of its group."""
    text_env = _text_env()
    tree_cfg = rollout.TreeConfig(fork_turns=(0, 2), branches=(2, 2), trees=2)
    config = _config(greedy=True, tree=tree_cfg)
    params, key = random_params(3), jax.random.key(5)
    tree = rollout.make_rollout(text_env, MICRO, config)(params, key)
    chain = rollout.make_rollout(text_env, MICRO, dataclasses.replace(config, tree=None))(
        params, key)
    for f in ("tokens", "length", "turn_rewards", "scores", "num_turns"):
      np.testing.assert_array_equal(np.asarray(getattr(tree, f)), np.asarray(getattr(chain, f)),
                                    err_msg=f)
    self._check_books(tree, chain, config)
    samples = train.decode_samples(tree, TOK, num=4)
    self.assertEqual(samples[3]["tree"], 0)
    self.assertEqual(samples[3]["tree_nodes"], np.asarray(tree.tree_node[3]).tolist())
    self.assertEqual(samples[3]["tree_parents"], np.asarray(tree.tree_parent[3]).tolist())
    self.assertNotIn("tree", train.decode_samples(chain, TOK, num=1)[0])

  def test_built_in_one_trace_runs_in_later_traces(self):
    # A program cache (experiments.programs) builds the rollout function the
    # first time a program traces and reuses it when a program traces again
    # (a sweep's last, shorter chunk of RL steps; the next cell). The function
    # must close over no array of the trace that built it: that trace's
    # tracers would leak into the later ones (UnexpectedTracerError).
    text_env = _text_env()
    config = _config(greedy=True, tree=rollout.TreeConfig(fork_turns=(0, 2), branches=(2, 2)))
    params, key = random_params(3), jax.random.key(5)
    built = []

    def run(params, key):
      if not built:
        built.append(rollout.make_rollout(text_env, MICRO, config))
      return built[0](params, key).tokens

    first = jax.jit(run)(params, key)
    again = jax.jit(run)(params, key)  # a new trace of the cached function
    twice = jax.jit(lambda p, k: jax.vmap(run, in_axes=(None, 0))(p, k))(
        params, jax.random.split(key, 2))
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    np.testing.assert_array_equal(
        np.asarray(twice[0]),
        np.asarray(rollout.make_rollout(text_env, MICRO, config)(
            params, jax.random.split(key, 2)[0]).tokens))

  def _check_books(self, tree, chain, config):
    """Nodes, parents, depths, and each turn's tokens trained once, by its owner."""
    b, t_max = config.batch_size, config.max_turns
    n = config.tree.rows_per_tree()
    node = np.asarray(tree.tree_node)
    taken = np.arange(t_max)[None] < np.asarray(tree.num_turns)[:, None]
    np.testing.assert_array_equal(node >= 0, taken)
    owner = np.where(taken, node // t_max, -1)
    np.testing.assert_array_equal(np.where(taken, node % t_max, -1),
                                  np.where(taken, np.arange(t_max)[None], -1))
    self.assertTrue(np.all((owner // n == np.arange(b)[:, None] // n) | ~taken))  # own tree
    parent = np.asarray(tree.tree_parent)
    np.testing.assert_array_equal(parent[:, 1:], np.where(taken[:, 1:], node[:, :-1], -1))
    self.assertTrue(np.all(parent[:, 0] == -1))
    np.testing.assert_array_equal(np.asarray(tree.tree_depth),
                                  np.where(taken, np.arange(1, t_max + 1)[None], 0))
    # fork (0, 2) with K = 2: rows 0, 1 of a tree own turns 0-1, rows 2, 3 only turn 2.
    self.assertEqual(n, 4)
    slot, rows = np.arange(b) % n, np.arange(b)
    np.testing.assert_array_equal(owner[:, 1], owner[:, 0])
    np.testing.assert_array_equal(owner[slot < 2, 0], rows[slot < 2])
    # the two new rows of a tree copied the two nodes (random order)
    np.testing.assert_array_equal(np.sort(owner[slot >= 2, 0].reshape(-1, 2), axis=1),
                                  (rows[slot == 0][:, None] + np.arange(2)[None]))
    np.testing.assert_array_equal(owner[:, 2], np.where(taken[:, 2], rows, -1))
    # loss_mask: exactly the chain's mask on the turns the row owns.
    ids = np.asarray(chain.turn_ids)
    own = np.take_along_axis(owner, np.clip(ids, 0, t_max - 1), axis=1) == np.arange(b)[:, None]
    np.testing.assert_array_equal(np.asarray(tree.loss_mask),
                                  np.asarray(chain.loss_mask) & own & (ids >= 0))
    # Sampled tokens: each distinct node's reply once.
    per_node = {}
    for r in range(b):
      for t in range(t_max):
        if node[r, t] >= 0:
          per_node[node[r, t]] = int(np.asarray(tree.reply_lengths)[r, t])
    self.assertEqual(int(np.asarray(tree.loss_mask).sum()), sum(per_node.values()))
    self.assertLess(sum(per_node.values()), int(np.asarray(chain.loss_mask).sum()))
    np.testing.assert_array_equal(np.asarray(tree.row_valid), np.ones(b, bool))


class TreeMetricsTest(parameterized.TestCase):
  """Rows no fork copied a node into are no episodes: every metric leaves them out,
  and episode metrics weight each leaf by its path's probability.

  FrozenLake (slippery, random maps) under a policy that always answers
  ``Down || Right``: some roots fall in a hole or reach the goal at turn 0,
  before the fork at turn 1, so their children's rows stay empty.
  """

  @parameterized.named_parameters(("full", -1), ("history1", 1))
  def test_metrics_are_path_weighted_means_over_played_rows(self, history_turns):
    env, _ = envs_jax.make("FrozenLake-4x4-v0")
    text_env = rollout.TextEnv(env, TOK, rollout.PromptConfig.compact(
        think=False, max_actions_per_turn=2), verify_states=8)
    tree = rollout.TreeConfig(fork_turns=(1, 2), branches=2)
    config = rollout.RolloutConfig(
        num_groups=8, group_size=tree.group_size(), max_turns=4, max_tokens_per_turn=12,
        history_turns=history_turns, tree=tree)
    traj = jax.jit(rollout.make_rollout(text_env, MICRO, config))(
        bigram_params("<answer>Down || Right</answer>"), jax.random.key(0))
    t = jax.tree.map(np.asarray, traj)
    b, t_max, g = config.batch_size, config.max_turns, config.group_size
    # By hand: a row was played iff it holds a turn (its tree's first row
    # always does); the empty ones hold no token, no turn, no end.
    played = t.num_turns > 0
    self.assertTrue(played[::g].all())
    self.assertGreater(np.sum(~played), 4)
    np.testing.assert_array_equal(traj.played(), played)
    np.testing.assert_array_equal(t.end_reason[~played], rollout.END_REASONS.index("running"))
    m = {k: float(v) for k, v in traj.metrics().items()}
    by_hand = {"success": t.success, "score": t.scores, "turns": t.num_turns,
               "actions": t.num_actions, "overflow_frac": t.overflow}
    by_hand.update({f"end/{r}": t.end_reason == i for i, r in enumerate(rollout.END_REASONS)
                    if i})
    # Path weights by hand: a leaf's weight is the product, over its turns,
    # of 1 / the number of distinct nodes sampled from that turn's parent
    # (a tree's initial state for turn 0).
    children = {}
    for r in range(b):
      for u in range(t.num_turns[r]):
        p = int(t.tree_parent[r, u]) if u else ("root", r // traj.tree_size)
        children.setdefault(p, set()).add(int(t.tree_node[r, u]))
    w = np.zeros(b)
    for r in np.flatnonzero(played):
      parents = [int(t.tree_parent[r, u]) if u else ("root", r // traj.tree_size)
                 for u in range(t.num_turns[r])]
      w[r] = np.prod([1.0 / len(children[p]) for p in parents])
    np.testing.assert_allclose(w.reshape(-1, traj.tree_size).sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(traj.path_weights(), w, rtol=1e-6)
    self.assertGreater(len(set(np.round(w[played], 6))), 1)  # not a plain mean
    for k, x in by_hand.items():
      self.assertAlmostEqual(m[k], float(np.sum(w * x) / np.sum(w)), places=5, msg=k)
    self.assertGreater(m["success"], 0.0)  # the test can see a wrong denominator
    self.assertNotAlmostEqual(m["turns"], float(np.mean(t.num_turns[played])), places=3)
    stds = [np.std(s[v]) for s, v in zip(t.scores.reshape(-1, g), played.reshape(-1, g))]
    self.assertAlmostEqual(m["reward_std_in_group"], float(np.mean(stds)), places=6)
    # Turn statistics: each node (a turn sampled once, by its owner) once.
    nodes = {int(t.tree_node[r, u]) for r in range(b) for u in range(t.num_turns[r])}
    own = np.array([(n // t_max, n % t_max) for n in sorted(nodes)])  # (owner row, turn)
    np.testing.assert_array_equal(t.tree_node[own[:, 0], own[:, 1]], sorted(nodes))
    self.assertLess(len(nodes), int(np.sum(t.num_turns)))  # prefixes are shared
    np.testing.assert_array_equal(np.sum(traj.sampled_turns()), len(nodes))
    np.testing.assert_array_equal(np.asarray(traj.sampled_turns())[own[:, 0], own[:, 1]], True)
    self.assertAlmostEqual(m["reply_tokens"],
                           float(np.sum(t.reply_lengths[own[:, 0], own[:, 1]]) / len(nodes)),
                           places=5)
    self.assertAlmostEqual(m["reply_tokens"], float(np.sum(t.loss_mask) / len(nodes)), places=5)
    frac = lambda num, den: float(np.sum(num[own[:, 0], own[:, 1]])  # noqa: E731
                                  / np.sum(den[own[:, 0], own[:, 1]]))
    self.assertAlmostEqual(m["effective_action_frac"], frac(t.num_effective, t.num_executed),
                           places=6)
    # The StarPO-S filter ranks groups by their played episodes' spread.
    _, fm = train.compact_groups(traj, 2, losses.FilterConfig("top_k", 2))
    unbiased = [np.std(s[v], ddof=1) if v.sum() > 1 else 0.0
                for s, v in zip(t.scores.reshape(-1, g), played.reshape(-1, g))]
    self.assertAlmostEqual(float(fm["filter/reward_std_before"]), float(np.mean(unbiased)),
                           places=6)


_SAME = ("tokens", "loss_mask", "length", "turn_rewards", "scores", "num_turns", "end_reason",
         "reply_lengths", "row_valid", "tree_node", "tree_parent", "tree_depth")


class TreeShardedVmappedTest(parameterized.TestCase):
  """The tree rollout on a 2-device mesh (rows over ``data``) and vmapped over
  rollout keys equals the one-device, one-key program: one tree of 4 rows
  (forks at turns 0 and 1, K = 2, every node), 2 rows a device, so a fork
  copies rows across the devices."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.text_env = _text_env()
    cls.config = _config(tree=rollout.TreeConfig(fork_turns=(0, 1), branches=2), num_groups=1)
    cls.params = random_params(4)
    # In a dict: a function class attribute would bind as a method.
    cls.fns = {"one": rollout.make_rollout(cls.text_env, MICRO, cls.config)}

  def _assert_same(self, got, want):
    for f in _SAME:
      np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)),
                                    err_msg=f)
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), rtol=1e-5,
                               atol=1e-6)
    self.assertEqual(got.tree_size, want.tree_size)

  def test_mesh_equals_one_device(self):
    mesh = sharding.make_mesh("data:2", jax.devices()[:2])
    key = jax.random.key(7)
    got = sharding.shard_rollout(self.text_env, MICRO, self.config, mesh)(self.params, key)
    want = self.fns["one"](self.params, key)
    self.assertEqual(got.tokens.addressable_shards[0].data.shape[0], 2)  # rows split in two
    self._assert_same(got, want)
    # Rows 2, 3 (device 1) hold copies of turn 0, sampled by row 0 or 1 (device 0).
    owner0 = np.asarray(want.tree_node)[:, 0] // self.config.max_turns
    np.testing.assert_array_equal(np.sort(owner0), [0, 0, 1, 1])

  def test_vmap_over_keys_equals_each_key(self):
    keys = jax.random.split(jax.random.key(8), 2)
    fn = self.fns["one"]
    both = jax.vmap(fn, in_axes=(None, 0))(self.params, keys)
    for i in range(2):
      self._assert_same(jax.tree.map(lambda x, i=i: x[i], both), fn(self.params, keys[i]))
    self.assertFalse(np.array_equal(np.asarray(both.tokens[0]), np.asarray(both.tokens[1])))


class TreeConfigErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("no_fork_turn", dict(fork_turns=()), "fork_turns"),
      ("turn_out_of_range", dict(fork_turns=(3,)), "fork_turns"),
      ("turns_out_of_order", dict(fork_turns=(1, 1)), "fork_turns"),
      ("one_branch", dict(branches=1), "branches"),
      ("branches_per_turn", dict(fork_turns=(0, 1), branches=(2, 2, 2)), "branches"),
      ("expand_more_than_nodes", dict(fork_turns=(0, 1), branches=2, expand=(2, 1)), "expand"),
      ("bad_select", dict(select="best"), "select"),
      ("no_trees", dict(trees=0), "trees"))
  def test_bad_tree_names_field(self, kwargs, field):
    with self.assertRaisesRegex(jagent.FieldError, rf"RolloutConfig\.tree\.{field}=") as cm:
      rollout.RolloutConfig(num_groups=1, group_size=4, max_turns=3,
                            tree=rollout.TreeConfig(**kwargs))
    self.assertEqual((cm.exception.owner, cm.exception.field), ("RolloutConfig", f"tree.{field}"))

  def test_more_branches_than_the_batch_holds(self):
    with self.assertRaisesRegex(jagent.FieldError,
                                r"RolloutConfig\.group_size=4: .*group_size=6") as cm:
      rollout.RolloutConfig(num_groups=1, group_size=4, max_turns=3,
                            tree=rollout.TreeConfig(fork_turns=(1,), branches=3, trees=2))
    self.assertEqual(cm.exception.field, "group_size")

  def test_sizes(self):
    t = rollout.TreeConfig(fork_turns=(0, 1, 2), branches=(2, 3, 2), expand=(None, 1, 2), trees=2)
    # 1 -> 2 -> 2 + 1 * 2 = 4 -> 4 + 2 * 1 = 6 rows per tree
    self.assertEqual(t.rows_per_tree(), 6)
    self.assertEqual(t.group_size(), 12)
    self.assertEqual(t.plan(), ((0, 2, 1, 1), (1, 3, 1, 2), (2, 2, 2, 4)))


if __name__ == "__main__":
  absltest.main()
