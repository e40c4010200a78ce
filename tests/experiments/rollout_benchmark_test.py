"""Smoke test of ``python -m experiments.benchmarks.rollout`` (no timing asserts).

Runs the benchmark as a subprocess with tiny settings (the nano model, batch
2 x 2, 2 turns, 8 tokens per reply, 1 repeat, the full history and
``history_turns=0``, each with its RL step) and checks its table, ratios,
summary and JSON line. A subprocess, because the benchmark's absl flags
(``--model``, ``--repeats``, ...) share names with other benchmarks' flags
and cannot be defined twice in one test process. Speed itself is measured
only by the benchmark.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest

from tests import testenv

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ROWS = ("on-device (make_rollout)", "host re-encode (RAGEN)", "host incremental KV")
_HISTORY_ROW = "on-device, history_turns=0"


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
                         "--nosampler_only", "--history_turns=0")
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
    self.assertEqual([r["name"] for r in res["rows"]], list(_ROWS) + [_HISTORY_ROW])
    for r in res["rows"]:
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
    for r in res["rows"][1:3]:
      self.assertNotIn("rl_step_seconds", r)  # the host loops have none
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

  def test_bad_flags_raise_before_compiling(self):
    proc = run_benchmark("--repeats=0")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("--repeats=0: must be an int >= 1", proc.stderr)
    proc = run_benchmark("--env=NoSuchEnv-v0")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("NoSuchEnv-v0", proc.stderr)


if __name__ == "__main__":
  absltest.main()
