"""Advantages of tree rollouts: Tree-GRPO and an exact step baseline.

One group holds ``G`` episodes (root-to-leaf paths) of ``M`` trees of ``n``
rows each (``G = M n``, tree ``e // n``). ``nodes_g`` int32 ``[G, T]`` is
the node each episode is at in turn t (equal ids = one shared step, sampled
once; -1 = no turn): ``jagent.rollout.Trajectory.tree_node``. The parent of
the node at turn t is the episode's node at turn t - 1; every node at turn
0 has the group's initial state as its parent. Every function returns a
per-turn advantage ``[G, T]``, equal on the episodes that share the node,
which the caller puts on the node's tokens (only its sampling row trains
them, so each step is trained once).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent.losses import _advantages
from jagent.losses import _checks

TREE_COMBINES = ("sum", "nested")
"""How Tree-GRPO joins its two levels (see :func:`tree_grpo_advantages`)."""
NODE_REDUCES = ("mean", "sum")
"""How a shared node's advantage joins its leaves' (see :func:`tree_grpo_advantages`)."""


def _check_tree_group(scores_g, nodes_g, valid_g):
  s = _checks.f32(scores_g)
  nodes = jnp.asarray(nodes_g)
  if s.ndim != 1 or nodes.ndim != 2 or nodes.shape[0] != s.shape[0]:
    raise ValueError(f"tree advantages need scores_g [G] and nodes_g [G, T]; got shapes "
                     f"{s.shape} and {nodes.shape}.")
  _checks.check_integer("nodes_g", nodes)
  valid = jnp.ones(s.shape, bool) if valid_g is None else jnp.asarray(valid_g, bool)
  valid = valid & jnp.isfinite(s)
  return jnp.where(valid, s, 0.0), nodes.astype(jnp.int32), valid


def _same_node(nodes, valid):
  """bool [T, G, G]: episodes e, e' valid at the same node of turn t."""
  n_t = nodes.T  # [T, G]
  taken = (n_t >= 0) & valid[None]
  return (n_t[:, :, None] == n_t[:, None, :]) & taken[:, :, None] & taken[:, None, :]


def tree_node_values(scores_g: ArrayLike, nodes_g: ArrayLike,
                     valid_g: ArrayLike | None = None) -> Array:
  r"""Node values of one group: :math:`V(n)` = mean score of the leaves below ``n``.

  An episode is a leaf; the leaves below the node of episode e at turn t are
  the valid episodes at that node.

  Args:
    scores_g: float ``[G]`` episode scores (returns of the root-to-leaf paths).
    nodes_g: int ``[G, T]`` node ids, -1 where no turn was taken.
    valid_g: optional bool ``[G]``; invalid or non-finite episodes count
      as no leaf.

  Returns:
    float32 ``[G, T]``: ``V`` of episode e's node at turn t (0 where none).

  Raises:
    ValueError: bad shapes or non-integer ``nodes_g``.
  """
  s, nodes, valid = _check_tree_group(scores_g, nodes_g, valid_g)
  same = _same_node(nodes, valid).astype(jnp.float32)  # [T, G, G]
  cnt = jnp.sum(same, axis=2)
  v = jnp.einsum("tij,j->ti", same, s) / jnp.maximum(cnt, 1.0)
  return jnp.where(cnt > 0, v, 0.0).T


def tree_step_advantages(scores_g: ArrayLike, nodes_g: ArrayLike,
                         valid_g: ArrayLike | None = None) -> Array:
  r"""Exact step baseline of one group: a turn's node value minus its siblings' mean.

  :math:`A_t(e) = V(n_t) - \frac{1}{|C(p)|}\sum_{c \in C(p)} V(c)` where
  :math:`n_t` is episode e's node at turn t, :math:`p` its parent and
  :math:`C(p)` the children of :math:`p` (the distinct nodes at turn t with
  that parent, each once however many leaves it has; at turn 0 the parent
  is the group's initial state, so the roots of the group's trees are
  siblings). :math:`V` is :func:`tree_node_values`. The baseline is the
  empirical value of the parent's state under the policy's branching, so
  a step that was not branched (one child) gets 0, and the rewards before
  turn t (shared by all siblings) cancel. Equal to GRPO's
  :math:`s - \mathrm{mean}` (Dr.GRPO) when every episode is its own root.

  Args:
    scores_g: float ``[G]`` episode scores.
    nodes_g: int ``[G, T]`` node ids, -1 where no turn was taken.
    valid_g: optional bool ``[G]``; invalid or non-finite episodes are no
      leaves and get 0.

  Returns:
    float32 ``[G, T]`` (0 on turns not taken and invalid episodes).

  Raises:
    ValueError: bad shapes or non-integer ``nodes_g``.
  """
  s, nodes, valid = _check_tree_group(scores_g, nodes_g, valid_g)
  v = tree_node_values(s, nodes, valid).T  # [T, G]
  cnt = jnp.sum(_same_node(nodes, valid).astype(jnp.float32), axis=2)  # [T, G]
  parents = jnp.pad(nodes[:, :-1], ((0, 0), (1, 0)), constant_values=-1).T  # [T, G]
  taken = (nodes.T >= 0) & valid[None]
  sib = (parents[:, :, None] == parents[:, None, :]) & taken[:, :, None] & taken[:, None, :]
  # Each sibling node once: an episode at a node of c leaves weighs 1 / c.
  w = sib.astype(jnp.float32) / jnp.maximum(cnt, 1.0)[:, None, :]
  mean_sib = jnp.sum(w * v[:, None, :], axis=2) / jnp.maximum(jnp.sum(w, axis=2), 1e-30)
  return jnp.where(taken, v - mean_sib, 0.0).T


