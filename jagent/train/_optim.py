"""Optimizer configuration: AdamW, global-norm clipping, warmup + decay schedules."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import optax

from jagent._src.errors import FieldError
from jagent._src import checks
from jagent._src.types import Array
from jagent._src.types import PyTree

DECAYS = ("constant", "linear", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW with gradient clipping and a learning-rate schedule (static, hashable).

  The schedule counts APPLIED optimizer updates ``n`` (skipped updates do not
  advance it): linear warmup ``lr * min(1, (n + 1) / warmup_steps)`` (so the
  first update already moves), then, for ``decay != "constant"``, a decay over
  ``decay_steps`` updates to ``final_lr_fraction * lr``, held afterwards.
  Weight decay is decoupled (Loshchilov & Hutter,
  https://arxiv.org/abs/1711.05101; ``p -= lr * wd * p`` as torch AdamW) and
  applies to every parameter, as verl's actor and critic optimizers do.

  Attributes:
    learning_rate: peak learning rate > 0 (RAGEN at 0.5B: actor 1e-6, critic
      1e-5). May also be a float32 ``[]`` ``jax.Array`` (e.g. traced under
      ``vmap``, to sweep learning rates in one program; not validated here,
      and such a config is not hashable, so not a static ``jit`` argument).
    warmup_steps: updates of linear warmup (0: none).
    decay: ``"constant"``, ``"linear"`` or ``"cosine"``.
    decay_steps: updates of decay after warmup (> 0 unless constant).
    final_lr_fraction: lr at the end of the decay, as a fraction of the peak.
    weight_decay: AdamW weight decay >= 0 (RAGEN: 0.01).
    b1: Adam beta1.
    b2: Adam beta2.
    eps: Adam epsilon.
    max_grad_norm: clip gradients to this global L2 norm (RAGEN: 1.0), or
      None for no clipping.

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming the bad field.
  """
  learning_rate: float = 1e-6
  warmup_steps: int = 0
  decay: str = "constant"
  decay_steps: int = 0
  final_lr_fraction: float = 0.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  max_grad_norm: float | None = 1.0

  def __post_init__(self):
    def bad(field, why):
      raise FieldError("OptimizerConfig", field, getattr(self, field), why)

    if not isinstance(self.learning_rate, jax.Array) and not (
        self.learning_rate > 0 and math.isfinite(self.learning_rate)):
      bad("learning_rate", "must be a positive finite float")
    for f in ("warmup_steps", "decay_steps"):
      checks.check_int(f, getattr(self, f), 0, owner="OptimizerConfig")
    if self.decay not in DECAYS:
      bad("decay", f"must be one of {DECAYS}")
    if self.decay != "constant" and self.decay_steps <= 0:
      bad("decay_steps", f"must be > 0 for decay={self.decay!r}")
    if not 0.0 <= self.final_lr_fraction <= 1.0:
      bad("final_lr_fraction", "must be in [0, 1]")
    if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
      bad("weight_decay", "must be a finite float >= 0")
    for f in ("b1", "b2"):
      if not 0.0 <= getattr(self, f) < 1.0:
        bad(f, "must be in [0, 1)")
    if not self.eps > 0:
      bad("eps", "must be > 0")
    if self.max_grad_norm is not None and not self.max_grad_norm > 0:
      bad("max_grad_norm", "must be > 0 or None")


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
  """The learning-rate schedule of ``config`` (see :class:`OptimizerConfig`).

  Args:
    config: an :class:`OptimizerConfig`.

  Returns:
    ``schedule(count) -> float32 []`` over applied updates ``count``.

  Example::

    >>> from jagent import train
    >>> s = train.make_schedule(train.OptimizerConfig(
    ...     learning_rate=1.0, warmup_steps=2, decay="linear", decay_steps=4))
    >>> [round(float(s(n)), 3) for n in range(7)]
    [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
  """
  c = config
  lr = (jnp.asarray(c.learning_rate, jnp.float32) if isinstance(c.learning_rate, jax.Array)
        else float(c.learning_rate))

  def schedule(count):
    n = jnp.asarray(count, jnp.float32)
    warm = (jnp.minimum(1.0, (n + 1.0) / c.warmup_steps) if c.warmup_steps
            else jnp.float32(1.0))
    if c.decay == "constant":
      frac = jnp.float32(1.0)
    else:
      t = jnp.clip((n - c.warmup_steps) / c.decay_steps, 0.0, 1.0)
      f = c.final_lr_fraction
      if c.decay == "linear":
        frac = 1.0 - (1.0 - f) * t
      else:
        frac = f + (1.0 - f) * 0.5 * (1.0 + jnp.cos(jnp.pi * t))
    return (lr * warm * frac).astype(jnp.float32)

  return schedule


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
  """``chain(clip_by_global_norm, adamw(schedule))`` for ``config``.

  Non-finite updates are not handled here: :func:`jagent.train.train_step`
  checks the loss and the pre-clip gradient norm and keeps the previous
  parameters and optimizer state when either is not finite (or when a
  minibatch has nothing to train), counting the skip in the
  :class:`jagent.train.TrainState`.

  Args:
    config: an :class:`OptimizerConfig`.

  Returns:
    an ``optax.GradientTransformation``.
  """
  parts = []
  if config.max_grad_norm is not None:
    parts.append(optax.clip_by_global_norm(config.max_grad_norm))
  parts.append(optax.adamw(make_schedule(config), b1=config.b1, b2=config.b2,
                           eps=config.eps, weight_decay=config.weight_decay))
  return optax.chain(*parts)


def current_learning_rate(opt_state: PyTree, config: OptimizerConfig) -> Array:
  """float32 ``[]``: the learning rate the next update of ``opt_state`` uses.

  Args:
    opt_state: state of :func:`make_optimizer` ``(config)``.
    config: the same :class:`OptimizerConfig`.

  Returns:
    the schedule at the state's applied-update count.

  Raises:
    ValueError: if ``opt_state`` holds no schedule count.
  """
  found = [s for s in jax.tree.leaves(
      opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByScheduleState))
           if isinstance(s, optax.ScaleByScheduleState)]
  if len(found) != 1:
    raise ValueError("opt_state is not a make_optimizer state (no single "
                     "ScaleByScheduleState).")
  return make_schedule(config)(found[0].count)
