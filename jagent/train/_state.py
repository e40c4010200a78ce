"""The train configuration, the train state pytree and how to build it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jagent import models
from jagent import transforms
from jagent._src.errors import FieldError
from jagent._src import checks
from jagent._src.types import Array
from jagent._src.types import PyTree
from jagent.train import _critic
from jagent.train import _optim


OLD_LOGPROBS = ("recompute", "sampler")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Static settings of :func:`train_step` / :func:`sft_step` (hashable).

  One RL step makes ``ppo_epochs * num_minibatches`` optimizer updates; each
  minibatch of ``B / num_minibatches`` rows is split into
  ``num_microbatches`` micro-batches whose gradients are accumulated exactly.
  RAGEN v1: 128 trajectories, minibatch 32 (``num_minibatches=4``), 1 epoch.

  Attributes:
    model: the policy's :class:`jagent.models.ModelConfig` (also the
      ``"model"`` critic's trunk).
    actor_optimizer: the policy's optimizer (RAGEN: lr 1e-6).
    critic_optimizer: the critic's optimizer (RAGEN: lr 1e-5).
    temperature: logits temperature of every log-prob the step computes; it
      must equal the rollout's sampling temperature so that the PPO ratio is
      exactly 1 on-policy (RAGEN: 1.0).
    ppo_epochs: passes over the batch per step (>= 1).
    num_minibatches: optimizer updates per epoch; must divide B.
    num_microbatches: gradient-accumulation chunks per minibatch; must divide
      the minibatch rows. Also the chunk count of the no-grad forward.
    old_logprobs: where the PPO ratio's old log-probs come from:
      ``"recompute"`` (a no-grad forward of the pre-update policy, RAGEN /
      verl's way, needed when the sampler's numerics differ from the
      trainer's) or ``"sampler"`` (``Batch.sampler_logprobs``, the behaviour
      policy's own log-probs: jagent's sampler matches the trainer's forward
      to ~1e-5, and this skips one forward pass per step when the state has
      no critic and no reference policy; ``actor/entropy`` is then measured
      in the loss passes, over the trained tokens).
    shuffle_minibatches: permute rows (with the state's rng) before each
      epoch's split into minibatches; False keeps batch order (verl's
      ``shuffle: false`` default). Minibatches and micro-batches take rows
      strided, not contiguous: with ``M`` minibatches, minibatch ``m`` holds
      rows ``m, m + M, m + 2M, ...`` (so rows sharded in blocks over devices
      stay spread over all of them). Rows a rollout filter drops:
      :func:`jagent.train.rl_iteration` removes the groups that a
      fixed-count filter (``top_fraction`` / ``top_k``) drops before the
      update (``compact_groups``), so the kept rows fill fewer, full
      minibatches, as in RAGEN. A data-dependent filter (``top_p`` /
      ``min_p``), or an objective's filter stage in a step called directly,
      masks them instead: they still cost compute, and a minibatch with no
      trained token is skipped (no optimizer step, counted as empty).

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming the bad field.
  """
  model: models.ModelConfig
  actor_optimizer: _optim.OptimizerConfig = _optim.OptimizerConfig(
      learning_rate=1e-6)
  critic_optimizer: _optim.OptimizerConfig = _optim.OptimizerConfig(
      learning_rate=1e-5)
  temperature: float = 1.0
  ppo_epochs: int = 1
  num_minibatches: int = 1
  num_microbatches: int = 1
  shuffle_minibatches: bool = False
  old_logprobs: str = "recompute"

  def __post_init__(self):
    def bad(field, why):
      raise FieldError("TrainConfig", field, getattr(self, field), why)

    if not isinstance(self.model, models.ModelConfig):
      bad("model", "must be a jagent.models.ModelConfig")
    for f in ("actor_optimizer", "critic_optimizer"):
      if not isinstance(getattr(self, f), _optim.OptimizerConfig):
        bad(f, "must be an OptimizerConfig")
    if not (self.temperature > 0 and math.isfinite(self.temperature)):
      bad("temperature", "must be a positive finite float")
    if self.old_logprobs not in OLD_LOGPROBS:
      bad("old_logprobs", f"must be one of {OLD_LOGPROBS}")
    for f in ("ppo_epochs", "num_minibatches", "num_microbatches"):
      checks.check_int(f, getattr(self, f), 1, owner="TrainConfig")

  def replace(self, **changes) -> "TrainConfig":
    """A copy with ``changes`` applied (validated again)."""
    return dataclasses.replace(self, **changes)


@struct.dataclass
class TrainState:
  """Everything a run carries between steps (a pytree; checkpointed whole).

  ``critic_params``/``critic_opt_state`` are None without a critic and
  ``ref_params`` is None without a reference policy; the train step branches
  on that (statically: a different tree structure is a different program).

  With LoRA (``params`` a :class:`jagent.models.LoraParams`), ``opt_state``
  covers the adapters only (``models.split_frozen(params)[0]``), and the
  reference policy is the policy's own base with the adapters off:
  ``ref_params`` is then ``LoraParams(base=None, adapters=None)``, a marker
  holding no array (no second copy of the base; see :func:`reference_params`).
  """
  step: Array  # shape=[], dtype=int32: completed train_step / sft_step calls
  params: models.Params | models.LoraParams  # the policy
  opt_state: optax.OptState  # make_optimizer(config.actor_optimizer) state of its trainable part
  critic_params: _critic.CriticParams | None
  critic_opt_state: optax.OptState | None  # make_optimizer(config.critic_optimizer)
  ref_params: models.Params | models.LoraParams | None  # frozen reference policy (KL terms)
  objective_state: PyTree  # the Objective's transform state (() for none)
  rng: Array  # shape=[2], dtype=uint32: raw threefry key data (shuffling)
  num_updates: Array  # shape=[], dtype=int32: optimizer updates applied
  skipped_nonfinite: Array  # shape=[], dtype=int32: updates skipped, non-finite loss/grads
  skipped_empty: Array  # shape=[], dtype=int32: updates skipped, nothing to train


