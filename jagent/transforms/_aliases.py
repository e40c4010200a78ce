"""Named algorithms, each a chain of stages plus a sum of loss terms.

Each alias registers itself (``@register(name)``) and declares what it reads
(``Objective.needs``, derived from the loss terms it adds and from its
advantage's baseline), so this module is the one place that lists them.

Defaults follow RAGEN v1 (its ``config/base.yaml``) and verl (its
``trainer/config/ppo_trainer.yaml`` and ``trainer/ppo/core_algos.py``): RAGEN's
algorithms (``ppo``, ``grpo``, ``starpo``, ``starpo_s``) use entropy bonus
0.001 and dual-clip 3 (verl's default "vanilla" policy loss always applies
``clip_ratio_c = 3``, so all aliases do); the others take their paper's
settings where the paper fixes one and otherwise verl's defaults (KL loss
0.001 with ``k3`` = ``low_var_kl``, token-mean aggregation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jagent import losses
from jagent.losses import _filters
from jagent.transforms import _loss
from jagent.transforms import _stages
from jagent.transforms import _tree
from jagent.transforms._base import chain
from jagent.transforms._base import Objective
from jagent.transforms._base import objective
from jagent.transforms._base import ObjectiveNeeds
from jagent.transforms._base import Transform
from jagent.transforms._registry import register

ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Transform]] = {
    "gae": _stages.compute_gae,
    "bilevel_gae": _stages.compute_bilevel_gae,
    "grpo": _stages.compute_grpo,
    "dr_grpo": _stages.compute_dr_grpo,
    "rloo": _stages.compute_rloo,
    "reinforce_pp": _stages.compute_reinforce_pp,
    "reinforce_pp_baseline": _stages.compute_reinforce_pp_baseline,
    "gigpo": _stages.compute_gigpo,
    "tree_grpo": _tree.compute_tree_grpo,
    "tree_step": _tree.compute_tree_step,
}
"""Advantage stage factories by config name."""

CRITIC_ESTIMATORS = ("gae", "bilevel_gae")
"""Estimators that need a critic (``Batch.values``, a value loss)."""

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "gigpo", "tree_grpo",
                    "tree_step")
"""Estimators whose baseline is the rollout's group (``ObjectiveNeeds.groups``)."""


def make_advantage(name: str, **kwargs: Any) -> Transform:
  """The advantage stage named ``name`` (a key of ADVANTAGE_ESTIMATORS).

  Args:
    name: e.g. ``"gae"``, ``"grpo"``, ``"gigpo"``.
    **kwargs: hyperparameters of the stage factory.

  Returns:
    a :class:`Transform`.

  Raises:
    ValueError: for an unknown name.
  """
  if name not in ADVANTAGE_ESTIMATORS:
    raise ValueError(f"unknown advantage estimator {name!r}; known: "
                     f"{sorted(ADVANTAGE_ESTIMATORS)}.")
  return ADVANTAGE_ESTIMATORS[name](**kwargs)


def _objective(stages, *, eps_low, eps_high, dual_clip, kl_coef, kl_estimator,
               entropy_coef, aggregation, value_coef=0.0, value_clip=0.5,
               critic=False, kl_in_reward=False, filter_config=None,
               turn_weighting="episode", groups=False):
  """The clipped-surrogate objective over ``stages``, its needs from its terms.

  ``stages`` is a Transform; ``filter_config`` the objective's rollout
  filter (data, see :class:`Objective`). ``kl_in_reward``: a stage reads
  ``ref_logprobs`` (KL-in-reward) besides the loss's KL term. ``groups``:
  the advantage stage's baseline is the rollout's group.
  """
  if kl_estimator not in losses.KL_ESTIMATORS:  # checked even when kl_coef drops the term
    raise ValueError(f"kl_estimator must be one of {losses.KL_ESTIMATORS}; got "
                     f"{kl_estimator!r}.")
  terms = [_loss.ppo_clip_term(eps_low, eps_high, dual_clip)]
  if kl_coef:
    terms.append(_loss.kl_term(kl_coef, kl_estimator))
  if entropy_coef:
    terms.append(_loss.entropy_term(entropy_coef))
  if critic:
    terms.append(_loss.value_term(value_coef, value_clip))
  needs = ObjectiveNeeds(critic=bool(critic),
                         reference=bool(kl_coef) or bool(kl_in_reward),
                         entropy=bool(entropy_coef), groups=bool(groups))
  loss = _loss.make_loss(*terms, aggregation=aggregation,
                         turn_weighting=turn_weighting)
  return objective(stages, loss, needs=needs, filter_config=filter_config)


