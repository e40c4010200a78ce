"""Advantage stages of tree rollouts (``Batch.tree_nodes``, ``Batch.tree_size``).

Each reads the episodes' scores and tree nodes, computes one advantage per
(episode, turn) with :mod:`jagent.losses` (:func:`jagent.losses.
tree_grpo_advantages`, :func:`jagent.losses.tree_step_advantages`) per
group, and puts it on the trained tokens of that turn: with one row per
episode the tokens whose ``turn_ids`` is t, with turn rows every trained
token of the turn's row. A tree rollout trains a shared step once, in the
row that sampled it (its ``loss_mask``), so each node gets its advantage
once.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jagent import losses
from jagent.losses import _checks
from jagent.transforms._base import stateless
from jagent.transforms._base import Transform
from jagent.transforms._batch import add_metrics
from jagent.transforms._batch import Batch
from jagent.transforms._batch import drop_nonfinite_episodes
from jagent.transforms._batch import episode_scores
from jagent.transforms._batch import episode_valid
from jagent.transforms._batch import episode_view
from jagent.transforms._batch import mask_of
from jagent.transforms._batch import require


def _turn_advantages_to_tokens(batch: Batch, adv_et, m):
  """float32 [B, S]: the [E, T] per-turn advantages on each turn's trained tokens."""
  e, t = adv_et.shape
  if batch.turns_per_episode > 1:  # row r is turn r % T of episode r // T
    return adv_et.reshape(-1)[:, None] * m
  ids = jnp.asarray(batch.turn_ids, jnp.int32)
  adv = jnp.take_along_axis(adv_et, jnp.clip(ids, 0, t - 1), axis=1)
  return jnp.where((ids >= 0) & (ids < t), adv, 0.0) * m


def _tree_stage(name: str, per_group) -> Transform:
  """A stage applying ``per_group(scores [G], nodes [G, T], valid [G], tree_size)``."""

  def fn(batch):
    fields = ("loss_mask", "tree_nodes") + (
        ("turn_ids",) if batch.turns_per_episode == 1 else ())
    require(batch, fields, name)
    _checks.check_integer("Batch.tree_nodes", batch.tree_nodes)
    g, n = batch.group_size, batch.tree_size
    if not isinstance(n, int) or n < 1 or g % n:
      raise ValueError(f"{name}: Batch.tree_size={n!r} must be an int >= 1 dividing "
                       f"group_size={g} (a tree rollout's Trajectory.tree_size).")
    batch = drop_nonfinite_episodes(batch)
    nodes = jnp.asarray(episode_view(batch.tree_nodes, batch.turns_per_episode), jnp.int32)
    e, t = nodes.shape
    adv_et = jax.vmap(lambda s, x, v: per_group(s, x, v, n))(
        episode_scores(batch).reshape(-1, g), nodes.reshape(-1, g, t),
        episode_valid(batch).reshape(-1, g)).reshape(e, t)
    m = mask_of(batch)
    adv = _turn_advantages_to_tokens(batch, adv_et, m)
    return add_metrics(batch.replace(advantages=adv), **{
        "advantages/mean": losses.safe_ratio(jnp.sum(adv), jnp.sum(m)),
        "advantages/abs_mean": losses.safe_ratio(jnp.sum(jnp.abs(adv)), jnp.sum(m))})

  return stateless(fn)


def compute_tree_grpo(eps: float = 1e-6, combine: str = "sum",
                      node_reduce: str = "mean") -> Transform:
  """Tree-GRPO stage: intra- plus inter-tree group advantages per node.

  :func:`jagent.losses.tree_grpo_advantages` per group (Ji et al., arXiv
  2509.21240, Sec. 3.2), put on each node's trained tokens. Reads
  ``loss_mask``, ``tree_nodes``, ``turn_ids`` (one row per episode),
  ``scores`` (or ``rewards``), the static ``tree_size`` and ``group_size``.

  Args:
    eps: std floor, > 0.
    combine: ``"sum"`` (the paper) or ``"nested"`` (the released code).
    node_reduce: ``"mean"`` or ``"sum"`` of a shared node's leaves.

  Returns:
    a stateless :class:`Transform` setting ``advantages``.

  Raises:
    ValueError: bad hyperparameters (here) or missing fields / a
      ``tree_size`` not dividing ``group_size`` (at update).
  """
  _checks.check_in_range("eps", eps, 0.0, float("inf"), lo_open=True)
  if combine not in losses.TREE_COMBINES:
    raise ValueError(f"combine={combine!r}: must be one of {losses.TREE_COMBINES}.")
  if node_reduce not in losses.NODE_REDUCES:
    raise ValueError(f"node_reduce={node_reduce!r}: must be one of {losses.NODE_REDUCES}.")
  return _tree_stage("compute_tree_grpo", lambda s, x, v, n: losses.tree_grpo_advantages(
      s, x, n, v, eps=eps, combine=combine, node_reduce=node_reduce))


def compute_tree_step() -> Transform:
  """Exact step-baseline stage: each turn's node value minus its siblings' mean.

  :func:`jagent.losses.tree_step_advantages` per group (a node's value is
  the mean score of its subtree's leaves), put on the turn's trained
  tokens. Reads the fields of :func:`compute_tree_grpo`.

  Returns:
    a stateless :class:`Transform` setting ``advantages``.
  """
  return _tree_stage("compute_tree_step",
                     lambda s, x, v, n: losses.tree_step_advantages(s, x, v))
