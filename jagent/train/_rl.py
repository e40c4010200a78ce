"""Pieces of the RL iteration around the train step: group compaction, evaluation.

The iteration is ``rollout -> filter -> advantages -> updates``. StarPO-S's
uncertainty filter keeps a FIXED number of groups under ``top_fraction`` /
``top_k`` (``k = max(1, int(0.25 N))``), so the kept rows can be gathered into
a smaller batch of static shape before the train step: the update then costs
``k / N`` of the masked version (where dropped rows still run through the
model). :func:`compact_groups` does that; the objective's own filter stage
then sees only kept groups.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jagent import losses
from jagent.losses import _filters
from jagent.rollout import _trajectory


def num_kept_groups(num_groups: int, mode: str, value: float) -> int:
  """Static group count kept by :func:`compact_groups` (``top_fraction``/``top_k``).

  Raises:
    ValueError: for modes whose kept count depends on the data (``top_p``,
      ``min_p``): compact to all groups with those.
  """
  _filters.check_filter_args(mode, value)
  if mode == "top_fraction":
    return min(num_groups, max(1, int(value * num_groups)))
  if mode == "top_k":
    return min(num_groups, int(value))
  raise ValueError(f"filter mode {mode!r} keeps a data-dependent number of groups; "
                   "compaction needs top_fraction or top_k")


def compact_groups(traj: _trajectory.Trajectory, num_keep: int, *,
                   mode: str = "top_fraction", value: float = 0.25,
                   include_zero: bool = True
                   ) -> tuple[_trajectory.Trajectory, dict[str, jax.Array]]:
  """Keeps the ``num_keep`` groups the uncertainty filter ranks first.

  Groups are ranked by :func:`jagent.losses.filter_groups` on RAW trajectory
  scores (StarPO-S); the kept ones come first (ties to the lower index), and
  their rows are gathered into a trajectory of ``num_keep * G`` rows. A
  group the filter does not keep but that fills a slot (e.g. zero-std groups
  with ``include_zero=False``) has its loss mask zeroed, so it trains
  nothing. Jittable (``num_keep`` static).

  Args:
    traj: a :class:`jagent.rollout.Trajectory` with ``N`` groups of ``G``.
    num_keep: K groups to keep (static, ``1 <= K <= N``).
    mode, value, include_zero: the filter (see ``losses.filter_groups``).

  Returns:
    ``(trajectory of K * G rows, metrics)`` with metrics
    ``filter/reward_std_before``, ``filter/reward_std_after`` (mean in-group
    std of raw scores over all / kept groups), ``filter/kept_groups`` and
    ``filter/nonzero_std_frac`` (share of groups with any reward variance).

  Raises:
    ValueError: ``num_keep`` out of range.
  """
  g = traj.group_size
  n = traj.scores.shape[0] // g
  if not 1 <= num_keep <= n:
    raise ValueError(f"num_keep={num_keep} must be in [1, {n}] groups")
  scores = traj.scores.reshape(n, g)
  res = losses.filter_groups(scores, mode, value, include_zero)
  keep, std = res.keep, res.group_std
  # Kept groups first, by decreasing std; then the rest by decreasing std.
  order = jnp.lexsort((jnp.arange(n), -std, ~keep))[:num_keep]
  rows = (order[:, None] * g + jnp.arange(g)[None]).reshape(-1)
  out = jax.tree.map(lambda x: x[rows], traj)
  row_keep = jnp.repeat(keep[order], g)
  out = out.replace(loss_mask=out.loss_mask & row_keep[:, None],
                    group_ids=jnp.arange(num_keep * g, dtype=jnp.int32) // g)
  kept_std = std[order]
  metrics = {
      "filter/reward_std_before": jnp.mean(std),
      "filter/reward_std_after": jnp.sum(jnp.where(keep[order], kept_std, 0.0)) / jnp.maximum(
          jnp.sum(keep[order]), 1),
      "filter/kept_groups": jnp.sum(keep[order]).astype(jnp.float32),
      "filter/nonzero_std_frac": jnp.mean((std > _filters.ZERO_STD).astype(jnp.float32)),
  }
  return out, metrics


def evaluate(rollout_fn: Callable[..., _trajectory.Trajectory], params: Any,
             reset_keys: jax.Array, key: jax.Array, num_groups: int
             ) -> tuple[dict[str, float], _trajectory.Trajectory]:
  """Success and friends on a fixed set of initial states.

  Args:
    rollout_fn: from :func:`jagent.rollout.make_rollout` (its config's
      ``num_groups`` is the chunk size; its sampling is the evaluation's).
    params: policy parameters.
    reset_keys: PRNG keys [M] of the initial states, M a multiple of
      ``num_groups`` (e.g. fixed validation seeds).
    key: sampling key.
    num_groups: the rollout config's ``num_groups``.

  Returns:
    ``(metrics, first_chunk)``: float metrics averaged over all M x G
    episodes (``success``, ``pass_at_group``, ``score``, ``actions``,
    ``turns``, ``format_valid_frac``, ...; see ``Trajectory.metrics``) and
    the first chunk's trajectories (for decoded samples).

  Raises:
    ValueError: M not a multiple of ``num_groups``.
  """
  m = reset_keys.shape[0]
  if m % num_groups:
    raise ValueError(f"{m} evaluation states is not a multiple of num_groups={num_groups}")
  sums: dict[str, float] = {}
  first = None
  for i in range(m // num_groups):
    traj = rollout_fn(params, jax.random.fold_in(key, i),
                      reset_keys[i * num_groups:(i + 1) * num_groups])
    first = traj if first is None else first
    for k, v in traj.metrics().items():
      sums[k] = sums.get(k, 0.0) + float(v)
  chunks = m // num_groups
  return {k: v / chunks for k, v in sums.items()}, first


def decode_samples(traj: _trajectory.Trajectory, tokenizer, num: int = 4) -> list[dict]:
  """The first ``num`` trajectories as text with their outcome (for inspection)."""
  out = []
  for b in range(min(num, traj.tokens.shape[0])):
    n = int(traj.length[b])
    out.append({
        "text": tokenizer.decode(np.asarray(traj.tokens[b, :n]).tolist()),
        "score": float(traj.scores[b]), "success": bool(traj.success[b]),
        "turns": int(traj.num_turns[b]),
        "end_reason": _trajectory.END_REASONS[int(traj.end_reason[b])],
    })
  return out
