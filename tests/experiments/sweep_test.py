"""Tests of ``experiments.sweep``: many runs of one config in one program per stage.

The evidence: a sweep of 2 seeds equals 2 separate runs (the stages of
``experiments.train`` through :class:`experiments.experiment.Experiment`: its
SFT loop, ``rl_step`` and ``evaluate``), bit for bit with
``batching="map"``. The vmapped RL iteration with traced learning rates
equals separate runs in tests/jagent/train/rl_test.py (with ``vmap`` the
batched matmuls round differently, so to float tolerance).
"""

import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import numpy as np
import pytest

from experiments import experiment
from experiments import fields
from experiments import sweep
from experiments.configs import tiny
from tests import testenv

# Two seeds test the batching; each further seed adds a separate run (~7 s on
# 2 cores after the first, which compiles) and a run inside the sweep.
_SEEDS = 2
_RL_LR = 2e-3


def _config():
  """A tiny Bandit run (the shape of train_test's, smaller)."""
  c = tiny.get_config("Bandit-v0,starpo_s")
  c.model = "nano"
  c.seed = 0
  # One row per turn (the tiny default, pinned so that the sweep of turn rows
  # stays covered): with Bandit's one turn a row is the episode's whole
  # context (measured: a history_turns=-1 sweep gave the same runs bit for bit).
  c.rollout.update(dict(num_groups=4, group_size=4, max_tokens_per_turn=12, temperature=1.0,
                        history_turns=0))
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
  return testenv.without_extras(c)


class _NoWriter:

  def write(self, step, record):
    del step, record


def _separate_run(config):
  """The run of ``config`` through the non-vmapped path (experiments.train's stages)."""
  exp = experiment.Experiment(config)
  params = exp.sft(_NoWriter(), progress=False)
  sft_params = params
  figures = {}
  for stage in ("sft", "rl"):
    if stage == "rl":
      state = exp.rl_state(params)
      curves = {k: [] for k in sweep.CURVE_KEYS}
      for step in range(config.rl.steps):
        state, m = exp.rl_step(state, step)
        for k in curves:
          curves[k].append(float(m[k]))
      params = state.params
      figures["rl_train_success"] = m["rollout/success"]
      figures["curves"] = curves
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


@pytest.mark.heavy
class SweepTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix="sweep_test_")
    cls.sft_dir = os.path.join(cls.root, "sft")
    cls.summary = sweep.sweep(_config(), cls.root, seeds=_SEEDS, batching="map",
                              sft_dir=cls.sft_dir)
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
        np.testing.assert_allclose(
            [runs[i]["curves"][k] for k in sweep.CURVE_KEYS],
            [figures["curves"][k] for k in sweep.CURVE_KEYS], rtol=1e-5, atol=1e-6)
    # Not all runs alike: the seeds matter.
    leaves = jax.tree.leaves(self.summary["params"])
    self.assertFalse(np.array_equal(leaves[0][0], leaves[0][1]))
    # One test method, so that pytest-xdist runs the class's setup once.
    self.check_summary_json_and_table()
    self.check_rl_from_given_sft_params()

  def check_rl_from_given_sft_params(self):
    # experiments.compare's algorithms share one SFT stage: RL from the SFT
    # parameters that the sweep above wrote to its sft_dir is the sweep's own
    # RL (no SFT step runs: the SFT program is never called). The sweep above
    # ran RL one step a call (eval.every = 0: a tenth of 2 steps); this one
    # both steps in one call: the same runs, bit for bit.
    self.assertEqual(sweep.chunk_steps(_config()), 1)
    with mock.patch.object(sweep, "sft_program", side_effect=AssertionError("SFT ran")):
      again = sweep.sweep(_config(), None, seeds=_SEEDS, batching="map", sft_dir=self.sft_dir,
                          chunk=2)
      # SFT fields other than the recorded ones: refused before anything runs.
      other = _config()
      other.sft.steps += 1
      with self.assertRaisesRegex(fields.ConfigError, "run 0: sft.steps is 9, the recorded"):
        sweep.sweep(other, None, seeds=_SEEDS, sft_dir=self.sft_dir)
    _assert_params_close(again["sft_params"], self.summary["sft_params"], rtol=0, atol=0)
    _assert_params_close(again["params"], self.summary["params"], rtol=0, atol=0)
    self.assertEqual(json.dumps(again["runs"]), json.dumps(self.summary["runs"]))  # NaN too
    with self.assertRaisesRegex(ValueError, r"sft_params: leading axes \[1\], expected 2"):
      sweep.sweep(_config(), None, seeds=_SEEDS, sft_params=jax.tree.map(
          lambda x: x[:1], self.summary["sft_params"]))

  def check_summary_json_and_table(self):
    with open(os.path.join(self.root, "sweep_summary.json")) as f:
      written = json.load(f)
    self.assertEqual(written, {k: v for k, v in self.summary.items()
                               if k not in ("params", "sft_params", "frozen")})
    self.assertEqual((self.summary["frozen"], written["shared_base"]), ([], False))  # no LoRA
    self.assertEqual((written["env"], written["algorithm"], written["field"],
                      written["batching"]), ("Bandit-v0", "starpo_s", None, "map"))
    (group,) = written["groups"]
    self.assertEqual(group["seeds"], list(range(_SEEDS)))
    for stage in ("sft", "rl"):
      for k in ("success", "greedy_success"):
        xs = [r[stage][k] for r in written["runs"]]
        self.assertAlmostEqual(group[stage][k]["mean"], np.mean(xs), places=12)
        self.assertAlmostEqual(group[stage][k]["std"], np.std(xs, ddof=1), places=12)
    # Every step trained (include_zero keeps every group).
    self.assertEqual([r["skipped_steps"] for r in written["runs"]], [0] * _SEEDS)
    text = sweep.table(written)
    self.assertLen(text.splitlines(), 2 + _SEEDS + 1)
    self.assertTrue(text.splitlines()[2].endswith(" | 0 |"), text)
    self.assertIn("RL greedy", text)
    self.assertIn(f"{group['rl']['success']['mean']:.3f} ± {group['rl']['success']['std']:.3f}",
                  text)