def tree_grpo_advantages(scores_g: ArrayLike, nodes_g: ArrayLike, tree_size: int,
                         valid_g: ArrayLike | None = None, *, eps: float = 1e-6,
                         combine: str = "sum", node_reduce: str = "mean") -> Array:
  r"""Tree-GRPO advantages of one group (Ji et al., arXiv 2509.21240, Sec. 3.2).

  Per leaf (episode) e of tree :math:`\mathcal{T}` in the group of all the
  prompt's trees :math:`\mathcal{G}`:

  * intra-tree: :math:`\hat A_{intra}(e) = (R_e - \mathrm{mean}_{\mathcal T}
    R) / \mathrm{std}_{\mathcal T} R`;
  * inter-tree: :math:`\hat A_{inter}(e) = (R_e - \mathrm{mean}_{\mathcal G}
    R) / \mathrm{std}_{\mathcal G} R`;
  * ``combine="sum"``: :math:`\hat A = \hat A_{intra} + \hat A_{inter}`, the
    paper's Tree-GRPO advantage. ``combine="nested"``: the released code's
    (AMAP-ML/Tree-GRPO ``verl/trainer/ppo/core_algos.py``,
    ``compute_tree_grpo_outcome_advantage``): the inter-tree normalised
    scores normalised again within the tree.

  Each normalisation is :func:`jagent.losses.grpo_advantages` (unbiased std
  plus ``eps``; invalid members left out). A node's tokens appear in every
  leaf of its subtree in the paper's training (one sequence per leaf); here
  they are sampled and trained once, with ``node_reduce`` of its leaves'
  advantages: ``"mean"`` (the per-token scale of a chain) or ``"sum"`` (the
  paper's gradient: one copy per leaf).

  Args:
    scores_g: float ``[G]`` episode scores.
    nodes_g: int ``[G, T]`` node ids, -1 where no turn was taken.
    tree_size: n, episodes per tree (dividing G).
    valid_g: optional bool ``[G]``.
    eps: std floor, > 0.
    combine: one of :data:`TREE_COMBINES`.
    node_reduce: one of :data:`NODE_REDUCES`.

  Returns:
    float32 ``[G, T]``: the advantage of episode e's node at turn t (0 where
    no turn was taken and on invalid episodes).

  Raises:
    ValueError: bad shapes, ``tree_size`` not dividing G, or an unknown
      ``combine`` / ``node_reduce``.
  """
  if combine not in TREE_COMBINES:
    raise ValueError(f"combine={combine!r}: must be one of {TREE_COMBINES}.")
  if node_reduce not in NODE_REDUCES:
    raise ValueError(f"node_reduce={node_reduce!r}: must be one of {NODE_REDUCES}.")
  s, nodes, valid = _check_tree_group(scores_g, nodes_g, valid_g)
  g = s.shape[0]
  if not isinstance(tree_size, int) or tree_size < 1 or g % tree_size:
    raise ValueError(f"tree_size={tree_size!r} must be an int >= 1 dividing the group's {g} "
                     "episodes.")
  grpo = lambda x, v: _advantages.grpo_advantages(x, eps=eps, valid_g=v)  # noqa: E731
  intra = lambda x: jax.vmap(grpo)(x.reshape(-1, tree_size),  # noqa: E731
                                   valid.reshape(-1, tree_size)).reshape(g)
  inter = grpo(s, valid)
  leaf = intra(s) + inter if combine == "sum" else intra(inter)
  leaf = jnp.where(valid, leaf, 0.0)
  same = _same_node(nodes, valid).astype(jnp.float32)  # [T, G, G]
  total = jnp.einsum("tij,j->ti", same, leaf)
  if node_reduce == "mean":
    total = total / jnp.maximum(jnp.sum(same, axis=2), 1.0)
  return jnp.where((nodes.T >= 0) & valid[None], total, 0.0).T
