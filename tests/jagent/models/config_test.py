"""Tests of ModelConfig validation, the named configs and HF config parsing."""

import json
import pathlib

from absl.testing import absltest
from absl.testing import parameterized

from jagent import models

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures"


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(
      ("vocab_size", 0), ("num_kv_heads", 3), ("head_dim", 7), ("family", "gpt2"),
      ("rope_type", "yarn"), ("dtype", "int8"), ("eos_id", 10_000), ("norm_eps", 0.0),
      ("rope_theta", -1.0), ("num_layers", 1.5), ("attention_impl", "flash"))
  def test_invalid_field_raises_naming_it(self, field, value):
    with self.assertRaisesRegex(ValueError, f"ModelConfig.{field}="):
      models.get_config("tiny", **{field: value})

  def test_unknown_name(self):
    with self.assertRaisesRegex(ValueError, "unknown model config 'gpt5'"):
      models.get_config("gpt5")

  @parameterized.parameters(
      # Parameter counts of the published checkpoints (tied embeddings).
      ("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304),
      ("qwen2.5-3b", 3_085_938_688),
      ("llama-3.2-1b", 1_235_814_400))
  def test_real_configs_have_published_sizes(self, name, count):
    self.assertEqual(models.get_config(name).num_params(), count)

  def test_small_configs_sizes(self):
    self.assertBetween(models.get_config("tiny").num_params(), 500_000, 1_000_000)
    self.assertBetween(models.get_config("small-10m").num_params(), 9_000_000, 12_000_000)

  def test_reads_transformers5_config(self):
    hf = json.loads((FIXTURES / "hf_llama_tiny" / "config.json").read_text())
    c = models.config_from_hf(hf)
    self.assertEqual((c.family, c.rope_type, c.rope_factor, c.rope_original_max_position),
                     ("llama", "llama3", 8.0, 32))
    self.assertEqual((c.num_kv_heads, c.head_dim, c.qkv_bias, c.tie_embeddings),
                     (1, 16, False, True))
    self.assertEqual(c.rope_theta, 500000.0)

  def test_reads_transformers4_spelling(self):
    hf = json.loads((FIXTURES / "hf_qwen2_tiny" / "config.json").read_text())
    hf.pop("rope_parameters")
    hf["rope_theta"] = 1234.0
    hf["torch_dtype"] = hf.pop("dtype")
    c = models.config_from_hf(hf)
    self.assertEqual((c.family, c.rope_theta, c.qkv_bias, c.tie_embeddings),
                     ("qwen2", 1234.0, True, False))

  def test_round_trip_through_hf_dict(self):
    for name in models.config_names():
      c = models.get_config(name)
      self.assertEqual(models.config_from_hf(models.config_to_hf(c)), c)

  def test_attention_impl_stays_out_of_hf_dict(self):
    # A runtime choice, not architecture: never exported, "auto" on import.
    c = models.get_config("tiny", attention_impl="xla")
    hf = models.config_to_hf(c)
    self.assertEqual(hf, models.config_to_hf(c.replace(attention_impl="auto")))
    self.assertEqual(models.config_from_hf(hf).attention_impl, "auto")
    self.assertEqual(models.config_from_hf(hf, attention_impl="xla"), c)

  @parameterized.parameters(
      ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "unsupported architecture"),
      ({"use_sliding_window": True}, "use_sliding_window"),
      ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, "yarn"),
  )
  def test_unsupported_hf_configs(self, change, message):
    hf = json.loads((FIXTURES / "hf_qwen2_tiny" / "config.json").read_text())
    hf.update(change)
    with self.assertRaisesRegex(ValueError, message):
      models.config_from_hf(hf)


if __name__ == "__main__":
  absltest.main()
