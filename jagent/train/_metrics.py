"""Per-step metrics: a JSON-lines file, TensorBoard event files and PNG plots."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jagent._src import files

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def _import_tensorboardx():
  try:
    import tensorboardX  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "MetricsWriter(tensorboard=True) needs the tensorboardX package, "
        "which is not installed: `pip install tensorboardX==2.6.5`, or pass "
        "tensorboard=False (metrics.jsonl is always written).") from e
  return tensorboardX


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The records of a ``metrics.jsonl`` file (one dict per line, in order).

  A last line without its newline that is not valid JSON is the record a
  killed run was writing: it is skipped (the resumed run writes that step
  again). Blank lines are skipped.

  Raises:
    ValueError: any other line is not JSON (naming the file and line).
  """
  with open(path) as fh:
    lines = fh.read().split("\n")
  records = []
  for i, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as e:
      if i == len(lines) - 1:  # no newline after it: cut short by a crash
        continue
      raise ValueError(f"{path}: line {i + 1} is not a JSON record ({e})") from e
  return records


@dataclasses.dataclass(frozen=True)
class PlotSeries:
  """One line of a :class:`PlotPanel`: a metric, or several merged into one.

  Attributes:
    keys: metric names (a str is one name). The finite points of every key
      are merged in step order, so one line can join records written under
      different names, e.g. ``("eval/sft/success", "eval/success",
      "eval/rl/success")``: the evaluations after SFT, during RL and after
      RL.
    label: legend text, or None (the first key when the panel has several
      series, none otherwise).
    sparse: True for a series with a few points (evaluations every N
      steps): drawn as points joined by lines, never smoothed, its legend
      giving the last value. False for a per-step series: drawn raw and
      faint under its EMA (the panel's ``smoothing``). Records without the
      key (a step that did not measure it, e.g. the entropy of a step that
      trained nothing) are gaps the EMA skips.

  Raises:
    ValueError: from ``__post_init__``, no keys or a key that is not a str.
  """
  keys: tuple[str, ...] | str
  label: str | None = None
  sparse: bool = False

  def __post_init__(self):
    keys = (self.keys,) if isinstance(self.keys, str) else tuple(self.keys)
    if not keys or not all(isinstance(k, str) and k for k in keys):
      raise ValueError(f"PlotSeries.keys={self.keys!r}: must be one or more "
                       "non-empty str.")
    object.__setattr__(self, "keys", keys)


@dataclasses.dataclass(frozen=True)
class PlotPanel:
  """One panel of a curves plot (:func:`plot_metrics`): what it draws, as data.

  Attributes:
    title: the panel's title, in words with units (e.g. ``"Policy entropy
      (nats/token)"``).
    series: its lines: :class:`PlotSeries`, or metric names (a str ``k``
      is ``PlotSeries(k)``).
    ylim: ``(low, high)`` fixed y range (either end None: automatic), or
      None (automatic).
    xlim: ``(low, high)`` fixed step range (e.g. the run's planned steps, so
      every panel shares one x axis), or None (automatic).
    smoothing: EMA weight of the past in ``[0, 1)`` for the per-step series
      (:func:`smooth_curve`; stated in the legend); 0 draws them as one
      plain line.
    baseline: a horizontal dashed reference line: a metric name (its last
      finite value in the file, whatever its step, e.g. the SFT evaluation
      ``"eval/sft/success"``), a number, or None.
    baseline_label: legend text of the baseline (its value is appended).
    min_step: records with a smaller step are left out of the series (e.g.
      1: only RL steps, not the SFT steps written at ``step <= 0``), or None.

  Raises:
    ValueError: from ``__post_init__``, no series or a bad ``smoothing``,
      ``ylim`` or ``xlim``.
  """
  title: str
  series: tuple[PlotSeries | str, ...] | PlotSeries | str
  ylim: tuple[float | None, float | None] | None = None
  xlim: tuple[float | None, float | None] | None = None
  smoothing: float = 0.9
  baseline: str | float | None = None
  baseline_label: str = "baseline"
  min_step: int | None = None

  def __post_init__(self):
    series = self.series
    if isinstance(series, (str, PlotSeries)):
      series = (series,)
    series = tuple(s if isinstance(s, PlotSeries) else PlotSeries(s) for s in series)
    if not series:
      raise ValueError(f"PlotPanel {self.title!r}: needs at least one series.")
    object.__setattr__(self, "series", series)
    if not 0.0 <= self.smoothing < 1.0:
      raise ValueError(f"PlotPanel {self.title!r}: smoothing={self.smoothing!r} "
                       "must be in [0, 1).")
    for name in ("ylim", "xlim"):
      lim = getattr(self, name)
      if lim is not None and len(lim) != 2:
        raise ValueError(f"PlotPanel {self.title!r}: {name}={lim!r} must be "
                         "(low, high).")