@register("ppo")
def ppo(*, gamma: float = 1.0, lambda_: float = 1.0, whiten: bool = True,
        eps_low: float = 0.2, eps_high: float = 0.2,
        dual_clip: float | None = 3.0, entropy_coef: float = 0.001,
        kl_coef: float = 0.0, kl_estimator: str = "k3",
        value_coef: float = 1.0, value_clip: float | None = 0.5,
        aggregation: str = "token-mean",
        turn_weighting: str = "episode") -> Objective:
  """PPO with a critic: GAE (whitened) + clipped surrogate + value loss.

  ``chain(compute_gae(gamma, lambda_, whiten))`` and the loss
  ``ppo_clip_term + [kl_term] + entropy_term + value_term``. Needs
  ``rewards``, ``values``, ``loss_mask`` (+ ``old_logprobs``) and model
  ``logprobs``, ``values``, ``entropy``.

  Args:
    gamma: GAE discount (RAGEN: 1).
    lambda_: GAE lambda (RAGEN: 1).
    whiten: whiten advantages over the batch.
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant (3) or None.
    entropy_coef: entropy bonus (RAGEN: 0.001); 0 drops the term.
    kl_coef: KL-to-reference loss coefficient; 0 drops the term.
    kl_estimator: KL estimator name.
    value_coef: value-loss coefficient.
    value_clip: value clip range (0.5) or None.
    aggregation: loss aggregation mode.
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  References:
    Schulman et al. (https://arxiv.org/abs/1707.06347); RAGEN's PPO baseline.
  """
  stages = chain(_stages.compute_gae(gamma, lambda_, whiten))
  return _objective(
      stages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip,
      kl_coef=kl_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef,
      aggregation=aggregation, turn_weighting=turn_weighting,
      value_coef=value_coef, value_clip=value_clip, critic=True)


@register("grpo")
def grpo(*, eps: float = 1e-6, eps_low: float = 0.2, eps_high: float = 0.2,
         dual_clip: float | None = 3.0, kl_coef: float = 0.001,
         kl_estimator: str = "k3", entropy_coef: float = 0.001,
         aggregation: str = "token-mean",
         turn_weighting: str = "episode") -> Objective:
  """GRPO: group-normalised scores + clipped surrogate + KL loss (k3).

  Args:
    eps: std floor of the group normalisation.
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant or None.
    kl_coef: KL loss coefficient (verl: 0.001).
    kl_estimator: KL estimator (verl ``low_var_kl`` = k3).
    entropy_coef: entropy bonus (RAGEN: 0.001).
    aggregation: loss aggregation (verl default token-mean).
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  References:
    Shao et al., DeepSeekMath (https://arxiv.org/abs/2402.03300).
  """
  return _objective(
      chain(_stages.compute_grpo(eps)), eps_low=eps_low, eps_high=eps_high,
      dual_clip=dual_clip, kl_coef=kl_coef, kl_estimator=kl_estimator,
      entropy_coef=entropy_coef, aggregation=aggregation,
      turn_weighting=turn_weighting, groups=True)


@register("dr_grpo")
def dr_grpo(*, eps_low: float = 0.2, eps_high: float = 0.2,
            dual_clip: float | None = 3.0, kl_coef: float = 0.0,
            kl_estimator: str = "k3", entropy_coef: float = 0.0,
            aggregation: str = "seq-mean-token-sum",
            turn_weighting: str = "episode") -> Objective:
  """Dr.GRPO: mean-centred scores (no std), no KL, seq-mean-token-sum.

  Args:
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant or None.
    kl_coef: KL loss coefficient (paper: 0).
    kl_estimator: KL estimator.
    entropy_coef: entropy bonus (0).
    aggregation: ``seq-mean-token-sum`` (the paper's constant normaliser;
      verl's ``loss_agg_mode``).
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  References:
    Liu et al. (https://arxiv.org/abs/2503.20783).
  """
  return _objective(
      chain(_stages.compute_dr_grpo()), eps_low=eps_low, eps_high=eps_high,
      dual_clip=dual_clip, kl_coef=kl_coef, kl_estimator=kl_estimator,
      entropy_coef=entropy_coef, aggregation=aggregation,
      turn_weighting=turn_weighting, groups=True)


