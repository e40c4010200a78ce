"""A configured run: :class:`Experiment`, the run-level glue around its stage programs.

An :class:`Experiment` takes a config's :class:`experiments.spec.RunSpec`
(every bad field named before anything compiles), builds its
:class:`experiments.stages.Stages` (the game, tokenizer, rollouts, and the
pure SFT, RL and evaluation programs) and runs them on the run's device
mesh, with what is the run's own: initial parameters, demonstrations and
keys, evaluation bookkeeping (held-out levels, samples), checkpoints and
export. ``experiments/train.py`` and ``experiments/eval.py`` run it.

Every run lives on a device mesh: ``config.mesh`` (``jagent.sharding.make_mesh``,
e.g. ``"data:8"`` or ``"data:2,fsdp:2,tensor:2"``; ``""``: a one-device mesh
of the default device, whose results equal an unsharded run's bit for bit).
The TrainStates live on ``jagent.sharding.train_state_shardings``, the SFT
and RL chunks (K steps a call) and the evaluation run jitted with explicit
in/out shardings (rows over ``data x fsdp``), and checkpoints restore onto those
shardings. The mesh may span processes (``jax.distributed.initialize`` first,
see ``experiments/train.py``): every process then runs the same program on
the same config, and only process 0 writes files other than checkpoints
(:attr:`Experiment.is_primary`).
"""

from __future__ import annotations

