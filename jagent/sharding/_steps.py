"""The train step and the rollout jitted with explicit shardings on a mesh.

Nothing in the model, the losses or the rollout knows about sharding: these
wrappers fix where the inputs and outputs live (parameters by their logical
axes, rows over ``data x fsdp``) and XLA's SPMD partitioner (GSPMD, Xu et al.,
https://arxiv.org/abs/2105.04663) places the collectives in between, as in
flax/examples/lm1b/train.py (``jit`` with ``in_shardings``,
``out_shardings`` and ``donate_argnums``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jagent import models
from jagent import transforms
from jagent._src.types import Array
from jagent.rollout import _rollout
from jagent.rollout import _text
from jagent.rollout import _trajectory
from jagent.sharding import _mesh
from jagent.sharding import _rules
from jagent.train import _state
from jagent.train import _step


def shard_train_step(objective: transforms.Objective, config: _state.TrainConfig,
                     mesh: jax.sharding.Mesh, state_shardings: _state.TrainState
                     ) -> Callable[[_state.TrainState, transforms.Batch],
                                   tuple[_state.TrainState, dict[str, Array]]]:
  """:func:`jagent.train.train_step` jitted for ``mesh``, state donated.

  The returned ``step(state, batch)`` places ``state`` on
  ``state_shardings`` and the batch rows over ``data x fsdp``
  (:func:`shard_rows`; both no-ops when already there), then runs one jitted
  program whose outputs are the new state on ``state_shardings`` and
  replicated metrics. The input state's buffers are donated (reused for the
  new state): do not read ``state`` after the call, nor the arrays it was
  placed from (``jax.device_put`` onto a replicated sharding reuses a
  single-device array's buffer for its first shard, even with
  ``may_alias=False``, in jax 0.10.2). Values equal the
  single-device ``train_step`` up to float reassociation of the sharded
  reductions. One compile per batch structure and shapes.

  Args:
    objective: the :class:`jagent.transforms.Objective` (static; build it
      once).
    config: the :class:`jagent.train.TrainConfig` (static).
    mesh: the device mesh (:func:`make_mesh`).
    state_shardings: :func:`train_state_shardings` of the state.

  Returns:
    ``step(state, batch) -> (state, metrics)``, same types as
    ``train_step``: ``batch`` a :class:`jagent.transforms.Batch` of ``B``
    rows, metrics a dict of float32 ``[]``.

  Raises:
    ValueError: (at build) ``state_shardings`` is not a TrainState of
      NamedShardings on ``mesh``; (per call) ``B`` not divisible by
      ``data x fsdp`` or ``train_step``'s own batch errors.
  """
  if not isinstance(state_shardings, _state.TrainState):
    raise ValueError(f"state_shardings must be train_state_shardings(...)'s TrainState; "
                     f"got {type(state_shardings).__name__}.")
  for s in jax.tree.leaves(state_shardings):
    if not isinstance(s, jax.sharding.NamedSharding) or s.mesh != mesh:
      raise ValueError(f"state_shardings must hold NamedShardings on the given mesh; "
                       f"got {s!r}.")
  rep = _rules.replicated(mesh)

  def step(state, batch):
    return _step.train_step(state, batch, objective=objective, config=config)

  compiled: dict[Any, Callable] = {}

  def sharded_step(state, batch):
    batch_shardings = _rules.rows_shardings(batch, mesh)
    key = (jax.tree.structure(batch), tuple(np.ndim(x) for x in jax.tree.leaves(batch)))
    if key not in compiled:
      compiled[key] = jax.jit(step, in_shardings=(state_shardings, batch_shardings),
                              out_shardings=(state_shardings, rep), donate_argnums=0)
    state = jax.device_put(state, state_shardings)
    batch = jax.device_put(batch, batch_shardings)
    return compiled[key](state, batch)

  return sharded_step


def shard_rollout(text_env: _text.TextEnv, model_config: models.ModelConfig,
                  config: _rollout.RolloutConfig, mesh: jax.sharding.Mesh,
                  rules: _rules.Rules = _rules.DEFAULT_RULES, env_params: Any = None
                  ) -> Callable[..., _trajectory.Trajectory]:
  """:func:`jagent.rollout.make_rollout` jitted for ``mesh``.

  The returned ``rollout(params, key, reset_keys=None)`` places ``params``
  by their logical axes (:func:`param_shardings` with ``rules``) and
  replicates ``key`` and ``reset_keys``; every ``[B, ...]`` field of the
  returned :class:`jagent.rollout.Trajectory` is split over ``data x fsdp``
  (:func:`batch_sharding`). The sampled tokens equal the single-device
  rollout's (jax's random bits do not depend on sharding) and the log-probs
  equal them up to float reassociation, unless a sharded reduction moves a
  logit across a sampling boundary.

  Args:
    text_env: the game, tokenizer and prompt (:class:`jagent.rollout.TextEnv`).
    model_config: the policy's :class:`jagent.models.ModelConfig`.
    config: :class:`jagent.rollout.RolloutConfig`; ``B = num_groups x
      group_size`` must be divisible by ``data x fsdp``.
    mesh: the device mesh (:func:`make_mesh`).
    rules: see :data:`DEFAULT_RULES`.
    env_params: environment params (default ``text_env.env_params``).

  Returns:
    ``rollout(params, key, reset_keys=None) -> Trajectory`` (as
    ``make_rollout``'s: ``key`` a PRNG key, ``reset_keys`` optional PRNG
    keys ``[num_groups]``).

  Raises:
    ValueError: ``B`` not divisible by ``data x fsdp``, a bad rule, or
      whatever ``make_rollout`` raises.
  """
  n = _mesh.rows_size(mesh)
  if config.batch_size % n:
    raise ValueError(f"rollout rows B = num_groups x group_size = {config.batch_size} "
                     f"are not divisible by data x fsdp = {n} (mesh {dict(mesh.shape)}).")
  fn = _rollout.make_rollout(text_env, model_config, config, env_params)
  abstract = jax.eval_shape(lambda k: models.init(model_config, k), jax.random.key(0))
  params_sh = _rules.param_shardings(abstract, mesh, rules)
  out = jax.eval_shape(fn, abstract, jax.random.key(0))
  out_sh = _rules.rows_shardings(out, mesh)
  rep = _rules.replicated(mesh)
  by_default = jax.jit(lambda p, k: fn(p, k), in_shardings=(params_sh, rep),
                       out_shardings=out_sh)
  by_keys = jax.jit(fn, in_shardings=(params_sh, rep, rep), out_shardings=out_sh)

  def sharded_rollout(params, key, reset_keys=None):
    params = jax.device_put(params, params_sh)
    if reset_keys is None:
      return by_default(params, key)
    return by_keys(params, key, reset_keys)

  return sharded_rollout
