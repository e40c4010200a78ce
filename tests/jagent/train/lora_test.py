"""Training LoRA adapters: adapter-only gradients and optimizer state, checkpoints, reference."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from jagent import models
from jagent import sharding
from jagent import train
from jagent import transforms

# D=24, F=40, H*Dh=16, 16 tokens a micro-batch: a weight gradient of the
# stacked gate/up [D, 2, F] has a shape no other product has.
CFG = models.ModelConfig(vocab_size=32, embed_dim=24, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, mlp_dim=40)
LORA = models.LoraConfig(rank=2, alpha=4.0)
B, S, G = 8, 8, 4
OBJ = transforms.grpo(kl_coef=0.1)  # needs a reference policy
TC = train.TrainConfig(model=CFG, actor_optimizer=train.OptimizerConfig(learning_rate=1e-2),
                       num_minibatches=2, num_microbatches=2)
REWARDS = np.array([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.2], np.float32)


def _lora(lora=LORA):
  return models.init_lora(models.init(CFG, jax.random.key(0)), CFG, lora, jax.random.key(5))


def _state(lora=LORA, critic=None):
  return train.init_train_state(_lora(lora), jax.random.key(1), config=TC, critic=critic,
                                reference=True, objective=OBJ)


def _batch():
  tokens = jax.random.randint(jax.random.key(1), (B, S), 1, CFG.vocab_size)
  mask = jnp.zeros((B, S)).at[:, 4:].set(1.0)
  rewards = jnp.zeros((B, S)).at[:, -1].set(jnp.asarray(REWARDS))
  return transforms.Batch(tokens=tokens, loss_mask=mask, rewards=rewards, group_size=G)


def _dot_shapes(jaxpr, out):
  """Output shapes of every dot_general in ``jaxpr`` and its sub-jaxprs."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      out.add(tuple(eqn.outvars[0].aval.shape))
    for v in eqn.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          _dot_shapes(inner, out)
  return out


def _assert_same(test, a, b):
  test.assertEqual(jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class LoraTrainTest(absltest.TestCase):

  def test_optimizer_state_covers_the_adapters_only(self):
    state = _state(critic="model")
    adapter_shapes = {x.shape for x in jax.tree.leaves(state.params.adapters)}
    for opt in (state.opt_state, state.critic_opt_state):
      shapes = {x.shape for x in jax.tree.leaves(opt)} - {()}
      self.assertTrue(shapes, "no moments")
      # Adam's mu and nu only: no moment shaped like a base weight.
      self.assertEqual(shapes - adapter_shapes, {(CFG.embed_dim,)} if opt is
                       state.critic_opt_state else set())
    n_adapter = sum(x.size for x in jax.tree.leaves(state.params.adapters))
    self.assertEqual(sum(x.size for x in jax.tree.leaves(state.opt_state)) - 2 * 1,
                     2 * n_adapter)  # mu + nu, plus two scalar counts
    # The reference is the base itself: a marker without arrays.
    self.assertEqual(jax.tree.leaves(state.ref_params), [])

  def test_gradients_reach_the_adapters_only(self):
    """No weight gradient of the base is ever formed (checked in the jaxpr)."""
    batch = _batch()

    def dots(state):
      jaxpr = jax.make_jaxpr(lambda s: train.train_step(s, batch, objective=OBJ, config=TC))(
          state)
      return _dot_shapes(jaxpr.jaxpr, set())

    # d/dW of the stacked gate/up [D, 2, F], in either order of its axes.
    base_grad = {(CFG.embed_dim, 2, CFG.mlp_dim), (2, CFG.mlp_dim, CFG.embed_dim)}
    plain = train.init_train_state(models.init(CFG, jax.random.key(0)), jax.random.key(1),
                                   config=TC, reference=True, objective=OBJ)
    self.assertTrue(base_grad & dots(plain))  # the check can fail
    self.assertFalse(base_grad & dots(_state()))

  def test_step_moves_adapters_and_keeps_the_base(self):
    state = _state()
    new, m = train.train_step(state, _batch(), objective=OBJ, config=TC)
    self.assertEqual(float(m["train/updates_applied"]), 2.0)
    # First step: policy == base, so the reference KL is exactly 0.
    self.assertEqual(float(m["actor/ref_kl_k1"]), 0.0)
    self.assertEqual(float(m["first_minibatch/policy/ratio"]), 1.0)
    _assert_same(self, new.params.base, state.params.base)
    self.assertIs(new.params.config, LORA)
    b_before = state.params.adapters["q"].b[0]
    self.assertGreater(float(jnp.abs(new.params.adapters["q"].b[0] - b_before).max()), 0.0)
    # The next step's reference is still the base, the policy has moved.
    _, m2 = train.train_step(new, _batch(), objective=OBJ, config=TC)
    self.assertNotEqual(float(m2["actor/ref_kl_k1"]), 0.0)

  def test_sft_with_dropout(self):
    state = _state(models.LoraConfig(rank=2, alpha=4.0, dropout=0.3))
    batch = _batch()
    a, ma = train.sft_step(state, batch, config=TC)
    _assert_same(self, a.params.base, state.params.base)
    self.assertEqual(float(ma["train/applied"]), 1.0)
    # The same step without dropout moves the adapters differently (B: A has
    # no gradient while B is zero).
    b, _ = train.sft_step(_state(), batch, config=TC)
    self.assertFalse(np.array_equal(a.params.adapters["up"].b, b.params.adapters["up"].b))

  def test_checkpoint_holds_adapters_only_and_resumes_exactly(self):
    workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
    state, _ = train.train_step(_state(), _batch(), objective=OBJ, config=TC)
    ckpt = train.Checkpointer(workdir, keep=1)
    ckpt.save(1, state)
    ckpt.wait()
    # The target's base is the reloaded one (same seed); the rest is abstract.
    fresh = _state()
    target = jax.eval_shape(lambda: fresh)
    target = models.join_frozen(models.split_frozen(target)[0],
                                models.split_frozen(fresh)[1])
    restored, _ = ckpt.restore(target)
    ckpt.close()
    _assert_same(self, restored, state)
    # On disk: the adapters and their Adam moments, no array of the base.
    with open(os.path.join(workdir, "checkpoints", "1", "state", "_METADATA")) as f:
      saved = json.load(f)["tree_metadata"]
    self.assertEqual([k for k in saved if "'base', " in k], [])
    self.assertIn("('opt_state', '1', '0', 'mu', 'adapters', 'q', 'b')", saved)
    a, ma = train.train_step(state, _batch(), objective=OBJ, config=TC)
    b, mb = train.train_step(restored, _batch(), objective=OBJ, config=TC)
    _assert_same(self, a, b)
    self.assertEqual(ma, mb)

  def test_shardings_and_export_merged(self):
    state = _state(critic="model")
    mesh = sharding.make_mesh("", jax.local_devices()[:1])
    placed = sharding.place_state(lambda s: s, state, mesh=mesh)
    _assert_same(self, placed, state)
    workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
    new, _ = train.train_step(state, _batch(), objective=OBJ, config=TC)
    train.export_policy(new.params, CFG, workdir)
    loaded, _ = models.load_hf_checkpoint(workdir)
    tokens = _batch().tokens
    pos = jnp.broadcast_to(jnp.arange(S), tokens.shape)
    np.testing.assert_allclose(models.apply(loaded, tokens, pos, config=CFG)[0],
                               models.apply(new.params, tokens, pos, config=CFG)[0],
                               atol=1e-5, rtol=0)


if __name__ == "__main__":
  absltest.main()
