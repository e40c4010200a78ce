"""Smoke test of ``python -m experiments.benchmarks.scaling`` (no timing asserts).

Runs the benchmark as a subprocess (its absl flags would clash with other
benchmarks' in one process) with tiny settings: Bandit, the ``nano`` model,
2 x 2 rollouts, meshes of 1 and 2 of the 8 fake CPU devices, 1 repeat, and
the MFU rows forced on (``--mfu=on``; the benchmark only runs them on an
accelerator by default) for a 4 x 16-token SFT step, with and without rank-2
LoRA (``--mfu_lora_rank``). Checks the tables, the ratios and the FLOP/s
arithmetic of its JSON line. Speed itself is measured
only by the benchmark.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest
import pytest

from jagent import models
from tests import testenv

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TINY = ("--config=experiments/configs/tiny.py:Bandit-v0,dr_grpo", "--config.model=nano",
         "--config.rollout.num_groups=2", "--config.rollout.group_size=2",
         "--config.rl.num_microbatches=1", "--repeats=1")


def run_benchmark(*args: str) -> subprocess.CompletedProcess:
  env = testenv.subprocess_env(8)
  return subprocess.run([sys.executable, "-m", "experiments.benchmarks.scaling", *args],
                        cwd=_ROOT, env=env, capture_output=True, text=True, timeout=600,
                        check=False)


@pytest.mark.heavy
class ScalingBenchmarkTest(absltest.TestCase):

  def test_tiny_run_prints_rows_ratios_mfu_and_json(self):
    proc = run_benchmark(*_TINY, "--devices=1,2", "--mfu=on", "--mfu_models=nano",
                         "--mfu_batch=4", "--mfu_seq=16", "--peak_tflops=2",
                         "--mfu_lora_rank=2")
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    out = proc.stdout
    self.assertIn("fake CPU devices share", out)
    self.assertRegex(out, r"SUMMARY: 2 vs 1 devices: rollout [0-9.]+x, train step [0-9.]+x "
                          r"tokens/s")
    res = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    self.assertEqual((res["env"], res["model"], res["rollout_rows"], res["trained_rows"]),
                     ("Bandit-v0", "nano", 4, 4))
    self.assertEqual([r["devices"] for r in res["rows"]], [1, 2])
    self.assertEqual([r["mesh"]["data"] for r in res["rows"]], [1, 2])
    for r in res["rows"]:
      for stage in ("rollout", "train"):
        x = r[stage]
        self.assertEqual(x["all_seconds"], [x["seconds"]])
        self.assertGreater(x["seconds"], 0.0)
        self.assertGreater(x["compile_seconds"], 0.0)
        self.assertAlmostEqual(x["steps_per_s"] * x["seconds"], 1.0, places=6)
        self.assertAlmostEqual(
            x["ratio_to_first"], x["tokens_per_s"] / res["rows"][0][stage]["tokens_per_s"])
      self.assertEqual(r["train"]["context_tokens"], 4 * res["context"])
      self.assertAlmostEqual(r["train"]["tokens_per_s"] * r["train"]["seconds"],
                             4 * res["context"], places=3)
      # One key, one set of parameters: every mesh samples the same tokens.
      self.assertEqual(r["rollout"]["sampled_tokens"], res["rows"][0]["rollout"]["sampled_tokens"])
      self.assertEqual(r["rollout"]["env_turns"], 4.0)  # Bandit: one turn per row
    # The full step, then the same step training rank-2 adapters only.
    self.assertEqual([m["lora_rank"] for m in res["mfu"]], [0, 2])
    full = res["mfu"][0]
    for m in res["mfu"]:
      self.assertEqual((m["model"], m["devices"], m["batch"], m["seq"]), ("nano", 2, 4, 16))
      self.assertEqual(m["params"], models.get_config("nano").num_params())
      self.assertAlmostEqual(m["tflops_per_s"], 6 * m["params"] * 4 * 16 / m["seconds"] / 1e12)
      self.assertAlmostEqual(m["mfu"], m["tflops_per_s"] / (2.0 * 2))
      self.assertAlmostEqual(m["speedup_to_full"], full["seconds"] / m["seconds"])
    self.assertIn("MFU", out)
    self.assertIn("LoRA r", out)

  def test_bad_flags_raise_before_compiling(self):
    for flag, message in (("--devices=1,9", "9 devices requested, jax sees 8"),
                          ("--devices=3", "config.mesh='data:3'"),
                          ("--repeats=0", "--repeats=0: must be an int >= 1"),
                          ("--mfu=on --mfu_lora_rank=-1",
                           "--mfu_lora_rank=-1: must be an int >= 0")):
      proc = run_benchmark(*_TINY, *flag.split())
      self.assertNotEqual(proc.returncode, 0, flag)
      self.assertIn(message, proc.stderr, flag)
      self.assertNotIn("compile", proc.stdout, flag)


if __name__ == "__main__":
  absltest.main()