def _raw_key(key) -> Array:
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  if key.dtype != jnp.uint32 or key.shape != (2,):
    raise ValueError(f"key must be a jax.random.key or a uint32 [2] raw key; "
                     f"got dtype {key.dtype}, shape {key.shape}.")
  return key


def state_key(state: TrainState) -> Array:
  """The state's rng as a typed PRNG key."""
  return jax.random.wrap_key_data(state.rng)


def reference_params(state: TrainState) -> models.Params | models.LoraParams | None:
  """The reference policy of ``state`` (None without one).

  ``state.ref_params`` itself, or, for the LoRA marker (a ``LoraParams``
  without base), the policy's base with the adapters off.
  """
  ref = state.ref_params
  if isinstance(ref, models.LoraParams) and ref.base is None:
    return state.params.replace(adapters=None)
  return ref


def init_train_state(params: models.Params, key: jax.Array, *,
                     config: TrainConfig, critic: str | None = None,
                     critic_params: _critic.CriticParams | None = None,
                     reference: bool = False,
                     objective: transforms.Objective | None = None,
                     batch: transforms.Batch | None = None) -> TrainState:
  """Builds the initial :class:`TrainState`.

  Optimizer states are created under ``jax.jit``, so their scalar counters
  are placed like the parameters (eagerly, ``jnp.zeros`` would put them on
  the default device whatever the parameters' sharding).

  Args:
    params: initial policy parameters (e.g. an SFT checkpoint).
    key: PRNG key (typed or raw uint32 [2]); split for the critic and the
      state's rng.
    config: the :class:`TrainConfig`.
    critic: None (no critic), ``"head"`` or ``"model"`` (see
      :func:`jagent.train.init_critic`; a ``"model"`` trunk copies
      ``params``). ``objective.needs.critic`` says whether it needs one.
    critic_params: explicit critic parameters (overrides ``critic``).
    reference: keep a frozen copy of ``params`` as the reference policy
      (needed by KL terms and KL-in-reward stages:
      ``objective.needs.reference``). With LoRA ``params`` no copy is made:
      the reference is the base with adapters off (see :class:`TrainState`).
    objective: the Objective; its transform state is initialised from
      ``batch`` (or an empty Batch, enough for the built-in stages).
    batch: example or spec batch for ``objective.init``.

  Returns:
    a :class:`TrainState` at step 0.

  Raises:
    ValueError: for a bad key or critic kind.
  """
  raw = _raw_key(key)
  k_critic, k_state = jax.random.split(jax.random.wrap_key_data(raw))
  if critic_params is None and critic is not None:
    critic_params = _critic.init_critic(config.model, k_critic, kind=critic,
                                        policy_params=params)
  # Optimizer states of the trainable parts only (LoRA: the adapters).
  actor_tx = _optim.make_optimizer(config.actor_optimizer)
  opt_state = jax.jit(actor_tx.init)(models.split_frozen(params)[0])
  critic_opt_state = None
  if critic_params is not None:
    critic_tx = _optim.make_optimizer(config.critic_optimizer)
    critic_opt_state = jax.jit(critic_tx.init)(models.split_frozen(critic_params)[0])
  ref_params = None
  if reference:
    ref_params = (models.LoraParams(base=None, adapters=None, config=params.config)
                  if isinstance(params, models.LoraParams)
                  else jax.tree.map(jnp.copy, params))
  obj_state = ()
  if objective is not None:
    obj_state = objective.init(transforms.Batch() if batch is None else batch)
  # One buffer per counter: a donated state may not hold a buffer twice.
  zero = lambda: jnp.zeros((), jnp.int32)  # pylint: disable=unnecessary-lambda-assignment
  return TrainState(
      step=zero(), params=params, opt_state=opt_state,
      critic_params=critic_params, critic_opt_state=critic_opt_state,
      ref_params=ref_params, objective_state=obj_state,
      rng=jax.random.key_data(k_state), num_updates=zero(),
      skipped_nonfinite=zero(), skipped_empty=zero())


ObjectiveNeeds = transforms.ObjectiveNeeds
"""What an objective declares it needs (defined in jagent.transforms)."""


def objective_needs(name: str, **kwargs: Any) -> transforms.ObjectiveNeeds:
  """What the registered objective ``name`` with ``kwargs`` needs.

  The objective declares it (:attr:`jagent.transforms.Objective.needs`, set
  where its alias is defined); this builds it with ``transforms.make`` (no
  compile) and returns that.

  Args:
    name: a registered objective name (``transforms.registered()``).
    **kwargs: the hyperparameters passed to ``transforms.make(name, ...)``.

  Returns:
    :class:`jagent.transforms.ObjectiveNeeds` ``(critic, reference,
    entropy, groups)``.

  Raises:
    ValueError: for an unregistered name or keyword arguments the objective
      does not take (from ``transforms.make``).

  Example::

    >>> from jagent import train
    >>> train.objective_needs("starpo_s")
    ObjectiveNeeds(critic=True, reference=False, entropy=True, groups=False)
    >>> train.objective_needs("grpo")
    ObjectiveNeeds(critic=False, reference=True, entropy=True, groups=True)
  """
  return transforms.make(name, **kwargs).needs
