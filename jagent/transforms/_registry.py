"""A name registry of objectives, so configs can select an algorithm by name.

An objective registers itself where it is defined, with :func:`register` as
a decorator (the built-in aliases in ``_aliases.py``)::

    @register("my_algo")
    def my_algo(*, eps: float = 0.2) -> Objective: ...
"""

from __future__ import annotations

from collections.abc import Callable
import inspect
from typing import Any

from jagent.transforms._base import Objective

Factory = Callable[..., Objective]

_REGISTRY: dict[str, Factory] = {}


def register(name: str, factory: Factory | None = None
             ) -> Factory | Callable[[Factory], Factory]:
  """Registers ``factory(**kwargs) -> Objective`` under ``name``.

  Names are never overwritten. Without ``factory`` it is a decorator that
  registers the function it decorates and returns it unchanged.

  Args:
    name: a non-empty string.
    factory: a callable returning an :class:`Objective` (its
      :class:`ObjectiveNeeds` declared on it), or None for the decorator.

  Returns:
    ``factory``, or the decorator.

  Raises:
    ValueError: for an empty or already registered name, or a non-callable.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"objective name must be a non-empty str; got {name!r}.")
  if factory is None:
    return lambda f: register(name, f)
  if name in _REGISTRY:
    raise ValueError(f"objective {name!r} is already registered.")
  if not callable(factory):
    raise ValueError(f"factory for {name!r} must be callable.")
  _REGISTRY[name] = factory
  return factory


def make(name: str, **kwargs: Any) -> Objective:
  """Builds the registered objective ``name`` with keyword hyperparameters.

  Args:
    name: a registered name (see :func:`registered`).
    **kwargs: passed to the alias (e.g. ``eps_high=0.3``).

  Returns:
    an :class:`Objective` (``.needs`` says what it reads).

  Raises:
    ValueError: for an unknown name (the message lists the known ones) or
      keyword arguments the objective does not take.
  """
  if name not in _REGISTRY:
    raise ValueError(f"unknown objective {name!r}; registered: "
                     f"{registered()}.")
  factory = _REGISTRY[name]
  try:
    inspect.signature(factory).bind(**kwargs)
  except TypeError as e:
    raise ValueError(f"objective {name!r}: {e} (got {sorted(kwargs)}).") from e
  return factory(**kwargs)


def signature(name: str) -> inspect.Signature:
  """The signature of the registered objective ``name``: its hyperparameters.

  Annotations are evaluated (``eval_str``), so a config system can read
  each keyword's default and type, e.g. to offer every hyperparameter as a
  flag (``experiments.hyperparameters.algorithm_kwargs``).

  Args:
    name: a registered name (see :func:`registered`).

  Returns:
    the ``inspect.Signature`` of the factory :func:`make` calls.

  Raises:
    ValueError: for an unknown name (the message lists the known ones).

  Example::

    >>> from jagent import transforms
    >>> transforms.signature("grpo").parameters["kl_coef"].default
    0.001
  """
  if name not in _REGISTRY:
    raise ValueError(f"unknown objective {name!r}; registered: "
                     f"{registered()}.")
  return inspect.signature(_REGISTRY[name], eval_str=True)


def registered() -> tuple[str, ...]:
  """The registered objective names, sorted."""
  return tuple(sorted(_REGISTRY))
