"""Batch stages: advantages, rollout filters, reward shaping, weights.

Each factory validates its hyperparameters on the host and returns a
:class:`Transform`. ``update`` raises ValueError (at trace time, before any
compile) when a field it needs is missing. Shapes: ``[B, S]`` tokens, ``[B, T]``
turns, ``[B]`` rows; groups are ``Batch.group_size`` consecutive rows.

Turn rows (``Batch.turns_per_episode = T > 1``, see :mod:`._batch`): every
stage computes over EPISODES and writes per-row results. Trajectory-level
advantages (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline) are computed from the
episodes' scores (``G`` per group) and broadcast to every trained token of
each of the episode's rows; REINFORCE++ and bi-level GAE run their token
recursions over the episode's replies in turn order (the full-history
sequence, so they equal the ``T = 1`` result on the same replies); GAE is
turn-level (:func:`compute_gae`); GiGPO has one step per row
(:func:`compute_gigpo`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jagent import losses
from jagent._src.types import Array
from jagent.losses import _checks
from jagent.losses import _filters
from jagent.transforms._base import chain
from jagent.transforms._base import Objective
from jagent.transforms._base import stateless
from jagent.transforms._base import Transform
from jagent.transforms._batch import add_metrics
from jagent.transforms._batch import Batch
from jagent.transforms._batch import drop_nonfinite_episodes
from jagent.transforms._batch import episode_scores
from jagent.transforms._batch import episode_tokens
from jagent.transforms._batch import episode_valid
from jagent.transforms._batch import episode_view
from jagent.transforms._batch import mask_of
from jagent.transforms._batch import require
from jagent.transforms._batch import to_rows
from jagent.transforms._batch import trajectory_scores
from jagent.transforms._batch import valid_rows


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def _episode_ends(batch: Batch):
  rows = jnp.shape(batch.loss_mask)[0]
  if batch.terminated is None:
    terminated = jnp.ones((rows,), jnp.bool_)
  else:
    require(batch, ("terminated",), "episode ends")
    terminated = jnp.asarray(batch.terminated, jnp.bool_)
  if batch.bootstrap_values is None:
    boot = jnp.zeros((rows,), jnp.float32)
  else:
    require(batch, ("bootstrap_values",), "episode ends")
    boot = _f32(batch.bootstrap_values)
  return terminated, boot


def _first_trained(x_rs, m):
  """float32 ``[B]``: ``x`` at each row's first trained position (0 if none)."""
  first = jnp.argmax(m > 0, axis=1)
  x = jnp.take_along_axis(_f32(x_rs), first[:, None], axis=1)[:, 0]
  return jnp.where(jnp.any(m > 0, axis=1), x, 0.0)


def _from_episode_tokens(x_et, m):
  return jnp.reshape(x_et, jnp.shape(m))


def _masked_mean(x, mask):
  return losses.safe_ratio(jnp.sum(_f32(x) * mask), jnp.sum(mask))


def _adv_metrics(batch, adv):
  m = mask_of(batch)
  return add_metrics(batch, **{"advantages/mean": _masked_mean(adv, m),
                               "advantages/abs_mean": _masked_mean(
                                   jnp.abs(adv), m)})


