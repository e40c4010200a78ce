"""LoRA adapters (Hu et al., https://arxiv.org/abs/2106.09685) as their own pytree.

Design: a separate adapter pytree beside the frozen base, applied inside the
forward. ``LoraParams(base, adapters, config)`` is itself a policy: every
function that takes ``Params`` (``apply``, ``hidden_states``, ``generate``,
the train steps, the rollouts) takes it too, so the pure ``params -> logits``
boundary is kept. Where gradients are taken, :func:`split_frozen` cuts every
``LoraParams`` of a pytree into its trainable part (``base=None``) and its
frozen base; the train steps differentiate and optimize the trainable part
only, so no base gradient is ever formed and the optimizer state covers the
adapters only.

Why not qwix (Google's JAX LoRA library, which Tunix uses): qwix 0.1.8
installs and runs on jax 0.10.2, but ``qwix.apply_lora_to_model`` takes flax
modules only (a plain function is refused: "Unsupported model type") and
intercepts their ``dot_general``/``einsum`` calls by module path, storing
``kernel_lora_a``/``kernel_lora_b`` inside the module's own parameter tree,
beside the base kernels. This model is plain functions over a params pytree;
using qwix would mean turning it into a module tree and then separating the
adapters from the base again, so the adapters here are their own pytree.

Per targeted projection ``W`` (our layout ``[in..., out...]``, the transpose
of the Hugging Face ``[out, in]`` weight), the adapted projection is

``y = x W + (alpha / r) * dropout(x) A B``,   A ``[in..., r]``, B ``[r, out...]``

with PEFT's defaults: A uniform in ``+-1/sqrt(fan_in)`` (torch's
``kaiming_uniform_(a=sqrt(5))``), B zero, so a fresh adapter leaves the
model's logits exactly unchanged. ``A = lora_A.weight.T`` and
``B = lora_B.weight.T`` in PEFT's names (reshaped to our head axes).

Rollouts sample with the adapters merged once per ``generate`` call
(``SamplingConfig.merge_lora``, the default): on XLA:CPU that was faster
than applying them at every decode step (docs/scaling.md), and both sample
the same tokens. Merging costs a merged copy of the adapted weights while
sampling; ``merge_lora=False`` avoids it. :func:`merge_lora` also gives the merged
``Params`` for export.

Projection names: ``q, k, v, o`` (attention), ``gate, up, down`` (SwiGLU
MLP); ``"all-linear"`` is all seven (PEFT's ``all-linear`` leaves the output
head out, and so does this).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jagent._src.errors import FieldError
from jagent._src import checks
from jagent.models import _axes as ax
from jagent.models import _config

LORA_MODULES = ("q", "k", "v", "o", "gate", "up", "down")
ALL_LINEAR = "all-linear"
# The projections each family's layers have (a family without one cannot be
# adapted there).
FAMILY_MODULES = {"qwen2": LORA_MODULES, "llama": LORA_MODULES}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Hyperparameters of LoRA adapters (hashable: a static part of ``LoraParams``).

  Attributes:
    rank: r >= 1, the inner width of each ``A B`` pair.
    alpha: the scale numerator: updates are multiplied by ``alpha / rank``
      (PEFT ``lora_alpha``; RAGEN's ``lora.alpha``).
    dropout: dropout rate on the adapters' input, in [0, 1) (0: none). Only
      applied where the forward gets a ``dropout_key`` (the train steps).
    target_modules: ``"all-linear"`` or a tuple of names from
      ``LORA_MODULES`` (a comma-separated string is accepted too).

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming the bad field.
  """
  rank: int = 16
  alpha: float = 32.0
  dropout: float = 0.0
  target_modules: Any = ALL_LINEAR

  def __post_init__(self):
    def bad(field, why):
      raise FieldError("LoraConfig", field, getattr(self, field), why)

    checks.check_int("rank", self.rank, 1, owner="LoraConfig")
    if isinstance(self.alpha, bool) or not (
        isinstance(self.alpha, (int, float)) and self.alpha > 0 and math.isfinite(self.alpha)):
      bad("alpha", "must be a positive finite float")
    if isinstance(self.dropout, bool) or not (
        isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
      bad("dropout", "must be a float in [0, 1)")
    names = self.target_modules
    if isinstance(names, str) and names != ALL_LINEAR:
      names = tuple(n.strip() for n in names.split(",") if n.strip())
    if names != ALL_LINEAR:
      if not isinstance(names, (tuple, list)) or not names:
        bad("target_modules", f"must be {ALL_LINEAR!r} or a non-empty tuple of {LORA_MODULES}")
      unknown = [n for n in names if n not in LORA_MODULES]
      if unknown:
        bad("target_modules", f"unknown module name(s) {unknown}; known: {LORA_MODULES} "
            f"or {ALL_LINEAR!r}")
      if len(set(names)) != len(names):
        bad("target_modules", "names a module twice")
      # Canonical order, so equal sets give equal (hashable) configs.
      names = tuple(n for n in LORA_MODULES if n in names)
    object.__setattr__(self, "target_modules", names)

  @property
  def modules(self) -> tuple[str, ...]:
    """The adapted projections, in ``LORA_MODULES`` order."""
    return LORA_MODULES if self.target_modules == ALL_LINEAR else self.target_modules

  @property
  def scale(self) -> float:
    """``alpha / rank``, the factor on every adapter's output."""
    return float(self.alpha) / self.rank

  def check_model(self, model: _config.ModelConfig) -> None:
    """Raises ValueError naming ``target_modules`` if ``model``'s family lacks one."""
    have = FAMILY_MODULES.get(model.family, ())
    missing = [n for n in self.modules if n not in have]
    if missing:
      raise FieldError("LoraConfig", "target_modules", self.target_modules,
                       f"model family {model.family!r} has no {missing} projection(s); "
                       f"it has {have}")


@flax.struct.dataclass
class LoraPair:
  """One adapted projection's factors (in the projection's own axes)."""
  a: jax.Array  # shape=[in..., r], dtype=float32
  b: jax.Array  # shape=[r, out...], dtype=float32


@flax.struct.dataclass
class LoraParams:
  """A policy with LoRA adapters: a frozen base and its trainable adapters.

  ``adapters`` maps each module of ``config.modules`` to its
  :class:`LoraPair`, stacked over the layers like the base's
  ``LayerParams`` (a leading ``[L]`` axis on every factor). ``base`` is None
  in the trainable part cut by :func:`split_frozen`; ``adapters`` None means
  the base alone (adapters off).

  Shapes per layer, after the leading L (D width, H/K heads, Dh head width,
  F MLP width, r rank): ``q``: a [D, r], b [r, H, Dh]; ``k``, ``v``: a
  [D, r], b [r, K, Dh]; ``o``: a [H, Dh, r], b [r, D]; ``gate``, ``up``: a
  [D, r], b [r, F]; ``down``: a [F, r], b [r, D].
  """
  base: Any  # jagent.models.Params or None
  adapters: dict[str, LoraPair] | None  # every factor [L, ...]
  config: LoraConfig = flax.struct.field(pytree_node=False)


def adapter_shapes(model: _config.ModelConfig, r: int) -> dict[str, tuple[tuple[int, ...], ...]]:
  """Module name -> one layer's (A shape, B shape) for rank ``r`` (see :class:`LoraParams`)."""
  d, h, k, dh, f = model.embed_dim, model.num_heads, model.num_kv_heads, model.head_dim, \
      model.mlp_dim
  return {"q": ((d, r), (r, h, dh)), "k": ((d, r), (r, k, dh)), "v": ((d, r), (r, k, dh)),
          "o": ((h, dh, r), (r, d)), "gate": ((d, r), (r, f)), "up": ((d, r), (r, f)),
          "down": ((f, r), (r, d))}


def init_lora(base: Any, model: _config.ModelConfig, lora: LoraConfig,
              key: jax.Array) -> LoraParams:
  """Fresh adapters on ``base``: A uniform in ``+-1/sqrt(fan_in)``, B zero.

  PEFT's default initialisation (``init_lora_weights=True``): with B zero the
  adapted model's logits equal the base's exactly.

  Args:
    base: the base ``jagent.models.Params`` (any dtype; kept as it is).
    model: its ModelConfig.
    lora: the :class:`LoraConfig`.
    key: a PRNG key.

  Returns:
    :class:`LoraParams` with float32 adapters.

  Raises:
    jagent.FieldError: (a ValueError) a target module ``model``'s family
      lacks (naming ``LoraConfig.target_modules``).
  """
  lora.check_model(model)
  shapes = adapter_shapes(model, lora.rank)
  layer_index = jnp.arange(model.num_layers)
  adapters = {}
  for j, name in enumerate(lora.modules):
    a_shape, b_shape = shapes[name]
    bound = 1.0 / math.sqrt(math.prod(a_shape[:-1]))  # 1 / sqrt(fan_in)
    # Layer i's A draws from its own key, the same under vmap as one by one.
    a = jax.vmap(lambda i: jax.random.uniform(  # pylint: disable=cell-var-from-loop
        jax.random.fold_in(key, i * len(LORA_MODULES) + j), a_shape, jnp.float32,
        -bound, bound))(layer_index)
    adapters[name] = LoraPair(a=a, b=jnp.zeros((model.num_layers, *b_shape), jnp.float32))
  return LoraParams(base=base, adapters=adapters, config=lora)


def lora_axes(params: LoraParams, base_axes: Any) -> LoraParams:
  """Logical axis names of ``params`` (PartitionSpec leaves), base given as ``base_axes``.

  Adapter factors carry their projection's axis names on the input/output
  dimensions and ``lora_rank`` on the rank dimension, so they shard by the
  same rules as the weights they adapt.
  """
  lr = (ax.LAYERS, ax.LORA_RANK)
  names = {"q": (P(ax.LAYERS, ax.EMBED, ax.LORA_RANK), P(*lr, ax.Q_HEADS, ax.HEAD_DIM)),
           "k": (P(ax.LAYERS, ax.EMBED, ax.LORA_RANK), P(*lr, ax.KV_HEADS, ax.HEAD_DIM)),
           "v": (P(ax.LAYERS, ax.EMBED, ax.LORA_RANK), P(*lr, ax.KV_HEADS, ax.HEAD_DIM)),
           "o": (P(ax.LAYERS, ax.Q_HEADS, ax.HEAD_DIM, ax.LORA_RANK), P(*lr, ax.EMBED)),
           "gate": (P(ax.LAYERS, ax.EMBED, ax.LORA_RANK), P(*lr, ax.MLP)),
           "up": (P(ax.LAYERS, ax.EMBED, ax.LORA_RANK), P(*lr, ax.MLP)),
           "down": (P(ax.LAYERS, ax.MLP, ax.LORA_RANK), P(*lr, ax.EMBED))}
  adapters = None
  if params.adapters is not None:
    adapters = {n: LoraPair(*names[n]) for n in params.adapters}
  return LoraParams(base=None if params.base is None else base_axes, adapters=adapters,
                    config=params.config)


def is_lora(x: Any) -> bool:
  """Whether ``x`` is a :class:`LoraParams`."""
  return isinstance(x, LoraParams)


def split_frozen(tree: Any) -> tuple[Any, list[Any]]:
  """``(trainable, frozen)``: every ``LoraParams`` in ``tree`` cut into adapters and base.

  ``trainable`` is ``tree`` with each ``LoraParams``'s ``base`` set to None
  (a tree without LoRA is returned whole); ``frozen`` is the list of those
  bases in flattening order (empty without LoRA). :func:`join_frozen`
  inverts it. Differentiating and optimizing ``trainable`` only is how the
  train steps leave the base without gradient or optimizer state.
  """
  frozen = [x.base for x in jax.tree.leaves(tree, is_leaf=is_lora) if is_lora(x)]
  if not frozen:
    return tree, frozen
  trainable = jax.tree.map(lambda x: x.replace(base=None) if is_lora(x) else x, tree,
                           is_leaf=is_lora)
  return trainable, frozen


def join_frozen(trainable: Any, frozen: list[Any]) -> Any:
  """Inverse of :func:`split_frozen`: puts the frozen bases back, in order.

  Raises:
    ValueError: ``frozen`` does not hold one base per ``LoraParams``.
  """
  if not frozen:
    return trainable
  nodes = [x for x in jax.tree.leaves(trainable, is_leaf=is_lora) if is_lora(x)]
  if len(nodes) != len(frozen):
    raise ValueError(f"join_frozen: {len(frozen)} bases for {len(nodes)} LoraParams")
  bases = iter(frozen)
  return jax.tree.map(lambda x: x.replace(base=next(bases)) if is_lora(x) else x, trainable,
                      is_leaf=is_lora)


def lora_delta(x: jax.Array, pair: LoraPair, scale: float, dtype, *, rate: float = 0.0,
               key: jax.Array | None = None, in_axes: int = 1) -> jax.Array:
  """``scale * dropout(x) A B`` of one adapted projection, in ``dtype``.

  Args:
    x: the projection's input ``[..., in...]`` (``in_axes`` trailing axes).
    pair: its :class:`LoraPair`.
    scale: ``alpha / rank``.
    dtype: the activation dtype (the factors are cast to it).
    rate: dropout rate (used only with ``key``).
    key: PRNG key of the dropout mask, or None for no dropout.
    in_axes: how many trailing axes of ``x`` the projection contracts.

  Returns:
    ``[..., out...]``: the adapter's addition to the projection's output.
  """
  if key is not None and rate > 0:
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    x = jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)
  lead = x.shape[:x.ndim - in_axes]
  a = pair.a.astype(dtype).reshape(-1, pair.a.shape[-1])
  xa = jnp.dot(x.reshape(-1, a.shape[0]), a, preferred_element_type=dtype)
  b = pair.b.astype(dtype)
  y = jnp.dot(xa * jnp.asarray(scale, dtype), b.reshape(b.shape[0], -1),
              preferred_element_type=dtype)
  return y.reshape(*lead, *b.shape[1:])


