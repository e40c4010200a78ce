"""The train step and the rollout jitted with explicit shardings on a mesh.

Nothing in the model, the losses or the rollout knows about meshes: these
wrappers fix where the inputs and outputs live (parameters by their logical
axes, rows over ``data x fsdp``) and XLA's SPMD partitioner (GSPMD, Xu et al.,
https://arxiv.org/abs/2105.04663) places the collectives in between, as in
flax/examples/lm1b/train.py (``jit`` with ``in_shardings``,
``out_shardings`` and ``donate_argnums``). They trace and run under
:func:`jagent.sharding.activation_rules`, so the model's hidden states keep
their rows on ``data x fsdp`` inside the layer scan too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jagent import losses
from jagent import models
from jagent import transforms
from jagent._src.types import Array
from jagent.rollout import _rollout
from jagent.rollout import _text
from jagent.rollout import _trajectory
from jagent.sharding import _mesh
from jagent.sharding import _rules
from jagent.train import _eval
from jagent.train import _rl
from jagent.train import _state
from jagent.train import _step


def _check_state_shardings(state_shardings: _state.TrainState,
                           mesh: jax.sharding.Mesh) -> None:
  if not isinstance(state_shardings, _state.TrainState):
    raise ValueError(f"state_shardings must be train_state_shardings(...)'s TrainState; "
                     f"got {type(state_shardings).__name__}.")
  for s in jax.tree.leaves(state_shardings):
    if not isinstance(s, jax.sharding.NamedSharding) or s.mesh != mesh:
      raise ValueError(f"state_shardings must hold NamedShardings on the given mesh; "
                       f"got {s!r}.")


def _placed(tree: Any, shardings: Any) -> Any:
  """``tree`` on ``shardings``: leaves already there are kept as they are.

  ``jax.device_put`` of a jax.Array onto a sharding that spans other
  processes fails in jax 0.10.2 ("cross-host device transfers"), even when
  the array is already there; numpy leaves are put (every process holds the
  same value).
  """
  def put(x, s):
    if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(s, x.ndim):
      return x
    return jax.device_put(x, s)

  return jax.tree.map(put, tree, shardings)


def _batch_step(fn: Callable, mesh: jax.sharding.Mesh, state_shardings: _state.TrainState):
  """``fn(state, batch)`` jitted per batch structure: state donated, rows over
  ``data x fsdp``, replicated metrics."""
  _check_state_shardings(state_shardings, mesh)
  rep = _rules.replicated(mesh)
  compiled: dict[Any, Callable] = {}

  def sharded_step(state, batch):
    batch_shardings = _rules.rows_shardings(batch, mesh)
    key = (jax.tree.structure(batch), tuple(np.ndim(x) for x in jax.tree.leaves(batch)))
    if key not in compiled:
      compiled[key] = jax.jit(fn, in_shardings=(state_shardings, batch_shardings),
                              out_shardings=(state_shardings, rep), donate_argnums=0)
    # NOTE(jax 0.10.2): jax.device_put onto a replicated sharding reuses a
    # single-device array's buffer for its first shard, even with
    # may_alias=False, so donating the placed state also frees the arrays it
    # was placed from (the docstrings say not to read them).
    with _rules.activation_rules(mesh):
      return compiled[key](_placed(state, state_shardings), _placed(batch, batch_shardings))

  return sharded_step


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
  placed from. Values equal the
  single-device ``train_step`` up to float reassociation of the sharded
  reductions. One compile per batch structure and shapes. In a multi-process
  run pass global arrays (e.g. :func:`global_rows`) or numpy arrays equal on
  every process.

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
  def step(state, batch):
    return _step._train_step(  # pylint: disable=protected-access
        state, batch, objective=objective, config=config)

  return _batch_step(step, mesh, state_shardings)


def shard_sft_step(config: _state.TrainConfig, mesh: jax.sharding.Mesh,
                   state_shardings: _state.TrainState
                   ) -> Callable[[_state.TrainState, transforms.Batch],
                                 tuple[_state.TrainState, dict[str, Array]]]:
  """:func:`jagent.train.sft_step` jitted for ``mesh``, state donated.

  Same placement, donation and compile rules as :func:`shard_train_step`
  (rows of ``batch.tokens`` / ``batch.loss_mask`` over ``data x fsdp``,
  parameters and Adam moments by their logical axes, replicated metrics);
  values equal the single-device ``sft_step`` up to float reassociation.

  Args:
    config: the SFT :class:`jagent.train.TrainConfig` (static).
    mesh: the device mesh (:func:`make_mesh`).
    state_shardings: :func:`train_state_shardings` of the SFT state.

  Returns:
    ``step(state, batch) -> (state, metrics)`` as ``sft_step``: ``batch`` a
    :class:`jagent.transforms.Batch` with ``tokens`` int ``[B, S]`` and
    ``loss_mask`` ``[B, S]``; metrics float32 ``[]`` (``sft/nll``, ...).

  Raises:
    ValueError: (at build) bad ``state_shardings``; (per call) ``B`` not
      divisible by ``data x fsdp`` or ``sft_step``'s own batch errors.
  """
  def step(state, batch):
    return _step.sft_update(state, batch, config=config)

  return _batch_step(step, mesh, state_shardings)


def rows_constraint(mesh: jax.sharding.Mesh) -> Callable[[Any], Any]:
  """``tree -> tree`` constraining row arrays to ``data x fsdp`` inside a jitted program.

  ``jax.lax.with_sharding_constraint`` of :func:`rows_shardings` when every
  non-scalar leaf's leading dimension is divisible by ``data x fsdp``;
  otherwise the tree unchanged (the partitioner chooses). The
  ``rows_constraint`` of :func:`jagent.train.rl_iteration` on a mesh (e.g.
  the kept rows after a compaction, which a gather alone would leave
  replicated). Call it under ``jit``.

  Raises:
    ValueError: the mesh lacks ``data`` or ``fsdp``.
  """
  n = _mesh.rows_size(mesh)

  def on_rows(tree):
    rows = {np.shape(x)[0] for x in jax.tree.leaves(tree) if np.ndim(x) >= 1}
    if any(b % n for b in rows):
      return tree  # the partitioner chooses
    return jax.lax.with_sharding_constraint(tree, _rules.rows_shardings(tree, mesh))

  return on_rows


def shard_rl_iteration(rollout_fn: Callable[..., _trajectory.Trajectory],
                       objective: transforms.Objective, config: _state.TrainConfig,
                       mesh: jax.sharding.Mesh, state_shardings: _state.TrainState, *,
                       num_keep: int, filter_config: losses.FilterConfig | None = None,
                       diagnostics: Callable[..., dict[str, Array]] | None = None
                       ) -> Callable[[_state.TrainState, jax.Array],
                                     tuple[_state.TrainState, dict[str, Array]]]:
  """:func:`jagent.train.rl_iteration` jitted for ``mesh``, state donated.

  One program per iteration (rollout -> StarPO-S compaction -> advantages
  -> updates) as in the single-device run, with the state on
  ``state_shardings`` in and out, a replicated key and replicated metrics.
  The rollout's trajectory rows are constrained to ``data x fsdp``
  (``jax.lax.with_sharding_constraint``; GSPMD carries that sharding back
  into the sampling loop, so each device generates only its rows), and so
  are the kept rows handed to the update when ``data x fsdp`` divides
  ``num_keep x G`` (the compaction's gather alone would leave them
  replicated: every device would then train on every row): it is
  :func:`jagent.train.rl_iteration` with that ``rows_constraint``. Values equal the
  single-device iteration up to float reassociation of the sharded
  reductions (sampled tokens are equal unless such a difference moves a
  logit across a sampling boundary). In a multi-process run every process
  calls it with the same key: each generates and trains on the rows of its
  own devices, and no host data moves.

  Args:
    rollout_fn: ``rollout_fn(params, key) -> Trajectory`` of ``B`` rows
      (:func:`jagent.rollout.make_rollout`; not jitted for a mesh: this
      function places it). ``B`` must be divisible by ``data x fsdp``.
    objective: the :class:`jagent.transforms.Objective` (static).
    config: the :class:`jagent.train.TrainConfig` (static).
    mesh: the device mesh (:func:`make_mesh`).
    state_shardings: :func:`train_state_shardings` of the state.
    num_keep, filter_config, diagnostics: as :func:`jagent.train.rl_iteration`
      (``filter_config`` None: the objective's own filter).

  Returns:
    ``step(state, key) -> (state, metrics)``: ``key`` a typed PRNG key
    ``[]``, metrics :func:`jagent.train.rl_iteration`'s dict of float32
    ``[]``. The input state is donated.

  Raises:
    ValueError: (at build) bad ``state_shardings``; (at the first call)
      ``B`` not divisible by ``data x fsdp`` or what ``rl_iteration``
      raises.
  """
  _check_state_shardings(state_shardings, mesh)
  _rl.iteration_filter(objective, filter_config)  # bad filters raise here, at build
  rep = _rules.replicated(mesh)

  def iteration(state, key):
    return _rl.rl_iteration(state, key, rollout_fn=rollout_fn, objective=objective,
                            config=config, num_keep=num_keep, filter_config=filter_config,
                            rows_constraint=rows_constraint(mesh), diagnostics=diagnostics)

  jitted = jax.jit(iteration, in_shardings=(state_shardings, rep),
                   out_shardings=(state_shardings, rep), donate_argnums=0)

  def sharded_iteration(state, key):
    with _rules.activation_rules(mesh):
      return jitted(_placed(state, state_shardings), key)

  return sharded_iteration


def shard_eval_program(rollout_fn: Callable[..., _trajectory.Trajectory],
                       mesh: jax.sharding.Mesh, rules: _rules.Rules = _rules.DEFAULT_RULES
                       ) -> _eval.EvalProgram:
  """:func:`jagent.train.eval_program` jitted for ``mesh``.

  The returned ``program(params, key, reset_keys)`` places ``params`` by
  their logical axes (:func:`param_shardings` with ``rules``; no-op when
  already there) and replicates the keys; the trajectory's rows come out over
  ``data x fsdp`` (GSPMD carries that sharding back into the sampling loop,
  so each device generates only its rows) and the metrics replicated,
  computed in the same program. Pass it to :func:`jagent.train.evaluate`.
  One compile per parameter structure; in a multi-process run every process
  calls it with the same keys. On a one-device mesh the values equal
  ``jax.jit(eval_program(rollout_fn))``'s bit for bit.

  Args:
    rollout_fn: ``rollout_fn(params, key, reset_keys) -> Trajectory``
      (:func:`jagent.rollout.make_rollout`); ``B = num_groups x G`` must be
      divisible by ``data x fsdp``.
    mesh: the device mesh (:func:`make_mesh`).
    rules: see :data:`DEFAULT_RULES`.

  Returns:
    ``program(params, key, reset_keys) -> (Trajectory, metrics)`` as
    :func:`jagent.train.eval_program`'s: ``key`` a typed PRNG key ``[]``,
    ``reset_keys`` typed PRNG keys ``[num_groups]``, metrics float32 ``[]``.

  Raises:
    ValueError: (at the first call) ``B`` not divisible by ``data x fsdp``,
      a bad rule, or what the rollout raises.
  """
  program = _eval.eval_program(rollout_fn)
  rep = _rules.replicated(mesh)
  compiled: dict[Any, tuple[Callable, Any]] = {}

  def sharded_program(params, key, reset_keys):
    sig = (jax.tree.structure(params), tuple(np.shape(x) for x in jax.tree.leaves(params)))
    if sig not in compiled:
      params_sh = _rules.param_shardings(params, mesh, rules)
      traj, _ = jax.eval_shape(program, params, key, reset_keys)
      compiled[sig] = (jax.jit(program, in_shardings=(params_sh, rep, rep),
                               out_shardings=(_rules.rows_shardings(traj, mesh), rep)),
                       params_sh)
    fn, params_sh = compiled[sig]
    with _rules.activation_rules(mesh, rules):
      return fn(_placed(params, params_sh), key, reset_keys)

  return sharded_program


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
    params = _placed(params, params_sh)
    with _rules.activation_rules(mesh, rules):
      if reset_keys is None:
        return by_default(params, key)
      return by_keys(params, key, reset_keys)

  return sharded_rollout
