"""Logical-axis rules and the shardings of every pytree a step touches.

The model names the axes of its arrays (``jagent.models.param_axes`` /
``cache_axes``: ``vocab``, ``embed``, ``q_heads``, ...); a rule table maps
those names to mesh axes, as ``flax.linen.logical_axis_rules`` and MaxText's
``logical_axis_rules`` do. Rules are plain data, overridable per run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import contextlib
from typing import Union

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jagent import models
from jagent._src.types import PyTree
from jagent.models import _axes
from jagent.models import _partitioning
from jagent.rollout import _trajectory
from jagent.sharding import _mesh
from jagent.train import _critic
from jagent.train import _state

MeshAxes = Union[str, tuple[str, ...], None]
Rules = Sequence[tuple[str, MeshAxes]]

DEFAULT_RULES: tuple[tuple[str, MeshAxes], ...] = (
    (_axes.BATCH, _mesh.ROW_AXES),      # rows: data parallel x FSDP
    (_axes.EMBED, _mesh.FSDP),          # FSDP shards every weight along D
    (_axes.Q_HEADS, _mesh.TENSOR),      # Megatron: attention by heads,
    (_axes.KV_HEADS, _mesh.TENSOR),
    (_axes.MLP, _mesh.TENSOR),          # the MLP by its hidden width,
    (_axes.VOCAB, _mesh.TENSOR),        # embeddings / logits by vocabulary
    (_axes.HEAD_DIM, None),
    (_axes.CACHE_SEQ, None),
    (_axes.LAYERS, None),               # every device holds its part of every layer
)
"""Default ``(logical_name, mesh_axes)`` rules for the ``make_mesh`` axes.