@register("dapo")
def dapo(*, eps: float = 1e-6, eps_low: float = 0.2, eps_high: float = 0.28,
         dual_clip: float | None = 3.0, dynamic_sampling: bool = True,
         kl_coef: float = 0.0, kl_estimator: str = "k3",
         entropy_coef: float = 0.0,
         aggregation: str = "token-mean",
         turn_weighting: str = "episode") -> Objective:
  """DAPO: clip-higher, token-mean, no KL, dynamic sampling as a mask.

  Dynamic sampling (dropping groups whose rewards are all equal) becomes the
  objective's filter, ``FilterConfig("top_fraction", 1.0,
  include_zero=False)``: :func:`jagent.train.rl_iteration` masks those groups
  (static shapes, no resampling) and reports the kept ratio; a run's own
  filter keeps it (:func:`jagent.train.iteration_filter`). Overlong reward
  shaping is not included (put it into ``rewards``).

  Args:
    eps: std floor of the group normalisation.
    eps_low: lower clip range (0.2).
    eps_high: upper clip range (0.28).
    dual_clip: dual-clip constant or None.
    dynamic_sampling: mask zero-std groups.
    kl_coef: KL loss coefficient (0).
    kl_estimator: KL estimator.
    entropy_coef: entropy bonus (0).
    aggregation: ``token-mean``.
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  References:
    Yu et al. (https://arxiv.org/abs/2503.14476).
  """
  return _objective(
      chain(_stages.compute_grpo(eps)),
      filter_config=_filters.DROP_ZERO_STD if dynamic_sampling else None, eps_low=eps_low,
      eps_high=eps_high, dual_clip=dual_clip,
      kl_coef=kl_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef,
      aggregation=aggregation,
      turn_weighting=turn_weighting, groups=True)


@register("rloo")
def rloo(*, eps_low: float = 0.2, eps_high: float = 0.2,
         dual_clip: float | None = 3.0, kl_coef: float = 0.0,
         kl_estimator: str = "k3", entropy_coef: float = 0.0,
         aggregation: str = "token-mean",
         turn_weighting: str = "episode") -> Objective:
  """RLOO: leave-one-out baseline + clipped surrogate.

  Args:
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant or None.
    kl_coef: KL loss coefficient.
    kl_estimator: KL estimator.
    entropy_coef: entropy bonus.
    aggregation: loss aggregation.
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  References:
    Ahmadian et al. (https://arxiv.org/abs/2402.14740).
  """
  return _objective(
      chain(_stages.compute_rloo()), eps_low=eps_low, eps_high=eps_high,
      dual_clip=dual_clip, kl_coef=kl_coef, kl_estimator=kl_estimator,
      entropy_coef=entropy_coef, aggregation=aggregation,
      turn_weighting=turn_weighting, groups=True)


@register("reinforce_pp")
def reinforce_pp(*, gamma: float = 1.0, baseline: bool = False,
                 kl_reward_coef: float = 0.001,
                 kl_reward_estimator: str = "k1", eps_low: float = 0.2,
                 eps_high: float = 0.2, dual_clip: float | None = 3.0,
                 entropy_coef: float = 0.0,
                 aggregation: str = "token-mean",
                 turn_weighting: str = "episode") -> Objective:
  """REINFORCE++: KL-penalised rewards, batch-whitened returns, PPO clip.

  ``chain(kl_reward_penalty, compute_reinforce_pp)`` (or the group-baseline
  stage with ``baseline=True``). With ``kl_reward_coef > 0`` the batch needs
  ``old_logprobs`` and ``ref_logprobs``.

  Args:
    gamma: discount per token (1).
    baseline: use the REINFORCE++-baseline (group mean) variant.
    kl_reward_coef: KL-in-reward coefficient; 0 drops the stage.
    kl_reward_estimator: KL estimator for the reward (k1).
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant or None.
    entropy_coef: entropy bonus.
    aggregation: loss aggregation.
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  References:
    Hu (https://arxiv.org/abs/2501.03262).
  """
  stages = []
  if kl_reward_coef:
    stages.append(_stages.kl_reward_penalty(kl_reward_coef,
                                            kl_reward_estimator))
  stages.append(_stages.compute_reinforce_pp_baseline() if baseline
                else _stages.compute_reinforce_pp(gamma))
  return _objective(
      chain(*stages), eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip,
      kl_coef=0.0, kl_estimator="k1", entropy_coef=entropy_coef,
      aggregation=aggregation, turn_weighting=turn_weighting,
      kl_in_reward=bool(kl_reward_coef), groups=baseline)


