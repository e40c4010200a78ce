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

  Sampled-token fields map one to one (``tokens`` int32 ``[B, S]``,
  ``loss_mask`` bool ``[B, S]``, ``sampler_logprobs`` = ``traj.logprobs``
  float32 ``[B, S]``, ``rewards`` = ``traj.token_rewards`` float32 ``[B, S]``,
  ``turn_ids`` int32 ``[B, S]``); the trajectory score ``[B]``, termination
  ``[B]`` (truncated rows bootstrap in GAE), turn anchors ``[B, T]`` and the
  static ``group_size`` are carried over. ``format_valid`` is NOT: the rollout
  is the one home of the format penalty (``RolloutConfig.format_penalty``,
  already in ``rewards``, as RAGEN's es_manager does), so no objective stage
  can apply it again. Jittable (and ``jax.eval_shape``-able).

  Turn rows (``traj.history_turns >= 0``: ``R = B * T`` rows, row ``r = b *
  T + t`` is turn ``t`` of episode ``b``, ``T = max_turns``): the token
  fields ``[R, S]`` map one to one as above; ``scores`` and ``terminated``
  are the episode's on each of its rows (``[B] -> [R]`` by
  ``traj.row_episode``); ``anchor_hashes`` is ``[R, 1]``, the anchor of the
  row's turn (``traj.anchor_hashes[row_episode, row_turn]``); ``row_valid``
  ``[R]`` is ``traj.row_valid`` (False: a turn not taken), ``episode_turns``
  ``[R]`` the number of valid rows of the row's episode, and
  ``turns_per_episode = T`` (see :mod:`jagent.transforms` on turn rows).
  ``group_size`` still counts episodes.

  Tree rollouts (``traj.tree_size > 0``): ``tree_nodes`` is
  ``traj.tree_node`` (``[B, T]``; with turn rows the episode's ``[T]`` on
  each of its rows), ``tree_size`` is carried over, and ``row_valid`` is
  ``traj.row_valid`` (False on rows never forked into).

  Args:
    traj: a :class:`jagent.rollout.Trajectory` of ``B`` episodes (``B`` rows,
      or ``B * T`` turn rows).

  Returns:
    a :class:`jagent.transforms.Batch` of ``B`` (or ``B * T``) rows.
  """
  if getattr(traj, "history_turns", -1) >= 0:
    return _turn_rows_batch(traj)
  tree = getattr(traj, "tree_size", 0)
  return transforms.Batch(
      tokens=traj.tokens, loss_mask=traj.loss_mask, sampler_logprobs=traj.logprobs,
      rewards=traj.token_rewards, scores=traj.scores, terminated=traj.terminated,
      turn_ids=traj.turn_ids, anchor_hashes=traj.anchor_hashes,
      group_size=traj.group_size, **(dict(
          tree_nodes=traj.tree_node, tree_size=tree, row_valid=traj.row_valid) if tree else {}))


def _turn_rows_batch(traj) -> transforms.Batch:
  """:func:`trajectory_batch` of turn rows (``traj.history_turns >= 0``)."""
  b, t = traj.anchor_hashes.shape
  ep = jnp.asarray(traj.row_episode, jnp.int32)
  valid = jnp.asarray(traj.row_valid, jnp.bool_)
  if valid.shape != (b * t,):
    raise ValueError(f"trajectory_batch: row_valid must be [B * T] = "
                     f"[{b * t}] rows; got shape {valid.shape}.")
  turns = jnp.sum(valid.reshape(b, t).astype(jnp.float32), axis=1)
  return transforms.Batch(
      tokens=traj.tokens, loss_mask=traj.loss_mask,
      sampler_logprobs=traj.logprobs, rewards=traj.token_rewards,
      scores=traj.scores[ep],
      terminated=traj.terminated[ep], turn_ids=traj.turn_ids,
      anchor_hashes=traj.anchor_hashes[ep, traj.row_turn][:, None],
      row_valid=valid, episode_turns=turns[ep], group_size=traj.group_size,
      turns_per_episode=t, **(dict(tree_nodes=traj.tree_node[ep], tree_size=traj.tree_size)
                              if getattr(traj, "tree_size", 0) else {}))
