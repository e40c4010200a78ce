"""The consumer side of a rollout: a Trajectory as the Batch objectives read.

The sampler (``jagent.rollout``) knows nothing of objectives; training maps
its trajectories into a :class:`jagent.transforms.Batch` here, so rollout and
transforms stay sibling packages.
"""

from __future__ import annotations

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

  Args:
    traj: a :class:`jagent.rollout.Trajectory` of ``B`` rows.

  Returns:
    a :class:`jagent.transforms.Batch` of ``B`` rows.
  """
  return transforms.Batch(
      tokens=traj.tokens, loss_mask=traj.loss_mask, sampler_logprobs=traj.logprobs,
      rewards=traj.token_rewards, scores=traj.scores, terminated=traj.terminated,
      turn_ids=traj.turn_ids, anchor_hashes=traj.anchor_hashes,
      group_size=traj.group_size)
