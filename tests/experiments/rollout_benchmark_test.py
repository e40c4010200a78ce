"""Smoke test of ``python -m experiments.benchmarks.rollout`` (no timing asserts).

Runs the benchmark as a subprocess with tiny settings (the nano model, batch
2 x 2, 2 turns, 8 tokens per reply, 1 repeat, the full history and
``history_turns=0``, each with its RL step, and a tree row forking at turn 1
into 3) and checks its table, ratios, summary and JSON line; the tree row's
counts against the same tree rollout replayed here and counted node by node.
A subprocess, because the benchmark's absl flags (``--model``,
``--repeats``, ...) share names with other benchmarks' flags and cannot be
defined twice in one test process. Speed itself is measured
only by the benchmark.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest
import jax
import numpy as np

import envs_jax
from jagent import models
from jagent import rollout
from jagent import tokenizers
from tests import testenv

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ROWS = ("on-device (make_rollout)", "host re-encode (RAGEN)", "host incremental KV")
_HISTORY_ROW = "on-device, history_turns=0"
_TREE_ROW = "on-device tree (K 3)"


def tree_counts(group_size):
  """The benchmark's tree row replayed here, counted node by node.

  Same model (nano, seed 0), prompt, tokenizer, key (seed + 1) and shape:
  2 groups, forks at turn 1 into 3, 2 turns, 8 tokens a reply. Each node
  (``tree_node``, a turn sampled once, by its owner row ``node // T``)
  counts its reply length once, independently of ``loss_mask``.

  Returns:
    ``(sampled tokens, env turns, finished trajectories)``.
  """
  env, env_params = envs_jax.make("Sokoban-6x6-1box-v0")
  tok = tokenizers.load_tiny_tokenizer()
  text_env = rollout.TextEnv(env, tok, rollout.PromptConfig.compact(), env_params=env_params,
                             verify_states=8)
  config = rollout.RolloutConfig(
      num_groups=2, group_size=group_size, max_turns=2, max_tokens_per_turn=8,
      temperature=1.0, tree=rollout.TreeConfig(fork_turns=(1,), branches=3, trees=1))
  cfg = models.get_config("nano")
  traj = rollout.make_rollout(text_env, cfg, config, env_params)(
      models.init(cfg, jax.random.key(0)), jax.random.key(1))
  node, turns = np.asarray(traj.tree_node), np.asarray(traj.num_turns)
  nodes = {int(node[b, t]) for b in range(node.shape[0]) for t in range(turns[b])}
  reply = np.asarray(traj.reply_lengths)
  tokens = sum(int(reply[n // 2, n % 2]) for n in nodes)
  finished = int(np.sum((turns > 0) & (np.asarray(traj.end_reason) > 0)))
  return tokens, len(nodes), finished


def run_benchmark(*args: str) -> subprocess.CompletedProcess:
  # One CPU device, as the benchmark runs.
  env = testenv.subprocess_env(1)
  return subprocess.run([sys.executable, "-m", "experiments.benchmarks.rollout", *args],
                        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=900,
                        check=False)


class RolloutBenchmarkTest(absltest.TestCase):

  def test_tiny_run_prints_rows_ratios_and_json(self):
    proc = run_benchmark("--model=nano", "--num_groups=2", "--group_size=2", "--max_turns=2",
                         "--max_tokens_per_turn=8", "--repeats=1", "--verify_states=8",
                         "--nosampler_only", "--history_turns=0", "--tree_fork_turns=1",
                         "--tree_branches=3")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    out = proc.stdout
    for name in _ROWS + (_HISTORY_ROW,):
      self.assertIn(name, out)
    self.assertNotIn("sampler only", out)
    self.assertIn("RL step s", out)
    self.assertIn("experiments/configs/tiny.py:Sokoban-6x6-1box-v0,starpo_s", out)
    self.assertIn("RAGEN-style, the baseline", out)
    self.assertRegex(out, r"SUMMARY: on-device rollout is [0-9.]+x \(env turns/s\) and "
                          r"[0-9.]+x \(tokens/s\) the RAGEN-style host loop; goal >= 3x: "
                          r"(met|NOT met)")
    res = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    self.assertEqual((res["batch"], res["max_turns"], res["max_tokens_per_turn"]), (4, 2, 8))
    self.assertEqual([r["name"] for r in res["rows"]], list(_ROWS) + [_HISTORY_ROW, _TREE_ROW])
    for r in res["rows"][:-1]:
      # Random replies are never valid, so every episode plays both turns.
      self.assertEqual(r["env_turns"], 4 * 2, r)
      self.assertBetween(r["tokens"], 1, 4 * 2 * 8)
      self.assertAlmostEqual(r["mean_reply"], r["tokens"] / r["env_turns"])
      for k in ("seconds", "warmup_seconds", "turns_per_s", "tokens_per_s", "peak_rss_mb"):
        self.assertGreater(r[k], 0.0, (r["name"], k))
      self.assertAlmostEqual(r["turns_per_s"] * r["seconds"], r["env_turns"], places=6)
      self.assertEqual(r["all_seconds"], [r["seconds"]])  # one round, one call
    # Same key and sampler: both host loops sample the on-device rollout's tokens.
    self.assertEqual(len({r["tokens"] for r in res["rows"] if r["name"] in _ROWS}), 1)
    # The RL steps (the main job's config at these sizes: StarPO-S keeps 1 of
    # the 2 groups) on the two on-device rows, and their ratios.
    self.assertEqual((res["rl_step"]["batch"], res["rl_step"]["kept_groups"]), (4, 1))
    rows = {r["name"]: r for r in res["rows"]}
    full, windowed = rows[_ROWS[0]], rows[_HISTORY_ROW]
    self.assertEqual((full["history_turns"], windowed["history_turns"]), (-1, 0))
    for r in (full, windowed):
      self.assertGreater(r["rl_step_seconds"], 0.0)
      self.assertEqual(r["rl_step_all_seconds"], [r["rl_step_seconds"]])
    for r in res["rows"][1:3] + res["rows"][4:]:
      self.assertNotIn("rl_step_seconds", r)  # the host loops and the tree have none
    self._check_tree(res, rows[_ROWS[0]], rows[_TREE_ROW], out)
    vs = windowed["vs_full_history"]
    self.assertAlmostEqual(vs["turns_per_s"], windowed["turns_per_s"] / full["turns_per_s"])
    self.assertAlmostEqual(vs["tokens_per_s"], windowed["tokens_per_s"] / full["tokens_per_s"])
    self.assertAlmostEqual(vs["rl_step_seconds"],
                           windowed["rl_step_seconds"] / full["rl_step_seconds"])
    self.assertEqual(res["history_context_sizes"], {"0": res["first_width"] + 8})
    q = res["ratios"]
    rates = {r["name"]: r["turns_per_s"] for r in res["rows"]}
    self.assertAlmostEqual(q["turns_vs_ragen"],
                           rates[_ROWS[0]] / rates["host re-encode (RAGEN)"])
    self.assertAlmostEqual(q["turns_vs_incremental"],
                           rates[_ROWS[0]] / rates["host incremental KV"])
    mem = res["compiled_memory"]
    self.assertIsNotNone(mem)
    self.assertEqual(mem["total_bytes"],
                     mem["argument_bytes"] + mem["output_bytes"] + mem["temp_bytes"])
    self.assertGreater(mem["argument_bytes"], 0)  # at least the weights

  def _check_tree(self, res, chain, tree, out):
    # One tree of 3 a group: 1 + 3 = 4 sampled turns, the chain's 2 x 2.
    tr = res["tree"]
    self.assertEqual((tr["trees"], tr["rows_per_tree"], tr["group_size"], tr["batch"],
                      tr["full_turns"]), (1, 3, 3, 6, 4))
    self.assertEqual((tree["tokens"], tree["env_turns"], tree["trajectories"]),
                     tree_counts(3))
    self.assertEqual((tree["env_turns"], tree["trajectories"]), (2 * 4, 6))
    self.assertEqual(chain["trajectories"], 4)
    self.assertLess(tree["tokens"], 6 * 2 * 8)  # a prefix of 3 rows counted once
    self.assertEqual(tree["all_seconds"], [tree["seconds"]])
    q = tr["ratio"]
    self.assertAlmostEqual(q["trajectories_per_1k_tokens"],
                           (6 / tree["tokens"]) / (4 / chain["tokens"]))
    self.assertAlmostEqual(q["env_turns_per_trajectory"], (8 / 6) / (8 / 4))
    self.assertAlmostEqual(q["seconds_per_trajectory"],
                           (tree["seconds"] / 6) / (chain["seconds"] / 4))
    self.assertRegex(out, r"TREE: [0-9.]+x the finished trajectories per sampled token of the "
                          r"chain; goal >= 1.4x: (met|NOT met)")

  def test_bad_flags_raise_before_compiling(self):
    proc = run_benchmark("--repeats=0")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("--repeats=0: must be an int >= 1", proc.stderr)
    proc = run_benchmark("--env=NoSuchEnv-v0")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("NoSuchEnv-v0", proc.stderr)
    proc = run_benchmark("--max_turns=2")  # the default forks at turns 1 and 2
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("RolloutConfig.tree.fork_turns=(1, 2): turn 2 is not in", proc.stderr)


if __name__ == "__main__":
  absltest.main()
