"""LoRA through the entry point: the config block, its checks, and a Bandit run.

``LoraBanditTest`` is the evidence that adapters learn and resume: a
LoRA RL run (``experiments.train.run``) on a TRAINED base. On a random base
adapters cannot learn (``train_test``'s Bandit run with ``lora.rank=16`` and
no base ended at success 0.0: the frozen tied embeddings, std 0.02, and the
final norm keep every logit within ~+-1.3, and adapters-only SFT of the
reply format reached an NLL of ~5.06 nats/token against 0.09 for full
fine-tuning; ``blocks.lora_base_warning`` says so). So the base is
``train_test``'s Bandit warm start (``nano``, format-only SFT on random arms,
no RL), exported as a Hugging Face directory, and the adapters (rank 16,
all-linear) are trained by RL at lr 1e-2, 10x ``train_test``'s full
fine-tuning rate.
"""

import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from experiments import blocks
from experiments import experiment
from experiments import spec
from experiments import sweep
from experiments import train as train_job
from experiments.configs import ragen
from experiments.configs import tiny
from jagent import models
from tests import testenv
from tests.experiments import train_test


class LoraConfigTest(parameterized.TestCase):

  def test_off_by_default_and_on_by_rank(self):
    c = tiny.get_config("Bandit-v0,dr_grpo")
    self.assertIsNone(blocks.lora_config(c))
    c.lora.update(dict(rank=16, alpha=32.0, target_modules="q,v,down"))
    self.assertEqual(blocks.lora_config(c),
                     models.LoraConfig(rank=16, alpha=32.0, target_modules=("q", "v", "down")))
    r = ragen.get_config("Sokoban-6x6-1box-v0,starpo_s,lora")
    self.assertEqual((r.lora.rank, r.lora.alpha, r.lora.target_modules, r.rl.learning_rate),
                     (64, 64.0, "all-linear", 1e-5))
    self.assertEqual(ragen.get_config("Sokoban-6x6-1box-v0,starpo_s").lora.rank, 0)
    with self.assertRaisesRegex(ValueError, "third part may only be 'lora'"):
      ragen.get_config("Sokoban-6x6-1box-v0,starpo_s,qlora")

  @parameterized.named_parameters(
      ("negative_rank", dict(rank=-1), r"config.lora.rank=-1: must be an int >= 0"),
      ("alpha", dict(rank=4, alpha=-1.0), r"config.lora.alpha=-1.0"),
      ("dropout", dict(rank=4, dropout=1.0), r"config.lora.dropout=1.0"),
      ("module", dict(rank=4, target_modules="q,qkv"), r"config.lora.target_modules='q,qkv'"),
      # LoRA off (rank 0): the fields are still checked, a typo is not silent.
      ("module_off", dict(rank=0, target_modules="bogus"),
       r"config.lora.target_modules='bogus': unknown module name\(s\) \['bogus'\]"),
      ("alpha_off", dict(rank=0, alpha=0.0), r"config.lora.alpha=0.0: must be a positive"),
      ("dropout_off", dict(rank=0, dropout=-0.5), r"config.lora.dropout=-0.5: must be a float"),
      ("base_dtype_off", dict(rank=0, base_dtype="fp8"), r"config.lora.base_dtype='fp8'"))
  def test_bad_values_name_the_field(self, fields, message):
    c = tiny.get_config("Bandit-v0,dr_grpo")
    c.lora.update(fields)
    with self.assertRaisesRegex(ValueError, message):
      spec.validate(c)

  def test_random_base_warns_once_in_one_line(self):
    c = tiny.get_config("Bandit-v0,dr_grpo")
    c.model = "nano"
    self.assertIsNone(blocks.lora_base_warning(c))  # LoRA off
    c.lora.rank = 16
    line = blocks.lora_base_warning(c)
    self.assertNotIn("\n", line)
    for part in ("config.lora.rank=16", "config.model_dir=''", "RANDOM", "nano",
                 "~10x"):
      self.assertIn(part, line)
    with mock.patch.object(experiment.logging, "warning") as warning:
      experiment.Experiment(c)
    warning.assert_called_once_with(line)
    c.model_dir = "/a/trained/base"  # a loaded base: no warning
    self.assertIsNone(blocks.lora_base_warning(c))

  def test_bfloat16_base(self):
    # lora.base_dtype=bfloat16 stores the frozen base in half the bytes; the
    # adapters and their moments stay float32, and an RL step trains them
    # while the base stays as loaded.
    c = tiny.get_config("Bandit-v0,dr_grpo")
    c.model, c.seed = "nano", 0
    c.rollout.update(dict(num_groups=2, group_size=4, max_tokens_per_turn=12))
    c.rl.update(dict(num_microbatches=1, learning_rate=1e-2))
    c.algorithm_kwargs.entropy_coef = 0.01  # random base: every reward alike, advantages 0
    c.lora.update(dict(rank=4, base_dtype="bfloat16"))
    exp = experiment.Experiment(c)
    params = exp.init_params()
    self.assertEqual({x.dtype for x in jax.tree.leaves(params.base)}, {np.dtype(jnp.bfloat16)})
    self.assertEqual({x.dtype for x in jax.tree.leaves(params.adapters)}, {np.dtype("float32")})
    for half, f32 in zip(jax.tree.leaves(params.base), jax.tree.leaves(
        models.init(exp.model_config, jax.random.key(0)))):
      np.testing.assert_array_equal(half, np.asarray(f32).astype(jnp.bfloat16))
    state, metrics = exp.rl_step(exp.rl_state(params), 0)
    self.assertTrue(np.isfinite(float(metrics["actor/entropy"])), metrics)
    for got, want in zip(jax.tree.leaves(state.params.base), jax.tree.leaves(params.base)):
      self.assertEqual(got.dtype, jnp.bfloat16)
      np.testing.assert_array_equal(got, want)
    moved = [float(jnp.abs(g - w).max()) for g, w in zip(jax.tree.leaves(state.params.adapters),
                                                          jax.tree.leaves(params.adapters))]
    self.assertGreater(max(moved), 0.0)
    c.lora.base_dtype = "float16"
    with self.assertRaisesRegex(ValueError, r"config.lora.base_dtype='float16': must be one of "
                                r"\('float32', 'bfloat16'\)"):
      spec.validate(c)

  def test_family_without_the_module_names_the_field(self):
    from jagent.models import _lora  # pylint: disable=g-import-not-at-top
    c = tiny.get_config("Bandit-v0,dr_grpo")
    c.lora.update(dict(rank=4, target_modules="q,up"))
    with mock.patch.dict(_lora.FAMILY_MODULES, {"qwen2": ("q", "k", "v", "o")}):
      with self.assertRaisesRegex(ValueError, r"config.lora.target_modules='q,up': model "
                                  r"family 'qwen2' has no \['up'\]"):
        spec.validate(c)


