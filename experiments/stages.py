"""A run's stage programs, built once from its spec (PureJaxRL's ``make_train``).

:func:`make_stages` turns an :class:`experiments.spec.RunSpec` into a
:class:`Stages`: the run's pieces (game, tokenizer, text env) and pure,
unjitted functions of arrays, K steps at a time (``jax.lax.scan`` over the
leading axis of their inputs)::

  st = make_stages(run_spec)
  state, m = jax.jit(st.rl_chunk)(state, keys)          # keys [K]: K RL iterations
  states, m = jax.jit(jax.vmap(st.rl_chunk))(states, keys)  # R runs [R, K]

They are the one implementation of the stages: ``experiments.experiment``
jits them on the run's mesh (``experiments.train`` runs them K steps a call)
and ``experiments.sweep`` batches them over runs (:func:`over_runs`), as
PureJaxRL's ``jax.jit(jax.vmap(make_train(config)))(keys)``
(https://github.com/luchris429/purejaxrl). A program depends only on the
spec, so programs are shared by the runs whose specs agree where it reads
(:attr:`Stages.keys`, the keys of :func:`experiments.programs.shared_program`;
e.g. runs that differ only in the seed: keys are arguments).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
import jagent
from experiments import blocks
from experiments import fields
from experiments import hyperparameters
from experiments import programs
from experiments import spec as spec_lib
from experiments import stats
from jagent import models
from jagent import rollout
from jagent import sharding
from jagent import tokenizers
from jagent import train
from jagent import transforms

# Config fields that enter the chunks as values (``hparams``): a sweep vmaps them.
SWEEPABLE = ("rl.learning_rate", "rl.critic_learning_rate", "sft.learning_rate")
# SFT writes its metrics every this many steps (and at its last).
SFT_LOG_EVERY = 50
ROLLOUT_KINDS = ("train", "eval_temp", "eval_greedy")


@dataclasses.dataclass(frozen=True, eq=False)
class Stages:
  """The stage programs of one spec (see the module docstring).

  Attributes:
    spec: the :class:`experiments.spec.RunSpec`.
    env, env_params: the game (``envs_jax.make(config.env)``).
    tokenizer: the run's tokenizer (``config.tokenizer``).
    text_env: the game, tokenizer and prompt (``jagent.rollout.TextEnv``).
    context_size: S, the tokens of a training row.
    keys: hashable keys of the programs, by what they read from the spec:
      ``"sft"`` (the SFT chunk), ``"rl"`` (the RL chunk) and ``"mesh"``
      (the mesh's shape and devices, or None).
    init_sft_state: ``(params, key) -> TrainState`` of SFT (actor only).
    init_rl_state: ``(params, key) -> TrainState`` of RL (with the critic
      and the reference the objective needs).
    sft_chunk: ``(state, demos, indices, hparams=None) -> (state, metrics)``:
      K :func:`jagent.train.sft_update` steps; ``demos`` a
      ``transforms.Batch`` of the demonstrations (``tokens`` int32 and
      ``loss_mask`` float32 ``[D, S]``), ``indices`` int ``[K, B]`` the rows of
      each step; metrics float32 ``[K]`` each. (The minibatches are
      gathered inside the program: a chunk holds the demonstrations once,
      not K minibatches.)
    rl_chunk: ``(state, keys, hparams=None) -> (state, metrics)``: K
      :func:`jagent.train.rl_iteration` iterations (rollout -> filter ->
      advantages -> updates), one per typed PRNG key of ``keys [K]``;
      metrics float32 ``[K]`` each (with ``collapse/*``, NaN off the
      diagnosed steps, when built with diagnostics and
      ``config.diagnostics.every``).
    eval_chunk: ``(params, key, reset_keys, *, greedy=False,
      temperature=None) -> (Trajectory, metrics)``: one evaluation chunk
      (:func:`jagent.train.eval_program`) of ``eval.num_groups`` levels
      ``reset_keys [eval.num_groups]``; ``greedy`` and ``temperature``
      (default ``eval.temperature``) are static.
    rollout: ``(kind, temperature=None) -> rollout_fn``: the jitted
      :func:`jagent.rollout.make_rollout` of ``kind`` (:data:`ROLLOUT_KINDS`),
      shared by the specs of the same :attr:`rollout_key`.
    rollout_key: ``(kind, temperature=None) -> key`` of that rollout.
    rollout_config: ``(kind, temperature=None) -> RolloutConfig``; these
      three raise ValueError for a kind not in :data:`ROLLOUT_KINDS`.
    sft_config, rl_config: ``(hparams=None) -> TrainConfig`` of the SFT and
      RL chunks.

  ``hparams``: a dict from fields of :data:`SWEEPABLE` to float32 scalars
  that replace the config's (traced under ``vmap``: a learning-rate sweep);
  None or ``{}``: the config's.
  """
  spec: spec_lib.RunSpec
  env: Any
  env_params: Any
  tokenizer: Any
  text_env: rollout.TextEnv
  context_size: int
  keys: dict
  init_sft_state: Callable
  init_rl_state: Callable
  sft_chunk: Callable
  rl_chunk: Callable
  eval_chunk: Callable
  rollout: Callable
  rollout_key: Callable
  rollout_config: Callable
  sft_config: Callable
  rl_config: Callable


def mesh_key(mesh: jax.sharding.Mesh | None) -> tuple | None:
  """A hashable key of ``mesh``: its axis sizes and device ids (None: no mesh)."""
  if mesh is None:
    return None
  return (tuple(mesh.shape.items()), tuple(d.id for d in mesh.devices.flat))


def _with_lr(config: train.TrainConfig, which: str, lr) -> train.TrainConfig:
  opt = getattr(config, which)
  return config.replace(**{which: dataclasses.replace(opt, learning_rate=lr)})


def make_stages(run_spec: spec_lib.RunSpec, *, mesh: jax.sharding.Mesh | None = None,
                diagnostics: bool = True) -> Stages:
  """The :class:`Stages` of ``run_spec``.

  Args:
    run_spec: the run's :class:`experiments.spec.RunSpec`.
    mesh: the device mesh the chunks will be jitted on: the row arrays inside
      them (rollout, kept rows, SFT minibatches) are constrained to ``data x
      fsdp`` (:func:`jagent.sharding.rows_constraint`). None: no constraint
      (one device, or ``vmap``).
    diagnostics: run RAGEN-2's collapse diagnostics in :attr:`Stages.rl_chunk`
      when ``config.diagnostics.every`` > 0 (:func:`diagnostics_hook`).
      Under ``vmap`` its ``lax.cond`` on the batched step runs every step,
      so a sweep leaves it out.

  Returns:
    the :class:`Stages`; nothing is compiled.

  Raises:
    ConfigError: the context cannot hold ``rollout.max_turns`` turns of
      ``rollout.max_tokens_per_turn`` (naming that field); a tokenizer
      directory without a ``tokenizer.json`` (from the tokenizer).
  """
  s = run_spec
  c = s.config
  r = c.rollout
  # "tiny": the shipped sentencepiece model; "": the model directory's
  # tokenizer.json; else a directory holding a tokenizer.json.
  tokenizer = (tokenizers.load_tiny_tokenizer() if c.tokenizer == "tiny"
               else tokenizers.HFTokenizer(c.tokenizer or c.model_dir))
  env, env_params = envs_jax.make(c.env)
  text_env = rollout.TextEnv(env, tokenizer, s.prompt, env_params=env_params)
  context = rollout.context_size(text_env, s.rollout)
  if context > s.model.max_position:
    raise fields.bad("rollout.max_tokens_per_turn", r.max_tokens_per_turn,
                     f"rollout.max_turns={r.max_turns} turns of it need {context} "
                     f"tokens of context; the model has {s.model.max_position} positions")
  on_rows = (lambda tree: tree) if mesh is None else sharding.rows_constraint(mesh)
  text_key = (c.env, c.tokenizer, "" if c.tokenizer else c.model_dir, s.prompt, s.model)

  def rollout_config(kind: str, temperature: float | None = None) -> rollout.RolloutConfig:
    if kind not in ROLLOUT_KINDS:
      raise ValueError(f"rollout kind {kind!r}: must be one of {ROLLOUT_KINDS}")
    if kind == "train":  # samples at rollout.temperature
      return s.rollout
    return blocks.eval_rollout_config(
        c, temperature=c.eval.temperature if temperature is None else temperature,
        greedy=kind == "eval_greedy", context_size=context)

  def rollout_key(kind: str, temperature: float | None = None) -> tuple:
    return ("rollout", text_key, rollout_config(kind, temperature))

  def rollout_fn(kind: str, temperature: float | None = None):
    rc = rollout_config(kind, temperature)
    return programs.shared_program(
        rollout_key(kind, temperature),
        lambda: rollout.make_rollout(text_env, s.model, rc, env_params))

  def sft_config(hparams=None) -> train.TrainConfig:
    lr = (hparams or {}).get("sft.learning_rate")
    optimizer = ((s.sft_optimizer if lr is None else None) or blocks.sft_optimizer(c, lr))
    return train.TrainConfig(model=s.model, actor_optimizer=optimizer)

  def rl_config(hparams=None) -> train.TrainConfig:
    hparams = hparams or {}
    cfg = s.train
    if "rl.learning_rate" in hparams:
      cfg = _with_lr(cfg, "actor_optimizer", hparams["rl.learning_rate"])
    if "rl.critic_learning_rate" in hparams:
      cfg = _with_lr(cfg, "critic_optimizer", hparams["rl.critic_learning_rate"])
    return cfg

  def init_sft_state(params, key):
    return train.init_train_state(params, key, config=sft_config())

  needs = s.objective.needs

  def init_rl_state(params, key):
    return train.init_train_state(
        params, key, config=s.train, critic=c.rl.critic if needs.critic else None,
        reference=needs.reference, objective=s.objective)

  def sft_chunk(state, demos: transforms.Batch, indices, hparams=None):
    tc = sft_config(hparams)

    def body(st, idx):
      mb = on_rows(transforms.Batch(tokens=demos.tokens[idx], loss_mask=demos.loss_mask[idx]))
      return train.sft_update(st, mb, config=tc)

    return jax.lax.scan(body, state, indices)

  hook = diagnostics_hook(s, tokenizer, text_env) if diagnostics else None

  def rl_chunk(state, keys, hparams=None):
    cfg = rl_config(hparams)
    roll = rollout_fn("train")

    def body(st, key):
      return train.rl_iteration(st, key, rollout_fn=roll, objective=s.objective, config=cfg,
                                num_keep=s.num_keep, filter_config=s.filter,
                                rows_constraint=on_rows, diagnostics=hook)

    return jax.lax.scan(body, state, keys)

  def eval_chunk(params, key, reset_keys, *, greedy: bool = False,
                 temperature: float | None = None):
    roll = rollout_fn("eval_greedy" if greedy else "eval_temp", temperature)
    return train.eval_program(roll)(params, key, reset_keys)

  state_key = (s.model, s.lora, s.lora_base_dtype)
  mk = mesh_key(mesh)
  objective_key = (c.algorithm, json.dumps(hyperparameters.objective_kwargs(c), sort_keys=True,
                                           default=repr), s.filter, s.num_keep)
  d = c.diagnostics
  keys = {
      "mesh": mk,
      "sft": ("sft", state_key, s.sft_optimizer, mk),
      "rl": ("rl", rollout_key("train"), state_key, objective_key, s.train,
             c.rl.critic if needs.critic else None,
             (d.every, d.num_rows) if hook is not None else None, mk),
  }
  return Stages(spec=s, env=env, env_params=env_params, tokenizer=tokenizer, text_env=text_env,
                context_size=context, keys=keys, init_sft_state=init_sft_state,
                init_rl_state=init_rl_state, sft_chunk=sft_chunk, rl_chunk=rl_chunk,
                eval_chunk=eval_chunk, rollout=rollout_fn, rollout_key=rollout_key,
                rollout_config=rollout_config, sft_config=sft_config, rl_config=rl_config)


def diagnostics_hook(run_spec: spec_lib.RunSpec, tokenizer, text_env: rollout.TextEnv):
  """The RL iteration's ``diagnostics`` hook (``config.diagnostics``), or None when off.

  ``hook(state, traj, key)`` runs :func:`jagent.train.collapse_metrics`
  (RAGEN-2's reply entropy and prompt-reply mutual information;
  ``diagnostics.num_rows`` pairs; the rollout's temperature and reply bound;
  the format of ``prompt.think`` left out of Z) under a ``lax.cond`` on
  :func:`experiments.stats.diagnostics_due` of ``state.step``: on the other
  steps it costs nothing and returns NaNs (not measured; MetricsWriter
  leaves them out).
  """
  c = run_spec.config
  every = c.diagnostics.every
  if not every:
    return None
  d = c.diagnostics
  rc = run_spec.rollout
  prompt = rollout.first_reply_prompt_tokens(text_env, rc)

  def compute(state, traj, key):
    return train.collapse_metrics(
        state.params, traj, key, config=run_spec.model, num_rows=d.num_rows,
        temperature=rc.temperature, reply_tokens=rc.max_tokens_per_turn,
        prompt_tokens=prompt, token_table=tokenizer.token_bytes(),  # read when traced
        think=run_spec.prompt.think)

  def hook(state, traj, key):
    shapes = jax.eval_shape(compute, state, traj, key)
    return jax.lax.cond(
        stats.diagnostics_due(state.step, every), lambda: compute(state, traj, key),
        lambda: jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan, x.dtype), shapes))

  return hook


# ------------------------------------------------------------------- chunking
def chunk_steps(config, steps: int | None = None) -> int:
  """RL steps per call of a sweep's RL program: ``steps`` (> 0), else ``eval.every``, else a tenth.

  Between calls the sweep prints its progress; the runs' results do not
  depend on it (each call scans the same iteration over the next keys).

  Raises:
    ConfigError: ``steps`` not None and not an int >= 0.
  """
  if steps is not None:
    jagent.check_int("--chunk_steps", steps, 0, error=fields.ConfigError,
                     why="must be an int >= 0 (0: eval.every, else a tenth of rl.steps)")
  if steps:
    return steps
  return config.eval.every or max(1, math.ceil(config.rl.steps / 10))


def train_chunk(config, steps: int | None = None) -> int:
  """RL steps per call of ``experiments.train``'s RL program (before :func:`chunk_end`'s cuts).

  ``steps`` (> 0), else the greatest common divisor of the nonzero
  ``eval.every``, ``checkpoint.every`` and ``diagnostics.every`` (so that
  every chunk ends on an evaluation, checkpoint and diagnosed step), else
  :func:`chunk_steps`. The results do not depend on it.

  Raises:
    ConfigError: ``steps`` not None and not an int >= 0.
  """
  if steps is not None:
    jagent.check_int("--chunk_steps", steps, 0, error=fields.ConfigError,
                     why="must be an int >= 0 (0: the evaluation/checkpoint interval)")
  if steps:
    return steps
  every = [e for e in (config.eval.every, config.checkpoint.every, config.diagnostics.every) if e]
  return math.gcd(*every) if every else chunk_steps(config)


def chunk_end(config, start: int, chunk: int, empty_streak: int = 0) -> int:
  """One past the last RL step of the chunk that starts at step ``start`` (0-based).

  At most ``chunk`` steps, cut at ``rl.steps`` and at the next multiple of
  each nonzero ``eval.every``, ``checkpoint.every`` and
  ``diagnostics.every`` (the host evaluates, checkpoints and warns there),
  and, with ``rl.empty_stop_steps`` N > 0, after ``N - empty_streak`` steps
  (``empty_streak``: the steps in a row before ``start`` that trained
  nothing), so that a run can only stop at a chunk's last step.
  """
  end = min(start + chunk, config.rl.steps)
  for every in (config.eval.every, config.checkpoint.every, config.diagnostics.every):
    if every:
      end = min(end, (start // every + 1) * every)
  if config.rl.empty_stop_steps:
    end = min(end, start + max(1, config.rl.empty_stop_steps - empty_streak))
  return max(end, start + 1)


def sft_chunk_end(config, start: int, chunk: int | None = None) -> int:
  """One past the last SFT step of the chunk that starts at ``start`` (0-based).

  At most ``chunk`` steps (None or 0: ``gcd(SFT_LOG_EVERY, sft.steps)``),
  cut at ``sft.steps`` and at the next multiple of :data:`SFT_LOG_EVERY`
  (the steps whose metrics are written).
  """
  steps = config.sft.steps
  chunk = chunk or math.gcd(SFT_LOG_EVERY, steps)
  return max(start + 1, min(start + chunk, steps, (start // SFT_LOG_EVERY + 1) * SFT_LOG_EVERY))


def step_records(metrics: dict, seconds: float) -> list[dict]:
  """The per-step float records of an RL chunk's stacked metrics.

  Args:
    metrics: :attr:`Stages.rl_chunk`'s metrics on the host, each ``[K]``.
    seconds: the chunk's wall time (the metrics' transfer included).

  Returns:
    K dicts of floats: the step's metrics, less what it did not measure (NaN):
    ``collapse/*`` off the diagnosed steps (or without a valid pair), and
    the update metrics of a step whose filter kept no group
    (``train/updates_applied`` 0: a mean over nothing); a non-finite value
    of a step that did update stays (a diverging loss must show). Plus
    ``time/step_seconds`` (``seconds / K``: the steps of one program are not
    timed apart) and the throughput per second of it:
    ``throughput/rollout_tokens_per_s`` (sampled tokens),
    ``throughput/env_turns_per_s`` and ``throughput/train_tokens_per_s``
    (trained context tokens, padding included).
  """
  k = len(next(iter(metrics.values())))
  sec = seconds / k
  out = []
  for i in range(k):
    m = {name: float(v[i]) for name, v in metrics.items()}
    trained = m["train/updates_applied"] > 0
    m = {name: v for name, v in m.items()
         if math.isfinite(v) or (trained and not name.startswith("collapse/"))}
    m["time/step_seconds"] = sec
    m["throughput/rollout_tokens_per_s"] = m["rollout/sampled_tokens"] / sec
    m["throughput/env_turns_per_s"] = m["rollout/env_turns"] / sec
    m["throughput/train_tokens_per_s"] = m["train/context_tokens"] / sec
    out.append(m)
  return out


# ------------------------------------------------------------ batching runs
BATCHINGS = ("vmap", "map")


def over_runs(fn, batching: str, in_axes: tuple[int | None, ...]):
  """``fn`` over a leading run axis of the arguments whose ``in_axes`` is 0.

  ``"vmap"``: ``jax.vmap`` (the runs in parallel, PureJaxRL style).
  ``"map"``: ``jax.lax.map`` (the runs one after the other inside the same
  program: each computes exactly as a separate run, whose unbatched
  operations round the same way).

  Raises:
    ConfigError: an unknown ``batching``.
  """
  if batching not in BATCHINGS:
    raise fields.ConfigError(f"--batching={batching!r}: must be one of {BATCHINGS}")
  if batching == "vmap":
    return jax.vmap(fn, in_axes=in_axes)

  def mapped(*args):
    per_run = tuple(a for a, ax in zip(args, in_axes) if ax == 0)

    def one(xs):
      it = iter(xs)
      return fn(*(next(it) if ax == 0 else a for a, ax in zip(args, in_axes)))

    return jax.lax.map(one, per_run)

  return mapped


def stack_runs(trees):
  """One pytree per run -> one pytree with a leading run axis R."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _same_arrays(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return (jax.tree.structure(a) == jax.tree.structure(b)
          and all(x is y or np.array_equal(x, y) for x, y in zip(la, lb)))


def stack_sharing_bases(trees) -> tuple[object, list]:
  """Per-run trees -> ``(trainable, frozen)``: the runs share one frozen base.

  Each tree's LoRA bases (:func:`jagent.models.split_frozen`) are cut off;
  when every run's bases equal the first run's, ``trainable`` is the stack
  of the cut trees (leading run axis R) and ``frozen`` the first run's bases
  (no run axis): :func:`jagent.models.join_frozen` of one run's slice and
  ``frozen`` is that run's tree. Otherwise (no LoRA, or bases that differ)
  ``(stack_runs(trees), [])``: each run keeps its own.
  """
  parts = [models.split_frozen(t) for t in trees]
  frozen = parts[0][1]
  if not frozen or not all(_same_arrays(f, frozen) for _, f in parts[1:]):
    return stack_runs(trees), []
  return stack_runs([t for t, _ in parts]), frozen


def join(tree, frozen):
  """``tree`` with the shared bases put back (as is when there are none)."""
  return models.join_frozen(tree, frozen) if frozen else tree


def cut(tree, frozen):
  """``tree`` without the shared bases (inverse of :func:`join`)."""
  return models.split_frozen(tree)[0] if frozen else tree
