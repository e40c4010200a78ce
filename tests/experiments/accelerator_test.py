"""Tests of ``python -m experiments.benchmarks.accelerator`` on CPU at toy sizes.

The whole command runs once in-process (``accelerator.run`` with
``TOY_SIZES``); the tests check its table, its JSON line and the arithmetic of
its figures (by hand), not its speed. transformers' figures are checked when
torch and transformers are installed, else their "not installed" marker.
"""

import dataclasses
import io
import json
from unittest import mock

from absl import flags
from absl.testing import absltest
import jax
import pytest

from experiments.benchmarks import accelerator
from experiments.benchmarks import generate
from jagent import models

_HF_MISSING = generate.hf_missing()
_MARKER = "torch and transformers are not installed: pip install -e .[hf]"


def _json_line(text: str) -> dict:
  lines = [l for l in text.splitlines() if l.startswith("{")]
  assert len(lines) == 1, text
  return json.loads(lines[0])


class SizesTest(absltest.TestCase):
  """Sizes, flags and bad input: nothing compiles."""

  def test_cpu_backend_gets_toy_sizes(self):
    self.assertEqual(jax.default_backend(), "cpu")
    self.assertEqual(accelerator.default_sizes(), accelerator.TOY_SIZES)
    self.assertEqual(accelerator.default_sizes(toy=False), accelerator.Sizes())
    self.assertEqual(accelerator.Sizes().model, "qwen2.5-0.5b")

  def test_size_flags_override_the_defaults(self):
    fv = accelerator.define_flags(flags.FlagValues())
    fv(["accelerator", "--gen_batch=4", "--model=nano"])
    sizes = accelerator.sizes_from_flags(fv)
    self.assertEqual((sizes.gen_batch, sizes.model), (4, "nano"))
    self.assertEqual(sizes.mfu_seq, accelerator.TOY_SIZES.mfu_seq)  # CPU: toy for the rest
    fv = accelerator.define_flags(flags.FlagValues())
    fv(["accelerator", "--notoy", "--ragen_steps=3"])
    self.assertEqual(accelerator.sizes_from_flags(fv),
                     accelerator.Sizes(ragen_steps=3))

  def test_bad_sizes_are_named(self):
    toy = accelerator.TOY_SIZES
    cases = [
        (dict(gen_batch=0), r"--gen_batch=0: must be an int >= 1"),
        (dict(ragen_groups=-1), r"--ragen_groups=-1: must be an int >= 0"),
        (dict(model="gpt-5"), r"--model='gpt-5': must be one of"),
        (dict(mfu_seq=5000), r"--mfu_seq=5000: tiny has 4096 positions"),
        (dict(gen_prompt=4000, gen_new=100),
         r"--gen_prompt \+ gen_new=4100: tiny has 4096 positions"),
    ]
    for changes, message in cases:
      with self.subTest(**changes):
        with self.assertRaisesRegex(ValueError, message):
          accelerator.run(dataclasses.replace(toy, **changes), out=io.StringIO())
    with self.assertRaisesRegex(ValueError, r"--sections=versions,gpu: must name some of"):
      accelerator.run(toy, sections=("versions", "gpu"), out=io.StringIO())
    with self.assertRaisesRegex(ValueError, r"--peak_tflops=0.0: must be > 0"):
      accelerator.run(toy, sections=("versions",), peak_tflops=0.0, out=io.StringIO())


class FailingSectionTest(absltest.TestCase):

  def test_a_failing_section_is_reported_and_the_others_run(self):
    fv = accelerator.define_flags(flags.FlagValues())
    fv(["accelerator", "--sections=versions,generate,parity", "--toy"])
    buf = io.StringIO()
    with mock.patch.object(generate, "ours", side_effect=RuntimeError("no device left")), \
        mock.patch("sys.stdout", buf):
      with self.assertRaises(SystemExit) as cm:
        accelerator.main([], fv)
    self.assertEqual(cm.exception.code, 1)
    out = buf.getvalue()
    self.assertIn("| generate |", out)
    self.assertIn("error: RuntimeError: no device left |", out)
    res = _json_line(out)
    self.assertEqual(res["failed"], ["generate"])
    self.assertEqual(res["generate"]["error"], "RuntimeError: no device left")
    self.assertEqual(set(res), {"versions", "generate", "parity", "sizes", "failed"})
    self.assertEqual(res["versions"]["jax"], jax.__version__)
    self.assertNotIn("error", res["parity"])


