"""Tests of attention by backend: every CPU-runnable implementation against the reference.

The reference (jagent's own XLA code) is the oracle, itself checked here
against a float64 NumPy softmax attention; "xla" is
``jax.nn.dot_product_attention(implementation="xla")``, and the Pallas TPU
flash kernel runs in Pallas' TPU interpret mode on CPU. cuDNN and compiled
TPU kernels need their hardware and are not run here.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.experimental.pallas import tpu as pltpu
import jax.numpy as jnp
import numpy as np

from jagent import models
from jagent.models import _attention

# Largest |difference| to the reference, outputs of magnitude ~1: float32
# differs by summation order only; bfloat16 rounds q, p and the output to 8
# mantissa bits at different points in each implementation.
_ATOL = {"float32": 2e-5, "bfloat16": 3e-2}
CFG = models.get_config("tiny", vocab_size=64, embed_dim=32, num_layers=2, mlp_dim=64,
                        head_dim=8)


def _qkv(key, b, t, nk, g, dh, dtype, s=None):
  """Random queries [B,T,K,G,Dh] and keys/values [B,S,K,Dh] (S = T by default)."""
  kq, kk, kv = jax.random.split(key, 3)
  s = t if s is None else s
  q = jax.random.normal(kq, (b, t, nk, g, dh), jnp.float32).astype(dtype)
  k = jax.random.normal(kk, (b, s, nk, dh), jnp.float32).astype(dtype)
  v = jax.random.normal(kv, (b, s, nk, dh), jnp.float32).astype(dtype)
  return q, k, v


def _numpy_attention(q, k, v, visible):
  """float64 softmax(q k^T / sqrt(Dh)) v; q [B,T,K,G,Dh], k/v [B,S,K,Dh], visible [B,T,S]."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  s = np.einsum("btkgd,bskd->bkgts", q, k) / np.sqrt(q.shape[-1])
  s = np.where(np.asarray(visible)[:, None, None], s, -np.inf)
  with np.errstate(invalid="ignore"):  # rows that see no key (padding) give NaN
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
  return np.einsum("bkgts,bskd->btkgd", p, v)


def _padding(b, t):
  """Key validity [B,T]: row 0 left-padded by 7, row 1 right-padded by 20, the rest full."""
  valid = np.ones((b, t), bool)
  valid[0, :7] = False
  valid[1, t - 20:] = False
  return valid


def _causal_mask(valid):
  t = valid.shape[1]
  return jnp.asarray(np.tril(np.ones((t, t), bool))[None] & valid[:, None, :])