import functools
import os
import time

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import blocks
from experiments import fields
from experiments import programs
from experiments import spec
from experiments import stages
from experiments import stats
from jagent import models
from jagent import rollout
from jagent import sharding
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
    random_base = blocks.lora_base_warning(c)
    if random_base:
      logging.warning(random_base)
    # One code path for every run: config.mesh (validated by the spec), or a
    # one-device mesh of the default device (bit for bit an unsharded run).
    self.mesh = (sharding.make_mesh(c.mesh, devices) if c.mesh
                 else sharding.make_mesh("", jax.local_devices()[:1]))
    self.stages = st = stages.make_stages(s, mesh=self.mesh)
    self.tokenizer, self.env, self.env_params = st.tokenizer, st.env, st.env_params
    self.text_env, self.context_size = st.text_env, st.context_size
    self.prompt, self.model_config, self.lora_config = s.prompt, s.model, s.lora
    self.rollout_config, self.train_config = s.rollout, s.train
    self.filter_config, self.objective = s.filter, s.objective
    self.num_keep, self.needs = s.num_keep, s.objective.needs

  @property
  def is_primary(self) -> bool:
    """Whether this process writes the run's files (process 0; checkpoints: all)."""
    return jax.process_index() == 0

  def param_shardings(self):
    """The policy's NamedShardings on :attr:`mesh` (``Params`` structure)."""
    abstract = jax.eval_shape(lambda k: models.init(self.model_config, k), jax.random.key(0))
    return sharding.param_shardings(abstract, self.mesh)

  def rollout_fn(self, kind: str, temperature: float | None = None):
    """The jitted rollout: ``"train"``, ``"eval_temp"`` or ``"eval_greedy"``.

    ``temperature`` (eval kinds only) overrides ``config.eval.temperature``.
    :attr:`stages`' ``rollout``: shared by the Experiments of this process
    whose specs agree on what the rollout reads (built and compiled once);
    vmappable and nestable in other programs.
    """
    return self.stages.rollout(kind, None if kind == "train" else temperature)

  def eval_program(self, kind: str, temperature: float | None = None):
    """``jagent.sharding.shard_eval_program`` of :meth:`rollout_fn` on :attr:`mesh`."""
    return programs.shared_program(
        ("eval_program", self.stages.rollout_key(kind, temperature), self.stages.keys["mesh"]),
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
    return self.stages.sft_config(
        None if learning_rate is None else {"sft.learning_rate": learning_rate})

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

  def sft_state(self, params) -> train.TrainState:
    """The SFT TrainState starting from ``params``, on the mesh's shardings."""
    key = jax.random.key(self.config.seed)
    return sharding.place_state(lambda p: self.stages.init_sft_state(p, key), params,
                                mesh=self.mesh)

  def _on_mesh(self, name: str, fn, state, *args):
    """``fn(state, *args)`` jitted on :attr:`mesh`: the state on its shardings (donated),
    the other arguments and the outputs but the state replicated; shared by the
    Experiments whose stage ``name`` (:attr:`stages`' keys) agrees."""
    state_sh = sharding.train_state_shardings(state, self.mesh)
    rep = sharding.replicated(self.mesh)
    program = programs.shared_program(
        (name, self.stages.keys[name]),
        lambda: jax.jit(fn, in_shardings=(state_sh,) + (rep,) * len(args),
                        out_shardings=(state_sh, rep), donate_argnums=0))
    with sharding.activation_rules(self.mesh):
      return program(state, *args)

  def _replicated(self, tree):
    """Host arrays equal on every process as global arrays replicated on :attr:`mesh`."""
    rep = sharding.replicated(self.mesh)
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(rep, np.asarray(x), np.shape(x)), tree)

  def sft(self, writer, *, progress: bool = True, chunk: int | None = None):
    """Behaviour cloning on :meth:`demonstrations`; returns the params.

    Runs :attr:`stages`' ``sft_chunk`` on :attr:`mesh`, ``chunk`` steps a call
    (:func:`experiments.stages.sft_chunk_end`; the results do not depend on
    it), and writes the metrics of every :data:`experiments.stages.SFT_LOG_EVERY`-th
    step and the last at steps ``-sft.steps + step + 1``.
    """
    import tqdm  # pylint: disable=g-import-not-at-top
    c = self.config
    params = self.init_params()
    if not c.sft.steps:
      return params
    demos = self.demonstrations()
    batch_all = train.trajectory_batch(demos)
    state = self.sft_state(params)
    indices = self.sft_batch_indices(demos.row_valid)
    success = float(np.mean(demos.success))
    # Every process holds the demonstrations: placed once, replicated; each
    # step's rows are gathered inside the program.
    rows = self._replicated(transforms.Batch(
        tokens=np.asarray(batch_all.tokens, np.int32),
        loss_mask=np.asarray(batch_all.loss_mask, np.float32)))
    bar = tqdm.tqdm(total=c.sft.steps, disable=not progress, desc="SFT")
    start = 0
    while start < c.sft.steps:
      stop = stages.sft_chunk_end(c, start, chunk)
      state, m = self._on_mesh("sft", self.stages.sft_chunk, state, rows,
                               self._replicated(indices[start:stop].astype(np.int32)))
      m = jax.device_get(m)
      for i, step in enumerate(range(start, stop)):
        if (step + 1) % stages.SFT_LOG_EVERY == 0 or step + 1 == c.sft.steps:
          writer.write(-c.sft.steps + step + 1, {
              **{k: float(v[i]) for k, v in m.items()}, "sft/demo_success": success})
      bar.update(stop - start)
      start = stop
    bar.close()
    return state.params

  # ------------------------------------------------------------------------ RL
  def rl_state(self, params) -> train.TrainState:
    """The RL TrainState starting from ``params`` (critic/reference as needed)."""
    key = jax.random.key(self.config.seed + 1)
    return sharding.place_state(lambda p: self.stages.init_rl_state(p, key), params,
                                mesh=self.mesh)

  def rl_state_target(self):
    """A restore target of the RL TrainState (``Checkpointer.restore``) on :attr:`mesh`.

    See ``jagent.sharding.train_state_target``: nothing is allocated or
    loaded, and a checkpoint written on any mesh or device count restores
    onto this run's.
    """
    abstract = jax.eval_shape(
        lambda k: self.stages.init_rl_state(
            self.with_lora(models.init(self.model_config, k)), jax.random.key(0)),
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

  def rl_chunk(self, state, start: int, stop: int) -> tuple[train.TrainState, list[dict]]:
    """RL steps ``start .. stop - 1`` (0-based) as one jitted program on :attr:`mesh`.

    :attr:`stages`' ``rl_chunk`` (rollout, compaction by the filter, update,
    ``stop - start`` times, with the collapse diagnostics when
    ``config.diagnostics.every`` > 0) over the keys :meth:`rl_key` of those
    steps. The input ``state`` is donated.

    Returns:
      ``(state, records)``: one dict of floats per step,
      :func:`experiments.stages.step_records` of the chunk's metrics
      (``time/step_seconds``: the chunk's wall time over its steps).

    Raises:
      ValueError: ``stop <= start``.
    """
    if stop <= start:
      raise ValueError(f"rl_chunk: steps {start}..{stop}: stop must exceed start")
    keys = jnp.stack([self.rl_key(s) for s in range(start, stop)])
    t0 = time.perf_counter()
    state, m = self._on_mesh("rl", self.stages.rl_chunk, state, keys)
    m = jax.device_get(m)
    return state, stages.step_records(m, time.perf_counter() - t0)

  def rl_step(self, state, step: int):
    """RL step ``step`` alone: :meth:`rl_chunk` of one step; returns ``(state, metrics)``."""
    state, (m,) = self.rl_chunk(state, step, step + 1)
    return state, m

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
