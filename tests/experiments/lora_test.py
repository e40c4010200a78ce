"""LoRA through the entry point: config checks, and a Bandit run that learns with adapters only.

The run is ``train_test``'s Bandit run (nano model, format-only SFT, Dr.GRPO
with StarPO-S's filter) with ``lora.rank=16``: SFT and RL train the adapters
alone on the frozen random base.
"""

import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from experiments import common
from experiments import train as train_job
from experiments.configs import ragen
from experiments.configs import tiny
from jagent import models
from tests.experiments import train_test


class LoraConfigTest(parameterized.TestCase):

  def test_off_by_default_and_on_by_rank(self):
    c = tiny.get_config("Bandit-v0,dr_grpo")
    self.assertIsNone(common.lora_config(c))
    c.lora.update(dict(rank=16, alpha=32.0, target_modules="q,v,down"))
    self.assertEqual(common.lora_config(c),
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
      ("module", dict(rank=4, target_modules="q,qkv"), r"config.lora.target_modules='q,qkv'"))
  def test_bad_values_name_the_field(self, fields, message):
    c = tiny.get_config("Bandit-v0,dr_grpo")
    c.lora.update(fields)
    with self.assertRaisesRegex(ValueError, message):
      common.validate(c)

  def test_family_without_the_module_names_the_field(self):
    from jagent.models import _lora  # pylint: disable=g-import-not-at-top
    c = tiny.get_config("Bandit-v0,dr_grpo")
    c.lora.update(dict(rank=4, target_modules="q,up"))
    with mock.patch.dict(_lora.FAMILY_MODULES, {"qwen2": ("q", "k", "v", "o")}):
      with self.assertRaisesRegex(ValueError, r"config.lora.target_modules='q,up': model "
                                  r"family 'qwen2' has no \['up'\]"):
        common.validate(c)


class LoraBanditRunTest(absltest.TestCase):

  def test_bandit_learns_with_adapters_only(self):
    workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
    c = train_test._bandit_config()  # pylint: disable=protected-access
    c.lora.update(dict(rank=16, alpha=32.0))
    c.diagnostics.every = 0  # not what this test is about
    c.eval.every = 0
    summary = train_job.run(c, workdir, progress=False)
    self.assertGreaterEqual(summary["rl"]["success"], 0.9)
    # The checkpoint holds no base array; the merged policy and the PEFT
    # adapter directory were exported.
    with open(os.path.join(workdir, "checkpoints", str(c.rl.steps), "state",
                           "_METADATA")) as f:
      saved = json.load(f)["tree_metadata"]
    self.assertEqual([k for k in saved if "'base', " in k], [])
    self.assertTrue(os.path.isfile(os.path.join(workdir, "policy", "model.safetensors")))
    exp = common.Experiment(c)
    merged, _ = models.load_hf_checkpoint(os.path.join(workdir, "policy"))
    lora = models.load_peft_adapter(os.path.join(workdir, "policy_adapter"),
                                    exp.init_params().base, exp.model_config)
    ckpt = exp.checkpointer(workdir)
    state, _ = ckpt.restore(exp.rl_state_target())
    ckpt.close()
    tokens = np.arange(24, dtype=np.int32).reshape(2, 12)
    pos = np.broadcast_to(np.arange(12), tokens.shape)
    want = models.apply(state.params, tokens, pos, config=exp.model_config)[0]
    for params in (merged, lora):
      np.testing.assert_allclose(models.apply(params, tokens, pos, config=exp.model_config)[0],
                                 want, atol=1e-5, rtol=0)


if __name__ == "__main__":
  absltest.main()
