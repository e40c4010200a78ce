"""Policy-gradient surrogate losses (per token, unreduced).

All functions return per-token losses (to be minimised) of the input shape,
usually ``[B, T]`` or ``[T]``; reduce them with the aggregation functions.
The importance ratio follows verl: :math:`\\rho = \\exp(\\mathrm{clip}(\\log\\pi -
\\log\\pi_{old}, -20, 20))`. Advantages are treated as constants
(``stop_gradient``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.losses import _checks

LOG_RATIO_CLIP = 20.0


class PolicyLoss(NamedTuple):
  """Per-token output of a clipped policy loss.

  Attributes:
    loss: float32, the per-token loss (minimise it).
    ratio: float32, the importance ratio used.
    clipped: bool, the clipped surrogate was strictly larger than the
      unclipped one (verl's ``pg_clipfrac`` numerator).
    dual_clipped: bool, the dual-clip bound ``-A c`` was active (A < 0 only).
  """
  loss: Array
  ratio: Array
  clipped: Array
  dual_clipped: Array


def importance_ratio(logprobs: ArrayLike, old_logprobs: ArrayLike) -> Array:
  r"""Token importance ratio :math:`\exp(\mathrm{clip}(\log\pi - \log\pi_{old}, -20, 20))`.

  Args:
    logprobs: float, log-probabilities of the sampled tokens under the current
      policy (any shape).
    old_logprobs: float, same shape, under the behaviour policy.

  Returns:
    float32 ratio, same shape.

  Raises:
    ValueError: if the shapes differ.

  References:
    Schulman et al., PPO (https://arxiv.org/abs/1707.06347); the clamp is
    verl's ``compute_policy_loss_vanilla``.
  """
  _checks.check_same_shape(("logprobs", "old_logprobs"), (logprobs, old_logprobs))
  log_ratio = _checks.f32(logprobs) - _checks.f32(old_logprobs)
  return jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))


def _check_clip(eps_low, eps_high):
  _checks.check_in_range("eps_low", eps_low, 0.0, 1.0, hi_open=True)
  _checks.check_in_range("eps_high", eps_high, 0.0, float("inf"))


def _clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip):
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(unclipped, clipped)
  was_clipped = clipped > unclipped
  if dual_clip is None:
    return loss, was_clipped, jnp.zeros_like(was_clipped)
  bound = -adv * dual_clip
  dual = (adv < 0) & (loss > bound)
  return jnp.where(adv < 0, jnp.minimum(loss, bound), loss), was_clipped, dual


def ppo_clip_loss(
    logprobs: ArrayLike,
    old_logprobs: ArrayLike,
    advantages: ArrayLike,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> PolicyLoss:
  r"""PPO clipped surrogate with asymmetric clip range and optional dual-clip.

  .. math::

    L = \max(-A\rho,\; -A\,\mathrm{clip}(\rho, 1-\epsilon_{low},
    1+\epsilon_{high})), \qquad
    L \leftarrow \min(L, -A c) \text{ where } A < 0 \text{ (dual-clip)}.

  ``eps_high > eps_low`` is DAPO's clip-higher. Where the clipped branch (or
  the dual-clip bound) is active the loss is constant in ``logprobs``, so the
  gradient there is exactly zero.

  Args:
    logprobs: float ``[...]`` current-policy log-probs of the sampled tokens.
    old_logprobs: float ``[...]`` behaviour (pre-update) log-probs.
    advantages: float ``[...]`` advantages (gradient stopped).
    eps_low: lower clip range in [0, 1).
    eps_high: upper clip range >= 0.
    dual_clip: ``c`` > 1 for dual-clip, or None.

  Returns:
    :class:`PolicyLoss` of the input shape.

  Raises:
    ValueError: on shape mismatch, eps outside range or ``dual_clip <= 1``.

  References:
    Schulman et al., PPO (https://arxiv.org/abs/1707.06347); dual-clip: Ye et
    al. (https://arxiv.org/abs/1912.09729); clip-higher: Yu et al., DAPO
    (https://arxiv.org/abs/2503.14476); verl ``compute_policy_loss_vanilla``.
  """
  _checks.check_same_shape(("logprobs", "old_logprobs", "advantages"),
                           (logprobs, old_logprobs, advantages))
  _check_clip(eps_low, eps_high)
  if dual_clip is not None:
    _checks.check_in_range("dual_clip", dual_clip, 1.0, float("inf"),
                           lo_open=True)
  ratio = importance_ratio(logprobs, old_logprobs)
  adv = jax.lax.stop_gradient(_checks.f32(advantages))
  loss, clipped, dual = _clipped_surrogate(ratio, adv, eps_low, eps_high,
                                           dual_clip)
  return PolicyLoss(loss, ratio, clipped, dual)


def gspo_loss(
    logprobs_t: ArrayLike,
    old_logprobs_t: ArrayLike,
    advantages_t: ArrayLike,
    mask_t: ArrayLike,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> PolicyLoss:
  r"""GSPO: the clipped surrogate with a sequence-level importance ratio.

  For one sequence, :math:`s = \exp(\frac{1}{|y|}\sum_t m_t(\log\pi_t -
  \log\pi^{old}_t))` and the token-level form
  :math:`s_t = \mathrm{sg}[s]\,\pi_t / \mathrm{sg}[\pi_t]` (value :math:`s`
  on every token; its gradient, averaged over tokens with a per-sequence
  advantage, is the sequence-level GSPO gradient). Then
  :math:`L_t = \max(-A_t s_t, -A_t\,\mathrm{clip}(s_t, 1-\epsilon_{low},
  1+\epsilon_{high}))`. Aggregate with ``seq-mean-token-mean``.

  Args:
    logprobs_t: float ``[T]`` current log-probs of one sequence.
    old_logprobs_t: float ``[T]`` behaviour log-probs.
    advantages_t: float ``[T]`` advantages (normally constant per sequence).
    mask_t: float or bool ``[T]`` trained tokens.
    eps_low: lower clip range in [0, 1) (paper: 3e-4).
    eps_high: upper clip range >= 0 (paper: 4e-4).

  Returns:
    :class:`PolicyLoss` of shape ``[T]`` (``dual_clipped`` all False); entries
    outside the mask are still computed, the aggregation masks them; the
    log-probs there are never read (they may be NaN or inf), so they reach
    neither the value nor the gradient.

  Raises:
    ValueError: on rank/shape mismatch or eps outside range.

  References:
    Zheng et al., "Group Sequence Policy Optimization"
    (https://arxiv.org/abs/2507.18071); verl ``compute_policy_loss_gspo``.
  """
  names = ("logprobs_t", "old_logprobs_t", "advantages_t", "mask_t")
  arrays = (logprobs_t, old_logprobs_t, advantages_t, mask_t)
  for name, x in zip(names, arrays):
    _checks.check_rank(name, x, 1, "T")
  _checks.check_same_shape(names, arrays)
  _check_clip(eps_low, eps_high)
  m = _checks.f32(mask_t)
  # Log-probs outside the mask are never read (they may be NaN or inf on
  # padding): selected away before the arithmetic, so neither the sequence
  # ratio nor a gradient sees them.
  keep = m != 0
  logp = jnp.where(keep, _checks.f32(logprobs_t), 0.0)
  d = logp - jnp.where(keep, _checks.f32(old_logprobs_t), 0.0)
  seq_log_ratio = jnp.sum(m * d) / jnp.maximum(jnp.sum(m), 1.0)
  log_ratio = logp - jax.lax.stop_gradient(logp) + jax.lax.stop_gradient(
      seq_log_ratio)
  ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
  adv = jax.lax.stop_gradient(_checks.f32(advantages_t))
  loss, clipped, dual = _clipped_surrogate(ratio, adv, eps_low, eps_high, None)
  return PolicyLoss(loss, ratio, clipped, dual)


def policy_gradient_loss(logprobs: ArrayLike, advantages: ArrayLike) -> Array:
  r"""Plain (REINFORCE) policy-gradient loss :math:`L = -A \log\pi`.

  Args:
    logprobs: float ``[...]`` log-probs of the sampled tokens.
    advantages: float ``[...]`` advantages (gradient stopped).

  Returns:
    float32 per-token loss of the input shape.

  Raises:
    ValueError: if the shapes differ.

  References:
    Williams (1992), "Simple statistical gradient-following algorithms for
    connectionist reinforcement learning"; Sutton et al. (2000).
  """
  _checks.check_same_shape(("logprobs", "advantages"), (logprobs, advantages))
  adv = jax.lax.stop_gradient(_checks.f32(advantages))
  return -adv * _checks.f32(logprobs)


def truncated_importance_weights(
    old_logprobs: ArrayLike,
    sampler_logprobs: ArrayLike,
    cap: float = 2.0,
) -> Array:
  r"""Truncated importance weights for sampler/trainer mismatch (TIS).

  :math:`w = \min(\exp(\mathrm{clip}(\log\pi_{old} - \log\pi_{sampler},
  -20, 20)), C)`, gradient stopped. Multiply the per-token policy loss by
  ``w`` when the rollout engine's log-probs differ from the trainer's.

  Args:
    old_logprobs: float ``[...]`` trainer (old policy) log-probs.
    sampler_logprobs: float ``[...]`` log-probs reported by the sampler.
    cap: ``C`` > 0 (verl's ``tis_imp_ratio_cap``; 2.0 in Yao et al.).

  Returns:
    float32 weights of the input shape.

  Raises:
    ValueError: if the shapes differ or cap <= 0.

  References:
    Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (2025, https://fengyao.notion.site/off-policy-rl); Espeholt et
    al., IMPALA's truncated weights (https://arxiv.org/abs/1802.01561).
  """
  _checks.check_same_shape(("old_logprobs", "sampler_logprobs"),
                           (old_logprobs, sampler_logprobs))
  _checks.check_in_range("cap", cap, 0.0, float("inf"), lo_open=True)
  w = importance_ratio(old_logprobs, sampler_logprobs)
  return jax.lax.stop_gradient(jnp.minimum(w, cap))
