"""A configured run: :class:`Experiment`, and the jitted programs runs share.

An :class:`Experiment` takes a config's :class:`experiments.spec.RunSpec`
(every bad field named before anything compiles), builds the game,
tokenizer, model, rollouts and objective, and runs the stages: SFT, RL
steps, evaluation, checkpoints. ``experiments/train.py`` and
``experiments/eval.py`` run it.

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

import functools
import math
import os
import time

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from experiments import blocks
from experiments import fields
from experiments import programs
from experiments import spec
from experiments import stats
from jagent import models
from jagent import rollout
from jagent import sharding
from jagent import tokenizers
from jagent import train
from jagent import transforms


class Experiment:
  """A configured run (see the module docstring).

  Args:
    config: the run's config (``experiments/configs/*.py``), or its
      :class:`experiments.spec.RunSpec` (:attr:`spec`; :attr:`config` holds the config
      upgraded, :func:`experiments.spec.upgrade`).
    devices: the devices of ``config.mesh`` (default ``jax.devices()``,
      every process's; with ``config.mesh=""`` the default device). E.g.
      the first N of 8 for a scaling benchmark in one process.

  Raises:
    ValueError: from :meth:`experiments.spec.RunSpec.from_config` (a bad
      ``config.mesh``, or one that does not use exactly ``devices`` or does
      not divide the batch rows, named as ``config.mesh``), a
      ``config.model_dir`` without a ``config.json``, or when the context
      cannot hold a turn
      (``rollout.max_tokens_per_turn`` etc.); all before anything compiles.
  """

  def __init__(self, config, devices=None):
    devices = None if devices is None else list(devices)
    if isinstance(config, spec.RunSpec):
      self.spec = config
      if devices is not None and config.config.mesh and config.num_devices != len(devices):
        raise ValueError(f"a RunSpec built for {config.num_devices} devices run on "
                         f"{len(devices)}")
    else:
      self.spec = spec.RunSpec.from_config(config, None if devices is None else len(devices))
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
    random_base = blocks.lora_base_warning(c)
    if random_base:
      logging.warning(random_base)
    r = c.rollout
    self.rollout_config = s.rollout
    self.context_size = rollout.context_size(self.text_env, self.rollout_config)
    if self.context_size > self.model_config.max_position:
      raise fields.bad("rollout.max_tokens_per_turn", r.max_tokens_per_turn,
                       f"rollout.max_turns={r.max_turns} turns of it need {self.context_size} "
                       f"tokens of context; the model has {self.model_config.max_position} "
                       "positions")
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

    A key for :func:`experiments.programs.shared_program`: runs that agree on the fields a
    program reads can share it.
    """
    if fields is not None:
      return programs.fields_json(self.config, fields)
    if self._signature is None:
      unseeded = self.config.copy_and_resolve_references()
      unseeded.seed = 0
      self._signature = unseeded.to_json_best_effort(sort_keys=True)
    return self._signature

  # ------------------------------------------------------------------ rollouts
  def _rollout_config(self, kind: str, temperature: float | None) -> rollout.RolloutConfig:
    if kind == "train":
      return self.rollout_config
    return blocks.eval_rollout_config(self.config, temperature=temperature,
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

    return programs.shared_program(
        ("rollout", self.signature(programs.ROLLOUT_FIELDS), kind, temperature), build)

  def eval_program(self, kind: str, temperature: float | None = None):
    """``jagent.sharding.shard_eval_program`` of :meth:`rollout_fn` on :attr:`mesh`."""
    if temperature is None:
      temperature = self.config.eval.temperature
    return programs.shared_program(
        ("eval_program", self.signature(programs.ROLLOUT_FIELDS), kind, temperature,
         self._devices_key),
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

    The base is stored in ``config.lora.base_dtype`` (:func:`experiments.blocks.lora_base_dtype`).
    """
    if self.lora_config is None:
      return base
    dtype = blocks.lora_base_dtype(self.config)
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
    optimizer = ((self.spec.sft_optimizer if learning_rate is None else None)
                 or blocks.sft_optimizer(self.config, learning_rate))
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
      raise fields.bad("sft.batch_size", c.sft.batch_size,
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
    step_fn = programs.shared_program(
        ("sft_step", self.signature(programs.SFT_FIELDS), self._devices_key),
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
    ``lax.cond`` on :func:`experiments.stats.diagnostics_due` of ``state.step``: on the other
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
          stats.diagnostics_due(state.step, every), lambda: compute(state, traj, key),
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
    :func:`experiments.stats.diagnostics_due`. What this step did not measure (NaN) is left
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

    fn = programs.shared_program(("rl_iteration", self.signature(), self._devices_key), build)
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

    This run's own (SFT demonstrations, RL steps: :func:`experiments.spec.trained_reset_keys`)
    and, when its base (``config.model_dir``) was exported by a run of
    ``experiments.train`` on the same env, that run's too, and its base's
    (:func:`experiments.spec.base_runs`): a LoRA run's base saw those levels, so they are not
    held out for it either. Sets :attr:`held_out_base_runs` to the base
    runs' ``config.json`` paths whose levels were added.
    """
    keys = [spec.trained_reset_keys(self.config)]
    self.held_out_base_runs = []
    for path, base in spec.base_runs(self.config):
      keys.append(spec.trained_reset_keys(base))
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
    (:meth:`experiments.spec.trained_reset_keys`, :meth:`held_out_keys`;
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
    """``{"greedy_success", "greedy_score"}`` of a greedy evaluation, or ``{}``.

    ``{}`` without ``eval.greedy``.
    """
    if not self.config.eval.greedy:
      return {}
    g, _ = self._evaluate(params, "eval_greedy")
    return {"greedy_success": g["success"], "greedy_score": g["score"]}

  def success_intervals(self, metrics: dict) -> dict:
    """``{"success_ci95": [lo, hi], "greedy_success_ci95": ...}`` of an evaluation's rates.

    The 95% Wilson intervals (:func:`experiments.stats.wilson_interval`) over the
    ``eval.num_levels`` levels (one episode each) of ``success`` and, when in
    ``metrics``, ``greedy_success``.
    """
    return {f"{k}_ci95": list(stats.wilson_interval(float(metrics[k]), self.config.eval.num_levels))
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
      raise fields.ConfigError(
          f"--workdir={workdir}: {e}. Remove {ckpt.directory} to start the run over (its "
          "config.json stays), or pass a new --workdir.") from e
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
