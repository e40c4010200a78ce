"""What experiments/train.py and experiments/eval.py share: one Experiment object.

An :class:`Experiment` validates a config (every bad field named before
anything compiles), builds the game, tokenizer, model, rollouts and
objective, and runs the stages: SFT, RL steps, evaluation, checkpoints.
"""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from jagent import models
from jagent import rollout
from jagent import tokenizers
from jagent import train
from jagent import transforms
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


def validate(config) -> None:
  """Checks a train/eval config; raises ValueError naming the first bad field."""
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
  if config.rl.num_minibatches < 1:
    raise _bad("rl.num_minibatches", config.rl.num_minibatches, "must be >= 1")
  if config.rl.filter_mode not in _filters.FILTER_MODES:
    raise _bad("rl.filter_mode", config.rl.filter_mode, f"unknown; known: {_filters.FILTER_MODES}")
  if config.rl.old_logprobs not in train.OLD_LOGPROBS:
    raise _bad("rl.old_logprobs", config.rl.old_logprobs,
               f"unknown; known: {train.OLD_LOGPROBS}")
  if config.rl.critic not in _critic.CRITIC_KINDS:
    raise _bad("rl.critic", config.rl.critic, f"unknown; known: {_critic.CRITIC_KINDS}")
  if config.rl.filter_mode in ("top_fraction", "top_k"):
    try:
      k = _rl.num_kept_groups(r.num_groups, config.rl.filter_mode, config.rl.filter_value)
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