@pytest.mark.heavy
class ToyRunTest(absltest.TestCase):
  """Every section once, at toy sizes (compile-bound: a few minutes on 2 cores)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    buf = io.StringIO()
    cls.res = accelerator.run(accelerator.TOY_SIZES, out=buf)
    cls.out = buf.getvalue()
    cls.sizes = accelerator.TOY_SIZES

  def test_one_table_and_one_json_line_of_every_section(self):
    self.assertEqual(self.res["failed"], [], self.out)
    rows = [l for l in self.out.splitlines() if l.startswith("| ")]
    self.assertEqual(rows[0], "| section | seconds | figures |")
    self.assertEqual([r.split(" | ")[0][2:] for r in rows[2:]], list(accelerator.SECTIONS))
    res = _json_line(self.out)
    self.assertEqual(list(res), [*accelerator.SECTIONS, "sizes", "failed"])
    self.assertEqual(res["sizes"], dataclasses.asdict(self.sizes))
    for name in accelerator.SECTIONS:
      self.assertGreater(res[name]["section_seconds"], 0.0)
      self.assertNotIn("error", res[name])

  def test_versions(self):
    v = self.res["versions"]
    self.assertEqual((v["jax"], v["backend"], v["device_kind"], v["device_count"]),
                     (jax.__version__, "cpu", "cpu", jax.device_count()))
    self.assertIsNotNone(v["flax"])
    self.assertIsNotNone(v["optax"])
    self.assertEqual(v["hf_skipped"], _HF_MISSING)
    self.assertEqual(v["torch_device"], None if _HF_MISSING else "cpu")

  def test_ragen_rl_step(self):
    r = self.res["ragen_rl"]
    # 4 groups x 2 rollouts; StarPO-S keeps the top 25% of groups: 1 group of 2 rows.
    self.assertEqual((r["model"], r["rollout_rows"], r["trained_rows"]), ("nano", 8, 2))
    self.assertLen(r["all_step_seconds"], 2)
    self.assertEqual(r["first_step_seconds"], r["all_step_seconds"][0])
    self.assertEqual(r["step_seconds"], r["all_step_seconds"][1])
    self.assertGreater(r["step_seconds"], 0.0)
    # 8 rows x at most 2 turns x 8 tokens.
    self.assertBetween(r["sampled_tokens"], 1.0, 8 * 2 * 8)
    self.assertIsNone(r["peak_bytes"])  # XLA:CPU keeps no memory statistics

  def test_smoke_train(self):
    r = self.res["smoke_train"]
    self.assertEqual((r["model"], r["sft_steps"], r["rl_steps"], r["eval_levels"]),
                     ("nano", 4, 3, 4))
    self.assertGreater(r["train_seconds"], 0.0)
    for k in ("sft_success", "rl_success"):  # a share of 4 levels
      self.assertIn(r[k] * 4, (0.0, 1.0, 2.0, 3.0, 4.0))

  def test_generate_against_transformers_and_the_roofline(self):
    g = self.res["generate"]
    cfg = models.get_config("tiny")
    self.assertEqual((g["model"], g["dtype"], g["batch"], g["prompt"], g["new"]),
                     ("tiny", "bfloat16", 2, 8, 16))
    self.assertGreater(g["ours_tokens_per_s"], 0.0)
    self.assertGreater(g["decode_step_ms"], 0.0)
    # bfloat16 weights, and K + V of 3 layers x 2 rows x 2 KV heads x 24 slots x 32 x 2 bytes.
    self.assertEqual(g["weight_bytes"], 2 * cfg.num_params())
    self.assertEqual(g["kv_bytes"], 2 * 3 * 2 * 2 * 24 * 32 * 2)
    self.assertAlmostEqual(g["roofline_ms"],
                           (g["weight_bytes"] + g["kv_bytes"]) / (g["copy_gb_per_s"] * 1e6))
    self.assertAlmostEqual(g["times_roofline"], g["decode_step_ms"] / g["roofline_ms"])
    if _HF_MISSING:
      self.assertEqual(_HF_MISSING, _MARKER)
      self.assertEqual(g["hf_skipped"], _MARKER)
      self.assertIsNone(g["hf_tokens_per_s"])
      self.assertIsNone(g["ratio"])
    else:
      self.assertIsNone(g["hf_skipped"])
      self.assertGreater(g["hf_tokens_per_s"], 0.0)
      self.assertAlmostEqual(g["ratio"], g["ours_tokens_per_s"] / g["hf_tokens_per_s"])

  def test_parity(self):
    p = self.res["parity"]
    if _HF_MISSING:
      self.assertEqual(p["skipped"], _MARKER)
      self.assertIsNone(p["max_abs_diff"])
    else:
      self.assertIsNone(p["skipped"])
      self.assertGreater(p["max_abs_logit"], 0.1)
      self.assertLess(p["max_abs_diff"], 1e-4)

  def test_mfu(self):
    m = self.res["mfu"]
    self.assertEqual((m["model"], m["devices"], m["batch"], m["seq"]), ("tiny", 1, 2, 32))
    # By hand: 6 x N x 64 tokens + 12 x 3 layers x 4 heads x 32 x 32 positions x 64 tokens.
    n = models.get_config("tiny").num_params()
    self.assertEqual(m["flops_per_step"], 6 * n * 64 + 12 * 3 * 4 * 32 * 32 * 64)
    self.assertAlmostEqual(m["tflops_per_s"], m["flops_per_step"] / m["seconds"] / 1e12)
    self.assertIsNone(m["peak_tflops_per_device"])  # a CPU has no entry in the table
    self.assertIsNone(m["mfu"])


if __name__ == "__main__":
  absltest.main()
