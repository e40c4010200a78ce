"""Rollout filters on in-group reward spread (StarPO-S and RAGEN-2).

Input is the RAW trajectory scores of a batch reshaped into groups,
``[B // G, G]`` (rows group-major, ``G`` static). The output is a keep mask
over groups (and rows) with static shapes: nothing is sliced, dropped rows are
masked out downstream. Ranking is by the unbiased in-group std, computed on
the sorted scores so that groups with the same multiset of scores get
bit-identical std; ties break towards the lower group index. Members whose
score is not finite (a broken environment reward) or that are marked invalid
are left out of their group's std, so the ranking never reads a NaN.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jagent._src.errors import FieldError
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.losses import _advantages
from jagent.losses import _checks

TOP_FRACTION = "top_fraction"
TOP_K = "top_k"
TOP_P = "top_p"
MIN_P = "min_p"
FILTER_MODES = (TOP_FRACTION, TOP_K, TOP_P, MIN_P)
"""Modes of :func:`filter_groups`."""

ZERO_STD = 1e-10
"""A group std at or below this counts as zero (RAGEN's tolerance)."""


class FilterResult(NamedTuple):
  """What a rollout filter kept.

  Attributes:
    keep: bool ``[B // G]``, the kept groups.
    keep_rows: bool ``[B]``, ``keep`` repeated over each group's rows.
    group_std: float32 ``[B // G]``, unbiased in-group std of the raw scores
      (of the finite, valid members: :func:`group_std`).
    kept_ratio: float32 ``[]``, kept groups / all groups.
    any_kept: bool ``[]``; False means "nothing survived: skip this step".
    std_mean: float32 ``[]``, mean group std before filtering.
    kept_std_mean: float32 ``[]``, mean group std of the kept groups (0 if
      none).
  """
  keep: Array
  keep_rows: Array
  group_std: Array
  kept_ratio: Array
  any_kept: Array
  std_mean: Array
  kept_std_mean: Array


def group_std(scores_ng: ArrayLike, valid_ng: ArrayLike | None = None) -> Array:
  """Unbiased std of each group, invariant to the order inside a group.

  Only the group's members count: finite scores, and ``valid_ng`` if given
  (as :func:`jagent.losses.grpo_advantages` counts them). A group with fewer
  than two members has std 0, and so has a group whose members' std is
  still not finite (float32 overflow of scores beyond ~1e19): it carries no
  usable spread, so it ranks with the zero-std groups (after every group with
  spread). With every member finite and valid the result is the plain
  formula bit for bit.

  Args:
    scores_ng: float ``[B // G, G]`` raw trajectory scores.
    valid_ng: optional bool ``[B // G, G]``, False for members to leave out
      (e.g. episodes dropped for a non-finite reward).

  Returns:
    float32 ``[B // G]``, finite and >= 0; 0 for groups of one.

  Raises:
    ValueError: if ``scores_ng`` is not a rank-2 float array, or
      ``valid_ng`` not of its shape.
  """
  _checks.check_rank("scores_ng", scores_ng, 2, "B // G, G")
  _checks.check_float("scores_ng", scores_ng)
  if valid_ng is not None:
    _checks.check_same_shape(("scores_ng", "valid_ng"), (scores_ng, valid_ng))
  x = _checks.f32(scores_ng)
  g = x.shape[1]
  if g == 1:
    return jnp.zeros(x.shape[:1], jnp.float32)
  members = jnp.isfinite(x)
  if valid_ng is not None:
    members &= jnp.asarray(valid_ng, jnp.bool_)
  # Non-members sort last (+inf), so the members' order is canonical too.
  s = jnp.sort(jnp.where(members, x, jnp.inf), axis=1)
  m = jnp.isfinite(s)
  plain = jnp.sqrt(jnp.sum(jnp.square(_advantages.centred(s, axis=1)), axis=1) / (g - 1))
  masked = jax.vmap(lambda s_g, m_g: _advantages.masked_centred_std(s_g, m_g)[1])(s, m)
  std = jnp.where(jnp.all(m, axis=1), plain, masked)
  return jnp.where(jnp.isfinite(std), std, 0.0)


def _ranks(std, eligible):
  """Rank of each group: eligible first, then std descending, index ascending."""
  key = jnp.where(eligible, -std, jnp.inf)
  order = jnp.argsort(key, stable=True)
  n = std.shape[0]
  return jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32)), order


def check_filter_args(mode: str, value: float) -> None:
  """Raises ValueError for an unknown mode or a value out of its range."""
  if mode not in FILTER_MODES:
    raise ValueError(f"mode must be one of {FILTER_MODES}; got {mode!r}.")
  if not _checks.is_concrete_number(value):
    raise ValueError(f"value must be a Python number; got {value!r}.")
  if mode == TOP_FRACTION:
    _checks.check_in_range("value", value, 0.0, 1.0, lo_open=True)
  elif mode == TOP_K:
    _checks.check_in_range("value", value, 1.0, float("inf"))
  elif mode == TOP_P:
    _checks.check_in_range("value", value, 0.0, float("inf"), lo_open=True)
  else:
    _checks.check_in_range("value", value, 0.0, 1.0)