# ------------------------------------------------------------------ advantages
def compute_gae(gamma: float = 1.0, lambda_: float = 1.0,
                whiten: bool = True) -> Transform:
  """Token-level GAE stage (critic); sets ``advantages`` and ``returns``.

  Reads ``rewards``, ``values``, ``loss_mask`` and optionally ``terminated``
  and ``bootstrap_values`` (truncated rows bootstrap). Applies
  :func:`jagent.losses.gae` per row, then (``whiten``) masked whitening of
  the advantages over the batch, as verl. RAGEN defaults gamma = lambda = 1.

  With turn rows (``Batch.turns_per_episode = T > 1``) it is TURN-level GAE,
  one step per row: the reward of turn ``t`` is ``rho_t = sum(rewards *
  loss_mask)`` of its row, its value ``V_t`` the critic's value at the
  row's FIRST trained position (``values[r, s]`` is V of the context before
  token ``s``, so this is V of the turn's own context: its bounded history,
  observation and assistant header), and :func:`jagent.losses.gae` runs over
  the episode's valid turns: ``delta_t = rho_t + gamma V_{t+1} - V_t``,
  ``A_t = delta_t + gamma lambda A_{t+1}``, after the last turn ``V = 0`` if
  the episode terminated, ``bootstrap_values`` if truncated. ``A_t`` and the
  return ``A_t + V_t`` are put on every trained token of the row (the value
  loss regresses each reply position to the turn's return), then whitened
  over the batch's trained tokens.

  Args:
    gamma: discount per trained token (per turn with turn rows), in [0, 1].
    lambda_: GAE lambda, in [0, 1].
    whiten: whiten advantages over the batch's trained tokens.

  Returns:
    a stateless :class:`Transform`.

  Raises:
    ValueError: for gamma/lambda outside [0, 1] (at construction) or missing
      fields (at update).
  """
  _checks.check_in_range("gamma", gamma, 0.0, 1.0)
  _checks.check_in_range("lambda_", lambda_, 0.0, 1.0)
  per_row = jax.vmap(functools.partial(losses.gae, gamma=gamma,
                                       lambda_=lambda_))

  def fn(batch):
    require(batch, ("rewards", "values", "loss_mask"), "compute_gae")
    batch = drop_nonfinite_episodes(batch)
    terminated, boot = _episode_ends(batch)
    t = batch.turns_per_episode
    if t == 1:
      out = per_row(batch.rewards, batch.values, mask_of(batch), terminated,
                    boot)
    else:
      m = mask_of(batch)
      turn = lambda x: x.reshape(-1, t)  # noqa: E731  [E, T] turns
      per_turn = per_row(turn(jnp.sum(_f32(batch.rewards) * m, axis=1)),
                         turn(_first_trained(batch.values, m)),
                         turn(jnp.any(m > 0, axis=1)),
                         episode_view(terminated, t), episode_view(boot, t))
      out = losses.AdvantagesAndReturns(
          per_turn.advantages.reshape(-1)[:, None] * m,
          per_turn.returns.reshape(-1)[:, None] * m)
    adv = out.advantages
    if whiten:
      adv = losses.masked_whiten(adv, mask_of(batch))
    return _adv_metrics(batch.replace(advantages=adv, returns=out.returns), adv)

  return stateless(fn)


def compute_bilevel_gae(gamma: float = 1.0, lambda_: float = 1.0,
                        turn_gamma: float = 0.95,
                        whiten: bool = True) -> Transform:
  """Turn-level ("bi-level") GAE stage (critic); sets advantages and returns.

  Reads ``rewards``, ``values``, ``loss_mask`` and optionally ``turn_ids``,
  ``terminated``, ``bootstrap_values``; applies
  :func:`jagent.losses.bilevel_gae` per row, then optional whitening.

  Args:
    gamma: token-level discount in [0, 1].
    lambda_: GAE lambda in [0, 1] (both levels).
    turn_gamma: turn-level discount in [0, 1] (RAGEN: 0.95).
    whiten: whiten advantages over the batch's trained tokens.

  Returns:
    a stateless :class:`Transform`.

  Raises:
    ValueError: for discounts outside [0, 1] or missing fields.
  """
  for name, x in (("gamma", gamma), ("lambda_", lambda_),
                  ("turn_gamma", turn_gamma)):
    _checks.check_in_range(name, x, 0.0, 1.0)

  def fn(batch):
    require(batch, ("rewards", "values", "loss_mask"), "compute_bilevel_gae")
    batch = drop_nonfinite_episodes(batch)
    terminated, boot = _episode_ends(batch)
    kw = dict(gamma=gamma, lambda_=lambda_, turn_gamma=turn_gamma)
    m = mask_of(batch)
    t = batch.turns_per_episode
    # Turn rows: one sequence per episode, its replies in turn order.
    ep = ((lambda x: x) if t == 1 else  # noqa: E731
          lambda x: episode_tokens(x, t))
    ends = (episode_view(terminated, t), episode_view(boot, t))
    if batch.turn_ids is None:
      per_row = jax.vmap(lambda r, v, mm, te, bo: losses.bilevel_gae(
          r, v, mm, None, te, bo, **kw))
      out = per_row(ep(batch.rewards), ep(batch.values), ep(m), *ends)
    else:
      require(batch, ("turn_ids", "loss_mask"), "compute_bilevel_gae")
      per_row = jax.vmap(functools.partial(losses.bilevel_gae, **kw))
      out = per_row(ep(batch.rewards), ep(batch.values), ep(m),
                    ep(batch.turn_ids), *ends)
    if t > 1:
      out = losses.AdvantagesAndReturns(
          _from_episode_tokens(out.advantages, m),
          _from_episode_tokens(out.returns, m))
    adv = losses.masked_whiten(out.advantages, m) if whiten else out.advantages
    return _adv_metrics(batch.replace(advantages=adv, returns=out.returns), adv)

  return stateless(fn)


