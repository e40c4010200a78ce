"""Putting a TrainState on a mesh, restore targets for it, and gathering to the host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import multihost_utils

from jagent._src.types import PyTree
from jagent.sharding import _rules
from jagent.train import _state


def place_state(make: Callable[..., _state.TrainState], *args: Any,
                mesh: jax.sharding.Mesh, rules: _rules.Rules = _rules.DEFAULT_RULES
                ) -> _state.TrainState:
  """``make(*args)`` run as one program whose outputs sit on their mesh shardings.

  The state is built under ``jit`` with ``out_shardings`` =
  :func:`train_state_shardings`, not eagerly and then moved: an eagerly
  built optimizer state leaves scalar leaves (Adam's ``count``) on one
  process's device, and orbax refuses to save such "host local" arrays in a
  multi-process run (orbax-checkpoint 0.12.8). The call waits for the
  result: a multi-process CPU run must not overlap two programs with
  collectives (e.g. this one and a checkpoint's barrier).

  Args:
    make: ``make(*args) -> TrainState`` (e.g. a closure over
      :func:`jagent.train.init_train_state`); traced once.
    *args: its arguments (e.g. the policy parameters), on any devices.
    mesh: the device mesh (:func:`make_mesh`).
    rules: see :data:`DEFAULT_RULES`.

  Returns:
    The :class:`jagent.train.TrainState` on
    ``train_state_shardings(state, mesh, rules)``.

  Raises:
    ValueError: ``make`` does not return a TrainState, or a bad rule.
  """
  shardings = _rules.train_state_shardings(jax.eval_shape(make, *args), mesh, rules)
  return jax.block_until_ready(jax.jit(make, out_shardings=shardings)(*args))


def train_state_target(state: _state.TrainState, mesh: jax.sharding.Mesh,
                       rules: _rules.Rules = _rules.DEFAULT_RULES) -> _state.TrainState:
  """A restore target for ``jagent.train.Checkpointer.restore`` on ``mesh``.

  ``jax.ShapeDtypeStruct`` leaves carrying :func:`train_state_shardings`:
  nothing is allocated or loaded, and a checkpoint written on any mesh or
  device count restores onto this one (orbax refuses a target without
  shardings when the checkpoint's topology differs: "Topology mismatch").

  Args:
    state: a TrainState of arrays or ``jax.eval_shape`` structs (only
      structure, shapes and dtypes are read).
    mesh: the device mesh (:func:`make_mesh`).
    rules: see :data:`DEFAULT_RULES`.

  Returns:
    A TrainState of ``jax.ShapeDtypeStruct`` with ``sharding`` set.

  Raises:
    ValueError: see :func:`train_state_shardings`.
  """
  shardings = _rules.train_state_shardings(state, mesh, rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)


def to_host(tree: PyTree) -> PyTree:
  """``tree`` as numpy arrays on every process.

  Arrays that this process holds whole (one process, or replicated) are
  copied with ``jax.device_get``; an array spread over other processes'
  devices is gathered with ``multihost_utils.process_allgather`` (a
  collective: every process must call this with the same tree).

  Args:
    tree: a pytree of ``jax.Array`` (e.g. a Trajectory with rows over
      ``data x fsdp``, or policy parameters) or host values.

  Returns:
    The same pytree of numpy arrays (host values as ``jax.device_get``
    returns them).
  """
  leaves = jax.tree.leaves(tree)
  if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)
