"""What experiments/train.py and experiments/eval.py share: one Experiment object.

An :class:`Experiment` validates a config (every bad field named before
anything compiles), builds the game, tokenizer, model, rollouts and
objective, and runs the stages: SFT, RL steps, evaluation, checkpoints.

Every run lives on a device mesh: ``config.mesh`` (``jagent.sharding.make_mesh``,
e.g. ``"data:8"`` or ``"data:2,fsdp:2,tensor:2"``; ``""``: a one-device mesh
of the default device, whose results equal an unsharded run's bit for bit).
The TrainStates live on ``jagent.sharding.train_state_shardings``, the SFT
step, the RL iteration and the evaluation run jitted with explicit in/out
shardings (rows over ``data x fsdp``), and checkpoints restore onto those
shardings. The mesh may span processes (``jax.distributed.initialize`` first,
see ``experiments/train.py``): every process then runs the same program on
the same config, and only process 0 writes files other than checkpoints
(:attr:`Experiment.is_primary`).
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import inspect
import json
import math
import os
import time
import typing
from typing import Any, Callable, Sequence

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict
import numpy as np

import envs_jax
import jagent
from jagent import losses
from jagent import models
from jagent import rollout
from jagent import sharding
from jagent import tokenizers
from jagent import train
from jagent import transforms

from experiments import spec

# Where experiments.train writes a run and experiments.eval reads it by default.
DEFAULT_WORKDIR = os.path.join(os.path.expanduser("~"), "jagent_runs", "default")


def setup_compilation_cache(path: str | None = None) -> None:
  """Persists XLA compilations across runs (``$JAX_COMPILATION_CACHE_DIR`` wins)."""
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or path or os.path.join(
      os.path.expanduser("~"), ".cache", "jagent", "jax")
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def quiet_logs() -> None:
  """Sets absl's verbosity to WARNING unless ``-v``/``--verbosity`` was passed.

  absl's ``app.run`` raises the verbosity from WARNING to INFO when the flag
  is not given; orbax's checkpoint messages (absl logging) and jax's backend
  probes (python logging, e.g. "Unable to initialize backend 'tpu'") then
  put ~450 INFO lines a run on stderr, between the progress bars. absl's
  handler sits on the root logger, whose level this sets, so both are
  quieted; ``--verbosity=0`` (or ``-v 0``) brings them back.

  Runs once flags are parsed (``app.call_after_init``, registered when this
  module is imported): every ``experiments`` entry point (train, eval,
  sweep, compare) imports it and runs under ``app.run``.
  """
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


app.call_after_init(quiet_logs)

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


# Jitted programs shared by the Experiments of one process whose configs
# differ only where the program does not look (e.g. the seed: keys are
# arguments), so that many runs of one config (experiments.sweep, its tests)
# trace and compile each program once. Least recently used dropped past 16.
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_MAX_PROGRAMS = 16
# The config fields a rollout program depends on.
ROLLOUT_FIELDS = ("env", "tokenizer", "model", "model_dir", "lora", "prompt", "rollout",
                  "eval.num_groups")
# The config fields an SFT step program depends on (LoRA: the params' structure).
SFT_FIELDS = ("model", "model_dir", "lora", "sft")


def shared_program(key: tuple, build: Callable[[], Any]) -> Any:
  """The program cached under ``key`` (hashable), built by ``build()`` on a miss.

  Holds the 16 most recently used programs of this process; ``key`` must
  name everything the program closes over (e.g. :meth:`Experiment.signature`).
  """
  if key not in _PROGRAMS:
    _PROGRAMS[key] = build()
    while len(_PROGRAMS) > _MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  _PROGRAMS.move_to_end(key)
  return _PROGRAMS[key]


def _fields_json(config, fields) -> str:
  """Sorted JSON of ``config``'s dotted ``fields``."""
  out = {}
  for f in fields:
    node = config
    for part in f.split("."):
      node = node[part]
    out[f] = node.to_dict() if hasattr(node, "to_dict") else node
  return json.dumps(out, sort_keys=True, default=repr)


class ConfigError(ValueError):
  """A bad config: the message names the config field (``config.rl.steps=-5: ...``).

  The programs (``experiments.cli.run``) print it as one line, without a
  traceback.
  """


def _bad(field: str, value: Any, why: str) -> ConfigError:
  return ConfigError(f"config.{field}={value!r}: {why}")


def closest(name: str, known: Sequence[str], n: int = 3) -> list[str]:
  """Up to ``n`` of ``known`` closest to ``name`` (a misspelt field), best first.

  Each candidate's last dotted part is compared with ``name``'s by
  ``difflib`` similarity, and also by its initials (``lr`` is close to
  ``learning_rate``); those at least 0.65 similar are kept, the candidates
  in ``name``'s own group first.
  """
  parent, _, last = name.rpartition(".")

  def score(candidate):
    group, _, field = candidate.rpartition(".")
    initials = "".join(w[:1] for w in field.split("_"))
    sim = max(difflib.SequenceMatcher(None, last, f).ratio() for f in (field, initials))
    return group == parent, sim

  scored = [(score(c), c) for c in known]
  return [c for (_, sim), c in sorted((x for x in scored if x[0][1] >= 0.65),
                                       key=lambda x: x[0], reverse=True)[:n]]


def _paths(node, prefix: str = "") -> list[str]:
  """Every dotted field path of a ConfigDict (groups and their fields)."""
  out = []
  for k in node.keys():
    out.append(prefix + k)
    if hasattr(node[k], "keys"):
      out += _paths(node[k], f"{prefix}{k}.")
  return out


def config_field(config, path: str) -> Any:
  """The value of the dotted field ``path`` of ``config`` (``"rl.learning_rate"``).

  Raises:
    ConfigError: ``config`` has no such field: the message names it and the
      closest known fields (:func:`closest`), or else the fields of its group.
  """
  node = config
  parts = path.split(".")
  for i, part in enumerate(parts):
    group = ".".join(["config"] + parts[:i])
    if not hasattr(node, "keys"):
      raise ConfigError(f"{group} is a value, not a group of fields (no field config.{path})")
    if part not in node:
      where = ".".join(parts[:i + 1])
      near = closest(where, _paths(config))
      raise ConfigError(f"the config has no field config.{where}; " + (
          f"closest: {', '.join('config.' + c for c in near)}" if near
          else f"{group} has: {', '.join(sorted(node.keys()))}"))
    node = node[part]
  return node


# What to set instead, for a config field whose dataclass's own message names
# a field of the dataclass that the config does not have.
_HINTS = {
    "rollout.temperature": "the train rollout samples; greedy evaluation is config.eval.greedy",
    "eval.temperature": "config.eval.greedy=True adds a greedy evaluation",
}


def _named(build: Callable[..., Any], fields: dict[str, tuple[str, Any]], *,
           owners: Sequence[str] | None = None, **fixed) -> Any:
  """``build(**fields' values, **fixed)``, its errors named as config fields.

  ``fields`` maps each argument of ``build`` (a config dataclass) to
  ``(config field, value)``. A :class:`jagent.FieldError` of the dataclass's
  own checks (``owners``: the dataclasses whose checks run, default
  ``build``'s own name) on one of those arguments
  (``RolloutConfig.group_size=0: ...``) is re-raised as a
  :class:`ConfigError` naming the config field
  (``config.rollout.group_size=0: ...``), its advice replaced by
  :data:`_HINTS`'s where that names the dataclass's fields; any other error
  propagates as it is.
  """
  try:
    return build(**{arg: value for arg, (_, value) in fields.items()}, **fixed)
  except jagent.FieldError as e:
    if e.owner not in (owners or (build.__name__,)) or e.field not in fields:
      raise
    field, value = fields[e.field]
    why = f"{e.why} ({_HINTS[field]})" if field in _HINTS else e.reason()
    raise _bad(field, value, why) from e


