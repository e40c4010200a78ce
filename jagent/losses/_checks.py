"""Host-side argument checks shared by the loss functions (private).

Every check runs on static information only (shapes, dtypes, Python numbers),
so it raises before anything is traced or compiled.
"""

from __future__ import annotations

from collections.abc import Sequence
import numbers

import jax
import jax.numpy as jnp
import numpy as np


def shape_of(x) -> tuple[int, ...]:
  return tuple(np.shape(x))


def check_rank(name: str, x, rank: int, letters: str = "") -> None:
  """Raises ValueError unless ``x`` has exactly ``rank`` dimensions."""
  if np.ndim(x) != rank:
    want = f" [{letters}]" if letters else ""
    raise ValueError(
        f"{name} must have rank {rank}{want}; got shape {shape_of(x)}.")


def check_same_shape(names: Sequence[str], arrays: Sequence) -> None:
  """Raises ValueError unless all arrays have the shape of the first one."""
  first = shape_of(arrays[0])
  for name, x in zip(names[1:], arrays[1:]):
    if shape_of(x) != first:
      raise ValueError(
          f"{name} must have the shape of {names[0]} {first}; got "
          f"{shape_of(x)}.")


def check_float(name: str, x) -> None:
  """Raises ValueError unless ``x`` has a floating dtype."""
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f"{name} must be floating point; got dtype {dtype}.")


def check_integer(name: str, x) -> None:
  """Raises ValueError unless ``x`` has an integer dtype."""
  dtype = jnp.result_type(x)
  if not jnp.issubdtype(dtype, jnp.integer):
    raise ValueError(f"{name} must have an integer dtype; got {dtype}.")


def is_concrete_number(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, jax.Array)


def check_in_range(name: str, x, lo: float, hi: float,
                   lo_open: bool = False, hi_open: bool = False) -> None:
  """Raises ValueError if a Python number lies outside [lo, hi].

  Traced or array-valued hyperparameters are not checked (they may be
  vmapped over); only plain Python numbers are.
  """
  if not is_concrete_number(x):
    return
  x = float(x)
  bad = (x < lo or x > hi or (lo_open and x == lo) or (hi_open and x == hi)
         or np.isnan(x))
  if bad:
    lb = "(" if lo_open else "["
    hb = ")" if hi_open else "]"
    raise ValueError(f"{name} must lie in {lb}{lo}, {hi}{hb}; got {x}.")


def f32(x) -> jax.Array:
  """Casts to float32 (bool masks become 0/1)."""
  return jnp.asarray(x, jnp.float32)