_WEIGHT = {"q": "wq", "k": "wk", "v": "wv", "o": "wo", "gate": "w_gate", "up": "w_up",
           "down": "w_down"}


def merge_lora(params: LoraParams, min_dtype: Any = None) -> Any:
  """The base ``Params`` with every adapter folded in: ``W + (alpha / r) A B``.

  Computed in float32 and cast to each weight's dtype, or with ``min_dtype``
  to ``jnp.promote_types(weight dtype, min_dtype)``: sampling passes the
  model's compute dtype, so a bfloat16 base computed in float32 samples the
  float32 sum the unmerged forward trains on (rounding the small ``A B`` into
  bfloat16 weights would change the policy). Its forward equals the unmerged
  ``LoraParams``'s up to rounding (float32: ~1e-6); the result is a plain
  ``jagent.models.Params`` (export, or serving without LoRA code).

  Raises:
    ValueError: ``params`` is not a LoraParams with a base.
  """
  if not is_lora(params) or params.base is None:
    raise ValueError("merge_lora needs a LoraParams with its base")
  if params.adapters is None:
    return params.base
  scale = params.config.scale
  changes = {}
  for name, pair in params.adapters.items():
    w = getattr(params.base.layers, _WEIGHT[name])  # [L, in..., out...]
    n, r = pair.a.shape[0], pair.a.shape[-1]
    a = pair.a.astype(jnp.float32).reshape(n, -1, r)
    b = pair.b.astype(jnp.float32).reshape(n, r, -1)
    delta = scale * jnp.einsum("lir,lro->lio", a, b)
    dtype = w.dtype if min_dtype is None else jnp.promote_types(w.dtype, min_dtype)
    changes[_WEIGHT[name]] = (w.astype(jnp.float32) + delta.reshape(w.shape)).astype(dtype)
  return params.base.replace(layers=params.base.layers.replace(**changes))


def base_of(params: Any) -> Any:
  """The frozen base ``Params`` of a ``LoraParams`` (``params`` itself otherwise)."""
  return params.base if is_lora(params) else params
