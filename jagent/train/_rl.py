"""The RL iteration (:func:`rl_iteration`) and group compaction.

The iteration is ``rollout -> filter -> advantages -> updates``. StarPO-S's
uncertainty filter keeps a FIXED number of groups under ``top_fraction`` /
``top_k`` (``k = max(1, int(0.25 N))``), so the kept rows can be gathered into
a smaller batch of static shape before the train step: the update then costs
``k / N`` of the masked version (where dropped rows still run through the
model). :func:`compact_groups` does that, and is the filter's one
application: the objective's ``update`` then sees only the kept groups. The
filter is one :class:`jagent.losses.FilterConfig`, the objective's
(``Objective.filter_config``) unless the iteration is given another
(:func:`iteration_filter`). A data-dependent filter (``top_p``, ``min_p``)
compacts to all ``N`` groups and zeroes the loss mask of the groups it drops.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent import transforms
from jagent.losses import _filters
from jagent.rollout import _trajectory
from jagent.transforms import _stages
from jagent.train import _batch
from jagent.train import _state
from jagent.train import _step

# Folded into an iteration's key for its diagnostics' own key (rl_iteration).
DIAGNOSTICS_SALT = 0x4D49


def _check_filter_config(filter_config) -> None:
  if not isinstance(filter_config, _filters.FilterConfig):
    raise ValueError(f"filter_config must be a jagent.losses.FilterConfig; "
                     f"got {filter_config!r}.")


def num_kept_groups(num_groups: int, filter_config: losses.FilterConfig) -> int:
  """Static group count kept by :func:`compact_groups` (``top_fraction``/``top_k``).

  Args:
    num_groups: N groups per rollout.
    filter_config: the :class:`jagent.losses.FilterConfig`.

  Raises:
    ValueError: for modes whose kept count depends on the data (``top_p``,
      ``min_p``; ``filter_config.fixed_count`` is False): compact to all
      groups with those.
  """
  _check_filter_config(filter_config)
  mode, value = filter_config.mode, filter_config.value
  if mode == _filters.TOP_FRACTION:
    return min(num_groups, max(1, int(value * num_groups)))
  if mode == _filters.TOP_K:
    return min(num_groups, int(value))
  raise ValueError(f"filter mode {mode!r} keeps a data-dependent number of groups; "
                   "compaction needs top_fraction or top_k")


def iteration_filter(objective: transforms.Objective,
                     filter_config: losses.FilterConfig | None = None) -> losses.FilterConfig:
  """The one filter an RL iteration ranks and compacts with.

  ``filter_config`` if given (e.g. a run's ``config.rl.filter_*``), else the
  objective's own (``objective.filter_config``), else one that keeps every
  group (``top_fraction`` 1.0). An objective that never keeps zero-std groups
  (``include_zero=False``: DAPO's dynamic sampling, a part of the algorithm)
  keeps that under a given filter: for every mode, ranking and then dropping
  the zero-std groups keeps what ``include_zero=False`` keeps.

  Args:
    objective: a :class:`jagent.transforms.Objective`.
    filter_config: an explicit :class:`jagent.losses.FilterConfig` replacing
      the objective's, or None.

  Returns:
    the :class:`jagent.losses.FilterConfig`.

  Raises:
    ValueError: ``filter_config`` not a FilterConfig.
  """
  own = objective.filter_config
  if filter_config is None:
    return own or _filters.KEEP_ALL
  _check_filter_config(filter_config)
  if own is not None and not own.include_zero and filter_config.include_zero:
    filter_config = dataclasses.replace(filter_config, include_zero=False)
  return filter_config


def compact_groups(traj: _trajectory.Trajectory, num_keep: int,
                   filter_config: losses.FilterConfig = losses.FilterConfig()
                   ) -> tuple[_trajectory.Trajectory, dict[str, jax.Array]]:
  """Keeps the ``num_keep`` groups the uncertainty filter ranks first.

  Groups are ranked by :func:`jagent.losses.filter_groups` on RAW trajectory
  scores (StarPO-S) of their played episodes (``Trajectory.played``); the
  kept ones come first (ties to the lower index), and their episodes are
  gathered, with their rows, into a trajectory of ``num_keep * G`` episodes
  (:meth:`jagent.rollout.Trajectory.take_episodes`). A group the filter
  does not keep but that fills a slot (e.g. zero-std groups with
  ``include_zero=False``) has its loss mask zeroed, so it trains nothing.
  Jittable (``num_keep`` static).

  Args:
    traj: a :class:`jagent.rollout.Trajectory` with ``N`` groups of ``G``.
    num_keep: K groups to keep (static, ``1 <= K <= N``).
    filter_config: the :class:`jagent.losses.FilterConfig` (default
      StarPO-S's: ``top_fraction`` 0.25).

  Returns:
    ``(trajectory of K * G episodes, metrics)`` with metrics
    ``filter/reward_std_before``, ``filter/reward_std_after`` (mean in-group
    std of raw scores over all / kept groups; the latter NaN when no group
    is kept), ``filter/kept_groups``, ``filter/kept_ratio`` (kept groups /
    ``N``), ``filter/any_kept`` (0: the step trains nothing) and
    ``filter/nonzero_std_frac`` (share of groups with any reward variance).

  Raises:
    ValueError: ``num_keep`` out of range or ``filter_config`` not a
      FilterConfig.
  """
  _check_filter_config(filter_config)
  g = traj.group_size
  n = traj.scores.shape[0] // g
  if not 1 <= num_keep <= n:
    raise ValueError(f"num_keep={num_keep} must be in [1, {n}] groups")
  scores = traj.scores.reshape(n, g)
  # A tree's rows never forked into are no episodes: not in their group's std.
  res = losses.filter_groups(scores, filter_config.mode, filter_config.value,
                             filter_config.include_zero, valid_ng=traj.played().reshape(n, g))
  keep, std = res.keep, res.group_std
  # Kept groups first, by decreasing std; then the rest by decreasing std.
  order = jnp.lexsort((jnp.arange(n), -std, ~keep))[:num_keep]
  episodes = (order[:, None] * g + jnp.arange(g)[None]).reshape(-1)
  # The kept episodes and their rows, renumbered to the new episodes.
  out = traj.take_episodes(episodes)
  row_keep = jnp.repeat(keep[order], g)[out.row_episode]
  out = out.replace(loss_mask=out.loss_mask & row_keep[:, None],
                    group_ids=jnp.arange(num_keep * g, dtype=jnp.int32) // g)
  kept_std = std[order]
  num_kept = jnp.sum(keep[order]).astype(jnp.float32)
  metrics = {
      "filter/reward_std_before": jnp.mean(std),
      # NaN when no group is kept: a mean over no group, not a std of 0.
      "filter/reward_std_after": jnp.sum(jnp.where(keep[order], kept_std, 0.0))
                                 / jnp.sum(keep[order]),
      "filter/kept_groups": num_kept,
      "filter/kept_ratio": num_kept / n,
      "filter/any_kept": (num_kept > 0).astype(jnp.float32),
      "filter/nonzero_std_frac": jnp.mean((std > _filters.ZERO_STD).astype(jnp.float32)),
  }
  return out, metrics


def rl_iteration(state: _state.TrainState, key: jax.Array, *,
                 rollout_fn: Callable[..., _trajectory.Trajectory],
                 objective: transforms.Objective,
                 config: _state.TrainConfig, num_keep: int,
                 filter_config: losses.FilterConfig | None = None,
                 rows_constraint: Callable[[Any], Any] | None = None,
                 diagnostics: Callable[..., dict[str, jax.Array]] | None = None
                 ) -> tuple[_state.TrainState, dict[str, jax.Array]]:
  """One RL iteration: rollout -> filter -> advantages -> updates, in one program.

  RAGEN's StarPO iteration (arXiv 2504.20073, section 3; StarPO-S adds the
  uncertainty filter): sample ``N`` groups of ``G`` trajectories with the
  current policy, keep the ``num_keep`` groups of largest in-group reward
  std (:func:`compact_groups`, raw scores), then let the objective compute
  advantages and make ``ppo_epochs x num_minibatches`` updates
  (:func:`jagent.train.train_step`'s stages). Pure: no host round trip, so
  it can be jitted, scanned over iterations and vmapped over ``(state,
  key)`` (many runs in one program, PureJaxRL style). Jit it with the
  keyword arguments bound (e.g. ``functools.partial``); they are static.

  Args:
    state: the :class:`jagent.train.TrainState` (its ``params`` sample the
      rollout).
    key: a typed PRNG key ``[]``: the rollout's key (initial states,
      sampling, environment).
    rollout_fn: ``rollout_fn(params, key) -> Trajectory`` of ``B = N x G``
      rows and ``S`` tokens (:func:`jagent.rollout.make_rollout`).
    objective: a :class:`jagent.transforms.Objective`.
    config: the :class:`jagent.train.TrainConfig`. Its optimizers' learning
      rates may be traced float32 scalars (a learning-rate sweep under
      ``vmap``); ``num_keep x G`` must be divisible by ``num_minibatches x
      num_microbatches``.
    num_keep: groups kept per iteration (static int in ``[1, N]``;
      :func:`num_kept_groups`, or ``N`` to keep every group).
    filter_config: the uncertainty filter, a
      :class:`jagent.losses.FilterConfig`; None: the objective's own
      (``objective.filter_config``), or keep every group when it has none
      (:func:`iteration_filter`). It is applied once, by
      :func:`compact_groups`; a kept slot whose group the filter drops
      trains nothing.
    rows_constraint: optional ``tree -> tree`` applied to the trajectory and
      to the kept rows before the update (identity by default);
      :func:`jagent.sharding.shard_rl_iteration` passes a sharding
      constraint over rows.
    diagnostics: optional ``diagnostics(state, traj, key) -> {name: []}``
      computed in the same program on the input state (the policy that
      sampled) and the whole rollout, before compaction and update, with a
      key of its own (``key`` folded with a constant); its metrics join the
      others (e.g. :func:`jagent.train.collapse_metrics`
      under a ``lax.cond`` on ``state.step``, as ``experiments/experiment.py``
      does).

  Returns:
    ``(state, metrics)``: the state after the update (``step + 1``) and a
    dict of float32 ``[]`` scalars: ``rollout/<key>`` for every key of
    :meth:`jagent.rollout.Trajectory.metrics` (``rollout/success``,
    ``rollout/format_valid_frac``, ...), ``rollout/sampled_tokens`` and
    ``rollout/env_turns`` (sums over the ``B`` rows; a tree's shared turns
    once, ``Trajectory.sampled_turns``),
    ``train/context_tokens`` (``num_keep x G x S``, padding included), the
    filter's ``filter/*`` (:func:`compact_groups`; those of a filter stage
    in the objective's own chain, which describe the compacted rows, are left
    out) and everything
    :func:`jagent.train.train_step` reports (``actor/entropy``,
    ``train/grad_norm``, ``loss/*``, ...). An iteration whose filter kept no
    group trains nothing (``train/updates_applied`` 0) and reports its
    update metrics and ``filter/reward_std_after`` as NaN (not measured).

  Raises:
    ValueError: (at trace time) ``filter_config`` not a FilterConfig, ``num_keep``
      out of range, or what :func:`jagent.train.train_step` raises (rows not
      divisible, missing batch fields).
  """
  filter_config = iteration_filter(objective, filter_config)
  on_rows = rows_constraint or (lambda tree: tree)
  traj = on_rows(rollout_fn(state.params, key))
  extra = {} if diagnostics is None else diagnostics(
      state, traj, jax.random.fold_in(key, DIAGNOSTICS_SALT))
  kept, filter_metrics = compact_groups(traj, num_keep, filter_config)
  state, train_metrics = _step._train_step(  # pylint: disable=protected-access
      state, on_rows(_batch.trajectory_batch(kept)), objective=objective, config=config)
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # pylint: disable=unnecessary-lambda-assignment
  metrics = {f"rollout/{k}": v for k, v in traj.metrics().items()}
  metrics["rollout/sampled_tokens"] = jnp.sum(f32(traj.loss_mask))
  metrics["rollout/env_turns"] = jnp.sum(f32(traj.sampled_turns()))  # a tree's prefixes once
  metrics["train/context_tokens"] = jnp.float32(np.prod(kept.tokens.shape))
  metrics.update(filter_metrics)
  # A filter stage in a user's own chain saw only the compacted rows: its
  # filter/* would describe them (kept_ratio 1 on a step that kept nothing).
  metrics.update({k: v for k, v in train_metrics.items()
                  if k not in _stages.FILTER_STAGE_METRICS})
  metrics.update(extra)
  return state, {k: f32(v).reshape(()) for k, v in metrics.items()}
