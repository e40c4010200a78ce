"""Tests of the pure transformer: caching, padding, axes, grad/vmap, sharding."""

import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jagent import models
from jagent import sharding

CFG = models.get_config("tiny", vocab_size=64, embed_dim=32, num_layers=2, mlp_dim=64,
                        head_dim=8)
B, T, S = 3, 10, 16


@functools.partial(jax.jit, static_argnames=("config",))
def _full(params, tokens, config=CFG, attention_mask=None):
  pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return models.apply(params, tokens, pos, config=config, attention_mask=attention_mask)[0]


@jax.jit
def _cached(params, tokens, cache, num_tokens):
  pos = cache.lengths[:, None] + jnp.arange(tokens.shape[1])[None]
  return models.apply(params, tokens, pos, cache, config=CFG, num_tokens=num_tokens)


class TransformerTest(chex.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = models.init(CFG, jax.random.key(0))
    cls.tokens = jax.random.randint(jax.random.key(1), (B, T), 0, CFG.vocab_size)
    cls.full = np.asarray(_full(cls.params, cls.tokens))

  @pytest.mark.smoke
  def test_shapes_dtypes_and_axes_match(self):
    leaves = jax.tree.leaves(self.params)
    axes = jax.tree.leaves(models.param_axes(CFG))
    self.assertLen(axes, len(leaves))
    self.assertEqual(sum(x.size for x in leaves), CFG.num_params())
    for x, a in zip(leaves, axes):
      self.assertLen(a, x.ndim)
      self.assertEqual(x.dtype, jnp.float32)
    cache = models.init_cache(CFG, B, S)
    for x, a in zip(jax.tree.leaves(cache), jax.tree.leaves(models.cache_axes(CFG))):
      self.assertLen(a, x.ndim)
    chex.assert_shape(cache.k, (CFG.num_layers, B, CFG.num_kv_heads, CFG.head_dim, S))
    chex.assert_shape(cache.v, (CFG.num_layers, B, CFG.num_kv_heads, S, CFG.head_dim))
    chex.assert_shape(self.full, (B, T, CFG.vocab_size))

  def test_layers_are_one_scanned_block(self):
    # The program is the same size at any depth: one block, scanned L times.
    def size(num_layers, with_cache):
      cfg = CFG.replace(num_layers=num_layers)
      params = jax.eval_shape(lambda k: models.init(cfg, k), jax.random.key(0))
      cache = models.init_cache(cfg, B, S) if with_cache else None

      def fwd(p):
        pos = jnp.broadcast_to(jnp.arange(T), (B, T))
        return models.apply(p, self.tokens, pos, cache, config=cfg)[0]

      jaxpr = jax.make_jaxpr(jax.grad(lambda p: fwd(p).sum()) if not with_cache else fwd)(
          params)
      text = str(jaxpr)
      self.assertIn(f"length={num_layers}", text)
      return len(text.splitlines())

    for with_cache in (False, True):
      self.assertEqual(size(2, with_cache), size(7, with_cache))

  def test_untied_qkv_biasless_variant(self):
    cfg = CFG.replace(family="llama", qkv_bias=False, tie_embeddings=False)
    p = models.init(cfg, jax.random.key(0))
    self.assertIsNone(p.layers.bq)
    chex.assert_shape(p.lm_head, (cfg.embed_dim, cfg.vocab_size))
    self.assertEqual(sum(x.size for x in jax.tree.leaves(p)), cfg.num_params())

  def test_chunked_prefill_and_decode_match_full_forward(self):
    cache = models.init_cache(CFG, B, S)
    outs = []
    for lo, hi in ((0, 4), (4, 5), (5, 6), (6, 10)):  # prefill, 2 decode steps, prefill
      logits, cache = _cached(self.params, self.tokens[:, lo:hi], cache, None)
      outs.append(logits)
    np.testing.assert_allclose(np.concatenate(outs, 1), self.full, atol=2e-5)
    np.testing.assert_array_equal(cache.lengths, [T] * B)

  def test_per_layer_decode_cache_matches_the_stacked_one(self):
    # A long cache (S = 300 > one stacked decode block of 128): a ragged
    # prefill to slots 133-140, then decode steps, once carrying the stacked
    # cache (blocks read from the stack) and once its per-layer form.
    s, steps = 300, 3
    tokens = jax.random.randint(jax.random.key(3), (B, 140 + steps), 0, CFG.vocab_size)
    n1 = jnp.asarray([133, 140, 137])
    cache = models.init_cache(CFG, B, s)
    _, cache = _cached(self.params, tokens[:, :140], cache, n1)
    split_params, per_layer = models.per_layer_form(self.params, cache)
    self.assertIsInstance(split_params.layers, tuple)
    self.assertIsInstance(per_layer.k, tuple)
    self.assertLen(per_layer.k, CFG.num_layers)
    self.assertEqual(per_layer.max_length, s)
    full = np.asarray(_full(self.params, tokens))
    for i in range(steps):
      tok = tokens[jnp.arange(B), n1 + i][:, None]
      got, per_layer = _cached(split_params, tok, per_layer, None)
      mixed, _ = _cached(self.params, tok, models.per_layer_form(self.params, cache)[1], None)
      want, cache = _cached(self.params, tok, cache, None)
      np.testing.assert_allclose(got, want, atol=1e-6)
      np.testing.assert_allclose(mixed, want, atol=1e-6)
      for b in range(B):
        np.testing.assert_allclose(got[b, 0], full[b, int(n1[b]) + i], atol=5e-5)
    back = models.stacked_cache(per_layer)
    np.testing.assert_allclose(back.k, cache.k, atol=1e-6)
    np.testing.assert_allclose(back.v, cache.v, atol=1e-6)
    np.testing.assert_array_equal(back.lengths, n1 + steps)
    deep = CFG.replace(num_layers=9)
    deep_params = models.init(deep, jax.random.key(0))
    kept, kept_cache = models.per_layer_form(deep_params, models.init_cache(deep, B, s))
    self.assertIs(kept, deep_params)
    self.assertIsInstance(kept_cache.k, jax.Array)
    with self.assertRaisesRegex(ValueError, "per-layer params"):
      models.apply(split_params, tokens[:, :2], jnp.zeros((B, 2), jnp.int32), config=CFG)

  def test_16bit_stacked_cache_decode_makes_no_float32_copy_of_the_cache(self):
    # A deep (scanned) stack with a bfloat16 cache: XLA:CPU computes bfloat16
    # slices and scatters in float32, so a decode step that scattered into or
    # read blocks from the whole stack would hold float32 copies of it (it
    # did: 4.3x the bound below). Its temporaries must stay under half a
    # float32 copy of the keys.
    deep = CFG.replace(num_layers=9, cache_dtype="bfloat16")
    params = jax.eval_shape(lambda: models.init(deep, jax.random.key(0)))
    s = 1024
    cache = jax.eval_shape(lambda: models.init_cache(deep, 4, s))
    tok = jax.ShapeDtypeStruct((4, 1), jnp.int32)
    step = jax.jit(lambda p, t, c: models.apply(p, t, c.lengths[:, None], c, config=deep))
    temp = step.lower(params, tok, cache).compile().memory_analysis().temp_size_in_bytes
    f32_keys = 4 * np.prod(cache.k.shape)
    self.assertLess(temp, f32_keys / 2)

  def test_ragged_rows_with_num_tokens(self):
    # Row b takes n_b tokens in the first call and the rest in a second one.
    n1 = np.array([3, 7, 5])
    first = np.zeros((B, 7), np.int32)
    for b in range(B):
      first[b, :n1[b]] = self.tokens[b, :n1[b]]
    cache = models.init_cache(CFG, B, S)
    l1, cache = _cached(self.params, jnp.asarray(first), cache, jnp.asarray(n1))
    np.testing.assert_array_equal(cache.lengths, n1)
    rest = np.zeros((B, T), np.int32)
    for b in range(B):
      rest[b, :T - n1[b]] = self.tokens[b, n1[b]:]
    l2, cache = _cached(self.params, jnp.asarray(rest), cache, jnp.asarray(T - n1))
    np.testing.assert_array_equal(cache.lengths, [T] * B)
    for b in range(B):
      got = np.concatenate([l1[b, :n1[b]], l2[b, :T - n1[b]]])
      np.testing.assert_allclose(got, self.full[b], atol=2e-5)

  def test_left_padding_with_attention_mask(self):
    pad = 3
    toks = jnp.pad(self.tokens[:, :T - pad], ((0, 0), (pad, 0)))
    mask = jnp.arange(T)[None] >= pad
    pos = jnp.broadcast_to(jnp.maximum(jnp.arange(T) - pad, 0), (B, T))
    got, _ = jax.jit(functools.partial(models.apply, config=CFG))(
        self.params, toks, pos, attention_mask=jnp.broadcast_to(mask, (B, T)))
    np.testing.assert_allclose(got[:, pad:], self.full[:, :T - pad], atol=2e-5)

  def test_logits_at_selects_rows(self):
    idx = jnp.array([0, 9, 4])
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    got, _ = jax.jit(functools.partial(models.apply, config=CFG))(
        self.params, self.tokens, pos, logits_at=idx)
    np.testing.assert_allclose(got, self.full[np.arange(B), idx], atol=2e-5)

  def test_grad_and_vmap_over_params(self):
    def loss(p):
      lg = _full(p, self.tokens)
      return -jnp.mean(jax.nn.log_softmax(lg)[..., 0])
    g = jax.jit(jax.grad(loss))(self.params)
    self.assertEqual(jax.tree.structure(g), jax.tree.structure(self.params))
    self.assertTrue(all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g)))
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), self.params,
                           models.init(CFG, jax.random.key(5)))
    out = jax.vmap(lambda p: _full(p, self.tokens))(stacked)
    np.testing.assert_allclose(out[0], self.full, atol=1e-6)

  def test_remat_keeps_values_and_gradients(self):
    # config.remat wraps the scanned block in jax.checkpoint: same logits
    # and gradients.
    cfg = CFG.replace(remat=True)

    def loss(p, config):
      lg = _full(p, self.tokens, config=config)
      return -jnp.mean(jax.nn.log_softmax(lg)[..., 0])

    np.testing.assert_allclose(_full(self.params, self.tokens, config=cfg), self.full,
                               atol=1e-6)
    g0 = jax.grad(loss)(self.params, CFG)
    g1 = jax.grad(loss)(self.params, cfg)
    chex.assert_trees_all_close(g1, g0, atol=1e-6)
    def remat_blocks(config):  # jax.checkpoint's primitive prints as remat2
      return str(jax.make_jaxpr(loss, static_argnums=1)(self.params, config)).count("remat2[")

    # One checkpointed block, the body of the layer scan (so every layer).
    self.assertEqual(remat_blocks(cfg), 1)
    jaxpr = str(jax.make_jaxpr(loss, static_argnums=1)(self.params, cfg))
    self.assertLess(jaxpr.index("scan["), jaxpr.index("remat2["))
    self.assertEqual(remat_blocks(CFG), 0)

  def test_bfloat16_runs_close_to_float32(self):
    cfg = CFG.replace(dtype="bfloat16", param_dtype="bfloat16")
    p = jax.tree.map(lambda x: x.astype(jnp.bfloat16), self.params)
    got = _full(p, self.tokens, config=cfg)
    self.assertEqual(got.dtype, jnp.float32)
    np.testing.assert_allclose(got, self.full, atol=0.05)

  def test_bfloat16_weights_under_float32_compute_are_exact(self):
    # Weights stored in bfloat16 enter the layer loop as their bits and are
    # cast per layer: the values equal those of the same (rounded) weights
    # stored in float32, bit for bit, with and without a cache.
    half = CFG.replace(param_dtype="bfloat16")
    p16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), self.params)
    p32 = jax.tree.map(lambda x: x.astype(jnp.float32), p16)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    for cache in (None, models.init_cache(CFG, B, S)):
      fwd = jax.jit(lambda p, c, cfg: models.apply(p, self.tokens, pos, c, config=cfg)[0],
                    static_argnums=2)
      want = np.asarray(fwd(p32, cache, CFG))
      np.testing.assert_array_equal(fwd(p16, cache, half), want)
      self.assertGreater(np.max(np.abs(want - self.full)), 1e-4)  # the rounding shows

  def test_bfloat16_cache_writes_equal_a_float32_cache_rounded(self):
    # A 16-bit cache is written layer by layer; the first layer's keys and
    # values must be the float32 cache's, rounded, slot for slot (ragged
    # prefill, then a decode step; writes past S dropped).
    half = CFG.replace(cache_dtype="bfloat16")
    n1 = jnp.asarray([3, 7, 5])

    @functools.partial(jax.jit, static_argnums=0)
    def run(cfg):
      cache = models.init_cache(cfg, B, 9)
      for toks, n in ((self.tokens[:, :7], n1), (self.tokens[:, 7:9], None),
                      (self.tokens[:, 9:10], None)):
        pos = cache.lengths[:, None] + jnp.arange(toks.shape[1])[None]
        _, cache = models.apply(self.params, toks, pos, cache, config=cfg, num_tokens=n)
      return cache

    want, got = run(CFG), run(half)
    self.assertEqual(got.k.dtype, jnp.bfloat16)
    np.testing.assert_array_equal(got.lengths, [6, 10, 8])
    np.testing.assert_array_equal(got.k[0], want.k[0].astype(jnp.bfloat16))
    np.testing.assert_array_equal(got.v[0], want.v[0].astype(jnp.bfloat16))
    self.assertGreater(float(jnp.max(jnp.abs(want.k[0]))), 0.01)

  def test_sharded_params_and_cache(self):
    mesh = jax.make_mesh((2, 4), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rules = (("batch", "data"), ("mlp", "model"), ("q_heads", "model"), ("vocab", "model"))
    shard = sharding.tree_shardings(models.param_axes(CFG), self.params, mesh, rules)
    params = jax.device_put(self.params, shard)
    self.assertEqual(params.layers.w_gate.sharding.spec, jax.P(None, None, "model"))
    cache = models.init_cache(CFG, 4, S)
    cache = jax.device_put(cache, sharding.tree_shardings(models.cache_axes(CFG), cache, mesh,
                                                          rules))
    toks = jnp.concatenate([self.tokens, self.tokens[:1]])
    logits, _ = _cached(params, toks, cache, None)
    np.testing.assert_allclose(logits[:B], self.full, atol=2e-5)

  def test_rope_llama3_scaling_bands(self):
    cfg = models.get_config("llama-3.2-1b")
    inv = models.rope_inv_freq(cfg)
    base = 1.0 / cfg.rope_theta ** (np.arange(0, 64, 2) / 64)
    wavelen = 2 * np.pi / base
    high = wavelen < 8192 / 4
    low = wavelen > 8192 / 1
    np.testing.assert_allclose(inv[high], base[high], rtol=1e-6)
    np.testing.assert_allclose(inv[low], base[low] / 32, rtol=1e-6)
    mid = ~high & ~low
    self.assertTrue(np.all(inv[mid] < base[mid]) and np.all(inv[mid] > base[mid] / 32))

  def test_bad_shapes_raise(self):
    with self.assertRaisesRegex(ValueError, "one shape"):
      models.apply(self.params, self.tokens, self.tokens[:, :2], config=CFG)
    with self.assertRaisesRegex(ValueError, "positive"):
      models.init_cache(CFG, 0, 4)


if __name__ == "__main__":
  absltest.main()
