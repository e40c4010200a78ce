"""Exact gradient accumulation: 1 micro-batch == 4 micro-batches == the full batch."""

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import models
from jagent import train
from jagent import transforms

CFG = models.ModelConfig(vocab_size=32, embed_dim=16, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32)
B, S, G = 8, 8, 4
PARAMS = models.init(CFG, jax.random.key(0))
AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
# One objective per aggregation, built once (static jit argument).
OBJECTIVES = {a: transforms.grpo(kl_coef=0.0, aggregation=a)
              for a in AGGREGATIONS}


def _mask():
  # Ragged rows (different numbers of trained tokens) and one empty row (a
  # filtered row): seq-mean weighs rows, token-mean tokens.
  lengths = np.array([4, 1, 3, 0, 2, 4, 1, 3])
  pos = np.arange(S)[None]
  return jnp.asarray((pos >= 4) & (pos < 4 + lengths[:, None]), jnp.float32)


def _rel_err(a, b, per_leaf=True):
  """Largest |a - b| relative to the leaf's largest |a| (or the tree's).

  Per leaf, the scale is floored at 1% of the tree's: a gradient that is zero
  in exact arithmetic (the key bias: softmax ignores a shift shared by all
  keys) has only rounding noise to compare.
  """
  xs = [np.asarray(x, np.float64) for x in jax.tree.leaves(a)]
  ys = [np.asarray(y, np.float64) for y in jax.tree.leaves(b)]
  scale = max(np.max(np.abs(x)) for x in xs)
  floor = 1e-2 * scale if per_leaf else scale
  return max(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), floor, 1e-30)
             for x, y in zip(xs, ys))


def _loss_fn(objective):

  def loss_fn(params, mb):
    lp = train.token_logprobs(params, mb.tokens, config=CFG, with_entropy=True)
    out = objective.loss(transforms.ModelOutputs(lp.logprobs, None,
                                                 lp.entropy), mb)
    return out.loss_sum, out.metrics

  return loss_fn


class AccumulateTest(parameterized.TestCase):

  @parameterized.parameters(*AGGREGATIONS)
  def test_accumulate_gradients_equals_full_batch_gradient(self, aggregation):
    obj = OBJECTIVES[aggregation]
    loss_fn = _loss_fn(obj)
    tokens = jax.random.randint(jax.random.key(1), (B, S), 1, CFG.vocab_size)
    mask = _mask()
    # Off-policy old log-probs and random advantages: ratios differ from 1
    # and some tokens are clipped.
    cur = train.token_logprobs(PARAMS, tokens, config=CFG).logprobs
    noise = 0.3 * jax.random.normal(jax.random.key(2), (B, S))
    batch = transforms.Batch(
        tokens=tokens, loss_mask=mask, old_logprobs=cur + noise,
        advantages=jax.random.normal(jax.random.key(3), (B, S)) * mask)

    @jax.jit
    def full(params):
      den = obj.loss(transforms.ModelOutputs(cur, None, cur), batch).denominator
      return jax.grad(lambda p: loss_fn(p, batch)[0] / den)(params), den

    @jax.jit
    def accumulated(params):
      micro = jax.tree.map(lambda x: x.reshape((4, B // 4) + x.shape[1:]),
                           batch)
      dens = jax.vmap(lambda mb: obj.loss(
          transforms.ModelOutputs(mb.loss_mask, None, mb.loss_mask),
          mb).denominator)(micro)
      return train.accumulate_gradients(loss_fn, params, micro, jnp.sum(dens))

    g_full, den = full(PARAMS)
    acc = accumulated(PARAMS)
    want_den = 18.0 if aggregation == "token-mean" else 7.0
    self.assertEqual(float(den), want_den)
    self.assertLess(_rel_err(g_full, acc.grads), 1e-6)
    self.assertGreater(float(jnp.max(jnp.abs(acc.grads.embed))), 1e-4)
    chex.assert_shape(acc.metrics["loss/tokens"], (4,))
    np.testing.assert_allclose(float(jnp.sum(acc.metrics["loss/tokens"])),
                               18.0)


if __name__ == "__main__":
  absltest.main()
