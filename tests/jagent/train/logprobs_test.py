"""token_logprobs: hand-computed values, alignment, and agreement with the sampler."""

from unittest import mock

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from jagent import models
from jagent import train
from jagent.train import _logprobs

TINY = models.get_config("tiny")


def _zero_layers(params):
  """Every layer weight zero: attention and MLP add nothing to the residual."""
  return params.replace(layers=jax.tree.map(jnp.zeros_like, params.layers))


class TokenLogprobsTest(chex.TestCase):

  def test_two_token_hand_check(self):
    # With zero layer weights the trunk is rms_norm(embed[token]) (final norm
    # scale 1) and the tied head gives logits = E h.
    cfg = models.ModelConfig(vocab_size=7, embed_dim=4, num_layers=1,
                             num_heads=2, num_kv_heads=1, head_dim=2,
                             mlp_dim=8)
    params = _zero_layers(models.init(cfg, jax.random.key(3)))
    emb = np.asarray(params.embed, np.float64) * 50.0  # spread the logits
    params = params.replace(embed=jnp.asarray(emb, jnp.float32))
    t0, t1, temp = 3, 5, 0.7
    e = emb[t0]
    h = e / np.sqrt(np.mean(e * e) + cfg.norm_eps)
    z = (emb @ h) / temp
    logp = z - np.log(np.sum(np.exp(z - z.max()))) - z.max()
    want_lp = logp[t1]
    want_ent = -np.sum(np.exp(logp) * logp)
    out = train.token_logprobs(params, jnp.array([[t0, t1]]), config=cfg,
                               temperature=temp, with_entropy=True)
    chex.assert_shape((out.logprobs, out.entropy), (1, 2))
    np.testing.assert_allclose(np.asarray(out.logprobs),
                               [[0.0, want_lp]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(out.entropy),
                               [[0.0, want_ent]], rtol=1e-5, atol=1e-6)
    self.assertLess(want_lp, -0.01)  # not a degenerate distribution

  def test_hidden_states_then_projection_is_apply(self):
    cfg = TINY.replace(vocab_size=64, embed_dim=32, num_layers=2, mlp_dim=64,
                       head_dim=8)
    params = models.init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, 64)
    pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
    h, cache = models.hidden_states(params, tokens, pos, config=cfg)
    self.assertIsNone(cache)
    chex.assert_shape(h, (2, 6, cfg.embed_dim))
    logits, _ = models.apply(params, tokens, pos, config=cfg)
    np.testing.assert_allclose(np.asarray(h @ params.embed.T),
                               np.asarray(logits), rtol=1e-5, atol=1e-6)

  def test_alignment_prefix_invariance(self):
    # logprobs[s] depends on tokens[:s+1] only; changing token 4 changes
    # position 4 and later, never earlier ones.
    cfg = TINY.replace(vocab_size=64, embed_dim=32, num_layers=2, mlp_dim=64,
                       head_dim=8)
    params = models.init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (1, 8), 0, 64)
    other = tokens.at[0, 4].set((tokens[0, 4] + 1) % 64)
    fn = jax.jit(lambda t: train.token_logprobs(params, t, config=cfg).logprobs)
    a, b = np.asarray(fn(tokens)), np.asarray(fn(other))
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    self.assertTrue(np.all(a[:, 4:] != b[:, 4:]))
    self.assertEqual(a[0, 0], 0.0)

  def test_equals_sampler_logprobs(self):
    params = models.init(TINY, jax.random.key(0))
    b, p, n, temp = 3, 5, 7, 0.8
    prompt = jax.random.randint(jax.random.key(1), (b, p), 3, TINY.vocab_size)
    out = models.generate(
        params, prompt, jnp.full((b,), p), jax.random.key(2), config=TINY,
        sampling=models.SamplingConfig(max_new_tokens=n, temperature=temp))
    np.testing.assert_array_equal(np.asarray(out.lengths), n)
    full = jnp.concatenate([prompt, out.tokens], axis=1)
    lp = train.token_logprobs(params, full, config=TINY, temperature=temp)
    np.testing.assert_allclose(np.asarray(lp.logprobs[:, p:]),
                               np.asarray(out.logprobs), atol=1e-5)
    # A different temperature gives different numbers (the check has teeth).
    lp1 = train.token_logprobs(params, full, config=TINY, temperature=1.0)
    self.assertGreater(
        np.max(np.abs(np.asarray(lp1.logprobs[:, p:] - out.logprobs))), 1e-3)

  def test_masked_projection_equals_full_at_the_mask(self):
    # logprobs_from_hidden(mask=...) computes only the masked positions, in
    # chunks (2 positions per row here, so 10 positions make 5 chunks: row
    # 0's 3 positions fill 2, the last 3 are skipped): values, entropies and parameter/hidden gradients of a masked
    # loss equal the full projection's; other positions are 0.
    cfg = TINY.replace(vocab_size=64, embed_dim=32, num_layers=1, mlp_dim=64,
                       head_dim=8, tie_embeddings=False)
    params = models.init(cfg, jax.random.key(0))
    b, s = 3, 11
    tokens = jax.random.randint(jax.random.key(1), (b, s), 0, 64)
    h = jax.random.normal(jax.random.key(2), (b, s, cfg.embed_dim))
    mask = np.zeros((b, s), np.float32)
    mask[0, 3:6] = 1.0
    mask[2, 9:] = 1.0
    mask[1, 0] = 1.0  # position 0 predicts nothing: stays 0 either way
    w = jax.random.normal(jax.random.key(3), (b, s))

    def loss(params, h, masked):
      out = _logprobs.logprobs_from_hidden(
          params, h, tokens, config=cfg, temperature=0.8, with_entropy=True,
          mask=mask if masked else None)
      return jnp.sum((out.logprobs * w + out.entropy) * mask), out

    with mock.patch.object(_logprobs, "_MASKED_CHUNK", 2):
      (l_m, out_m), g_m = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
          params, h, True)
      batched = jax.vmap(lambda hh: loss(params, hh, True)[1].logprobs)(
          jnp.stack([h, 2 * h]))
    (l_f, out_f), g_f = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        params, h, False)
    on = mask != 0
    on[:, 0] = False
    for got, want in ((out_m.logprobs, out_f.logprobs), (out_m.entropy, out_f.entropy)):
      np.testing.assert_allclose(np.asarray(got)[on], np.asarray(want)[on], atol=1e-5)
      np.testing.assert_array_equal(np.asarray(got)[~on], 0.0)
    np.testing.assert_allclose(l_m, l_f, rtol=1e-5)
    for x, y in zip(jax.tree.leaves(g_m), jax.tree.leaves(g_f)):
      np.testing.assert_allclose(x, y, atol=1e-5)
    self.assertGreater(float(jnp.max(jnp.abs(g_m[0].lm_head))), 1e-3)
    np.testing.assert_allclose(np.asarray(batched[0]), np.asarray(out_m.logprobs), atol=1e-6)

  def test_masked_projection_backward_keeps_the_weights_once(self):
    # The chunk loop's backward must not save the output projection's
    # weights once per chunk (a [chunks, V, D] stack; 46 GiB for
    # Qwen2.5-0.5B at 2,904 tokens): 16 chunks of [V, D] = 4 MiB here, so
    # such a stack alone would need 64 MiB of XLA temporaries.
    cfg = TINY.replace(vocab_size=4096, embed_dim=256, num_layers=1, mlp_dim=64,
                       head_dim=8, tie_embeddings=False)
    params = jax.eval_shape(lambda k: models.init(cfg, k), jax.random.key(0))
    b, s = 2, 129

    def loss(params, h, tokens, mask):
      out = _logprobs.logprobs_from_hidden(params, h, tokens, config=cfg, temperature=1.0,
                                           with_entropy=True, mask=mask)
      return jnp.sum(out.logprobs * mask + out.entropy)

    with mock.patch.object(_logprobs, "_MASKED_CHUNK", 8):
      compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(
          params, jax.ShapeDtypeStruct((b, s, 256), jnp.float32),
          jax.ShapeDtypeStruct((b, s), jnp.int32),
          jax.ShapeDtypeStruct((b, s), jnp.float32)).compile()
    weights = 4096 * 256 * 4
    self.assertLess(compiled.memory_analysis().temp_size_in_bytes, 6 * weights)

  def test_bad_input_raises(self):
    params = models.init(TINY, jax.random.key(0))
    with self.assertRaisesRegex(ValueError, "S >= 2"):
      train.token_logprobs(params, jnp.zeros((2, 1), jnp.int32), config=TINY)
    with self.assertRaisesRegex(ValueError, "temperature"):
      train.token_logprobs(params, jnp.zeros((2, 3), jnp.int32), config=TINY,
                           temperature=0.0)


if __name__ == "__main__":
  absltest.main()
