"""jagent.sharding: mesh specs, logical-axis rules, and sharded train / rollout steps.

The sharded train step and rollout on meshes (data, fsdp, tensor) = (8,1,1),
(2,2,2) and (1,2,4) of the 8 fake CPU devices (tests/conftest.py) must give
the single-device ``train.train_step`` / ``rollout.make_rollout`` results,
the rollout also with bounded-history rows (``history_turns`` 0 and 2).
The (1,2,4) mesh also exercises the divisibility fallback: 2 key/value heads
do not split over ``tensor:4``.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import envs_jax
from jagent import losses
from jagent import models
from jagent import rollout
from jagent import sharding
from jagent import tokenizers
from jagent import train
from jagent import transforms

TOK = tokenizers.load_tiny_tokenizer()
# heads 4, mlp 32 / 64, vocab 512 and embed 16 / 32 divide every mesh below;
# 2 kv heads do not divide tensor:4 (the fallback).
TRAIN_CFG = models.ModelConfig(vocab_size=64, embed_dim=16, num_layers=1, num_heads=4,
                               num_kv_heads=2, head_dim=4, mlp_dim=32, tie_embeddings=False)
ROLLOUT_CFG = models.ModelConfig(vocab_size=512, embed_dim=32, num_layers=1, num_heads=4,
                                 num_kv_heads=2, head_dim=8, mlp_dim=64, tie_embeddings=False,
                                 eos_id=TOK.eos_id, pad_id=0)
# The cube splits rows over data and fsdp and parameters over fsdp and tensor
# (all three axes at once); fsdp:2,tensor:4 adds the fallback for 2 kv heads
# over 4 tensor shards. A pure data:8 mesh (a compile per step test, ~12-15 s
# each) added no path the cube's data axis does not take; data:4 runs in
# tests/experiments/multihost_test.py, and data:8 in the error tests below.
MESHES = (("cube", "data:2,fsdp:2,tensor:2"), ("fsdp2_tensor4", "fsdp:2,tensor:4"))
ROWS = P(("data", "fsdp"))


def _lake_text_env() -> rollout.TextEnv:
  """FrozenLake 4x4 in the compact prompt (no system text, no think)."""
  env, _ = envs_jax.make("FrozenLake-4x4-v0")
  return rollout.TextEnv(env, TOK, rollout.PromptConfig.compact(
      system="", instructions="", think=False))


def _spec(mesh, *axes):
  return NamedSharding(mesh, P(*axes))


class MakeMeshTest(parameterized.TestCase):

  @parameterized.parameters(
      ("data:2,fsdp:2,tensor:2", (2, 2, 2)),
      ("", (8, 1, 1)),
      ("  ", (8, 1, 1)),
      ("tensor:8", (1, 1, 8)),
      ("fsdp:-1", (1, 8, 1)),
      (" tensor : 4 , data : -1 ", (2, 1, 4)),
      ("fsdp:2,tensor:-1", (1, 2, 4)),
      ("data:8,fsdp:1", (8, 1, 1)),
  )
  def test_parse(self, spec, shape):
    self.assertEqual(sharding.parse_mesh_spec(spec, 8), shape)
    mesh = sharding.make_mesh(spec)
    self.assertEqual(mesh.axis_names, ("data", "fsdp", "tensor"))
    self.assertEqual(tuple(mesh.shape.values()), shape)
    self.assertEqual(mesh.axis_types, (jax.sharding.AxisType.Auto,) * 3)
    self.assertEqual(sorted(d.id for d in mesh.devices.flat),
                     sorted(d.id for d in jax.devices()))
    self.assertEqual(sharding.rows_size(mesh), shape[0] * shape[1])

  def test_devices_subset(self):
    devices = jax.devices()[2:6]
    mesh = sharding.make_mesh("data:2,tensor:2", devices)
    self.assertEqual(dict(mesh.shape), {"data": 2, "fsdp": 1, "tensor": 2})
    self.assertEqual({d.id for d in mesh.devices.flat}, {d.id for d in devices})
    self.assertEqual(sharding.make_mesh("", devices[:1]).devices.shape, (1, 1, 1))

  @parameterized.parameters(
      ("model:8", "'model'"),            # unknown axis
      ("data:4,data:2", "duplicate axis 'data'"),
      ("data:two", "'two'"),            # not an integer
      ("data:2.5", "'2.5'"),
      ("data:3", "multiply to 3"),      # product != 8
      ("data:2,fsdp:2", "multiply to 4"),
      ("data:-1,fsdp:-1", "second -1"),
      ("data:0,fsdp:8", "size 0"),
      ("tensor:-2", "size -2"),
      ("data", "'data' is not 'axis:size'"),
      ("data:2,", "'' is not 'axis:size'"),
      ("fsdp:3,data:-1", "do not divide"),
  )
  def test_errors(self, spec, message):
    with self.assertRaisesRegex(ValueError, message):
      sharding.make_mesh(spec)

  def test_one_device_is_singular(self):
    with self.assertRaisesRegex(ValueError, r"multiply to 2, not the 1 device\.$"):
      sharding.parse_mesh_spec("data:2", 1)
    with self.assertRaisesRegex(ValueError, r"do not divide the 1 device, so"):
      sharding.parse_mesh_spec("fsdp:2,data:-1", 1)
    with self.assertRaisesRegex(ValueError, r"multiply to 2, not the 8 devices\.$"):
      sharding.parse_mesh_spec("data:2", 8)

  def test_other_errors(self):
    with self.assertRaisesRegex(ValueError, "empty devices"):
      sharding.make_mesh("", [])
    with self.assertRaisesRegex(ValueError, "must be a str"):
      sharding.make_mesh(8)


class RulesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = jax.eval_shape(lambda k: models.init(TRAIN_CFG, k), jax.random.key(0))

  def test_default_rules(self):
    rules = dict(sharding.DEFAULT_RULES)
    self.assertEqual(rules["batch"], ("data", "fsdp"))
    self.assertEqual(rules["embed"], "fsdp")
    for name in ("q_heads", "kv_heads", "mlp", "vocab"):
      self.assertEqual(rules[name], "tensor")
    self.assertIsNone(rules["head_dim"])
    self.assertIsNone(rules["cache_seq"])
    # Every logical name the model uses has a rule.
    names = {n for spec in jax.tree.leaves(
        (models.param_axes(TRAIN_CFG), models.cache_axes(TRAIN_CFG)),
        is_leaf=lambda x: isinstance(x, P)) for n in spec}
    self.assertEqual(names, set(rules))

  def test_param_shardings_with_fallback(self):
    mesh = sharding.make_mesh("fsdp:2,tensor:4")
    sh = sharding.param_shardings(self.params, mesh)
    layer = sh.layers  # every layer leaf leads with the replicated [L] axis
    self.assertEqual(sh.embed, _spec(mesh, "tensor", "fsdp"))      # [V, D]
    self.assertEqual(sh.lm_head, _spec(mesh, "fsdp", "tensor"))    # [D, V]
    self.assertEqual(sh.final_norm, _spec(mesh, "fsdp"))
    self.assertEqual(layer.wq, _spec(mesh, None, "fsdp", "tensor"))  # [L, D, H=4, Dh]
    self.assertEqual(layer.bq, _spec(mesh, None, "tensor"))        # [L, H=4, Dh]
    # K = 2 key/value heads do not split 4 ways: that dimension is replicated.
    self.assertEqual(layer.wk, _spec(mesh, None, "fsdp"))          # [L, D, K=2, Dh]
    self.assertEqual(layer.bk, _spec(mesh))
    self.assertEqual(layer.wo, _spec(mesh, None, "tensor", None, "fsdp"))  # [L, H, Dh, D]
    self.assertEqual(layer.w_down, _spec(mesh, None, "tensor", "fsdp"))  # [L, F, D]
    # On (2,2,2) they split 2 ways.
    cube = sharding.param_shardings(self.params, sharding.make_mesh("data:2,fsdp:2,tensor:2"))
    self.assertEqual(cube.layers.wk.spec, P(None, "fsdp", "tensor"))
    self.assertEqual(cube.layers.bk.spec, P(None, "tensor"))

  def test_fallback_on_embed_and_vocab(self):
    odd = TRAIN_CFG.replace(embed_dim=12, vocab_size=66, mlp_dim=36, num_heads=2,
                            num_kv_heads=1)
    params = jax.eval_shape(lambda k: models.init(odd, k), jax.random.key(0))
    mesh = sharding.make_mesh("fsdp:8")
    sh = sharding.param_shardings(params, mesh)
    # 12 % 8 != 0: embed replicated; tensor (size 1) divides everything.
    self.assertEqual(sh.embed.spec, P("tensor"))
    self.assertEqual(sh.layers.w_up.spec, P(None, None, "tensor"))
    mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
    sh = sharding.param_shardings(params, mesh)
    self.assertEqual(sh.embed.spec, P("tensor", "fsdp"))           # 66 % 2, 12 % 2
    self.assertEqual(sh.layers.wk.spec, P(None, "fsdp"))           # K = 1
    mesh = sharding.make_mesh("tensor:8")
    sh = sharding.param_shardings(params, mesh)
    self.assertEqual(sh.embed.spec, P(None, "fsdp"))               # 66 % 8 != 0
    self.assertEqual(sh.layers.w_gate.spec, P(None, "fsdp"))       # 36 % 8 != 0
    # Arrays placed with these shardings hold the right blocks.
    real = models.init(odd, jax.random.key(0))
    placed = jax.device_put(real, sharding.param_shardings(real, mesh))
    np.testing.assert_array_equal(placed.embed, real.embed)
    self.assertEqual(placed.layers.wq.addressable_shards[0].data.shape,
                     (odd.num_layers, 12, 2, 4))

  def test_logical_to_sharding(self):
    mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
    self.assertEqual(sharding.logical_to_sharding(P("batch", None), (4, 3), mesh).spec,
                     P(("data", "fsdp")))
    # 6 rows do not split 4 ways.
    self.assertEqual(sharding.logical_to_sharding(P("batch"), (6,), mesh).spec, P())
    self.assertEqual(sharding.logical_to_sharding(P(), (), mesh).spec, P())
    # Earlier rules win a contested mesh axis; user rules are plain data.
    rules = (("mlp", "fsdp"), ("embed", "fsdp"))
    self.assertEqual(sharding.logical_to_sharding(P("embed", "mlp"), (4, 4), mesh, rules).spec,
                     P(None, "fsdp"))
    with self.assertRaisesRegex(ValueError, "'pipeline'"):
      sharding.logical_to_sharding(P("embed"), (4,), mesh, (("embed", "pipeline"),))
    with self.assertRaisesRegex(ValueError, "pair"):
      sharding.logical_to_sharding(P("embed"), (4,), mesh, (("embed",),))
    with self.assertRaisesRegex(ValueError, r"shape \(4,\)"):
      sharding.logical_to_sharding(P("embed", "mlp"), (4,), mesh)
    with self.assertRaisesRegex(ValueError, "Params"):
      sharding.param_shardings({"w": jnp.zeros(3)}, mesh)

  def test_train_state_shardings(self):
    mesh = sharding.make_mesh("fsdp:2,tensor:4")
    tc = train.TrainConfig(model=TRAIN_CFG)
    state = jax.eval_shape(lambda p, k: train.init_train_state(
        p, k, config=tc, critic="model", reference=True, objective=transforms.make("ppo")),
        self.params, jax.random.key(1))
    sh = sharding.train_state_shardings(state, mesh)
    params = sharding.param_shardings(self.params, mesh)
    rep = sharding.replicated(mesh)
    self.assertEqual(sh.params, params)
    self.assertEqual(sh.ref_params, params)
    self.assertEqual(sh.critic_params.trunk, params)
    self.assertEqual(sh.critic_params.head.w, _spec(mesh, "fsdp"))
    self.assertEqual(sh.critic_params.head.b, rep)
    for s in (sh.step, sh.rng, sh.num_updates, sh.skipped_nonfinite, sh.skipped_empty):
      self.assertEqual(s, rep)
    self.assertTrue(all(s == rep for s in jax.tree.leaves(sh.objective_state)))
    # Adam's moments mirror their parameters; the step counts are replicated.
    for opt, p in ((sh.opt_state, params), (sh.critic_opt_state, sh.critic_params)):
      adam = [s for s in jax.tree.leaves(opt, is_leaf=lambda x: hasattr(x, "mu"))
              if hasattr(s, "mu")]
      self.assertLen(adam, 1)
      self.assertEqual(adam[0].mu, p)
      self.assertEqual(adam[0].nu, p)
      self.assertEqual(adam[0].count, rep)
      n_param = len(jax.tree.leaves(p))
      self.assertEqual(sum(s != rep for s in jax.tree.leaves(opt)),
                       2 * sum(s != rep for s in jax.tree.leaves(p)))
      self.assertGreater(len(jax.tree.leaves(opt)), 2 * n_param)
    with self.assertRaisesRegex(ValueError, "TrainState"):
      sharding.train_state_shardings(state.params, mesh)

  def test_rows(self):
    mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
    batch = transforms.Batch(tokens=jnp.arange(24).reshape(8, 3),
                             loss_mask=jnp.ones((8, 3)), scores=jnp.arange(8.0),
                             metrics={"m": jnp.float32(1.0)}, group_size=2)
    self.assertEqual(sharding.batch_sharding(mesh), NamedSharding(mesh, ROWS))
    sh = sharding.rows_shardings(batch, mesh)
    self.assertEqual(sh.tokens, NamedSharding(mesh, ROWS))
    self.assertEqual(sh.metrics["m"], sharding.replicated(mesh))
    placed = sharding.shard_rows(batch, mesh)
    self.assertEqual(placed.group_size, 2)
    np.testing.assert_array_equal(placed.tokens, batch.tokens)
    # 4 row blocks of 2 rows, each on the 2 devices of one tensor pair.
    blocks = {(s.index[0].start, s.data.shape) for s in placed.tokens.addressable_shards}
    self.assertEqual(blocks, {(0, (2, 3)), (2, (2, 3)), (4, (2, 3)), (6, (2, 3))})
    with self.assertRaisesRegex(ValueError, r"B=6 are not divisible by data x fsdp = 4"):
      sharding.shard_rows(transforms.Batch(tokens=jnp.zeros((6, 3))), mesh)
    with self.assertRaisesRegex(ValueError, r"\[4, 8\]"):
      sharding.rows_shardings({"a": jnp.zeros(8), "b": jnp.zeros((4, 2))}, mesh)


class ActivationRulesTest(absltest.TestCase):
  """The model's hidden states keep their rows on data x fsdp under activation_rules."""

  def _forward(self, mesh):
    """A jitted trunk forward: weights by their logical axes, tokens replicated."""
    params = models.init(TRAIN_CFG.replace(num_layers=2), jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (8, 6)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (8, 6))
    fn = jax.jit(lambda p, t: models.hidden_states(p, t, positions, config=TRAIN_CFG.replace(
        num_layers=2))[0], in_shardings=(sharding.param_shardings(params, mesh),
                                         sharding.replicated(mesh)))
    return fn, params, tokens

  def test_rows_constrained_values_equal(self):
    mesh = sharding.make_mesh("fsdp:8")
    fn, params, tokens = self._forward(mesh)
    want = models.hidden_states(params, tokens, jnp.broadcast_to(jnp.arange(6), (8, 6)),
                                config=TRAIN_CFG.replace(num_layers=2))[0]
    # Left alone, the partitioner lays the hidden states out like the weights
    # (D over fsdp, every row on every device) ...
    rows = NamedSharding(mesh, ROWS)
    free = fn.lower(params, tokens).compile().output_shardings
    self.assertFalse(free.is_equivalent_to(rows, 3), free)
    # ... under the rules their rows are split: one row per device.
    with sharding.activation_rules(mesh):
      got = fn(params, tokens)
      pinned = fn.lower(params, tokens).compile().output_shardings
    self.assertTrue(pinned.is_equivalent_to(rows, 3), pinned)
    self.assertEqual(got.addressable_shards[0].data.shape, (1, 6, 16))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  def test_identity_outside_and_bad_rules(self):
    x = jnp.arange(8.0)
    self.assertIs(models._partitioning.constrain(x, P("batch")), x)  # pylint: disable=protected-access
    mesh = sharding.make_mesh("fsdp:8")
    with self.assertRaisesRegex(ValueError, "'pipeline'"):
      with sharding.activation_rules(mesh, (("batch", "pipeline"),)):
        pass


