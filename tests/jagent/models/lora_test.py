"""Tests of LoRA adapters: exact no-op at init, merged == unmerged, config checks."""

import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from jagent import models

CFG = models.get_config("tiny", vocab_size=64, embed_dim=32, num_layers=2, mlp_dim=48,
                        head_dim=8)
LLAMA = CFG.replace(family="llama", qkv_bias=False, tie_embeddings=False)
B, T = 2, 7


@functools.partial(jax.jit, static_argnames=("config",))
def _logits(params, tokens, config, dropout_key=None):
  pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  return models.apply(params, tokens, pos, config=config, dropout_key=dropout_key)[0]


def _randomize_b(lora, key):
  """The adapters with B drawn N(0, 0.05^2) (a trained-looking adapter)."""
  leaves, tdef = jax.tree.flatten(lora.adapters, is_leaf=lambda x: isinstance(x, models.LoraPair))
  keys = jax.random.split(key, len(leaves))
  leaves = [p.replace(b=0.05 * jax.random.normal(k, p.b.shape)) for p, k in zip(leaves, keys)]
  return lora.replace(adapters=jax.tree.unflatten(tdef, leaves))


class LoraTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tokens = jax.random.randint(jax.random.key(1), (B, T), 0, CFG.vocab_size)

  @parameterized.named_parameters(("qwen2", CFG), ("llama", LLAMA))
  def test_zero_b_gives_the_base_logits_exactly(self, cfg):
    base = models.init(cfg, jax.random.key(0))
    lora = models.init_lora(base, cfg, models.LoraConfig(rank=4, alpha=8.0),
                            jax.random.key(2))
    np.testing.assert_array_equal(_logits(lora, self.tokens, cfg),
                                  _logits(base, self.tokens, cfg))
    # Every projection adapted, each A non-zero, each B zero.
    self.assertEqual(set(lora.adapters), set(models.LORA_MODULES))
    for pair in lora.adapters.values():
      self.assertEqual(pair.a.shape[0], cfg.num_layers)
      self.assertEqual(pair.b.shape[0], cfg.num_layers)
      for a in pair.a:  # each layer's A drawn, within its bound
        self.assertGreater(float(jnp.abs(a).max()), 0.0)
        self.assertLessEqual(float(jnp.abs(a).max()), 1.0 / np.sqrt(np.prod(a.shape[:-1])))
      self.assertFalse(np.array_equal(pair.a[0], pair.a[1]))  # layers draw their own A
      np.testing.assert_array_equal(pair.b, 0.0)

  @parameterized.named_parameters(
      ("all_qwen2", CFG, "all-linear"), ("all_llama", LLAMA, "all-linear"),
      ("k_v_up", CFG, "k,v,up"))
  def test_merged_equals_unmerged(self, cfg, modules):
    base = models.init(cfg, jax.random.key(0))
    lora = _randomize_b(models.init_lora(base, cfg, models.LoraConfig(
        rank=3, alpha=6.0, target_modules=modules), jax.random.key(2)), jax.random.key(3))
    unmerged = np.asarray(_logits(lora, self.tokens, cfg))
    merged = np.asarray(_logits(models.merge_lora(lora), self.tokens, cfg))
    np.testing.assert_allclose(unmerged, merged, atol=1e-5, rtol=0)
    # The adapters do change the model (so the comparison can fail).
    self.assertGreater(np.abs(unmerged - np.asarray(_logits(base, self.tokens, cfg))).max(),
                       1e-3)

  def test_merge_by_hand(self):
    """merge_lora of one pair equals W + alpha / r * A @ B computed in numpy."""
    base = models.init(CFG, jax.random.key(0))
    lora = _randomize_b(models.init_lora(base, CFG, models.LoraConfig(
        rank=2, alpha=5.0, target_modules=("o",)), jax.random.key(2)), jax.random.key(3))
    pair = lora.adapters["o"]
    a = np.asarray(pair.a[1]).reshape(-1, 2)
    want = np.asarray(base.layers.wo[1]) + 2.5 * (a @ np.asarray(pair.b[1])).reshape(
        base.layers.wo.shape[1:])
    np.testing.assert_allclose(models.merge_lora(lora).layers.wo[1], want, atol=1e-7)
    np.testing.assert_array_equal(models.merge_lora(lora).layers.wq, base.layers.wq)

  def test_merged_and_unmerged_sampling_give_the_same_tokens(self):
    base = models.init(CFG, jax.random.key(0))
    lora = _randomize_b(models.init_lora(base, CFG, models.LoraConfig(rank=4, alpha=8.0),
                                         jax.random.key(2)), jax.random.key(3))
    prompt = jax.random.randint(jax.random.key(4), (8, 5), 1, CFG.vocab_size)
    lengths = jnp.array([5, 4, 3, 5, 2, 5, 1, 5], jnp.int32)
    out = {}
    for merge in (True, False):
      sp = models.SamplingConfig(max_new_tokens=12, temperature=1.0, merge_lora=merge)
      out[merge] = models.generate(lora, prompt, lengths, jax.random.key(5), config=CFG,
                                   sampling=sp)
    np.testing.assert_array_equal(out[True].tokens, out[False].tokens)
    np.testing.assert_allclose(out[True].logprobs, out[False].logprobs, atol=1e-5)
    # And the adapters matter: the base samples other tokens.
    plain = models.generate(base, prompt, lengths, jax.random.key(5), config=CFG,
                            sampling=models.SamplingConfig(max_new_tokens=12))
    self.assertFalse(np.array_equal(plain.tokens, out[True].tokens))

  def test_bfloat16_base_merges_in_the_compute_dtype(self):
    # A bfloat16 base under float32 compute (experiments' lora.base_dtype):
    # merged with min_dtype float32 it is the unmerged forward to float32
    # rounding, and the sampled log-probs match; merged into bfloat16 weights
    # the small A B is rounded away in part, so the logits move by far more.
    base = jax.tree.map(lambda w: w.astype(jnp.bfloat16), models.init(CFG, jax.random.key(0)))
    lora = models.init_lora(base, CFG, models.LoraConfig(rank=4, alpha=8.0), jax.random.key(2))
    lora = _randomize_b(lora, jax.random.key(3))
    lora = lora.replace(adapters=jax.tree.map(lambda x: 0.05 * x, lora.adapters))  # small A B
    unmerged = np.asarray(_logits(lora, self.tokens, CFG))
    merged = models.merge_lora(lora, min_dtype=jnp.float32)
    layer = merged.layers
    self.assertEqual({getattr(layer, w).dtype for w in ("wq", "wk", "wv", "wo", "w_gate",
                                                        "w_up", "w_down")}, {jnp.dtype("float32")})
    self.assertEqual(merged.embed.dtype, jnp.bfloat16)  # not adapted: kept as it is
    np.testing.assert_allclose(np.asarray(_logits(merged, self.tokens, CFG)), unmerged,
                               atol=1e-5, rtol=0)
    rounded = np.asarray(_logits(models.merge_lora(lora), self.tokens, CFG))
    self.assertGreater(np.abs(rounded - unmerged).max(), 1e-4)
    prompt = jax.random.randint(jax.random.key(4), (4, 5), 1, CFG.vocab_size)
    lengths = jnp.array([5, 4, 3, 5], jnp.int32)
    out = [models.generate(lora, prompt, lengths, jax.random.key(5), config=CFG,
                           sampling=models.SamplingConfig(max_new_tokens=8, merge_lora=m))
           for m in (True, False)]
    np.testing.assert_array_equal(out[0].tokens, out[1].tokens)
    np.testing.assert_allclose(out[0].logprobs, out[1].logprobs, atol=1e-5)

  def test_dropout(self):
    base = models.init(CFG, jax.random.key(0))
    cfg_drop = models.LoraConfig(rank=4, alpha=8.0, dropout=0.5)
    lora = _randomize_b(models.init_lora(base, CFG, cfg_drop, jax.random.key(2)),
                        jax.random.key(3))
    plain = np.asarray(_logits(lora, self.tokens, CFG))
    dropped = np.asarray(_logits(lora, self.tokens, CFG, jax.random.key(4)))
    self.assertGreater(np.abs(plain - dropped).max(), 1e-4)
    # Rate 0 with a key, and zero B with a key, are exact no-ops.
    no_rate = lora.replace(config=models.LoraConfig(rank=4, alpha=8.0, dropout=0.0))
    np.testing.assert_array_equal(_logits(no_rate, self.tokens, CFG, jax.random.key(4)), plain)
    fresh = models.init_lora(base, CFG, cfg_drop, jax.random.key(2))
    np.testing.assert_array_equal(_logits(fresh, self.tokens, CFG, jax.random.key(4)),
                                  _logits(base, self.tokens, CFG))

  def test_split_and_join_frozen(self):
    base = models.init(CFG, jax.random.key(0))
    lora = models.init_lora(base, CFG, models.LoraConfig(rank=2), jax.random.key(2))
    tree = {"policy": lora, "other": jnp.ones(3), "none": None}
    trainable, frozen = models.split_frozen(tree)
    self.assertIsNone(trainable["policy"].base)
    self.assertLen(frozen, 1)
    self.assertIs(frozen[0], base)
    joined = models.join_frozen(trainable, frozen)
    self.assertEqual(jax.tree.structure(joined), jax.tree.structure(tree))
    for x, y in zip(jax.tree.leaves(joined), jax.tree.leaves(tree)):
      self.assertIs(x, y)
    # Without LoRA nothing is cut.
    t2, f2 = models.split_frozen(base)
    self.assertIs(t2, base)
    self.assertEqual(f2, [])
    with self.assertRaisesRegex(ValueError, "2 bases for 1 LoraParams"):
      models.join_frozen(trainable, [base, base])

  def test_axes_match_ranks(self):
    base = models.init(LLAMA, jax.random.key(0))
    lora = models.init_lora(base, LLAMA, models.LoraConfig(rank=2), jax.random.key(2))
    axes = models.lora_axes(lora, models.param_axes(LLAMA))
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731
    leaves = jax.tree.leaves(lora)
    specs = jax.tree.leaves(axes, is_leaf=is_spec)
    self.assertLen(specs, len(leaves))
    for x, s in zip(leaves, specs):
      self.assertLen(s, x.ndim)
    self.assertEqual(axes.adapters["q"].a,
                     jax.sharding.PartitionSpec("layers", "embed", "lora_rank"))

  @parameterized.named_parameters(
      ("rank0", dict(rank=0), "LoraConfig.rank=0"),
      ("rank_negative", dict(rank=-2), "LoraConfig.rank=-2"),
      ("rank_float", dict(rank=2.0), "LoraConfig.rank=2.0"),
      ("alpha", dict(alpha=0.0), "LoraConfig.alpha=0.0"),
      ("dropout", dict(dropout=1.0), "LoraConfig.dropout=1.0"),
      ("unknown", dict(target_modules=("q", "qkv")), r"unknown module name\(s\) \['qkv'\]"),
      ("unknown_str", dict(target_modules="q,lm_head"), "'lm_head'"),
      ("twice", dict(target_modules=("q", "q")), "twice"),
      ("empty", dict(target_modules=()), "LoraConfig.target_modules=()"))
  def test_bad_config(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      models.LoraConfig(**kwargs)

  def test_target_modules_canonical(self):
    self.assertEqual(models.LoraConfig(target_modules="v, q").modules, ("q", "v"))
    self.assertEqual(models.LoraConfig(target_modules=["down", "q"]),
                     models.LoraConfig(target_modules=("q", "down")))
    self.assertEqual(models.LoraConfig().modules, models.LORA_MODULES)
    self.assertEqual(models.LoraConfig(rank=8, alpha=32).scale, 4.0)

  def test_family_without_the_module_is_rejected(self):
    from jagent.models import _lora  # pylint: disable=g-import-not-at-top
    with mock.patch.dict(_lora.FAMILY_MODULES, {"llama": ("q", "k", "v", "o")}):
      with self.assertRaisesRegex(ValueError, r"LoraConfig.target_modules=.*'llama' has no "
                                  r"\['gate', 'up', 'down'\]"):
        models.init_lora(None, LLAMA, models.LoraConfig(), jax.random.key(0))


if __name__ == "__main__":
  absltest.main()
