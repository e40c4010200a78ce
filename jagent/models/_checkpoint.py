"""Hugging Face checkpoint directories <-> ``Params`` (no torch at run time).

A directory holds ``config.json`` and either ``model.safetensors`` or a sharded
``model.safetensors.index.json`` (``weight_map``: tensor name -> file). Tensors
are read one at a time with ``safetensors.safe_open(..., framework="numpy")``
(bfloat16 via ml_dtypes), converted to our layouts (pure transposes and
reshapes, so the round trip is exact) and placed with ``jax.device_put``,
optionally straight into a target sharding.

Name table (Hugging Face ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``, HF shape
-> ours):

==============================================  ==========  ============
``model.embed_tokens.weight``                   [V, D]      [V, D]
``model.layers.{i}.input_layernorm.weight``     [D]         [D]
``model.layers.{i}.self_attn.q_proj.weight``    [H*Dh, D]   [D, H, Dh]
``model.layers.{i}.self_attn.{k,v}_proj.weight``  [K*Dh, D]   [D, K, Dh]
``model.layers.{i}.self_attn.q_proj.bias``      [H*Dh]      [H, Dh]
``model.layers.{i}.self_attn.{k,v}_proj.bias``  [K*Dh]      [K, Dh]
``model.layers.{i}.self_attn.o_proj.weight``    [D, H*Dh]   [H, Dh, D]
``model.layers.{i}.post_attention_layernorm.weight``  [D]   [D]
``model.layers.{i}.mlp.{gate,up}_proj.weight``  [F, D]      [D, F]
``model.layers.{i}.mlp.down_proj.weight``       [D, F]      [F, D]
``model.norm.weight``                           [D]         [D]
``lm_head.weight`` (untied only)                [V, D]      [D, V]
==============================================  ==========  ============

Ours are per layer: layer i's tensors are entry ``[i]`` of the stacked
``Params.layers`` fields (``layers.wq[i]`` is ``[D, H, Dh]``).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Mapping

import jax
import numpy as np

from jagent._src import files
from jagent.models import _config
from jagent.models import _lora
from jagent.models import _transformer

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Present in some older checkpoints; recomputed from the config.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _table(config: _config.ModelConfig) -> list[tuple[str, tuple[Any, ...], tuple[int, ...],
                                                       Callable, Callable]]:
  """(hf name, our path, hf shape, hf->ours, ours->hf) for every tensor."""
  c = config
  d, h, k, dh, f, v = (c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim, c.mlp_dim,
                       c.vocab_size)
  same = (lambda a: a, lambda a: a)

  def proj(n):  # [n*Dh, D] <-> [D, n, Dh]
    return (lambda a: a.T.reshape(d, n, dh), lambda a: a.reshape(d, n * dh).T)

  def bias(n):  # [n*Dh] <-> [n, Dh]
    return (lambda a: a.reshape(n, dh), lambda a: a.reshape(n * dh))

  out_proj = (lambda a: a.T.reshape(h, dh, d), lambda a: a.reshape(h * dh, d).T)
  transpose = (lambda a: a.T, lambda a: a.T)
  rows = [("model.embed_tokens.weight", ("embed",), (v, d), *same)]
  for i in range(c.num_layers):
    pre = f"model.layers.{i}."
    L = ("layers", i)
    rows += [
        (pre + "input_layernorm.weight", L + ("attn_norm",), (d,), *same),
        (pre + "self_attn.q_proj.weight", L + ("wq",), (h * dh, d), *proj(h)),
        (pre + "self_attn.k_proj.weight", L + ("wk",), (k * dh, d), *proj(k)),
        (pre + "self_attn.v_proj.weight", L + ("wv",), (k * dh, d), *proj(k)),
    ]
    if c.qkv_bias:
      rows += [
          (pre + "self_attn.q_proj.bias", L + ("bq",), (h * dh,), *bias(h)),
          (pre + "self_attn.k_proj.bias", L + ("bk",), (k * dh,), *bias(k)),
          (pre + "self_attn.v_proj.bias", L + ("bv",), (k * dh,), *bias(k)),
      ]
    rows += [
        (pre + "self_attn.o_proj.weight", L + ("wo",), (d, h * dh), *out_proj),
        (pre + "post_attention_layernorm.weight", L + ("mlp_norm",), (d,), *same),
        (pre + "mlp.gate_proj.weight", L + ("w_gate",), (f, d), *transpose),
        (pre + "mlp.up_proj.weight", L + ("w_up",), (f, d), *transpose),
        (pre + "mlp.down_proj.weight", L + ("w_down",), (d, f), *transpose),
    ]
  rows.append(("model.norm.weight", ("final_norm",), (d,), *same))
  if not c.tie_embeddings:
    rows.append(("lm_head.weight", ("lm_head",), (v, d), *transpose))
  return rows


def _get(tree, path):
  """The leaf at ``path`` of ``Params`` (or a like-shaped tree of shardings).

  ``("layers", i, name)`` is layer i of the stacked ``layers.name``;
  ``("layers", name)`` the whole stack.
  """
  if path[0] == "layers" and len(path) == 3:
    leaf = getattr(tree.layers, path[2])
    return None if leaf is None else leaf[path[1]]
  for p in path:
    tree = getattr(tree, p)
  return tree


def _layer_major(table):
  """``_table``'s rows with each layer field's L rows together, in layer order.

  The loader stacks a field once its L tensors are read, so reading field by
  field holds one field's stack on the host at a time, not the whole model.
  """
  fields = {name: j for j, name in enumerate(_transformer.LAYER_FIELDS)}
  def key(row):
    ours = row[1]
    if ours[0] == "layers":
      return (1, fields[ours[2]], ours[1])
    return (0 if ours[0] == "embed" else 2, 0, 0)
  return sorted(table, key=key)


def _build(config: _config.ModelConfig, leaves: dict[tuple[Any, ...], Any]) -> _transformer.Params:
  """Assembles Params from {our path: array} (layer fields as ``("layers", name)`` stacks)."""
  layers = _transformer.LayerParams(**{name: leaves.get(("layers", name))
                                       for name in _transformer.LAYER_FIELDS})
  return _transformer.Params(embed=leaves[("embed",)], layers=layers,
                             final_norm=leaves[("final_norm",)],
                             lm_head=leaves.get(("lm_head",)))


def read_hf_config(path: str, **overrides) -> _config.ModelConfig:
  """ModelConfig from ``<path>/config.json`` (see ``config_from_hf``).

  Raises:
    ValueError: no config.json, or an unsupported config.
  """
  fn = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(fn):
    raise ValueError(f"no {CONFIG_FILE} in checkpoint directory {path!r}")
  with open(fn) as fh:
    return _config.config_from_hf(json.load(fh), **overrides)


def _weight_files(path: str) -> dict[str, str]:
  """tensor name -> safetensors file of a checkpoint directory."""
  index = os.path.join(path, INDEX_FILE)
  if os.path.isfile(index):
    with open(index) as fh:
      weight_map = json.load(fh)["weight_map"]
    return {name: os.path.join(path, fn) for name, fn in weight_map.items()}
  single = os.path.join(path, SINGLE_FILE)
  if not os.path.isfile(single):
    raise ValueError(f"checkpoint directory {path!r} has neither {SINGLE_FILE} nor {INDEX_FILE}")
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(single, framework="numpy") as fh:
    return {name: single for name in fh.keys()}


def load_hf_checkpoint(
    path: str,
    *,
    config: _config.ModelConfig | None = None,
    shardings: Any | None = None,
    **config_overrides,
) -> tuple[_transformer.Params, _config.ModelConfig]:
  """Loads a Hugging Face Qwen2 / Llama checkpoint directory into ``Params``.

  Args:
    path: directory with config.json and model.safetensors (or a sharded
      model.safetensors.index.json).
    config: optional config to use instead of reading config.json (its shapes
      must match the tensors).
    shardings: optional pytree like ``Params`` with a ``jax.sharding.Sharding``
      per leaf (e.g. ``jagent.sharding.param_shardings(params_shapes, mesh)``);
      each tensor goes straight to its target sharding.
    **config_overrides: ModelConfig fields replaced after reading config.json
      (e.g. ``param_dtype="bfloat16"``, ``dtype="bfloat16"``).

  Returns:
    ``(params, config)``; params in ``config.param_dtype``.

  Raises:
    ValueError: missing config/weights, unsupported architecture, a missing or
      unexpected tensor, or a shape mismatch (the message names the tensor).
  """
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  if config is None:
    config = read_hf_config(path, **config_overrides)
  elif config_overrides:
    config = config.replace(**config_overrides)
  files = _weight_files(path)
  table = _table(config)
  expected = {row[0] for row in table}
  missing = [row[0] for row in table if row[0] not in files]
  if missing:
    raise ValueError(f"checkpoint {path!r} lacks {len(missing)} tensor(s), e.g. {missing[:3]}")
  extra = sorted(n for n in files if n not in expected and not n.endswith(_IGNORED_SUFFIXES)
                 and not (config.tie_embeddings and n == "lm_head.weight"))
  if extra:
    raise ValueError(f"checkpoint {path!r} has {len(extra)} unexpected tensor(s), e.g. "
                     f"{extra[:3]} (unsupported architecture variant?)")
  dtype = config.jnp_param_dtype
  leaves: dict[tuple[Any, ...], Any] = {}
  handles: dict[str, Any] = {}
  stack: list[np.ndarray] = []  # the layer field being read, one array a layer

  def put(ours, arr):
    target = None if shardings is None else _get(shardings, ours)
    leaves[ours] = jax.device_put(arr, target) if target is not None else jax.numpy.asarray(arr)

  try:
    for name, ours, hf_shape, to_ours, _ in _layer_major(table):
      fn = files[name]
      if fn not in handles:
        handles[fn] = safe_open(fn, framework="numpy").__enter__()
      arr = handles[fn].get_tensor(name)
      if tuple(arr.shape) != hf_shape:
        raise ValueError(f"tensor {name!r} has shape {tuple(arr.shape)}, config expects "
                         f"{hf_shape}")
      arr = np.ascontiguousarray(to_ours(arr).astype(dtype))
      if ours[0] != "layers":
        put(ours, arr)
        continue
      stack.append(arr)
      if len(stack) == config.num_layers:
        put(("layers", ours[2]), np.stack(stack))
        stack = []
  finally:
    for h in handles.values():
      h.__exit__(None, None, None)
  return _build(config, leaves), config


def save_hf_checkpoint(
    params: _transformer.Params,
    config: _config.ModelConfig,
    path: str,
    *,
    max_shard_bytes: int | None = None,
    extra_files: Mapping[str, str] | None = None,
) -> None:
  """Writes ``params`` as a Hugging Face checkpoint directory.

  Writes config.json (transformers 5 spelling) and model.safetensors, or, when
  the tensors exceed ``max_shard_bytes``, ``model-0000i-of-0000n.safetensors``
  files plus model.safetensors.index.json. Tensors keep the params' dtype.
  Every shape is checked before anything is written; the files are written
  in full in a staging directory beside ``path``, then moved in (weights and
  ``extra_files``, then the index, then config.json;
  ``jagent._src.files.staged_directory``), so an interrupted export never
  leaves a truncated or half-new checkpoint.

  Args:
    params: the parameters (gathered to the host).
    config: their config.
    path: output directory (created).
    max_shard_bytes: optional size limit per file.
    extra_files: file name -> text written beside the weights, e.g. a
      tokenizer's ``Tokenizer.hf_files()``.

  Raises:
    ValueError: params whose shapes disagree with ``config``.
  """
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  tensors = {}
  for name, ours, hf_shape, _, to_hf in _table(config):
    arr = np.asarray(jax.device_get(_get(params, ours)))
    arr = np.ascontiguousarray(to_hf(arr))
    if tuple(arr.shape) != hf_shape:
      raise ValueError(f"param {ours} gives {name!r} of shape {arr.shape}, expected {hf_shape}")
    tensors[name] = arr
  hf = _config.config_to_hf(config)
  hf["dtype"] = str(next(iter(tensors.values())).dtype)
  meta = {"format": "pt"}
  total = sum(a.nbytes for a in tensors.values())
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, arr in tensors.items():
    if max_shard_bytes is not None and shards[-1] and size + arr.nbytes > max_shard_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = arr
    size += arr.nbytes
  # A single-file export over a sharded one drops the old index (loaders
  # prefer an index); a sharded export's index wins over an old single file.
  with files.staged_directory(path, last=(INDEX_FILE, CONFIG_FILE),
                              remove=(INDEX_FILE,) if len(shards) == 1 else ()) as staging:
    if len(shards) == 1:
      safetensors.numpy.save_file(tensors, os.path.join(staging, SINGLE_FILE), metadata=meta)
    else:
      weight_map = {}
      for j, shard in enumerate(shards):
        fn = f"model-{j + 1:05d}-of-{len(shards):05d}.safetensors"
        safetensors.numpy.save_file(shard, os.path.join(staging, fn), metadata=meta)
        weight_map.update({name: fn for name in shard})
      with open(os.path.join(staging, INDEX_FILE), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
    for name, text in (extra_files or {}).items():
      with open(os.path.join(staging, name), "w", encoding="utf-8") as fh:
        fh.write(text)
    with open(os.path.join(staging, CONFIG_FILE), "w") as fh:
      json.dump(hf, fh, indent=2)


# ------------------------------------------------------------------ PEFT LoRA
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
# Our module name -> the Hugging Face projection it adapts (Qwen2 and Llama).
_PEFT_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                 "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                 "down": "mlp.down_proj"}


def _peft_name(layer: int, module: str, factor: str) -> str:
  """PEFT's saved key: ``base_model.model.`` + the HF module path + ``lora_{A,B}.weight``."""
  return f"base_model.model.model.layers.{layer}.{_PEFT_MODULES[module]}.lora_{factor}.weight"


