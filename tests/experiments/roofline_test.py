"""Tests of the benchmarks' roofline arithmetic (experiments/benchmarks/roofline.py)."""

from absl.testing import absltest
import jax
import jax.numpy as jnp

from experiments.benchmarks import roofline
from jagent import models


class DecodeStepFlopsTest(absltest.TestCase):

  def test_matches_xla_cost_analysis(self):
    # XLA's own count of the compiled decode step (matmuls plus the norms,
    # RoPE and softmax that decode_step_flops leaves out) is the reference.
    # One layer: XLA's cost analysis counts the layer scan's body once,
    # whatever its trip count.
    config = models.get_config("tiny", num_layers=1)
    batch, slots = 8, 48
    params = models.init(config, jax.random.key(0))
    cache = models.init_cache(config, batch, slots, lengths=jnp.full((batch,), 5))

    def step(params, tok, cache):
      return models.apply(params, tok[:, None], cache.lengths[:, None], cache, config=config,
                          num_tokens=jnp.ones((batch,), jnp.int32))[0]

    cost = jax.jit(step).lower(params, jnp.zeros((batch,), jnp.int32), cache).compile()
    cost = cost.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    ours = roofline.decode_step_flops(config, batch, slots)
    # By hand: L layers x (128*(4+4)*32 + 128*128 + 3*128*384 + 2*4*48*32) + 128*512
    # = L x 208,896 + 65,536 multiply-adds per row.
    self.assertEqual(ours, 2.0 * batch * (208_896 + 65_536))
    self.assertEqual(roofline.decode_step_flops(models.get_config("tiny"), batch, slots),
                     2.0 * batch * (3 * 208_896 + 65_536))
    self.assertBetween(cost["flops"] / ours, 1.0, 1.03)
    # Bytes by hand: float32 weights, and K + V of 1 layer x 8 rows x 2 KV heads x 48 x 32.
    self.assertEqual(roofline.decode_step_bytes(params, config, batch, slots),
                     (4 * config.num_params(), 2 * 1 * 8 * 2 * 48 * 32 * 4))

  def test_kv_cache_bytes_follow_the_activation_dtype(self):
    config = models.get_config("tiny", dtype="bfloat16", param_dtype="bfloat16")
    params = models.init(config, jax.random.key(0))
    # bfloat16: 2 bytes per weight and per cached key or value.
    self.assertEqual(roofline.decode_step_bytes(params, config, 8, 48),
                     (2 * config.num_params(), 2 * 3 * 8 * 2 * 48 * 32 * 2))


class TrainStepFlopsTest(absltest.TestCase):

  def test_by_hand(self):
    config = models.get_config("qwen2.5-0.5b")
    n = 494_032_768  # Qwen2.5-0.5B's parameter count, tied embeddings counted once
    self.assertEqual(config.num_params(), n)
    # 8 x 1024 tokens: 6 N T, plus 12 x 24 layers x 14 heads x 64 x 1024 per token.
    tokens = 8 * 1024
    self.assertEqual(roofline.train_step_flops(config, 8, 1024, attention=False), 6.0 * n * tokens)
    self.assertEqual(roofline.train_step_flops(config, 8, 1024),
                     6.0 * n * tokens + 12.0 * 24 * 14 * 64 * 1024 * tokens)


class PeakTflopsTest(absltest.TestCase):

  def test_device_kinds(self):
    cases = {
        "NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA H100 NVL": 835.0,
        "NVIDIA H200": 989.0, "NVIDIA GH200 480GB": 989.0, "NVIDIA A100-SXM4-80GB": 312.0,
        "NVIDIA A100 80GB PCIe": 312.0, "NVIDIA L4": 121.0, "NVIDIA L40S": 362.0,
        "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5": 459.0, "TPU v5p": 459.0,
        "TPU v6 lite": 918.0, "cpu": None, "Tesla V100-SXM2-16GB": None,
    }
    for kind, peak in cases.items():
      with self.subTest(kind):
        self.assertEqual(roofline.peak_tflops(kind), peak)


if __name__ == "__main__":
  absltest.main()