def smooth_curve(values: Sequence[float], smoothing: float) -> np.ndarray:
  """The exponential moving average drawn over a per-step series.

  TensorBoard's smoothing: ``m[i] = smoothing * m[i - 1] + (1 - smoothing) *
  values[i]`` from ``m[-1] = 0``, debiased as ``m[i] / (1 - smoothing ** (i +
  1))``, so each point is the average of the values so far weighted by
  ``smoothing ** age`` (the first value weighs no more than any other). Its
  time constant is about ``1 / (1 - smoothing)`` points.

  Args:
    values: the finite values, in step order.
    smoothing: the weight of the past, in ``[0, 1)`` (0: the values).

  Returns:
    float64 ``[len(values)]``.

  Raises:
    ValueError: ``smoothing`` outside ``[0, 1)``.
  """
  if not 0.0 <= smoothing < 1.0:
    raise ValueError(f"smoothing={smoothing!r} must be in [0, 1).")
  x = np.asarray(values, np.float64).reshape(-1)
  out = np.empty_like(x)
  acc, weight = 0.0, 0.0
  for i, v in enumerate(x):
    acc = smoothing * acc + (1.0 - smoothing) * v
    weight = smoothing * weight + (1.0 - smoothing)  # = 1 - smoothing ** (i + 1)
    out[i] = acc / weight
  return out


def _series_points(records, series: PlotSeries, min_step):
  """``(keys present, steps, values)`` of ``series``: finite points, by step.

  A key is present when a record (from ``min_step`` on) has it, finite or not.
  """
  pts, present = [], []
  for k in series.keys:
    got = [(r["step"], r[k]) for r in records
           if k in r and (min_step is None or r["step"] >= min_step)]
    if got:
      present.append(k)
      pts.extend(p for p in got if math.isfinite(p[1]))
  pts.sort(key=lambda p: p[0])  # stable: keys in their order within a step
  steps = np.asarray([p[0] for p in pts], np.float64)
  return tuple(present), steps, np.asarray([p[1] for p in pts], np.float64)


def _layout(records, panels):
  """The panels with a key present, narrowed to those, with each line's points.

  Returns ``[(panel, [(series, steps, values), ...]), ...]``: each panel's
  series narrowed to those present (their ``keys`` to the keys present) and
  its ``baseline`` resolved to a float or None.
  """
  out = []
  for panel in panels:
    lines = []
    for s in panel.series:
      present, steps, values = _series_points(records, s, panel.min_step)
      if present:
        lines.append((dataclasses.replace(s, keys=present), steps, values))
    if not lines:
      continue
    base = panel.baseline
    if isinstance(base, str):
      found = [r[base] for r in records if base in r and math.isfinite(r[base])]
      base = float(found[-1]) if found else None
    elif base is not None:
      base = float(base)
    out.append((dataclasses.replace(panel, series=tuple(s for s, _, _ in lines),
                                    baseline=base), lines))
  return out