def save_peft_adapter(params: _lora.LoraParams, config: _config.ModelConfig, path: str, *,
                      base_model_name_or_path: str | None = None) -> None:
  """Writes LoRA adapters as a Hugging Face PEFT adapter directory.

  ``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``,
  ``lora_dropout``, ``target_modules`` as HF projection names) and
  ``adapter_model.safetensors`` with PEFT's saved key names
  (``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``
  ``[r, in]``, ``...lora_B.weight`` ``[out, r]``; the format described in
  PEFT's docs, "PEFT checkpoint format"). ``peft.PeftModel.from_pretrained``
  loads it onto the base checkpoint (a ``transformers`` Qwen2/Llama model);
  :func:`load_peft_adapter` reads it back. Files are staged and moved in as
  :func:`save_hf_checkpoint` does.

  Args:
    params: a :class:`jagent.models.LoraParams` with adapters (its base is
      not written).
    config: the base model's config.
    path: output directory (created).
    base_model_name_or_path: recorded in adapter_config.json (e.g. the
      base's Hugging Face directory or hub id); None writes null.

  Raises:
    ValueError: ``params`` without adapters, or adapters whose shapes
      disagree with ``config``.
  """
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  if not isinstance(params, _lora.LoraParams) or params.adapters is None:
    raise ValueError("save_peft_adapter needs a LoraParams with adapters")
  lc = params.config
  shapes = _lora.adapter_shapes(config, lc.rank)
  tensors = {}
  for name, pair in params.adapters.items():
    a_all, b_all = (np.asarray(jax.device_get(x), np.float32) for x in (pair.a, pair.b))
    want = tuple((config.num_layers, *s) for s in shapes[name])
    if (a_all.shape, b_all.shape) != want:
      raise ValueError(f"adapter {name!r} has shapes {a_all.shape}, {b_all.shape}; "
                       f"config expects {want}")
    for i, (a, b) in enumerate(zip(a_all, b_all)):
      tensors[_peft_name(i, name, "A")] = np.ascontiguousarray(a.reshape(-1, lc.rank).T)
      tensors[_peft_name(i, name, "B")] = np.ascontiguousarray(b.reshape(lc.rank, -1).T)
  adapter_config = {
      "peft_type": "LORA", "task_type": "CAUSAL_LM",
      "base_model_name_or_path": base_model_name_or_path, "revision": None,
      "r": lc.rank, "lora_alpha": lc.alpha, "lora_dropout": lc.dropout,
      "target_modules": sorted(_PEFT_MODULES[m].split(".")[1] for m in lc.modules),
      "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
      "init_lora_weights": True, "inference_mode": True, "modules_to_save": None,
  }
  with files.staged_directory(path, last=(PEFT_CONFIG_FILE,)) as staging:
    safetensors.numpy.save_file(tensors, os.path.join(staging, PEFT_WEIGHTS_FILE),
                                metadata={"format": "pt"})
    with open(os.path.join(staging, PEFT_CONFIG_FILE), "w") as fh:
      json.dump(adapter_config, fh, indent=2)


