"""Smoke test of ``python -m experiments.benchmarks.peer_rl`` (jagent's side only).

Runs the benchmark as a subprocess with its smallest settings (the nano
model, 2 levels x 2 rollouts, 2 turns, one warm-up and one timed iteration)
and peer virtualenvs that do not exist, so the Tunix and TRL sides are
skipped with their messages; checks both tables (jagent on the multi-turn
game and on the single-turn Bandit-v0), the messages and the JSON last
line.
A subprocess, because the benchmark's absl flags share names with other
benchmarks'. No timing asserts: speed is measured only by the benchmark.
"""

import json
import os
import re
import subprocess
import sys
import tempfile

from absl.testing import absltest

from tests import testenv

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_benchmark(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "experiments.benchmarks.peer_rl", *args],
                        cwd=_ROOT, env=testenv.subprocess_env(1), capture_output=True,
                        text=True, timeout=900, check=False)


class PeerRlBenchmarkTest(absltest.TestCase):

  def test_jagent_side_prints_table_and_json_without_the_peer(self):
    with tempfile.TemporaryDirectory() as tmp:
      venv = os.path.join(tmp, "no_venv")
      trl_venv = os.path.join(tmp, "no_trl_venv")
      proc = run_benchmark("--model=nano", "--num_groups=2", "--group_size=2",
                           "--max_turns=2", "--iterations=1", f"--peer_venv={venv}",
                           f"--trl_venv={trl_venv}")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    out = proc.stdout
    self.assertIn("peer RL benchmark: model nano", out)
    self.assertIn("multi-turn game vs Tunix: env Sokoban-6x6-1box-v0, 2 levels x 2 rollouts, "
                  "2 turns, 6 tokens/reply", out)
    self.assertIn("single-turn game vs TRL: env Bandit-v0, 2 prompts x 2 completions, 1 turn, "
                  "12 tokens/reply", out)
    self.assertRegex(out, r"framework +iteration s +best s +rollout s +update s")
    self.assertLen(re.findall(r"\njagent [0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+", out), 2)
    self.assertIn(f"tunix: skipped (no Tunix virtualenv at {venv} (--peer_venv); create it "
                  "with python -m experiments.benchmarks.peer_rl --setup)", out)
    self.assertIn(f"trl: skipped (no TRL virtualenv at {trl_venv} (--trl_venv); create it "
                  "with python -m experiments.benchmarks.peer_rl --setup)", out)
    self.assertNotRegex(out, r"\n(tunix|trl) [0-9]")  # no peer rows
    res = json.loads(out.strip().splitlines()[-1])
    self.assertIsNone(res["tunix_iteration_s"])
    self.assertIsNone(res["ratio_iteration"])
    self.assertIsNone(res["trl"])
    self.assertIsNone(res["trl_iteration_s"])
    self.assertIsNone(res["ratio_iteration_trl"])
    self.assertIn(f"no TRL virtualenv at {trl_venv}", res["trl_skipped"])
    b = res["trl_game"]["jagent"]
    self.assertEqual(res["jagent_trl_game_iteration_s"], b["iteration_s"])
    for it in b["iterations"]:
      self.assertEqual(it["env_turns"], 2 * 2, it)  # one turn per episode
      self.assertBetween(it["tokens"], 1, 2 * 2 * 12)
    j = res["jagent"]
    self.assertEqual(res["jagent_iteration_s"], j["iteration_s"])
    self.assertEqual(j["all_seconds"], [j["iteration_s"]])  # one timed iteration
    self.assertEqual(len(j["iterations"]), 2)  # warm-up + timed
    for it in j["iterations"]:
      # Random nano replies are never valid answers: every episode plays both turns.
      self.assertEqual(it["env_turns"], 2 * 2 * 2, it)
      self.assertBetween(it["tokens"], 1, 2 * 2 * 2 * 6)
    timed = j["iterations"][1]
    self.assertAlmostEqual(timed["rollout_s"] + timed["update_s"], timed["seconds"])
    self.assertAlmostEqual(j["turns_per_s"], 8 / j["iteration_s"])
    self.assertAlmostEqual(j["tokens_per_s"], timed["tokens"] / j["iteration_s"])
    for k in ("warmup_s", "setup_s", "rollout_compile_s", "peak_rss_mb"):
      self.assertGreater(j[k], 0.0, k)

  def test_trl_side_rewards_replies_as_reference_parse_does(self):
    # The TRL side's own parse (it cannot import jagent) against jagent's
    # oracle on Bandit's rules: the replies of a random policy never parse,
    # so the benchmark's own check sees only the format penalty.
    from experiments.benchmarks import peer_rl_trl  # pylint: disable=g-import-not-at-top
    from jagent import rollout  # pylint: disable=g-import-not-at-top
    spec = rollout.ParseSpec(action_names=("Phoenix", "Dragon"), think=False,
                             max_actions_per_turn=1, separator="||", max_answer_bytes=128)
    rules = dict(separator="||", max_actions_per_turn=1, max_actions_per_traj=1,
                 format_penalty=-0.1)
    table = {"phoenix": 0.1, "dragon": 1.0}
    replies = ["<answer>Dragon</answer>", "<answer> phoenix </answer>", "<answer>DRAGON",
               "x <answer>Dragon || Phoenix</answer>", "<answer>Tiger</answer>",
               "<answer></answer>", "<answer>||Dragon</answer>", "no answer",
               "<answer>Dragon</answer><answer>Phoenix</answer>", "<answer>\nDragon\n</answer>",
               "<answer>Phoenix||Tiger</answer>"]
    for reply in replies:
      parsed = rollout.reference_parse(reply.encode("utf-8"), spec)
      ours = 0.0 if parsed["format_valid"] else -0.1
      ours += sum(table[spec.action_names[a].lower()] for a in parsed["actions"][:1])
      self.assertAlmostEqual(peer_rl_trl.parse_reward(reply, table, rules), ours, msg=reply)

  def test_bad_flags_raise_before_compiling(self):
    proc = run_benchmark("--iterations=0", "--peer=none")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("--iterations=0: must be an int >= 1", proc.stderr)

  def test_multi_turn_trl_env_is_refused_before_compiling(self):
    proc = run_benchmark("--peer=trl", "--trl_env=Sokoban-6x6-1box-v0")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("--trl_env='Sokoban-6x6-1box-v0': TRL's GRPOTrainer plays single-turn "
                  "games; this one has 5 turns", proc.stderr)


if __name__ == "__main__":
  absltest.main()