def _group_stage(name: str, per_group) -> Transform:
  def fn(batch):
    require(batch, ("loss_mask",), name)
    batch = drop_nonfinite_episodes(batch)
    # Over episodes (G per group), then on each of the episode's rows.
    groups = losses.as_groups("scores", episode_scores(batch),
                              batch.group_size)
    valid = losses.as_groups("row_valid", episode_valid(batch),
                             batch.group_size)
    adv_e = jax.vmap(lambda s, v: per_group(s, valid_g=v))(
        groups, valid).reshape(-1)
    adv = to_rows(adv_e, batch.turns_per_episode)[:, None] * mask_of(batch)
    return _adv_metrics(batch.replace(advantages=adv), adv)

  return stateless(fn)


def compute_grpo(eps: float = 1e-6, normalize_std: bool = True) -> Transform:
  """GRPO stage: group-normalised trajectory scores broadcast over tokens.

  Scores are ``Batch.scores`` or ``sum(rewards * loss_mask)``; see
  :func:`jagent.losses.grpo_advantages`. Sets ``advantages`` only.

  Args:
    eps: std floor, > 0.
    normalize_std: divide by the group std (False: Dr.GRPO).

  Returns:
    a stateless :class:`Transform`.

  Raises:
    ValueError: for eps <= 0, missing fields, or a group size not dividing B.
  """
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)
  return _group_stage("compute_grpo", functools.partial(
      losses.grpo_advantages, eps=eps, normalize_std=normalize_std))


def compute_dr_grpo() -> Transform:
  """Dr.GRPO stage: ``s_i - mean_g`` broadcast over tokens (no std)."""
  return _group_stage("compute_dr_grpo", losses.dr_grpo_advantages)


def compute_rloo() -> Transform:
  """RLOO stage: leave-one-out baseline per group, broadcast over tokens."""
  return _group_stage("compute_rloo", losses.rloo_advantages)


def compute_reinforce_pp(gamma: float = 1.0) -> Transform:
  """REINFORCE++ stage: discounted token returns whitened over the batch.

  Args:
    gamma: discount per trained token, in [0, 1].

  Returns:
    a stateless :class:`Transform` setting ``advantages``.

  Raises:
    ValueError: for gamma outside [0, 1] or missing rewards/loss_mask.
  """
  _checks.check_in_range("gamma", gamma, 0.0, 1.0)

  def fn(batch):
    require(batch, ("rewards", "loss_mask"), "compute_reinforce_pp")
    batch = drop_nonfinite_episodes(batch)
    t, m = batch.turns_per_episode, mask_of(batch)
    if t == 1:
      adv = losses.reinforce_pp_advantages(batch.rewards, m, gamma)
    else:  # returns to go over the episode's later turns too
      adv = _from_episode_tokens(losses.reinforce_pp_advantages(
          episode_tokens(batch.rewards, t), episode_tokens(m, t), gamma), m)
    return _adv_metrics(batch.replace(advantages=adv), adv)

  return stateless(fn)


