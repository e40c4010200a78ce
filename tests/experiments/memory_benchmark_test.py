"""Smoke test of ``python -m experiments.benchmarks.memory`` on the tiny config.

Runs the benchmark's ``main`` in-process on its own ``flags.FlagValues``
(other modules define ``--config`` on the global flags): Bandit, the ``nano``
model (2 layers), 2 x 2 rollouts, one mesh (``data:2``; each mesh costs 4
compiles), layers 1 and 2. Checks the Markdown rows, the JSON line, the
persistent state against a hand computation from the parameter count, the
extrapolation arithmetic and positive temporaries; ``--compare_lora``'s
state with and without LoRA against a hand computation (no compile); and that
bad flags fail before anything compiles.
"""

import contextlib
import io
import json
import os
import re

from absl import flags
from absl.testing import absltest
import jax
import pytest

from experiments.benchmarks import memory
from jagent import models

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TINY = (f"--config={_ROOT}/experiments/configs/tiny.py:Bandit-v0,starpo_s",
         "--config.model=nano", "--config.rollout.num_groups=2",
         "--config.rollout.group_size=2", "--config.rl.num_microbatches=1")
# TrainState's scalars: step, num_updates, 2 skip counters (int32) + a raw
# uint32[2] key; the AdamW chain's step counts (adam's, the schedule's) int32.
_OTHER = 4 * 4 + 2 * 4
_COUNTS = 2 * 4


def _flag_values(*args):
  argv = ["memory", *_TINY, *args]
  fv = memory.define_flags(flags.FlagValues(), argv)
  fv(argv)
  return fv


def _run_main(*args) -> str:
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    memory.main([], _flag_values(*args))
  return out.getvalue()


