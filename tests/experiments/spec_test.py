"""experiments.spec.upgrade: configs saved by older versions read as they ran.

Nothing here builds a model or compiles.
"""

from absl.testing import absltest
import ml_collections

from experiments import blocks
from experiments import experiment
from experiments import fields
from experiments import spec
from experiments.configs import tiny

# Each field added since the first saved configs, with the value the runs
# saved before it ran with (written out here, not read from spec).
_OLD_BEHAVIOUR = {
    "mesh": "", "model_dir": "", "remat": False, "compute_dtype": "float32",
    "attention_impl": "auto", "cache_dtype": "",
    "lora.rank": 0, "lora.alpha": 32.0, "lora.dropout": 0.0,
    "lora.target_modules": "all-linear", "lora.base_dtype": None,
    "rollout.history_turns": -1, "rollout.merge_lora": True, "rollout.prefill_chunk": 0,
    "rollout.tree.fork_turns": (), "rollout.tree.branches": (2,), "rollout.tree.expand": (),
    "rollout.tree.trees": 1, "rollout.tree.select": "random",
    "rl.num_microbatches": 1, "rl.empty_stop_steps": 0,
    "sft.expert": "solver", "sft.expert_max_nodes": 1_000_000, "sft.expert_reuse_plans": False,
    "eval.held_out": False,
    "diagnostics.every": 0, "diagnostics.num_rows": 32, "diagnostics.min_reward_std": 0.0,
    "diagnostics.min_entropy": 0.0, "diagnostics.min_mutual_info": 0.0,
}


def _get(config, path):
  node = config
  for part in path.split("."):
    node = node[part]
  return node


def _old_config():
  """The tiny Bandit config without any field added since the first saved runs."""
  c = tiny.get_config("Bandit-v0,starpo_s")
  for group in ("lora", "diagnostics"):  # whole groups added later
    del c[group]
  del c.rollout["tree"]
  for path in _OLD_BEHAVIOUR:
    *groups, name = path.split(".")
    node = c
    for g in groups:
      node = node.get(g)
    if node is not None and name in node:
      del node[name]
  return c


class UpgradeTest(absltest.TestCase):

  def test_old_config_reads_as_it_ran(self):
    old = _old_config()
    self.assertNotIn("history_turns", old.rollout)
    self.assertNotIn("lora", old)
    up = spec.upgrade(old)
    for path, want in _OLD_BEHAVIOUR.items():
      with self.subTest(path):
        got = _get(up, path)
        self.assertEqual(got, want)
        self.assertIs(type(got), type(want))
    self.assertEqual(set(_OLD_BEHAVIOUR), set(spec.LEGACY_DEFAULTS))
    # Not today's tiny.py values where those differ: the old runs' full
    # history, no micro-batches, no diagnostics, plain evaluation levels.
    now = tiny.get_config("Bandit-v0,starpo_s")
    self.assertEqual((now.rollout.history_turns, now.rl.num_microbatches,
                      now.diagnostics.every, now.eval.held_out), (0, 4, 25, True))
    self.assertNotIn("history_turns", old.rollout)  # the input is left as it was
    # What the run builds from it: the full history, one micro-batch.
    self.assertEqual(blocks.rollout_config(up).history_turns, -1)
    self.assertIsNone(blocks.lora_config(up))
    spec.validate(old)

  def test_current_config_is_unchanged(self):
    for arg in ("Bandit-v0,starpo_s", "Sokoban-6x6-1box-v0,grpo"):
      with self.subTest(arg):
        c = tiny.get_config(arg)
        before = c.to_json_best_effort(sort_keys=True)
        up = spec.upgrade(c)
        self.assertIsNot(up, c)
        self.assertEqual(up.to_json_best_effort(sort_keys=True), before)
        self.assertEqual(c.to_json_best_effort(sort_keys=True), before)
        self.assertEqual(spec.upgrade(up).to_json_best_effort(sort_keys=True), before)

  def test_partial_group_keeps_its_values(self):
    c = tiny.get_config("Bandit-v0,starpo_s")
    c.lora = ml_collections.ConfigDict(dict(rank=4, alpha=8.0))  # saved before the rest
    up = spec.upgrade(c)
    self.assertEqual(up.lora.to_dict(), dict(rank=4, alpha=8.0, dropout=0.0,
                                             target_modules="all-linear", base_dtype=None))

  def test_a_value_where_a_group_belongs(self):
    c = tiny.get_config("Bandit-v0,starpo_s")
    with c.ignore_type():
      c.lora = 0
    with self.assertRaisesRegex(ValueError, r"^config\.lora=0: a group of fields is needed"):
      spec.upgrade(c)