def prompt_config(config) -> rollout.PromptConfig:
  """The run's PromptConfig (``config.prompt``).

  Raises:
    ConfigError: PromptConfig's own checks, or a ``chat_template`` that is
      not one of ``jagent.tokenizers.CHAT_TEMPLATES`` (``""``: the
      tokenizer's), naming ``config.prompt.<field>``.
  """
  p = config.prompt
  if p.chat_template and p.chat_template not in tokenizers.CHAT_TEMPLATES:
    raise _bad("prompt.chat_template", p.chat_template,
               f"unknown; known: {sorted(tokenizers.CHAT_TEMPLATES)} or \"\" (the tokenizer's)")
  return _named(rollout.PromptConfig, {
      f: (f"prompt.{f}", p[f]) for f in ("system", "first_turn", "next_turn", "think",
                                         "max_actions_per_turn")},
                instructions=p.instructions if p.instructions != "" or
                "{instructions}" not in p.first_turn else None,
                chat_template=p.chat_template or None)


def rollout_config(config) -> rollout.RolloutConfig:
  """The train rollout's RolloutConfig (``config.rollout``).

  Raises:
    ValueError: RolloutConfig's own checks, naming ``config.rollout.<field>``.
  """
  r = config.rollout
  return _named(rollout.RolloutConfig, {
      **{f: (f"rollout.{f}", r[f]) for f in ("num_groups", "group_size", "max_turns",
                                             "max_tokens_per_turn", "max_actions_per_traj",
                                             "temperature")},
      "history_turns": ("rollout.history_turns", r.history_turns),
      "merge_lora": ("rollout.merge_lora", r.merge_lora),
      "prefill_chunk": ("rollout.prefill_chunk", r.prefill_chunk)},
                owners=("RolloutConfig", "SamplingConfig"))  # the latter: temperature


def train_config(config, model_config: models.ModelConfig,
                 num_microbatches: int) -> train.TrainConfig:
  """The RL stage's TrainConfig (``config.rl``; ``num_microbatches`` resolved from -1).

  Raises:
    ValueError: TrainConfig's and OptimizerConfig's own checks, naming
      ``config.rl.<field>`` (or ``config.rollout.temperature``).
  """
  rl = config.rl
  named = lambda *fs: {f: (f"rl.{f}", rl[f]) for f in fs}  # noqa: E731
  actor = _named(train.OptimizerConfig,
                 named("learning_rate", "warmup_steps", "decay", "weight_decay",
                       "max_grad_norm"),
                 decay_steps=max(1, rl.steps * rl.num_minibatches * rl.ppo_epochs
                                 - rl.warmup_steps) if rl.decay != "constant" else 0)
  critic = _named(train.OptimizerConfig,
                  {"learning_rate": ("rl.critic_learning_rate", rl.critic_learning_rate),
                   **named("weight_decay", "max_grad_norm")})
  return _named(train.TrainConfig, {
      "temperature": ("rollout.temperature", config.rollout.temperature),
      **named("ppo_epochs", "num_minibatches", "old_logprobs"),
      "num_microbatches": ("rl.num_microbatches", num_microbatches)},
                model=model_config, actor_optimizer=actor, critic_optimizer=critic)


def lora_config(config, model_config: models.ModelConfig | None = None
                ) -> models.LoraConfig | None:
  """The run's LoRA adapters (``config.lora``), or None when off.

  Off when ``lora.rank`` is 0.
  With ``model_config``, also checks that its family has every target module.
  The other fields are checked even when off, so a typo (say
  ``target_modules=bogus``) is refused before it silently costs a run.

  Raises:
    ValueError: a negative or non-int ``lora.rank``, or LoraConfig's own
      checks (``alpha``, ``dropout``, an unknown or missing module), naming
      ``config.lora.<field>``.
  """
  lo = config.lora
  rank = lo.rank
  _require_int("lora.rank", rank, 0, "must be an int >= 0 (0: LoRA off)")

  def build(**fields):
    lc = models.LoraConfig(**fields)
    if model_config is not None:
      lc.check_model(model_config)
    return lc

  # Rank 0 is checked as rank 1: LoraConfig refuses 0, the other fields stand.
  lc = _named(build, {f: (f"lora.{f}", lo[f]) for f in ("alpha", "dropout", "target_modules")},
              owners=("LoraConfig",), rank=max(rank, 1))
  return lc if rank else None


LORA_BASE_DTYPES = ("float32", "bfloat16")


def lora_base_dtype(config) -> str | None:
  """The dtype the frozen LoRA base is stored in (``config.lora.base_dtype``).

  ``"bfloat16"`` halves the base's memory; the model still computes in its
  ``dtype`` (weights are cast at use) and the adapters stay float32.

  Returns:
    The dtype name, or None when LoRA is off or the field is None (the
    loaded dtype).

  Raises:
    ConfigError: a value not in :data:`LORA_BASE_DTYPES` (LoRA on or off),
      naming the field.
  """
  dtype = config.lora.base_dtype
  if dtype is not None and dtype not in LORA_BASE_DTYPES:
    raise _bad("lora.base_dtype", dtype, f"must be one of {LORA_BASE_DTYPES}")
  return dtype if config.lora.rank else None


def lora_base_warning(config) -> str | None:
  """The warning line of LoRA on a random base, or None.

  With ``config.lora.rank > 0`` and an empty ``config.model_dir`` the frozen
  base is ``models.init``'s random weights, and adapters alone can hardly
  move such a model: its tied embeddings (std 0.02) and final norm keep
  every logit within about +-1.3, so no reply format can be learned
  (measured on Bandit with ``nano``: adapters-only SFT reached a format NLL
  of ~5.06 nats/token where full fine-tuning reached 0.09, and RL then
  success 0.0). Adapters need a trained base (``config.model_dir``: e.g. a
  full fine-tuning run's ``policy/`` export) and about 10x the full
  fine-tuning learning rate.

  Args:
    config: a run's config (``experiments/configs/*.py``).

  Returns:
    One line naming ``config.lora.rank`` and ``config.model_dir``, or None
    (LoRA off, or a base loaded from ``model_dir``).
  """
  rank = config.lora.rank
  if not rank or config.model_dir:
    return None
  return (f"config.lora.rank={rank} with config.model_dir='': the adapters train on a "
          f"RANDOM frozen base ({config.model}), which they cannot teach a reply format "
          "(its logits stay within ~+-1.3); pass a trained base as config.model_dir "
          "(e.g. a full fine-tuning run's <workdir>/policy) and ~10x its learning rate")


def eval_rollout_config(config, *, temperature: float | None = None, greedy: bool = False,
                        group_size: int = 1, context_size: int | None = None
                        ) -> rollout.RolloutConfig:
  """The evaluation rollout's RolloutConfig: ``eval.num_groups`` levels a chunk.

  ``temperature`` overrides ``config.eval.temperature``; turn, token and
  action limits are the train rollout's (``config.rollout``).

  Raises:
    ValueError: RolloutConfig's own checks, naming the config field.
  """
  r = config.rollout
  return _named(rollout.RolloutConfig, {
      "num_groups": ("eval.num_groups", config.eval.num_groups),
      "temperature": ("eval.temperature",
                      config.eval.temperature if temperature is None else temperature),
      **{f: (f"rollout.{f}", r[f]) for f in ("max_turns", "max_tokens_per_turn",
                                             "max_actions_per_traj")},
      "history_turns": ("rollout.history_turns", r.history_turns)},
                owners=("RolloutConfig", "SamplingConfig"), group_size=group_size, greedy=greedy, context_size=context_size)


