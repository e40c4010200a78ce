"""Tests of group compaction (StarPO-S filter before the update) and evaluation."""

import functools

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import models
from jagent import train
from jagent import transforms
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
      group_ids=jnp.arange(b) // group_size,
      **_trajectory.Trajectory.one_row_per_episode(b), group_size=group_size)


class CompactTest(absltest.TestCase):

  def test_keeps_highest_std_groups_first(self):
    # 4 groups of 2: stds (unbiased) 0, 1/sqrt(2)*2, 0, 1/sqrt(2)*1.
    traj = fake_trajectory([1, 1, 0, 2, 5, 5, 0, 1], 2)
    out, m = _rl.compact_groups(traj, 2, losses.FilterConfig("top_fraction", 0.5))
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

  def test_a_non_finite_score_leaves_its_group_std(self):
    # Group 0 = [1, NaN]: one finite member, no spread (std 0, finite).
    traj = fake_trajectory([1, np.nan, 0, 2, 5, 5, 0, 1], 2)
    out, m = _rl.compact_groups(traj, 2, losses.FilterConfig("top_fraction", 0.5))
    np.testing.assert_array_equal(out.tokens[:, 0], [200, 300, 600, 700])
    std = np.array([0, np.std([0, 2], ddof=1), 0, np.std([0, 1], ddof=1)])
    np.testing.assert_allclose(m["filter/reward_std_before"], std.mean(), rtol=1e-6)
    self.assertEqual(float(m["filter/nonzero_std_frac"]), 0.5)

  def test_unkept_groups_fill_slots_with_zero_mask(self):
    # Only one group has variance; without zero-std groups the second slot trains nothing.
    traj = fake_trajectory([1, 1, 0, 2, 5, 5], 2)
    out, m = _rl.compact_groups(traj, 2, losses.FilterConfig("top_fraction", 0.7, False))
    np.testing.assert_array_equal(out.scores[:2], [0, 2])
    np.testing.assert_array_equal(np.asarray(out.loss_mask).any(axis=1), [True, True, False,
                                                                          False])
    self.assertEqual(float(m["filter/kept_groups"]), 1.0)
    self.assertAlmostEqual(float(m["filter/kept_ratio"]), 1 / 3, places=6)
    self.assertEqual(float(m["filter/any_kept"]), 1.0)
    self.assertAlmostEqual(float(m["filter/reward_std_after"]), 2 ** 0.5, places=6)

  def test_no_group_kept_has_no_kept_std(self):
    # Every group without variance and include_zero=False: nothing kept, every
    # slot masked, and the kept groups' mean std is not 0 but not measured.
    traj = fake_trajectory([1, 1, 0, 0, 5, 5], 2)
    out, m = _rl.compact_groups(traj, 2, losses.FilterConfig("top_fraction", 0.7, False))
    self.assertFalse(np.asarray(out.loss_mask).any())
    self.assertEqual(float(m["filter/kept_groups"]), 0.0)
    self.assertEqual(float(m["filter/reward_std_before"]), 0.0)
    self.assertTrue(np.isnan(float(m["filter/reward_std_after"])))
    self.assertEqual((float(m["filter/kept_ratio"]), float(m["filter/any_kept"])), (0.0, 0.0))

  def test_jit_and_errors(self):
    traj = fake_trajectory([1, 1, 0, 2], 2)
    f = jax.jit(_rl.compact_groups, static_argnums=1)
    out, _ = f(traj, 1)
    np.testing.assert_array_equal(out.scores, [0, 2])
    with self.assertRaisesRegex(ValueError, "num_keep"):
      _rl.compact_groups(traj, 3)
    self.assertEqual(_rl.num_kept_groups(8, losses.FilterConfig("top_fraction", 0.25)), 2)
    self.assertEqual(_rl.num_kept_groups(8, losses.FilterConfig("top_k", 3)), 3)
    with self.assertRaisesRegex(ValueError, "data-dependent"):
      _rl.num_kept_groups(8, losses.FilterConfig("top_p", 0.9))


