"""Loss aggregation that returns ``(sum, denominator)`` for exact accumulation.

Each mode reduces a per-token loss ``[B, T]`` and a mask ``[B, T]`` to
``Aggregate(total, denominator)`` such that the loss of a batch split into
micro-batches ``k`` is exactly ``sum_k total_k / sum_k denominator_k`` (a mean
of per-micro-batch means would weight micro-batches wrongly). A row whose mask
is all zero (padding, or a group dropped by a rollout filter) adds nothing to
any total or denominator, except the constant of ``seq-mean-token-sum-norm``.

Masking selects rather than multiplies: a loss value where the mask is 0 (a
NaN or inf log-prob on a padded token, say) reaches neither a total nor a
gradient, where ``0 * nan = nan`` would poison both (as fixed in verl PR
#6349). The gradient with respect to ``loss_bt`` is exactly 0 there. A
caller that computes ``loss_bt`` from inputs that are non-finite at masked
positions must also select those inputs before the computation (the "double
where"): the zero cotangent times a non-finite local derivative is NaN.

Modes (:math:`m` mask, :math:`l` loss, :math:`n_i = \\sum_t m_{i,t}`,
:math:`N = |\\{i: n_i > 0\\}|`, ``L`` a constant horizon):

==========================  ===================================  ==============
mode                        total                                denominator
==========================  ===================================  ==============
token-mean                  sum_{i,t} m l                        sum_{i,t} m
seq-mean-token-mean         sum_i (sum_t m l) / n_i              N
seq-mean-token-sum          sum_{i,t} m l                        N
seq-mean-token-sum-norm     sum_{i,t} m l                        B * L
==========================  ===================================  ==============

``seq-mean-token-sum-norm`` is Dr.GRPO's constant normaliser. verl divides by
``L`` only; we also divide by the static row count ``B`` so the denominator
adds up over micro-batches (a constant factor, the same as Dr.GRPO's
``1/G``).

Row weights (``aggregate(..., row_weights=w)``, float ``[B]``): every mode is
a sum over rows of a per-row ``(total_i, denominator_i)`` (the row's
``sum_t m l`` or its token mean, and ``n_i``, ``[n_i > 0]`` or ``L``), and
``w_i`` multiplies both, so the accumulation stays exact. With turn rows
(one row per turn) ``w_i = 1 / (turns of i's episode)`` makes every episode
weigh the same whatever its number of turns (with ``seq-mean-token-mean``:
the mean over its turn rows, then over episodes).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from jagent._src import checks
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.losses import _checks

TOKEN_MEAN = "token-mean"
SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"
AGGREGATION_MODES = (TOKEN_MEAN, SEQ_MEAN_TOKEN_MEAN, SEQ_MEAN_TOKEN_SUM,
                     SEQ_MEAN_TOKEN_SUM_NORM)
"""The aggregation modes of :func:`aggregate` (verl ``loss_agg_mode`` names)."""


class Aggregate(NamedTuple):
  """An unreduced loss: ``total / denominator`` is its value.

  Attributes:
    total: float32 ``[]`` the summed loss.
    denominator: float32 ``[]`` what to divide by (0 if nothing was kept).
  """
  total: Array
  denominator: Array


def _prep(loss_bt, mask_bt):
  for name, x in (("loss_bt", loss_bt), ("mask_bt", mask_bt)):
    _checks.check_rank(name, x, 2, "B, T")
  _checks.check_same_shape(("loss_bt", "mask_bt"), (loss_bt, mask_bt))
  m = _checks.f32(mask_bt)
  return masked(loss_bt, m), m


def masked(x: ArrayLike, mask: ArrayLike) -> Array:
  """``mask * x`` where ``mask != 0``, and exactly 0 elsewhere.

  A select, not a product: a NaN or inf of ``x`` where ``mask == 0`` reaches
  neither the result nor its gradient (``0 * nan`` is NaN). Finite input
  gives ``mask * x`` bit for bit.

  Args:
    x: float array.
    mask: float or bool array of the shape of ``x`` (fractional = weights).

  Returns:
    float32 array of the shape of ``x``.
  """
  m = _checks.f32(mask)
  return jnp.where(m != 0, _checks.f32(x) * m, 0.0)


def _num_sequences(m):
  return jnp.sum((jnp.sum(m, axis=1) > 0).astype(jnp.float32))


def token_mean(loss_bt: ArrayLike, mask_bt: ArrayLike) -> Aggregate:
  """Token-mean: ``(sum(m l), sum(m))``; every trained token weighs the same.

  Args:
    loss_bt: float ``[B, T]`` per-token loss.
    mask_bt: float or bool ``[B, T]`` mask (fractional = weights).

  Returns:
    :class:`Aggregate` of float32 scalars.

  Raises:
    ValueError: on rank/shape mismatch.

  References:
    verl ``agg_loss`` "token-mean"; DAPO's token-level loss
    (https://arxiv.org/abs/2503.14476).
  """
  lm, m = _prep(loss_bt, mask_bt)
  return Aggregate(jnp.sum(lm), jnp.sum(m))


def seq_mean_token_mean(loss_bt: ArrayLike, mask_bt: ArrayLike) -> Aggregate:
  """Seq-mean-token-mean: mean over sequences of each sequence's token mean.

  ``total = sum_i sum_t m l / n_i`` over rows with ``n_i > 0``,
  ``denominator`` = number of such rows.

  Args:
    loss_bt: float ``[B, T]`` per-token loss.
    mask_bt: float or bool ``[B, T]`` mask.

  Returns:
    :class:`Aggregate` of float32 scalars.

  Raises:
    ValueError: on rank/shape mismatch.

  References:
    GRPO's objective (Shao et al., https://arxiv.org/abs/2402.03300); verl
    ``agg_loss`` "seq-mean-token-mean".
  """
  lm, m = _prep(loss_bt, mask_bt)
  n = jnp.sum(m, axis=1)
  per_seq = jnp.sum(lm, axis=1) / jnp.maximum(n, 1e-30)
  return Aggregate(jnp.sum(jnp.where(n > 0, per_seq, 0.0)), _num_sequences(m))


def seq_mean_token_sum(loss_bt: ArrayLike, mask_bt: ArrayLike) -> Aggregate:
  """Seq-mean-token-sum: mean over sequences of each sequence's token sum.

  Args:
    loss_bt: float ``[B, T]`` per-token loss.
    mask_bt: float or bool ``[B, T]`` mask.

  Returns:
    :class:`Aggregate`: ``(sum(m l), number of rows with n_i > 0)``.

  Raises:
    ValueError: on rank/shape mismatch.

  References:
    Dr.GRPO (https://arxiv.org/abs/2503.20783); verl ``agg_loss``
    "seq-mean-token-sum".
  """
  lm, m = _prep(loss_bt, mask_bt)
  return Aggregate(jnp.sum(lm), _num_sequences(m))


def seq_mean_token_sum_norm(
    loss_bt: ArrayLike,
    mask_bt: ArrayLike,
    horizon: int | None = None,
) -> Aggregate:
  """Seq-mean-token-sum-norm: token sum over a constant ``B * L``.

  Args:
    loss_bt: float ``[B, T]`` per-token loss.
    mask_bt: float or bool ``[B, T]`` mask.
    horizon: the constant ``L`` (default ``T``, the padded length; keep it
      fixed across training).

  Returns:
    :class:`Aggregate`: ``(sum(m l), B * L)``.

  Raises:
    ValueError: on rank/shape mismatch or ``horizon < 1``.

  References:
    Dr.GRPO (https://arxiv.org/abs/2503.20783); verl ``agg_loss``
    "seq-mean-token-sum-norm" (which divides by ``L`` only).
  """
  lm, _ = _prep(loss_bt, mask_bt)
  b, t = lm.shape
  length = t if horizon is None else checks.check_int(
      "horizon", horizon, 1)
  return Aggregate(jnp.sum(lm), jnp.asarray(float(b * length), jnp.float32))


def _row_weighted(loss_bt, mask_bt, mode, horizon, row_weights):
  """The per-row ``(total_i, denominator_i)`` of ``mode``, weighted by rows."""
  lm, m = _prep(loss_bt, mask_bt)
  _checks.check_rank("row_weights", row_weights, 1, "B")
  w = _checks.f32(row_weights)
  if w.shape[0] != m.shape[0]:
    raise ValueError(f"row_weights has {w.shape[0]} rows, mask_bt "
                     f"{m.shape[0]}.")
  n = jnp.sum(m, axis=1)
  row_sum = jnp.sum(lm, axis=1)
  has = (n > 0).astype(jnp.float32)
  if mode == TOKEN_MEAN:
    total, den = row_sum, n
  elif mode == SEQ_MEAN_TOKEN_MEAN:
    total, den = jnp.where(n > 0, row_sum / jnp.maximum(n, 1e-30), 0.0), has
  elif mode == SEQ_MEAN_TOKEN_SUM:
    total, den = row_sum, has
  else:
    length = m.shape[1] if horizon is None else checks.check_int(
        "horizon", horizon, 1)
    total, den = row_sum, jnp.full_like(n, float(length))
  return Aggregate(jnp.sum(w * total), jnp.sum(w * den))


def aggregate(
    loss_bt: ArrayLike,
    mask_bt: ArrayLike,
    mode: str = TOKEN_MEAN,
    horizon: int | None = None,
    row_weights: ArrayLike | None = None,
) -> Aggregate:
  """Dispatches to the aggregation named ``mode`` (one of AGGREGATION_MODES).

  Args:
    loss_bt: float ``[B, T]`` per-token loss.
    mask_bt: float or bool ``[B, T]`` mask.
    mode: a name in :data:`AGGREGATION_MODES`.
    horizon: ``L`` for ``seq-mean-token-sum-norm`` (ignored otherwise).
    row_weights: optional float ``[B]`` weight of each row's total and
      denominator (see the module docstring); None: every row 1 (exactly the
      unweighted modes).

  Returns:
    :class:`Aggregate`.

  Raises:
    ValueError: for an unknown mode or bad shapes.
  """
  if row_weights is not None and mode in AGGREGATION_MODES:
    return _row_weighted(loss_bt, mask_bt, mode, horizon, row_weights)
  if mode == TOKEN_MEAN:
    return token_mean(loss_bt, mask_bt)
  if mode == SEQ_MEAN_TOKEN_MEAN:
    return seq_mean_token_mean(loss_bt, mask_bt)
  if mode == SEQ_MEAN_TOKEN_SUM:
    return seq_mean_token_sum(loss_bt, mask_bt)
  if mode == SEQ_MEAN_TOKEN_SUM_NORM:
    return seq_mean_token_sum_norm(loss_bt, mask_bt, horizon)
  raise ValueError(f"mode must be one of {AGGREGATION_MODES}; got {mode!r}.")


def safe_ratio(total: ArrayLike, denominator: ArrayLike) -> Array:
  """``total / denominator``, and 0 where the denominator is 0.

  Args:
    total: float ``[...]``.
    denominator: float ``[...]``.

  Returns:
    float32 ``[...]``.
  """
  d = _checks.f32(denominator)
  return jnp.where(d > 0, _checks.f32(total) / jnp.where(d > 0, d, 1.0), 0.0)
