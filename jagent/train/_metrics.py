"""Per-step metrics: a JSON-lines file, TensorBoard event files and PNG plots."""

from __future__ import annotations

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


class MetricsWriter:
  """Writes one record per step to ``<workdir>/metrics.jsonl`` and TensorBoard.

  Each :meth:`write` appends ``{"step": step, key: float, ...}`` as one JSON
  line (flushed at once, so a crash loses at most the line being written) and,
  with TensorBoard on, one scalar per key to event files under
  ``<workdir>/tensorboard`` (tensorboardX). On resume pass the restored step:
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
        ``NaN``/``Infinity`` (Python's json reads them back).

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
           ncols: int = 3) -> list[str]:
    """Draws the curves of ``keys`` against the step into a PNG file.

    Uses matplotlib's object API with the Agg canvas (no pyplot, no global
    backend change, no display needed). One panel per key; non-finite
    points are left out.

    Args:
      path: output PNG path.
      keys: metric names (default: every key in the file, sorted).
      ncols: panels per row.

    Returns:
      the keys drawn (those present in the file).

    Raises:
      ImportError: matplotlib is not installed.
      ValueError: no requested key is in the file.
    """
    try:
      from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
      from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("MetricsWriter.plot needs matplotlib: `pip install "
                        "matplotlib`.") from e
    self.flush()
    records = read_metrics(self.path)
    present = sorted({k for r in records for k in r if k != "step"})
    keys = present if keys is None else [k for k in keys if k in present]
    if not keys:
      raise ValueError(f"none of the requested keys is in {self.path}.")
    ncols = max(1, min(ncols, len(keys)))
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(4 * ncols, 2.6 * nrows))
    FigureCanvasAgg(fig)
    for i, k in enumerate(keys):
      ax = fig.add_subplot(nrows, ncols, i + 1)
      pts = [(r["step"], r[k]) for r in records
             if k in r and math.isfinite(r[k])]
      if pts:
        steps, vals = zip(*pts)
        ax.plot(steps, vals, linewidth=1.2)
      ax.set_title(k, fontsize=9)
      ax.set_xlabel("step", fontsize=8)
      ax.tick_params(labelsize=7)
      ax.grid(alpha=0.3)
    fig.tight_layout()
    with files.atomic_path(path) as tmp:  # the format follows path's extension
      fig.savefig(tmp, dpi=100, format=os.path.splitext(path)[1][1:] or "png")
    return list(keys)
