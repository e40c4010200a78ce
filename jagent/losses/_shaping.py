"""Reward shaping: format penalty, turn/token reward placement, running norms.

When tokens and turns appear together, tokens are ``S`` and turns ``T``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from jagent._src import checks
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.losses import _advantages
from jagent.losses import _checks

FORMAT_PENALTY = -0.1
"""RAGEN's format penalty (``es_manager.format_penalty: -0.1``): the reward
added to a turn whose reply has a bad format. One sign everywhere: a penalty is
the (non-positive) amount added, as in ``jagent.rollout.RolloutConfig``."""


def format_penalty(format_valid_t: ArrayLike,
                   penalty: float = FORMAT_PENALTY) -> Array:
  """Per-turn format penalty: ``penalty`` on every turn with a bad format.

  A turn's format is bad when any parsed action is invalid or there is no
  valid action (an unparseable reply included); RAGEN adds -0.1 once per such
  turn to the trajectory score.

  Args:
    format_valid_t: bool ``[T]`` (turns), True where the turn's format was ok.
    penalty: the reward added to a bad turn, <= 0 (RAGEN: -0.1).

  Returns:
    float32 ``[T]``: 0 or ``penalty``.

  Raises:
    ValueError: if ``format_valid_t`` is not rank 1 or penalty > 0.

  References:
    RAGEN (https://arxiv.org/abs/2504.20073), ``es_manager.format_penalty``.
  """
  _checks.check_rank("format_valid_t", format_valid_t, 1, "T")
  _checks.check_in_range("penalty", penalty, -float("inf"), 0.0)
  return jnp.where(jnp.asarray(format_valid_t, jnp.bool_), 0.0,
                   jnp.float32(penalty))


def _check_tokens(mask_s, turn_ids_s):
  for name, x in (("mask_s", mask_s), ("turn_ids_s", turn_ids_s)):
    _checks.check_rank(name, x, 1, "S")
  _checks.check_same_shape(("mask_s", "turn_ids_s"), (mask_s, turn_ids_s))
  _checks.check_integer("turn_ids_s", turn_ids_s)


def turn_mask(mask_s: ArrayLike, turn_ids_s: ArrayLike, num_turns: int) -> Array:
  """Which turns exist: turn ``t`` has at least one trained token.

  Args:
    mask_s: float or bool ``[S]`` trained tokens.
    turn_ids_s: int ``[S]`` turn index per token (ids outside
      ``[0, num_turns)`` are ignored).
    num_turns: static ``T``.

  Returns:
    bool ``[T]``.

  Raises:
    ValueError: on rank/shape/dtype mismatch or ``num_turns < 1``.
  """
  _check_tokens(mask_s, turn_ids_s)
  t = checks.check_int("num_turns", num_turns, 1)
  onehot = (jnp.asarray(turn_ids_s)[:, None] == jnp.arange(t)[None, :])
  return jnp.any(onehot & (jnp.asarray(mask_s)[:, None] > 0), axis=0)


def token_to_turn_rewards(rewards_s: ArrayLike, mask_s: ArrayLike,
                          turn_ids_s: ArrayLike, num_turns: int) -> Array:
  """Sums the trained per-token rewards of each turn.

  Args:
    rewards_s: float ``[S]`` per-token rewards.
    mask_s: float or bool ``[S]`` trained tokens.
    turn_ids_s: int ``[S]`` turn index per token.
    num_turns: static ``T``.

  Returns:
    float32 ``[T]``.

  Raises:
    ValueError: on rank/shape/dtype mismatch.
  """
  _check_tokens(mask_s, turn_ids_s)
  _checks.check_same_shape(("mask_s", "rewards_s"), (mask_s, rewards_s))
  t = checks.check_int("num_turns", num_turns, 1)
  onehot = (jnp.asarray(turn_ids_s)[:, None] == jnp.arange(t)[None, :])
  rm = _checks.f32(rewards_s) * _checks.f32(mask_s)
  return jnp.sum(jnp.where(onehot, rm[:, None], 0.0), axis=0)


def turn_to_token_rewards(turn_rewards_t: ArrayLike, mask_s: ArrayLike,
                          turn_ids_s: ArrayLike) -> Array:
  """Places each turn's reward on the turn's last trained token (verl style).

  Args:
    turn_rewards_t: float ``[T]`` per-turn rewards.
    mask_s: float or bool ``[S]`` trained tokens.
    turn_ids_s: int ``[S]`` turn index per token; a token whose id lies
      outside ``[0, T)`` gets nothing.

  Returns:
    float32 ``[S]``, zero except on turn-end tokens.

  Raises:
    ValueError: on rank/shape/dtype mismatch.
  """
  _checks.check_rank("turn_rewards_t", turn_rewards_t, 1, "T")
  _check_tokens(mask_s, turn_ids_s)
  ends = _advantages.turn_ends(mask_s, turn_ids_s)
  ids = jnp.asarray(turn_ids_s)
  t = _checks.shape_of(turn_rewards_t)[0]
  ok = ends & (ids >= 0) & (ids < t)
  r = _checks.f32(turn_rewards_t)[jnp.clip(ids, 0, t - 1)]
  return jnp.where(ok, r, 0.0)


class RunningNormState(NamedTuple):
  """Running mean and variance (Chan et al. parallel update).

  Attributes:
    count: float32 ``[]`` number of samples seen.
    mean: float32 ``[]`` running mean.
    m2: float32 ``[]`` running sum of squared deviations.
  """
  count: Array
  mean: Array
  m2: Array


def running_norm_init() -> RunningNormState:
  """An empty :class:`RunningNormState` (count 0)."""
  z = jnp.zeros((), jnp.float32)
  return RunningNormState(z, z, z)


def running_norm_update(x: ArrayLike, state: RunningNormState,
                        mask: ArrayLike | None = None) -> RunningNormState:
  r"""Merges the masked entries of ``x`` into the running moments.

  With batch count :math:`n_b`, mean :math:`\mu_b` and squared deviations
  :math:`M_b`: :math:`\delta = \mu_b - \mu`, :math:`n' = n + n_b`,
  :math:`\mu' = \mu + \delta n_b / n'`,
  :math:`M' = M + M_b + \delta^2 n n_b / n'`.

  Args:
    x: float array of any shape (e.g. trajectory scores ``[B]``).
    state: the current :class:`RunningNormState`.
    mask: optional float or bool array of ``x``'s shape (weights).

  Returns:
    the updated :class:`RunningNormState`.

  Raises:
    ValueError: if ``mask`` has another shape.

  References:
    Chan, Golub and LeVeque, "Updating formulae and a pairwise algorithm for
    computing sample variances" (1979).
  """
  x = _checks.f32(x)
  if mask is None:
    m = jnp.ones_like(x)
  else:
    _checks.check_same_shape(("x", "mask"), (x, mask))
    m = _checks.f32(mask)
    # Unread where the mask is 0, so a NaN or inf there changes nothing.
    x = jnp.where(m != 0, x, 0.0)
  n_b = jnp.sum(m)
  mean_b = jnp.sum(x * m) / jnp.maximum(n_b, 1.0)
  m2_b = jnp.sum(m * jnp.square(x - mean_b))
  n = state.count + n_b
  delta = mean_b - state.mean
  frac = n_b / jnp.maximum(n, 1.0)
  return RunningNormState(
      count=n,
      mean=state.mean + delta * frac,
      m2=state.m2 + m2_b + jnp.square(delta) * state.count * frac,
  )


def running_norm_apply(x: ArrayLike, state: RunningNormState,
                       center: bool = False, eps: float = 1e-8) -> Array:
  r"""Normalises ``x`` by the running std (and mean if ``center``).

  :math:`x / (\sigma + \epsilon)` or :math:`(x - \mu)/(\sigma + \epsilon)`,
  with :math:`\sigma^2 = M / n` (population variance). Before two samples
  have been seen, :math:`\sigma = 1` and :math:`\mu = 0`, i.e. the identity.

  Args:
    x: float array of any shape.
    state: a :class:`RunningNormState`.
    center: subtract the running mean (do not centre per-token rewards, only
      trajectory-level quantities).
    eps: > 0, added to the std.

  Returns:
    float32 array of ``x``'s shape.

  Raises:
    ValueError: if eps <= 0.

  References:
    Reward scaling in PPO implementations (Engstrom et al., "Implementation
    Matters in Deep RL", https://arxiv.org/abs/2005.12729).
  """
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)
  ready = state.count > 1.0
  std = jnp.where(ready, jnp.sqrt(state.m2 / jnp.maximum(state.count, 1.0)),
                  1.0)
  mean = jnp.where(ready, state.mean, 0.0)
  x = _checks.f32(x)
  if center:
    x = x - mean
  return x / jnp.where(ready, std + eps, 1.0)