def compute_reinforce_pp_baseline() -> Transform:
  """REINFORCE++-baseline stage: group-centred scores, batch-whitened."""

  def fn(batch):
    require(batch, ("loss_mask",), "compute_reinforce_pp_baseline")
    batch = drop_nonfinite_episodes(batch)
    t, m = batch.turns_per_episode, mask_of(batch)
    if t == 1:
      adv = losses.reinforce_pp_baseline_advantages(
          trajectory_scores(batch), m, batch.group_size, valid_rows(batch))
    else:  # one sequence per episode: centred over episodes, same whitening
      adv = _from_episode_tokens(losses.reinforce_pp_baseline_advantages(
          episode_scores(batch), episode_tokens(m, t), batch.group_size,
          episode_valid(batch)), m)
    return _adv_metrics(batch.replace(advantages=adv), adv)

  return stateless(fn)


def compute_gigpo(step_gamma: float = 0.95, step_weight: float = 1.0,
                  eps: float = 1e-6, normalize_std: bool = True) -> Transform:
  """GiGPO stage: episode + anchor-state step advantages, mapped to tokens.

  Reads ``rewards``, ``loss_mask``, ``turn_ids`` and ``anchor_hashes``
  ``[B, T]``. Turn rewards are the trained token rewards summed per turn; a
  turn exists if it has a trained token. Each token gets its turn's
  advantage (:func:`jagent.losses.gigpo_advantages`).

  With turn rows (``Batch.turns_per_episode = T > 1``) each row is one step:
  ``anchor_hashes`` is ``[B, 1]`` (the row's turn's anchor), the step reward
  is the row's ``sum(rewards * loss_mask)``, a step exists if its row has a
  trained token, and the episode level uses the episodes' scores. The
  discounted step returns run over the episode's turns (GiGPO, arXiv
  2505.10978, eq. 6-7; RAGEN-2's per-turn rewards), the step groups gather
  identical anchors over every episode and turn of the group, and each row
  gets ``A^E`` of its episode plus ``w A^S`` of its step on its trained
  tokens.

  Args:
    step_gamma: turn-level discount in [0, 1] (paper: 0.95).
    step_weight: weight of the step advantage (paper: 1).
    eps: std floor, > 0.
    normalize_std: mean-std (True) or mean-only normalisation.

  Returns:
    a stateless :class:`Transform` setting ``advantages`` and the metric
    ``gigpo/anchor_group_size`` (mean over valid turns).

  Raises:
    ValueError: for bad hyperparameters or missing fields.
  """
  _checks.check_in_range("step_gamma", step_gamma, 0.0, 1.0)
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)
  per_group = jax.vmap(lambda s, r, a, m, v: losses.gigpo_advantages(
      s, r, a, m, step_gamma=step_gamma, step_weight=step_weight, eps=eps,
      normalize_std=normalize_std, valid_g=v))

  def fn(batch):
    require(batch, ("rewards", "loss_mask", "turn_ids", "anchor_hashes"),
            "compute_gigpo")
    _checks.check_integer("Batch.anchor_hashes", batch.anchor_hashes)
    batch = drop_nonfinite_episodes(batch)
    if batch.turns_per_episode > 1:
      return _gigpo_turn_rows(batch, per_group)
    b, t = jnp.shape(batch.anchor_hashes)
    g = batch.group_size
    m = mask_of(batch)
    ids = jnp.asarray(batch.turn_ids, jnp.int32)
    turn_r = jax.vmap(functools.partial(losses.token_to_turn_rewards,
                                        num_turns=t))(batch.rewards, m, ids)
    tmask = jax.vmap(functools.partial(losses.turn_mask, num_turns=t))(m, ids)
    scores = trajectory_scores(batch)
    out = per_group(scores.reshape(b // g, g), turn_r.reshape(b // g, g, t),
                    jnp.asarray(batch.anchor_hashes).reshape(b // g, g, t),
                    tmask.reshape(b // g, g, t),
                    valid_rows(batch).reshape(b // g, g))
    adv_turn = out.advantages.reshape(b, t)
    valid_id = (ids >= 0) & (ids < t)
    adv = jnp.take_along_axis(adv_turn, jnp.clip(ids, 0, t - 1), axis=1)
    adv = jnp.where(valid_id, adv, 0.0) * m
    sizes = out.anchor_group_size.reshape(b, t)
    batch = add_metrics(batch, **{"gigpo/anchor_group_size": _masked_mean(
        sizes, tmask.astype(jnp.float32))})
    return _adv_metrics(batch.replace(advantages=adv), adv)

  return stateless(fn)


def _gigpo_turn_rows(batch, per_group):
  """:func:`compute_gigpo` with one step per row (turn rows)."""
  t, g = batch.turns_per_episode, batch.group_size
  rows, width = jnp.shape(batch.anchor_hashes)
  if width != 1:
    raise ValueError(f"compute_gigpo: with turn rows Batch.anchor_hashes must "
                     f"be [B, 1] (the row's turn); got shape {(rows, width)}.")
  m = mask_of(batch)
  per_turn = lambda x: x.reshape(-1, g, t)  # noqa: E731  [N, G, T]
  tmask = jnp.any(m > 0, axis=1)
  out = per_group(
      episode_scores(batch).reshape(-1, g),
      per_turn(jnp.sum(_f32(batch.rewards) * m, axis=1)),
      per_turn(jnp.asarray(batch.anchor_hashes)[:, 0]), per_turn(tmask),
      episode_valid(batch).reshape(-1, g))
  adv = out.advantages.reshape(-1)[:, None] * m
  batch = add_metrics(batch, **{"gigpo/anchor_group_size": _masked_mean(
      out.anchor_group_size.reshape(-1), tmask.astype(jnp.float32))})
  return _adv_metrics(batch.replace(advantages=adv), adv)


def whiten_advantages(shift_mean: bool = True) -> Transform:
  """Masked whitening of ``advantages`` over the batch's trained tokens.

  Args:
    shift_mean: keep the result centred (False adds the mean back).

  Returns:
    a stateless :class:`Transform`.
  """

  def fn(batch):
    require(batch, ("advantages", "loss_mask"), "whiten_advantages")
    adv = losses.masked_whiten(batch.advantages, mask_of(batch), shift_mean)
    return batch.replace(advantages=adv)

  return stateless(fn)


# --------------------------------------------------------------------- filters
# filter_rollouts' metrics, in the order it computes them.
FILTER_STAGE_METRICS = ("filter/kept_ratio", "filter/any_kept", "filter/reward_std",
                        "filter/kept_reward_std")


def filter_rollouts(mode: str | losses.FilterConfig = "top_fraction", value: float = 0.25,
                    include_zero: bool = True) -> Transform:
  """Rollout filter stage: drops low-spread groups by masking their rows.

  For a batch filtered by hand (e.g. before ``Objective.update`` outside
  an RL iteration); :func:`jagent.train.rl_iteration` applies an
  objective's filter itself and compacts the kept groups.

  Ranks groups by the in-group std of RAW trajectory scores
  (:func:`jagent.losses.filter_groups`; put this stage before any reward
  normalisation) over the group's valid episodes (``row_valid``: an
  episode dropped for a non-finite reward leaves its group's std), zeroes
  ``loss_mask`` on the rows of dropped groups and sets ``keep`` ``[B]``
  (AND-ed with an earlier filter's). Metrics:
  ``filter/kept_ratio``, ``filter/any_kept`` (0 means skip the step),
  ``filter/reward_std`` and ``filter/kept_reward_std``.

  Args:
    mode: ``top_fraction`` (StarPO-S, 0.25), ``top_k``, ``top_p`` (RAGEN-2,
      0.9) or ``min_p``; or a :class:`jagent.losses.FilterConfig` (e.g.
      ``Objective.filter_config``), whose fields then replace all three.
    value: the mode's parameter.
    include_zero: whether zero-std groups may be kept.

  Returns:
    a stateless :class:`Transform`.

  Raises:
    ValueError: for a bad mode/value (at construction) or missing fields.
  """
  if isinstance(mode, losses.FilterConfig):
    mode, value, include_zero = mode.mode, mode.value, mode.include_zero
  _filters.check_filter_args(mode, value)

  def fn(batch):
    require(batch, ("loss_mask",), "filter_rollouts")
    batch = drop_nonfinite_episodes(batch)
    # Episodes dropped for a non-finite reward (scores zeroed) leave their
    # group's std: it ranks by the finite members' spread.
    res = losses.filter_groups(
        losses.as_groups("scores", episode_scores(batch), batch.group_size),
        mode, value, include_zero,
        losses.as_groups("row_valid", episode_valid(batch), batch.group_size))
    keep = to_rows(res.keep_rows, batch.turns_per_episode)
    if batch.keep is not None:
      require(batch, ("keep",), "filter_rollouts")
      keep = keep & jnp.asarray(batch.keep, jnp.bool_)
    mask = jnp.where(keep[:, None], batch.loss_mask,
                     jnp.zeros_like(batch.loss_mask))
    batch = batch.replace(loss_mask=mask, keep=keep)
    return add_metrics(batch, **dict(zip(FILTER_STAGE_METRICS, (
        res.kept_ratio, res.any_kept.astype(jnp.float32), res.std_mean,
        res.kept_std_mean))))

  return stateless(fn)


def with_filter_stage(objective: Objective) -> Transform:
  """``objective``'s batch transform with its filter in front, as a stage.

  ``chain(filter_rollouts(objective.filter_config), <objective's transform>)``,
  or the objective's transform alone when it has no filter. For running an
  objective on a whole batch by hand, outside :func:`jagent.train.rl_iteration`
  (which applies the filter itself, by compacting the kept groups).

  Args:
    objective: a :class:`Objective`.

  Returns:
    a :class:`Transform` whose ``update`` masks the groups the filter drops
    (``keep``, ``filter/*`` metrics) and then runs ``objective.update``.
  """
  own = Transform(objective.init, objective.update)
  if objective.filter_config is None:
    return own
  return chain(filter_rollouts(objective.filter_config), own)


# -------------------------------------------------------------- reward shaping
def _add_token_rewards(batch, extra_bs):
  """Adds per-token rewards, keeping explicit ``scores`` consistent."""
  rewards = _f32(batch.rewards) + extra_bs
  if batch.scores is not None:
    extra = jnp.sum(extra_bs * mask_of(batch), axis=1)
    t = batch.turns_per_episode
    if t > 1:  # the episode's score changes by the sum over its rows
      extra = to_rows(jnp.sum(extra.reshape(-1, t), axis=1), t)
    return batch.replace(rewards=rewards, scores=_f32(batch.scores) + extra)
  return batch.replace(rewards=rewards)


def penalize_format(penalty: float = losses.FORMAT_PENALTY) -> Transform:
  """Adds ``penalty`` (<= 0) to the reward of every turn with an invalid format.

  Reads ``format_valid`` ``[B, T]``, ``turn_ids``, ``loss_mask`` and
  ``rewards``; the penalty lands on the turn's last trained token (turns
  without trained tokens get none). ``scores``, if given, change by the same
  amount. Metric ``format/invalid_turn_frac``.

  For batches whose rewards do not hold the penalty yet (data from another
  sampler). A jagent rollout is the penalty's one home: it adds
  ``RolloutConfig.format_penalty`` to the rewards (as RAGEN's es_manager
  does), and :func:`jagent.train.trajectory_batch` leaves ``format_valid``
  out, so this stage cannot add it to such a batch a second time (it raises
  instead). No built-in objective includes it.

  Args:
    penalty: the reward added to a bad turn, <= 0 (RAGEN: -0.1; the sign of
      ``RolloutConfig.format_penalty``).

  Returns:
    a stateless :class:`Transform`.

  Raises:
    ValueError: for penalty > 0 or missing fields.

  References:
    RAGEN (https://arxiv.org/abs/2504.20073), format penalty -0.1 per turn.
  """
  _checks.check_in_range("penalty", penalty, -float("inf"), 0.0)

  def fn(batch):
    require(batch, ("rewards", "loss_mask", "turn_ids", "format_valid"),
            "penalize_format")
    if batch.turns_per_episode > 1:
      raise ValueError("penalize_format: Batch.turns_per_episode > 1 (turn "
                       "rows) is not supported; the rollout adds the format "
                       "penalty (RolloutConfig.format_penalty).")
    batch = drop_nonfinite_episodes(batch)
    t = jnp.shape(batch.format_valid)[1]
    m = mask_of(batch)
    ids = jnp.asarray(batch.turn_ids, jnp.int32)
    pen = jax.vmap(functools.partial(losses.format_penalty, penalty=penalty))(
        batch.format_valid)
    tok = jax.vmap(losses.turn_to_token_rewards)(pen, m, ids)
    exists = jax.vmap(functools.partial(losses.turn_mask, num_turns=t))(m, ids)
    invalid = (~jnp.asarray(batch.format_valid, jnp.bool_)) & exists
    batch = add_metrics(batch, **{"format/invalid_turn_frac": _masked_mean(
        invalid, exists.astype(jnp.float32))})
    return _add_token_rewards(batch, tok)

  return stateless(fn)


def normalize_rewards(eps: float = 1e-8) -> Transform:
  """Scales rewards by a running std of trajectory scores (stateful).

  The state (:class:`jagent.losses.RunningNormState`) absorbs the scores of
  the rows with trained tokens, then ``rewards`` (and ``scores``) are divided
  by ``std + eps`` (identity until two scores have been seen). Not centred:
  per-token rewards have no meaningful mean shift. Metric
  ``rewards/running_std``.

  Args:
    eps: > 0.

  Returns:
    a :class:`Transform` with a ``RunningNormState`` state.

  Raises:
    ValueError: for eps <= 0 or missing fields.
  """
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)

  def init(batch):
    del batch
    return losses.running_norm_init()

  def update(batch, state):
    require(batch, ("rewards", "loss_mask"), "normalize_rewards")
    batch = drop_nonfinite_episodes(batch)
    t = batch.turns_per_episode
    trained = jnp.sum(mask_of(batch), axis=1) > 0
    state = losses.running_norm_update(  # one score per episode
        episode_scores(batch), state,
        jnp.any(trained.reshape(-1, t), axis=1) if t > 1 else trained)
    scale = losses.running_norm_apply(jnp.ones(()), state, eps=eps)
    batch = batch.replace(rewards=_f32(batch.rewards) * scale)
    if batch.scores is not None:
      batch = batch.replace(scores=_f32(batch.scores) * scale)
    return add_metrics(batch, **{"rewards/running_std": 1.0 / scale}), state

  return Transform(init, update)


class KlControllerState(NamedTuple):
  """State of :func:`kl_reward_penalty`.

  Attributes:
    coef: float32 ``[]`` current KL coefficient.
  """
  coef: Array


def kl_reward_penalty(coef: float = 0.001, estimator: str = "k1",
                      target: float | None = None,
                      horizon: float = 10000.0) -> Transform:
  r"""KL penalty in the reward, with a fixed or adaptive coefficient.

  ``rewards -= beta * kl(old_logprobs, ref_logprobs)`` on trained tokens
  (``scores`` too, if given). With ``target`` the coefficient adapts after each
  batch: :math:`\beta \leftarrow \beta (1 + \mathrm{clip}(KL/target - 1,
  -0.2, 0.2)\, E / horizon)`, with KL the batch mean of per-row mean KL and
  ``E`` the number of valid episodes of the batch (verl's ``n_steps``, the
  batch size: ``B`` with one row per episode; with turn rows the episodes,
  not their ``B = E * T`` rows; episodes dropped for a non-finite reward do
  not count). Metrics ``kl_reward/kl`` and ``kl_reward/coef`` (the one
  applied).

  Args:
    coef: initial coefficient >= 0.
    estimator: a :data:`jagent.losses.KL_ESTIMATORS` name (verl: k1).
    target: target KL > 0 for the adaptive controller, or None (fixed).
    horizon: adaptive controller horizon > 0.

  Returns:
    a :class:`Transform` with a :class:`KlControllerState` state.

  Raises:
    ValueError: for bad hyperparameters or missing fields.

  References:
    Ziegler et al., "Fine-Tuning Language Models from Human Preferences"
    (https://arxiv.org/abs/1909.08593); verl ``AdaptiveKLController``.
  """
  _checks.check_in_range("coef", coef, 0.0, float("inf"))
  if estimator not in losses.KL_ESTIMATORS:
    raise ValueError(f"estimator must be one of {losses.KL_ESTIMATORS}; got "
                     f"{estimator!r}.")
  if target is not None:
    _checks.check_in_range("target", target, 0.0, float("inf"), lo_open=True)
  _checks.check_in_range("horizon", horizon, 0.0, float("inf"), lo_open=True)

  def init(batch):
    del batch
    return KlControllerState(jnp.asarray(coef, jnp.float32))

  def update(batch, state):
    require(batch, ("rewards", "loss_mask", "old_logprobs", "ref_logprobs"),
            "kl_reward_penalty")
    batch = drop_nonfinite_episodes(batch)
    m = mask_of(batch)
    kl = losses.kl_penalty(batch.old_logprobs, batch.ref_logprobs, estimator)
    kl = jax.lax.stop_gradient(kl) * m
    batch = _add_token_rewards(batch, -state.coef * kl)
    per_seq = losses.seq_mean_token_mean(kl, m)
    current = losses.safe_ratio(per_seq.total, per_seq.denominator)
    new_coef = state.coef
    if target is not None:
      err = jnp.clip(current / target - 1.0, -0.2, 0.2)
      # n_steps counts episodes (verl: the batch's sequences), not turn rows.
      episodes = jnp.sum(episode_valid(batch).astype(jnp.float32))
      new_coef = state.coef * (1.0 + err * episodes / horizon)
    batch = add_metrics(batch, **{"kl_reward/kl": current,
                                  "kl_reward/coef": state.coef})
    return batch, KlControllerState(new_coef)

  return Transform(init, update)


def truncate_importance_weights(cap: float = 2.0) -> Transform:
  """Sets ``is_weights = min(pi_old / pi_sampler, cap)`` (TIS).

  The policy loss terms multiply the per-token loss by ``is_weights``.
  Metrics ``tis/mean_weight`` and ``tis/capped_frac``.

  Args:
    cap: > 0 (verl ``tis_imp_ratio_cap``; 2.0).

  Returns:
    a stateless :class:`Transform`.

  Raises:
    ValueError: for cap <= 0 or missing old/sampler log-probs.
  """
  _checks.check_in_range("cap", cap, 0.0, float("inf"), lo_open=True)

  def fn(batch):
    require(batch, ("old_logprobs", "sampler_logprobs", "loss_mask"),
            "truncate_importance_weights")
    w = losses.truncated_importance_weights(batch.old_logprobs,
                                            batch.sampler_logprobs, cap)
    m = mask_of(batch)
    return add_metrics(batch.replace(is_weights=w), **{
        "tis/mean_weight": _masked_mean(w, m),
        "tis/capped_frac": _masked_mean(w >= cap, m)})

  return stateless(fn)
