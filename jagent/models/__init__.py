"""jagent.models: pure-function decoder-only LLM policies, checkpoints, sampler.

Example::

  from jagent import models, tokenizers
  config = models.get_config("tiny")            # or load_hf_checkpoint(dir)
  params = models.init(config, jax.random.key(0))
  tok = tokenizers.load_tiny_tokenizer()
  ids = tok.encode_chat([{"role": "user", "content": "#_P#"}])
  out = models.generate(
      params, jnp.asarray([ids]), jnp.asarray([len(ids)]), jax.random.key(1),
      config=config, cache_size=256,
      sampling=models.SamplingConfig(max_new_tokens=32, eos_ids=(tok.eos_id,)))
  # out.tokens [1, 32], out.logprobs (log pi_T), out.lengths, out.cache: pass
  # out.cache back with the next observation's tokens to continue the dialogue.

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

from jagent.models._checkpoint import load_hf_checkpoint
from jagent.models._checkpoint import load_peft_adapter
from jagent.models._checkpoint import read_hf_config
from jagent.models._checkpoint import save_hf_checkpoint
from jagent.models._checkpoint import save_peft_adapter
from jagent.models._config import ATTENTION_IMPLS
from jagent.models._config import config_from_hf
from jagent.models._config import config_names
from jagent.models._config import config_to_hf
from jagent.models._config import DTYPES
from jagent.models._config import get_config
from jagent.models._config import ModelConfig
from jagent.models._lora import init_lora
from jagent.models._lora import join_frozen
from jagent.models._lora import LORA_MODULES
from jagent.models._lora import lora_axes
from jagent.models._lora import LoraConfig
from jagent.models._lora import LoraPair
from jagent.models._lora import LoraParams
from jagent.models._lora import merge_lora
from jagent.models._lora import split_frozen
from jagent.models._sampling import generate
from jagent.models._sampling import GenerateOutput
from jagent.models._sampling import sample_logits
from jagent.models._sampling import SamplingConfig
from jagent.models._transformer import apply
from jagent.models._transformer import cache_axes
from jagent.models._transformer import hidden_states
from jagent.models._transformer import init
from jagent.models._transformer import init_cache
from jagent.models._transformer import KVCache
from jagent.models._transformer import LayerParams
from jagent.models._transformer import param_axes
from jagent.models._transformer import per_layer_form
from jagent.models._transformer import Params
from jagent.models._transformer import rope_inv_freq
from jagent.models._transformer import stacked_cache

__all__ = (
    "ATTENTION_IMPLS",
    "DTYPES",
    "GenerateOutput",
    "KVCache",
    "LORA_MODULES",
    "LayerParams",
    "LoraConfig",
    "LoraPair",
    "LoraParams",
    "ModelConfig",
    "SamplingConfig",
    "Params",
    "apply",
    "cache_axes",
    "config_from_hf",
    "config_names",
    "config_to_hf",
    "generate",
    "get_config",
    "hidden_states",
    "init",
    "init_cache",
    "init_lora",
    "join_frozen",
    "load_hf_checkpoint",
    "load_peft_adapter",
    "lora_axes",
    "merge_lora",
    "param_axes",
    "per_layer_form",
    "read_hf_config",
    "rope_inv_freq",
    "sample_logits",
    "save_hf_checkpoint",
    "save_peft_adapter",
    "split_frozen",
    "stacked_cache",
)
