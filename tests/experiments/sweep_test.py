"""Tests of ``experiments.sweep``: many runs of one config in one program per stage.

The evidence: a sweep of 4 seeds equals 4 separate runs (the stages of
``experiments.train`` through :class:`experiments.common.Experiment`: its
SFT loop, ``rl_step`` and ``evaluate``), and a sweep of 2 learning rates
equals 2 separate runs. With ``batching="map"`` they are equal bit for bit;
with ``batching="vmap"`` (parallel runs) the batched matmuls round
differently, so one update of each stage is compared to float tolerance and
the evaluation's success figures exactly.
"""

import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from experiments import common
from experiments import sweep
from experiments.configs import tiny
from jagent import train
from jagent import transforms

_SEEDS = 4
_RL_LR, _OTHER_LR = 2e-3, 5e-3


def _config():
  """A tiny Bandit run (the shape of train_test's, smaller)."""
  c = tiny.get_config("Bandit-v0,starpo_s")
  c.model = "nano"
  c.seed = 0
  c.rollout.update(dict(num_groups=4, group_size=4, max_tokens_per_turn=12, temperature=1.0))
  # A few SFT steps: too few to teach the format (S = 360 tokens a row makes
  # each step cost ~0.1 s here), so every reply scores the format penalty and
  # advantages are 0; the entropy bonus still moves the policy in RL.
  c.algorithm_kwargs.entropy_coef = 0.01
  c.sft.update(dict(expert="random", num_demos=8, steps=8, batch_size=4, learning_rate=3e-2,
                    warmup_steps=2))
  c.rl.update(dict(steps=2, learning_rate=_RL_LR, warmup_steps=0, decay="constant",
                   filter_mode="top_fraction", filter_value=0.5, include_zero=True,
                   num_minibatches=1, ppo_epochs=1))
  c.eval.update(dict(num_levels=8, num_groups=8, every=0, temperature=0.5, greedy=True,
                     samples=1))
  return c


class _NoWriter:

  def write(self, step, record):
    del step, record


def _separate_run(config):
  """The run of ``config`` through the non-vmapped path (experiments.train's stages)."""
  exp = common.Experiment(config)
  params = exp.sft(_NoWriter(), progress=False)
  sft_params = params
  figures = {}
  for stage in ("sft", "rl"):
    if stage == "rl":
      state = exp.rl_state(params)
      for step in range(config.rl.steps):
        state, m = exp.rl_step(state, step)
      params = state.params
      figures["rl_train_success"] = m["rollout/success"]
    figures[stage] = {
        **{k: exp.evaluate(params)[k] for k in sweep.EVAL_KEYS},
        **{f"greedy_{k}": exp.evaluate(params, greedy=True)[k] for k in sweep.EVAL_KEYS}}
  return figures, sft_params, params


def _assert_figures_equal(test, got, want):
  """Success exactly (a share of levels); the other means to float32 rounding."""
  test.assertEqual(sorted(got), sorted(want))
  for k, v in want.items():
    if k.endswith("success"):
      test.assertEqual(got[k], v, k)
    else:
      test.assertAlmostEqual(got[k], v, places=6, msg=k)


def _assert_params_close(got, want, **tol):
  for (path, g), w in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), err_msg=jax.tree_util.keystr(path),
                               **tol)


class SweepTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix="sweep_test_")
    cls.summary = sweep.sweep(_config(), cls.root, seeds=_SEEDS, batching="map")
    cls.separate = []
    for i in range(_SEEDS):
      c = _config()
      c.seed = i
      cls.separate.append(_separate_run(c))

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_seed_sweep_equals_separate_runs(self):
    runs = self.summary["runs"]
    self.assertEqual([r["seed"] for r in runs], list(range(_SEEDS)))
    for i, (figures, _, params) in enumerate(self.separate):
      with self.subTest(seed=i):
        _assert_params_close(jax.tree.map(lambda x, i=i: x[i], self.summary["params"]),
                             params, rtol=1e-5, atol=0)
        for stage in ("sft", "rl"):
          _assert_figures_equal(self, runs[i][stage], figures[stage])
        self.assertEqual(runs[i]["rl_train_success"], figures["rl_train_success"])
    # Not all runs alike: the seeds matter.
    leaves = jax.tree.leaves(self.summary["params"])
    self.assertFalse(np.array_equal(leaves[0][0], leaves[0][1]))

  def test_summary_json_and_table(self):
    with open(os.path.join(self.root, "sweep_summary.json")) as f:
      written = json.load(f)
    self.assertEqual(written, {k: v for k, v in self.summary.items() if k != "params"})
    self.assertEqual((written["env"], written["algorithm"], written["field"],
                      written["batching"]), ("Bandit-v0", "starpo_s", None, "map"))
    (group,) = written["groups"]
    self.assertEqual(group["seeds"], list(range(_SEEDS)))
    for stage in ("sft", "rl"):
      for k in ("success", "greedy_success"):
        xs = [r[stage][k] for r in written["runs"]]
        self.assertAlmostEqual(group[stage][k]["mean"], np.mean(xs), places=12)
        self.assertAlmostEqual(group[stage][k]["std"], np.std(xs, ddof=1), places=12)
    text = sweep.table(written)
    self.assertLen(text.splitlines(), 2 + _SEEDS + 1)
    self.assertIn("RL greedy", text)
    self.assertIn(f"{group['rl']['success']['mean']:.3f} ± {group['rl']['success']['std']:.3f}",
                  text)

  def test_learning_rate_sweep_equals_separate_runs(self):
    got = sweep.sweep(_config(), None, sweep_spec=f"rl.learning_rate={_RL_LR},{_OTHER_LR}",
                      batching="map")
    self.assertEqual(got["field"], "rl.learning_rate")
    self.assertEqual([(r["seed"], r["value"]) for r in got["runs"]],
                     [(0, _RL_LR), (0, _OTHER_LR)])
    other = _config()
    other.rl.learning_rate = _OTHER_LR
    for i, (figures, _, params) in enumerate([self.separate[0], _separate_run(other)]):
      with self.subTest(run=i):
        _assert_params_close(jax.tree.map(lambda x, i=i: x[i], got["params"]), params,
                             rtol=1e-5, atol=0)
        for stage in ("sft", "rl"):
          _assert_figures_equal(self, got["runs"][i][stage], figures[stage])
    # Same SFT, then the two learning rates part.
    leaves = jax.tree.leaves(got["params"])
    self.assertGreater(max(float(jnp.max(jnp.abs(x[0] - x[1]))) for x in leaves), 1e-4)
    self.assertEqual([g["value"] for g in got["groups"]], [_RL_LR, _OTHER_LR])

  def test_vmapped_stages_equal_separate_runs_to_rounding(self):
    # One update of each stage and the evaluation, vmapped over the 4 runs.
    exps = [common.Experiment(c) for _, _, c in sweep.run_configs(_config(), _SEEDS)[1]]
    exp = exps[0]
    zeros = jnp.zeros((_SEEDS,), jnp.float32)
    # SFT: the first update from the initial params.
    batches = [e.demonstrations().to_batch() for e in exps]
    states = [e.sft_state(e.init_params()) for e in exps]
    idx = [e.sft_batch_indices(b.tokens.shape[0])[:1] for e, b in zip(exps, batches)]
    got, _ = sweep.sft_program(exp, None, "vmap")(
        sweep.stack_runs(states), jnp.stack([b.tokens for b in batches]),
        jnp.stack([b.loss_mask for b in batches]), jnp.asarray(np.stack(idx)), zeros)
    for i, (state, b, ix) in enumerate(zip(states, batches, idx)):
      mb = transforms.Batch(tokens=b.tokens[ix[0]], loss_mask=b.loss_mask[ix[0]])
      want, _ = train.sft_step(state, mb, config=exp.sft_train_config())
      # Adam's first update is lr * g / (|g| + eps): ~lr per entry, and
      # rounding moves it on entries with |g| ~ eps (lr = 1.5e-2 here).
      _assert_params_close(jax.tree.map(lambda x, i=i: x[i], got), want.params,
                           rtol=1e-5, atol=1e-4)
    # RL: the first iteration from the SFT params of the separate runs.
    states = [e.rl_state(sft) for e, (_, sft, _) in zip(exps, self.separate)]
    keys = jnp.stack([jnp.stack([e.rl_key(0)]) for e in exps])
    got, metrics = sweep.rl_program(exp, None, "vmap")(sweep.stack_runs(states), keys, zeros)
    for i, (e, state) in enumerate(zip(exps, states)):
      want, m = e.rl_step(state, 0)
      _assert_params_close(jax.tree.map(lambda x, i=i: x[i], got.params), want.params,
                           rtol=1e-5, atol=1e-5)
      self.assertEqual(float(metrics["rollout/success"][i, 0]), m["rollout/success"])
    # Evaluation of the final params (at the temperature): the same figures.
    chunks = exp.eval_keys.reshape(-1, exp.config.eval.num_groups)
    figures = sweep.eval_program(exp, False, "vmap")(
        self.summary["params"], jnp.stack([e.eval_key() for e in exps]), chunks)
    for i, run in enumerate(self.summary["runs"]):
      self.assertEqual(float(figures["success"][i]), run["rl"]["success"], i)
      self.assertAlmostEqual(float(figures["score"][i]), run["rl"]["score"], places=5, msg=i)

  def test_bad_specs_fail_before_anything_compiles(self):
    cases = [
        ("rl.learning_rate", "no value", "expected <field>="),
        ("rl.learning_rat=1e-3", "missing field", "has no field 'rl.learning_rat'"),
        ("rollout.num_groups=4,8", "static field", "cannot be vmapped"),
        ("rl.learning_rate=1e-3,fast", "not a float", "'fast' is not a float"),
        ("rl.learning_rate=1e-3,-1e-3", "not positive", "positive finite"),
    ]
    # Raised while listing the runs: no Experiment is built, nothing compiles.
    with mock.patch.object(common, "Experiment", side_effect=AssertionError("built")):
      for spec, name, message in cases:
        with self.subTest(name):
          with self.assertRaisesRegex(ValueError, message) as cm:
            sweep.sweep(_config(), None, sweep_spec=spec)
          self.assertIn(f"--sweep={spec!r}", str(cm.exception))
      with self.assertRaisesRegex(ValueError, "--seeds=0"):
        sweep.sweep(_config(), None, seeds=0)
      with self.assertRaisesRegex(ValueError, "--batching='pmap'"):
        sweep.sweep(_config(), None, batching="pmap")
      bad = _config()
      bad.rollout.group_size = 0
      with self.assertRaisesRegex(ValueError, r"config\.rollout\.group_size="):
        sweep.sweep(bad, None, seeds=2)


if __name__ == "__main__":
  absltest.main()
