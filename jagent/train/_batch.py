"""The consumer side of a rollout: a Trajectory as the Batch objectives read.

The sampler (``jagent.rollout``) knows nothing of objectives; training maps
its trajectories into a :class:`jagent.transforms.Batch` here, so rollout and
transforms stay sibling packages.
"""

from __future__ import annotations

import jax.numpy as jnp

from jagent import transforms
from jagent.rollout import _trajectory


def trajectory_batch(traj: _trajectory.Trajectory) -> transforms.Batch:
  """The :class:`jagent.transforms.Batch` that objectives consume.

  One row of the batch per row of the trajectory (``R`` rows, ``P = R / B``
  to an episode, see :class:`jagent.rollout.Trajectory`). Sampled-token
  fields map one to one (``tokens`` int32 ``[R, S]``, ``loss_mask`` bool
  ``[R, S]``, ``sampler_logprobs`` = ``traj.logprobs`` float32 ``[R, S]``,
  ``rewards`` = ``traj.token_rewards`` float32 ``[R, S]``, ``turn_ids``
  int32 ``[R, S]``), and so does ``row_valid`` bool ``[R]``. Episode fields
  reach the rows through ``traj.row_episode``: ``scores`` float32 ``[R]``
  and ``terminated`` bool ``[R]`` (truncated rows bootstrap in GAE) are the
  episode's on each of its rows; ``anchor_hashes`` int32 ``[R, T / P]`` are
  the anchors of the turns the row holds (``traj.anchor_hashes[row_episode,
  row_turn + i]``: all T with one row per episode, the row's own turn with
  one row per turn). ``turns_per_episode = P``; with ``P > 1``,
  ``episode_turns`` float32 ``[R]`` is the number of valid rows of the row's
  episode (see :mod:`jagent.transforms` on turn rows). ``group_size`` counts
  episodes. ``format_valid`` is NOT carried over: the rollout is the one
  home of the format penalty (``RolloutConfig.format_penalty``, already in
  ``rewards``, as RAGEN's es_manager does), so no objective stage can apply
  it again. Jittable (and ``jax.eval_shape``-able).

  Tree rollouts (``traj.tree_size > 0``): ``tree_nodes`` int32 ``[R, T]`` is
  the row's episode's ``traj.tree_node`` and ``tree_size`` is carried over.

  Args:
    traj: a :class:`jagent.rollout.Trajectory` of ``B`` episodes in ``R``
      rows.

  Returns:
    a :class:`jagent.transforms.Batch` of ``R`` rows.

  Raises:
    ValueError: ``R`` not a multiple of ``B`` or ``row_valid`` not ``[R]``.
  """
  b, t = traj.anchor_hashes.shape
  r = traj.tokens.shape[0]
  if r % b:
    raise ValueError(f"trajectory_batch: {r} token rows are not a whole number of rows per "
                     f"episode for B = {b} episodes")
  p = r // b
  ep = jnp.asarray(traj.row_episode, jnp.int32)
  valid = jnp.asarray(traj.row_valid, jnp.bool_)
  if valid.shape != (r,):
    raise ValueError(f"trajectory_batch: row_valid must be [R] = [{r}] rows; got shape "
                     f"{valid.shape}.")
  # The turns each row holds: all T with one row per episode, its own with one per turn.
  held = (jnp.asarray(traj.row_turn, jnp.int32)[:, None]
          + jnp.arange(t // p, dtype=jnp.int32)[None])
  extra = {}
  if p > 1:  # the transforms' turn rows: each row weighs 1 / its episode's valid rows
    turns = jnp.sum(valid.reshape(b, p).astype(jnp.float32), axis=1)
    extra["episode_turns"] = turns[ep]
  tree = getattr(traj, "tree_size", 0)
  if tree:
    extra.update(tree_nodes=traj.tree_node[ep], tree_size=tree)
  return transforms.Batch(
      tokens=traj.tokens, loss_mask=traj.loss_mask, sampler_logprobs=traj.logprobs,
      rewards=traj.token_rewards, scores=traj.scores[ep], terminated=traj.terminated[ep],
      turn_ids=traj.turn_ids, anchor_hashes=traj.anchor_hashes[ep[:, None], held],
      row_valid=valid, group_size=traj.group_size, turns_per_episode=p, **extra)