_KILL_AT = 6  # after the checkpoint at step 4 of 8


def _base_config():
  """``train_test``'s Bandit warm start (format-only SFT), no RL."""
  c = train_test._bandit_config()  # pylint: disable=protected-access
  c.rl.steps = 0
  c.eval.update(dict(held_out=False, greedy=False, every=0))
  c.diagnostics.every = 0
  return c


def _lora_config(model_dir):
  """RL of rank-16 adapters on the base in ``model_dir`` (8 steps, lr 1e-2), no SFT."""
  c = train_test._bandit_config()  # pylint: disable=protected-access
  c.model_dir = model_dir  # the architecture and weights; the tokenizer stays "tiny"
  c.sft.steps = 0
  c.lora.update(dict(rank=16, alpha=32.0, dropout=0.0, target_modules="all-linear"))
  c.rl.learning_rate = 1e-2
  c.eval.update(dict(held_out=False, greedy=False, every=0))
  c.diagnostics.every = 0
  return c


@pytest.mark.heavy
class HeldOutOfBaseTest(absltest.TestCase):
  """A LoRA run on a jagent-trained base holds its base's training levels out too."""

  def test_eval_levels_exclude_the_base_runs_levels(self):
    root = tempfile.mkdtemp(prefix="lora_held_out_")
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    # The base run as experiments.train leaves it: <workdir>/config.json beside
    # <workdir>/policy (a nano model: no training is needed to count levels).
    base = testenv.without_extras(tiny.get_config("FrozenLake-4x4-v0,grpo"))
    base.model = "nano"
    base.seed = 5
    base.rl.steps = 100  # 100 x 16 levels, plus 128 demonstrations
    base.eval.update(dict(num_levels=64, num_groups=64, held_out=True))
    base_dir = os.path.join(root, "base")
    models.save_hf_checkpoint(
        models.init(models.get_config("nano"), jax.random.key(0)), models.get_config("nano"),
        os.path.join(base_dir, "policy"))
    with open(os.path.join(base_dir, "config.json"), "w") as f:
      f.write(base.to_json_best_effort(indent=2))
    lora = base.copy_and_resolve_references()
    lora.model_dir = os.path.join(base_dir, "policy")
    lora.lora.rank = 4
    lora.seed = 9
    lora.rl.steps = 10
    lora.sft.steps = 0

    exp = experiment.Experiment(lora)
    env, env_params = exp.env, exp.env_params

    def levels(keys):
      states = jax.vmap(lambda k: env.reset(k, env_params)[1])(keys)
      return {row.tobytes() for row in np.asarray(jax.vmap(env.render_symbols)(states))}

    base_levels = levels(spec.trained_reset_keys(base))
    own_levels = levels(spec.trained_reset_keys(lora))
    # Held out of its own levels only (as before), the set holds base levels.
    own_only, removed_own = exp.held_out_keys(spec.trained_reset_keys(lora))
    self.assertNotEmpty(levels(own_only) & base_levels)
    evaluated = levels(exp.eval_keys)
    self.assertEmpty(evaluated & base_levels)
    self.assertEmpty(evaluated & own_levels)
    self.assertGreater(exp.eval_levels_removed, removed_own)
    self.assertEqual(exp.held_out_base_runs, [os.path.join(base_dir, "config.json")])
    # A base outside a run directory (no config.json beside it) adds nothing.
    self.assertEqual(spec.base_runs(base), [])
    moved = lora.copy_and_resolve_references()
    moved.model_dir = os.path.join(root, "elsewhere", "policy")
    self.assertEqual(spec.base_runs(moved), [])