if __name__ == "__main__":
  absltest.main()


class RunSpecTest(absltest.TestCase):

  def test_built_once_from_the_config(self):
    c = tiny.get_config("Sokoban-6x6-1box-v0,starpo_s")
    c.compute_dtype = "bfloat16"
    s = spec.RunSpec.from_config(c)
    self.assertEqual(s.config.to_json_best_effort(sort_keys=True),
                     c.to_json_best_effort(sort_keys=True))
    self.assertEqual(s.rollout, blocks.rollout_config(c))
    self.assertEqual(s.prompt, blocks.prompt_config(c))
    # The micro model (d64, 4 layers) computing in the config's dtype.
    self.assertEqual((s.model.embed_dim, s.model.num_layers, s.model.dtype), (64, 4, "bfloat16"))
    # StarPO-S keeps the top half of 16 groups; 8 x 8 rows in 2 minibatches of 4 chunks.
    self.assertEqual(s.num_keep, 8)
    self.assertEqual((s.filter.mode, s.filter.value), ("top_fraction", 0.5))
    self.assertEqual((s.train.num_minibatches, s.train.num_microbatches), (2, 4))
    self.assertEqual(s.train.actor_optimizer.learning_rate, 1e-4)
    self.assertEqual(s.sft_optimizer.learning_rate, 1e-3)
    self.assertIsNone(s.lora)
    self.assertEqual(s.num_devices, 1)
    # -1: one row per device in each micro-batch (one device: 32 rows a minibatch).
    c.rl.num_microbatches = -1
    self.assertEqual(spec.RunSpec.from_config(c).train.num_microbatches, 32)

  def test_tree_fields_build_the_rollout_tree(self):
    c = tiny.get_config("Sokoban-6x6-1box-v0,tree_grpo")
    self.assertIsNone(spec.RunSpec.from_config(c).rollout.tree)  # empty fork_turns: no tree
    # Forks at turns 1 and 2, K = 2 and then 4 for one node a tree: 1 + 1 + 3 = 5 rows a
    # tree, 2 trees a group.
    c.rollout.tree.update(dict(fork_turns=(1, 2), branches=(2, 4), expand=(1,), trees=2))
    c.rollout.group_size = 10
    tree = spec.RunSpec.from_config(c).rollout.tree
    self.assertEqual((tree.fork_turns, tree.branches, tree.expand, tree.trees, tree.select),
                     ((1, 2), (2, 4), 1, 2, "random"))
    self.assertEqual(tree.group_size(), 10)

  def test_bad_tree_fields_are_named_as_config_fields(self):
    for update, field in ((dict(fork_turns=(7,)), "rollout.tree.fork_turns=(7,)"),
                          (dict(branches=(1,)), "rollout.tree.branches=(1,)"),
                          (dict(branches=(2, 2)), "rollout.tree.branches=(2, 2)"),
                          (dict(expand=(3,)), "rollout.tree.expand=(3,)"),
                          (dict(select="best"), "rollout.tree.select='best'"),
                          (dict(trees=0), "rollout.tree.trees=0"),
                          (dict(trees=2), "rollout.group_size=8")):
      c = tiny.get_config("Sokoban-6x6-1box-v0,tree_grpo")
      c.rollout.tree.update(dict(fork_turns=(1,), branches=(8,)))  # 8 rows: group_size 8
      c.rollout.tree.update(update)
      with self.subTest(field), self.assertRaises(fields.ConfigError) as cm:
        spec.RunSpec.from_config(c)
      self.assertTrue(str(cm.exception).startswith(f"config.{field}: "), str(cm.exception))

  def test_the_experiment_holds_the_spec(self):
    c = tiny.get_config("Bandit-v0,starpo_s")
    s = spec.RunSpec.from_config(c)
    exp = experiment.Experiment(s)
    self.assertIs(exp.spec, s)
    self.assertIs(exp.config, s.config)
    for mine, theirs in ((exp.rollout_config, s.rollout), (exp.train_config, s.train),
                         (exp.objective, s.objective), (exp.model_config, s.model),
                         (exp.prompt, s.prompt), (exp.filter_config, s.filter)):
      self.assertIs(mine, theirs)
    self.assertIs(exp.sft_train_config().actor_optimizer, s.sft_optimizer)

  def test_model_dir_is_read_only_by_the_spec(self):
    c = tiny.get_config("Bandit-v0,starpo_s")
    c.model_dir = "/nonexistent"
    spec.validate(c)  # checks only: the nano config stands in
    with self.assertRaisesRegex(fields.ConfigError,
                                r"^config\.model_dir='/nonexistent': no config\.json there"):
      spec.RunSpec.from_config(c)
