"""The objective's hyperparameters (``config.algorithm_kwargs``) and its Objective.

:func:`algorithm_kwargs` writes every keyword of a registered objective
(``jagent.transforms.signature``) with its default into the config, so each
is a flag; :func:`advantage_hyperparameters` does so for every named
advantage estimator. :func:`objective_kwargs` reads the block back, naming
a misspelt key or one of another estimator, and :func:`objective` builds
the ``jagent.transforms.Objective``, naming the key its own checks blame.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict

from experiments import fields
from jagent import transforms

# Objective arguments the run sets itself, kept out of config.algorithm_kwargs:
# the run's one filter replaces the objective's (train.iteration_filter).
_RUN_KWARGS = {"filter_config": "config.rl.filter_mode, config.rl.filter_value and "
                                "config.rl.include_zero"}


def _keyword_defaults(signature: inspect.Signature) -> dict[str, Any]:
  """The config values of the keywords of ``signature`` that have a default.

  A plain default (bool, int, float, str) as it is; a default of None as a
  typed ``ml_collections`` placeholder (a flag can set it; null in
  config.json), or ``{}`` for a dict (of keyword arguments: a flag sets it
  as a dict literal). Keywords no flag could set (e.g. a Transform) and
  :data:`_RUN_KWARGS` are left out.
  """
  out = {}
  for name, p in signature.parameters.items():
    if p.default is inspect.Parameter.empty or name in _RUN_KWARGS:
      continue
    if p.default is None:
      types = [t for t in typing.get_args(p.annotation) if t is not type(None)]
      kind = (typing.get_origin(types[0]) or types[0]) if len(types) == 1 else None
      if kind is dict:
        out[name] = {}
      elif kind in (bool, int, float, str):
        out[name] = config_dict.placeholder(kind)
    elif isinstance(p.default, (bool, int, float, str)):
      out[name] = p.default
  return out


def _hyperparameters(algorithm: str) -> dict[str, Any]:
  """:func:`_keyword_defaults` of the objective ``algorithm`` (ConfigError if unknown)."""
  if algorithm not in transforms.registered():
    raise fields.bad("algorithm", algorithm, f"unknown; known: {list(transforms.registered())}")
  return _keyword_defaults(transforms.signature(algorithm))


def algorithm_kwargs(algorithm: str, **values) -> ml_collections.ConfigDict:
  """``config.algorithm_kwargs``: every hyperparameter of the objective, ``values`` set.

  The keywords of ``jagent.transforms.signature(algorithm)`` with their
  defaults (see :func:`_keyword_defaults`), so that each shows in the
  written config.json and is a flag
  (``--config.algorithm_kwargs.entropy_coef=0.01``). StarPO's
  ``advantage_kwargs`` holds the hyperparameters of every named advantage
  estimator with their defaults (:func:`advantage_hyperparameters`; one
  flat dict, shared names have one default), so that
  ``--config.algorithm_kwargs.advantage=gigpo`` alone switches the
  estimator and each of its hyperparameters is a flag
  (``--config.algorithm_kwargs.advantage_kwargs.step_gamma=0.9``); the run
  passes the chosen estimator its own (:func:`objective_kwargs`). A dict
  literal (``--config.algorithm_kwargs.advantage_kwargs="{'step_gamma':
  0.9}"``) replaces the whole dict: the keys it leaves out take their
  defaults. The uncertainty filter is the run's (``config.rl.filter_*``),
  not here.

  Args:
    algorithm: a registered objective name (``jagent.transforms.registered()``).
    **values: hyperparameters that differ from the objective's defaults
      (``advantage_kwargs``: a dict updating the estimator's defaults).

  Returns:
    a ConfigDict of plain values and typed placeholders (defaults of None).

  Raises:
    ConfigError: an unknown algorithm, or a key of ``values`` that is not
      one of its hyperparameters.
  """
  out = _hyperparameters(algorithm)
  if "advantage_kwargs" in out:
    out["advantage_kwargs"] = advantage_hyperparameters()
  for k, v in values.items():
    if k not in out:
      raise fields.bad(f"algorithm_kwargs.{k}", v, _not_a_hyperparameter(algorithm, k, out))
    if k == "advantage_kwargs":
      for name, x in (v or {}).items():
        if name not in out[k]:
          raise fields.bad(f"algorithm_kwargs.advantage_kwargs.{name}", x,
                           f"not a hyperparameter of any named advantage; known: {sorted(out[k])}")
        out[k][name] = x
    elif v is not None or not isinstance(out[k], config_dict.FieldReference):
      out[k] = v
  return ml_collections.ConfigDict(out)


def advantage_hyperparameters() -> dict[str, Any]:
  """Every named advantage estimator's hyperparameters with their defaults, one dict.

  The keywords of each of ``jagent.transforms.ADVANTAGE_ESTIMATORS`` (see
  :func:`_keyword_defaults`), e.g. GAE's ``gamma``/``lambda_``/``whiten``,
  GiGPO's ``step_gamma``/``step_weight``. A name two estimators share has
  one default in both (``eps`` 1e-6, ``normalize_std`` True, ...).

  Raises:
    ValueError: two estimators give a shared name different defaults (the
      flat dict could not hold both).
  """
  out, owner = {}, {}
  for advantage, fn in transforms.ADVANTAGE_ESTIMATORS.items():
    for k, v in _keyword_defaults(inspect.signature(fn)).items():
      if k in out and out[k] != v:
        raise ValueError(f"advantage hyperparameter {k!r}: default {out[k]!r} in "
                         f"{owner[k]!r} but {v!r} in {advantage!r}")
      out.setdefault(k, v)
      owner.setdefault(k, advantage)
  return out


def _not_a_hyperparameter(algorithm: str, key: str, known) -> str:
  if key in _RUN_KWARGS:
    return f"the run sets it: {_RUN_KWARGS[key]}"
  near = fields.closest(key, list(known))
  return (f"not a hyperparameter of the objective {algorithm!r}"
          + (f" (closest: {', '.join(near)})" if near else "")
          + f"; its hyperparameters: {sorted(known)}")


def objective_kwargs(config) -> dict[str, Any]:
  """``config.algorithm_kwargs`` as ``jagent.transforms.make``'s keyword arguments.

  Configs written before every hyperparameter was listed (a subset of the
  keys) are valid. ``advantage_kwargs`` is narrowed to the chosen
  estimator's own hyperparameters (:func:`algorithm_kwargs`).

  Raises:
    ConfigError: a key that is not a hyperparameter of ``config.algorithm``
      (naming it, the closest and the known ones), an unknown
      ``advantage``, or an ``advantage_kwargs`` key its advantage does not
      take set to other than its default (one set for another estimator).
  """
  known = _hyperparameters(config.algorithm)
  kwargs = config.algorithm_kwargs.to_dict()
  for k, v in kwargs.items():
    if k not in known:
      raise fields.bad(f"algorithm_kwargs.{k}", v,
                       _not_a_hyperparameter(config.algorithm, k, known)
                       + " (a config file fills algorithm_kwargs for the algorithm of its "
                       "argument: choose it there, --config=<file>:<env id>,<algorithm>)")
  advantage = kwargs.get("advantage", known.get("advantage"))
  if "advantage" in known and isinstance(advantage, str):
    if advantage not in transforms.ADVANTAGE_ESTIMATORS:
      raise fields.bad("algorithm_kwargs.advantage", advantage,
                       f"unknown; known: {sorted(transforms.ADVANTAGE_ESTIMATORS)}")
    own = inspect.signature(transforms.ADVANTAGE_ESTIMATORS[advantage]).parameters
    defaults = advantage_hyperparameters()
    chosen = {}
    for k, v in (kwargs.get("advantage_kwargs") or {}).items():
      if k in own:
        chosen[k] = v
      elif k not in defaults or v != defaults[k]:  # set for another estimator
        raise fields.bad(f"algorithm_kwargs.advantage_kwargs.{k}", v,
                         f"not a hyperparameter of the advantage {advantage!r}; its "
                         f"hyperparameters: {sorted(own)}")
    if "advantage_kwargs" in kwargs:
      kwargs["advantage_kwargs"] = chosen
  return kwargs


def objective(config) -> transforms.Objective:
  """``transforms.make(config.algorithm, **objective_kwargs(config))`` (no compile).

  Raises:
    ConfigError: from :func:`objective_kwargs`, or the objective's own checks
      (e.g. ``entropy_coef=-1``) naming the ``config.algorithm_kwargs`` field
      to blame: each set key whose default instead makes the objective build.
  """
  kwargs = objective_kwargs(config)
  try:
    return transforms.make(config.algorithm, **kwargs)
  except ValueError as e:
    params = transforms.signature(config.algorithm).parameters

    def builds(k):
      try:
        transforms.make(config.algorithm, **{**kwargs, k: params[k].default})
        return True
      except (TypeError, ValueError):
        return False

    blamed = [k for k, v in kwargs.items() if v != params[k].default and builds(k)]
    if not blamed:
      raise fields.ConfigError(f"config.algorithm_kwargs of {config.algorithm!r}: {e}") from e
    raise fields.ConfigError(", ".join(f"config.algorithm_kwargs.{k}={kwargs[k]!r}" for k in blamed)
                             + f": {e}") from e