def _forward(params, config, ids):
  pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  return np.asarray(jax.jit(models.apply, static_argnames="config")(
      params, ids, pos, config=config)[0])


@pytest.mark.heavy
class LoraBanditTest(absltest.TestCase):
  """A LoRA RL run on a trained base: learns, checkpoints adapters only, exports, resumes."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix="lora_test_")
    # The base: SFT only, exported as experiments.train exports a policy.
    base_exp = experiment.Experiment(_base_config())
    params = base_exp.sft(train_job._NoWriter(), progress=False)  # pylint: disable=protected-access
    base_exp.export(os.path.join(cls.root, "base"), params)
    cls.base_dir = os.path.join(cls.root, "base", "policy")
    cls.config = _lora_config(cls.base_dir)
    cls.workdir = os.path.join(cls.root, "lora")
    with mock.patch.object(experiment.logging, "warning") as warning:
      cls.summary = train_job.run(cls.config, cls.workdir, progress=False)
    cls.warnings = [c.args for c in warning.call_args_list]

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_adapters_learn_the_high_arm(self):
    s = self.summary
    self.assertEqual((s["steps"], s["stopped"]), (8, None))
    self.assertEqual(self.warnings, [])  # a trained base: no random-base warning
    # Before RL the adapters are off (B = 0): the base's policy, whose format is
    # learned and whose arm is not; RL on the adapters alone learns the arm.
    self.assertGreaterEqual(s["sft"]["format_valid_frac"], 0.8, s)
    self.assertLessEqual(s["sft"]["success"], 0.85, s)
    self.assertGreaterEqual(s["rl"]["success"], 0.9, s)
    self.assertGreaterEqual(s["rl"]["success"] - s["sft"]["success"], 0.1, s)

  def test_checkpoint_holds_adapters_and_their_moments_only(self):
    exp = experiment.Experiment(self.config)
    adapters = sum(x.size for x in jax.tree.leaves(
        models.split_frozen(exp.with_lora(exp.init_params()))[0]))
    path = os.path.join(self.workdir, "checkpoints", "8", "state")
    tree = ocp.StandardCheckpointer().metadata(path).item_metadata.tree
    arrays = {jax.tree_util.keystr(p): x.shape for p, x in jax.tree.leaves_with_path(tree)
              if x.shape and jax.tree_util.keystr(p) != "['rng']"}  # (the raw key, [2])
    # No base weight (embeddings, layers, norms): params and Adam's mu and nu
    # of the adapters, each [in..., 16] or [16, out...].
    self.assertTrue(all("['adapters']" in k for k in arrays), arrays)
    self.assertTrue(all(16 in shape for shape in arrays.values()), arrays)
    self.assertEqual(sum(int(np.prod(s)) for s in arrays.values()), 3 * adapters)
    self.assertEqual(sum(int(np.prod(s)) for k, s in arrays.items() if k.startswith("['params']")),
                     adapters)

  def test_merged_export_is_the_peft_export_on_the_base(self):
    base, config = models.load_hf_checkpoint(self.base_dir)
    merged, merged_config = models.load_hf_checkpoint(os.path.join(self.workdir, "policy"))
    self.assertEqual(merged_config, config)
    adapter_dir = os.path.join(self.workdir, "policy_adapter")
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
      self.assertEqual(json.load(f)["base_model_name_or_path"], self.base_dir)
    peft = models.load_peft_adapter(adapter_dir, base, config)
    ids = np.random.default_rng(0).integers(3, config.vocab_size, (2, 12)).astype(np.int32)
    want = _forward(peft, config, ids)
    np.testing.assert_allclose(_forward(merged, config, ids), want, rtol=0, atol=1e-5)
    # The adapters moved the policy (the base's logits differ).
    self.assertGreater(np.abs(_forward(base, config, ids) - want).max(), 1e-2)
    # And they are the checkpoint's (the trained state's) adapters.
    exp = experiment.Experiment(self.config)
    state, _ = exp.checkpointer(self.workdir).restore(exp.rl_state_target())
    for got, ckpt in zip(jax.tree.leaves(peft.adapters), jax.tree.leaves(state.params.adapters)):
      np.testing.assert_allclose(got, np.asarray(ckpt), rtol=0, atol=0)

  def test_sweep_shares_one_base_and_its_first_run_is_this_run(self):
    # A sweep vmaps adapters, not models. Two seeds hold ONE copy of
    # the base (no run axis) beside two sets of adapters and moments; with
    # batching="map" seed 0 is this class's separate run.
    s = sweep.sweep(self.config, None, seeds=2, batching="map")
    self.assertTrue(s["shared_base"])
    base, _ = models.load_hf_checkpoint(self.base_dir)
    (frozen,) = s["frozen"]
    self.assertEqual(jax.tree.structure(frozen), jax.tree.structure(base))
    for got, want in zip(jax.tree.leaves(frozen), jax.tree.leaves(base)):
      self.assertEqual(got.shape, want.shape)  # no run axis
      np.testing.assert_array_equal(got, want)
    self.assertIsNone(s["params"].base)
    self.assertTrue(all(x.shape[0] == 2 for x in jax.tree.leaves(s["params"])))
    exp = experiment.Experiment(self.config)
    state, _ = exp.checkpointer(self.workdir).restore(exp.rl_state_target())
    for got, want in zip(jax.tree.leaves(s["params"].adapters),
                         jax.tree.leaves(state.params.adapters)):
      np.testing.assert_allclose(got[0], np.asarray(want), rtol=1e-5, atol=1e-7)
    self.assertEqual(s["runs"][0]["rl"]["success"], self.summary["rl"]["success"])
    self.assertEqual(s["runs"][0]["sft"]["success"], self.summary["sft"]["success"])
    # The seeds matter: the second run's adapters are its own.
    first = jax.tree.leaves(s["params"].adapters)[0]
    self.assertFalse(np.array_equal(first[0], first[1]))
    # RL from those adapters (experiments.compare's reuse) loads the base once
    # more and gives the same runs.
    again = sweep.sweep(self.config, None, seeds=2, batching="map",
                        sft_params=s["sft_params"])
    self.assertTrue(again["shared_base"])
    self.assertEqual(json.dumps(again["runs"]), json.dumps(s["runs"]))

  def test_killed_run_resumes_to_the_uninterrupted_result(self):
    train_test._assert_resumes(  # pylint: disable=protected-access
        self, self.config, self.workdir, self.summary, os.path.join(self.root, "killed"),
        kill_at=_KILL_AT)


if __name__ == "__main__":
  absltest.main()
