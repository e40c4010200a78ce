"""Model configuration: a frozen, validated dataclass and the named configs.

The named real configs copy the hyperparameters of the published Hugging Face
``config.json`` files (Qwen/Qwen2.5-0.5B-Instruct, Qwen/Qwen2.5-1.5B-Instruct,
meta-llama/Llama-3.2-1B-Instruct); ``tiny`` and ``small-10m`` are ours.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax.numpy as jnp

from jagent._src.errors import FieldError
from jagent._src import checks

FAMILIES = ("qwen2", "llama")
ROPE_TYPES = ("default", "llama3")
DTYPES = ("float32", "bfloat16", "float16")
# Attention implementations (jagent.models._attention): "auto" picks one per
# platform at trace time.
ATTENTION_IMPLS = ("auto", "reference", "xla", "cudnn", "pallas")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of a decoder-only transformer (Qwen2 / Llama 3 family).

  The architecture is pre-norm: ``x + attn(rmsnorm(x))`` then
  ``x + swiglu(rmsnorm(x))``, rotary position embeddings (RoPE, Su et al.,
  https://arxiv.org/abs/2104.09864) on queries and keys, grouped-query
  attention (Ainslie et al., https://arxiv.org/abs/2305.13245), a final RMSNorm
  and tied or untied output embeddings. Qwen2 adds biases to q/k/v
  (``qkv_bias``); Llama 3.x scales RoPE frequencies (``rope_type="llama3"``).

  Attributes:
    family: "qwen2" or "llama" (names the Hugging Face architecture on export).
    vocab_size: V, number of token ids.
    embed_dim: D, model width (HF ``hidden_size``).
    num_layers: L (HF ``num_hidden_layers``).
    num_heads: H query heads (HF ``num_attention_heads``).
    num_kv_heads: K key/value heads; must divide ``num_heads``.
    head_dim: Dh, per-head width (HF ``head_dim``, default D // H).
    mlp_dim: F, SwiGLU hidden width (HF ``intermediate_size``).
    qkv_bias: biases on the q/k/v projections (Qwen2: True).
    tie_embeddings: output logits use the input embedding matrix.
    rope_theta: RoPE base.
    rope_type: "default" or "llama3" (frequency scaling of Llama 3.1+).
    rope_factor, rope_low_freq_factor, rope_high_freq_factor,
    rope_original_max_position: the "llama3" scaling parameters.
    norm_eps: RMSNorm epsilon.
    max_position: the largest supported position (HF
      ``max_position_embeddings``); informational, not enforced on device.
    dtype: activation dtype name ("float32", "bfloat16", "float16").
    remat: rematerialize each decoder block in the backward pass
      (``jax.checkpoint`` around the block of a forward without a KV cache):
      training keeps only the blocks' inputs ``[B, S, D]`` instead of every
      block's activations (the ``H x S x S`` attention scores, the MLP's
      ``S x F``), for about one more forward pass of compute. Values and
      gradients are unchanged; sampling (with a cache) is unaffected.
    param_dtype: parameter dtype name.
    cache_dtype: the KV cache's dtype name; "" (the default) is ``dtype``.
      "bfloat16" under float32 compute halves the cache, the largest buffer
      of a long rollout, for a rounding of the cached keys and values only
      (the cache-free training forward is unaffected). A runtime choice like
      ``attention_impl``: not written to a Hugging Face config.json.
    attention_impl: which attention kernel runs, one of ``ATTENTION_IMPLS``:
      "auto" (the default: the reference on CPU, cuDNN's fused attention on
      GPU where dtype and shapes allow, the Pallas flash kernel on TPU where
      shapes allow, else XLA), "reference" (jagent's own XLA code), "xla"
      (``jax.nn.dot_product_attention(implementation="xla")``), "cudnn"
      (GPU only) or "pallas" (TPU only). The outputs agree up to rounding.
      A runtime choice, not part of the architecture: it is not written to a
      Hugging Face config.json and reads back as "auto". See
      :mod:`jagent.models._attention`.
    bos_id, eos_id, pad_id: special token ids (None when the family has none);
      ``pad_id`` is what the sampler writes after a row stops.

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming the first invalid field.
  """

  family: str = "qwen2"
  vocab_size: int = 512
  embed_dim: int = 128
  num_layers: int = 3
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  mlp_dim: int = 384
  qkv_bias: bool = True
  tie_embeddings: bool = True
  rope_theta: float = 10000.0
  rope_type: str = "default"
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192
  norm_eps: float = 1e-6
  max_position: int = 4096
  dtype: str = "float32"
  param_dtype: str = "float32"
  remat: bool = False
  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int = 0
  attention_impl: str = "auto"
  cache_dtype: str = ""

  def __post_init__(self):
    def bad(field, why):
      raise FieldError("ModelConfig", field, getattr(self, field), why)

    if self.family not in FAMILIES:
      bad("family", f"must be one of {FAMILIES}")
    for f in ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads",
              "head_dim", "mlp_dim", "max_position", "rope_original_max_position"):
      checks.check_int(f, getattr(self, f), 1, why="must be a positive int",
                       owner="ModelConfig")
    if self.num_heads % self.num_kv_heads:
      bad("num_kv_heads", f"must divide num_heads={self.num_heads}")
    if self.head_dim % 2:
      bad("head_dim", "must be even (RoPE rotates pairs)")
    if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
      bad("rope_theta", "must be a positive finite float")
    if self.rope_type not in ROPE_TYPES:
      bad("rope_type", f"must be one of {ROPE_TYPES}")
    if self.rope_type == "llama3":
      if not self.rope_factor >= 1.0:
        bad("rope_factor", "must be >= 1 for llama3 scaling")
      if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
        bad("rope_high_freq_factor", "llama3 scaling needs 0 < low_freq_factor < high_freq_factor")
    if not (0 < self.norm_eps < 1):
      bad("norm_eps", "must be in (0, 1)")
    for f in ("dtype", "param_dtype"):
      if getattr(self, f) not in DTYPES:
        bad(f, f"must be one of {DTYPES}")
    if self.cache_dtype not in ("",) + DTYPES:
      bad("cache_dtype", f"must be '' (the compute dtype) or one of {DTYPES}")
    if self.attention_impl not in ATTENTION_IMPLS:
      bad("attention_impl", f"must be one of {ATTENTION_IMPLS}")
    for f in ("bos_id", "eos_id"):
      v = getattr(self, f)
      if v is not None and not 0 <= v < self.vocab_size:
        bad(f, f"must be None or in [0, vocab_size={self.vocab_size})")
    if not 0 <= self.pad_id < self.vocab_size:
      bad("pad_id", f"must be in [0, vocab_size={self.vocab_size})")

  @property
  def jnp_dtype(self):
    """The activation dtype as a jnp dtype."""
    return jnp.dtype(self.dtype)

  @property
  def jnp_cache_dtype(self):
    """The KV cache's dtype as a jnp dtype (``cache_dtype``, else ``dtype``)."""
    return jnp.dtype(self.cache_dtype or self.dtype)

  @property
  def jnp_param_dtype(self):
    """The parameter dtype as a jnp dtype."""
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> "ModelConfig":
    """A copy with ``changes`` applied (validated again)."""
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Number of scalar parameters of ``init(self, key)``."""
    d, h, k, dh, f = self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_dim
    attn = d * h * dh * 2 + 2 * d * k * dh
    if self.qkv_bias:
      attn += h * dh + 2 * k * dh
    layer = attn + 3 * d * f + 2 * d
    out = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * layer + d + out


_NANO = ModelConfig(
    family="qwen2", vocab_size=512, embed_dim=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, mlp_dim=256, qkv_bias=True, tie_embeddings=True,
    rope_theta=10000.0, norm_eps=1e-6, max_position=4096, bos_id=None, eos_id=2,
    pad_id=0)

_CONFIGS: dict[str, ModelConfig] = {
    # ~0.65M parameters: the CPU default (vocab of the shipped tiny tokenizer).
    "tiny": ModelConfig(
        family="qwen2", vocab_size=512, embed_dim=128, num_layers=3, num_heads=4,
        num_kv_heads=2, head_dim=32, mlp_dim=384, qkv_bias=True, tie_embeddings=True,
        rope_theta=10000.0, norm_eps=1e-6, max_position=4096, bos_id=None, eos_id=2,
        pad_id=0),
    # ~0.16M parameters: the fastest CPU policy (narrow and shallow; attention
    # over [heads, S, S] dominates training on long multi-turn contexts).
    "nano": _NANO,
    # ~0.28M parameters: "nano" with 4 layers, the main job's policy (why
    # four layers: docs/results.md, "Model sizes").
    "micro": dataclasses.replace(_NANO, num_layers=4),
    # ~10.8M parameters (d384, 6 layers, vocab 8k): the size of the CPU
    # kernel measurements in docs/results.md.
    "small-10m": ModelConfig(
        family="qwen2", vocab_size=8192, embed_dim=384, num_layers=6, num_heads=6,
        num_kv_heads=2, head_dim=64, mlp_dim=768, qkv_bias=True, tie_embeddings=True,
        rope_theta=10000.0, norm_eps=1e-6, max_position=4096, bos_id=None, eos_id=2,
        pad_id=0),
    "qwen2.5-0.5b": ModelConfig(
        family="qwen2", vocab_size=151936, embed_dim=896, num_layers=24, num_heads=14,
        num_kv_heads=2, head_dim=64, mlp_dim=4864, qkv_bias=True, tie_embeddings=True,
        rope_theta=1000000.0, norm_eps=1e-6, max_position=32768, bos_id=151643,
        eos_id=151645, pad_id=151643),
    "qwen2.5-1.5b": ModelConfig(
        family="qwen2", vocab_size=151936, embed_dim=1536, num_layers=28, num_heads=12,
        num_kv_heads=2, head_dim=128, mlp_dim=8960, qkv_bias=True, tie_embeddings=True,
        rope_theta=1000000.0, norm_eps=1e-6, max_position=32768, bos_id=151643,
        eos_id=151645, pad_id=151643),
    # Qwen2.5-3B(-Instruct)'s architecture (3,085,938,688 parameters): RAGEN's
    # 3B setting.
    "qwen2.5-3b": ModelConfig(
        family="qwen2", vocab_size=151936, embed_dim=2048, num_layers=36, num_heads=16,
        num_kv_heads=2, head_dim=128, mlp_dim=11008, qkv_bias=True, tie_embeddings=True,
        rope_theta=1000000.0, norm_eps=1e-6, max_position=32768, bos_id=151643,
        eos_id=151645, pad_id=151643),
    "llama-3.2-1b": ModelConfig(
        family="llama", vocab_size=128256, embed_dim=2048, num_layers=16, num_heads=32,
        num_kv_heads=8, head_dim=64, mlp_dim=8192, qkv_bias=False, tie_embeddings=True,
        rope_theta=500000.0, rope_type="llama3", rope_factor=32.0,
        rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
        rope_original_max_position=8192, norm_eps=1e-5, max_position=131072,
        bos_id=128000, eos_id=128009, pad_id=128004),
}


def config_names() -> tuple[str, ...]:
  """Names accepted by :func:`get_config`."""
  return tuple(_CONFIGS)


def get_config(name: str, **overrides) -> ModelConfig:
  """A named config, optionally with fields replaced.

  Args:
    name: one of :func:`config_names` ("tiny", "small-10m", "qwen2.5-0.5b",
      "qwen2.5-1.5b", "qwen2.5-3b", "llama-3.2-1b").
    **overrides: ModelConfig fields to replace (e.g. ``dtype="bfloat16"``).

  Returns:
    The validated ModelConfig.

  Raises:
    ValueError: unknown name, or an invalid override.
  """
  if name not in _CONFIGS:
    raise ValueError(f"unknown model config {name!r}; known: {sorted(_CONFIGS)}")
  return _CONFIGS[name].replace(**overrides) if overrides else _CONFIGS[name]


_ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}


def config_from_hf(hf: Mapping[str, Any], **overrides) -> ModelConfig:
  """Builds a ModelConfig from a Hugging Face ``config.json`` dict.

  Reads both transformers 4 (``rope_theta``, ``rope_scaling``, ``torch_dtype``)
  and transformers 5 (``rope_parameters``, ``dtype``) spellings.

  Args:
    hf: the parsed config.json.
    **overrides: fields to replace afterwards (e.g. ``param_dtype``).

  Returns:
    A validated ModelConfig (``dtype``/``param_dtype`` default to float32).

  Raises:
    ValueError: unsupported architecture or features (sliding window, MLP
      bias, an unknown RoPE scaling type), or missing keys.
  """
  archs = hf.get("architectures") or []
  family = None
  for a in archs:
    family = _ARCHITECTURES.get(a, family)
  if family is None:
    family = {"qwen2": "qwen2", "llama": "llama"}.get(hf.get("model_type"))
  if family is None:
    raise ValueError(
        f"unsupported architecture {archs or hf.get('model_type')!r}; supported: "
        f"{sorted(_ARCHITECTURES)}")
  try:
    d = int(hf["hidden_size"])
    h = int(hf["num_attention_heads"])
    fields = dict(
        family=family, vocab_size=int(hf["vocab_size"]), embed_dim=d,
        num_layers=int(hf["num_hidden_layers"]), num_heads=h,
        num_kv_heads=int(hf.get("num_key_value_heads") or h),
        head_dim=int(hf.get("head_dim") or d // h),
        mlp_dim=int(hf["intermediate_size"]),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position=int(hf.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", family == "qwen2")),
    )
  except KeyError as e:
    raise ValueError(f"config.json lacks required key {e.args[0]!r}") from None
  if family == "qwen2":
    fields["qkv_bias"] = True
    if hf.get("use_sliding_window"):
      raise ValueError("config.json use_sliding_window=True is not supported")
  else:
    fields["qkv_bias"] = bool(hf.get("attention_bias", False))
    if hf.get("mlp_bias"):
      raise ValueError("config.json mlp_bias=True is not supported")
  rope = dict(hf.get("rope_parameters") or {})
  rope.update(hf.get("rope_scaling") or {})
  theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
  fields["rope_theta"] = float(theta)
  rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
  if rope_type == "llama3":
    fields.update(
        rope_type="llama3", rope_factor=float(rope["factor"]),
        rope_low_freq_factor=float(rope["low_freq_factor"]),
        rope_high_freq_factor=float(rope["high_freq_factor"]),
        rope_original_max_position=int(rope["original_max_position_embeddings"]))
  elif rope_type != "default":
    raise ValueError(f"unsupported RoPE scaling type {rope_type!r}; supported: {ROPE_TYPES}")
  for ours, theirs in (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id")):
    v = hf.get(theirs)
    if isinstance(v, (list, tuple)):
      v = v[0] if v else None
    fields[ours] = None if v is None else int(v)
  pad = hf.get("pad_token_id")
  fields["pad_id"] = int(pad) if pad is not None else (fields["eos_id"] or 0)
  fields.update(overrides)
  return ModelConfig(**fields)


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
  """The Hugging Face ``config.json`` dict (transformers 5 spelling) of a config.

  Raises:
    ValueError: a Qwen2 config without q/k/v biases (Qwen2ForCausalLM always
      has them; use family="llama" with ``qkv_bias=False`` instead).
  """
  if config.family == "qwen2" and not config.qkv_bias:
    raise ValueError("a qwen2 config must have qkv_bias=True to export to Qwen2ForCausalLM")
  rope: dict[str, Any] = {"rope_theta": config.rope_theta, "rope_type": config.rope_type}
  if config.rope_type == "llama3":
    rope.update(factor=config.rope_factor, low_freq_factor=config.rope_low_freq_factor,
                high_freq_factor=config.rope_high_freq_factor,
                original_max_position_embeddings=config.rope_original_max_position)
  out: dict[str, Any] = {
      "architectures": ["Qwen2ForCausalLM" if config.family == "qwen2" else "LlamaForCausalLM"],
      "model_type": config.family,
      "vocab_size": config.vocab_size,
      "hidden_size": config.embed_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "intermediate_size": config.mlp_dim,
      "hidden_act": "silu",
      "rms_norm_eps": config.norm_eps,
      "max_position_embeddings": config.max_position,
      "tie_word_embeddings": config.tie_embeddings,
      "rope_theta": config.rope_theta,
      "rope_parameters": rope,
      "bos_token_id": config.bos_id,
      "eos_token_id": config.eos_id,
      "pad_token_id": config.pad_id,
      "dtype": config.param_dtype,
  }
  if config.family == "llama":
    out.update(attention_bias=config.qkv_bias, mlp_bias=False)
  else:
    out.update(use_sliding_window=False)
  return out