@register("gigpo")
def gigpo(*, step_gamma: float = 0.95, step_weight: float = 1.0,
          normalize_std: bool = True, eps_low: float = 0.2,
          eps_high: float = 0.2, dual_clip: float | None = 3.0,
          kl_coef: float = 0.01, kl_estimator: str = "k3",
          entropy_coef: float = 0.0,
          aggregation: str = "token-mean",
          turn_weighting: str = "episode") -> Objective:
  """GiGPO: episode + anchor-state step advantages + clipped surrogate + KL.

  Needs ``turn_ids`` and ``anchor_hashes`` in the batch.

  Args:
    step_gamma: turn discount (0.95).
    step_weight: step-advantage weight (1).
    normalize_std: mean-std (True) or mean-only normalisation.
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant or None.
    kl_coef: KL loss coefficient (verl-agent examples: 0.01, low_var_kl).
    kl_estimator: KL estimator (k3).
    entropy_coef: entropy bonus.
    aggregation: loss aggregation.
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  References:
    Feng et al. (https://arxiv.org/abs/2505.10978).
  """
  stages = chain(_stages.compute_gigpo(step_gamma, step_weight,
                                       normalize_std=normalize_std))
  return _objective(
      stages, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip,
      kl_coef=kl_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef,
      aggregation=aggregation,
      turn_weighting=turn_weighting, groups=True)


@register("tree_grpo")
def tree_grpo(*, advantage: str = "tree_grpo", eps: float = 1e-6, combine: str = "sum",
              node_reduce: str = "mean", eps_low: float = 0.2, eps_high: float = 0.2,
              dual_clip: float | None = 3.0, kl_coef: float = 0.001,
              kl_estimator: str = "k3", entropy_coef: float = 0.001,
              aggregation: str = "token-mean",
              turn_weighting: str = "episode") -> Objective:
  """Tree-GRPO: tree-rollout advantages per node + clipped surrogate + KL loss.

  Needs a tree rollout's batch (``tree_nodes``, ``tree_size``; see
  :func:`jagent.train.trajectory_batch`). For StarPO-S clipping and its
  filter use ``starpo_s(advantage="tree_grpo")`` or
  ``starpo_s(advantage="tree_step")``.

  Args:
    advantage: ``"tree_grpo"`` (intra- plus inter-tree group advantages,
      :func:`jagent.transforms.compute_tree_grpo`) or ``"tree_step"`` (the
      exact step baseline, :func:`jagent.transforms.compute_tree_step`).
    eps: std floor (``tree_grpo``).
    combine: ``"sum"`` (the paper) or ``"nested"`` (the released code).
    node_reduce: ``"mean"`` or ``"sum"`` of a shared node's leaves.
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant or None.
    kl_coef: KL loss coefficient (GRPO's 0.001).
    kl_estimator: KL estimator (k3).
    entropy_coef: entropy bonus.
    aggregation: loss aggregation.
    turn_weighting: how turn rows weigh; see :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  Raises:
    ValueError: an unknown ``advantage`` or bad hyperparameters.

  References:
    Ji et al., "Tree Search for LLM Agent Reinforcement Learning"
    (https://arxiv.org/abs/2509.21240).
  """
  if advantage == "tree_grpo":
    stage = _tree.compute_tree_grpo(eps, combine, node_reduce)
  elif advantage == "tree_step":
    stage = _tree.compute_tree_step()
  else:
    raise ValueError(f"tree_grpo: advantage={advantage!r} must be 'tree_grpo' or "
                     "'tree_step'.")
  return _objective(
      chain(stage), eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip,
      kl_coef=kl_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef,
      aggregation=aggregation, turn_weighting=turn_weighting, groups=True)