def _cache_case(key, lengths, t, s, nk, g, dh, dtype):
  """Queries of T new tokens at slots lengths[b] + t over a random S-slot cache.

  Every slot holds random keys/values, filled or not, so a slot a query must
  not see changes the output if it leaks in.
  """
  q, k, v = _qkv(key, len(lengths), t, nk, g, dh, dtype, s=s)
  slots = jnp.asarray(lengths, jnp.int32)[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
  needed = jnp.int32(max(lengths) + t)
  visible = np.arange(s)[None, None, :] <= np.asarray(slots)[:, :, None]
  k_bkhs, v_bksh = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
  return (q, k_bkhs, v_bksh, slots, needed), (q, k, v, visible)


class AttentionTest(parameterized.TestCase):

  @parameterized.product(impl=("reference", "xla"), dtype=("float32", "bfloat16"), g=(1, 3))
  def test_causal_with_padding_matches(self, impl, dtype, g):
    # T = 150: the reference's three query blocks of 64; GQA when g > 1.
    b, t, nk, dh = 3, 150, 2, 16
    q, k, v = _qkv(jax.random.key(0), b, t, nk, g, dh, jnp.dtype(dtype))
    valid = _padding(b, t)
    mask = _causal_mask(valid)
    got = jax.jit(_attention.causal_attention, static_argnums=(4, 5))(
        q, k, v, mask, jnp.dtype(dtype), impl)
    self.assertEqual(got.shape, (b, t, nk, g, dh))
    self.assertEqual(got.dtype, jnp.dtype(dtype))
    want = _numpy_attention(q, k, v, mask)
    # Padded queries' outputs are unspecified (and unused).
    np.testing.assert_allclose(np.asarray(got, np.float64)[valid], want[valid],
                               atol=_ATOL[dtype])

  def test_causal_gradients_agree(self):
    b, t, nk, g, dh = 3, 150, 2, 2, 16
    q, k, v = _qkv(jax.random.key(1), b, t, nk, g, dh, jnp.float32)
    valid = _padding(b, t)
    mask = _causal_mask(valid)
    # A fixed readout of the valid queries' outputs.
    w = jax.random.normal(jax.random.key(2), q.shape) * valid[:, :, None, None, None]

    def grads(impl):
      loss = lambda q, k, v: jnp.sum(  # noqa: E731
          w * _attention.causal_attention(q, k, v, mask, jnp.float32, impl))
      return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)

    want = grads("reference")
    self.assertGreater(float(jnp.abs(want[1]).max()), 0.1)
    for got, ref in zip(grads("xla"), want):
      np.testing.assert_allclose(got, ref, atol=2e-5)

  def test_pallas_tpu_kernel_in_interpret_mode_matches(self):
    # The TPU flash kernel's own code, interpreted on CPU (slow: float32
    # only): GQA heads repeated, padding as segment ids, T = 2 blocks of 128.
    b, t, nk, g, dh = 3, 256, 1, 2, 16
    q, k, v = _qkv(jax.random.key(3), b, t, nk, g, dh, jnp.float32)
    valid = _padding(b, t)
    mask = _causal_mask(valid)
    with pltpu.force_tpu_interpret_mode():
      got = _attention._causal_pallas(q, k, v, mask, jnp.float32)
    want = _attention.causal_attention(q, k, v, mask, jnp.float32, "reference")
    np.testing.assert_allclose(got[valid], want[valid], atol=_ATOL["float32"])

  @parameterized.product(impl=("reference", "xla"), dtype=("float32", "bfloat16"), g=(1, 3))
  def test_prefill_into_partly_filled_cache_matches(self, impl, dtype, g):
    # S = 80 > one key block of 64: the reference's online-softmax loop.
    args, (q, k, v, visible) = _cache_case(jax.random.key(4), [0, 13, 55], 12, 80, 2, g, 16,
                                           jnp.dtype(dtype))
    got = jax.jit(_attention.cached_attention, static_argnums=(5, 6))(
        *args, jnp.dtype(dtype), impl)
    self.assertEqual(got.dtype, jnp.dtype(dtype))
    np.testing.assert_allclose(np.asarray(got, np.float64), _numpy_attention(q, k, v, visible),
                               atol=_ATOL[dtype])

  @parameterized.product(impl=("reference", "xla"), dtype=("float32", "bfloat16"),
                         s=(80, 1100))
  def test_decode_step_matches(self, impl, dtype, s):
    # One query per row; S = 1100 > 1024: the reference's blocked decode.
    lengths = [0, 5, s - 1]
    args, (q, k, v, visible) = _cache_case(jax.random.key(5), lengths, 1, s, 2, 3, 16,
                                           jnp.dtype(dtype))
    got = jax.jit(_attention.cached_attention, static_argnums=(5, 6))(
        *args, jnp.dtype(dtype), impl)
    np.testing.assert_allclose(np.asarray(got, np.float64), _numpy_attention(q, k, v, visible),
                               atol=_ATOL[dtype])

  @parameterized.product(impl=("reference", "xla"), t=(1, 12))
  def test_layer_of_a_stacked_cache_matches(self, impl, t):
    # Three layers of different random caches, S = 300: a decode step reads
    # key blocks of the stack (the last block overlaps the one before); the
    # other layers must not leak in, and the traced layer index is honoured.
    s, layers = 300, []
    for i in range(3):
      layers.append(_cache_case(jax.random.key(20 + i), [0, 129, s - t], t, s, 2, 2, 16,
                                jnp.float32))
    k_stack = jnp.stack([a[1] for a, _ in layers])
    v_stack = jnp.stack([a[2] for a, _ in layers])
    run = jax.jit(_attention.cached_attention, static_argnums=(5, 6))
    for i in (1, 2):
      (q, _, _, slots, needed), (_, k, v, visible) = layers[i]
      got = run(q, k_stack, v_stack, slots, needed, jnp.float32, impl, jnp.int32(i))
      np.testing.assert_allclose(np.asarray(got, np.float64), _numpy_attention(q, k, v, visible),
                                 atol=_ATOL["float32"])

  def test_cache_rank_must_match_layer(self):
    (q, k, v, slots, needed), _ = _cache_case(jax.random.key(9), [0, 3], 1, 20, 2, 2, 16,
                                              jnp.float32)
    with self.assertRaisesRegex(ValueError, r"rank-5 keys and values with layer=1"):
      _attention.cached_attention(q, k, v, slots, needed, jnp.float32, "reference", 1)
    with self.assertRaisesRegex(ValueError, r"rank-4 keys and values with layer=None"):
      _attention.cached_attention(q, k[None], v[None], slots, needed, jnp.float32)

  @parameterized.parameters("float32", "bfloat16")
  def test_model_logits_agree(self, dtype):
    cfg = CFG.replace(dtype=dtype, param_dtype=dtype)
    params = models.init(cfg, jax.random.key(6))
    b, t = 3, 10
    tokens = jax.random.randint(jax.random.key(7), (b, t), 0, cfg.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = jnp.asarray(np.arange(t)[None] >= np.array([[3], [0], [1]]))

    @functools.partial(jax.jit, static_argnames="config")
    def run(params, config):
      full, _ = models.apply(params, tokens, pos, config=config, attention_mask=mask)
      # Prefill 6 tokens into a cache already holding 0, 2 and 5 slots, then
      # decode one token.
      cache = models.init_cache(config, b, 16, lengths=jnp.array([0, 2, 5]))
      cache = cache.replace(k=jnp.ones_like(cache.k), v=jnp.ones_like(cache.v))
      p_pos = cache.lengths[:, None] + jnp.arange(6)[None]
      prefill, cache = models.apply(params, tokens[:, :6], p_pos, cache, config=config)
      decode, _ = models.apply(params, tokens[:, 6:7], cache.lengths[:, None], cache,
                               config=config)
      return full, prefill, decode

    want = run(params, cfg.replace(attention_impl="reference"))
    got = run(params, cfg.replace(attention_impl="xla"))
    atol = {"float32": 2e-5, "bfloat16": 0.1}[dtype]
    valid = np.asarray(mask)
    np.testing.assert_allclose(got[0][valid], want[0][valid], atol=atol)
    np.testing.assert_allclose(got[1], want[1], atol=atol)
    np.testing.assert_allclose(got[2], want[2], atol=atol)
    # "auto" on CPU is the reference.
    self.assertEqual(jax.default_backend(), "cpu")
    auto = run(params, cfg)
    for a, w in zip(auto, want):
      np.testing.assert_array_equal(a, w)

  @parameterized.parameters(
      # (impl, platform, cached, dtype, head_dim, num_queries, num_keys) -> chosen
      ("auto", "cpu", False, "bfloat16", 64, 256, 256, "reference"),
      ("auto", "cpu", True, "float32", 64, 1, 100, "reference"),
      ("auto", "gpu", False, "bfloat16", 64, 256, 256, "cudnn"),
      ("auto", "gpu", True, "float16", 128, 1, 101, "cudnn"),  # decode: key lengths, no bias
      ("auto", "gpu", True, "bfloat16", 64, 7, 100, "xla"),  # a masked prefill of odd T
      ("auto", "gpu", False, "float32", 64, 256, 256, "xla"),
      ("auto", "gpu", False, "bfloat16", 12, 256, 256, "xla"),
      ("auto", "tpu", False, "bfloat16", 64, 256, 256, "pallas"),
      ("auto", "tpu", False, "bfloat16", 64, 200, 200, "xla"),
      ("auto", "tpu", True, "bfloat16", 64, 1, 256, "xla"),
      ("pallas", "tpu", True, "bfloat16", 64, 1, 256, "xla"),
      ("reference", "gpu", False, "bfloat16", 64, 256, 256, "reference"),
      ("xla", "cpu", True, "float32", 64, 1, 100, "xla"),
  )
  def test_select_impl(self, impl, platform, cached, dtype, dh, t, s, chosen):
    self.assertEqual(
        _attention.select_impl(impl, cached=cached, dtype=dtype, head_dim=dh, num_queries=t,
                               num_keys=s, platform=platform), chosen)

  @parameterized.parameters(
      ("cudnn", "cpu", "float16", 256, "runs only on the 'gpu' backend"),
      ("pallas", "gpu", "float32", 256, "runs only on the 'tpu' backend"),
      ("cudnn", "gpu", "float32", 256, "bfloat16 or float16 activations, not float32"),
      ("pallas", "tpu", "float32", 200, "multiple of 128, not 200"),
      ("flash", "cpu", "float32", 256, "must be one of"),
  )
  def test_select_impl_rejects(self, impl, platform, dtype, t, message):
    with self.assertRaisesRegex(ValueError, f"ModelConfig.attention_impl='{impl}': .*{message}"):
      _attention.select_impl(impl, cached=False, dtype=dtype, head_dim=64, num_queries=t,
                             num_keys=t, platform=platform)

  def test_bad_field_values_raise_before_compile(self):
    with self.assertRaisesRegex(ValueError, r"ModelConfig.attention_impl='flash': must be one of "
                                            r"\('auto', 'reference', 'xla', 'cudnn', 'pallas'\)"):
      CFG.replace(attention_impl="flash")
    # A valid name the CPU cannot run fails while tracing (eval_shape never
    # compiles).
    cfg = CFG.replace(attention_impl="cudnn")
    params = jax.eval_shape(lambda k: models.init(cfg, k), jax.random.key(0))
    tokens = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    with self.assertRaisesRegex(ValueError, "ModelConfig.attention_impl='cudnn': runs only on "
                                            "the 'gpu' backend; this one is 'cpu'"):
      jax.eval_shape(functools.partial(models.apply, config=cfg), params, tokens, tokens)


if __name__ == "__main__":
  absltest.main()