def _draw_panel(ax, panel, lines):
  """Draws one resolved panel (see :func:`_layout`) onto ``ax``."""
  colors = [f"C{i % 10}" for i in range(len(lines))]
  several = len(lines) > 1
  smoothed = panel.smoothing > 0
  ema_drawn = False
  for (s, steps, values), color in zip(lines, colors):
    if not steps.size:
      continue
    label = s.label if s.label is not None else (s.keys[0] if several else None)
    if s.sparse:  # few points: their last value is worth reading off
      ax.plot(steps, values, "o-", color=color, linewidth=1.3, markersize=3.5,
              label=f"{label} (last {values[-1]:.3g})" if label else None)
    elif smoothed:
      ax.plot(steps, values, color=color, linewidth=0.8, alpha=0.25)
      ema = f"EMA {panel.smoothing:g}"
      ax.plot(steps, smooth_curve(values, panel.smoothing), color=color,
              linewidth=1.6, label=f"{label}, {ema}" if label else ema)
      ema_drawn = True
    else:
      ax.plot(steps, values, color=color, linewidth=1.2, label=label)
  if not any(steps.size for _, steps, _ in lines):
    ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center",
            va="center", fontsize=9, color="0.4")
  _decorate(ax, panel, panel.baseline)
  if panel.ylim is not None:
    lo, hi = panel.ylim
    if lo is not None and hi is not None:  # a margin, so points at the ends show
      pad = 0.03 * (hi - lo)
      lo, hi = lo - pad, hi + pad
    ax.set_ylim(lo, hi)
  if panel.xlim is not None:
    lo, hi = panel.xlim
    if lo is not None and hi is not None:  # a margin, as for ylim
      pad = 0.02 * (hi - lo)
      lo, hi = lo - pad, hi + pad
    ax.set_xlim(lo, hi)
  if ax.get_legend_handles_labels()[0] and (  # more than one line
      several or ema_drawn or panel.baseline is not None):
    ax.legend(fontsize=7, loc="best", framealpha=0.8)


def _decorate(ax, panel, baseline):
  """A panel's dashed ``baseline`` (a float, or None: none), title, axis labels and grid."""
  if baseline is not None:
    ax.axhline(baseline, color="0.3", linestyle="--", linewidth=1.0,
               label=f"{panel.baseline_label} {baseline:.3g}")
  ax.set_title(panel.title, fontsize=10)
  ax.set_xlabel("step", fontsize=8)
  ax.tick_params(labelsize=7)
  ax.grid(alpha=0.3)


# A panel's cell and the gaps around its axes, in inches.
_CELL_W, _CELL_H = 4.2, 2.9
_LEFT, _RIGHT, _TOP, _BOTTOM = 0.5, 0.15, 0.3, 0.45
_GAP_W, _GAP_H = 0.55, 0.75
_TITLE_H = 0.4


def _figsize(nrows, ncols, title):
  return (_CELL_W * ncols, _CELL_H * nrows + (_TITLE_H if title else 0.0))


def _margins(nrows, ncols, title):
  """``subplots_adjust`` fractions for the fixed margins and gaps in inches."""
  w, h = _figsize(nrows, ncols, title)
  top = _TOP + (_TITLE_H if title else 0.0)
  axes_w = (w - _LEFT - _RIGHT - (ncols - 1) * _GAP_W) / ncols
  axes_h = (h - top - _BOTTOM - (nrows - 1) * _GAP_H) / nrows
  return {"left": _LEFT / w, "right": 1.0 - _RIGHT / w, "bottom": _BOTTOM / h,
          "top": 1.0 - top / h, "wspace": _GAP_W / axes_w, "hspace": _GAP_H / axes_h}


def plot_metrics(records: Sequence[Mapping[str, Any]], path: str,
                 panels: Sequence[PlotPanel], *, ncols: int = 3,
                 title: str | None = None) -> list[PlotPanel]:
  """Draws curves of metrics records into an image file, one panel per spec.

  Uses matplotlib's object API with the Agg canvas (no pyplot, no global
  backend change, no display needed). A panel none of whose keys is in the
  records is left out, so the same specs serve runs that do not write every
  metric; the others keep their order, ``ncols`` a row. Non-finite values
  are left out of the lines (a panel with none finite says so).

  Args:
    records: ``{"step": int, key: float, ...}`` dicts (:func:`read_metrics`).
    path: output image path (PNG; the format follows the extension).
    panels: the :class:`PlotPanel` specs, in order.
    ncols: panels per row.
    title: the figure's title, or None.

  Returns:
    the panels drawn, each with its ``series`` narrowed to those present
    (their ``keys`` to the keys present) and its ``baseline`` resolved to a
    float (None: its key has no finite value).

  Raises:
    ImportError: matplotlib is not installed.
    ValueError: no panel's key is in the records.
  """
  return _draw_figure(_layout(records, panels), _draw_panel, path, ncols=ncols, title=title,
                      source="records")


