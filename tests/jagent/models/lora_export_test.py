"""LoRA export: merged Hugging Face checkpoints and PEFT adapter directories.

The PEFT-library test needs ``peft``, ``torch`` and ``transformers`` (the
``hf`` extra) and is skipped without them; the others read and write files
only.
"""

import importlib.util
import json
import os
import pathlib
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import safetensors.numpy

from jagent import models

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
NAMES = ("hf_qwen2_tiny", "hf_llama_tiny")
_HAVE_PEFT = all(importlib.util.find_spec(m) is not None
                 for m in ("peft", "torch", "transformers"))


def _forward(params, config, ids):
  pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  return np.asarray(jax.jit(models.apply, static_argnames="config")(
      params, ids, pos, config=config)[0])


def _trained_lora(name, modules="all-linear"):
  """The fixture's base with adapters whose B is non-zero (as if trained)."""
  base, config = models.load_hf_checkpoint(str(FIXTURES / name))
  lora = models.init_lora(base, config, models.LoraConfig(rank=4, alpha=8.0, dropout=0.1,
                                                          target_modules=modules),
                          jax.random.key(0))
  leaves, tdef = jax.tree.flatten(lora.adapters,
                                  is_leaf=lambda x: isinstance(x, models.LoraPair))
  keys = jax.random.split(jax.random.key(1), len(leaves))
  leaves = [p.replace(b=0.1 * jax.random.normal(k, p.b.shape)) for p, k in zip(leaves, keys)]
  return lora.replace(adapters=jax.tree.unflatten(tdef, leaves)), config


class LoraExportTest(parameterized.TestCase):

  @parameterized.parameters(*NAMES)
  def test_merged_export_reloads_to_the_same_logits(self, name):
    lora, config = _trained_lora(name)
    ids = np.load(FIXTURES / name / "reference.npz")["input_ids"]
    want = _forward(lora, config, ids)
    with tempfile.TemporaryDirectory() as tmp:
      models.save_hf_checkpoint(models.merge_lora(lora), config, tmp)
      merged, config2 = models.load_hf_checkpoint(tmp)
    self.assertEqual(config2, config)
    np.testing.assert_allclose(_forward(merged, config, ids), want, atol=1e-5, rtol=0)
    # The adapters matter (so the comparison can fail).
    self.assertGreater(np.abs(_forward(lora.base, config, ids) - want).max(), 1e-3)

  def test_peft_directory_format_and_round_trip(self):
    lora, config = _trained_lora(NAMES[1], modules=("q", "o", "down"))
    with tempfile.TemporaryDirectory() as tmp:
      models.save_peft_adapter(lora, config, tmp, base_model_name_or_path="base-dir")
      self.assertEqual(sorted(os.listdir(tmp)),
                       ["adapter_config.json", "adapter_model.safetensors"])
      with open(os.path.join(tmp, "adapter_config.json")) as f:
        pc = json.load(f)
      tensors = safetensors.numpy.load_file(os.path.join(tmp, "adapter_model.safetensors"))
      back = models.load_peft_adapter(tmp, lora.base, config)
    self.assertEqual((pc["peft_type"], pc["r"], pc["lora_alpha"], pc["lora_dropout"],
                      pc["target_modules"], pc["base_model_name_or_path"]),
                     ("LORA", 4, 8.0, 0.1, ["down_proj", "o_proj", "q_proj"], "base-dir"))
    # PEFT's names and torch's Linear layouts: lora_A [r, in], lora_B [out, r].
    self.assertLen(tensors, 2 * 3 * config.num_layers)
    pre = "base_model.model.model.layers.1."
    hq = config.num_heads * config.head_dim
    self.assertEqual(tensors[pre + "self_attn.q_proj.lora_A.weight"].shape,
                     (4, config.embed_dim))
    self.assertEqual(tensors[pre + "self_attn.q_proj.lora_B.weight"].shape, (hq, 4))
    self.assertEqual(tensors[pre + "self_attn.o_proj.lora_A.weight"].shape, (4, hq))
    self.assertEqual(tensors[pre + "mlp.down_proj.lora_A.weight"].shape, (4, config.mlp_dim))
    # delta W (HF [out, in]) = alpha / r * B_hf @ A_hf = (our A @ B).T
    pair = lora.adapters["down"]
    np.testing.assert_allclose(
        tensors[pre + "mlp.down_proj.lora_B.weight"] @ tensors[pre + "mlp.down_proj.lora_A.weight"],
        (np.asarray(pair.a[1]) @ np.asarray(pair.b[1])).T, atol=1e-6)
    self.assertEqual(back.config, lora.config)
    for x, y in zip(jax.tree.leaves(back.adapters), jax.tree.leaves(lora.adapters)):
      np.testing.assert_array_equal(x, y)

  def test_peft_bad_directory(self):
    lora, config = _trained_lora(NAMES[0], modules=("v",))
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(ValueError, "lacks adapter_config.json"):
        models.load_peft_adapter(tmp, lora.base, config)
      models.save_peft_adapter(lora, config, tmp)
      with open(os.path.join(tmp, "adapter_config.json")) as f:
        pc = json.load(f)
      with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
        json.dump({**pc, "use_dora": True}, f)
      with self.assertRaisesRegex(ValueError, "use_dora=True is not supported"):
        models.load_peft_adapter(tmp, lora.base, config)
      with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
        json.dump({**pc, "target_modules": ["v_proj", "lm_head"]}, f)
      with self.assertRaisesRegex(ValueError, r"\['lm_head'\] are not projections"):
        models.load_peft_adapter(tmp, lora.base, config)

  @absltest.skipUnless(_HAVE_PEFT, "needs peft, torch and transformers (the hf extra)")
  @parameterized.parameters(*NAMES)
  def test_peft_loads_the_adapter_onto_the_base(self, name):
    import peft  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    lora, config = _trained_lora(name)
    ids = np.load(FIXTURES / name / "reference.npz")["input_ids"]
    with tempfile.TemporaryDirectory() as tmp:
      models.save_peft_adapter(lora, config, tmp)
      base = transformers.AutoModelForCausalLM.from_pretrained(
          str(FIXTURES / name), dtype=torch.float32)
      model = peft.PeftModel.from_pretrained(base, tmp).eval()
      with torch.no_grad():
        theirs = model(torch.as_tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, _forward(lora, config, ids), atol=1e-4, rtol=0)


if __name__ == "__main__":
  absltest.main()
