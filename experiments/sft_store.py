"""A sweep's SFT parameters on disk, so later sweeps start RL from the same SFT.

SFT reads no RL or algorithm field. Sweeps of several algorithms on one game
(:mod:`experiments.compare`) can therefore start RL from the same parameters
after SFT, even in separate processes, or after an interrupted grid. The
parameters go to ``<directory>/checkpoints/0/``
(:class:`jagent.train.Checkpointer`; LoRA bases are left out and reloaded
from the runs' configs). The metadata records each run's :func:`sft_fields`.
A sweep reads them back only when its runs' fields are equal to the
recorded ones, and otherwise refuses, naming the first field that differs.
"""

from __future__ import annotations

import json
import os

from experiments import fields
from jagent import train

# Config fields that SFT parameters do not depend on: the RL stage and its
# objective, the tree of an RL rollout, evaluation and checkpoint cadence.
SFT_FREE_FIELDS = ("algorithm", "algorithm_kwargs", "rl", "rollout.tree", "eval",
                   "checkpoint", "diagnostics")


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    name = f"{prefix}{k}"
    if isinstance(v, dict) and v:
      out.update(_flatten(v, name + "."))
    else:
      out[name] = v
  return out


def sft_fields(config) -> dict:
  """The fields that decide a run's SFT parameters, as ``{"sft.steps": 200, ...}``.

  Every leaf field of ``config`` (an ``ml_collections.ConfigDict``) by its
  dotted name, except those under :data:`SFT_FREE_FIELDS`. Values are as
  they read back from JSON (tuples become lists), so that a config and the
  recorded fields compare equal.
  """
  flat = _flatten(json.loads(config.to_json_best_effort()))
  return {k: v for k, v in flat.items()
          if not any(k == f or k.startswith(f + ".") for f in SFT_FREE_FIELDS)}


def _first_difference(saved: list[dict], now: list[dict]) -> str | None:
  if len(saved) != len(now):
    return f"{len(saved)} runs recorded, {len(now)} runs now"
  for i, (a, b) in enumerate(zip(saved, now)):
    for k in sorted(set(a) | set(b)):
      if a.get(k, "<absent>") != b.get(k, "<absent>"):
        return (f"run {i}: {k} is {b.get(k, '<absent>')!r}, the recorded SFT used "
                f"{a.get(k, '<absent>')!r}")
  return None


def load(directory: str, configs: list, target):
  """The SFT parameters saved in ``directory``, or None when none are there.

  Args:
    directory: where :func:`save` wrote them.
    configs: each run's config, in run order.
    target: a function of no arguments that returns a pytree of the
      parameters' structure with a leading run axis (concrete or from
      ``jax.eval_shape``), called only when the recorded fields match; LoRA
      bases are taken from it.

  Raises:
    ConfigError: the recorded runs' :func:`sft_fields` differ from those of
      ``configs`` (naming the run, the field and both values), before
      anything is read or compiled.
    CheckpointError: the saved parameters do not read back.
  """
  ckpt = train.Checkpointer(directory, keep=1, async_save=False)
  try:
    if ckpt.latest_step() is None:
      return None
    why = _first_difference(ckpt.restore_metadata(0)["runs"],
                            [sft_fields(c) for c in configs])
    if why:
      raise fields.ConfigError(
          f"the SFT parameters in {directory} were trained for other runs ({why}); "
          "delete that directory to run SFT again, or choose another one")
    try:
      params, _ = ckpt.restore(target(), 0)
    except Exception as e:  # pylint: disable=broad-except
      # Which error a damaged file raises depends on the file and the damage.
      raise train.CheckpointError(f"the SFT parameters in {directory} do not read back "
                                  f"({type(e).__name__}: {e}); delete that directory to "
                                  "run SFT again") from e
    return params
  finally:
    ckpt.close()


def save(directory: str, configs: list, params) -> None:
  """Writes ``params`` (leading run axis) and each run's :func:`sft_fields`.

  Raises:
    ValueError: ``directory`` already holds SFT parameters.
  """
  os.makedirs(directory, exist_ok=True)
  ckpt = train.Checkpointer(directory, keep=1, async_save=False)
  try:
    ckpt.save(0, params, {"runs": [sft_fields(c) for c in configs]})
  finally:
    ckpt.close()
