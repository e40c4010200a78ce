"""Device meshes from a short string spec: ``"data:2,fsdp:2,tensor:2"``."""

from __future__ import annotations

from collections.abc import Sequence
import math

import jax

DATA = "data"
FSDP = "fsdp"
TENSOR = "tensor"
MESH_AXES = (DATA, FSDP, TENSOR)
ROW_AXES = (DATA, FSDP)  # the mesh axes a batch's rows are split over


def parse_mesh_spec(spec: str, num_devices: int) -> tuple[int, int, int]:
  """The (data, fsdp, tensor) sizes of a mesh spec for ``num_devices`` devices.

  Args:
    spec: comma-separated ``axis:size`` entries, axes from ``("data",
      "fsdp", "tensor")`` in any order, each at most once; a missing axis has
      size 1 and at most one size may be ``-1`` ("the remaining devices").
      ``""`` (or only whitespace) puts every device on ``data``.
    num_devices: how many devices the mesh must use (> 0).

  Returns:
    the three int sizes, in the order of ``MESH_AXES``, whose product is
    ``num_devices``.

  Raises:
    ValueError: naming the bad entry for an unknown or duplicate axis, a
      missing ``:``, a size that is not an integer, a size < 1 other than one
      ``-1``, a second ``-1``, a ``-1`` the remaining devices do not fill
      exactly, or a product != ``num_devices``.

  Example::

    >>> from jagent import sharding
    >>> sharding.parse_mesh_spec("fsdp:2,tensor:-1", 8)
    (1, 2, 4)
  """
  if not isinstance(spec, str):
    raise ValueError(f"mesh spec must be a str like 'data:2,fsdp:2,tensor:2'; got "
                     f"{spec!r}.")
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1; got {num_devices!r}.")
  if not spec.strip():
    return (num_devices, 1, 1)
  sizes: dict[str, int] = {}
  for entry in spec.split(","):
    name, sep, size = (s.strip() for s in entry.partition(":"))
    if not sep:
      raise ValueError(f"mesh spec {spec!r}: entry {entry!r} is not 'axis:size'.")
    if name not in MESH_AXES:
      raise ValueError(f"mesh spec {spec!r}: unknown axis {name!r}; the axes are "
                       f"{MESH_AXES}.")
    if name in sizes:
      raise ValueError(f"mesh spec {spec!r}: duplicate axis {name!r}.")
    try:
      n = int(size)
    except ValueError:
      raise ValueError(f"mesh spec {spec!r}: size {size!r} of axis {name!r} is not "
                       f"an integer.") from None
    if n < 1 and n != -1:
      raise ValueError(f"mesh spec {spec!r}: size {n} of axis {name!r} must be >= 1 "
                       f"or -1 (the remaining devices).")
    if n == -1 and -1 in sizes.values():
      raise ValueError(f"mesh spec {spec!r}: a second -1 (axis {name!r}); at most "
                       f"one axis takes the remaining devices.")
    sizes[name] = n
  fixed = math.prod(n for n in sizes.values() if n != -1)
  rest = [a for a, n in sizes.items() if n == -1]
  devices = f"the {num_devices} device{'' if num_devices == 1 else 's'}"
  if rest:
    if num_devices % fixed:
      raise ValueError(f"mesh spec {spec!r}: the fixed sizes (product {fixed}) do not "
                       f"divide {devices}, so -1 on {rest[0]!r} is "
                       f"not a whole number.")
    sizes[rest[0]] = num_devices // fixed
  shape = tuple(sizes.get(a, 1) for a in MESH_AXES)
  if math.prod(shape) != num_devices:
    raise ValueError(f"mesh spec {spec!r}: sizes {dict(zip(MESH_AXES, shape))} "
                     f"multiply to {math.prod(shape)}, not {devices}.")
  return shape


def make_mesh(spec: str = "", devices: Sequence[jax.Device] | None = None
              ) -> jax.sharding.Mesh:
  """A ``("data", "fsdp", "tensor")`` mesh with Auto axis types.

  The three axes are always present, in that order (size 1 when the spec
  leaves them out), so sharding rules can name any of them on any mesh:
  ``data`` splits batch rows (pure data parallelism), ``fsdp`` splits batch
  rows and the parameters' ``embed`` dimension (ZeRO-3 / FSDP, Rajbhandari
  et al., https://arxiv.org/abs/1910.02054), ``tensor`` splits heads, MLP
  width and vocabulary (Megatron-LM, Shoeybi et al.,
  https://arxiv.org/abs/1909.08053). Axis types are ``AxisType.Auto``: jax
  0.10's ``jax.make_mesh`` defaults to Explicit axes, under which ordinary
  ``jit(in_shardings=..., out_shardings=...)`` code fails on contractions
  with a ``ShardingTypeError`` (jax's "Explicit sharding" documentation,
  https://docs.jax.dev/en/latest/notebooks/explicit-sharding.html), so the
  partitioner (GSPMD) places the collectives.

  Args:
    spec: see :func:`parse_mesh_spec`, e.g. ``"data:2,fsdp:2,tensor:2"``,
      ``"fsdp:-1"`` or ``""`` (all devices on ``data``).
    devices: the devices (default ``jax.devices()``); ``jax.make_mesh``
      orders them for the hardware topology.

  Returns:
    a ``jax.sharding.Mesh`` of shape ``(data, fsdp, tensor)`` over
    ``devices``.

  Raises:
    ValueError: a bad spec or one whose sizes do not multiply to the number
      of devices (see :func:`parse_mesh_spec`), or an empty ``devices``.

  Example::

    >>> from jagent import sharding
    >>> mesh = sharding.make_mesh("data:2,tensor:-1")   # 8 devices
    >>> dict(mesh.shape)
    {'data': 2, 'fsdp': 1, 'tensor': 4}
  """
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("make_mesh needs at least one device; got an empty devices.")
  shape = parse_mesh_spec(spec, len(devices))
  return jax.make_mesh(shape, MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


def rows_size(mesh: jax.sharding.Mesh) -> int:
  """How many ways batch rows are split: the product of ``data`` and ``fsdp``.

  Args:
    mesh: a mesh with the ``data`` and ``fsdp`` axes (:func:`make_mesh`).

  Returns:
    ``mesh.shape["data"] * mesh.shape["fsdp"]``.

  Raises:
    ValueError: the mesh lacks one of those axes.
  """
  missing = [a for a in ROW_AXES if a not in mesh.shape]
  if missing:
    raise ValueError(f"mesh axes {tuple(mesh.axis_names)} lack {missing}; build the "
                     f"mesh with jagent.sharding.make_mesh.")
  return math.prod(mesh.shape[a] for a in ROW_AXES)
