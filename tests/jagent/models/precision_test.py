"""Memory levers against the float32 reference: a bfloat16 KV cache, bfloat16 compute.

Each lever changes rounding only; these tests state how far the values it
touches (log-probs, logits, losses, gradients) may move from float32 and
check it on a model with sharpened random weights (every weight but the
RMSNorm scales x4, so the next-token distributions are far from uniform, as a
trained model's are).
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import models
from jagent import train
from tests.jagent.models import sharpen

CFG = models.get_config("tiny")
B, P, N = 8, 24, 48


def _sharp_params():
  return sharpen.sharpened(models.init(CFG, jax.random.key(0)), 4.0)


def _prefill_logprobs(params, config, seqs):
  """Log-probs of ``seqs[:, P:]`` from one prefill into a KV cache of ``config``."""
  s = seqs.shape[1]
  cache = models.init_cache(config, seqs.shape[0], s)
  pos = jnp.broadcast_to(jnp.arange(s - 1), (seqs.shape[0], s - 1))
  logits, cache = models.apply(params, seqs[:, :-1], pos, cache, config=config)
  lp = jax.nn.log_softmax(logits[:, P - 1:], axis=-1)
  return jnp.take_along_axis(lp, seqs[:, P:, None], axis=2)[..., 0], cache


class PrecisionTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = _sharp_params()
    prompt = jax.random.randint(jax.random.key(1), (B, P), 0, CFG.vocab_size)
    out = models.generate(cls.params, prompt, jnp.full((B,), P, jnp.int32), jax.random.key(3),
                          config=CFG, sampling=models.SamplingConfig(max_new_tokens=N))
    cls.seqs = jnp.concatenate([prompt, out.tokens], axis=1)
    # The reference: float32 compute, no cache.
    cls.want = train.token_logprobs(cls.params, cls.seqs, config=CFG).logprobs[:, P:]

  def test_bfloat16_kv_cache(self):
    # Tolerance: mean |d log p| <= 0.02 nats, max <= 0.25 (keys and values
    # rounded to 8 mantissa bits; the queries, weights and softmax stay float32).
    f32, cache32 = _prefill_logprobs(self.params, CFG, self.seqs)
    bf16, cache16 = _prefill_logprobs(self.params, CFG.replace(cache_dtype="bfloat16"),
                                      self.seqs)
    self.assertEqual((cache32.k.dtype, cache16.k.dtype, cache16.v.dtype),
                     (jnp.float32, jnp.bfloat16, jnp.bfloat16))
    self.assertEqual(cache16.k.nbytes * 2, cache32.k.nbytes)
    np.testing.assert_allclose(f32, self.want, atol=1e-4)  # the float32 cache is exact
    err = np.abs(np.asarray(bf16) - np.asarray(self.want))
    self.assertLessEqual(err.mean(), 0.02)
    self.assertLessEqual(err.max(), 0.25)
    self.assertGreater(err.max(), 1e-4)  # the lever does round (the test can fail)

  def test_bfloat16_compute_over_float32_weights(self):
    # Tolerances: log-probs mean |d| <= 0.05 nats; the NLL within 1% of
    # float32's; its gradient (float32, as the weights) at cosine >= 0.9 and
    # relative error <= 0.5 to float32's. bfloat16 activations round the
    # residual stream at every block, so gradients move far more than
    # log-probs: use it where memory, not exactness, decides.
    bf = CFG.replace(dtype="bfloat16")
    got = train.token_logprobs(self.params, self.seqs, config=bf).logprobs[:, P:]
    self.assertEqual(got.dtype, jnp.float32)  # log-probs are float32 either way
    self.assertLessEqual(float(jnp.mean(jnp.abs(got - self.want))), 0.05)

    def nll(params, config):
      return -jnp.mean(train.token_logprobs(params, self.seqs, config=config).logprobs[:, P:])

    (l32, g32), (l16, g16) = (jax.value_and_grad(nll)(self.params, c) for c in (CFG, bf))
    self.assertLessEqual(abs(float(l16) - float(l32)), 0.01 * abs(float(l32)))
    self.assertEqual({x.dtype for x in jax.tree.leaves(g16)}, {jnp.dtype(jnp.float32)})
    flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])  # noqa: E731
    a, b = flat(g32), flat(g16)
    self.assertGreaterEqual(a @ b / np.linalg.norm(a) / np.linalg.norm(b), 0.9)
    self.assertLessEqual(np.linalg.norm(a - b) / np.linalg.norm(a), 0.5)

  def test_bad_cache_dtype_is_named(self):
    with self.assertRaisesRegex(ValueError, r"ModelConfig\.cache_dtype='int8'"):
      CFG.replace(cache_dtype="int8")


if __name__ == "__main__":
  absltest.main()
