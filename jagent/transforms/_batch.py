"""The batch pytree that every transform consumes, and the loss I/O types.

Shapes: ``B`` token rows, ``S`` token positions (the padded context, or the
trained window), ``T`` assistant turns.

One row layout (:func:`jagent.train.trajectory_batch` maps a rollout's rows
one to one): every episode owns ``P = Batch.turns_per_episode`` consecutive
rows, so ``E = B / P`` episodes, episode-major (row ``r`` belongs to episode
``r // P``, and episode ``e`` to group ``e // G``: ``G = group_size`` counts
EPISODES, so a group is ``G * P`` consecutive rows). Each sampled token names
its turn in ``turn_ids``; ``anchor_hashes`` is ``[B, T / P]``, the anchors of
the turns the row holds. Row fields (``scores``, ``terminated``,
``bootstrap_values``) hold the episode's value on each of its rows;
``row_valid`` is False on rows that hold no taken turn (they have no trained
token). With ``P = 1`` a row is a whole episode (its turns told apart by
``turn_ids``); with ``P = T > 1`` (turn rows, a bounded-history rollout) a
row is ONE turn of its episode: row ``r`` is turn ``r % T``. Stages compute
over episodes on the whole batch (trajectory-level advantages, group
statistics) and write per-row results; the losses only read per-row fields,
so micro-batches may split episodes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jagent._src import checks
from jagent._src.types import Array

TOKEN_FIELDS = ("tokens", "loss_mask", "sampler_logprobs", "old_logprobs",
                "ref_logprobs", "values", "rewards", "turn_ids", "advantages",
                "returns", "is_weights")
TURN_FIELDS = ("anchor_hashes", "format_valid", "tree_nodes")
ROW_FIELDS = ("scores", "terminated", "bootstrap_values", "keep", "row_valid",
              "episode_turns")
NONFINITE_KEY = "rollout/nonfinite_episodes"
"""Batch metric: episodes dropped for a non-finite reward or score."""


@struct.dataclass
class Batch:
  """One batch of rollouts as every objective sees it; absent fields are None.

  Rollout fields are filled by the caller; stages add the derived ones
  (advantages, returns, weights, keep mask, metrics) with ``.replace``. A stage
  raises ValueError naming the field when something it needs is None.

  Attributes:
    tokens: int32 ``[B, S]`` token ids (not read by the losses; kept for
      callers that micro-batch the batch together with the model inputs).
    loss_mask: float32 or bool ``[B, S]``, 1 on trained tokens (the sampled
      assistant tokens). Filters zero the rows they drop.
    sampler_logprobs: float32 ``[B, S]`` log-probs reported by the sampler.
    old_logprobs: float32 ``[B, S]`` log-probs of the pre-update trainer
      policy (PPO's pi_old). If None the loss uses the current log-probs with
      the gradient stopped (ratio 1, on-policy).
    ref_logprobs: float32 ``[B, S]`` log-probs of the reference policy.
    values: float32 ``[B, S]`` critic values at rollout time.
    rewards: float32 ``[B, S]`` per-token rewards; a turn's reward sits on
      its last trained token (verl convention). Rewards on untrained tokens are
      ignored.
    scores: float32 ``[B]`` trajectory scores. If None, ``sum(rewards *
      loss_mask)`` over the row (see :func:`trajectory_scores`).
    terminated: bool ``[B]``; False = truncated (GAE bootstraps). If None,
      every row counts as terminated.
    bootstrap_values: float32 ``[B]`` value after the last step of truncated
      rows. If None, 0.
    turn_ids: int32 ``[B, S]`` assistant-turn index of each token (-1 or any
      value on untrained tokens).
    anchor_hashes: int32 ``[B, T / P]`` hash of the state each turn the row
      holds acted from (GiGPO): ``[B, T]`` with one row per episode, ``[B,
      1]`` (the row's own turn) with turn rows.
    format_valid: bool ``[B, T]`` per-turn format validity (format penalty);
      turns past the end of a trajectory are ignored.
    tree_nodes: int32 ``[B, T]`` tree rollouts: the node (shared agent step)
      the row's episode is at in turn t, -1 where no turn was taken
      (``jagent.rollout.Trajectory.tree_node``; with turn rows, the
      episode's nodes on each of its rows). Tree stages read it.
    advantages: float32 ``[B, S]`` (added by an advantage stage).
    returns: float32 ``[B, S]`` value targets (added by GAE stages).
    is_weights: float32 ``[B, S]`` truncated importance weights (TIS stage).
    keep: bool ``[B]`` rows kept by a rollout filter.
    row_valid: bool ``[B]`` rows that may train; False rows train nothing and
      leave their group's statistics (e.g. an episode with a non-finite
      reward, see :func:`drop_nonfinite_episodes`; with turn rows, the rows
      of turns not taken). None: every row.
    episode_turns: float32 ``[B]`` with turn rows, the number of valid rows
      of the row's episode (how the losses weigh an episode, see
      :func:`jagent.transforms.make_loss`'s ``turn_weighting``). Filled by
      :func:`jagent.train.trajectory_batch` and, if None, by the first stage.
      None with one row per episode.
    metrics: dict of float32 ``[]`` diagnostics added by stages (filter kept
      ratio, reward std before/after, KL coefficient, ...).
    group_size: static int ``G`` (rollouts per initial state), dividing ``B``.
    turns_per_episode: static int ``P`` rows per episode (see the module
      docstring): 1, a row holds the whole episode; ``T``, one row per turn.
    tree_size: static int, episodes per tree of a tree rollout (dividing
      ``group_size``; 0: not a tree rollout).
  """
  tokens: Array | None = None
  loss_mask: Array | None = None
  sampler_logprobs: Array | None = None
  old_logprobs: Array | None = None
  ref_logprobs: Array | None = None
  values: Array | None = None
  rewards: Array | None = None
  scores: Array | None = None
  terminated: Array | None = None
  bootstrap_values: Array | None = None
  turn_ids: Array | None = None
  anchor_hashes: Array | None = None
  format_valid: Array | None = None
  tree_nodes: Array | None = None
  advantages: Array | None = None
  returns: Array | None = None
  is_weights: Array | None = None
  keep: Array | None = None
  row_valid: Array | None = None
  episode_turns: Array | None = None
  metrics: dict[str, Array] = struct.field(default_factory=dict)
  group_size: int = struct.field(pytree_node=False, default=1)
  turns_per_episode: int = struct.field(pytree_node=False, default=1)
  tree_size: int = struct.field(pytree_node=False, default=0)

  def select_rows(self, start: int, stop: int) -> "Batch":
    """Rows ``[start, stop)`` of every array field (a micro-batch).

    Metrics are dropped (they describe the whole batch). ``group_size`` is
    kept; the losses do not use it.

    Args:
      start: first row (Python int).
      stop: one past the last row (Python int).

    Returns:
      a :class:`Batch` with ``stop - start`` rows.
    """
    rows = self.replace(metrics={})
    return jax.tree.map(lambda x: x[start:stop], rows)


class ModelOutputs(NamedTuple):
  """What the model computes inside the gradient for the final loss.

  Attributes:
    logprobs: float32 ``[B, S]`` current-policy log-probs of the sampled
      tokens (aligned with ``Batch.loss_mask``).
    values: float32 ``[B, S]`` current critic values, or None (no critic).
    entropy: float32 ``[B, S]`` per-token policy entropy, or None.
  """
  logprobs: Array
  values: Array | None = None
  entropy: Array | None = None


class LossOutput(NamedTuple):
  """An unreduced objective: the loss is ``loss_sum / denominator``.

  Summing ``loss_sum`` and ``denominator`` over micro-batches and dividing
  once gives exactly the full-batch loss.

  Attributes:
    loss_sum: float32 ``[]``.
    denominator: float32 ``[]`` (no gradient; 0 if nothing is trained).
    metrics: dict of float32 ``[]`` means over this call's trained tokens.
  """
  loss_sum: Array
  denominator: Array
  metrics: dict[str, Any]


def require(batch: Batch, fields: tuple[str, ...], stage: str) -> None:
  """Raises ValueError if any of ``fields`` is None or has a bad shape.

  Token fields must be ``[B, S]`` with one shared shape, turn fields
  ``[B, T]`` and row fields ``[B]``.

  Args:
    batch: the :class:`Batch`.
    fields: names of fields the stage reads.
    stage: the stage's name, for the message.

  Raises:
    ValueError: naming the first missing or mis-shaped field.
  """
  missing = [f for f in fields if getattr(batch, f) is None]
  if missing:
    raise ValueError(f"{stage} needs Batch.{missing[0]}, which is None "
                     f"(needs {', '.join(fields)}).")
  token_shape = None
  rows = None
  for f in fields:
    shape = tuple(np.shape(getattr(batch, f)))
    want = 2 if f in TOKEN_FIELDS + TURN_FIELDS else 1
    if len(shape) != want:
      raise ValueError(f"{stage}: Batch.{f} must have rank {want}; got shape "
                       f"{shape}.")
    if f in TOKEN_FIELDS:
      if token_shape is not None and shape != token_shape:
        raise ValueError(f"{stage}: Batch.{f} has shape {shape}, other token "
                         f"fields {token_shape}.")
      token_shape = shape
    if rows is not None and shape[0] != rows:
      raise ValueError(f"{stage}: Batch.{f} has {shape[0]} rows, expected "
                       f"{rows}.")
    rows = shape[0]
  if rows is not None and rows % batch.group_size:
    raise ValueError(f"{stage}: group_size {batch.group_size} does not divide "
                     f"the {rows} rows of the batch.")
  t = checks.check_int(f"{stage}: turns_per_episode", batch.turns_per_episode, 1)
  if rows is not None and rows % (t * batch.group_size):
    raise ValueError(f"{stage}: turns_per_episode {t} x group_size "
                     f"{batch.group_size} does not divide the {rows} rows of "
                     f"the batch.")


def mask_of(batch: Batch) -> Array:
  """``loss_mask`` as float32 ``[B, S]``."""
  return jnp.asarray(batch.loss_mask, jnp.float32)


def trajectory_scores(batch: Batch) -> Array:
  """Trajectory scores ``[B]``: ``batch.scores`` or ``sum(rewards * mask)``.

  Args:
    batch: a :class:`Batch` with ``scores``, or ``rewards`` and ``loss_mask``.

  Returns:
    float32 ``[B]``.

  Raises:
    ValueError: if neither is available.
  """
  if batch.scores is not None:
    require(batch, ("scores",), "trajectory_scores")
    return jnp.asarray(batch.scores, jnp.float32)
  require(batch, ("rewards", "loss_mask"), "trajectory_scores")
  return jnp.sum(jnp.asarray(batch.rewards, jnp.float32) * mask_of(batch),
                 axis=1)


def add_metrics(batch: Batch, **metrics: Array) -> Batch:
  """Returns ``batch`` with ``metrics`` merged into ``batch.metrics``."""
  return batch.replace(metrics={**batch.metrics, **metrics})


def drop_nonfinite_episodes(batch: Batch) -> Batch:
  """Invalidates the rows whose reward or score is not finite (NaN, inf).

  A host environment may return a non-finite reward; left alone it makes its
  group's mean/std (and so the whole update) NaN, and the step is skipped.
  Instead such a row gets ``row_valid`` False, ``loss_mask`` all zero and its
  ``rewards``/``scores`` set to 0, so it trains nothing, the advantage stages
  leave it out of its group's statistics (they read ``row_valid``), and the
  other rows train (TRL PR #5773's case). With turn rows a non-finite value
  in any row drops every row of its episode, and ``episode_turns`` is filled
  if None. Every stage that reads rewards or scores calls this first; it runs
  once per batch (the metric :data:`NONFINITE_KEY`, the count of dropped
  episodes, marks it done). With finite input every field keeps its values
  (``row_valid`` becomes all True if it was None).

  Why in every stage and not once at an entry point (``trajectory_batch``,
  ``Objective.update``): the stages are public and compose on their own
  (``transforms.chain``, ``transforms.make_advantage``, a user's own loop
  over a Batch built by hand), so each must be correct on its own input; an
  entry point would cover rollouts or objectives only, and GAE's whitening
  would turn one NaN reward into NaN advantages for the whole batch of a
  bare stage. The marker is a key of the metrics dict, part of the pytree's
  static structure: the later stages' calls return at trace time and add
  nothing to the compiled program.

  Args:
    batch: a :class:`Batch` with ``loss_mask`` and optionally ``rewards``
      ``[B, S]``, ``scores`` ``[B]`` and ``row_valid`` ``[B]``.

  Returns:
    the :class:`Batch` with the metric ``rollout/nonfinite_episodes``.

  Raises:
    ValueError: a missing ``loss_mask`` or mis-shaped fields.
  """
  if NONFINITE_KEY in batch.metrics:  # static: already applied to this batch
    return batch
  present = tuple(f for f in ("rewards", "scores", "row_valid")
                  if getattr(batch, f) is not None)
  require(batch, ("loss_mask",) + present, "drop_nonfinite_episodes")
  rows = jnp.shape(batch.loss_mask)[0]
  ok = jnp.ones((rows,), jnp.bool_)
  if batch.rewards is not None:
    ok &= jnp.all(jnp.isfinite(batch.rewards), axis=1)
  if batch.scores is not None:
    ok &= jnp.isfinite(batch.scores)
  t = batch.turns_per_episode
  ok_e = jnp.all(ok.reshape(-1, t), axis=1)  # a bad turn drops its episode
  ok = to_rows(ok_e, t)
  valid = ok if batch.row_valid is None else ok & jnp.asarray(
      batch.row_valid, jnp.bool_)
  zeros = jnp.zeros_like
  out = batch.replace(
      loss_mask=jnp.where(ok[:, None], batch.loss_mask, zeros(batch.loss_mask)),
      row_valid=valid)
  if batch.rewards is not None:
    out = out.replace(rewards=jnp.where(ok[:, None], batch.rewards,
                                        zeros(batch.rewards)))
  if batch.scores is not None:
    out = out.replace(scores=jnp.where(ok, batch.scores, zeros(batch.scores)))
  if t > 1 and batch.episode_turns is None:
    out = out.replace(episode_turns=to_rows(jnp.sum(
        valid.reshape(-1, t).astype(jnp.float32), axis=1), t))
  return add_metrics(out, **{NONFINITE_KEY: jnp.sum(
      (~ok_e).astype(jnp.float32))})


def valid_rows(batch: Batch) -> Array:
  """``row_valid`` as bool ``[B]`` (all True when None)."""
  if batch.row_valid is None:
    return jnp.ones((jnp.shape(batch.loss_mask)[0],), jnp.bool_)
  return jnp.asarray(batch.row_valid, jnp.bool_)


def to_rows(x_e: Array, turns_per_episode: int) -> Array:
  """Episode values ``[E, ...]`` on each of their rows: ``[E * T, ...]``."""
  if turns_per_episode == 1:
    return x_e
  return jnp.repeat(x_e, turns_per_episode, axis=0)


def episode_view(x_r: Array, turns_per_episode: int) -> Array:
  """The value of each episode's first row: ``[E * T, ...]`` -> ``[E, ...]``.

  For row fields that hold the episode's value on every row (``scores``,
  ``terminated``, ...); turn 0 is always a taken turn.
  """
  if turns_per_episode == 1:
    return x_r
  x = jnp.asarray(x_r)
  return x.reshape((-1, turns_per_episode) + x.shape[1:])[:, 0]


def episode_tokens(x_rs: Array, turns_per_episode: int) -> Array:
  """Each episode's rows side by side: ``[E * T, S]`` -> ``[E, T * S]``.

  The replies of an episode's turns, in turn order, each masked where it is
  not trained, as the one sequence of the full-history layout: token-level
  recursions (discounted returns, bi-level GAE) run over it unchanged.
  """
  x = jnp.asarray(x_rs)
  return x.reshape(-1, turns_per_episode * x.shape[1])


def episode_scores(batch: Batch) -> Array:
  """float32 ``[E]`` episode scores (``[B]`` = trajectory_scores with one row
  per episode): ``scores`` of the episode's first row, or the sum of
  ``rewards * loss_mask`` over all its rows."""
  t = batch.turns_per_episode
  if t == 1 or batch.scores is not None:
    return episode_view(trajectory_scores(batch), t)
  return jnp.sum(trajectory_scores(batch).reshape(-1, t), axis=1)


def episode_valid(batch: Batch) -> Array:
  """bool ``[E]``: episodes with a valid row (see :func:`valid_rows`)."""
  t = batch.turns_per_episode
  return jnp.any(valid_rows(batch).reshape(-1, t), axis=1)
