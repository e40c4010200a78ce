"""Transforms: named pairs of pure functions over a :class:`Batch`, and chains.

A :class:`Transform` is ``(init, update)`` with::

    state = init(batch)                       # batch: example or spec batch
    batch, state = update(batch, state)       # pure, jittable

Stages read fields of the batch and add or overwrite others; state carries
what adapts across steps (running normalisers, an adaptive KL coefficient).
An :class:`Objective` is a transform (run once per step on the whole batch,
outside the gradient) plus a final loss (run per micro-batch inside it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from jagent._src.types import PyTree
from jagent.losses import _filters
from jagent.transforms._batch import Batch
from jagent.transforms._batch import LossOutput
from jagent.transforms._batch import ModelOutputs

InitFn = Callable[[Batch], PyTree]
UpdateFn = Callable[[Batch, PyTree], tuple[Batch, PyTree]]
LossFn = Callable[[ModelOutputs, Batch], LossOutput]


class Transform(NamedTuple):
  """A batch transform: a pair of pure functions.

  Attributes:
    init: ``init(batch) -> state``; ``batch`` may hold
      ``jax.ShapeDtypeStruct`` leaves.
    update: ``update(batch, state) -> (batch, state)``.
  """
  init: InitFn
  update: UpdateFn


class EmptyState(NamedTuple):
  """The state of a stateless transform."""


def stateless(fn: Callable[[Batch], Batch]) -> Transform:
  """Wraps ``fn(batch) -> batch`` as a :class:`Transform` with no state.

  Args:
    fn: a pure function of the batch.

  Returns:
    a :class:`Transform` whose state is :class:`EmptyState`.
  """

  def init(batch):
    del batch
    return EmptyState()

  def update(batch, state):
    return fn(batch), state

  return Transform(init, update)


def identity() -> Transform:
  """The transform that changes nothing."""
  return stateless(lambda batch: batch)


def chain(*transforms: Transform) -> Transform:
  """Applies ``transforms`` in order; the state is the tuple of their states.

  Args:
    *transforms: :class:`Transform` objects.

  Returns:
    a :class:`Transform`.

  Raises:
    ValueError: if an argument is not a :class:`Transform`.
  """
  for i, t in enumerate(transforms):
    if not isinstance(t, Transform):
      raise ValueError(f"chain argument {i} is not a Transform: {t!r}.")

  def init(batch):
    return tuple(t.init(batch) for t in transforms)

  def update(batch, state):
    new_state = []
    for t, s in zip(transforms, state):
      batch, s = t.update(batch, s)
      new_state.append(s)
    return batch, tuple(new_state)

  return Transform(init, update)


class ObjectiveNeeds(NamedTuple):
  """What an objective reads besides the policy's log-probs (it declares it).

  Attributes:
    critic: a value function: ``Batch.values`` (GAE) and
      ``ModelOutputs.values`` (a value loss).
    reference: a frozen reference policy: ``Batch.ref_logprobs`` (a KL loss
      or KL-in-reward).
    entropy: ``ModelOutputs.entropy`` (an entropy bonus).
    groups: several rollouts of each initial state (``Batch.group_size``
      >= 2): the advantages compare the rollouts of a group (GRPO, RLOO,
      GiGPO, ...), so with one rollout a group every advantage is 0.
  """
  critic: bool = False
  reference: bool = False
  entropy: bool = False
  groups: bool = False


class Objective(NamedTuple):
  """An RL algorithm: a batch transform, a final loss and its rollout filter.

  Typical train step::

      batch, state = jax.jit(obj.update)(batch, state)   # whole batch, once
      def loss_fn(params, mb):                           # per micro-batch
        out = obj.loss(ModelOutputs(*model(params, mb)), mb)
        return out.loss_sum / global_denominator, out.metrics

  where ``global_denominator`` is the sum of ``out.denominator`` over the
  micro-batches (it carries no gradient), so accumulation is exact.

  The uncertainty filter is data (``filter_config``), not a stage of
  ``update``: :func:`jagent.train.rl_iteration` ranks the rollout's groups
  once, compacts the kept ones (:func:`jagent.train.compact_groups`) and
  then runs ``update`` on them. To filter a batch outside an RL iteration,
  use :func:`jagent.transforms.with_filter_stage`.

  Attributes:
    init: ``init(batch) -> state`` of the transform.
    update: ``update(batch, state) -> (batch, state)``; adds advantages,
      returns, weights and metrics.
    loss: ``loss(outputs, batch) -> LossOutput``; pure, differentiable in
      ``outputs``.
    needs: the :class:`ObjectiveNeeds` it declares (what
      :func:`jagent.train.init_train_state` must provide).
    filter_config: its uncertainty filter (a
      :class:`jagent.losses.FilterConfig`; StarPO-S's top 25%, DAPO's
      dynamic sampling), or None for none.
  """
  init: InitFn
  update: UpdateFn
  loss: LossFn
  needs: ObjectiveNeeds = ObjectiveNeeds()
  filter_config: _filters.FilterConfig | None = None


def objective(transform: Transform, loss: LossFn, *,
              needs: ObjectiveNeeds = ObjectiveNeeds(),
              filter_config: _filters.FilterConfig | None = None) -> Objective:
  """Bundles a batch transform, a final loss and a rollout filter into an :class:`Objective`.

  Args:
    transform: the batch :class:`Transform` (e.g. a :func:`chain`).
    loss: a loss function, e.g. from :func:`make_loss`.
    needs: what the transform and loss read (:class:`ObjectiveNeeds`).
    filter_config: the objective's uncertainty filter (a
      :class:`jagent.losses.FilterConfig`, applied by
      :func:`jagent.train.rl_iteration`), or None.

  Returns:
    an :class:`Objective`.

  Raises:
    ValueError: if ``transform`` is not a Transform, ``loss`` not callable,
      ``needs`` not an ObjectiveNeeds or ``filter_config`` not a FilterConfig.
  """
  if not callable(loss):
    raise ValueError(f"loss must be callable; got {loss!r}.")
  if not isinstance(needs, ObjectiveNeeds):
    raise ValueError(f"needs must be an ObjectiveNeeds; got {needs!r}.")
  if filter_config is not None and not isinstance(filter_config, _filters.FilterConfig):
    raise ValueError(f"filter_config must be a jagent.losses.FilterConfig; "
                     f"got {filter_config!r}.")
  if not isinstance(transform, Transform):
    raise ValueError(f"transform must be a Transform; got {transform!r}.")
  return Objective(transform.init, transform.update, loss, needs, filter_config)