def _draw_figure(layout, draw_panel, path: str, *, ncols: int, title: str | None,
                 source: str) -> list[PlotPanel]:
  """Draws each ``(panel, lines)`` of ``layout`` with ``draw_panel(ax, panel, lines)``,
  ``ncols`` a row, into ``path``; returns the panels.

  Raises:
    ImportError: matplotlib is not installed.
    ValueError: an empty ``layout`` (no panel's key is in the ``source``).
  """
  if not layout:
    raise ValueError(f"none of the panels' keys is in the {source}.")
  try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("plotting metrics needs matplotlib: `pip install "
                      "matplotlib`.") from e
  ncols = max(1, min(ncols, len(layout)))
  nrows = math.ceil(len(layout) / ncols)
  fig = Figure(figsize=_figsize(nrows, ncols, title))
  FigureCanvasAgg(fig)
  # Fixed margins, in inches (a layout engine measuring every text took
  # half the drawing time).
  fig.subplots_adjust(**_margins(nrows, ncols, title))
  for i, (panel, lines) in enumerate(layout):
    draw_panel(fig.add_subplot(nrows, ncols, i + 1), panel, lines)
  if title:
    fig.suptitle(title, fontsize=12, y=1.0 - 0.12 / fig.get_figheight(), va="top")
  with files.atomic_path(path) as tmp:
    fig.savefig(tmp, dpi=100, format=os.path.splitext(path)[1][1:] or "png")
  return [panel for panel, _ in layout]


def _seeds_by_steps(values) -> np.ndarray:
  """``values`` as float64 ``[seeds, steps]``; ValueError naming the shape if not 2-D."""
  x = np.asarray(values, np.float64)
  if x.ndim != 2:
    raise ValueError(f"values: shape {x.shape}, expected [seeds, steps]")
  return x


