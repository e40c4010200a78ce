"""Sharding constraints on the model's activations, by logical axis names.

The model names no mesh axis. Inside the scanned layer block XLA's SPMD
partitioner chooses the activations' layout itself, and on an ``fsdp`` mesh
it took the weights' (``embed`` split over ``fsdp``) and replicated the rows:
every device then ran every row of a micro-batch, its MLP on ``[rows x S, F]``
partial sums all-reduced (measured in docs/scaling.md, "Activations on
rows"). MaxText pins its activations with logical constraints
(``nn.with_logical_constraint``); :func:`constrain` does the same here. It
applies only while a caller has set a mesh (``jax.sharding.use_abstract_mesh``)
and logical-axis rules (``flax.linen.logical_axis_rules``), as
``jagent.sharding``'s step wrappers do; elsewhere it is the identity, so the
model's values never depend on it.
"""

from __future__ import annotations

from collections.abc import Sequence
import math

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P


def fitted_mesh_axes(logical: P, shape: Sequence[int], mesh_shape, rules) -> P:
  """The mesh-axis PartitionSpec of an array from its logical axis names.

  Each named dimension goes to the mesh axes its rule gives
  (``flax.linen.logical_to_mesh_axes``; earlier rules win); a dimension
  whose size the product of those axes' sizes does not divide is replicated
  (that dimension only), so any array fits any mesh.

  Args:
    logical: a PartitionSpec of logical names or None, at most
      ``len(shape)`` of them (missing trailing names: replicated).
    shape: the array's shape.
    mesh_shape: mapping mesh axis name -> size (``mesh.shape``).
    rules: ``(logical_name, mesh_axes)`` pairs.

  Returns:
    a PartitionSpec of mesh axes, trailing replicated entries dropped.

  Raises:
    ValueError: more names than ``shape`` has dimensions.
  """
  names, shape = tuple(logical), tuple(shape)
  if len(names) > len(shape):
    raise ValueError(f"logical axes {logical} name {len(names)} dimensions; the array "
                     f"has shape {shape}.")
  mesh_axes = tuple(nn.logical_to_mesh_axes(names, rules)) if names else ()

  def size(axes):
    if axes is None:
      return 1
    return math.prod(mesh_shape[a] for a in ((axes,) if isinstance(axes, str) else axes))

  fitted = [a if n % size(a) == 0 else None for a, n in zip(mesh_axes, shape)]
  while fitted and fitted[-1] is None:
    fitted.pop()
  return P(*fitted)


def constrain(x: jax.Array, logical: P) -> jax.Array:
  """``x`` with a sharding constraint from its logical axis names, when one is active.

  ``jax.lax.with_sharding_constraint(x, fitted_mesh_axes(...))`` under a mesh
  set with ``jax.sharding.use_abstract_mesh`` and rules set with
  ``flax.linen.logical_axis_rules`` (``jagent.sharding.activation_rules``
  sets both); the identity otherwise. Values are unchanged either way: it
  only fixes where the partitioner puts the array.

  Args:
    x: any array.
    logical: logical names of ``x``'s leading dimensions, e.g. ``P("batch")``
      for ``[B, T, D]`` hidden states.

  Returns:
    ``x`` (same shape, dtype and values).
  """
  rules = nn.get_logical_axis_rules()
  mesh = jax.sharding.get_abstract_mesh()
  if not rules or mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(
      x, fitted_mesh_axes(logical, x.shape, dict(mesh.shape), rules))