class ShardedTrainStepTest(parameterized.TestCase):
  """PPO with a value-head critic: one step with 2 shuffled minibatches."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # eps 1e-4: Adam divides each gradient by its own magnitude, so with eps
    # 1e-8 a gradient that is exactly 0 up to float noise (e.g. bk's: keys'
    # biases shift all scores of a query equally) moves by +-lr either way.
    opt = train.OptimizerConfig(learning_rate=1e-3, eps=1e-4)
    cls.config = train.TrainConfig(model=TRAIN_CFG, actor_optimizer=opt, critic_optimizer=opt,
                                   num_minibatches=2, shuffle_minibatches=True)
    cls.objective = transforms.make("ppo")
    b, s = 8, 12
    rng = np.random.default_rng(0)
    mask = np.zeros((b, s), np.float32)
    mask[:, 5:] = 1.0
    rewards = np.zeros((b, s), np.float32)
    rewards[:, -1] = rng.normal(size=b)
    cls.batch = transforms.Batch(
        tokens=jnp.asarray(rng.integers(1, TRAIN_CFG.vocab_size, (b, s)), jnp.int32),
        loss_mask=jnp.asarray(mask), rewards=jnp.asarray(rewards),
        scores=jnp.asarray(rewards.sum(1)), terminated=jnp.ones((b,), bool), group_size=2)
    params = models.init(TRAIN_CFG, jax.random.key(0))
    cls.state = train.init_train_state(params, jax.random.key(1), config=cls.config,
                                       critic="head", objective=cls.objective)
    cls.expected = train.train_step(cls.state, cls.batch, objective=cls.objective,
                                    config=cls.config)

  @parameterized.named_parameters(*MESHES)
  def test_equals_single_device(self, spec):
    mesh = sharding.make_mesh(spec)
    sh = sharding.train_state_shardings(self.state, mesh)
    step = sharding.shard_train_step(self.objective, self.config, mesh, sh)
    placed = jax.device_put(jax.tree.map(jnp.copy, self.state), sh)
    new, metrics = step(placed, self.batch)
    self.assertTrue(placed.params.embed.is_deleted())  # donated
    want_state, want_metrics = self.expected
    self.assertEqual(int(new.step), 1)
    self.assertEqual(int(new.num_updates), 2)
    # The update moved the parameters well beyond the tolerance.
    moved = np.max(np.abs(np.asarray(want_state.params.layers.wq[0])
                          - np.asarray(self.state.params.layers.wq[0])))
    self.assertGreater(moved, 1e-4)
    # rtol 1e-5 of each array's scale: sharded sums add in another order.
    paths = jax.tree_util.tree_flatten_with_path(want_state)[0]
    for (path, want), got in zip(paths, jax.tree.leaves(new)):
      want = np.asarray(want)
      scale = float(np.max(np.abs(want))) if want.size and want.dtype.kind == "f" else 0.0
      np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * scale,
                                 err_msg=jax.tree_util.keystr(path))
    self.assertEqual(set(metrics), set(want_metrics))
    for k, v in want_metrics.items():
      np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    self.assertGreater(float(metrics["loss/value"]), 0.01)
    # Outputs carry the requested shardings.
    for got, want in zip(jax.tree.leaves(new), jax.tree.leaves(sh)):
      self.assertEqual(got.sharding, want)
    for v in metrics.values():
      self.assertTrue(v.sharding.is_fully_replicated)
    data, fsdp, tensor = mesh.shape.values()
    wq = new.params.layers.wq  # [L, D=16, H=4, Dh=4] over (-, fsdp, tensor)
    num_layers = wq.shape[0]
    self.assertEqual(wq.addressable_shards[0].data.shape,
                     (num_layers, 16 // fsdp, 4 // tensor, 4))
    mu = new.opt_state[1][0].mu.layers.wq
    self.assertEqual(mu.sharding, wq.sharding)
    wk = new.params.layers.wk  # K = 2: split only when tensor divides it
    self.assertEqual(wk.addressable_shards[0].data.shape,
                     (num_layers, 16 // fsdp, 2 // tensor if 2 % tensor == 0 else 2, 4))
    del data

  def test_errors(self):
    mesh = sharding.make_mesh("data:8")
    sh = sharding.train_state_shardings(self.state, mesh)
    step = sharding.shard_train_step(self.objective, self.config, mesh, sh)
    half = jax.tree.map(lambda x: x[:4], self.batch)
    with self.assertRaisesRegex(ValueError, r"B=4 are not divisible by data x fsdp = 8"):
      step(self.state, half)
    with self.assertRaisesRegex(ValueError, "state_shardings"):
      sharding.shard_train_step(self.objective, self.config, mesh, sh.params)
    other = sharding.train_state_shardings(self.state, sharding.make_mesh("tensor:8"))
    with self.assertRaisesRegex(ValueError, "on the given mesh"):
      sharding.shard_train_step(self.objective, self.config, mesh, other)


@pytest.mark.heavy
class ShardedRolloutTest(parameterized.TestCase):
  """A 2-turn FrozenLake rollout of 8 rows by a random policy; and the same
  8 episodes as 4-turn bounded-history rollouts (32 turn rows)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.text_env = _lake_text_env()
    cls.config = rollout.RolloutConfig(num_groups=4, group_size=2, max_turns=2,
                                       max_tokens_per_turn=8)
    cls.params = models.init(ROLLOUT_CFG, jax.random.key(0))
    cls.expected = {}  # history_turns -> the one-device trajectory, built on first use

  def _config(self, k):
    if k < 0:
      return self.config
    # 4 turns: with k = 2 the window of turn 3 drops turn 0. Random replies
    # are never valid, so every episode plays all 4 turns.
    return dataclasses.replace(self.config, max_turns=4, history_turns=k)

  def _expected(self, k):
    if k not in self.expected:
      self.expected[k] = rollout.make_rollout(self.text_env, ROLLOUT_CFG, self._config(k))(
          self.params, jax.random.key(1))
    return self.expected[k]

  # The full history on the cube (rows over data x fsdp = 4), a bounded
  # history on fsdp:2,tensor:4 (rows over 2; the kv-head fallback). Each
  # case compiles two rollouts (~30 s on 2 cores); the other pairings add no
  # path: the parameters' placement does not depend on history_turns, and
  # k = 0 is the same window code as k = 2 with no history segments (checked
  # against the host reference per game in rollout/history_test.py).
  @parameterized.named_parameters(("cube", MESHES[0][1], -1),
                                  ("fsdp2_tensor4_history2", MESHES[1][1], 2))
  def test_equals_single_device(self, spec, k):
    mesh = sharding.make_mesh(spec)
    config = self._config(k)
    fn = sharding.shard_rollout(self.text_env, ROLLOUT_CFG, config, mesh)
    key = jax.random.key(1)
    if spec == MESHES[0][1]:
      # The reset_keys variant (no extra compile of a reference): these are
      # the keys make_rollout draws from ``key`` by default (its first split).
      reset_keys = jax.random.split(jax.random.split(key, 3)[0], config.num_groups)
      got = fn(self.params, key, reset_keys)
    else:
      got = fn(self.params, key)
    want = self._expected(k)
    self.assertGreater(int(np.sum(want.loss_mask)), 60)  # the policy did reply
    names = ("tokens", "loss_mask", "turn_ids", "length", "num_turns", "end_reason",
             "reply_lengths", "format_valid", "anchor_hashes", "group_ids", "scores",
             "token_rewards", "turn_rewards")
    if k >= 0:
      names += ("row_valid", "row_episode", "row_turn")
    for name in names:
      np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5)
    self.assertEqual((got.group_size, got.history_turns), (2, k))
    for leaf in jax.tree.leaves(got):
      self.assertEqual(leaf.sharding, NamedSharding(mesh, ROWS))
    n = sharding.rows_size(mesh)
    rows = 8 * (1 if k < 0 else config.max_turns)
    self.assertEqual(got.tokens.shape[0], rows)
    self.assertEqual(got.tokens.addressable_shards[0].data.shape[0], rows // n)
    if k >= 0:
      np.testing.assert_array_equal(got.num_turns, 4)  # every row holds a turn
      # Each device holds whole episodes: its turn rows are those of its episode rows.
      for tok, ep in zip(got.row_episode.addressable_shards, got.scores.addressable_shards):
        self.assertEqual(tok.device, ep.device)
        first = ep.index[0].start or 0
        np.testing.assert_array_equal(
            np.unique(np.asarray(tok.data)), np.arange(first, first + 8 // n))

  def test_rows_not_divisible(self):
    config = rollout.RolloutConfig(num_groups=3, group_size=2, max_turns=2,
                                   max_tokens_per_turn=8)
    with self.assertRaisesRegex(ValueError, r"B = num_groups x group_size = 6 .* = 4"):
      sharding.shard_rollout(self.text_env, ROLLOUT_CFG, config,
                             sharding.make_mesh("data:2,fsdp:2,tensor:2"))


class ShardedEvaluateTest(absltest.TestCase):
  """``train.evaluate`` of 8 FrozenLake levels in 2 chunks: one device vs meshes."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    text_env = _lake_text_env()
    config = rollout.RolloutConfig(num_groups=4, group_size=2, max_turns=2,
                                   max_tokens_per_turn=8, temperature=0.5)
    # In a dict: a function class attribute would bind as a method.
    cls.fns = {"rollout": rollout.make_rollout(text_env, ROLLOUT_CFG, config)}
    cls.params = models.init(ROLLOUT_CFG, jax.random.key(0))
    cls.reset_keys = jax.random.split(jax.random.key(7), 8)
    cls.key = jax.random.key(3)
    program = jax.jit(train.eval_program(cls.fns["rollout"]))
    cls.want, cls.want_first = train.evaluate(program, cls.params, cls.reset_keys, cls.key, 4)

  def test_chunks_average_the_chunk_metrics(self):
    program = jax.jit(train.eval_program(self.fns["rollout"]))
    chunks = [program(self.params, jax.random.fold_in(self.key, i),
                      self.reset_keys[4 * i:4 * (i + 1)])[1] for i in range(2)]
    self.assertEqual(set(self.want), set(chunks[0]))
    for k, v in self.want.items():
      self.assertIsInstance(v, float)
      self.assertEqual(v, (float(chunks[0][k]) + float(chunks[1][k])) / 2, k)
    self.assertEqual(self.want_first.tokens.shape[0], 8)  # 4 levels x G = 2
    with self.assertRaisesRegex(ValueError, "6 evaluation states .* num_groups=4"):
      train.evaluate(program, self.params, self.reset_keys[:6], self.key, 4)

  def test_one_device_mesh_is_bit_for_bit(self):
    mesh = sharding.make_mesh("", jax.devices()[:1])
    program = sharding.shard_eval_program(self.fns["rollout"], mesh)
    got, first = train.evaluate(program, self.params, self.reset_keys, self.key, 4)
    self.assertEqual(got, self.want)
    np.testing.assert_array_equal(sharding.to_host(first).tokens, self.want_first.tokens)

  def test_mesh_equals_one_device(self):
    mesh = sharding.make_mesh(MESHES[0][1])
    program = sharding.shard_eval_program(self.fns["rollout"], mesh)
    got, first = train.evaluate(program, self.params, self.reset_keys, self.key, 4)
    self.assertGreater(self.want["reply_tokens"], 1.0)  # the policy did reply
    self.assertEqual(set(got), set(self.want))
    for k, v in self.want.items():
      self.assertAlmostEqual(got[k], v, places=6, msg=k)
    self.assertEqual(first.tokens.sharding, NamedSharding(mesh, ROWS))
    host = sharding.to_host(first)
    self.assertIsInstance(host.tokens, np.ndarray)
    np.testing.assert_array_equal(host.tokens, self.want_first.tokens)
    samples = train.decode_samples(host, TOK, 2)
    self.assertLen(samples, 2)
    self.assertEqual(samples[0]["turns"], int(self.want_first.num_turns[0]))


class PlacementTest(absltest.TestCase):
  """``place_state`` / ``train_state_target`` / ``to_host`` on the cube mesh."""

  @pytest.mark.smoke
  def test_place_gather_and_restore_target(self):
    config = train.TrainConfig(model=TRAIN_CFG, actor_optimizer=train.OptimizerConfig(
        learning_rate=1e-3))
    params = models.init(TRAIN_CFG, jax.random.key(0))

    def make(p):
      return train.init_train_state(p, jax.random.key(1), config=config, critic="head")

    mesh = sharding.make_mesh(MESHES[0][1])
    placed = sharding.place_state(make, params, mesh=mesh)
    want = make(params)
    shardings = sharding.train_state_shardings(want, mesh)
    for (path, got), s in zip(jax.tree.leaves_with_path(placed), jax.tree.leaves(shardings)):
      self.assertEqual(got.sharding, s, jax.tree_util.keystr(path))
    self.assertEqual(placed.params.layers.wq.sharding, shardings.params.layers.wq)
    host = sharding.to_host(placed)
    self.assertEqual(jax.tree.structure(host), jax.tree.structure(want))
    for got, w in zip(jax.tree.leaves(host), jax.tree.leaves(jax.device_get(want))):
      self.assertIsInstance(got, np.ndarray)
      np.testing.assert_array_equal(got, w)
    target = sharding.train_state_target(jax.eval_shape(make, params), mesh)
    for t, w, s in zip(jax.tree.leaves(target), jax.tree.leaves(want),
                       jax.tree.leaves(shardings)):
      self.assertIsInstance(t, jax.ShapeDtypeStruct)
      self.assertEqual((t.shape, t.dtype, t.sharding), (w.shape, w.dtype, s))
    with self.assertRaisesRegex(ValueError, "TrainState"):
      sharding.place_state(lambda p: p, params, mesh=mesh)


@pytest.mark.heavy
class ShardedRLIterationTest(absltest.TestCase):
  """shard_rl_iteration on (2,2,2) == jagent.train.rl_iteration on one device.

  FrozenLake, 4 groups x 2 rows by a random 1-layer policy, PPO with a
  value head (nonzero advantages), the top half of the groups kept (4 rows:
  the kept-rows constraint applies).
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    text_env = _lake_text_env()
    rc = rollout.RolloutConfig(num_groups=4, group_size=2, max_turns=2, max_tokens_per_turn=8)
    # In a dict: a function class attribute would bind as a method.
    cls.fns = {"rollout": rollout.make_rollout(text_env, ROLLOUT_CFG, rc)}
    opt = train.OptimizerConfig(learning_rate=1e-3, eps=1e-4)  # eps: see ShardedTrainStepTest
    cls.config = train.TrainConfig(model=ROLLOUT_CFG, actor_optimizer=opt, critic_optimizer=opt,
                                   old_logprobs="sampler")
    cls.objective = transforms.make("ppo")
    cls.kwargs = dict(num_keep=2, filter_config=losses.FilterConfig("top_fraction", 0.5, True))
    params = models.init(ROLLOUT_CFG, jax.random.key(0))
    cls.state = train.init_train_state(params, jax.random.key(1), config=cls.config,
                                       critic="head", objective=cls.objective)
    cls.key = jax.random.key(2)
    cls.expected = jax.jit(lambda st, k: train.rl_iteration(
        st, k, rollout_fn=cls.fns["rollout"], objective=cls.objective, config=cls.config,
        **cls.kwargs))(cls.state, cls.key)

  def test_equals_single_device(self):
    mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
    sh = sharding.train_state_shardings(self.state, mesh)
    step = sharding.shard_rl_iteration(self.fns["rollout"], self.objective, self.config, mesh, sh,
                                       **self.kwargs)
    placed = jax.device_put(jax.tree.map(jnp.copy, self.state), sh)
    new, metrics = step(placed, self.key)
    self.assertTrue(placed.params.embed.is_deleted())  # donated
    want_state, want_metrics = self.expected
    self.assertEqual(int(new.step), 1)
    self.assertEqual(set(metrics), set(want_metrics))  # the same metrics as rl_iteration
    for k, v in want_metrics.items():
      np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    self.assertGreater(float(want_metrics["rollout/sampled_tokens"]), 30)
    moved = np.max(np.abs(np.asarray(want_state.params.layers.wq[0])
                          - np.asarray(self.state.params.layers.wq[0])))
    self.assertGreater(moved, 1e-4)
    paths = jax.tree_util.tree_flatten_with_path(want_state)[0]
    for (path, want), got in zip(paths, jax.tree.leaves(new)):
      want = np.asarray(want)
      scale = float(np.max(np.abs(want))) if want.size and want.dtype.kind == "f" else 0.0
      np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * scale,
                                 err_msg=jax.tree_util.keystr(path))
    for got, want in zip(jax.tree.leaves(new), jax.tree.leaves(sh)):
      self.assertEqual(got.sharding, want)
    for v in metrics.values():
      self.assertTrue(v.sharding.is_fully_replicated)

  def test_errors(self):
    mesh = sharding.make_mesh("data:8")
    sh = sharding.train_state_shardings(self.state, mesh)
    with self.assertRaisesRegex(ValueError, "state_shardings"):
      sharding.shard_rl_iteration(self.fns["rollout"], self.objective, self.config, mesh,
                                  sh.params, **self.kwargs)
    with self.assertRaisesRegex(ValueError, r"value must lie in \(0.0, 1.0\]; got 2.0"):
      sharding.shard_rl_iteration(self.fns["rollout"], self.objective, self.config, mesh, sh,
                                  num_keep=2,
                                  filter_config=losses.FilterConfig("top_fraction", 2.0))
    with self.assertRaisesRegex(ValueError, "filter_config must be a jagent.losses.FilterConfig"):
      sharding.shard_rl_iteration(self.fns["rollout"], self.objective, self.config, mesh, sh,
                                  num_keep=2, filter_config=("top_fraction", 0.5))


class ShardedSFTStepTest(absltest.TestCase):

  def test_equals_single_device_and_global_rows(self):
    config = train.TrainConfig(model=TRAIN_CFG, actor_optimizer=train.OptimizerConfig(
        learning_rate=1e-3, eps=1e-4))
    rng = np.random.default_rng(0)
    mask = np.zeros((8, 12), np.float32)
    mask[:, 4:] = 1.0
    batch = transforms.Batch(tokens=rng.integers(1, TRAIN_CFG.vocab_size, (8, 12)).astype(
        np.int32), loss_mask=mask)
    state = train.init_train_state(models.init(TRAIN_CFG, jax.random.key(0)),
                                   jax.random.key(1), config=config)
    want_state, want_metrics = train.sft_step(state, batch, config=config)
    mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
    rows = sharding.global_rows(batch, mesh)  # one process: equals shard_rows
    placed = sharding.shard_rows(batch, mesh)
    for a, b in zip(jax.tree.leaves(rows), jax.tree.leaves(placed)):
      self.assertEqual(a.sharding, b.sharding)
      np.testing.assert_array_equal(a, b)
    with self.assertRaisesRegex(ValueError, "B=6"):
      sharding.global_rows(jax.tree.map(lambda x: x[:6], batch), mesh)
    sh = sharding.train_state_shardings(state, mesh)
    step = sharding.shard_sft_step(config, mesh, sh)
    new, metrics = step(jax.device_put(jax.tree.map(jnp.copy, state), sh), rows)
    self.assertEqual(set(metrics), set(want_metrics))
    for k, v in want_metrics.items():
      np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    for got, want in zip(jax.tree.leaves(new), jax.tree.leaves(want_state)):
      want = np.asarray(want)
      scale = float(np.max(np.abs(want))) if want.size and want.dtype.kind == "f" else 0.0
      np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5 * scale)
    self.assertEqual(new.params.layers.wq.sharding, sh.params.layers.wq)


if __name__ == "__main__":
  absltest.main()