def _advantage_stage(advantage, advantage_kwargs):
  if isinstance(advantage, Transform):
    if advantage_kwargs:
      raise ValueError("advantage_kwargs only apply to a named advantage.")
    return advantage
  if not isinstance(advantage, str):
    raise ValueError(f"advantage must be a name or a Transform; got "
                     f"{advantage!r}.")
  return make_advantage(advantage, **(advantage_kwargs or {}))


def _critic(advantage, critic):
  if critic is not None:
    return bool(critic)
  return isinstance(advantage, str) and advantage in CRITIC_ESTIMATORS


def _groups(advantage):
  # A custom Transform declares nothing: it is not assumed group-relative.
  return isinstance(advantage, str) and advantage in GROUP_ESTIMATORS


@register("starpo")
def starpo(*, advantage: str | Transform = "gae",
           advantage_kwargs: dict[str, Any] | None = None,
           critic: bool | None = None, eps_low: float = 0.2,
           eps_high: float = 0.2,
           dual_clip: float | None = 3.0, kl_coef: float = 0.001,
           kl_estimator: str = "k3", entropy_coef: float = 0.001,
           value_coef: float = 1.0, value_clip: float | None = 0.5,
           aggregation: str = "token-mean",
           turn_weighting: str = "episode") -> Objective:
  """StarPO: a token-level PPO/GRPO objective over whole multi-turn trajectories.

  ``chain(<advantage>)`` and the loss ``ppo_clip_term + kl_term +
  entropy_term [+ value_term]``. RAGEN's format penalty (-0.1 per bad turn)
  is already in the rollout's rewards (``RolloutConfig.format_penalty``, its
  one home), so no stage adds it here.

  Args:
    advantage: an ADVANTAGE_ESTIMATORS name (``"gae"``: PPO-style StarPO,
      ``"grpo"``: GRPO-style) or any :class:`Transform` that sets
      ``advantages``.
    advantage_kwargs: hyperparameters of a named estimator (GAE defaults:
      gamma = lambda = 1).
    critic: add the value loss; default: True for GAE estimators.
    eps_low: lower clip range.
    eps_high: upper clip range.
    dual_clip: dual-clip constant (3) or None.
    kl_coef: KL loss coefficient (0.001; StarPO-S removes it).
    kl_estimator: KL estimator (k3).
    entropy_coef: entropy bonus (0.001).
    value_coef: value-loss coefficient.
    value_clip: value clip range (0.5) or None.
    aggregation: loss aggregation.
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  Raises:
    ValueError: for an unknown advantage name or bad hyperparameters.

  References:
    Wang et al., RAGEN (https://arxiv.org/abs/2504.20073), section 3.
  """
  return _objective(
      chain(_advantage_stage(advantage, advantage_kwargs)), eps_low=eps_low,
      eps_high=eps_high, dual_clip=dual_clip, kl_coef=kl_coef,
      kl_estimator=kl_estimator, entropy_coef=entropy_coef,
      aggregation=aggregation, turn_weighting=turn_weighting,
      value_coef=value_coef, value_clip=value_clip,
      critic=_critic(advantage, critic), groups=_groups(advantage))