@pytest.mark.heavy
class MemoryBenchmarkTest(absltest.TestCase):

  def test_tiny_run_prints_table_and_json(self):
    out = _run_main("--meshes=data:2", "--layers=1,2")
    num_params = models.get_config("nano").num_params()
    self.assertIn("memory benchmark: Bandit-v0 starpo_s, model nano", out)
    self.assertIn("| mesh | devices | micro-batches | state ", out)
    self.assertRegex(out, r"\n\| data:2 \| 2 \| 1 \|( [0-9.,]+ \|){6}\n")
    res = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    self.assertEqual((res["model"], res["num_params"], res["num_layers"], res["layers"]),
                     ("nano", num_params, 2, [1, 2]))
    self.assertEqual((res["rollout_rows"], res["trained_rows"]), (4, 2))  # 1 of 2 groups kept
    self.assertFalse(res["critic"] or res["reference"])
    self.assertEqual([r["mesh"] for r in res["rows"]], ["data:2"])
    for r in res["rows"]:
      # float32 policy + AdamW's two moments, replicated on a data mesh.
      st = r["state"]
      self.assertEqual(st["params"], 4 * num_params)
      self.assertEqual(st["opt_state"], 2 * 4 * num_params + _COUNTS)
      self.assertEqual((st["critic_params"], st["critic_opt_state"], st["ref_params"]),
                       (0, 0, 0))
      self.assertEqual(st["other"], _OTHER)
      self.assertEqual(st["total"], 12 * num_params + _COUNTS + _OTHER)
      for name in ("rollout", "train"):
        p = r[name]
        m1, m2 = p["measured"]["1"], p["measured"]["2"]
        self.assertGreater(m1["temp_bytes"], 0)
        self.assertGreater(m2["temp_bytes"], 0)
        self.assertEqual(p["per_layer_bytes"], m2["temp_bytes"] - m1["temp_bytes"])
        # nano has 2 layers: the extrapolation lands on the 2-layer compile.
        self.assertEqual(p["temp_bytes"], m2["temp_bytes"])
        self.assertGreater(p["compile_seconds"], 0.0)
      self.assertEqual(r["total_bytes"], st["total"] + max(r["rollout"]["temp_bytes"],
                                                           r["train"]["temp_bytes"]))
      self.assertAlmostEqual(
          r["compile_seconds"], r["rollout"]["compile_seconds"] + r["train"]["compile_seconds"])

  def test_default_compiles_at_the_model_depth(self):
    res = json.loads([l for l in _run_main("--meshes=data:1").splitlines()
                      if l.startswith("{")][-1])
    self.assertEqual((res["num_layers"], res["layers"]), (2, []))
    for name in ("rollout", "train"):
      p = res["rows"][0][name]
      self.assertEqual(list(p["measured"]), ["2"])  # one compile, at L = 2
      self.assertIsNone(p["per_layer_bytes"])
      self.assertEqual(p["temp_bytes"], p["measured"]["2"]["temp_bytes"])

  def test_state_bytes_shrink_on_fsdp(self):
    fv = _flag_values()
    num_params = models.get_config("nano").num_params()
    by_mesh = {}
    for spec, n in (("data:1", 1), ("data:2", 2), ("fsdp:2", 2)):
      c = fv.config.copy_and_resolve_references()
      c.mesh = spec
      exp = memory.experiment.Experiment(c, devices=jax.devices()[:n])
      by_mesh[spec] = memory.state_bytes(exp)
    self.assertEqual(by_mesh["data:2"], by_mesh["data:1"])  # replicated weights
    fsdp = by_mesh["fsdp:2"]
    self.assertLess(fsdp["params"], 4 * num_params)
    self.assertGreaterEqual(fsdp["params"], 2 * num_params)  # at best halved
    self.assertEqual(fsdp["opt_state"], 2 * fsdp["params"] + _COUNTS)  # moments mirror
    self.assertEqual(fsdp["other"], _OTHER)

  def test_with_layers_changes_only_the_depth(self):
    fv = _flag_values()
    exp = memory.experiment.Experiment(fv.config)
    one = memory.with_layers(exp, 1)
    self.assertEqual((one.model_config.num_layers, one.train_config.model.num_layers), (1, 1))
    self.assertEqual(exp.model_config.num_layers, 2)  # the original is unchanged
    self.assertEqual(one.model_config.replace(num_layers=2), exp.model_config)
    self.assertEqual(one.train_config.num_microbatches, exp.train_config.num_microbatches)

  def test_compare_lora_state_by_hand(self):
    # StarPO-S with a GAE critic of its own (a second trunk), rank 4 on nano.
    out = _run_main("--compare_lora", "--compare_models=nano", "--lora_rank=4",
                    "--sweep_runs=3", "--meshes=data:1;fsdp:2", "--config.rl.critic=model",
                    "--config.algorithm_kwargs.advantage=gae")
    self.assertIn("LoRA memory comparison: Bandit-v0 starpo_s, critic model", out)
    self.assertRegex(out, r"\n\| nano \| [0-9,]+ \| fsdp:2 \|( [0-9.,]+ \|){6}\n")
    res = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    c = models.get_config("nano")
    n, r = c.num_params(), 4
    d, h, k, dh, f = c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim
    # q, k + v, o, gate + up, down: [in, r] and [r, out] each, every layer.
    adapters = c.num_layers * r * ((d + h * dh) + 2 * (d + k * dh) + (h * dh + d)
                                   + 2 * (d + f) + (f + d))
    self.assertEqual([(x["model"], x["mesh"]) for x in res["rows"]],
                     [("nano", "data:1"), ("nano", "fsdp:2")])
    one, fsdp = res["rows"]
    full, lora = one["full"], one["lora"]
    self.assertEqual((full["params"], full["opt_state"], full["frozen"]),
                     (4 * n, 8 * n + _COUNTS, 0))
    # The base is frozen (no moments) and the critic's trunk is a second frozen copy.
    self.assertEqual((lora["params"], lora["opt_state"], lora["frozen"]),
                     (4 * n + 4 * adapters, 8 * adapters + _COUNTS, 2 * 4 * n))
    self.assertEqual(lora["critic_params"] - full["critic_params"], 4 * adapters)
    self.assertLess(lora["critic_opt_state"], full["critic_opt_state"])
    self.assertLess(lora["total"], full["total"])
    # fsdp shards the frozen bases too.
    self.assertLess(fsdp["lora"]["frozen"], lora["frozen"])
    self.assertLess(fsdp["full"]["total"], full["total"])
    # A sweep of 3 runs: full fine-tuning stacks 3 states; LoRA shares the two
    # frozen trunks and stacks only adapters, moments and counters.
    self.assertEqual(one["sweep"], {"full": 3 * full["total"], "lora_shared_base": (
        2 * 4 * n + 3 * (lora["total"] - 2 * 4 * n))})
    for args, message in ((("--compare_models=gpt5",), "--compare_models=gpt5"),
                          (("--lora_rank=0",), "--lora_rank=0: must be an int >= 1"),
                          (("--sweep_runs=0",), "--sweep_runs=0: must be an int >= 1")):
      with self.subTest(args=args):
        with self.assertRaisesRegex(ValueError, re.escape(message)):
          _run_main("--compare_lora", "--meshes=data:1", *args)

  def test_bad_flags_raise_before_compiling(self):
    self.assertEqual(memory.parse_meshes("data:1;data:2,fsdp:4; fsdp:-1", 8),
                     [("data:1", 1), ("data:2,fsdp:4", 8), ("fsdp:-1", 8)])
    for args, message in (
        (("--meshes=data:9",), "data:9"),
        (("--meshes=data:1;;data:2",), "no empty entry"),
        (("--meshes=data:3",), "config.mesh='data:3'"),
        (("--config.rollout.num_groups=4", "--meshes=data:8"),  # 2 of 4 groups kept
         "config.mesh='data:8': the 4 trained rows"),
        (("--meshes=data:1", "--layers=2,1"), "two counts a < b"),
        (("--meshes=data:1", "--layers=0"), "one layer count n >= 1"),
        (("--meshes=data:1", "--layers=1,2,3"), "two counts a < b"),
        (("--meshes=data:1", "--layers=1,x"), "must be ints")):
      with self.subTest(args=args):
        with self.assertRaisesRegex(ValueError, re.escape(message)):
          _run_main(*args)


if __name__ == "__main__":
  absltest.main()
