"""Name -> environment registry: ``make``, ``register``, ``unregister``, ``registered``,
``agent_defaults``.

IDs follow ``Name-vN`` and are part of the public contract: a registered name
is never overwritten or silently redefined.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from envs_jax._src import environment

_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]*-v\d+$")
_REGISTRY: dict[str, Callable[..., environment.Environment]] = {}


def register(env_id: str, factory: Callable[..., environment.Environment]) -> None:
  """Registers ``factory`` (``**kwargs -> Environment``) under ``env_id``.

  Raises:
    ValueError: if ``env_id`` is not of the form ``Name-vN`` or is already
      registered.
  """
  if not _ID_RE.match(env_id):
    raise ValueError(f"environment id {env_id!r} must look like 'Name-v0'")
  if env_id in _REGISTRY:
    raise ValueError(f"environment id {env_id!r} is already registered")
  _REGISTRY[env_id] = factory


def unregister(env_id: str) -> None:
  """Removes ``env_id`` from the registry, so that it can be registered again.

  For code that registers an env of its own for a while (a test's toy env, a
  notebook's experiment); the shipped ids stay registered for the life of
  the process unless removed this way.

  Raises:
    ValueError: naming ``env_id`` and listing the registered ids when unknown.
  """
  _check_id(env_id)
  del _REGISTRY[env_id]


def registered() -> tuple[str, ...]:
  """All registered environment ids, sorted."""
  return tuple(sorted(_REGISTRY))


def _check_id(env_id: str) -> None:
  if env_id not in _REGISTRY:
    raise ValueError(
        f"unknown environment id {env_id!r}; registered: {', '.join(registered())}"
    )


def agent_defaults(env_id: str) -> environment.AgentDefaults | None:
  """The registered environment's :class:`AgentDefaults`, its params not built.

  Configs read it while command-line flags are parsed, before a multi-host
  run calls ``jax.distributed.initialize``, which must come before any JAX
  computation: the environment object is built (the shipped ones create no
  device array), its default ``EnvParams`` are not.

  Args:
    env_id: a name from :func:`registered`.

  Returns:
    ``env.agent_defaults`` (None for an environment that sets none).

  Raises:
    ValueError: naming ``env_id`` and listing the registered ids when unknown.
  """
  _check_id(env_id)
  return _REGISTRY[env_id]().agent_defaults


def make(env_id: str, **kwargs: Any) -> tuple[environment.Environment, Any]:
  """Builds a registered environment.

  Args:
    env_id: a name from :func:`registered`, e.g. ``"Sokoban-6x6-1box-v0"``.
    **kwargs: static configuration overrides passed to the env's factory.

  Returns:
    ``(env, params)``: the environment object and its default ``EnvParams``.

  Raises:
    ValueError: naming ``env_id`` and listing the registered ids when unknown.
  """
  _check_id(env_id)
  env = _REGISTRY[env_id](**kwargs)
  return env, env.default_params