class IterationFilterTest(absltest.TestCase):
  """One filter per iteration: the given one, else the objective's, else keep all."""

  def test_given_filter_replaces_the_objectives(self):
    fc = losses.FilterConfig
    obj = transforms.starpo_s()  # declares top_fraction 0.25
    self.assertEqual(_rl.iteration_filter(obj), fc("top_fraction", 0.25, True))
    # An explicit filter replaces the objective's (experiments' rl.filter_*).
    for given in (fc("top_k", 3, False), fc("top_p", 0.9, True), fc("min_p", 0.5, False)):
      self.assertEqual(_rl.iteration_filter(obj, given), given)
    with self.assertRaisesRegex(ValueError, "filter_config must be a jagent.losses.FilterConfig"):
      _rl.iteration_filter(obj, ("top_k", 3))

  def test_objective_without_filter_keeps_all(self):
    obj = transforms.grpo()
    self.assertEqual(_rl.iteration_filter(obj), losses.FilterConfig("top_fraction", 1.0, True))
    self.assertEqual(_rl.iteration_filter(obj, losses.FilterConfig("top_fraction", 0.5)).value,
                     0.5)

  def test_dapo_keeps_its_dynamic_sampling_under_a_given_filter(self):
    fc = losses.FilterConfig
    obj = transforms.dapo()
    self.assertEqual(_rl.iteration_filter(obj), fc("top_fraction", 1.0, False))
    self.assertEqual(_rl.iteration_filter(obj, fc("top_fraction", 0.5, True)),
                     fc("top_fraction", 0.5, False))
    self.assertEqual(_rl.iteration_filter(obj, fc("top_p", 0.9, True)), fc("top_p", 0.9, False))
    # Ranking then dropping the zero-std groups (DAPO's stage after the
    # compaction) keeps exactly what include_zero=False keeps, for every mode.
    scores = np.array([[0., 1., 1., 0.], [1., 1., 1., 1.], [0., 0., 0., 1.],
                       [0., 0., 0., 0.], [1., 0., 1., 0.]], np.float32)
    for mode, value in (("top_fraction", 0.8), ("top_k", 4), ("top_p", 0.7), ("min_p", 0.0)):
      then_drop = (np.asarray(losses.filter_groups(scores, mode, value, True).keep)
                   & (np.std(scores, axis=1) > 0))
      at_once = np.asarray(losses.filter_groups(scores, mode, value, False).keep)
      np.testing.assert_array_equal(then_drop, at_once, err_msg=mode)



# ------------------------------------------------------------ rl_iteration
CFG = models.ModelConfig(vocab_size=32, embed_dim=16, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, mlp_dim=32)
N, G, S = 4, 2, 8
OBJ = transforms.grpo(kl_coef=0.0)  # built once: static


def _train_config(lr=1e-2):
  return train.TrainConfig(model=CFG, actor_optimizer=train.OptimizerConfig(
      learning_rate=lr, weight_decay=0.0), num_minibatches=2)