``batch`` rows over ``("data", "fsdp")``; ``embed`` over ``fsdp``;
``q_heads``, ``kv_heads``, ``mlp`` and ``vocab`` over ``tensor``;
``head_dim``, ``cache_seq`` and the stacked ``layers`` axis replicated. Earlier rules win when two names of
one array ask for the same mesh axis (``flax.linen.logical_to_mesh_axes``).
"""


def _check_rules(rules: Rules, mesh: jax.sharding.Mesh) -> tuple:
  rules = tuple(rules)
  for rule in rules:
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2
            and isinstance(rule[0], str)):
      raise ValueError(f"a sharding rule must be a (logical_name, mesh_axes) pair; "
                       f"got {rule!r}.")
    axes = rule[1]
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    for a in axes:
      if a not in mesh.shape:
        raise ValueError(f"sharding rule {tuple(rule)!r} names mesh axis {a!r}, not one "
                         f"of the mesh's {tuple(mesh.axis_names)}.")
  return tuple((name, tuple(a) if isinstance(a, list) else a) for name, a in rules)


def logical_to_sharding(logical: P, shape: Sequence[int], mesh: jax.sharding.Mesh,
                        rules: Rules = DEFAULT_RULES) -> NamedSharding:
  """The NamedSharding of one array from its logical axis names.

  Each named dimension goes to the mesh axes its rule gives
  (``flax.linen.logical_to_mesh_axes``); a dimension whose size is not
  divisible by the product of those mesh axes' sizes is replicated instead
  (only that dimension: e.g. 2 key/value heads on ``tensor:4`` keep the
  ``embed`` dimension on ``fsdp``), so any model fits any mesh.

  Args:
    logical: a PartitionSpec of logical names (or None), e.g.
      ``P("embed", "kv_heads", "head_dim")``; ``P()`` for a scalar.
    shape: the array's shape (rank >= ``len(logical)``; missing trailing
      names are replicated).
    mesh: the device mesh.
    rules: ``(logical_name, mesh_axes)`` pairs (:data:`DEFAULT_RULES`).

  Returns:
    a ``jax.sharding.NamedSharding`` on ``mesh``.

  Raises:
    ValueError: ``logical`` has more names than ``shape`` has dimensions, a
      malformed rule, or a rule naming an axis the mesh lacks.
  """
  rules = _check_rules(rules, mesh)
  return NamedSharding(mesh, _partitioning.fitted_mesh_axes(logical, shape, mesh.shape,
                                                            rules))


@contextlib.contextmanager
def activation_rules(mesh: jax.sharding.Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
  """Within it, programs traced constrain the model's activations by ``rules``.

  Sets ``mesh`` as jax's abstract mesh (``jax.sharding.use_abstract_mesh``)
  and ``rules`` as flax's logical-axis rules (``flax.linen.logical_axis_rules``),
  which ``jagent.models`` reads to pin its hidden states' rows (logical
  ``batch``) to ``data x fsdp`` inside the layer scan: without it the
  partitioner laid them out like the weights (``embed`` over ``fsdp``) and
  every device computed every row of a micro-batch (docs/scaling.md,
  "Activations on rows"). The step wrappers here trace and call under it;
  wrap a hand-made ``jax.jit(...)`` call (or ``.lower``) of a sharded program
  in it to get the same layout. Values do not change.

  Args:
    mesh: the device mesh (:func:`make_mesh`).
    rules: see :data:`DEFAULT_RULES`.

  Raises:
    ValueError: a malformed rule or one naming an axis the mesh lacks.
  """
  rules = _check_rules(rules, mesh)
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
    yield


def tree_shardings(axes: PyTree, tree: PyTree, mesh: jax.sharding.Mesh,
                   rules: Rules = DEFAULT_RULES) -> PyTree:
  """:func:`logical_to_sharding` over a pytree and its logical axes.

  The one place logical axis names become shardings (it replaces
  ``jagent.models.logical_sharding``): e.g.
  ``tree_shardings(models.cache_axes(config), cache, mesh, rules)``.

  Args:
    axes: the pytree with PartitionSpec leaves (e.g. ``models.param_axes``).
    tree: the arrays (or ``jax.ShapeDtypeStruct`` leaves) of the same
      structure; only their shapes are read.
    mesh: the device mesh.
    rules: see :data:`DEFAULT_RULES`.

  Returns:
    ``tree``'s structure with NamedSharding leaves.

  Raises:
    ValueError: the structures differ, or from :func:`logical_to_sharding`.
  """
  is_spec = lambda x: isinstance(x, P)  # noqa: E731
  if jax.tree.structure(axes, is_leaf=is_spec) != jax.tree.structure(tree):
    raise ValueError(f"axes and tree differ in structure: "
                     f"{jax.tree.structure(axes, is_leaf=is_spec)} vs "
                     f"{jax.tree.structure(tree)}.")
  return jax.tree.map(lambda a, x: logical_to_sharding(a, np.shape(x), mesh, rules),
                      axes, tree, is_leaf=is_spec)


def _params_axes(params):
  """``models.param_axes`` for the config ``params`` were built from.

  A :class:`jagent.models.LoraParams` gets ``models.lora_axes`` (its base's
  axes, and the adapters' by the weights they adapt).
  """
  if isinstance(params, models.LoraParams):
    return models.lora_axes(params, None if params.base is None else _params_axes(params.base))
  if not isinstance(params, models.Params):
    raise ValueError(f"expected jagent.models.Params; got {type(params).__name__}.")
  if not isinstance(params.layers, models.LayerParams):
    raise ValueError(f"params.layers must be a stacked jagent.models.LayerParams; got "
                     f"{type(params.layers).__name__}.")
  # param_axes reads only these three fields of the config.
  config = models.ModelConfig(num_layers=params.layers.num_layers,
                              qkv_bias=params.layers.bq is not None,
                              tie_embeddings=params.lm_head is None)
  return models.param_axes(config)


def param_shardings(params: models.Params, mesh: jax.sharding.Mesh,
                    rules: Rules = DEFAULT_RULES) -> models.Params:
  """NamedShardings of a policy's parameters by their logical axes.

  With :data:`DEFAULT_RULES`: ``wq [D, H, Dh]`` is ``P("fsdp", "tensor")``,
  ``embed [V, D]`` ``P("tensor", "fsdp")``, norms ``[D]`` ``P("fsdp")``. A
  dimension not divisible by its mesh axes is replicated (see
  :func:`logical_to_sharding`).

  Args:
    params: :class:`jagent.models.Params` or
      :class:`jagent.models.LoraParams` (arrays or ``jax.eval_shape``
      structs).
    mesh: the device mesh.
    rules: see :data:`DEFAULT_RULES`; the adapters' ``lora_rank`` axis,
      named by no rule, is replicated.

  Returns:
    ``params``' structure with NamedSharding leaves.

  Raises:
    ValueError: ``params`` is not a ``models.Params``, or a bad rule.
  """
  return tree_shardings(_params_axes(params), params, mesh, rules)


def _critic_shardings(critic: _critic.CriticParams, mesh, rules):
  trunk = None if critic.trunk is None else _params_axes(critic.trunk)
  axes = _critic.CriticParams(head=_critic.ValueHead(w=P(_axes.EMBED), b=P()), trunk=trunk)
  return tree_shardings(axes, critic, mesh, rules)


def _mirror(tree: PyTree, template: PyTree, template_shardings: PyTree,
            other: NamedSharding) -> PyTree:
  """Shardings of ``tree``: its subtrees shaped like ``template`` get
  ``template_shardings``, every other leaf ``other``."""
  tdef = jax.tree.structure(template)
  shapes = [np.shape(x) for x in jax.tree.leaves(template)]

  def mirrors(x) -> bool:
    return (jax.tree.structure(x) == tdef
            and [np.shape(y) for y in jax.tree.leaves(x)] == shapes)

  return jax.tree.map(lambda x: template_shardings if mirrors(x) else other,
                      tree, is_leaf=mirrors)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  """The fully replicated sharding: every device holds the whole array.

  Args:
    mesh: the device mesh.

  Returns:
    ``NamedSharding(mesh, P())`` (any shape and dtype).
  """
  return NamedSharding(mesh, P())


def train_state_shardings(state: _state.TrainState, mesh: jax.sharding.Mesh,
                          rules: Rules = DEFAULT_RULES) -> _state.TrainState:
  """A TrainState-shaped pytree of NamedShardings for ``state`` on ``mesh``.

  - ``params`` and ``ref_params``: :func:`param_shardings`.
  - ``critic_params``: the value head's ``w [D]`` as ``embed``, its bias
    replicated, a ``"model"`` trunk like the policy.
  - ``opt_state`` / ``critic_opt_state``: every subtree with the structure
    and shapes of the parameters (Adam's ``mu`` and ``nu``, ZeRO's sharded
    optimizer states) takes the parameters' shardings; other leaves (counts)
    are replicated.
  - ``step``, ``rng``, the skip counters and ``objective_state``: replicated.

  Dimensions that the mesh axes do not divide are replicated (see
  :func:`logical_to_sharding`), so every model runs on every mesh; with
  ``tensor:4`` and 2 key/value heads, ``wk``/``wv`` are sharded only along
  ``embed``.

  Args:
    state: a :class:`jagent.train.TrainState` (arrays or
      ``jax.eval_shape`` structs; only structure and shapes are read).
    mesh: the device mesh (:func:`make_mesh`).
    rules: see :data:`DEFAULT_RULES`.

  Returns:
    a ``TrainState`` whose leaves are ``jax.sharding.NamedSharding``: pass it
    to ``jax.device_put(state, shardings)`` and :func:`shard_train_step`.

  Raises:
    ValueError: ``state`` is not a TrainState, its params are not
      ``models.Params``, or a bad rule.
  """
  if not isinstance(state, _state.TrainState):
    raise ValueError(f"expected a jagent.train.TrainState; got {type(state).__name__}.")
  rep = replicated(mesh)
  params = param_shardings(state.params, mesh, rules)
  critic = critic_opt = None
  # Optimizer states mirror the trainable parts (LoRA: the adapters).
  trainable = lambda p, s: models.split_frozen((p, s))[0]  # noqa: E731
  if state.critic_params is not None:
    critic = _critic_shardings(state.critic_params, mesh, rules)
    critic_opt = _mirror(state.critic_opt_state,
                         *trainable(state.critic_params, critic), rep)
  ref = None if state.ref_params is None else param_shardings(state.ref_params, mesh, rules)
  every = lambda t: jax.tree.map(lambda _: rep, t)  # noqa: E731
  return _state.TrainState(
      step=rep, params=params,
      opt_state=_mirror(state.opt_state, *trainable(state.params, params), rep),
      critic_params=critic, critic_opt_state=critic_opt, ref_params=ref,
      objective_state=every(state.objective_state), rng=rep, num_updates=rep,
      skipped_nonfinite=rep, skipped_empty=rep)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Rows (the leading dimension) over ``("data", "fsdp")``, the rest replicated.

  The sharding of every ``[B, ...]`` array of a ``transforms.Batch``, a
  ``rollout.Trajectory`` or a ``[B]`` array of rollout keys.

  Args:
    mesh: a mesh with ``data`` and ``fsdp`` axes (:func:`make_mesh`).

  Returns:
    ``NamedSharding(mesh, P(("data", "fsdp")))``.

  Raises:
    ValueError: the mesh lacks ``data`` or ``fsdp``.
  """
  _mesh.rows_size(mesh)
  return NamedSharding(mesh, P(_mesh.ROW_AXES))


def rows_shardings(tree: PyTree, mesh: jax.sharding.Mesh) -> PyTree:
  """Shardings of a pytree of row arrays: :func:`batch_sharding` on every leaf
  of rank >= 1, replicated scalars (e.g. ``Batch.metrics``).

  Args:
    tree: a ``transforms.Batch``, ``rollout.Trajectory`` or any pytree
      whose non-scalar leaves share the leading dimension B (arrays or
      ``jax.ShapeDtypeStruct``); a Trajectory's token rows (its
      ``ROW_FIELDS``, R) and its episode fields (B) each share theirs.
    mesh: the device mesh.

  Returns:
    ``tree``'s structure with NamedSharding leaves.

  Raises:
    ValueError: non-scalar leaves disagree on B, or B is not divisible by
      ``data x fsdp``.
  """
  rows = batch_sharding(mesh)
  n = _mesh.rows_size(mesh)
  groups = [tree]
  if isinstance(tree, _trajectory.Trajectory):
    # R token rows and B episodes (R = P * B, episode-major: a contiguous
    # split keeps each episode's rows together).
    rows_of = {f: getattr(tree, f) for f in _trajectory.ROW_FIELDS}
    groups = [rows_of, tree.replace(**{f: None for f in rows_of})]
  sizes = set()
  for group in groups:
    group_sizes = {np.shape(x)[0] for x in jax.tree.leaves(group) if np.ndim(x) >= 1}
    if len(group_sizes) > 1:
      raise ValueError(f"row arrays disagree on the leading dimension B: "
                       f"{sorted(group_sizes)}.")
    sizes |= group_sizes
  for b in sizes:
    if b % n:
      raise ValueError(f"batch rows B={b} are not divisible by data x fsdp = {n} "
                       f"(mesh {dict(mesh.shape)}).")
  rep = replicated(mesh)
  return jax.tree.map(lambda x: rows if np.ndim(x) >= 1 else rep, tree)


def shard_rows(tree: PyTree, mesh: jax.sharding.Mesh) -> PyTree:
  """``jax.device_put(tree, rows_shardings(tree, mesh))``.

  Args:
    tree: a ``transforms.Batch``, ``rollout.Trajectory`` or a pytree of
      ``[B, ...]`` arrays (scalars are replicated).
    mesh: the device mesh.

  Returns:
    the same pytree with its rows split over ``data x fsdp``.

  Raises:
    ValueError: see :func:`rows_shardings`.
  """
  return jax.device_put(tree, rows_shardings(tree, mesh))


def global_rows(tree: PyTree, mesh: jax.sharding.Mesh) -> PyTree:
  """Host row arrays, equal on every process, as global arrays with rows over
  ``data x fsdp``.

  Each process hands ``jax.make_array_from_process_local_data`` only the
  rows its own devices hold (in a multi-process run no process copies the
  other processes' rows to its devices); scalars (e.g. ``Batch.metrics``) are
  replicated. With one process this equals :func:`shard_rows`.

  Args:
    tree: a ``transforms.Batch`` or any pytree of numpy (or host-convertible)
      arrays whose non-scalar leaves share the leading dimension B.
    mesh: the device mesh (:func:`make_mesh`), possibly spanning processes.

  Returns:
    the same pytree of global ``jax.Array`` leaves, each on its
    :func:`rows_shardings` sharding.

  Raises:
    ValueError: see :func:`rows_shardings` (B not divisible by ``data x
      fsdp``, leaves disagreeing on B).
  """
  shardings = rows_shardings(tree, mesh)

  def one(x, s):
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.make_array_from_process_local_data(s, x, x.shape)
    per_device = x.shape[0] // _mesh.rows_size(mesh)
    starts = sorted({idx[0].start or 0
                     for idx in s.addressable_devices_indices_map(x.shape).values()})
    local = np.concatenate([x[a:a + per_device] for a in starts])
    return jax.make_array_from_process_local_data(s, local, x.shape)

  return jax.tree.map(one, tree, shardings)