class Experiment:
  """A configured run (see the module docstring).

  Raises:
    ValueError: from :func:`validate`, or when the context cannot hold a
      turn (``rollout.max_tokens_per_turn`` etc.).
  """

  def __init__(self, config):
    validate(config)
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
    kwargs = dict(c.algorithm_kwargs)
    if c.rl.filter_mode in ("top_fraction", "top_k"):
      # Compaction applies the filter; the objective's own filter keeps all.
      self.num_keep = _rl.num_kept_groups(r.num_groups, c.rl.filter_mode, c.rl.filter_value)
      if c.algorithm in ("starpo_s",):
        kwargs.update(filter_mode="top_fraction", filter_value=1.0)
    else:
      self.num_keep = r.num_groups
      if c.algorithm in ("starpo_s",):
        kwargs.update(filter_mode=c.rl.filter_mode, filter_value=c.rl.filter_value)
    self.objective = transforms.make(c.algorithm, **kwargs)
    self.needs = train.objective_needs(c.algorithm, **dict(c.algorithm_kwargs))
    rl = c.rl
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
        old_logprobs=rl.old_logprobs)
    self.eval_keys = jax.random.split(jax.random.key(c.eval.seed), c.eval.num_levels)
    self._signature = None

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
  def rollout_fn(self, kind: str, temperature: float | None = None):
    """The jitted rollout: ``"train"``, ``"eval_temp"`` or ``"eval_greedy"``.

    ``temperature`` (eval kinds only) overrides ``config.eval.temperature``.
    Shared by the Experiments of this process whose configs agree on the
    fields the rollout reads (built and compiled once).
    """
    if kind == "train":
      temperature = None  # the train rollout samples at rollout.temperature
    elif temperature is None:
      temperature = self.config.eval.temperature

    def build():
      rc = self.rollout_config
      if kind != "train":
        rc = rollout.RolloutConfig(
            num_groups=self.config.eval.num_groups, group_size=1, max_turns=rc.max_turns,
            max_tokens_per_turn=rc.max_tokens_per_turn,
            max_actions_per_traj=rc.max_actions_per_traj,
            temperature=temperature, greedy=kind == "eval_greedy",
            context_size=self.context_size)
      return rollout.make_rollout(self.text_env, self.model_config, rc, self.env_params)

    return shared_program(("rollout", self.signature(ROLLOUT_FIELDS), kind, temperature), build)

  def init_params(self):
    """Initial policy parameters (random, or the Hugging Face checkpoint)."""
    c = self.config
    if c.model_dir:
      return models.load_hf_checkpoint(c.model_dir)[1]
    return models.init(self.model_config, jax.random.key(c.seed))

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
    """The SFT TrainState starting from ``params``."""
    return train.init_train_state(params, jax.random.key(self.config.seed),
                                  config=config or self.sft_train_config())

  def sft(self, writer, *, progress: bool = True):
    """Behaviour cloning on :meth:`demonstrations`; returns the params."""
    import tqdm  # pylint: disable=g-import-not-at-top
    c = self.config
    params = self.init_params()
    if not c.sft.steps:
      return params
    demos = self.demonstrations()
    batch_all = demos.to_batch()
    tc = self.sft_train_config()
    state = self.sft_state(params, tc)
    indices = self.sft_batch_indices(demos.tokens.shape[0])
    success = float(np.mean(demos.success))
    for step in tqdm.trange(c.sft.steps, disable=not progress, desc="SFT"):
      idx = jnp.asarray(indices[step])
      mb = transforms.Batch(tokens=batch_all.tokens[idx], loss_mask=batch_all.loss_mask[idx])
      state, m = train.sft_step(state, mb, config=tc)
      if (step + 1) % 50 == 0 or step + 1 == c.sft.steps:
        writer.write(-c.sft.steps + step + 1, {
            **{k: float(v) for k, v in m.items()}, "sft/demo_success": success})
    return state.params

  # ------------------------------------------------------------------------ RL
  def rl_state(self, params) -> train.TrainState:
    """The RL TrainState starting from ``params`` (critic/reference as needed)."""
    c = self.config
    return train.init_train_state(
        params, jax.random.key(c.seed + 1), config=self.train_config,
        critic=c.rl.critic if self.needs.critic else None, reference=self.needs.reference,
        objective=self.objective)

  def rl_key(self, step: int) -> jax.Array:
    """The rollout key of RL step ``step`` (0-based)."""
    return jax.random.fold_in(jax.random.key(self.config.seed + 2), step)

  def rl_iteration(self, state, key, *, config: train.TrainConfig | None = None):
    """One pure RL iteration (``jagent.train.rl_iteration`` with this run's pieces).

    ``config`` overrides :attr:`train_config` (e.g. with a traced learning
    rate). Not jitted: jit or vmap it; :meth:`rl_step` runs it jitted.
    """
    c = self.config
    return train.rl_iteration(
        state, key, rollout_fn=self.rollout_fn("train"), objective=self.objective,
        config=self.train_config if config is None else config, num_keep=self.num_keep,
        filter_mode=c.rl.filter_mode, filter_value=c.rl.filter_value,
        include_zero=c.rl.include_zero)

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
    fn = shared_program(("rl_iteration", self.signature()), lambda: jax.jit(self.rl_iteration))
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
    fn = self.rollout_fn("eval_greedy" if greedy else "eval_temp", temperature)
    m, _ = _rl.evaluate(fn, params, self.eval_keys, self.eval_key(), self.config.eval.num_groups)
    return m

  def evaluate_all(self, params, stage: str, workdir: str) -> dict:
    """Temperature and greedy evaluation; saves decoded samples; returns a dict."""
    c = self.config
    out = {}
    fn = self.rollout_fn("eval_temp")
    m, traj = _rl.evaluate(fn, params, self.eval_keys, self.eval_key(),
                           c.eval.num_groups)
    out.update({k: m[k] for k in ("success", "score", "actions", "turns",
                                  "format_valid_frac", "valid_action_frac")})
    out["temperature"] = c.eval.temperature
    if c.eval.greedy:
      g, _ = _rl.evaluate(self.rollout_fn("eval_greedy"), params, self.eval_keys,
                          self.eval_key(), c.eval.num_groups)
      out["greedy_success"] = g["success"]
      out["greedy_score"] = g["score"]
    out["num_levels"] = c.eval.num_levels
    os.makedirs(os.path.join(workdir, "samples"), exist_ok=True)
    with open(os.path.join(workdir, "samples", f"{stage}.json"), "w") as f:
      json.dump(_rl.decode_samples(traj, self.tokenizer, c.eval.samples), f, indent=2)
    return {k: float(v) if isinstance(v, (float, np.floating)) else v for k, v in out.items()}

  # ---------------------------------------------------------------- checkpoints
  def checkpointer(self, workdir: str) -> train.Checkpointer:
    """The run's checkpoints, in ``<workdir>/checkpoints``."""
    return train.Checkpointer(workdir, keep=self.config.checkpoint.keep, async_save=False)

  def export(self, workdir: str, params) -> None:
    """Writes the policy as a Hugging Face directory ``<workdir>/policy``."""
    train.export_policy(params, self.model_config, os.path.join(workdir, "policy"))