def filter_config(config) -> losses.FilterConfig:
  """The run's uncertainty filter, from ``config.rl.filter_mode/filter_value/include_zero``.

  Raises:
    ValueError: from :class:`jagent.losses.FilterConfig`, naming the field.
  """
  rl = config.rl
  return _named(losses.FilterConfig, {
      "mode": ("rl.filter_mode", rl.filter_mode), "value": ("rl.filter_value", rl.filter_value),
      "include_zero": ("rl.include_zero", rl.include_zero)})


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
    raise _bad("algorithm", algorithm, f"unknown; known: {list(transforms.registered())}")
  return _keyword_defaults(transforms.signature(algorithm))


def config_arg(arg: str | None, default: str) -> tuple[str, str]:
  """``(env id, algorithm)`` of a config file's argument ``"<env id>,<algorithm>"``.

  The argument is the text after the config file's ``:``
  (``--config=experiments/configs/tiny.py:FrozenLake-4x4-v0,grpo``); None or
  ``""`` is ``default``.

  Raises:
    ConfigError: not two comma-separated names, an unregistered environment
      or an unknown algorithm, naming the argument and the known names.
  """
  text = arg or default
  parts = text.split(",")
  where = f"config argument {text!r} (<env id>,<algorithm> after the config file's ':')"
  if len(parts) != 2 or not all(p.strip() for p in parts):
    raise ConfigError(f"{where}: expected two names separated by a comma, e.g. {default!r}")
  env, algorithm = (p.strip() for p in parts)
  if env not in envs_jax.registered():
    near = closest(env, sorted(envs_jax.registered()))
    raise ConfigError(f"{where}: unknown environment {env!r}"
                      + (f" (closest: {', '.join(near)})" if near else "")
                      + f"; registered: {', '.join(sorted(envs_jax.registered()))}")
  if algorithm not in transforms.registered():
    raise ConfigError(f"{where}: unknown algorithm {algorithm!r}; registered: "
                      f"{', '.join(transforms.registered())}")
  return env, algorithm


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
      raise _bad(f"algorithm_kwargs.{k}", v, _not_a_hyperparameter(algorithm, k, out))
    if k == "advantage_kwargs":
      for name, x in (v or {}).items():
        if name not in out[k]:
          raise _bad(f"algorithm_kwargs.advantage_kwargs.{name}", x,
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
  near = closest(key, list(known))
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
      raise _bad(f"algorithm_kwargs.{k}", v,
                 _not_a_hyperparameter(config.algorithm, k, known)
                 + " (a config file fills algorithm_kwargs for the algorithm of its argument: "
                 "choose it there, --config=<file>:<env id>,<algorithm>)")
  advantage = kwargs.get("advantage", known.get("advantage"))
  if "advantage" in known and isinstance(advantage, str):
    if advantage not in transforms.ADVANTAGE_ESTIMATORS:
      raise _bad("algorithm_kwargs.advantage", advantage,
                 f"unknown; known: {sorted(transforms.ADVANTAGE_ESTIMATORS)}")
    own = inspect.signature(transforms.ADVANTAGE_ESTIMATORS[advantage]).parameters
    defaults = advantage_hyperparameters()
    chosen = {}
    for k, v in (kwargs.get("advantage_kwargs") or {}).items():
      if k in own:
        chosen[k] = v
      elif k not in defaults or v != defaults[k]:  # set for another estimator
        raise _bad(f"algorithm_kwargs.advantage_kwargs.{k}", v,
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
      raise ConfigError(f"config.algorithm_kwargs of {config.algorithm!r}: {e}") from e
    raise ConfigError(", ".join(f"config.algorithm_kwargs.{k}={kwargs[k]!r}" for k in blamed)
                      + f": {e}") from e


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


def _require_int(field: str, value: Any, minimum: int, why: str) -> None:
  """Raises ``_bad(field, value, why)`` unless ``value`` is an int (not a bool) >= ``minimum``."""
  jagent.check_int(f"config.{field}", value, minimum, why=why, error=ConfigError)


def _validate_diagnostics(config) -> None:
  """``config.diagnostics``."""
  d = config.diagnostics
  _require_int("diagnostics.every", d.every, 0, "must be an int >= 0 (0: no diagnostics)")
  _require_int("diagnostics.num_rows", d.num_rows, 2,
               "must be an int >= 2 (I(X;Z) compares replies across prompts)")
  for _, floor in ALERT_FLOORS:
    v = d[floor]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
      raise _bad(f"diagnostics.{floor}", v, "must be a finite float >= 0 (0: no alert)")


@dataclasses.dataclass(frozen=True, eq=False)
class RunSpec:
  """What a run's config means, built once: every jagent dataclass and the objective.

  Built by :meth:`from_config`, which names the first bad config field
  before anything compiles. Holds no arrays, devices, tokenizer or env.

  Attributes:
    config: the config, upgraded (:func:`experiments.spec.upgrade`).
    num_devices: the devices ``config.mesh`` uses (1 without a mesh).
    model: the policy's ModelConfig (``config.model`` or ``config.model_dir``'s
      ``config.json``, with ``remat``, ``compute_dtype``, ``attention_impl``
      and ``cache_dtype`` set).
    prompt: the PromptConfig (``config.prompt``).
    rollout: the train rollout's RolloutConfig (``config.rollout``).
    lora: the LoRA adapters' LoraConfig, or None when off.
    lora_base_dtype: the dtype the frozen LoRA base is stored in, or None.
    filter: the run's one uncertainty filter (``config.rl.filter_*``).
    objective: the objective run on the kept rows
      (``jagent.train.iteration_filter`` of ``config.algorithm``'s).
    num_keep: the groups an RL step trains on (the filter's count, or all).
    train: the RL stage's TrainConfig (``num_microbatches`` resolved from -1:
      one row per device of ``data x fsdp`` in each micro-batch).
    sft_optimizer: the SFT stage's OptimizerConfig, or None without SFT.
  """
  config: ml_collections.ConfigDict
  num_devices: int
  model: models.ModelConfig
  prompt: rollout.PromptConfig
  rollout: rollout.RolloutConfig
  lora: models.LoraConfig | None
  lora_base_dtype: str | None
  filter: losses.FilterConfig
  objective: transforms.Objective
  num_keep: int
  train: train.TrainConfig
  sft_optimizer: train.OptimizerConfig | None

  @classmethod
  def from_config(cls, config, num_devices: int | None = None, *,
                  read_model_dir: bool = True) -> "RunSpec":
    """The spec of ``config`` (upgraded first), its cross-field checks run.

    Builds the run's config dataclasses (RolloutConfig, OptimizerConfig,
    TrainConfig, PromptConfig, ...) and the objective once, re-raising their
    own checks' errors naming the config field (e.g.
    ``config.rl.learning_rate``, ``config.algorithm_kwargs.entropy_coef``),
    and checks what spans fields (a group-relative objective's group size,
    rows per minibatch, SFT batch, evaluation chunks, the mesh). Compiles
    nothing.

    Args:
      config: a run's config (``experiments/configs/*.py`` or a saved
        ``config.json``).
      num_devices: the device count ``config.mesh`` must use (default
        ``jax.device_count()``: every process's devices; so in a
        multi-process run, call it after ``jax.distributed.initialize``).
      read_model_dir: read ``config.model_dir``'s ``config.json`` for the
        model. False reads no file: the ``nano`` config stands in for a
        model directory's (checks only: see :func:`validate`).

    Raises:
      ConfigError: the first bad field, named (a ``config.model_dir``
        without a ``config.json`` too).
    """
    config = spec.upgrade(config)
    if config.env not in envs_jax.registered():
      raise _bad("env", config.env, f"not a registered environment; known: "
                 f"{sorted(envs_jax.registered())}")
    if config.algorithm not in transforms.registered():
      raise _bad("algorithm", config.algorithm,
                 f"unknown; known: {sorted(transforms.registered())}")
    if not config.tokenizer and not config.model_dir:
      raise _bad("tokenizer", config.tokenizer,
                 "empty means the model_dir's tokenizer, but config.model_dir is empty too "
                 "(pass --config.model_dir=<a Hugging Face model directory>)")
    if config.model not in models.config_names() and not config.model_dir:
      raise _bad("model", config.model, f"unknown; known: {models.config_names()}")
    model = _model_config(config, read_model_dir)
    prompt = prompt_config(config)
    r = rollout_config(config)
    obj = objective(config)
    # Group-relative advantages (GRPO, RLOO, GiGPO, ...) are all 0 with one
    # rollout a group: such a run would train nothing.
    if obj.needs.groups and r.group_size < 2:
      raise _bad("rollout.group_size", r.group_size,
                 f"the objective {config.algorithm!r} compares the rollouts of a group, so "
                 "with one rollout a group every advantage is 0 and nothing is learned; set "
                 "config.rollout.group_size >= 2")
    for field in ("rl.steps", "sft.steps", "eval.every", "eval.samples"):
      _require_int(field, config_field(config, field), 0, "must be an int >= 0")
    fc = filter_config(config)
    if config.rl.critic not in train.CRITIC_KINDS:
      raise _bad("rl.critic", config.rl.critic, f"unknown; known: {train.CRITIC_KINDS}")
    num_keep = r.num_groups
    if fc.fixed_count:
      try:
        num_keep = train.num_kept_groups(r.num_groups, fc)
      except ValueError as e:
        raise _bad("rl.filter_value", config.rl.filter_value, str(e)) from None
      if num_keep < 1:
        raise _bad("rl.filter_value", config.rl.filter_value,
                   f"keeps no group of rollout.num_groups={r.num_groups}")
    rows = num_keep * r.group_size
    micro = config.rl.num_microbatches
    # -1 (one row per device) is resolved once the mesh is checked, below.
    tc = train_config(config, model, 1 if micro == -1 else micro)
    if rows % config.rl.num_minibatches:
      raise _bad("rl.num_minibatches", config.rl.num_minibatches,
                 f"does not divide the {rows} trained rows per step (kept groups x group_size)")
    if micro > 0 and (rows // config.rl.num_minibatches) % micro:
      raise _bad("rl.num_microbatches", config.rl.num_microbatches,
                 f"does not divide the {rows // config.rl.num_minibatches} rows of a minibatch "
                 f"({rows} trained rows / rl.num_minibatches={config.rl.num_minibatches})")
    # config.sft.expert is make_expert's policy.
    if config.sft.expert not in rollout.EXPERT_POLICIES:
      raise _bad("sft.expert", config.sft.expert, f"unknown; known: {rollout.EXPERT_POLICIES}")
    _require_int("sft.expert_max_nodes", config.sft.expert_max_nodes, 1, "must be an int >= 1")
    sft = sft_optimizer(config) if config.sft.steps else None
    # SFT rows are episodes in the full history, turns in a bounded window (at
    # most max_turns an episode; sft_batch_indices checks the turns taken).
    sft_rows = config.sft.num_demos * (
        1 if config.rollout.history_turns < 0 else config.rollout.max_turns)
    if config.sft.steps and config.sft.batch_size > sft_rows:
      raise _bad("sft.batch_size", config.sft.batch_size,
                 f"is larger than the {sft_rows} rows of sft.num_demos={config.sft.num_demos}")
    if config.sft.steps and not 1 <= config.sft.actions_per_turn <= (
        config.prompt.max_actions_per_turn):
      raise _bad("sft.actions_per_turn", config.sft.actions_per_turn,
                 f"must be in [1, prompt.max_actions_per_turn="
                 f"{config.prompt.max_actions_per_turn}]")
    eval_rollout_config(config)  # eval.num_groups, eval.temperature
    # A stand-in model (no model directory read) has no modules to check.
    lora = lora_config(config, model if read_model_dir or not config.model_dir else None)
    base_dtype = lora_base_dtype(config)
    _validate_diagnostics(config)
    _require_int("checkpoint.every", config.checkpoint.every, 0,
                 "must be an int >= 0 (0: a checkpoint after SFT and after the last step only)")
    _require_int("checkpoint.keep", config.checkpoint.keep, 1, "must be an int >= 1")
    _require_int("rl.empty_stop_steps", config.rl.empty_stop_steps, 0,
                 "must be an int >= 0 (stop after that many consecutive steps that trained "
                 "nothing; 0: never)")
    _require_int("eval.num_levels", config.eval.num_levels, 1, "must be an int >= 1")
    if config.eval.num_levels % config.eval.num_groups:
      raise _bad("eval.num_levels", config.eval.num_levels,
                 f"must be a multiple of eval.num_groups={config.eval.num_groups}")
    n_dev, rows_per_device = _validate_mesh(config, num_devices, num_keep)
    if micro == -1:  # one row per device (data x fsdp) in each micro-batch
      tc = tc.replace(num_microbatches=rows // config.rl.num_minibatches // rows_per_device)
    # The run's one filter (rl.filter_*) replaces the objective's own; the
    # objective kept is the one that runs on the compacted rows (its filter
    # stage rebuilt so the filter applies once), as train.rl_iteration does.
    fc, obj = train.iteration_filter(obj, fc)
    return cls(config=config, num_devices=n_dev, model=model, prompt=prompt, rollout=r,
               lora=lora, lora_base_dtype=base_dtype, filter=fc, objective=obj,
               num_keep=num_keep, train=tc, sft_optimizer=sft)


def validate(config, num_devices: int | None = None) -> None:
  """Checks a train/eval config; raises ConfigError naming the first bad field.

  :meth:`RunSpec.from_config` without reading ``config.model_dir`` (the
  ``nano`` config stands in for its model), so a config naming a model
  directory of another machine can be checked. Compiles nothing.
  """
  RunSpec.from_config(config, num_devices, read_model_dir=False)


def _model_config(config, read_model_dir: bool) -> models.ModelConfig:
  """The policy's ModelConfig with the run's fields (see :attr:`RunSpec.model`).

  Raises:
    ConfigError: a ``config.model_dir`` without a ``config.json``, or
      ModelConfig's own checks of ``remat``, ``compute_dtype``,
      ``attention_impl`` and ``cache_dtype``, naming the field.
  """
  if config.model_dir and read_model_dir:
    if not os.path.isfile(os.path.join(config.model_dir, "config.json")):
      raise _bad("model_dir", config.model_dir, "no config.json there: a Hugging Face model "
                 "directory is needed (e.g. a run's <workdir>/policy)")
    base = models.read_hf_config(config.model_dir)
  else:
    base = models.get_config("nano" if config.model_dir else config.model)
  return _named(base.replace, {
      "dtype": ("compute_dtype", config.compute_dtype),
      "attention_impl": ("attention_impl", config.attention_impl),
      "cache_dtype": ("cache_dtype", config.cache_dtype)},
                owners=("ModelConfig",), remat=bool(config.remat))


def sft_optimizer(config, learning_rate=None) -> train.OptimizerConfig:
  """The SFT stage's OptimizerConfig (``learning_rate`` overrides ``sft.learning_rate``).

  ``learning_rate`` may be a traced float32 scalar (a vmapped sweep).

  Raises:
    ValueError: OptimizerConfig's own checks, naming ``config.sft.<field>``.
  """
  sft = config.sft
  lr = sft.learning_rate if learning_rate is None else learning_rate
  return _named(train.OptimizerConfig, {
      "learning_rate": ("sft.learning_rate", lr),
      "warmup_steps": ("sft.warmup_steps", sft.warmup_steps)},
                decay="cosine", decay_steps=max(1, sft.steps - sft.warmup_steps),
                weight_decay=0.0)


def _validate_mesh(config, num_devices: int | None, num_keep: int) -> tuple[int, int]:
  """``config.mesh`` against the device count and the rows it must split.

  Without ``num_devices`` reads ``jax.device_count()`` (all processes'
  devices), so in a multi-process run call it after
  ``jax.distributed.initialize``. ``num_keep``: the groups an RL step keeps.

  Returns:
    ``(devices, rows per device)``: the mesh's device count and its
    ``data x fsdp`` (``(1, 1)`` without a mesh).
  """
  mesh = config.mesh
  if not mesh:
    return 1, 1
  n_dev = jax.device_count() if num_devices is None else num_devices
  try:
    data, fsdp, _ = sharding.parse_mesh_spec(mesh, n_dev)
  except ValueError as e:
    raise _bad("mesh", mesh, f"{e} (the mesh must use {n_dev} devices; jax sees "
               f"{jax.device_count()} in {jax.process_count()} process(es))") from None
  n = data * fsdp
  r = config.rollout
  rows = [("rollout.num_groups x rollout.group_size", r.num_groups * r.group_size),
          ("eval.num_groups", config.eval.num_groups)]
  if config.sft.steps:
    rows.append(("sft.batch_size", config.sft.batch_size))
  if config.rl.num_microbatches == -1:
    rows.append(("a minibatch (rl.num_microbatches=-1: one row per device)",
                 num_keep * r.group_size // config.rl.num_minibatches))
  for name, b in rows:
    if b % n:
      raise _bad("mesh", mesh, f"splits batch rows data x fsdp = {n} ways, which does not "
                 f"divide the {b} rows of {name}")
  return n_dev, n


def trained_reset_keys(config) -> jax.Array:
  """Typed PRNG keys of the levels the run of ``config`` trains on: its RL steps' and SFT's.

  RL step ``s`` resets ``rollout.num_groups`` levels from
  ``fold_in(key(seed + 2), s)`` (:meth:`Experiment.rl_key`); a solver's
  demonstrations ``sft.num_demos`` from ``fold_in(key(seed), 1)``
  (:meth:`Experiment.demonstrations`; a random expert plays no level to the
  end, so they are not counted).
  """
  steps = jax.numpy.arange(config.rl.steps)
  rl_key = lambda s: jax.random.fold_in(jax.random.key(config.seed + 2), s)  # noqa: E731
  keys = [jax.vmap(lambda s: rollout.group_reset_keys(rl_key(s), config.rollout.num_groups))(
      steps).reshape(-1)]
  if config.sft.steps and config.sft.expert == "solver":
    keys.append(rollout.group_reset_keys(jax.random.fold_in(jax.random.key(config.seed), 1),
                                         config.sft.num_demos))
  return jax.numpy.concatenate(keys)


def base_runs(config, max_depth: int = 8) -> list[tuple[str, ml_collections.ConfigDict]]:
  """The ``experiments.train`` runs whose exported policy ``config.model_dir`` is, base first.

  ``experiments.train`` exports its policy to ``<workdir>/policy`` beside its
  ``<workdir>/config.json``; a ``model_dir`` so placed whose run played the
  same ``env`` is a base run, and so, in turn, is its own ``model_dir``'s (a
  LoRA run on a LoRA run's export), up to ``max_depth``. A ``model_dir``
  elsewhere (e.g. a Hugging Face download) has none.

  Returns:
    ``[(path of its config.json, its upgraded config), ...]``, nearest first.
  """
  out = []
  while len(out) < max_depth and config.model_dir:
    path = os.path.join(os.path.dirname(os.path.abspath(os.path.normpath(config.model_dir))),
                        "config.json")
    try:
      with open(path) as f:
        base = ml_collections.ConfigDict(json.load(f))
      if base.get("env") != config.env or any(k not in base for k in ("seed", "rl", "sft",
                                                                       "rollout")):
        break
      base = spec.upgrade(base)
    except (OSError, ValueError):  # none there, or not a run's config
      break
    out.append((path, base))
    config = base
  return out


class Experiment:
  """A configured run (see the module docstring).

  Args:
    config: the run's config (``experiments/configs/*.py``), or its
      :class:`RunSpec` (:attr:`spec`; :attr:`config` holds the config
      upgraded, :func:`experiments.spec.upgrade`).
    devices: the devices of ``config.mesh`` (default ``jax.devices()``,
      every process's; with ``config.mesh=""`` the default device). E.g.
      the first N of 8 for a scaling benchmark in one process.

  Raises:
    ValueError: from :meth:`RunSpec.from_config` (a bad ``config.mesh``, or one that
      does not use exactly ``devices`` or does not divide the batch rows,
      named as ``config.mesh``), a ``config.model_dir`` without a
      ``config.json``, or when the context cannot hold a turn
      (``rollout.max_tokens_per_turn`` etc.); all before anything compiles.
  """

  def __init__(self, config, devices=None):
    devices = None if devices is None else list(devices)
    if isinstance(config, RunSpec):
      self.spec = config
      if devices is not None and config.config.mesh and config.num_devices != len(devices):
        raise ValueError(f"a RunSpec built for {config.num_devices} devices run on "
                         f"{len(devices)}")
    else:
      self.spec = RunSpec.from_config(config, None if devices is None else len(devices))
    s = self.spec
    self.config = c = s.config
    # "tiny": the shipped sentencepiece model; "": the model directory's
    # tokenizer.json; else a directory holding a tokenizer.json.
    self.tokenizer = (tokenizers.load_tiny_tokenizer() if c.tokenizer == "tiny"
                      else tokenizers.HFTokenizer(c.tokenizer or c.model_dir))
    self.env, self.env_params = envs_jax.make(c.env)
    self.prompt = s.prompt
    self.text_env = rollout.TextEnv(self.env, self.tokenizer, self.prompt,
                                    env_params=self.env_params)
    self.model_config = s.model
    self.lora_config = s.lora  # None: LoRA off
    random_base = lora_base_warning(c)
    if random_base:
      logging.warning(random_base)
    r = c.rollout
    self.rollout_config = s.rollout
    self.context_size = rollout.context_size(self.text_env, self.rollout_config)
    if self.context_size > self.model_config.max_position:
      raise _bad("rollout.max_tokens_per_turn", r.max_tokens_per_turn,
                 f"rollout.max_turns={r.max_turns} turns of it need {self.context_size} "
                 f"tokens of context; the model has {self.model_config.max_position} positions")
    self.filter_config, self.objective = s.filter, s.objective
    self.num_keep = s.num_keep
    self.needs = self.objective.needs
    # One code path for every run: config.mesh (validated by the spec), or a
    # one-device mesh of the default device (bit for bit an unsharded run).
    self.mesh = (sharding.make_mesh(c.mesh, devices) if c.mesh
                 else sharding.make_mesh("", jax.local_devices()[:1]))
    self.train_config = s.train
    self._signature = None
    # Sharded programs are shared only by Experiments on the same devices.
    self._devices_key = (tuple(self.mesh.shape.values()),
                         tuple(d.id for d in self.mesh.devices.flat))

  @property
  def is_primary(self) -> bool:
    """Whether this process writes the run's files (process 0; checkpoints: all)."""
    return jax.process_index() == 0

  def param_shardings(self):
    """The policy's NamedShardings on :attr:`mesh` (``Params`` structure)."""
    abstract = jax.eval_shape(lambda k: models.init(self.model_config, k), jax.random.key(0))
    return sharding.param_shardings(abstract, self.mesh)

  def signature(self, fields: tuple[str, ...] | None = None) -> str:
    """JSON of the config's dotted ``fields`` (None: all but ``seed``).

    A key for :func:`shared_program`: runs that agree on the fields a
    program reads can share it.
    """
    if fields is not None:
      return _fields_json(self.config, fields)
    if self._signature is None:
      unseeded = self.config.copy_and_resolve_references()
      unseeded.seed = 0
      self._signature = unseeded.to_json_best_effort(sort_keys=True)
    return self._signature

  # ------------------------------------------------------------------ rollouts
  def _rollout_config(self, kind: str, temperature: float | None) -> rollout.RolloutConfig:
    if kind == "train":
      return self.rollout_config
    return eval_rollout_config(self.config, temperature=temperature,
                               greedy=kind == "eval_greedy", context_size=self.context_size)

  def rollout_fn(self, kind: str, temperature: float | None = None):
    """The jitted rollout: ``"train"``, ``"eval_temp"`` or ``"eval_greedy"``.

    ``temperature`` (eval kinds only) overrides ``config.eval.temperature``.
    Shared by the Experiments of this process whose configs agree on the
    fields the rollout reads (built and compiled once). Always the
    single-program ``jagent.rollout.make_rollout`` (vmappable, nestable in
    other programs); :meth:`evaluate` and :meth:`rl_step` run it on the mesh.
    """
    if kind == "train":
      temperature = None  # the train rollout samples at rollout.temperature
    elif temperature is None:
      temperature = self.config.eval.temperature

    def build():
      return rollout.make_rollout(self.text_env, self.model_config,
                                  self._rollout_config(kind, temperature), self.env_params)

    return shared_program(("rollout", self.signature(ROLLOUT_FIELDS), kind, temperature), build)

  def eval_program(self, kind: str, temperature: float | None = None):
    """``jagent.sharding.shard_eval_program`` of :meth:`rollout_fn` on :attr:`mesh`."""
    if temperature is None:
      temperature = self.config.eval.temperature
    return shared_program(
        ("eval_program", self.signature(ROLLOUT_FIELDS), kind, temperature, self._devices_key),
        lambda: sharding.shard_eval_program(self.rollout_fn(kind, temperature), self.mesh))

  def _evaluate(self, params, kind: str, temperature: float | None = None):
    """``(metrics, first chunk's Trajectory)`` on the held-out levels (``train.evaluate``)."""
    return train.evaluate(self.eval_program(kind, temperature), params, self.eval_keys,
                          self.eval_key(), self.config.eval.num_groups)

  def init_params(self):
    """Initial policy parameters (random, or the Hugging Face checkpoint).

    Each array is created (or loaded) straight onto its mesh sharding. With
    ``config.lora`` on: a ``models.LoraParams`` of that base and fresh
    adapters (B zero: the base's logits).
    """
    c = self.config
    shardings = self.param_shardings()
    if c.model_dir:
      base = models.load_hf_checkpoint(c.model_dir, shardings=shardings)[0]
    else:
      base = jax.block_until_ready(jax.jit(lambda k: models.init(self.model_config, k),
                                           out_shardings=shardings)(jax.random.key(c.seed)))
    return self.with_lora(base)

  def with_lora(self, base):
    """``base`` with the run's fresh LoRA adapters on their shardings (``base`` when off).

    The base is stored in ``config.lora.base_dtype`` (:func:`lora_base_dtype`).
    """
    if self.lora_config is None:
      return base
    dtype = lora_base_dtype(self.config)
    if dtype is not None:
      base = jax.tree.map(lambda w: w if w.dtype == dtype else w.astype(dtype), base)
    key = jax.random.fold_in(jax.random.key(self.config.seed), 4)
    make = lambda: models.init_lora(None, self.model_config, self.lora_config, key)  # noqa: E731
    adapters = jax.jit(make, out_shardings=sharding.param_shardings(
        jax.eval_shape(make), self.mesh))()
    return adapters.replace(base=base)

  # ----------------------------------------------------------------------- SFT
  def demonstrations(self):
    """Expert demonstrations (one Trajectory) for SFT; levels disjoint from eval."""
    c = self.config
    # config.sft.expert_<name> sets the game's expert option <name>; the config
    # template holds Sokoban's for every game, so the game gets the ones its
    # expert takes (env.expert_defaults) and its defaults for the rest.
    options = {k[len("expert_"):]: v for k, v in c.sft.items() if k.startswith("expert_")}
    expert = rollout.make_expert(
        self.env, think=self.prompt.think, actions_per_turn=c.sft.actions_per_turn,
        policy=c.sft.expert, seed=c.seed,
        **{k: v for k, v in options.items() if k in self.env.expert_defaults})
    rc = rollout.RolloutConfig(
        num_groups=c.sft.num_demos, group_size=1, max_turns=self.rollout_config.max_turns,
        max_tokens_per_turn=self.rollout_config.max_tokens_per_turn,
        max_actions_per_traj=self.rollout_config.max_actions_per_traj,
        context_size=self.context_size, history_turns=self.rollout_config.history_turns)
    return rollout.demonstrations(
        self.text_env, num_groups=c.sft.num_demos,
        key=jax.random.fold_in(jax.random.key(c.seed), 1), config=rc,
        actions_per_turn=c.sft.actions_per_turn, expert=expert)

  def sft_train_config(self, learning_rate=None) -> train.TrainConfig:
    """The SFT stage's TrainConfig (``learning_rate`` overrides ``sft.learning_rate``).

    ``learning_rate`` may be a traced float32 scalar (a vmapped sweep).
    """
    optimizer = (self.spec.sft_optimizer if learning_rate is None else None) or sft_optimizer(
        self.config, learning_rate)
    return train.TrainConfig(model=self.model_config, actor_optimizer=optimizer)

  def sft_batch_indices(self, row_valid) -> np.ndarray:
    """int64 ``[sft.steps, sft.batch_size]``: the demonstration rows of each SFT step.

    Drawn without replacement per step by ``numpy.random.default_rng(seed)``
    among the rows that hold a turn (a demonstration is one row per episode at
    ``history_turns = -1``, one row per turn taken at ``k >= 0``).

    Args:
      row_valid: bool [R], the demonstrations' ``Trajectory.row_valid``.

    Raises:
      ValueError: ``sft.batch_size`` larger than the number of valid rows.
    """
    c = self.config
    rows = np.flatnonzero(np.asarray(row_valid, bool))
    if c.sft.batch_size > rows.size:
      raise _bad("sft.batch_size", c.sft.batch_size,
                 f"is larger than the {rows.size} demonstration rows")
    rng = np.random.default_rng(c.seed)
    return np.asarray([rows[rng.choice(rows.size, c.sft.batch_size, replace=False)]
                       for _ in range(c.sft.steps)], np.int64).reshape(
                           c.sft.steps, c.sft.batch_size)

  def sft_state(self, params, config: train.TrainConfig | None = None) -> train.TrainState:
    """The SFT TrainState starting from ``params``, on the mesh's shardings."""
    def make(p):
      return train.init_train_state(p, jax.random.key(self.config.seed),
                                    config=config or self.sft_train_config())

    return sharding.place_state(make, params, mesh=self.mesh)

  def sft(self, writer, *, progress: bool = True):
    """Behaviour cloning on :meth:`demonstrations`; returns the params."""
    import tqdm  # pylint: disable=g-import-not-at-top
    c = self.config
    params = self.init_params()
    if not c.sft.steps:
      return params
    demos = self.demonstrations()
    batch_all = train.trajectory_batch(demos)
    tc = self.sft_train_config()
    state = self.sft_state(params, tc)
    indices = self.sft_batch_indices(demos.row_valid)
    success = float(np.mean(demos.success))
    step_fn = shared_program(
        ("sft_step", self.signature(SFT_FIELDS), self._devices_key),
        lambda: sharding.shard_sft_step(tc, self.mesh,
                                        sharding.train_state_shardings(state, self.mesh)))
    tokens, loss_mask = np.asarray(batch_all.tokens), np.asarray(batch_all.loss_mask)
    for step in tqdm.trange(c.sft.steps, disable=not progress, desc="SFT"):
      # Every process holds the demonstrations; each places its rows.
      idx = indices[step]
      mb = sharding.global_rows(
          transforms.Batch(tokens=tokens[idx], loss_mask=loss_mask[idx]), self.mesh)
      state, m = step_fn(state, mb)
      if (step + 1) % 50 == 0 or step + 1 == c.sft.steps:
        writer.write(-c.sft.steps + step + 1, {
            **{k: float(v) for k, v in m.items()}, "sft/demo_success": success})
    return state.params

  # ------------------------------------------------------------------------ RL
  def rl_state(self, params) -> train.TrainState:
    """The RL TrainState starting from ``params`` (critic/reference as needed)."""
    c = self.config

    def make(p):
      return train.init_train_state(
          p, jax.random.key(c.seed + 1), config=self.train_config,
          critic=c.rl.critic if self.needs.critic else None, reference=self.needs.reference,
          objective=self.objective)

    return sharding.place_state(make, params, mesh=self.mesh)

  def rl_state_target(self):
    """A restore target of the RL TrainState (``Checkpointer.restore``) on :attr:`mesh`.

    See ``jagent.sharding.train_state_target``: nothing is allocated or
    loaded, and a checkpoint written on any mesh or device count restores
    onto this run's.
    """
    abstract = jax.eval_shape(
        lambda k: self.rl_state(self.with_lora(models.init(self.model_config, k))),
        jax.random.key(0))
    target = sharding.train_state_target(abstract, self.mesh)
    if self.lora_config is None:
      return target
    # LoRA: checkpoints hold no base; the target carries the reloaded one
    # (a copy for each further LoRA trunk: a donated state holds each buffer once).
    target, frozen = models.split_frozen(target)
    base = self.init_params().base
    real, seen = [], False
    for f in frozen:  # the policy's base comes first (TrainState.params)
      real.append(None if f is None else jax.tree.map(jnp.copy, base) if seen else base)
      seen = seen or f is not None
    return models.join_frozen(target, real)

  def rl_key(self, step: int) -> jax.Array:
    """The rollout key of RL step ``step`` (0-based)."""
    return jax.random.fold_in(jax.random.key(self.config.seed + 2), step)

  def rl_iteration(self, state, key, *, config: train.TrainConfig | None = None):
    """One pure RL iteration (``jagent.train.rl_iteration`` with this run's pieces).

    ``config`` overrides :attr:`train_config` (e.g. with a traced learning
    rate). Not jitted: jit or vmap it; :meth:`rl_step` runs it jitted,
    with :meth:`diagnostics` (left out here: under ``vmap`` its ``lax.cond``
    on the batched step would run every step).
    """
    return train.rl_iteration(
        state, key, rollout_fn=self.rollout_fn("train"), objective=self.objective,
        config=self.train_config if config is None else config, num_keep=self.num_keep,
        filter_config=self.filter_config)

  def diagnostics(self):
    """The RL iteration's ``diagnostics`` hook (``config.diagnostics``), or None when off.

    ``hook(state, traj, key)`` runs :func:`jagent.train.collapse_metrics`
    (``diagnostics.num_rows`` pairs; the rollout's temperature and reply
    bound; the format of ``prompt.think`` left out of Z) under a
    ``lax.cond`` on :func:`diagnostics_due` of ``state.step``: on the other
    steps it costs nothing and returns NaNs (not measured; MetricsWriter
    leaves them out).
    """
    every = self.config.diagnostics.every
    if not every:
      return None
    d = self.config.diagnostics
    table = self.tokenizer.token_bytes()
    rc = self.rollout_config
    # The full layout's pairs are first turns: X fits turn 1's prompt buffer.
    prompt = (self.text_env.first_width if rc.history_turns < 0
              else self.context_size - rc.max_tokens_per_turn)

    def compute(state, traj, key):
      return train.collapse_metrics(
          state.params, traj, key, config=self.model_config, num_rows=d.num_rows,
          temperature=rc.temperature, reply_tokens=rc.max_tokens_per_turn,
          prompt_tokens=prompt, token_table=table, think=self.prompt.think)

    def hook(state, traj, key):
      shapes = jax.eval_shape(compute, state, traj, key)
      return jax.lax.cond(
          diagnostics_due(state.step, every), lambda: compute(state, traj, key),
          lambda: jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan, x.dtype), shapes))

    return hook

  def rl_step(self, state, step: int):
    """One iteration (rollout, compaction by the filter, update) as one jitted program.

    The input ``state`` is donated (``jagent.sharding.shard_rl_iteration``).
    Returns ``(state, metrics)`` with float metrics: those of
    ``jagent.train.rl_iteration``, ``time/step_seconds`` (wall time of the
    whole iteration, the metrics' transfer included) and the throughput of
    the iteration: ``throughput/rollout_tokens_per_s`` (sampled tokens),
    ``throughput/env_turns_per_s`` and ``throughput/train_tokens_per_s``
    (trained context tokens, padding included), each per second of the
    whole iteration (rollout and update run in one program, so they are
    not timed apart). With ``config.diagnostics.every`` > 0 also
    ``collapse/*`` (:func:`jagent.train.collapse_metrics` of this step's
    rollout under the policy that sampled it), NaN on the steps that are not
    :func:`diagnostics_due`. What this step did not measure (NaN) is left
    out of the dict: ``collapse/*`` off the diagnosed steps (or without a
    valid (prompt, reply) pair), and the update metrics of a step whose
    filter kept no group (``train/updates_applied`` 0: a mean over nothing).
    A non-finite value of a step that did update stays (a diverging loss
    must show).
    """
    def build():
      return sharding.shard_rl_iteration(
          self.rollout_fn("train"), self.objective, self.train_config, self.mesh,
          sharding.train_state_shardings(state, self.mesh), num_keep=self.num_keep,
          filter_config=self.filter_config, diagnostics=self.diagnostics())

    fn = shared_program(("rl_iteration", self.signature(), self._devices_key), build)
    t0 = time.perf_counter()
    state, m = fn(state, self.rl_key(step))
    out = {k: float(v) for k, v in jax.device_get(m).items()}
    sec = time.perf_counter() - t0
    trained = out["train/updates_applied"] > 0
    out = {k: v for k, v in out.items()
           if math.isfinite(v) or (trained and not k.startswith("collapse/"))}
    out["time/step_seconds"] = sec
    out["throughput/rollout_tokens_per_s"] = out["rollout/sampled_tokens"] / sec
    out["throughput/env_turns_per_s"] = out["rollout/env_turns"] / sec
    out["throughput/train_tokens_per_s"] = out["train/context_tokens"] / sec
    return state, out

  # ---------------------------------------------------------------------- eval
  def trained_reset_keys(self) -> jax.Array:
    """Typed PRNG keys of every level this run's policy trained on.

    This run's own (SFT demonstrations, RL steps: :func:`trained_reset_keys`)
    and, when its base (``config.model_dir``) was exported by a run of
    ``experiments.train`` on the same env, that run's too, and its base's
    (:func:`base_runs`): a LoRA run's base saw those levels, so they are not
    held out for it either. Sets :attr:`held_out_base_runs` to the base
    runs' ``config.json`` paths whose levels were added.
    """
    keys = [trained_reset_keys(self.config)]
    self.held_out_base_runs = []
    for path, base in base_runs(self.config):
      keys.append(trained_reset_keys(base))
      self.held_out_base_runs.append(path)
    return jax.numpy.concatenate(keys)

  def held_out_keys(self, trained: jax.Array) -> tuple[jax.Array, int]:
    """``(reset keys [eval.num_levels], removed)``: evaluation levels not in ``trained``.

    The plain set is ``split(key(eval.seed), eval.num_levels)``; a level of it
    that is a trained level (``jagent.train.held_out_reset_keys``) is replaced
    by the next fresh one of a second stream (``fold_in(key(eval.seed), 1)``),
    so the other levels stay those of the plain set. ``removed`` is -1 when
    the game has too few distinct levels to hold any out (then the plain set
    is evaluated, with a warning).
    """
    c = self.config
    plain = jax.random.split(jax.random.key(c.eval.seed), c.eval.num_levels)
    extra = jax.random.split(jax.random.fold_in(jax.random.key(c.eval.seed), 1),
                             8 * c.eval.num_levels)
    try:
      return train.held_out_reset_keys(self.env, self.text_env.env_params,
                                       jax.numpy.concatenate([plain, extra]), trained,
                                       c.eval.num_levels)
    except ValueError as e:
      logging.warning("config.eval.held_out: %s; evaluating on the plain levels", e)
      return plain, -1

  @functools.cached_property
  def eval_keys(self) -> jax.Array:
    """Typed PRNG keys ``[eval.num_levels]`` of the evaluation levels.

    With ``config.eval.held_out`` (the tiny configs' default) they are held
    out of the levels this run's policy trained on, its base run's included
    (:meth:`trained_reset_keys`, :meth:`held_out_keys`;
    :attr:`eval_levels_removed` tells how many were replaced,
    :attr:`held_out_base_runs` which base runs counted); otherwise
    ``split(key(eval.seed), eval.num_levels)``.
    Computed on first use; a sweep assigns the set held out of all its runs.
    """
    c = self.config
    if c.eval.held_out:
      keys, self.eval_levels_removed = self.held_out_keys(self.trained_reset_keys())
      return keys
    self.eval_levels_removed = 0
    return jax.random.split(jax.random.key(c.eval.seed), c.eval.num_levels)

  def eval_key(self) -> jax.Array:
    """The evaluation's sampling key (the initial states are :attr:`eval_keys`)."""
    return jax.random.key(self.config.seed + 3)

  def evaluate(self, params, *, temperature: float | None = None, greedy: bool = False):
    """Metrics on the fixed held-out levels (see ``jagent.train.evaluate``).

    ``temperature`` overrides ``config.eval.temperature`` (ignored when greedy).
    """
    m, _ = self._evaluate(params, "eval_greedy" if greedy else "eval_temp", temperature)
    return m

  def evaluate_greedy(self, params) -> dict:
    """``{"greedy_success", "greedy_score"}`` of a greedy evaluation; ``{}`` without ``eval.greedy``."""
    if not self.config.eval.greedy:
      return {}
    g, _ = self._evaluate(params, "eval_greedy")
    return {"greedy_success": g["success"], "greedy_score": g["score"]}

  def success_intervals(self, metrics: dict) -> dict:
    """``{"success_ci95": [lo, hi], "greedy_success_ci95": ...}`` of an evaluation's rates.

    The 95% Wilson intervals (:func:`wilson_interval`) over the
    ``eval.num_levels`` levels (one episode each) of ``success`` and, when in
    ``metrics``, ``greedy_success``.
    """
    return {f"{k}_ci95": list(wilson_interval(float(metrics[k]), self.config.eval.num_levels))
            for k in ("success", "greedy_success") if k in metrics}

  def evaluate_all(self, params, stage: str, workdir: str) -> dict:
    """Temperature and greedy evaluation; saves decoded samples; returns a dict.

    The dict: success, score, actions, turns, format_valid_frac,
    valid_action_frac, temperature, greedy_success and greedy_score (with
    ``eval.greedy``), their 95% intervals (:meth:`success_intervals`),
    num_levels and held_out_removed. Every process evaluates; only
    :attr:`is_primary` writes the samples.
    """
    c = self.config
    out = {}
    m, traj = self._evaluate(params, "eval_temp")
    out.update({k: m[k] for k in ("success", "score", "actions", "turns",
                                  "format_valid_frac", "valid_action_frac")})
    out["temperature"] = c.eval.temperature
    out.update(self.evaluate_greedy(params))
    out.update(self.success_intervals(out))
    out["num_levels"] = c.eval.num_levels
    _ = self.eval_keys  # computed on first use; sets eval_levels_removed
    out["held_out_removed"] = int(self.eval_levels_removed)
    # The base runs (config.model_dir) whose training levels were held out too.
    out["held_out_base_runs"] = list(getattr(self, "held_out_base_runs", []))
    traj = sharding.to_host(traj)  # all processes gather (a collective), one writes
    if self.is_primary:
      os.makedirs(os.path.join(workdir, "samples"), exist_ok=True)
      train.write_json(os.path.join(workdir, "samples", f"{stage}.json"),
                       train.decode_samples(traj, self.tokenizer, c.eval.samples))
    return {k: float(v) if isinstance(v, (float, np.floating)) else v for k, v in out.items()}

  # ---------------------------------------------------------------- checkpoints
  def checkpointer(self, workdir: str) -> train.Checkpointer:
    """The run's checkpoints, in ``<workdir>/checkpoints``."""
    return train.Checkpointer(workdir, keep=self.config.checkpoint.keep, async_save=False)

  def restore_newest(self, ckpt: train.Checkpointer, workdir: str
                     ) -> tuple[int, train.TrainState, dict, list[str]]:
    """The newest checkpoint of ``workdir`` that reads back, on :meth:`rl_state_target`.

    A checkpoint whose files are damaged (truncated, corrupted) is skipped
    rather than ending the run: the one before it holds everything but the
    steps since, which a resumed run trains again (bit for bit), and an
    evaluation says which step it played. The skipped one stays on disk
    (``jagent.train.Checkpointer.restore_readable``).

    Args:
      ckpt: the run's :meth:`checkpointer` (with at least one checkpoint).
      workdir: the run directory (``--workdir``), named in the messages.

    Returns:
      ``(step, state, metadata, lines)``: the restored step, state and
      metadata, and one line per skipped checkpoint, e.g. ``skipped
      checkpoint 40 of /w: unreadable (OUT_OF_RANGE: ...); it stays on disk;
      using checkpoint 30``.

    Raises:
      ConfigError: no checkpoint reads back: naming the directory, each
        checkpoint's error and what to do.
    """
    try:
      step, state, meta, skipped = ckpt.restore_readable(self.rl_state_target())
    except train.CheckpointError as e:
      raise ConfigError(f"--workdir={workdir}: {e}. Remove {ckpt.directory} to start the run "
                        "over (its config.json stays), or pass a new --workdir.") from e
    lines = [f"skipped checkpoint {s} of {workdir}: unreadable ({why}); it stays on disk; "
             f"using checkpoint {step}" for s, why in skipped]
    return step, state, meta, lines

  def export(self, workdir: str, params) -> None:
    """Writes the policy as a Hugging Face directory ``<workdir>/policy``.

    Weights, config and the tokenizer files with the prompt's chat template
    (``jagent.train.export_policy``): ``transformers``' ``AutoTokenizer`` and
    ``AutoModelForCausalLM`` load it. A LoRA policy is written merged there,
    and its adapters alone as a PEFT adapter directory
    ``<workdir>/policy_adapter``. Every process gathers the parameters and
    process 0 writes.
    """
    params = sharding.to_host(params)
    if self.is_primary:
      train.export_policy(params, self.model_config, os.path.join(workdir, "policy"),
                          tokenizer=self.tokenizer, chat_template=self.config.prompt.chat_template
                          or None)
      if isinstance(params, models.LoraParams):  # also the adapters alone, for PEFT
        models.save_peft_adapter(params, self.model_config,
                                 os.path.join(workdir, "policy_adapter"),
                                 base_model_name_or_path=self.config.model_dir or None)
