"""What a run's config means: the one home of the defaults of older configs.

A run's ``config.json`` holds the fields its version of the config files had.
:func:`upgrade` fills each field added since with the value under which the
older versions ran (which is not always today's default in
``experiments/configs/tiny.py``: e.g. runs saved before
``rollout.history_turns`` trained on the full history, -1, where tiny.py now
sets 0). Every program that reads a config (``experiments.train``,
``experiments.eval``, ``experiments.sweep``, a base run's ``config.json``)
upgrades it once; the code then reads ``config.<field>`` directly.

:class:`RunSpec` is what a config means, built once: every jagent
dataclass and the objective, with the checks that span fields
(:func:`validate` runs them without reading a model directory).
:func:`trained_reset_keys` and :func:`base_runs` read what a run trained on.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections

import envs_jax
from experiments import blocks
from experiments import fields
from experiments import hyperparameters
from experiments import stats
from jagent import losses
from jagent import models
from jagent import rollout
from jagent import sharding
from jagent import train
from jagent import transforms

# Dotted config field -> the value that runs saved before the field behaved as.
LEGACY_DEFAULTS: dict[str, Any] = {
    # Devices: one (the default device).
    "mesh": "",
    # A random init of config.model (no Hugging Face checkpoint).
    "model_dir": "",
    # The model as loaded: no rematerialization, float32 compute, the
    # platform's attention, a KV cache in the compute dtype.
    "remat": False,
    "compute_dtype": "float32",
    "attention_impl": "auto",
    "cache_dtype": "",
    # No LoRA (every weight trains); the other fields are LoraConfig's
    # defaults, and the base stays in the dtype it was loaded in (None).
    "lora.rank": 0,
    "lora.alpha": 32.0,
    "lora.dropout": 0.0,
    "lora.target_modules": "all-linear",
    "lora.base_dtype": None,
    # One sequence per episode (the full history), sampled with merged adapters.
    "rollout.history_turns": -1,
    "rollout.merge_lora": True,
    "rollout.prefill_chunk": 0,
    # Independent episodes (no tree); the other fields are TreeConfig's defaults.
    "rollout.tree.fork_turns": (),
    "rollout.tree.branches": (2,),
    "rollout.tree.expand": (),
    "rollout.tree.trees": 1,
    "rollout.tree.select": "random",
    # No gradient accumulation; never stop early.
    "rl.num_microbatches": 1,
    "rl.empty_stop_steps": 0,
    # BFS demonstrations, each search capped at 1,000,000 states, one search a turn.
    "sft.expert": "solver",
    "sft.expert_max_nodes": envs_jax.SOKOBAN_MAX_NODES,
    "sft.expert_reuse_plans": False,
    # Evaluation on split(key(eval.seed), eval.num_levels), training levels included.
    "eval.held_out": False,
    # No collapse diagnostics and no Echo Trap alert.
    "diagnostics.every": 0,
    "diagnostics.num_rows": 32,
    "diagnostics.min_reward_std": 0.0,
    "diagnostics.min_entropy": 0.0,
    "diagnostics.min_mutual_info": 0.0,
}


def upgrade(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` with every field of :data:`LEGACY_DEFAULTS` it lacks filled.

  A field (or a whole group, e.g. ``lora`` or ``diagnostics``) absent from a
  config saved by an older version gets the value that version ran with; a
  field present keeps its value, so upgrading a current config changes
  nothing and upgrading twice equals upgrading once. References and
  placeholders are resolved (``copy_and_resolve_references``); ``config`` is
  not modified.

  Args:
    config: a run's config (``experiments/configs/*.py``, or a
      ``config.json`` read back as a ConfigDict).

  Returns:
    The upgraded copy.

  Raises:
    ValueError: a field on the path of a default holds a value where the
      default needs a group (e.g. ``lora=0``), naming it.
  """
  out = config.copy_and_resolve_references()
  with out.unlocked():
    for path, value in LEGACY_DEFAULTS.items():
      *groups, name = path.split(".")
      node = out
      for i, g in enumerate(groups):
        if g not in node:
          node[g] = ml_collections.ConfigDict()
        node = node[g]
        if not isinstance(node, ml_collections.ConfigDict):
          raise ValueError(f"config.{'.'.join(groups[:i + 1])}={node!r}: a group of fields "
                           f"is needed here (it holds config.{path})")
      if name not in node:
        node[name] = value
  return out


