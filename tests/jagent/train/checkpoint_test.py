"""Checkpointer: exact round trip, keep-N, interrupted saves; export_policy."""

import os
import shutil
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jagent import models
from jagent import train
from jagent import transforms

CFG = models.ModelConfig(vocab_size=32, embed_dim=32, num_layers=1,
                         num_heads=2, num_kv_heads=1, head_dim=16, mlp_dim=64)
TC = train.TrainConfig(model=CFG, actor_optimizer=train.OptimizerConfig(
    learning_rate=1e-2, weight_decay=0.0, warmup_steps=5), num_microbatches=2)
# A stateful objective (running reward normaliser) so the objective state
# holds real arrays inside NamedTuples.
OBJ = transforms.objective(
    transforms.chain(transforms.normalize_rewards(), transforms.compute_grpo()),
    transforms.make_loss(transforms.pg_term()))


def _state():
  params = models.init(CFG, jax.random.key(0))
  return train.init_train_state(params, jax.random.key(1), config=TC,
                                critic="model", reference=True, objective=OBJ)


def _batch():
  tokens = jax.random.randint(jax.random.key(1), (8, 8), 1, CFG.vocab_size)
  return transforms.Batch(tokens=tokens,
                          loss_mask=jnp.ones((8, 8)).at[:, 0].set(0.0))


def _assert_same(test, a, b):
  test.assertEqual(jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    test.assertEqual((x.shape, x.dtype), (y.shape, y.dtype))
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class CheckpointTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.workdir, ignore_errors=True)

  def test_round_trip_is_exact_and_resumes(self):
    state = _state()
    state, _ = train.sft_step(state, _batch(), config=TC)  # non-trivial opt state
    ckpt = train.Checkpointer(self.workdir, keep=2)
    self.assertIsNone(ckpt.latest_step())
    meta = {"data_position": 128, "config": {"lr": 0.01, "name": "tiny"}}
    ckpt.save(1, state, meta)
    self.assertEqual(ckpt.latest_step(), 1)
    restored, got_meta = ckpt.restore(jax.eval_shape(_state))
    ckpt.close()
    self.assertEqual(got_meta, meta)
    _assert_same(self, state, restored)
    # optax NamedTuples come back as themselves, not lists.
    self.assertIsInstance(restored.opt_state[1][0], optax.ScaleByAdamState)
    self.assertIsInstance(restored.critic_params, train.CriticParams)
    # Resuming gives exactly the same next step.
    a, ma = train.sft_step(state, _batch(), config=TC)
    b, mb = train.sft_step(restored, _batch(), config=TC)
    _assert_same(self, a, b)
    self.assertEqual(float(ma["sft/nll"]), float(mb["sft/nll"]))
    # A new Checkpointer on the same directory sees it; metadata alone too.
    again = train.Checkpointer(self.workdir)
    self.assertEqual(again.restore_metadata(), meta)
    again.close()

  def test_keep_n_and_interrupted_save(self):
    state = _state()
    ckpt = train.Checkpointer(self.workdir, keep=2)
    for step in (1, 2, 3, 4):
      ckpt.save(step, state.replace(step=jnp.int32(step)), {"step": step})
    self.assertEqual(ckpt.all_steps(), [3, 4])
    ckpt.close()
    # Simulate a save of step 5 killed mid-write: a partial copy in orbax's
    # temporary directory, never renamed.
    root = os.path.join(self.workdir, "checkpoints")
    tmp = os.path.join(root, "5.orbax-checkpoint-tmp-1700000000000000")
    shutil.copytree(os.path.join(root, "4"), tmp)
    for dirpath, _, files in os.walk(tmp):
      for f in files:
        with open(os.path.join(dirpath, f), "wb") as fh:
          fh.write(b"\x00garbage")
    ckpt = train.Checkpointer(self.workdir, keep=2)
    self.assertEqual(ckpt.latest_step(), 4)
    restored, meta = ckpt.restore(state)
    self.assertEqual(meta, {"step": 4})
    self.assertEqual(int(restored.step), 4)
    # The run goes on: saving step 5 for real works and becomes the latest.
    ckpt.save(5, state.replace(step=jnp.int32(5)), {"step": 5})
    self.assertEqual(ckpt.all_steps(), [4, 5])
    self.assertEqual(int(ckpt.restore(state)[0].step), 5)
    with self.assertRaisesRegex(ValueError, "step 9"):
      ckpt.restore(state, step=9)
    ckpt.close()
    with self.assertRaisesRegex(ValueError, "keep"):
      train.Checkpointer(self.workdir, keep=0)

  def test_export_policy_round_trip(self):
    params = models.init(CFG, jax.random.key(3))
    path = os.path.join(self.workdir, "hf")
    train.export_policy(params, CFG, path)
    loaded, cfg = models.load_hf_checkpoint(path)
    self.assertEqual(cfg.embed_dim, CFG.embed_dim)
    _assert_same(self, params, loaded)


if __name__ == "__main__":
  absltest.main()