@register("starpo_s")
def starpo_s(*, advantage: str | Transform = "gae",
             advantage_kwargs: dict[str, Any] | None = None,
             critic: bool | None = None,
             filter_config: _filters.FilterConfig = _filters.FilterConfig(),
             eps_low: float = 0.2, eps_high: float = 0.28,
             dual_clip: float | None = 3.0, kl_coef: float = 0.0,
             kl_estimator: str = "k3",
             entropy_coef: float = 0.001, value_coef: float = 1.0,
             value_clip: float | None = 0.5,
             aggregation: str = "token-mean",
             turn_weighting: str = "episode") -> Objective:
  """StarPO-S: StarPO + uncertainty filtering, no KL, clip-higher, critic.

  ``<advantage>`` and the loss ``ppo_clip_term(0.2, 0.28, 3) + entropy_term
  [+ value_term]``, with the uncertainty filter as the objective's
  ``filter_config``: :func:`jagent.train.rl_iteration` ranks groups by the
  std of RAW trajectory scores, keeps the top 25% (RAGEN-2:
  ``FilterConfig("top_p", 0.9)``) and compacts them before ``update``;
  ``filter/any_kept == 0`` means the step trained nothing. The format
  penalty is the rollout's (see :func:`starpo`).

  Example: plugging in a custom advantage (score minus a fixed baseline,
  broadcast over each trajectory's trained tokens; no critic), with the
  filter as a stage to filter a batch by hand
  (:func:`jagent.transforms.with_filter_stage`)::

    >>> import jax, jax.numpy as jnp
    >>> from jagent import losses, transforms
    >>> def fixed_baseline(batch):
    ...   scores = transforms.trajectory_scores(batch)
    ...   adv = (scores - 0.5)[:, None] * batch.loss_mask
    ...   return batch.replace(advantages=adv)
    >>> obj = transforms.starpo_s(advantage=transforms.stateless(fixed_baseline),
    ...                           filter_config=losses.FilterConfig(value=0.5))
    >>> batch = transforms.Batch(
    ...     loss_mask=jnp.ones((4, 2)),
    ...     rewards=jnp.array([[0., 1.], [0., 0.], [0., 1.], [0., 1.]]),
    ...     group_size=2)
    >>> update = transforms.with_filter_stage(obj)
    >>> batch, state = jax.jit(update.update)(batch, update.init(batch))
    >>> batch.keep.tolist()  # group 1's rewards have std 0: filtered out
    [True, True, False, False]
    >>> batch.advantages[:2].tolist()
    [[0.5, 0.5], [-0.5, -0.5]]
    >>> logp = jnp.full((4, 2), -1.0)
    >>> out = obj.loss(transforms.ModelOutputs(logp, entropy=jnp.zeros((4, 2))),
    ...                batch)
    >>> float(out.loss_sum), float(out.denominator)
    (0.0, 4.0)

  Args:
    advantage: an ADVANTAGE_ESTIMATORS name or a :class:`Transform`.
    advantage_kwargs: hyperparameters of a named estimator.
    critic: add the value loss; default: True for GAE estimators.
    filter_config: the uncertainty filter, a
      :class:`jagent.losses.FilterConfig` (StarPO-S: ``top_fraction`` 0.25,
      zero-std groups may be kept).
    eps_low: lower clip range (0.2).
    eps_high: upper clip range (0.28).
    dual_clip: dual-clip constant (3) or None.
    kl_coef: KL loss coefficient (0: no KL).
    kl_estimator: KL estimator.
    entropy_coef: entropy bonus (0.001).
    value_coef: value-loss coefficient.
    value_clip: value clip range (0.5) or None.
    aggregation: loss aggregation.
    turn_weighting: how turn rows weigh (``"episode"``: each episode the
      same; ``"turn"``: each turn row); see
      :func:`jagent.transforms.make_loss`.

  Returns:
    an :class:`Objective`.

  Raises:
    ValueError: for an unknown advantage name, a filter_config that is not a
      FilterConfig, or bad values.

  References:
    Wang et al., RAGEN (https://arxiv.org/abs/2504.20073), section 4.3.
  """
  if not isinstance(filter_config, _filters.FilterConfig):
    raise ValueError(f"starpo_s: filter_config must be a "
                     f"jagent.losses.FilterConfig; got {filter_config!r}.")
  return _objective(
      chain(_advantage_stage(advantage, advantage_kwargs)), eps_low=eps_low,
      eps_high=eps_high, dual_clip=dual_clip,
      kl_coef=kl_coef, kl_estimator=kl_estimator, entropy_coef=entropy_coef,
      aggregation=aggregation, turn_weighting=turn_weighting,
      value_coef=value_coef, value_clip=value_clip,
      critic=_critic(advantage, critic), filter_config=filter_config,
      groups=_groups(advantage))
