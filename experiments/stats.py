"""The statistics a run reports: Wilson intervals and the Echo Trap alert.

:func:`wilson_interval` is the 95% interval of an evaluation's success
rate; :func:`collapse_alert` names the collapse diagnostics
(:data:`ALERT_FLOORS`) that fell below their floors in
``config.diagnostics``, on the steps :func:`diagnostics_due` runs them.
"""

from __future__ import annotations

import math
from typing import Sequence

import jagent

_Z95 = 1.959963984540054  # the standard normal's 0.975 quantile


def wilson_interval(rate: float, n: int) -> tuple[float, float]:
  """The 95% Wilson score interval of a success rate over ``n`` trials.

  For ``p = rate`` (successes / n) and ``z = 1.959964`` (the normal's 97.5%
  quantile)::

    (p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)

  (Wilson, "Probable inference, the law of succession, and statistical
  inference", JASA 1927). Unlike the normal approximation ``p -+ z sqrt(p (1
  - p) / n)`` it stays inside ``[0, 1]`` and is not empty at 0 or 1 success.
  Evaluations are one episode per level, so ``n`` is the number of levels:
  on 512 levels at ``p`` ~ 0.45 it is about +-0.043 (two standard errors).

  Args:
    rate: the success rate in ``[0, 1]``.
    n: the number of trials (>= 1).

  Returns:
    ``(low, high)`` floats.

  Raises:
    ValueError: ``n < 1`` or ``rate`` outside ``[0, 1]``.
  """
  jagent.check_int("wilson_interval: n", n, 1)
  if not 0.0 <= rate <= 1.0:
    raise ValueError(f"wilson_interval: rate={rate!r} must be in [0, 1].")
  z2 = _Z95 ** 2
  center = (rate + z2 / (2 * n)) / (1 + z2 / n)
  half = _Z95 * math.sqrt(rate * (1 - rate) / n + z2 / (4 * n * n)) / (1 + z2 / n)
  return max(0.0, center - half), min(1.0, center + half)


# The Echo Trap early warning (collapse_alert): a metric and its floor in
# config.diagnostics.
ALERT_FLOORS = (("filter/reward_std_before", "min_reward_std"),
                ("actor/entropy", "min_entropy"),
                ("collapse/mutual_info", "min_mutual_info"))


def diagnostics_due(step, every: int):
  """Whether RL step ``step`` (0-based; a Python or traced int) runs the diagnostics.

  The first step and every ``every``-th (``step + 1`` a multiple of
  ``every``, as ``eval.every``), so they are logged at steps 1, every,
  2 every, ...; ``every`` must be >= 1.
  """
  return (step == 0) | ((step + 1) % every == 0)


def collapse_alert(config, step: int, metrics: dict,
                   recent: Sequence[dict] | None = None) -> str | None:
  """The Echo Trap warning of logged step ``step``, or None.

  On the steps that ran the diagnostics (a finite ``collapse/*`` value in
  ``metrics``, e.g. ``collapse/replies``; on the other steps they are NaN or
  absent), each of :data:`ALERT_FLOORS` whose value is below its
  floor ``config.diagnostics.min_*`` (a floor of 0 checks nothing; NaN is
  never below it) is named on one line: RAGEN's early signs of the Echo
  Trap (in-group reward std and policy entropy falling) and RAGEN-2's
  template collapse (``I(X;Z)`` falling).

  The per-step metrics (reward std, entropy) are compared by their mean
  over ``recent``: one step's reward std swings by a factor of ten between
  neighbouring steps of a healthy run, and a warning should name a trend.
  Values that are absent or NaN (not measured: the entropy of a step that
  trained nothing, ``jagent.train.train_step``) are left out of the mean.
  ``I(X;Z)`` is measured on the diagnosed steps only, so this step's value
  is used.

  Args:
    config: the run's config (its ``diagnostics`` block).
    step: the logged step (1-based), named in the line.
    metrics: this step's metrics (a dict of floats).
    recent: the metrics of the logged steps since the previous diagnosed
      step, this one's last; None: this step alone.

  Returns:
    ``"Echo Trap warning at step N: key=value < diagnostics.floor=f; ..."``
    (``mean of K steps`` after a value averaged over K > 1 steps), or None.
  """
  d = config.diagnostics
  if not any(k.startswith("collapse/") and math.isfinite(v) for k, v in metrics.items()):
    return None
  recent = [metrics] if not recent else list(recent)
  crossed = []
  for key, floor in ALERT_FLOORS:
    if d[floor] <= 0:
      continue
    rows = [metrics] if key.startswith("collapse/") else recent
    values = [float(r[key]) for r in rows if key in r and math.isfinite(r[key])]
    if not values:
      continue
    value = sum(values) / len(values)
    if value < d[floor]:
      over = f" (mean of {len(values)} steps)" if len(values) > 1 else ""
      crossed.append(f"{key}={value:.4g}{over} < diagnostics.{floor}={d[floor]:g}")
  if not crossed:
    return None
  return f"Echo Trap warning at step {step}: " + "; ".join(crossed)