def seed_band(values, smoothing: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Mean, lowest and highest of several seeds' smoothed curves, per step.

  Each seed's finite values are smoothed (:func:`smooth_curve`, so a step
  whose value is NaN, e.g. the entropy of a step that trained nothing, is a
  gap the EMA skips) and then linearly interpolated back onto every step,
  so the seeds line up.

  Args:
    values: float ``[S, T]``: S seeds' values at steps ``1 .. T`` (NaN: not
      measured).
    smoothing: EMA weight of the past, in ``[0, 1)``.

  Returns:
    float64 ``(mean, low, high)``, each ``[T]``; NaN at every step where a
    seed has no finite value at all.

  Raises:
    ValueError: ``values`` not 2-D, or a bad ``smoothing``.
  """
  x = _seeds_by_steps(values)
  steps = np.arange(1, x.shape[1] + 1, dtype=np.float64)
  rows = []
  for row in x:
    ok = np.isfinite(row)
    rows.append(np.interp(steps, steps[ok], smooth_curve(row[ok], smoothing))
                if ok.any() else np.full_like(steps, np.nan))
  rows = np.stack(rows)
  return rows.mean(0), rows.min(0), rows.max(0)


def plot_seed_curves(curves: Mapping[str, Mapping[str, Any]], path: str,
                     panels: Sequence[PlotPanel], *, ncols: int = 2,
                     title: str | None = None, x_key: str | None = None,
                     x_label: str | None = None) -> list[PlotPanel]:
  """Draws several labelled runs over seeds: one line per label, seeds shaded.

  For each panel (its first series' keys are the metric names looked up, the
  first one a label has) and each label (e.g. an algorithm): the mean over
  seeds of the per-seed EMA curves as a line, and the band between the
  lowest and highest seed (:func:`seed_band`). A panel no label has a key of
  is left out. Used for RAGEN's comparison (StarPO-S vs PPO vs GRPO per
  environment, Wang et al. 2025, arXiv:2504.20073, Fig. 3).

  Args:
    curves: ``{label: {metric: float [S, T] (seeds x steps)}}``.
    path: output image path (PNG; the format follows the extension).
    panels: :class:`PlotPanel` specs (title, ylim, xlim, smoothing,
      baseline as a number).
    ncols: panels per row.
    title: the figure's title, or None.
    x_key: None (the x axis is the step), or a per-step metric every label
      has, e.g. ``"rollout/sampled_tokens"``: the x axis is then its running
      total (the mean over seeds of each seed's running sum), so that runs
      that cost differently per step compare at equal budgets (Tree-GRPO's
      equal-token comparison, arXiv:2509.21240).
    x_label: the x axis's label (default ``"step"``, or ``"<x_key>, total"``).

  Returns:
    the panels drawn.

  Raises:
    ImportError: matplotlib is not installed.
    ValueError: no panel's key is in ``curves``, a curve that is not 2-D, or
      a label without ``x_key``.
  """
  layout = _seed_layout(curves, panels, x_key)
  x_label = x_label or ("step" if x_key is None else f"{x_key}, total")
  return _draw_figure(layout, functools.partial(_draw_seed_panel, x_label=x_label), path,
                      ncols=ncols, title=title, source="curves")


def _cumulative_x(values) -> np.ndarray:
  """The seeds' mean running total of a per-step metric: an x axis per step.

  Args:
    values: float ``[S, T]``: S seeds' values at steps ``1 .. T``, e.g. each
      step's sampled tokens (non-finite values count as 0).

  Returns:
    float64 ``[T]``: at step t, the mean over seeds of the sum of steps 1..t.

  Raises:
    ValueError: ``values`` not 2-D.
  """
  x = _seeds_by_steps(values)
  return np.cumsum(np.where(np.isfinite(x), x, 0.0), axis=1).mean(0)


def _seed_layout(curves, panels, x_key=None):
  """``[(panel, [(label, x, (mean, low, high)), ...]), ...]`` of the panels some label has.

  ``x`` [T] is the steps ``1 .. T``, or the running total of ``x_key``.
  """
  xs = {}  # label -> its x axis, once for every panel (None: the steps)
  for label, metrics in curves.items():
    if x_key is not None and x_key not in metrics:
      raise ValueError(f"x_key={x_key!r}: label {label!r} has no such curve "
                       f"(it has {sorted(metrics)})")
    xs[label] = None if x_key is None else _cumulative_x(metrics[x_key])
  out = []
  for panel in panels:
    lines = []
    for label, metrics in curves.items():
      key = next((k for k in panel.series[0].keys if k in metrics), None)
      if key is not None:
        band = seed_band(metrics[key], panel.smoothing)
        x = xs[label] if xs[label] is not None else np.arange(
            1, band[0].size + 1, dtype=np.float64)
        lines.append((label, x, band))
    if lines:
      out.append((panel, lines))
  return out


def _draw_seed_panel(ax, panel, lines, x_label="step"):
  """Draws one panel of :func:`plot_seed_curves` onto ``ax``."""
  for i, (label, x, (mean, low, high)) in enumerate(lines):
    ax.fill_between(x, low, high, color=f"C{i % 10}", alpha=0.2, linewidth=0)
    ax.plot(x, mean, color=f"C{i % 10}", linewidth=1.6, label=label)
  _decorate(ax, panel, panel.baseline if isinstance(panel.baseline, (int, float)) else None)
  ax.set_xlabel(x_label, fontsize=8)
  if panel.ylim is not None:
    ax.set_ylim(*panel.ylim)
  if panel.xlim is not None:
    ax.set_xlim(*panel.xlim)
  ax.legend(fontsize=7, loc="best", framealpha=0.8)


class MetricsWriter:
  """Writes one record per step to ``<workdir>/metrics.jsonl`` and TensorBoard.

  Each :meth:`write` appends ``{"step": step, key: float, ...}`` as one JSON
  line (flushed at once, so a crash loses at most the line being written) and,
  with TensorBoard on, one scalar per key to event files under
  ``<workdir>/tensorboard`` (tensorboardX). Pass only what was measured:
  a non-finite value is written (JSON ``NaN``/``Infinity``) so that a
  diverging loss shows. On resume pass the restored step:
  records with a larger step (written after that checkpoint) are dropped from
  the file (rewritten atomically) and TensorBoard purges them too, so no step
  appears twice.

  Args:
    workdir: the run directory (created if missing).
    resume_step: the restored checkpoint's step, or None for a fresh run
      (an existing file is appended to).
    tensorboard: True (require tensorboardX), False (JSON lines only) or None
      (use tensorboardX if it is installed).

  Raises:
    ImportError: ``tensorboard=True`` without tensorboardX (with the fix).
  """

  def __init__(self, workdir: str, *, resume_step: int | None = None,
               tensorboard: bool | None = None):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, METRICS_FILE)
    if os.path.exists(self.path):
      # Rewritten from what read_metrics reads: a last record cut short by a
      # crash is dropped, one that lost only its newline is ended.
      kept = [r for r in read_metrics(self.path)
              if resume_step is None or int(r.get("step", -1)) <= resume_step]
      files.write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
    self._file = open(self.path, "a")
    self._tb = None
    if tensorboard or tensorboard is None:
      try:
        tbx = _import_tensorboardx()
      except ImportError:
        if tensorboard:
          self._file.close()
          raise
        tbx = None
      if tbx is not None:
        purge = None if resume_step is None else resume_step + 1
        self._tb = tbx.SummaryWriter(
            logdir=os.path.join(workdir, TENSORBOARD_DIR), purge_step=purge)

  @property
  def tensorboard(self) -> bool:
    """Whether TensorBoard event files are being written."""
    return self._tb is not None

  def write(self, step: int, metrics: Mapping[str, Any]) -> None:
    """Appends the metrics of ``step``.

    Args:
      step: the step (Python int).
      metrics: ``{name: scalar}`` (Python, numpy or jax scalars; fetched
        from the device here). Non-finite values are written as JSON
        ``NaN``/``Infinity`` (Python's json reads them back); leave out
        what the step did not measure.

    Raises:
      ValueError: a non-scalar value or a key named ``step``.
    """
    values = jax.device_get(dict(metrics))
    record = {"step": int(step)}
    for k, v in values.items():
      if k == "step":
        raise ValueError("metrics must not contain the key 'step'.")
      arr = np.asarray(v)
      if arr.size != 1:
        raise ValueError(f"metric {k!r} must be a scalar; got shape "
                         f"{arr.shape}.")
      record[k] = float(arr.reshape(()))
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in record.items():
        if k != "step":
          self._tb.add_scalar(k, v, int(step))

  def flush(self) -> None:
    """Flushes the JSON-lines file and the event files (no-op once closed)."""
    if self._file.closed:
      return
    self._file.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    """Flushes and closes every file (idempotent; :meth:`plot` still works)."""
    if self._file.closed:
      return
    self.flush()
    self._file.close()
    if self._tb is not None:
      self._tb.close()

  def plot(self, path: str, keys: Sequence[str] | None = None, *,
           panels: Sequence[PlotPanel] | None = None, ncols: int = 3,
           title: str | None = None) -> list[str]:
    """Draws this file's curves against the step into an image file.

    Either ``keys`` (one plain panel per key, titled with it) or ``panels``
    (:class:`PlotPanel` specs: titles, several lines, EMA smoothing,
    baselines; see :func:`plot_metrics`).

    Args:
      path: output image path (PNG; the format follows the extension).
      keys: metric names (default, without ``panels``: every key in the file,
        sorted).
      panels: panel specs instead of ``keys``.
      ncols: panels per row.
      title: the figure's title, or None.

    Returns:
      the keys drawn (those present in the file), in panel order.

    Raises:
      ImportError: matplotlib is not installed.
      ValueError: both ``keys`` and ``panels``, or no requested key is in
        the file.
    """
    if keys is not None and panels is not None:
      raise ValueError("MetricsWriter.plot: pass keys or panels, not both.")
    self.flush()
    records = read_metrics(self.path)
    present = {k for r in records for k in r if k != "step"}
    if panels is None:
      keys = sorted(present) if keys is None else [k for k in keys if k in present]
      panels = [PlotPanel(k, k, smoothing=0.0) for k in keys]
    if not any(k in present for p in panels for s in p.series for k in s.keys):
      raise ValueError(f"none of the requested keys is in {self.path}.")
    drawn = plot_metrics(records, path, panels, ncols=ncols, title=title)
    return list(dict.fromkeys(k for p in drawn for s in p.series for k in s.keys))
