"""What experiments/train.py and experiments/eval.py share: one Experiment object.

An :class:`Experiment` validates a config (every bad field named before
anything compiles), builds the game, tokenizer, model, rollouts and
objective, and runs the stages: SFT, RL steps, evaluation, checkpoints.

``config.mesh`` (``""``: one device) spreads a run over a device mesh
(``jagent.sharding.make_mesh``, e.g. ``"data:8"`` or
``"data:2,fsdp:2,tensor:2"``): the TrainStates live on
``jagent.sharding.train_state_shardings``, the SFT step, the RL iteration and
the evaluation rollouts run jitted with explicit in/out shardings (rows over
``data x fsdp``), and checkpoints restore onto those shardings. The mesh may
span processes (``jax.distributed.initialize`` first, see
``experiments/train.py``): every process then runs the same program on the
same config, and only process 0 writes files other than checkpoints
(:attr:`Experiment.is_primary`).
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

import envs_jax
from jagent import losses
from jagent import models
from jagent import rollout
from jagent import sharding
from jagent import tokenizers
from jagent import train
from jagent import transforms
from jagent._src import files
from jagent.losses import _filters
from jagent.train import _critic
from jagent.train import _rl


def setup_compilation_cache(path: str | None = None) -> None:
  """Persists XLA compilations across runs (``$JAX_COMPILATION_CACHE_DIR`` wins)."""
  path = os.environ.get("JAX_COMPILATION_CACHE_DIR") or path or os.path.join(
      os.path.expanduser("~"), ".cache", "jagent", "jax")
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# Jitted programs shared by the Experiments of one process whose configs
# differ only where the program does not look (e.g. the seed: keys are
# arguments), so that many runs of one config (experiments.sweep, its tests)
# trace and compile each program once. Least recently used dropped past 16.
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_MAX_PROGRAMS = 16
# The config fields a rollout program depends on.
ROLLOUT_FIELDS = ("env", "tokenizer", "model", "model_dir", "prompt", "rollout",
                  "eval.num_groups")


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


def _bad(field: str, value: Any, why: str) -> ValueError:
  return ValueError(f"config.{field}={value!r}: {why}")


def filter_config(config) -> losses.FilterConfig:
  """The run's uncertainty filter, from ``config.rl.filter_mode/filter_value/include_zero``.

  Raises:
    ValueError: from :class:`jagent.losses.FilterConfig`, naming the field.
  """
  rl = config.rl
  return losses.FilterConfig(rl.filter_mode, rl.filter_value, rl.include_zero)


def validate(config, num_devices: int | None = None) -> None:
  """Checks a train/eval config; raises ValueError naming the first bad field.

  ``num_devices`` is the device count ``config.mesh`` must use (default
  ``jax.device_count()``: every process's devices).
  """
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
  r = config.rollout
  for f in ("num_groups", "group_size", "max_turns", "max_tokens_per_turn",
            "max_actions_per_traj"):
    if not isinstance(r[f], int) or r[f] < 1:
      raise _bad(f"rollout.{f}", r[f], "must be an int >= 1")
  if not isinstance(config.rl.num_minibatches, int) or config.rl.num_minibatches < 1:
    raise _bad("rl.num_minibatches", config.rl.num_minibatches, "must be an int >= 1")
  micro = config.rl.get("num_microbatches", 1)
  if not isinstance(micro, int) or (micro < 1 and micro != -1):
    raise _bad("rl.num_microbatches", micro,
               "must be an int >= 1, or -1 (one row per device in each micro-batch)")
  if config.rl.filter_mode not in _filters.FILTER_MODES:
    raise _bad("rl.filter_mode", config.rl.filter_mode, f"unknown; known: {_filters.FILTER_MODES}")
  if config.rl.old_logprobs not in train.OLD_LOGPROBS:
    raise _bad("rl.old_logprobs", config.rl.old_logprobs,
               f"unknown; known: {train.OLD_LOGPROBS}")
  if config.rl.critic not in _critic.CRITIC_KINDS:
    raise _bad("rl.critic", config.rl.critic, f"unknown; known: {_critic.CRITIC_KINDS}")
  if config.rl.filter_mode in ("top_fraction", "top_k"):
    try:
      k = _rl.num_kept_groups(r.num_groups, filter_config(config))
    except ValueError as e:
      raise _bad("rl.filter_value", config.rl.filter_value, str(e)) from None
    if k < 1:
      raise _bad("rl.filter_value", config.rl.filter_value,
                 f"keeps no group of rollout.num_groups={r.num_groups}")
    rows = k * r.group_size
  else:
    rows = r.num_groups * r.group_size
  if rows % config.rl.num_minibatches:
    raise _bad("rl.num_minibatches", config.rl.num_minibatches,
               f"does not divide the {rows} trained rows per step (kept groups x group_size)")
  if micro > 0 and (rows // config.rl.num_minibatches) % micro:
    raise _bad("rl.num_microbatches", config.rl.num_microbatches,
               f"does not divide the {rows // config.rl.num_minibatches} rows of a minibatch "
               f"({rows} trained rows / rl.num_minibatches={config.rl.num_minibatches})")
  # config.sft.expert is make_expert's policy (absent in runs saved before it).
  if config.sft.get("expert", "solver") not in rollout.EXPERT_POLICIES:
    raise _bad("sft.expert", config.sft.expert, f"unknown; known: {rollout.EXPERT_POLICIES}")
  if config.sft.steps and config.sft.batch_size > config.sft.num_demos:
    raise _bad("sft.batch_size", config.sft.batch_size,
               f"is larger than sft.num_demos={config.sft.num_demos}")
  if config.sft.steps and not 1 <= config.sft.actions_per_turn <= (
      config.prompt.max_actions_per_turn):
    raise _bad("sft.actions_per_turn", config.sft.actions_per_turn,
               f"must be in [1, prompt.max_actions_per_turn="
               f"{config.prompt.max_actions_per_turn}]")
  for f in ("num_levels", "num_groups"):
    if not isinstance(config.eval[f], int) or config.eval[f] < 1:
      raise _bad(f"eval.{f}", config.eval[f], "must be an int >= 1")
  if config.eval.num_levels % config.eval.num_groups:
    raise _bad("eval.num_levels", config.eval.num_levels,
               f"must be a multiple of eval.num_groups={config.eval.num_groups}")
  _validate_mesh(config, num_devices)


def _validate_mesh(config, num_devices: int | None) -> None:
  """``config.mesh`` against the device count and the rows it must split.

  Without ``num_devices`` reads ``jax.device_count()`` (all processes'
  devices), so in a multi-process run call it after
  ``jax.distributed.initialize``.
  """
  spec = config.get("mesh", "")  # absent in runs saved before the field
  if not spec:
    return
  n_dev = jax.device_count() if num_devices is None else num_devices
  try:
    data, fsdp, _ = sharding.parse_mesh_spec(spec, n_dev)
  except ValueError as e:
    raise _bad("mesh", spec, f"{e} (the mesh must use {n_dev} devices; jax sees "
               f"{jax.device_count()} in {jax.process_count()} process(es))") from None
  n = data * fsdp
  r = config.rollout
  rows = [("rollout.num_groups x rollout.group_size", r.num_groups * r.group_size),
          ("eval.num_groups", config.eval.num_groups)]
  if config.sft.steps:
    rows.append(("sft.batch_size", config.sft.batch_size))
  if config.rl.get("num_microbatches", 1) == -1:
    kept = r.num_groups
    if config.rl.filter_mode in ("top_fraction", "top_k"):
      kept = _rl.num_kept_groups(r.num_groups, filter_config(config))
    rows.append(("a minibatch (rl.num_microbatches=-1: one row per device)",
                 kept * r.group_size // config.rl.num_minibatches))
  for name, b in rows:
    if b % n:
      raise _bad("mesh", spec, f"splits batch rows data x fsdp = {n} ways, which does not "
                 f"divide the {b} rows of {name}")


class Experiment:
  """A configured run (see the module docstring).

  Args:
    config: the run's config (``experiments/configs/*.py``).
    devices: the devices of ``config.mesh`` (default ``jax.devices()``,
      every process's); ignored without a mesh. E.g. the first N of 8 for a
      scaling benchmark in one process.

  Raises:
    ValueError: from :func:`validate` (a bad ``config.mesh``, or one that
      does not use exactly ``devices`` or does not divide the batch rows,
      named as ``config.mesh``), or when the context cannot hold a turn
      (``rollout.max_tokens_per_turn`` etc.); all before anything compiles.
  """

  def __init__(self, config, devices=None):
    devices = None if devices is None else list(devices)
    validate(config, None if devices is None else len(devices))
    self.config = c = config
    # "tiny": the shipped sentencepiece model; "": the model directory's
    # tokenizer.json; else a directory holding a tokenizer.json.
    self.tokenizer = (tokenizers.load_tiny_tokenizer() if c.tokenizer == "tiny"
                      else tokenizers.HFTokenizer(c.tokenizer or c.model_dir))
    self.env, self.env_params = envs_jax.make(c.env)
    p = c.prompt
    self.prompt = rollout.PromptConfig(
        system=p.system, instructions=p.instructions if p.instructions != "" or
        "{instructions}" not in p.first_turn else None,
        first_turn=p.first_turn, next_turn=p.next_turn, think=p.think,
        max_actions_per_turn=p.max_actions_per_turn, chat_template=p.chat_template or None)
    self.text_env = rollout.TextEnv(self.env, self.tokenizer, self.prompt,
                                    env_params=self.env_params)
    if c.model_dir:
      self.model_config = models.read_hf_config(c.model_dir)
    else:
      self.model_config = models.get_config(c.model)
    if c.get("remat", False):  # absent in runs saved before the field
      self.model_config = self.model_config.replace(remat=True)
    r = c.rollout
    self.rollout_config = rollout.RolloutConfig(
        num_groups=r.num_groups, group_size=r.group_size, max_turns=r.max_turns,
        max_tokens_per_turn=r.max_tokens_per_turn, max_actions_per_traj=r.max_actions_per_traj,
        temperature=r.temperature)
    self.context_size = rollout.context_size(self.text_env, self.rollout_config)
    if self.context_size > self.model_config.max_position:
      raise _bad("rollout.max_tokens_per_turn", r.max_tokens_per_turn,
                 f"rollout.max_turns={r.max_turns} turns of it need {self.context_size} "
                 f"tokens of context; the model has {self.model_config.max_position} positions")
    # The run's one filter (rl.filter_*) replaces the objective's own; the
    # objective kept is the one that runs on the compacted rows (its filter
    # stage rebuilt so the filter applies once), as train.rl_iteration does.
    self.filter_config, self.objective = _rl.iteration_filter(
        transforms.make(c.algorithm, **dict(c.algorithm_kwargs)), filter_config(c))
    self.num_keep = (_rl.num_kept_groups(r.num_groups, self.filter_config)
                     if self.filter_config.fixed_count else r.num_groups)
    self.needs = self.objective.needs
    # config.mesh (validated above): None runs on the default device as before.
    spec = c.get("mesh", "")
    self.mesh = sharding.make_mesh(spec, devices) if spec else None
    rl = c.rl
    minibatch_rows = self.num_keep * r.group_size // rl.num_minibatches
    micro = rl.get("num_microbatches", 1)
    if micro == -1:  # one row per device (data x fsdp) in each micro-batch
      micro = minibatch_rows // (1 if self.mesh is None else sharding.rows_size(self.mesh))
    self.train_config = train.TrainConfig(
        model=self.model_config,
        actor_optimizer=train.OptimizerConfig(
            learning_rate=rl.learning_rate, warmup_steps=rl.warmup_steps, decay=rl.decay,
            decay_steps=max(1, rl.steps * rl.num_minibatches * rl.ppo_epochs - rl.warmup_steps)
            if rl.decay != "constant" else 0,
            weight_decay=rl.weight_decay, max_grad_norm=rl.max_grad_norm),
        critic_optimizer=train.OptimizerConfig(
            learning_rate=rl.critic_learning_rate, weight_decay=rl.weight_decay,
            max_grad_norm=rl.max_grad_norm),
        temperature=r.temperature, ppo_epochs=rl.ppo_epochs, num_minibatches=rl.num_minibatches,
        num_microbatches=micro, old_logprobs=rl.old_logprobs)
    self.eval_keys = jax.random.split(jax.random.key(c.eval.seed), c.eval.num_levels)
    self._signature = None
    # Sharded programs are shared only by Experiments on the same devices.
    self._devices_key = None if self.mesh is None else (
        tuple(self.mesh.shape.values()), tuple(d.id for d in self.mesh.devices.flat))

  @property
  def is_primary(self) -> bool:
    """Whether this process writes the run's files (process 0; checkpoints: all)."""
    return jax.process_index() == 0

  # ---------------------------------------------------------------- sharding
  def param_shardings(self):
    """The policy's NamedShardings on :attr:`mesh` (``Params`` structure)."""
    abstract = jax.eval_shape(lambda k: models.init(self.model_config, k), jax.random.key(0))
    return sharding.param_shardings(abstract, self.mesh)

  def _placed_state(self, make: Callable[[Any], train.TrainState], params):
    """``make(params)`` as one program whose outputs sit on their mesh shardings.

    Under ``jit`` (not eagerly) so that no leaf stays on one process's device
    (orbax refuses to save such arrays in a multi-process run, STACK.md).
    """
    shardings = sharding.train_state_shardings(jax.eval_shape(make, params), self.mesh)
    # Waits: a multi-process CPU run must not overlap two programs with
    # collectives (see _eval_program), e.g. this and a checkpoint's barrier.
    return jax.block_until_ready(jax.jit(make, out_shardings=shardings)(params))

  def state_shardings(self, state) -> train.TrainState:
    """``jagent.sharding.train_state_shardings`` of ``state`` on :attr:`mesh`."""
    return sharding.train_state_shardings(state, self.mesh)

  def to_host(self, tree):
    """``tree`` as numpy arrays on every process (gathered across processes on a mesh)."""
    if self.mesh is None:
      return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)

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
    rc = self.rollout_config
    if kind == "train":
      return rc
    return rollout.RolloutConfig(
        num_groups=self.config.eval.num_groups, group_size=1, max_turns=rc.max_turns,
        max_tokens_per_turn=rc.max_tokens_per_turn,
        max_actions_per_traj=rc.max_actions_per_traj,
        temperature=temperature, greedy=kind == "eval_greedy",
        context_size=self.context_size)

  def rollout_fn(self, kind: str, temperature: float | None = None):
    """The jitted rollout: ``"train"``, ``"eval_temp"`` or ``"eval_greedy"``.

    ``temperature`` (eval kinds only) overrides ``config.eval.temperature``.
    Shared by the Experiments of this process whose configs agree on the
    fields the rollout reads (built and compiled once). Always the
    single-program ``jagent.rollout.make_rollout`` (vmappable, nestable in
    other programs), whatever ``config.mesh``; :meth:`evaluate` and
    :meth:`rl_step` run it on the mesh.
    """
    if kind == "train":
      temperature = None  # the train rollout samples at rollout.temperature
    elif temperature is None:
      temperature = self.config.eval.temperature

    def build():
      return rollout.make_rollout(self.text_env, self.model_config,
                                  self._rollout_config(kind, temperature), self.env_params)

    return shared_program(("rollout", self.signature(ROLLOUT_FIELDS), kind, temperature), build)

  def _eval_program(self, kind: str, temperature: float):
    """On a mesh: ``(params, key, reset_keys) -> (Trajectory, metrics)`` as one program.

    The rollout of :meth:`rollout_fn` with parameters on their mesh
    shardings, rows over ``data x fsdp`` and ``Trajectory.metrics()``
    computed in the same program (replicated). Eager jnp reductions on
    arrays spanning processes would each be a separate collective program,
    dispatched asynchronously; on CPU (gloo) two processes then deadlocked
    (measured with jax 0.10.2), so nothing is reduced eagerly.
    """
    def build():
      fn = rollout.make_rollout(self.text_env, self.model_config,
                                self._rollout_config(kind, temperature), self.env_params)
      params_sh = self.param_shardings()
      abstract = jax.eval_shape(lambda k: models.init(self.model_config, k), jax.random.key(0))
      n = self.config.eval.num_groups
      out = jax.eval_shape(fn, abstract, jax.random.key(0), self.eval_keys[:n])
      rep = sharding.replicated(self.mesh)

      def program(params, key, reset_keys):
        traj = fn(params, key, reset_keys)
        return traj, traj.metrics()

      return jax.jit(program, in_shardings=(params_sh, rep, rep),
                     out_shardings=(sharding.rows_shardings(out, self.mesh), rep))

    return shared_program(("eval_program", self.signature(ROLLOUT_FIELDS), kind, temperature,
                           self._devices_key), build)

  def _evaluate(self, params, kind: str, temperature: float | None = None):
    """``(metrics, first chunk's Trajectory)`` on the held-out levels.

    ``jagent.train`` evaluate (``_rl.evaluate``) without a mesh; on a mesh
    the same chunks, keys and averages with :meth:`_eval_program`.
    """
    c = self.config
    if self.mesh is None:
      return _rl.evaluate(self.rollout_fn(kind, temperature), params, self.eval_keys,
                          self.eval_key(), c.eval.num_groups)
    if temperature is None:
      temperature = c.eval.temperature
    program = self._eval_program(kind, temperature)
    n = c.eval.num_groups
    chunks = self.eval_keys.shape[0] // n
    sums: dict[str, float] = {}
    first = None
    for i in range(chunks):
      traj, m = program(params, jax.random.fold_in(self.eval_key(), i),
                        self.eval_keys[i * n:(i + 1) * n])
      first = traj if first is None else first
      for k, v in jax.device_get(m).items():  # waits: one program at a time
        sums[k] = sums.get(k, 0.0) + float(v)
    return {k: v / chunks for k, v in sums.items()}, first

  def init_params(self):
    """Initial policy parameters (random, or the Hugging Face checkpoint).

    On a mesh each array is created (or loaded) straight onto its sharding.
    """
    c = self.config
    if self.mesh is None:
      if c.model_dir:
        return models.load_hf_checkpoint(c.model_dir)[0]
      return models.init(self.model_config, jax.random.key(c.seed))
    shardings = self.param_shardings()
    if c.model_dir:
      return models.load_hf_checkpoint(c.model_dir, shardings=shardings)[0]
    return jax.block_until_ready(jax.jit(lambda k: models.init(self.model_config, k),
                                         out_shardings=shardings)(jax.random.key(c.seed)))

  # ----------------------------------------------------------------------- SFT
  def demonstrations(self):
    """Expert demonstrations (one Trajectory) for SFT; levels disjoint from eval."""
    c = self.config
    expert = rollout.make_expert(
        self.env, think=self.prompt.think, actions_per_turn=c.sft.actions_per_turn,
        policy=c.sft.get("expert", "solver"), seed=c.seed)
    rc = rollout.RolloutConfig(
        num_groups=c.sft.num_demos, group_size=1, max_turns=self.rollout_config.max_turns,
        max_tokens_per_turn=self.rollout_config.max_tokens_per_turn,
        max_actions_per_traj=self.rollout_config.max_actions_per_traj,
        context_size=self.context_size)
    return rollout.demonstrations(
        self.text_env, num_groups=c.sft.num_demos,
        key=jax.random.fold_in(jax.random.key(c.seed), 1), config=rc,
        actions_per_turn=c.sft.actions_per_turn, expert=expert)

  def sft_train_config(self, learning_rate=None) -> train.TrainConfig:
    """The SFT stage's TrainConfig (``learning_rate`` overrides ``sft.learning_rate``).

    ``learning_rate`` may be a traced float32 scalar (a vmapped sweep).
    """
    c = self.config
    return train.TrainConfig(model=self.model_config, actor_optimizer=train.OptimizerConfig(
        learning_rate=c.sft.learning_rate if learning_rate is None else learning_rate,
        warmup_steps=c.sft.warmup_steps, decay="cosine",
        decay_steps=max(1, c.sft.steps - c.sft.warmup_steps), weight_decay=0.0))

  def sft_batch_indices(self, num_demos: int) -> np.ndarray:
    """int64 ``[sft.steps, sft.batch_size]``: the demonstrations of each SFT step.

    Drawn without replacement per step by ``numpy.random.default_rng(seed)``.
    """
    c = self.config
    rng = np.random.default_rng(c.seed)
    return np.asarray([rng.choice(num_demos, c.sft.batch_size, replace=False)
                       for _ in range(c.sft.steps)], np.int64).reshape(
                           c.sft.steps, c.sft.batch_size)

  def sft_state(self, params, config: train.TrainConfig | None = None) -> train.TrainState:
    """The SFT TrainState starting from ``params`` (on a mesh: on its shardings)."""
    def make(p):
      return train.init_train_state(p, jax.random.key(self.config.seed),
                                    config=config or self.sft_train_config())

    return make(params) if self.mesh is None else self._placed_state(make, params)

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
    indices = self.sft_batch_indices(demos.tokens.shape[0])
    success = float(np.mean(demos.success))
    if self.mesh is not None:
      step_fn = shared_program(
          ("sft_step", self.signature(("model", "model_dir", "sft")), self._devices_key),
          lambda: sharding.shard_sft_step(tc, self.mesh, self.state_shardings(state)))
      tokens, loss_mask = np.asarray(batch_all.tokens), np.asarray(batch_all.loss_mask)
    for step in tqdm.trange(c.sft.steps, disable=not progress, desc="SFT"):
      if self.mesh is None:
        idx = jnp.asarray(indices[step])
        mb = transforms.Batch(tokens=batch_all.tokens[idx], loss_mask=batch_all.loss_mask[idx])
        state, m = train.sft_step(state, mb, config=tc)
      else:  # every process holds the demonstrations; each places its rows
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

    return make(params) if self.mesh is None else self._placed_state(make, params)

  def rl_state_target(self):
    """A restore target of the RL TrainState (``Checkpointer.restore``).

    ``jax.ShapeDtypeStruct`` leaves carrying this run's shardings: the mesh's
    (``train_state_shardings``) or, without a mesh, the default device's.
    Nothing is allocated or loaded, and a checkpoint written on any mesh or
    device count restores onto this run's (orbax refuses a target without
    shardings when the checkpoint's topology differs: "Topology mismatch").
    """
    abstract = jax.eval_shape(
        lambda k: self.rl_state(models.init(self.model_config, k)), jax.random.key(0))
    if self.mesh is None:
      one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      shardings = jax.tree.map(lambda _: one, abstract)
    else:
      shardings = self.state_shardings(abstract)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        abstract, shardings)

  def rl_key(self, step: int) -> jax.Array:
    """The rollout key of RL step ``step`` (0-based)."""
    return jax.random.fold_in(jax.random.key(self.config.seed + 2), step)

  def rl_iteration(self, state, key, *, config: train.TrainConfig | None = None):
    """One pure RL iteration (``jagent.train.rl_iteration`` with this run's pieces).

    ``config`` overrides :attr:`train_config` (e.g. with a traced learning
    rate). Not jitted: jit or vmap it; :meth:`rl_step` runs it jitted.
    """
    return train.rl_iteration(
        state, key, rollout_fn=self.rollout_fn("train"), objective=self.objective,
        config=self.train_config if config is None else config, num_keep=self.num_keep,
        filter_config=self.filter_config)

  def rl_step(self, state, step: int):
    """One iteration (rollout, compaction by the filter, update) as one jitted program.

    Returns ``(state, metrics)`` with float metrics: those of
    ``jagent.train.rl_iteration``, ``time/step_seconds`` (wall time of the
    whole iteration, the metrics' transfer included) and the throughput of
    the iteration: ``throughput/rollout_tokens_per_s`` (sampled tokens),
    ``throughput/env_turns_per_s`` and ``throughput/train_tokens_per_s``
    (trained context tokens, padding included), each per second of the
    whole iteration (rollout and update run in one program, so they are
    not timed apart).
    """
    if self.mesh is None:
      fn = shared_program(("rl_iteration", self.signature()),
                          lambda: jax.jit(self.rl_iteration))
    else:

      def build():
        return sharding.shard_rl_iteration(
            self.rollout_fn("train"), self.objective, self.train_config, self.mesh,
            self.state_shardings(state), num_keep=self.num_keep,
            filter_config=self.filter_config)

      fn = shared_program(("rl_iteration", self.signature(), self._devices_key), build)
    t0 = time.perf_counter()
    state, m = fn(state, self.rl_key(step))
    out = {k: float(v) for k, v in jax.device_get(m).items()}
    sec = time.perf_counter() - t0
    out["time/step_seconds"] = sec
    out["throughput/rollout_tokens_per_s"] = out["rollout/sampled_tokens"] / sec
    out["throughput/env_turns_per_s"] = out["rollout/env_turns"] / sec
    out["throughput/train_tokens_per_s"] = out["train/context_tokens"] / sec
    return state, out

  # ---------------------------------------------------------------------- eval
  def eval_key(self) -> jax.Array:
    """The evaluation's sampling key (the initial states are :attr:`eval_keys`)."""
    return jax.random.key(self.config.seed + 3)

  def evaluate(self, params, *, temperature: float | None = None, greedy: bool = False):
    """Metrics on the fixed held-out levels (see ``jagent.train`` evaluate).

    ``temperature`` overrides ``config.eval.temperature`` (ignored when greedy).
    """
    m, _ = self._evaluate(params, "eval_greedy" if greedy else "eval_temp", temperature)
    return m

  def evaluate_all(self, params, stage: str, workdir: str) -> dict:
    """Temperature and greedy evaluation; saves decoded samples; returns a dict.

    Every process evaluates; only :attr:`is_primary` writes the samples.
    """
    c = self.config
    out = {}
    m, traj = self._evaluate(params, "eval_temp")
    out.update({k: m[k] for k in ("success", "score", "actions", "turns",
                                  "format_valid_frac", "valid_action_frac")})
    out["temperature"] = c.eval.temperature
    if c.eval.greedy:
      g, _ = self._evaluate(params, "eval_greedy")
      out["greedy_success"] = g["success"]
      out["greedy_score"] = g["score"]
    out["num_levels"] = c.eval.num_levels
    if self.mesh is not None:  # all processes gather (a collective), one writes
      traj = self.to_host(traj)
    if self.is_primary:
      os.makedirs(os.path.join(workdir, "samples"), exist_ok=True)
      files.write_json(os.path.join(workdir, "samples", f"{stage}.json"),
                       _rl.decode_samples(traj, self.tokenizer, c.eval.samples))
    return {k: float(v) if isinstance(v, (float, np.floating)) else v for k, v in out.items()}

  # ---------------------------------------------------------------- checkpoints
  def checkpointer(self, workdir: str) -> train.Checkpointer:
    """The run's checkpoints, in ``<workdir>/checkpoints``."""
    return train.Checkpointer(workdir, keep=self.config.checkpoint.keep, async_save=False)

  def export(self, workdir: str, params) -> None:
    """Writes the policy as a Hugging Face directory ``<workdir>/policy``.

    On a mesh every process gathers the parameters and process 0 writes.
    """
    if self.mesh is not None:
      params = self.to_host(params)
    if self.is_primary:
      train.export_policy(params, self.model_config, os.path.join(workdir, "policy"))

