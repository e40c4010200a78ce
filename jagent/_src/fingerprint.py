"""A hashable fingerprint of a Python object's content, for caches of compiled programs (private).

A program jitted over a closure (an environment, its params, token tables)
can be reused by an equal closure. Objects such as environments compare by
identity, and two built from the same settings are different objects, so a
cache keyed on them would never hit; :func:`fingerprint` keys them on what
they hold instead: their class (and the methods it has at the time, so a
patched method is a different key), their attribute values (arrays by dtype,
shape and a digest of their bytes) and the same, recursively, for what those
hold.

Two objects with equal fingerprints behave alike in a program as long as
their behaviour depends only on their class and attributes. Anything this
module cannot look into (an unhashable value of an unknown kind, or a
structure nested deeper than :data:`MAX_DEPTH`) gets a fresh key that equals
nothing, so the cache misses rather than reusing a program it cannot vouch
for.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import types
from typing import Any

import jax
import numpy as np

MAX_DEPTH = 12
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
# Kept by identity (held in the key, so the identity stays valid).
_BY_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                types.ModuleType, enum.Enum, functools.partial)


class _Unique:
  """A key part that equals only itself: an object the fingerprint cannot look into."""

  __slots__ = ()


def _array(x) -> tuple:
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    impl = str(jax.random.key_impl(x))
    x = jax.random.key_data(x)
  else:
    impl = None
  a = np.asarray(x)
  return ("array", a.dtype.str, a.shape, impl, hashlib.blake2b(
      np.ascontiguousarray(a).tobytes(), digest_size=16).digest())


def _class_methods(cls: type) -> tuple:
  """The class's functions and descriptors along its MRO (patching one changes the key)."""
  return tuple((k, v) for c in cls.__mro__ if c is not object for k, v in vars(c).items()
               if isinstance(v, (types.FunctionType, property, staticmethod, classmethod,
                                 functools.cached_property)))


def fingerprint(x: Any) -> Any:
  """A hashable key equal for objects of equal content (see the module docstring).

  Args:
    x: any object: Python scalars and strings, numpy and jax arrays (typed
      PRNG keys too), tuples, lists, dicts, JAX pytrees (dataclasses
      registered with ``flax.struct`` etc.), and plain objects (by class and
      ``vars``, leaving out the values that ``functools.cached_property``
      computed: they derive from the rest).

  Returns:
    A hashable value; ``fingerprint(a) == fingerprint(b)`` implies that ``a``
    and ``b`` have the same class, methods and attribute values.
  """
  return _fp(x, 0, set())


def _fp(x: Any, depth: int, active: set[int]) -> Any:
  if isinstance(x, _ATOMS):
    return (type(x), x)
  if isinstance(x, (np.ndarray, np.generic, jax.Array)):
    return _array(x)
  if isinstance(x, _BY_IDENTITY):
    return x
  if depth > MAX_DEPTH or id(x) in active:
    return _Unique()
  active.add(id(x))
  try:
    if isinstance(x, (tuple, list)):
      return (type(x), tuple(_fp(v, depth + 1, active) for v in x))
    if isinstance(x, dict):
      return (type(x), tuple((_fp(k, depth + 1, active), _fp(v, depth + 1, active))
                             for k, v in x.items()))
    if isinstance(x, types.MappingProxyType):
      return (type(x), _fp(dict(x), depth + 1, active))
    leaves, treedef = jax.tree.flatten(x)
    if not (len(leaves) == 1 and leaves[0] is x):  # a registered pytree node
      return ("pytree", treedef, tuple(_fp(v, depth + 1, active) for v in leaves))
    if hasattr(x, "__dict__"):
      cls = type(x)
      own = {k: v for k, v in vars(x).items()
             if not isinstance(getattr(cls, k, None), functools.cached_property)}
      return (cls, _class_methods(cls), _fp(own, depth + 1, active))
    try:
      hash(x)
    except TypeError:
      return _Unique()
    return x
  finally:
    active.discard(id(x))
