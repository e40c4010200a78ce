"""Hugging Face checkpoint loading/export, and parity with transformers.

The fixtures (tests/fixtures/hf_*_tiny) are tiny random checkpoints and
reference outputs written by ``transformers`` (experiments/make_hf_fixtures.py);
these tests need neither torch nor transformers.
"""

import json
import os
import pathlib
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import pytest
import safetensors.numpy

from jagent import models
from jagent import sharding

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"
NAMES = ("hf_qwen2_tiny", "hf_llama_tiny")


def _forward(params, config, ids):
  pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  return np.asarray(jax.jit(models.apply, static_argnames="config")(
      params, ids, pos, config=config)[0])


class CheckpointTest(parameterized.TestCase):

  @parameterized.parameters(*NAMES)
  @pytest.mark.smoke
  def test_logits_match_transformers(self, name):
    params, config = models.load_hf_checkpoint(str(FIXTURES / name))
    ref = np.load(FIXTURES / name / "reference.npz")
    diff = np.abs(_forward(params, config, ref["input_ids"]) - ref["logits"]).max()
    self.assertLessEqual(diff, 1e-4)

  @parameterized.parameters(*NAMES)
  @pytest.mark.smoke
  def test_greedy_continuation_matches_transformers(self, name):
    params, config = models.load_hf_checkpoint(str(FIXTURES / name))
    ref = np.load(FIXTURES / name / "reference.npz")
    prompt = ref["prompt"]
    out = models.generate(
        params, prompt, np.full((2,), prompt.shape[1]), jax.random.key(0), config=config,
        sampling=models.SamplingConfig(max_new_tokens=ref["greedy"].shape[1], greedy=True))
    np.testing.assert_array_equal(out.tokens, ref["greedy"])

  @parameterized.parameters((NAMES[0], None), (NAMES[1], None), (NAMES[0], 100_000))
  @pytest.mark.smoke
  def test_load_export_load_is_exact(self, name, shard_bytes):
    params, config = models.load_hf_checkpoint(str(FIXTURES / name))
    with tempfile.TemporaryDirectory() as tmp:
      models.save_hf_checkpoint(params, config, tmp, max_shard_bytes=shard_bytes)
      sharded = os.path.exists(os.path.join(tmp, "model.safetensors.index.json"))
      self.assertEqual(sharded, shard_bytes is not None)
      again, config2 = models.load_hf_checkpoint(tmp)
    self.assertEqual(config2, config)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again), strict=True):
      np.testing.assert_array_equal(a, b)
    # The exported tensors are exactly the original files' tensors.
    with tempfile.TemporaryDirectory() as tmp:
      models.save_hf_checkpoint(params, config, tmp)
      ours = safetensors.numpy.load_file(os.path.join(tmp, "model.safetensors"))
    theirs = {}
    for fn in os.listdir(FIXTURES / name):
      if fn.endswith(".safetensors"):
        theirs.update(safetensors.numpy.load_file(str(FIXTURES / name / fn)))
    self.assertEqual(sorted(ours), sorted(theirs))
    for k in ours:
      np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)

  def test_load_into_target_sharding_and_dtype(self):
    path = str(FIXTURES / NAMES[0])
    config = models.read_hf_config(path)
    mesh = jax.make_mesh((2, 4), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rules = (("mlp", "model"), ("q_heads", "model"), ("vocab", "model"))
    shapes = jax.eval_shape(lambda k: models.init(config, k), jax.random.key(0))
    shardings = sharding.tree_shardings(models.param_axes(config), shapes, mesh, rules)
    params, _ = models.load_hf_checkpoint(path, shardings=shardings)
    for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
      self.assertEqual(x.sharding, s)
    self.assertEqual(params.embed.sharding.spec, jax.P("model"))  # [V, D]: V over model
    plain, _ = models.load_hf_checkpoint(path)
    np.testing.assert_array_equal(params.layers.w_up, plain.layers.w_up)
    half, cfg16 = models.load_hf_checkpoint(path, param_dtype="bfloat16")
    self.assertEqual(cfg16.param_dtype, "bfloat16")
    self.assertEqual(half.layers.wq.dtype, jax.numpy.bfloat16)

  def _broken_copy(self, tmp, mutate):
    src = FIXTURES / NAMES[0]
    for fn in ("config.json", "model.safetensors"):
      shutil.copy(src / fn, tmp)
    tensors = safetensors.numpy.load_file(os.path.join(tmp, "model.safetensors"))
    mutate(tensors)
    safetensors.numpy.save_file(tensors, os.path.join(tmp, "model.safetensors"))

  def test_missing_tensor_is_named(self):
    with tempfile.TemporaryDirectory() as tmp:
      self._broken_copy(tmp, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
      with self.assertRaisesRegex(ValueError, r"lacks 1 tensor.*layers\.1\.mlp\.up_proj"):
        models.load_hf_checkpoint(tmp)

  def test_shape_mismatch_is_named(self):
    def cut(t):
      t["model.layers.0.self_attn.k_proj.weight"] = t[
          "model.layers.0.self_attn.k_proj.weight"][:-1]
    with tempfile.TemporaryDirectory() as tmp:
      self._broken_copy(tmp, cut)
      with self.assertRaisesRegex(ValueError, r"k_proj.weight.*shape \(31, 64\).*\(32, 64\)"):
        models.load_hf_checkpoint(tmp)

  def test_unexpected_tensor_and_unsupported_architecture(self):
    with tempfile.TemporaryDirectory() as tmp:
      self._broken_copy(tmp, lambda t: t.update(
          {"model.layers.0.mlp.gate_proj.bias": np.zeros(128, np.float32)}))
      with self.assertRaisesRegex(ValueError, "unexpected tensor.*gate_proj.bias"):
        models.load_hf_checkpoint(tmp)
      with open(os.path.join(tmp, "config.json")) as fh:
        hf = json.load(fh)
      hf["architectures"] = ["MistralForCausalLM"]
      hf["model_type"] = "mistral"
      with open(os.path.join(tmp, "config.json"), "w") as fh:
        json.dump(hf, fh)
      with self.assertRaisesRegex(ValueError, "unsupported architecture.*Mistral"):
        models.load_hf_checkpoint(tmp)
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(ValueError, "no config.json"):
        models.load_hf_checkpoint(tmp)


if __name__ == "__main__":
  absltest.main()