def load_peft_adapter(path: str, base: Any, config: _config.ModelConfig) -> _lora.LoraParams:
  """Reads a PEFT LoRA adapter directory onto ``base`` (inverse of :func:`save_peft_adapter`).

  Args:
    path: directory with adapter_config.json and adapter_model.safetensors.
    base: the base ``Params`` the adapters apply to.
    config: the base's config.

  Returns:
    :class:`jagent.models.LoraParams` (float32 adapters).

  Raises:
    ValueError: missing files, a non-LoRA or unsupported PEFT config
      (``use_rslora``, ``use_dora``, ``fan_in_fan_out``, a bias, a module
      this model does not have), or a missing or misshapen tensor.
  """
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  cfg_file = os.path.join(path, PEFT_CONFIG_FILE)
  weights = os.path.join(path, PEFT_WEIGHTS_FILE)
  if not (os.path.isfile(cfg_file) and os.path.isfile(weights)):
    raise ValueError(f"{path!r} lacks {PEFT_CONFIG_FILE} or {PEFT_WEIGHTS_FILE}")
  with open(cfg_file) as fh:
    pc = json.load(fh)
  if pc.get("peft_type") != "LORA":
    raise ValueError(f"{cfg_file}: peft_type={pc.get('peft_type')!r}, expected 'LORA'")
  for key, ok in (("use_rslora", False), ("use_dora", False), ("fan_in_fan_out", False),
                  ("bias", "none")):
    if pc.get(key, ok) != ok:
      raise ValueError(f"{cfg_file}: {key}={pc[key]!r} is not supported")
  targets = pc.get("target_modules")
  ours = {v.split(".")[1]: k for k, v in _PEFT_MODULES.items()}
  if targets == _lora.ALL_LINEAR:
    modules = _lora.ALL_LINEAR
  else:
    targets = [targets] if isinstance(targets, str) else list(targets or [])
    unknown = [t for t in targets if t not in ours]
    if unknown:
      raise ValueError(f"{cfg_file}: target_modules {unknown} are not projections of "
                       f"this model ({sorted(ours)})")
    modules = tuple(ours[t] for t in targets)
  lc = _lora.LoraConfig(rank=int(pc["r"]), alpha=float(pc["lora_alpha"]),
                        dropout=float(pc.get("lora_dropout", 0.0)), target_modules=modules)
  lc.check_model(config)
  shapes = _lora.adapter_shapes(config, lc.rank)
  adapters = {}
  with safe_open(weights, framework="numpy") as fh:
    names = set(fh.keys())
    for m in lc.modules:
      pair = []
      for factor, shape in zip("AB", shapes[m]):
        want = (lc.rank, math.prod(shape[:-1])) if factor == "A" else (
            math.prod(shape[1:]), lc.rank)
        per_layer = []
        for i in range(config.num_layers):
          key = _peft_name(i, m, factor)
          if key not in names:
            raise ValueError(f"{weights} lacks tensor {key!r}")
          arr = fh.get_tensor(key).astype(np.float32)
          if arr.shape != want:
            raise ValueError(f"tensor {key!r} has shape {arr.shape}, expected {want}")
          per_layer.append(arr.T.reshape(shape))
        pair.append(jax.numpy.asarray(np.stack(per_layer)))
      adapters[m] = _lora.LoraPair(a=pair[0], b=pair[1])
  return _lora.LoraParams(base=base, adapters=adapters, config=lc)
