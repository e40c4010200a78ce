"""Exact accumulation inside train_step: 1 micro-batch == 4 micro-batches."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jagent import train
from jagent import transforms
from tests.jagent.train.accumulate_test import _mask
from tests.jagent.train.accumulate_test import _rel_err
from tests.jagent.train.accumulate_test import AGGREGATIONS
from tests.jagent.train.accumulate_test import B
from tests.jagent.train.accumulate_test import CFG
from tests.jagent.train.accumulate_test import G
from tests.jagent.train.accumulate_test import OBJECTIVES
from tests.jagent.train.accumulate_test import PARAMS
from tests.jagent.train.accumulate_test import S


class AccumulateStepTest(parameterized.TestCase):

  @parameterized.parameters(*AGGREGATIONS)
  def test_train_step_one_vs_four_micro_batches(self, aggregation):
    obj = OBJECTIVES[aggregation]
    tokens = jax.random.randint(jax.random.key(4), (B, S), 1, CFG.vocab_size)
    mask = _mask()
    scores = jnp.array([1.0, 0.0, 0.3, 0.0, 0.0, 1.0, 1.0, 0.2])
    batch = transforms.Batch(tokens=tokens, loss_mask=mask, scores=scores,
                             group_size=G)
    out = {}
    for k in (1, 4):
      tc = train.TrainConfig(
          model=CFG, actor_optimizer=train.OptimizerConfig(
              learning_rate=1e-3, max_grad_norm=None),
          num_microbatches=k)
      state = train.init_train_state(PARAMS, jax.random.key(0), config=tc,
                                     objective=obj)
      out[k] = train.train_step(state, batch, objective=obj, config=tc)
    (s1, m1), (s4, m4) = out[1], out[4]
    # The gradient norm carries the scale (Adam's update does not).
    np.testing.assert_allclose(float(m1["train/grad_norm"]),
                               float(m4["train/grad_norm"]), rtol=1e-6)
    np.testing.assert_allclose(float(m1["loss/total"]),
                               float(m4["loss/total"]), rtol=1e-6)
    # Parameters: relative to the largest parameter. (Per leaf, Adam turns
    # gradients that are zero in exact arithmetic, such as the key bias's,
    # into noise-sized steps of either sign.)
    self.assertLess(_rel_err([s1.params], [s4.params], per_leaf=False), 1e-6)
    # Adam's first moment is 0.1 * grad: the accumulated gradients agree.
    mu1, mu4 = s1.opt_state[-1][0].mu, s4.opt_state[-1][0].mu
    self.assertLess(_rel_err(mu1, mu4), 1e-6)
    self.assertGreater(float(jnp.max(jnp.abs(mu1.embed))), 1e-5)
    self.assertEqual(float(m1["train/trained_tokens"]), 18.0)


if __name__ == "__main__":
  absltest.main()