@dataclasses.dataclass(frozen=True)
class FilterConfig:
  """The uncertainty filter of a rollout: one object, validated once.

  An objective owns it as data (``transforms.starpo_s(filter_config=...)``,
  read back as ``Objective.filter_config``); :func:`jagent.train.rl_iteration`
  alone applies it, ranking and compacting the kept groups
  (:func:`jagent.train.compact_groups`), and
  :func:`jagent.transforms.filter_rollouts` applies it to a batch by hand.
  Hashable (a static argument of a jitted step).

  Attributes:
    mode: one of :data:`FILTER_MODES` (see :func:`filter_groups`).
    value: the mode's parameter (a Python number): fraction in (0, 1]
      (``top_fraction``; StarPO-S: 0.25), count >= 1 (``top_k``), share > 0
      (``top_p``; RAGEN-2: 0.9), ratio in [0, 1] (``min_p``).
    include_zero: whether zero-std groups may be kept (a bool).

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming the bad field, e.g.
      ``FilterConfig.mode='top': must be one of (...)``.

  References:
    StarPO-S (RAGEN, https://arxiv.org/abs/2504.20073, section 4.3).
  """
  mode: str = TOP_FRACTION
  value: float = 0.25
  include_zero: bool = True

  def __post_init__(self):
    def bad(field, why):
      raise FieldError("FilterConfig", field, getattr(self, field), why)

    if self.mode not in FILTER_MODES:
      bad("mode", f"must be one of {FILTER_MODES}")
    try:
      check_filter_args(self.mode, self.value)
    except ValueError as e:
      bad("value", f"invalid for mode {self.mode!r} ({e})")
    if not isinstance(self.include_zero, bool):
      bad("include_zero", "must be a bool")

  @property
  def fixed_count(self) -> bool:
    """Whether the mode keeps a number of groups known before the data."""
    return self.mode in (TOP_FRACTION, TOP_K)


KEEP_ALL = FilterConfig(TOP_FRACTION, 1.0, True)
"""The filter that keeps every group (no uncertainty filtering)."""

DROP_ZERO_STD = FilterConfig(TOP_FRACTION, 1.0, False)
"""The filter that keeps every group with reward spread (DAPO's dynamic sampling)."""


def filter_groups(
    scores_ng: ArrayLike,
    mode: str = TOP_FRACTION,
    value: float = 0.25,
    include_zero: bool = True,
    valid_ng: ArrayLike | None = None,
) -> FilterResult:
  """Keeps the groups whose raw rewards vary most (uncertainty filtering).

  Modes (``N = B // G`` groups, ``sigma`` the group stds):

  - ``top_fraction``: the ``k = max(1, int(value * N))`` groups of largest
    std (StarPO-S: ``value = 0.25``; RAGEN's ``top_k`` with a ratio).
  - ``top_k``: the ``k = min(int(value), N)`` groups of largest std.
  - ``top_p``: in order of decreasing std, keep groups while the share of
    total std kept before them is below ``value`` (so the kept share reaches
    ``value``); zero-std groups are never kept, and nothing is kept if all
    stds are zero. ``value >= 1`` keeps every group (RAGEN-2, 0.9
    recommended).
  - ``min_p``: groups with ``sigma >= value * max(sigma)``.

  With ``include_zero=False`` groups of zero std are never kept by any mode
  (DAPO-style dynamic sampling). Ties break towards the lower group index.

  Non-finite scores (NaN, inf) and members with ``valid_ng`` False are left
  out of their group's std (:func:`group_std`): such a group ranks by its
  finite members' spread, and one with fewer than two of them (or a std that
  overflows) counts as a zero-std group. The ranking is therefore the same
  whatever the NaNs' payloads or positions.

  Args:
    scores_ng: float ``[B // G, G]`` RAW trajectory scores (not normalised;
      RAGEN v1 ranked normalised scores, a known bug).
    mode: one of :data:`FILTER_MODES`.
    value: the mode's parameter: fraction in (0, 1] (``top_fraction``), count
      >= 1 (``top_k``), share in (0, inf) (``top_p``), ratio in [0, 1]
      (``min_p``).
    include_zero: whether zero-std groups may be kept.
    valid_ng: optional bool ``[B // G, G]``: False leaves a member out of
      its group's std (e.g. an episode dropped for a non-finite reward,
      whose score was then zeroed).

  Returns:
    :class:`FilterResult`.

  Raises:
    ValueError: for an unknown mode, a value out of range or bad shapes.

  References:
    StarPO-S (RAGEN, https://arxiv.org/abs/2504.20073, section 4.3); RAGEN-2
    ``rollout_filter.py`` (top_p "linear", top_k, min_p); DAPO dynamic
    sampling (https://arxiv.org/abs/2503.14476).
  """
  check_filter_args(mode, value)
  std = group_std(scores_ng, valid_ng)
  n, g = _checks.shape_of(scores_ng)
  nonzero = std > ZERO_STD
  eligible = nonzero if not include_zero else jnp.ones_like(nonzero)

  if mode in (TOP_FRACTION, TOP_K):
    k = max(1, int(value * n)) if mode == TOP_FRACTION else int(value)
    rank, _ = _ranks(std, eligible)
    keep = (rank < min(k, n)) & eligible
  elif mode == TOP_P:
    if value >= 1.0:
      keep = eligible
    else:
      rank, order = _ranks(std, nonzero)
      s_sorted = jnp.where(nonzero, std, 0.0)[order]
      before = jnp.cumsum(s_sorted) - s_sorted
      total = jnp.sum(s_sorted)
      keep_sorted = (before < value * total) & (s_sorted > ZERO_STD)
      keep = keep_sorted[rank]
  else:
    keep = (std >= value * jnp.max(std)) & eligible

  keep_f = keep.astype(jnp.float32)
  num_kept = jnp.sum(keep_f)
  return FilterResult(
      keep=keep,
      keep_rows=jnp.repeat(keep, g),
      group_std=std,
      kept_ratio=num_kept / n,
      any_kept=num_kept > 0,
      std_mean=jnp.mean(std),
      kept_std_mean=jnp.sum(std * keep_f) / jnp.maximum(num_kept, 1.0),
  )
