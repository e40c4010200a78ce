"""Advantage and return estimators for token sequences and rollout groups.

Conventions (shape letters of ``jagent._src.types``):

- Per-trajectory functions take one trajectory: arrays ``[T]`` over its time
  steps (tokens unless stated) and batch with ``jax.vmap`` (rlax style).
- ``mask_t`` (float or bool ``[T]``) marks the trained tokens (sampled
  assistant tokens). Masked-out tokens (prompt, observations, padding) are
  skipped: they neither carry reward nor break the recursion, and get
  advantage/return 0 (verl's multi-turn GAE convention).
- Groups: rows of a batch are group-major (row ``b`` belongs to group
  ``b // G``) and ``G`` is static. Per-group functions take one group ``[G]``
  and batch over groups with ``jax.vmap`` on ``x.reshape(B // G, G)``. A group
  of size 1 carries no comparison and gets advantage 0 (verl instead uses mean
  0 / std 1 there, i.e. the raw score).
- Group standard deviations are unbiased (ddof = 1, as ``torch.std`` in verl).

All outputs are float32. Inputs of any floating dtype are computed in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jagent._src import checks
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.losses import _aggregation
from jagent.losses import _checks


class AdvantagesAndReturns(NamedTuple):
  """Advantages and value targets of one trajectory.

  Attributes:
    advantages: float32 ``[T]``; 0 where the mask is 0.
    returns: float32 ``[T]``, ``advantages + values`` (the value-loss target);
      0 where the mask is 0.
  """
  advantages: Array
  returns: Array


def _gae_scan(r_t, v_t, m_t, terminal_t, next_value, gamma, lambda_):
  """Reverse GAE recursion over the valid steps of one trajectory.

  At a valid step ``t`` with carry ``(v_next, a_next)`` (value and advantage of
  the next valid step), ``terminal_t`` zeroes the carry, then
  ``delta = r_t + gamma v_next - v_t`` and ``a_t = delta + gamma lambda
  a_next``. Invalid steps pass the carry through and output 0.
  """

  def step(carry, x):
    v_next, a_next = carry
    r, v, m, terminal = x
    keep = 1.0 - terminal
    delta = r + gamma * keep * v_next - v
    a = delta + gamma * lambda_ * keep * a_next
    valid = m > 0
    new_carry = (jnp.where(valid, v, v_next), jnp.where(valid, a, a_next))
    return new_carry, jnp.where(valid, a, 0.0)

  init = (jnp.asarray(next_value, jnp.float32), jnp.zeros((), jnp.float32))
  _, adv = jax.lax.scan(step, init, (r_t, v_t, m_t, terminal_t), reverse=True)
  return adv


def _check_trajectory(names, arrays):
  for name, x in zip(names, arrays):
    _checks.check_rank(name, x, 1, "T")
  _checks.check_same_shape(names, arrays)


def _check_gamma_lambda(gamma, lambda_):
  _checks.check_in_range("gamma", gamma, 0.0, 1.0)
  _checks.check_in_range("lambda_", lambda_, 0.0, 1.0)


def _final_next_value(terminated, bootstrap_value):
  _checks.check_rank("terminated", terminated, 0)
  _checks.check_rank("bootstrap_value", bootstrap_value, 0)
  terminated = jnp.asarray(terminated, jnp.bool_)
  return jnp.where(terminated, 0.0, _checks.f32(bootstrap_value))


def gae(
    rewards_t: ArrayLike,
    values_t: ArrayLike,
    mask_t: ArrayLike,
    terminated: ArrayLike = True,
    bootstrap_value: ArrayLike = 0.0,
    gamma: float = 1.0,
    lambda_: float = 1.0,
) -> AdvantagesAndReturns:
  r"""Generalised advantage estimation that keeps termination and truncation apart.

  Over the valid steps :math:`t_1 < \dots < t_n` of one trajectory:

  .. math::

    \delta_k = r_{t_k} + \gamma V_{t_{k+1}} - V_{t_k}, \qquad
    A_{t_k} = \delta_k + \gamma \lambda A_{t_{k+1}}, \qquad
    R_{t_k} = A_{t_k} + V_{t_k},

  with :math:`A_{t_{n+1}} = 0` and :math:`V_{t_{n+1}} = 0` if the episode
  terminated, or ``bootstrap_value`` (e.g. the critic's value of the state
  after the last step) if it was truncated by a time or turn limit. Masked-out
  steps are skipped (their rewards are ignored). With ``gamma = lambda_ = 1``
  and one terminal reward ``R`` this gives ``A_t = R - V_t``. No whitening is
  applied; see :func:`masked_whiten`.

  Args:
    rewards_t: float ``[T]`` per-step rewards (per-token rewards: the reward
      of a turn sits on its last trained token).
    values_t: float ``[T]`` critic values ``V_t``.
    mask_t: float or bool ``[T]``, 1 on the steps to train on.
    terminated: bool ``[]``; True if the episode ended in a terminal state
      (no bootstrap), False if it was truncated.
    bootstrap_value: float ``[]``, the value used after the last valid step
      when ``terminated`` is False.
    gamma: discount per valid step, in [0, 1].
    lambda_: GAE lambda, in [0, 1].

  Returns:
    :class:`AdvantagesAndReturns` of float32 ``[T]`` arrays.

  Raises:
    ValueError: if the arrays are not rank 1 of equal shape, ``terminated`` or
      ``bootstrap_value`` is not a scalar, or gamma/lambda lie outside [0, 1].

  References:
    Schulman et al., "High-Dimensional Continuous Control Using Generalized
    Advantage Estimation" (https://arxiv.org/abs/1506.02438); masked skipping
    as in verl's ``compute_gae_advantage_return``; truncation bootstrapping as
    brax's ``compute_gae(truncation, termination, ...)``.
  """
  _check_trajectory(("rewards_t", "values_t", "mask_t"),
                    (rewards_t, values_t, mask_t))
  _check_gamma_lambda(gamma, lambda_)
  next_value = _final_next_value(terminated, bootstrap_value)
  r, v, m = _checks.f32(rewards_t), _checks.f32(values_t), _checks.f32(mask_t)
  adv = _gae_scan(r, v, m, jnp.zeros_like(m), next_value, gamma, lambda_)
  return AdvantagesAndReturns(adv, jnp.where(m > 0, adv + v, 0.0))


def discounted_returns(
    rewards_t: ArrayLike,
    mask_t: ArrayLike,
    gamma: float = 1.0,
) -> Array:
  r"""Discounted reward-to-go over the valid steps of one trajectory.

  :math:`G_{t_k} = r_{t_k} + \gamma G_{t_{k+1}}`, :math:`G_{t_{n+1}} = 0`;
  masked-out steps are skipped and get 0.

  Args:
    rewards_t: float ``[T]`` rewards.
    mask_t: float or bool ``[T]`` valid steps.
    gamma: discount per valid step, in [0, 1].

  Returns:
    float32 ``[T]`` returns.

  Raises:
    ValueError: on rank/shape mismatch or gamma outside [0, 1].

  References:
    Williams, "Simple statistical gradient-following algorithms" (1992); the
    token returns of REINFORCE++ (https://arxiv.org/abs/2501.03262).
  """
  _check_trajectory(("rewards_t", "mask_t"), (rewards_t, mask_t))
  _checks.check_in_range("gamma", gamma, 0.0, 1.0)
  r, m = _checks.f32(rewards_t), _checks.f32(mask_t)
  zeros = jnp.zeros_like(m)
  return _gae_scan(r, zeros, m, zeros, 0.0, gamma, 1.0)


def turn_ends(mask_t: ArrayLike, turn_ids_t: ArrayLike | None = None) -> Array:
  """Marks the last trained token of every turn of one trajectory.

  Token ``t`` ends a turn iff it is trained (``mask_t > 0``) and the next
  trained token after it belongs to another turn or does not exist. Without
  ``turn_ids_t`` a turn is a maximal run of consecutive trained tokens.

  Args:
    mask_t: float or bool ``[T]`` trained tokens.
    turn_ids_t: optional int ``[T]``, the assistant-turn index of each token
      (any value on masked-out tokens).

  Returns:
    bool ``[T]``.

  Raises:
    ValueError: on rank/shape mismatch or a non-integer ``turn_ids_t``.
  """
  _checks.check_rank("mask_t", mask_t, 1, "T")
  valid = jnp.asarray(mask_t) > 0
  if turn_ids_t is None:
    next_valid = jnp.concatenate([valid[1:], jnp.zeros((1,), jnp.bool_)])
    return valid & ~next_valid
  _check_trajectory(("mask_t", "turn_ids_t"), (mask_t, turn_ids_t))
  _checks.check_integer("turn_ids_t", turn_ids_t)
  ids = jnp.asarray(turn_ids_t, jnp.int32)

  def step(carry, x):
    has_next, next_id = carry
    ok, tid = x
    is_end = ok & (~has_next | (next_id != tid))
    carry = (has_next | ok, jnp.where(ok, tid, next_id))
    return carry, is_end

  init = (jnp.zeros((), jnp.bool_), jnp.zeros((), jnp.int32))
  _, ends = jax.lax.scan(step, init, (valid, ids), reverse=True)
  return ends


def _turn_reward_at_ends(r_t, m_t, end_t):
  """Sum of the trained rewards of each turn, placed on its end token."""
  c = jnp.cumsum(_aggregation.masked(r_t, m_t))
  idx = jnp.arange(c.shape[0])
  last_end = jax.lax.cummax(jnp.where(end_t, idx, -1))
  prev_end = jnp.concatenate([jnp.full((1,), -1, last_end.dtype), last_end[:-1]])
  prev_c = jnp.where(prev_end >= 0, c[jnp.maximum(prev_end, 0)], 0.0)
  return jnp.where(end_t, c - prev_c, 0.0)


def bilevel_gae(
    rewards_t: ArrayLike,
    values_t: ArrayLike,
    mask_t: ArrayLike,
    turn_ids_t: ArrayLike | None = None,
    terminated: ArrayLike = True,
    bootstrap_value: ArrayLike = 0.0,
    gamma: float = 1.0,
    lambda_: float = 1.0,
    turn_gamma: float = 0.95,
) -> AdvantagesAndReturns:
  r"""Turn-level ("bi-level") GAE of one multi-turn trajectory.

  1. Turn level: with :math:`e_1 < \dots < e_n` the end tokens of the turns
     (:func:`turn_ends`), :math:`\rho_k` the sum of the trained rewards of turn
     :math:`k` and values taken at the end tokens,
     :math:`\delta_k = \rho_k + \gamma_{turn} V_{e_{k+1}} - V_{e_k}`,
     :math:`A^{turn}_k = \delta_k + \gamma_{turn}\lambda A^{turn}_{k+1}`, with
     the same termination/truncation rule as :func:`gae`. The turn return is
     :math:`R_k = A^{turn}_k + V_{e_k}`.
  2. Token level: inside each turn, token GAE with ``gamma`` and ``lambda_``
     where the end token is terminal with reward :math:`R_k` (other tokens
     reward 0). Hence :math:`A_{e_k} = A^{turn}_k`, and with
     ``gamma = lambda_ = 1`` every token of turn ``k`` gets
     :math:`R_k - V_t`.

  Turns come from the mask and turn ids, not from where rewards are non-zero
  (RAGEN's implementation finds turn ends as the non-zero rewards, so a turn
  with reward exactly 0 merges into the next one; we do not copy that). No
  whitening is applied.

  Args:
    rewards_t: float ``[T]`` per-token rewards (rewards on masked-out tokens
      are ignored).
    values_t: float ``[T]`` critic values.
    mask_t: float or bool ``[T]`` trained tokens.
    turn_ids_t: optional int ``[T]`` assistant-turn index of each token.
    terminated: bool ``[]``; False means truncated (bootstrap at turn level).
    bootstrap_value: float ``[]`` value after the last turn if truncated.
    gamma: token-level discount in [0, 1].
    lambda_: GAE lambda in [0, 1], used at both levels (as RAGEN).
    turn_gamma: turn-level discount in [0, 1] (RAGEN ``high_level_gamma``,
      default 0.95).

  Returns:
    :class:`AdvantagesAndReturns` of float32 ``[T]`` arrays.

  Raises:
    ValueError: on rank/shape/dtype mismatch or discounts outside [0, 1].

  References:
    RAGEN (Wang et al., https://arxiv.org/abs/2504.20073),
    ``compute_bi_level_gae_advantage_return``; hierarchical turn/token MDP as
    in ArCHer (Zhou et al., https://arxiv.org/abs/2402.19446).
  """
  _check_trajectory(("rewards_t", "values_t", "mask_t"),
                    (rewards_t, values_t, mask_t))
  _check_gamma_lambda(gamma, lambda_)
  _checks.check_in_range("turn_gamma", turn_gamma, 0.0, 1.0)
  next_value = _final_next_value(terminated, bootstrap_value)
  r, v, m = _checks.f32(rewards_t), _checks.f32(values_t), _checks.f32(mask_t)
  end = turn_ends(m, turn_ids_t)
  end_f = end.astype(jnp.float32)
  turn_r = _turn_reward_at_ends(r, m, end)
  zeros = jnp.zeros_like(m)
  turn_adv = _gae_scan(turn_r, v, end_f, zeros, next_value, turn_gamma,
                       lambda_)
  token_r = jnp.where(end, turn_adv + v, 0.0)
  adv = _gae_scan(token_r, v, m, end_f, 0.0, gamma, lambda_)
  return AdvantagesAndReturns(adv, jnp.where(m > 0, adv + v, 0.0))


def _check_group(name, x):
  _checks.check_rank(name, x, 1, "G")
  _checks.check_float(name, x)


def centred(s: Array, axis: int = -1) -> Array:
  """``s - mean(s)`` along ``axis``, exactly 0 where all entries are equal.

  The float32 mean of equal values can round (eight scores of 10.7 average to
  10.699999), leaving deviations of ~1e-6 whose std-normalisation turns a
  group with no signal into advantages of ~0.5 that do not sum to zero. A
  second pass removes the rounding of the first mean; equal entries give 0.
  """
  c = s - jnp.mean(s, axis=axis, keepdims=True)
  c = c - jnp.mean(c, axis=axis, keepdims=True)
  equal = jnp.max(s, axis=axis, keepdims=True) == jnp.min(s, axis=axis, keepdims=True)
  return jnp.where(equal, 0.0, c)


def _group_centred_std(s_g):
  """Centred scores and unbiased std of one group (std 0 for a group of one)."""
  g = s_g.shape[0]
  c = centred(s_g)
  if g == 1:
    return c, jnp.zeros((), jnp.float32)
  return c, jnp.sqrt(jnp.sum(jnp.square(c)) / (g - 1))


def group_members(scores_g: ArrayLike, valid_g: ArrayLike | None = None) -> Array:
  """Which members of a group count: finite scores, and ``valid_g`` if given.

  Args:
    scores_g: float ``[G]`` scores of one group.
    valid_g: optional bool ``[G]``, False for members to leave out (e.g. an
      episode invalidated by a non-finite reward elsewhere).

  Returns:
    bool ``[G]``.

  Raises:
    ValueError: if ``valid_g`` is not ``[G]``.
  """
  s = _checks.f32(scores_g)
  v = jnp.isfinite(s)
  if valid_g is None:
    return v
  _checks.check_same_shape(("scores_g", "valid_g"), (scores_g, valid_g))
  return v & jnp.asarray(valid_g, jnp.bool_)


def masked_centred_std(s_g, v_g):
  """Like :func:`_group_centred_std` over the members ``v_g`` only.

  Returns ``(c, std, n)``: centred scores (0 off the members and where the
  members' scores are all equal), their unbiased std (0 for n <= 1) and the
  member count n.
  """
  vf = v_g.astype(jnp.float32)
  n = jnp.sum(vf)
  s0 = jnp.where(v_g, s_g, 0.0)
  c = jnp.where(v_g, s0 - jnp.sum(s0) / jnp.maximum(n, 1.0), 0.0)
  c = jnp.where(v_g, c - jnp.sum(c) / jnp.maximum(n, 1.0), 0.0)  # see `centred`
  hi = jnp.max(jnp.where(v_g, s0, -jnp.inf))
  lo = jnp.min(jnp.where(v_g, s0, jnp.inf))
  c = jnp.where(hi == lo, 0.0, c)
  std = jnp.where(n > 1.0, jnp.sqrt(jnp.sum(jnp.square(c)) /
                                    jnp.maximum(n - 1.0, 1.0)), 0.0)
  return c, std, n


def grpo_advantages(
    scores_g: ArrayLike,
    eps: float = 1e-6,
    normalize_std: bool = True,
    valid_g: ArrayLike | None = None,
) -> Array:
  r"""GRPO group-normalised advantages of one group.

  :math:`A_i = (s_i - \mathrm{mean}_g s) / (\mathrm{std}_g s + \epsilon)`
  (unbiased std), or :math:`s_i - \mathrm{mean}_g s` when
  ``normalize_std=False`` (Dr.GRPO). Broadcast over a trajectory's trained
  tokens by the caller. Advantages of a group sum to zero; a group of one gets
  0.

  Members whose score is not finite (NaN, inf: a broken environment reward)
  or whose ``valid_g`` is False are left out: the mean and std are over the
  other members, and they get advantage 0, so one bad episode does not turn
  its whole group into NaN (TRL PR #5773's case). With every member valid the
  result is exactly the unmasked formula.

  Args:
    scores_g: float ``[G]`` trajectory scores of one group.
    eps: added to the std, > 0 (default 1e-6 as verl).
    normalize_std: divide by the group std.
    valid_g: optional bool ``[G]``; False leaves a member out (as above).

  Returns:
    float32 ``[G]``.

  Raises:
    ValueError: if ``scores_g`` is not a rank-1 float array or eps <= 0.

  References:
    Shao et al., "DeepSeekMath" (https://arxiv.org/abs/2402.03300), outcome
    supervision; verl ``compute_grpo_outcome_advantage``.
  """
  _check_group("scores_g", scores_g)
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)
  s = _checks.f32(scores_g)
  if s.shape[0] == 1:
    return jnp.zeros_like(s)
  v = group_members(s, valid_g)
  c, std = _group_centred_std(s)
  plain = c / (std + eps) if normalize_std else c
  mc, mstd, _ = masked_centred_std(s, v)
  masked = mc / (mstd + eps) if normalize_std else mc
  # The unmasked formula whenever every member counts (bit for bit as before).
  return jnp.where(jnp.all(v), plain, masked)


def dr_grpo_advantages(scores_g: ArrayLike,
                       valid_g: ArrayLike | None = None) -> Array:
  r"""Dr.GRPO advantages of one group: :math:`A_i = s_i - \mathrm{mean}_g s`.

  No std normalisation (which biases towards easy/hard questions); pair with
  the ``seq-mean-token-sum`` aggregation. A group of one gets 0; non-finite or
  invalid members are left out as in :func:`grpo_advantages`.

  Args:
    scores_g: float ``[G]`` trajectory scores.
    valid_g: optional bool ``[G]``; False leaves a member out.

  Returns:
    float32 ``[G]``, summing to zero.

  Raises:
    ValueError: if ``scores_g`` is not a rank-1 float array.

  References:
    Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective"
    (https://arxiv.org/abs/2503.20783).
  """
  return grpo_advantages(scores_g, normalize_std=False, valid_g=valid_g)


def rloo_advantages(scores_g: ArrayLike,
                    valid_g: ArrayLike | None = None) -> Array:
  r"""REINFORCE leave-one-out advantages of one group.

  :math:`A_i = s_i - \frac{1}{G-1}\sum_{j \ne i} s_j
  = \frac{G}{G-1}(s_i - \mathrm{mean}_g s)`. A group of one gets 0.
  Non-finite or invalid members are left out (``G`` becomes the count of the
  others; they get 0), as in :func:`grpo_advantages`.

  Args:
    scores_g: float ``[G]`` trajectory scores.
    valid_g: optional bool ``[G]``; False leaves a member out.

  Returns:
    float32 ``[G]``.

  Raises:
    ValueError: if ``scores_g`` is not a rank-1 float array.

  References:
    Kool et al., "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (2019);
    Ahmadian et al. (https://arxiv.org/abs/2402.14740); verl
    ``compute_rloo_outcome_advantage``.
  """
  _check_group("scores_g", scores_g)
  s = _checks.f32(scores_g)
  g = s.shape[0]
  if g == 1:
    return jnp.zeros_like(s)
  v = group_members(s, valid_g)
  mc, _, n = masked_centred_std(s, v)
  masked = jnp.where(n > 1.0, mc * n / jnp.maximum(n - 1.0, 1.0), 0.0)
  return jnp.where(jnp.all(v), centred(s) * (g / (g - 1)), masked)


def masked_whiten(
    x: ArrayLike,
    mask: ArrayLike,
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> Array:
  r"""Whitens ``x`` with the mean and variance of its masked entries.

  :math:`\hat x = (x - \mu) / \sqrt{\sigma^2 + \epsilon}` with :math:`\mu,
  \sigma^2` the mean and unbiased variance over ``mask > 0`` (``mask`` may be
  fractional: a weighted mean). With ``shift_mean=False`` the mean is added
  back. Entries outside the mask are set to 0 and never read (they may be
  NaN or inf). One or zero masked entries give variance 0.

  Args:
    x: float array of any shape (typically ``[B, T]``).
    mask: float or bool array of the same shape.
    shift_mean: keep the result centred at 0.
    eps: variance floor, > 0.

  Returns:
    float32 array of the shape of ``x``.

  Raises:
    ValueError: if the shapes differ or eps <= 0.

  References:
    verl ``masked_whiten`` (unbiased masked variance); advantage
    normalisation as in PPO implementations (Andrychowicz et al.,
    https://arxiv.org/abs/2006.05990).
  """
  _checks.check_same_shape(("x", "mask"), (x, mask))
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)
  m = _checks.f32(mask)
  # Select before any arithmetic: a NaN or inf outside the mask then reaches
  # neither the statistics nor a gradient.
  x = jnp.where(m != 0, _checks.f32(x), 0.0)
  n = jnp.sum(m)
  mean = jnp.sum(x * m) / jnp.maximum(n, 1.0)
  var = jnp.sum(m * jnp.square(x - mean)) / jnp.maximum(n, 1.0)
  var = jnp.where(n > 1.0, var * n / jnp.maximum(n - 1.0, 1.0), 0.0)
  out = (x - mean) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(m > 0, out, 0.0)


def _check_batch_tokens(names, arrays):
  for name, x in zip(names, arrays):
    _checks.check_rank(name, x, 2, "B, T")
  _checks.check_same_shape(names, arrays)


def reinforce_pp_advantages(
    rewards_bt: ArrayLike,
    mask_bt: ArrayLike,
    gamma: float = 1.0,
) -> Array:
  r"""REINFORCE++ advantages of a batch: token returns whitened over the batch.

  :math:`A = \mathrm{whiten}_{mask}(G)` with :math:`G_t` the discounted
  reward-to-go of each trajectory (:func:`discounted_returns`).

  Args:
    rewards_bt: float ``[B, T]`` per-token rewards.
    mask_bt: float or bool ``[B, T]`` trained tokens.
    gamma: discount per trained token, in [0, 1].

  Returns:
    float32 ``[B, T]`` (0 outside the mask).

  Raises:
    ValueError: on rank/shape mismatch or gamma outside [0, 1].

  References:
    Hu, "REINFORCE++" (https://arxiv.org/abs/2501.03262); verl
    ``compute_reinforce_plus_plus_outcome_advantage``.
  """
  _check_batch_tokens(("rewards_bt", "mask_bt"), (rewards_bt, mask_bt))
  _checks.check_in_range("gamma", gamma, 0.0, 1.0)
  returns = jax.vmap(discounted_returns, in_axes=(0, 0, None))(
      rewards_bt, mask_bt, gamma)
  return masked_whiten(returns, mask_bt)


def reinforce_pp_baseline_advantages(
    scores_b: ArrayLike,
    mask_bt: ArrayLike,
    group_size: int,
    valid_b: ArrayLike | None = None,
) -> Array:
  r"""REINFORCE++-baseline advantages: group-centred scores, batch-whitened.

  :math:`A_{b,t} = \mathrm{whiten}_{mask}(s_b - \mathrm{mean}_{g(b)} s)`,
  broadcast over the trained tokens of row ``b``. Rows are group-major with
  static ``group_size``; a group of one centres to 0.

  Args:
    scores_b: float ``[B]`` trajectory scores.
    mask_bt: float or bool ``[B, T]`` trained tokens.
    group_size: static ``G`` dividing ``B``.
    valid_b: optional bool ``[B]``; False (or a non-finite score) leaves a
      row out of its group's mean (see :func:`dr_grpo_advantages`).

  Returns:
    float32 ``[B, T]``.

  Raises:
    ValueError: on rank mismatch or if ``group_size`` does not divide ``B``.

  References:
    Hu, "REINFORCE++" (https://arxiv.org/abs/2501.03262); verl
    ``compute_reinforce_plus_plus_baseline_outcome_advantage``.
  """
  _checks.check_rank("scores_b", scores_b, 1, "B")
  _checks.check_rank("mask_bt", mask_bt, 2, "B, T")
  groups = as_groups("scores_b", scores_b, group_size)
  if valid_b is None:
    centred = jax.vmap(dr_grpo_advantages)(groups).reshape(-1)
  else:
    centred = jax.vmap(dr_grpo_advantages)(
        groups, as_groups("valid_b", valid_b, group_size)).reshape(-1)
  if centred.shape[0] != _checks.shape_of(mask_bt)[0]:
    raise ValueError(f"scores_b has {centred.shape[0]} rows but mask_bt has "
                     f"{_checks.shape_of(mask_bt)[0]}.")
  m = _checks.f32(mask_bt)
  return masked_whiten(centred[:, None] * m, m)


def as_groups(name: str, x_b: ArrayLike, group_size: int) -> Array:
  """Reshapes group-major rows ``[B, ...]`` into ``[B // G, G, ...]``.

  Args:
    name: the argument's name, for errors.
    x_b: array whose leading axis is ``B``.
    group_size: static ``G`` >= 1 dividing ``B``.

  Returns:
    the reshaped array.

  Raises:
    ValueError: if ``group_size`` is not a positive int dividing ``B``.
  """
  g = checks.check_int("group_size", group_size, 1)
  x = jnp.asarray(x_b)
  if x.ndim < 1 or x.shape[0] % g:
    raise ValueError(f"group_size {g} must divide the leading axis of {name} "
                     f"(shape {x.shape}).")
  return x.reshape((x.shape[0] // g, g) + x.shape[1:])


class GigpoAdvantages(NamedTuple):
  """GiGPO advantages of one group, per turn.

  Attributes:
    episode: float32 ``[G]`` episode-level (group-normalised score) advantage.
    step: float32 ``[G, T]`` step-level (anchor-state) advantage per turn;
      0 on invalid turns.
    advantages: float32 ``[G, T]``, ``episode[:, None] + step_weight * step``
      on valid turns, 0 elsewhere.
    anchor_group_size: int32 ``[G, T]``, how many valid turns of the group
      share this turn's anchor state (itself included); 0 on invalid turns.
  """
  episode: Array
  step: Array
  advantages: Array
  anchor_group_size: Array


def gigpo_advantages(
    scores_g: ArrayLike,
    step_rewards_gt: ArrayLike,
    anchors_gt: ArrayLike,
    turn_mask_gt: ArrayLike,
    step_gamma: float = 0.95,
    step_weight: float = 1.0,
    eps: float = 1e-6,
    normalize_std: bool = True,
    valid_g: ArrayLike | None = None,
) -> GigpoAdvantages:
  r"""Group-in-Group (GiGPO) advantages of one group of trajectories.

  - Episode level: :math:`A^E_i` = :func:`grpo_advantages` of the trajectory
    scores (``normalize_std`` chooses mean-std or mean-only normalisation).
  - Step level: :math:`R_{i,t} = \sum_{k \ge 0} \gamma^k r_{i,t+k}` is the
    discounted return of turn ``t`` over the valid turns of trajectory ``i``.
    The anchor group of ``(i, t)`` is every valid ``(j, u)`` of the same group
    with ``anchors[j, u] == anchors[i, t]`` (other trajectories and other turns
    alike); :math:`A^S_{i,t} = (R_{i,t} - \mathrm{mean}) / (\mathrm{std} +
    \epsilon)` over it (unbiased std; mean only if ``normalize_std=False``).
    A singleton anchor group gets :math:`A^S = 0`.
  - :math:`A_{i,t} = A^E_i + w A^S_{i,t}`.

  A trajectory whose score or a valid turn's reward is not finite, or whose
  ``valid_g`` is False, is left out of both levels (its turns become invalid,
  advantage 0), as in :func:`grpo_advantages`.

  Cost is :math:`O((G T)^2)` comparisons per group (a few thousand for
  ``G = 16, T = 5``); shapes are static.

  Args:
    scores_g: float ``[G]`` trajectory scores.
    step_rewards_gt: float ``[G, T]`` reward of each turn.
    anchors_gt: int ``[G, T]`` hash of the environment state each turn acted
      from (equal hashes = identical states; the caller picks the hash).
    turn_mask_gt: bool or float ``[G, T]`` valid turns.
    step_gamma: turn-level discount in [0, 1] (0.95 as the paper).
    step_weight: weight ``w`` of the step advantage (1.0 as the paper).
    eps: std floor, > 0.
    normalize_std: divide by the std at both levels.
    valid_g: optional bool ``[G]``; False leaves a trajectory out.

  Returns:
    :class:`GigpoAdvantages`.

  Raises:
    ValueError: on rank/shape/dtype mismatch or out-of-range hyperparameters.

  References:
    Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training"
    (https://arxiv.org/abs/2505.10978); verl-agent ``core_gigpo.py``.
  """
  _check_group("scores_g", scores_g)
  names = ("step_rewards_gt", "anchors_gt", "turn_mask_gt")
  arrays = (step_rewards_gt, anchors_gt, turn_mask_gt)
  for name, x in zip(names, arrays):
    _checks.check_rank(name, x, 2, "G, T")
  _checks.check_same_shape(names, arrays)
  _checks.check_integer("anchors_gt", anchors_gt)
  if _checks.shape_of(anchors_gt)[0] != _checks.shape_of(scores_g)[0]:
    raise ValueError(f"anchors_gt has {_checks.shape_of(anchors_gt)[0]} rows, "
                     f"scores_g {_checks.shape_of(scores_g)[0]}.")
  _checks.check_in_range("step_gamma", step_gamma, 0.0, 1.0)
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)
  m = _checks.f32(turn_mask_gt)
  r = _checks.f32(step_rewards_gt)
  ok = group_members(scores_g, valid_g) & jnp.all(
      jnp.isfinite(jnp.where(m > 0, r, 0.0)), axis=1)
  episode = grpo_advantages(scores_g, eps, normalize_std, ok)
  # Multiplying by 1.0 / selecting unread entries keeps finite input exact.
  m = m * ok[:, None].astype(jnp.float32)
  returns = jax.vmap(discounted_returns, in_axes=(0, 0, None))(
      jnp.where(m > 0, r, 0.0), m, step_gamma)
  shape = returns.shape
  ret, valid = returns.reshape(-1), m.reshape(-1) > 0
  h = jnp.asarray(anchors_gt).reshape(-1)
  same = (h[:, None] == h[None, :]) & valid[:, None] & valid[None, :]
  same_f = same.astype(jnp.float32)
  count = jnp.sum(same_f, axis=1)
  mean = same_f @ ret / jnp.maximum(count, 1.0)
  # Exactly 0 in a step group whose returns are all equal (see `centred`).
  hi = jnp.max(jnp.where(same, ret[None, :], -jnp.inf), axis=1)
  lo = jnp.min(jnp.where(same, ret[None, :], jnp.inf), axis=1)
  dev = jnp.where(hi == lo, 0.0, ret - mean)
  if normalize_std:
    sq = same_f * jnp.square(ret[None, :] - mean[:, None])
    var = jnp.sum(sq, axis=1) / jnp.maximum(count - 1.0, 1.0)
    std = jnp.where((count > 1.0) & (hi > lo), jnp.sqrt(var), 0.0)
    dev = dev / (std + eps)
  step = jnp.where(valid, dev, 0.0).reshape(shape)
  combined = jnp.where(m > 0, episode[:, None] + step_weight * step, 0.0)
  return GigpoAdvantages(episode, step, combined,
                         count.astype(jnp.int32).reshape(shape))