class ProgressTest(absltest.TestCase):
  """The per-chunk lines and the empty-step warnings (no runs needed)."""

  def test_chunk_line_and_a_warning_once_per_streak(self):
    # Run 0 trains every step; run 1 trains nothing from the chunk's step 6 on.
    applied = np.array([[1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
    metrics = {"train/updates_applied": applied,
               "rollout/score": np.array([[0.1, 0.2, 0.3, 0.4], [-0.1, -0.1, -0.1, -0.1]]),
               "rollout/success": np.array([[0.0, 0.5, 0.5, 1.0], [0.0, 0.0, 0.0, 0.0]]),
               "rollout/format_valid_frac": np.array([[1.0] * 4, [0.5, 0.0, 0.0, 0.0]]),
               "filter/reward_std_before": np.array([[0.3] * 4, [0.2, 0.0, 0.0, 0.0]])}
    streaks = [0, 1]  # run 1's step 4 trained nothing, step 5 ends that streak
    lines = sweep.chunk_lines(4, 8, 12, 3.25, metrics, streaks, [7, 8], warn_after=3)
    self.assertEqual(lines, [
        "sweep RL steps 5-8 of 12 (3.2 s): reward per run 0.25 -0.10; training success per "
        "run 0.50 0.00",
        "warning: run 1 (seed 8) trained nothing for 3 RL steps in a row (steps 6-8: the filter "
        "kept no group; format-valid 0.00, in-group reward std 0.00 over this chunk's part of "
        "them)"])
    self.assertEqual(streaks, [0, 3])
    # The streak goes on: no second warning; a step that trains ends it.
    metrics["train/updates_applied"] = np.array([[1, 1, 1, 1], [0, 1, 1, 1]], np.float32)
    lines = sweep.chunk_lines(8, 12, 12, 1.0, metrics, streaks, [7, 8], warn_after=3)
    self.assertLen(lines, 1)
    self.assertEqual(streaks, [0, 0])

  def test_a_sweep_that_trained_nothing_says_so(self):
    run = {"seed": 0, "value": None, "sft": {"success": 0.25}, "rl": {"success": 0.25},
           "skipped_steps": 5}
    summary = {"field": None, "rl_steps": 5, "runs": [run, {**run, "seed": 1}],
               "groups": [{"value": None, "seeds": [0, 1],
                           "sft": {"success": {"mean": 0.25, "std": 0.0}},
                           "rl": {"success": {"mean": 0.25, "std": 0.0}}}]}
    text = sweep.table(summary)
    self.assertEqual(text.splitlines()[0],
                     "| run | seed | SFT success | RL success | train/skipped_steps |")
    self.assertEqual(text.splitlines()[2], "| 0 | 0 | 0.250 | 0.250 | 5 |")
    self.assertEqual(text.splitlines()[-1],
                     "Every one of the 5 RL steps of every run trained nothing (the filter kept "
                     "no group: no valid reply format, or zero in-group reward std): the RL "
                     "figures are the SFT policy's, not RL's.")
    summary["runs"][1]["skipped_steps"] = 4  # one step of one run trained
    self.assertNotIn("trained nothing", sweep.table(summary))


class SweepSpecTest(absltest.TestCase):
  """Bad specs (no runs needed: nothing may compile)."""

  def test_bad_specs_fail_before_anything_compiles(self):
    cases = [
        ("rl.learning_rate", "no value", "expected <field>="),
        ("rl.learning_rat=1e-3", "missing field",
         r"has no field config\.rl\.learning_rat; closest: config\.rl\.learning_rate, "),
        ("rollout.num_groups=4,8", "static field", "cannot be vmapped"),
        ("rl.learning_rate=1e-3,fast", "not a float", "'fast' is not a float"),
        ("rl.learning_rate=1e-3,-1e-3", "not positive", "positive finite"),
    ]
    # Raised while listing the runs: no Experiment is built, nothing compiles.
    with mock.patch.object(experiment, "Experiment", side_effect=AssertionError("built")):
      for spec, name, message in cases:
        with self.subTest(name):
          with self.assertRaisesRegex(ValueError, message) as cm:
            sweep.sweep(_config(), None, sweep_spec=spec)
          self.assertIn(f"--sweep={spec!r}", str(cm.exception))
      with self.assertRaisesRegex(ValueError, "--seeds=0"):
        sweep.sweep(_config(), None, seeds=0)
      with self.assertRaisesRegex(ValueError, "--batching='pmap'"):
        sweep.sweep(_config(), None, batching="pmap")
      meshed = _config()
      meshed.mesh = "data:2"
      with self.assertRaisesRegex(ValueError, r"config\.mesh='data:2'"):
        sweep.sweep(meshed, None, seeds=2)
      stopping = _config()
      stopping.rl.empty_stop_steps = 5
      with self.assertRaisesRegex(ValueError, r"config\.rl\.empty_stop_steps=5: a sweep"):
        sweep.sweep(stopping, None, seeds=2)
      bad = _config()
      bad.rollout.group_size = 0
      with self.assertRaisesRegex(ValueError, r"config\.rollout\.group_size="):
        sweep.sweep(bad, None, seeds=2)


if __name__ == "__main__":
  absltest.main()
