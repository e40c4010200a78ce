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
    config = models.get_config("tiny")
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
    # By hand: 3 layers x (128*(4+4)*32 + 128*128 + 3*128*384 + 2*4*48*32) + 128*512
    # = 3 x 208,896 + 65,536 = 692,224 multiply-adds per row.
    self.assertEqual(ours, 2.0 * batch * 692_224)
    self.assertBetween(cost["flops"] / ours, 1.0, 1.03)
    # Bytes by hand: float32 weights, and K + V of 3 layers x 8 rows x 2 KV heads x 48 x 32.
    self.assertEqual(roofline.decode_step_bytes(params, config, batch, slots),
                     (4 * config.num_params(), 2 * 3 * 8 * 2 * 48 * 32 * 4))


if __name__ == "__main__":
  absltest.main()