def fake_rollout(params, key):
  """A pure stand-in for make_rollout: one turn of random tokens (the second
  half of each row sampled), 0/1 scores."""
  del params
  k_tok, k_score = jax.random.split(key)
  tokens = jax.random.randint(k_tok, (N * G, S), 1, CFG.vocab_size)
  scores = jax.random.bernoulli(k_score, 0.5, (N * G,)).astype(jnp.float32)
  mask = jnp.broadcast_to(jnp.arange(S)[None] >= S // 2, (N * G, S))
  return fake_trajectory(scores, G, s=S).replace(
      tokens=tokens, loss_mask=mask,
      token_rewards=jnp.zeros((N * G, S)).at[:, -1].set(scores))


def _iteration(config):
  return functools.partial(_rl.rl_iteration, rollout_fn=fake_rollout, objective=OBJ,
                           config=config, num_keep=2,
                           filter_config=losses.FilterConfig("top_fraction", 0.5, True))


class RlIterationTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.states = [train.init_train_state(models.init(CFG, jax.random.key(i)),
                                         jax.random.key(10 + i), config=_train_config(),
                                         objective=OBJ) for i in range(2)]
    cls.keys = [jax.random.key(20), jax.random.key(21)]
    cls.one = staticmethod(jax.jit(_iteration(_train_config())))

  def test_equals_rollout_compact_train_step(self):
    state, m = self.one(self.states[0], self.keys[0])
    traj = fake_rollout(self.states[0].params, self.keys[0])
    kept, fm = _rl.compact_groups(traj, 2, losses.FilterConfig("top_fraction", 0.5))
    want, tm = train.train_step(self.states[0], train.trajectory_batch(kept), objective=OBJ,
                                config=_train_config())
    for g, w in zip(jax.tree.leaves(state.params), jax.tree.leaves(want.params)):
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    self.assertFalse(np.array_equal(jax.tree.leaves(state.params)[0],
                                    jax.tree.leaves(self.states[0].params)[0]))
    self.assertEqual(int(state.step), 1)
    for k, v in m.items():
      self.assertEqual((v.shape, v.dtype), ((), jnp.float32), k)
    for k, v in {**fm, **tm}.items():
      np.testing.assert_allclose(m[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    for k, v in traj.metrics().items():
      np.testing.assert_allclose(m[f"rollout/{k}"], v, rtol=1e-6, err_msg=k)
    self.assertEqual(float(m["rollout/sampled_tokens"]), N * G * S // 2)
    self.assertEqual(float(m["rollout/env_turns"]), N * G)  # one turn each
    self.assertEqual(float(m["train/context_tokens"]), 2 * G * S)
    for k in ("rollout/success", "filter/reward_std_before", "actor/entropy",
              "train/grad_norm", "rollout/format_valid_frac"):
      self.assertIn(k, m)

  def test_diagnostics_see_the_sampling_policy_and_change_nothing_else(self):
    def hook(state, traj, key):
      return {**train.collapse_metrics(state.params, traj, key, config=CFG, num_rows=4),
              "diag/params": sum(jnp.sum(x) for x in jax.tree.leaves(state.params)),
              "diag/score": jnp.sum(traj.scores), "diag/rows": jnp.float32(traj.scores.size),
              "diag/key": jax.random.uniform(key)}

    state, m = jax.jit(functools.partial(_iteration(_train_config()), diagnostics=hook))(
        self.states[0], self.keys[0])
    want_state, want = self.one(self.states[0], self.keys[0])
    # The same update and metrics, bit for bit, plus the hook's.
    for g, w in zip(jax.tree.leaves(state), jax.tree.leaves(want_state)):
      if jax.dtypes.issubdtype(w.dtype, jax.dtypes.prng_key):
        g, w = jax.random.key_data(g), jax.random.key_data(w)
      np.testing.assert_array_equal(g, w)
    self.assertEqual({k: float(v) for k, v in m.items() if k in want},
                     {k: float(v) for k, v in want.items()})
    # The input state's params (before the update), the whole rollout (not
    # the kept groups) and a key other than the rollout's.
    before = sum(float(jnp.sum(x)) for x in jax.tree.leaves(self.states[0].params))
    self.assertAlmostEqual(float(m["diag/params"]), before, places=3)
    traj = fake_rollout(self.states[0].params, self.keys[0])
    self.assertEqual(float(m["diag/score"]), float(jnp.sum(traj.scores)))
    self.assertEqual(float(m["diag/rows"]), N * G)
    self.assertNotEqual(float(m["diag/key"]), float(jax.random.uniform(self.keys[0])))
    self.assertEqual(float(m["collapse/replies"]), 4.0)
    self.assertTrue(np.isfinite(float(m["collapse/mutual_info"])))

  def test_vmap_over_runs_and_learning_rates_equals_separate_runs(self):
    # Two runs (state, key, learning rate) in one vmapped program; the
    # learning rate is a traced value there and a Python float in the
    # separate runs. Tolerance: the vmapped matmuls round differently (~1e-7)
    # and Adam's first updates amplify that on near-zero gradients; the two
    # learning rates move the params ~1e-2 apart.
    lrs = (1e-2, 3e-3)

    def run(state, key, lr):
      return _iteration(_train_config(lr))(state, key)

    states = jax.tree.map(lambda *x: jnp.stack(x), *self.states)
    got, gm = jax.jit(jax.vmap(run))(states, jnp.stack(self.keys),
                                     jnp.asarray(lrs, jnp.float32))
    separate = (self.one, jax.jit(_iteration(_train_config(lrs[1]))))
    for i, lr in enumerate(lrs):
      want, wm = separate[i](self.states[i], self.keys[i])
      for g, w in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params)):
        np.testing.assert_allclose(g[i], w, rtol=1e-5, atol=1e-6)
      for k, v in wm.items():
        np.testing.assert_allclose(gm[k][i], v, rtol=1e-4, atol=1e-6, err_msg=k)
      np.testing.assert_allclose(gm["train/lr"][i], lr, rtol=1e-7)
    moved = [np.max(np.abs(np.asarray(g[1] - g[0]))) for g in jax.tree.leaves(got.params)]
    self.assertGreater(max(moved), 1e-3)

  def test_a_step_that_keeps_nothing_reports_the_iteration_filter(self):
    # StarPO-S's own filter stage, rebuilt to keep the compacted rows, would
    # report kept_ratio 1 and any_kept 1 there; the iteration reports its
    # compaction's: nothing kept, nothing trained, update metrics NaN.
    def flat_rollout(params, key):
      return fake_rollout(params, key).replace(scores=jnp.ones((N * G,), jnp.float32))

    obj = transforms.starpo_s(advantage="grpo", kl_coef=0.0)
    state = train.init_train_state(models.init(CFG, jax.random.key(0)), jax.random.key(1),
                                   config=_train_config(), objective=obj)
    new, m = jax.jit(functools.partial(
        _rl.rl_iteration, rollout_fn=flat_rollout, objective=obj, config=_train_config(),
        num_keep=1, filter_config=losses.FilterConfig("top_fraction", 0.25, False)))(
            state, self.keys[0])
    self.assertEqual((float(m["filter/kept_ratio"]), float(m["filter/any_kept"]),
                      float(m["filter/kept_groups"])), (0.0, 0.0, 0.0))
    self.assertNotIn("filter/kept_reward_std", m)
    self.assertNotIn("filter/reward_std", m)
    self.assertEqual(float(m["train/updates_applied"]), 0.0)
    self.assertTrue(np.isnan(float(m["actor/entropy"])))
    for g, w in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
      np.testing.assert_array_equal(g, w)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "mode"):
      jax.eval_shape(functools.partial(_iteration(_train_config()),
                                       filter_config=losses.FilterConfig("top_half")),
                     self.states[0], self.keys[0])
    with self.assertRaisesRegex(ValueError, "filter_config must be a jagent.losses.FilterConfig"):
      jax.eval_shape(functools.partial(_iteration(_train_config()),
                                       filter_config=("top_fraction", 0.5)),
                     self.states[0], self.keys[0])
    with self.assertRaisesRegex(ValueError, "num_keep"):
      jax.eval_shape(functools.partial(_iteration(_train_config()), num_keep=N + 1),
                     self.states[0], self.keys[0])


if __name__ == "__main__":
  absltest.main()
