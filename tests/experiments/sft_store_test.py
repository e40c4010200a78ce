"""experiments.sft_store: SFT parameters on disk, read back only for the same SFT fields."""

import os
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from experiments import compare
from experiments import fields
from experiments import sft_store
from experiments.configs import tiny
from jagent import models
from jagent import train


def _params():
  """A small pytree with a leading run axis of 2 (a dict of two arrays)."""
  return {"w": jnp.arange(12, dtype=jnp.float32).reshape(2, 3, 2),
          "b": jnp.asarray([[0.5], [-1.5]], jnp.bfloat16)}


class SftFieldsTest(absltest.TestCase):

  def test_algorithms_of_one_game_share_their_sft_fields(self):
    # experiments.compare hands one SFT stage to every algorithm of a game,
    # tree rollouts included (their scoped overrides touch rollout.tree only).
    tree = ["tree_grpo:rollout.tree.fork_turns=(1, 2)", "tree_grpo:rollout.tree.branches=(2, 4)"]
    env = "Sokoban-6x6-1box-v0"
    got = [sft_store.sft_fields(compare.apply_overrides(tiny.get_config(f"{env},{a}"), env, tree))
           for a in ("starpo_s", "gigpo", "tree_grpo", "ppo", "grpo")]
    for other in got[1:]:
      self.assertEqual(other, got[0])

  def test_fields_by_dotted_name_without_the_rl_stage(self):
    c = tiny.get_config("Sokoban-6x6-1box-v0,starpo_s")
    got = sft_store.sft_fields(c)
    self.assertEqual(got["sft.steps"], c.sft.steps)
    self.assertEqual(got["seed"], c.seed)
    self.assertEqual(got["rollout.num_groups"], c.rollout.num_groups)
    self.assertEqual(got["env"], "Sokoban-6x6-1box-v0")
    for name in got:
      self.assertFalse(name.startswith(("rl.", "algorithm", "eval.", "rollout.tree.")), name)
    self.assertNotIn("rollout.tree", got)
    c.sft.learning_rate = 1e-2
    self.assertEqual(sft_store.sft_fields(c)["sft.learning_rate"], 1e-2)


class SaveLoadTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = os.path.join(tempfile.mkdtemp(prefix="sft_store_test_"), "sft")
    c = tiny.get_config("Bandit-v0,starpo_s")
    self.configs = [c, c.copy_and_resolve_references()]
    self.configs[1].seed = c.seed + 1

  def test_nothing_saved_reads_none_without_building_the_target(self):
    never = lambda: self.fail("target built")  # noqa: E731
    self.assertIsNone(sft_store.load(self.dir, self.configs, never))

  def test_round_trip_for_runs_that_differ_only_in_rl_fields(self):
    sft_store.save(self.dir, self.configs, _params())
    later = [c.copy_and_resolve_references() for c in self.configs]
    for c in later:
      c.algorithm, c.rl.steps, c.rl.learning_rate = "gigpo", 7, 3e-4
    got = sft_store.load(self.dir, later, lambda: jax.eval_shape(_params))
    for k, want in _params().items():
      self.assertEqual(got[k].dtype, want.dtype)
      np.testing.assert_array_equal(np.asarray(got[k], np.float32), np.asarray(want, np.float32))
    with self.assertRaisesRegex(ValueError, "already exists"):
      sft_store.save(self.dir, self.configs, _params())

  def test_lora_adapters_are_saved_without_their_bases(self):
    # A shared-base sweep's SFT parameters are adapters without base (None);
    # in a sweep whose runs keep their own base, the bases come back from the
    # target (the runs' initial, frozen ones), as jagent.train.Checkpointer does.
    lora = models.LoraConfig(rank=2)
    pair = models.LoraPair(a=jnp.ones((2, 1, 3, 2)), b=jnp.full((2, 1, 2, 3), 0.25))
    base = {"w": jnp.arange(6.0).reshape(2, 3)}
    for saved_base, target_base in ((None, None), (base, jax.tree.map(jnp.negative, base))):
      with self.subTest(shared_base=saved_base is None):
        directory = os.path.join(self.dir, str(saved_base is None))
        sft_store.save(directory, self.configs, models.LoraParams(saved_base, {"q": pair}, lora))
        got = sft_store.load(directory, self.configs, lambda b=target_base: models.LoraParams(
            b, {"q": jax.tree.map(jnp.zeros_like, pair)}, lora))
        self.assertEqual(got.config, lora)
        np.testing.assert_array_equal(got.adapters["q"].a, pair.a)
        np.testing.assert_array_equal(got.adapters["q"].b, pair.b)
        if target_base is None:
          self.assertIsNone(got.base)
        else:
          np.testing.assert_array_equal(got.base["w"], target_base["w"])

  def test_other_sft_fields_are_refused_naming_the_field(self):
    sft_store.save(self.dir, self.configs, _params())
    never = lambda: self.fail("target built")  # noqa: E731
    other = [c.copy_and_resolve_references() for c in self.configs]
    other[1].sft.steps = self.configs[1].sft.steps + 1
    with self.assertRaisesRegex(
        fields.ConfigError,
        rf"run 1: sft.steps is {other[1].sft.steps}, the recorded SFT used "
        rf"{self.configs[1].sft.steps}\); delete that directory"):
      sft_store.load(self.dir, other, never)
    with self.assertRaisesRegex(fields.ConfigError, "2 runs recorded, 1 runs now"):
      sft_store.load(self.dir, self.configs[:1], never)

  def test_damaged_parameters_are_named(self):
    sft_store.save(self.dir, self.configs, _params())
    for root, _, files in os.walk(os.path.join(self.dir, "checkpoints", "0", "state")):
      for name in files:
        with open(os.path.join(root, name), "wb") as f:
          f.write(b"\0")
    with self.assertRaisesRegex(train.CheckpointError, "do not read back"):
      sft_store.load(self.dir, self.configs, lambda: jax.eval_shape(_params))


if __name__ == "__main__":
  absltest.main()