def _validate_diagnostics(config) -> None:
  """``config.diagnostics``."""
  d = config.diagnostics
  fields.require_int("diagnostics.every", d.every, 0, "must be an int >= 0 (0: no diagnostics)")
  fields.require_int("diagnostics.num_rows", d.num_rows, 2,
                     "must be an int >= 2 (I(X;Z) compares replies across prompts)")
  for _, floor in stats.ALERT_FLOORS:
    v = d[floor]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
      raise fields.bad(f"diagnostics.{floor}", v, "must be a finite float >= 0 (0: no alert)")


@dataclasses.dataclass(frozen=True, eq=False)
class RunSpec:
  """What a run's config means, built once: every jagent dataclass and the objective.

  Built by :meth:`from_config`, which names the first bad config field
  before anything compiles. Holds no arrays, devices, tokenizer or env.

  Attributes:
    config: the config, upgraded (:func:`upgrade`).
    num_devices: the devices ``config.mesh`` uses (1 without a mesh).
    model: the policy's ModelConfig (``config.model`` or ``config.model_dir``'s
      ``config.json``, with ``remat``, ``compute_dtype``, ``attention_impl``
      and ``cache_dtype`` set).
    prompt: the PromptConfig (``config.prompt``).
    rollout: the train rollout's RolloutConfig (``config.rollout``).
    lora: the LoRA adapters' LoraConfig, or None when off.
    lora_base_dtype: the dtype the frozen LoRA base is stored in, or None.
    filter: the run's one uncertainty filter (``config.rl.filter_*``, with
      the objective's ``include_zero=False`` kept: ``jagent.train.iteration_filter``).
    objective: ``config.algorithm``'s objective.
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
    config = upgrade(config)
    if config.env not in envs_jax.registered():
      raise fields.bad("env", config.env, f"not a registered environment; known: "
                       f"{sorted(envs_jax.registered())}")
    if config.algorithm not in transforms.registered():
      raise fields.bad("algorithm", config.algorithm,
                       f"unknown; known: {sorted(transforms.registered())}")
    if not config.tokenizer and not config.model_dir:
      raise fields.bad("tokenizer", config.tokenizer,
                       "empty means the model_dir's tokenizer, but config.model_dir is empty too "
                       "(pass --config.model_dir=<a Hugging Face model directory>)")
    if config.model not in models.config_names() and not config.model_dir:
      raise fields.bad("model", config.model, f"unknown; known: {models.config_names()}")
    model = blocks.model_config(config, read_model_dir)
    prompt = blocks.prompt_config(config)
    r = blocks.rollout_config(config)
    obj = hyperparameters.objective(config)
    # Group-relative advantages (GRPO, RLOO, GiGPO, ...) are all 0 with one
    # rollout a group: such a run would train nothing.
    if obj.needs.groups and r.group_size < 2:
      raise fields.bad("rollout.group_size", r.group_size,
                       f"the objective {config.algorithm!r} compares the rollouts of a group, so "
                       "with one rollout a group every advantage is 0 and nothing is learned; set "
                       "config.rollout.group_size >= 2")
    for field in ("rl.steps", "sft.steps", "eval.every", "eval.samples"):
      fields.require_int(field, fields.config_field(config, field), 0, "must be an int >= 0")
    fc = blocks.filter_config(config)
    if config.rl.critic not in train.CRITIC_KINDS:
      raise fields.bad("rl.critic", config.rl.critic, f"unknown; known: {train.CRITIC_KINDS}")
    num_keep = r.num_groups
    if fc.fixed_count:
      try:
        num_keep = train.num_kept_groups(r.num_groups, fc)
      except ValueError as e:
        raise fields.bad("rl.filter_value", config.rl.filter_value, str(e)) from None
      if num_keep < 1:
        raise fields.bad("rl.filter_value", config.rl.filter_value,
                         f"keeps no group of rollout.num_groups={r.num_groups}")
    rows = num_keep * r.group_size
    micro = config.rl.num_microbatches
    # -1 (one row per device) is resolved once the mesh is checked, below.
    tc = blocks.train_config(config, model, 1 if micro == -1 else micro)
    if rows % config.rl.num_minibatches:
      raise fields.bad(
          "rl.num_minibatches", config.rl.num_minibatches,
          f"does not divide the {rows} trained rows per step (kept groups x group_size)")
    if micro > 0 and (rows // config.rl.num_minibatches) % micro:
      raise fields.bad(
          "rl.num_microbatches", config.rl.num_microbatches,
          f"does not divide the {rows // config.rl.num_minibatches} rows of a minibatch "
          f"({rows} trained rows / rl.num_minibatches={config.rl.num_minibatches})")
    # config.sft.expert is make_expert's policy.
    if config.sft.expert not in rollout.EXPERT_POLICIES:
      raise fields.bad("sft.expert", config.sft.expert,
                       f"unknown; known: {rollout.EXPERT_POLICIES}")
    fields.require_int("sft.expert_max_nodes", config.sft.expert_max_nodes, 1,
                       "must be an int >= 1")
    sft = blocks.sft_optimizer(config) if config.sft.steps else None
    # At most rows_per_episode SFT rows a demonstration (sft_batch_indices
    # checks the turns taken).
    sft_rows = config.sft.num_demos * r.rows_per_episode
    if config.sft.steps and config.sft.batch_size > sft_rows:
      raise fields.bad(
          "sft.batch_size", config.sft.batch_size,
          f"is larger than the {sft_rows} rows of sft.num_demos={config.sft.num_demos}")
    if config.sft.steps and not 1 <= config.sft.actions_per_turn <= (
        config.prompt.max_actions_per_turn):
      raise fields.bad("sft.actions_per_turn", config.sft.actions_per_turn,
                       f"must be in [1, prompt.max_actions_per_turn="
                       f"{config.prompt.max_actions_per_turn}]")
    blocks.eval_rollout_config(config)  # eval.num_groups, eval.temperature
    # A stand-in model (no model directory read) has no modules to check.
    lora = blocks.lora_config(config, model if read_model_dir or not config.model_dir else None)
    base_dtype = blocks.lora_base_dtype(config)
    _validate_diagnostics(config)
    fields.require_int(
        "checkpoint.every", config.checkpoint.every, 0,
        "must be an int >= 0 (0: a checkpoint after SFT and after the last step only)")
    fields.require_int("checkpoint.keep", config.checkpoint.keep, 1, "must be an int >= 1")
    fields.require_int("rl.empty_stop_steps", config.rl.empty_stop_steps, 0,
                       "must be an int >= 0 (stop after that many consecutive steps that trained "
                       "nothing; 0: never)")
    fields.require_int("eval.num_levels", config.eval.num_levels, 1, "must be an int >= 1")
    if config.eval.num_levels % config.eval.num_groups:
      raise fields.bad("eval.num_levels", config.eval.num_levels,
                       f"must be a multiple of eval.num_groups={config.eval.num_groups}")
    n_dev, rows_per_device = _validate_mesh(config, num_devices, num_keep)
    if micro == -1:  # one row per device (data x fsdp) in each micro-batch
      tc = tc.replace(num_microbatches=rows // config.rl.num_minibatches // rows_per_device)
    # The run's one filter (rl.filter_*) replaces the objective's own, as
    # train.rl_iteration resolves it.
    fc = train.iteration_filter(obj, fc)
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
    raise fields.bad("mesh", mesh, f"{e} (the mesh must use {n_dev} devices; jax sees "
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
      raise fields.bad("mesh", mesh, f"splits batch rows data x fsdp = {n} ways, which does not "
                       f"divide the {b} rows of {name}")
  return n_dev, n


def trained_reset_keys(config) -> jax.Array:
  """Typed PRNG keys of the levels the run of ``config`` trains on: its RL steps' and SFT's.

  RL step ``s`` resets ``rollout.num_groups`` levels from
  ``fold_in(key(seed + 2), s)`` (:meth:`experiments.experiment.Experiment.rl_key`); a solver's
  demonstrations ``sft.num_demos`` from ``fold_in(key(seed), 1)``
  (:meth:`experiments.experiment.Experiment.demonstrations`; a random expert plays no level to the
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
      base = upgrade(base)
    except (OSError, ValueError):  # none there, or not a run's config
      break
    out.append((path, base))
    config = base
  return out
