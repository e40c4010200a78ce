"""Tree rollouts: episodes that fork, environment state and context included.

A tree rollout (``RolloutConfig.tree``) grows each group's episodes as trees
of agent steps (Tree-GRPO, Ji et al., "Tree Search for LLM Agent
Reinforcement Learning", arXiv 2509.21240, Sec. 3.1: a node is a whole turn,
reply, actions and observation). Shapes stay static: a group of ``G`` rows
holds ``trees`` trees of ``n`` rows each (:meth:`TreeConfig.rows_per_tree`).
Only the first row of a tree is alive at the start; the others are "not yet
alive" (done, sampling nothing) until a fork copies a node into them. At the
start of a fork turn ``t`` the ``expand`` chosen running nodes of a tree
each fork into ``K`` children: the node's own row goes on as child 0 and
``K - 1`` unborn rows become children ``1 .. K - 1``. A fork is one gather
along the row axis of everything the rollout carries (environment state, KV
cache or token segments, token buffers, turn counters, action budgets, done
flags, per-turn books, RNG keys), so a child starts as an exact copy of its
parent; then each of the K children's sampling and environment keys become
``fold_in(parent key, child index)`` and they diverge.

Every row samples with its own keys (one per row, split from the rollout's),
so a row's tokens depend only on its own state, context and keys: a forked
branch is token for token the rollout a lone row would play from the same
state, context and key. The copied prefix is NOT sampled again and is not
counted again: a row's ``loss_mask`` marks only the tokens it sampled itself,
so ``sum(loss_mask)`` is the tokens sampled, and every turn is trained once,
in the row that sampled it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jagent._src.errors import FieldError
from jagent.models import _sampling
from jagent.models import _transformer

SELECTS = ("random", "return")
"""How a tree picks the nodes it expands: at random, or the highest return so far."""


@dataclasses.dataclass(frozen=True)
class TreeConfig:
  """How the episodes of a group grow as trees (see the module docstring).

  Attributes:
    fork_turns: 0-based turns, strictly increasing, at whose start chosen
      nodes fork (before the turn's prompt is rendered and its reply sampled;
      turn 0 forks right after the first prompt).
    branches: K >= 2 children per expanded node, one value for every fork
      turn or one per fork turn.
    expand: nodes expanded per tree at each fork turn (one value or one per
      fork turn); None: every node the tree has then. Only running nodes
      fork; a pick that has ended leaves its children's rows unborn.
    trees: trees per group (per initial state): Tree-GRPO's M.
    select: ``"random"`` (uniform among running nodes, Tree-GRPO's
      choice) or ``"return"`` (the highest reward so far first, ties at
      random).

  Raises:
    jagent.FieldError: from :func:`check_tree` (called by ``RolloutConfig``),
      naming the bad field.
  """

  fork_turns: tuple[int, ...] = (1,)
  branches: int | tuple[int, ...] = 2
  expand: int | None | tuple[int | None, ...] = None
  trees: int = 1
  select: str = "random"

  def _per_fork(self, name):
    v = getattr(self, name)
    vals = tuple(v) if isinstance(v, (tuple, list)) else (v,) * len(self.fork_turns)
    if len(vals) != len(self.fork_turns):
      raise ValueError(f"RolloutConfig.tree.{name}={v!r}: needs one value, or one per fork "
                       f"turn (fork_turns={self.fork_turns!r})")
    return vals

  def plan(self) -> tuple[tuple[int, int, int, int], ...]:
    """Per fork: ``(turn, K, nodes expanded, rows alive before)`` of one tree."""
    out, alive = [], 1
    for t, k, e in zip(self.fork_turns, self._per_fork("branches"), self._per_fork("expand")):
      e = alive if e is None else e
      out.append((t, k, e, alive))
      alive += e * (k - 1)
    return tuple(out)

  def rows_per_tree(self) -> int:
    """n: rows of one tree, ``1 + sum(expand_i * (K_i - 1))``."""
    t, k, e, alive = self.plan()[-1]
    return alive + e * (k - 1)

  def full_turns(self, max_turns: int) -> int:
    """Turns one tree samples when no episode ends before ``max_turns``.

    A turn is sampled once per node: turn ``t`` by the rows alive after the
    forks at turns ``<= t`` (a chain of ``n`` episodes samples ``n *
    max_turns``). With ``fork_turns=(1, 2)``, ``branches=(2, 4)`` and 5
    turns: ``1 + 2 + 8 * 3 = 27`` turns for 8 episodes, against 40.
    """
    alive, total, forks = 1, 0, {t: (k, e) for t, k, e, _ in self.plan()}
    for t in range(max_turns):
      if t in forks:
        alive += forks[t][1] * (forks[t][0] - 1)
      total += alive
    return total

  def group_size(self) -> int:
    """The ``RolloutConfig.group_size`` this tree needs: ``trees * rows_per_tree()``."""
    return self.trees * self.rows_per_tree()


def _int(v, lo):
  return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= lo


def check_tree(tree: TreeConfig, *, max_turns: int, group_size: int) -> None:
  """Validates ``tree`` against the rollout's turns and group (before any compile).

  Raises:
    jagent.FieldError: owner ``"RolloutConfig"``, field ``"tree.<name>"``
      (or ``"group_size"``): no fork turn, a turn out of ``[0,
      max_turns)`` or out of order, K < 2, more expanded nodes than the tree
      has at that turn, a ``group_size`` other than the tree's rows, an
      unknown ``select``.
  """
  def bad(field, value, why):
    # owner RolloutConfig, field "tree.<name>": the message reads
    # "RolloutConfig.tree.<name>=<value>: <why>" and a program filling the
    # config from its own settings can name its own field.
    return FieldError("RolloutConfig", field, value, why)

  if not isinstance(tree, TreeConfig):
    raise bad("tree", tree, "must be a TreeConfig or None")
  turns = tree.fork_turns
  if not isinstance(turns, tuple) or not turns:
    raise bad("tree.fork_turns", turns,
              "needs at least one turn to fork at (a tuple of 0-based turns)")
  for i, t in enumerate(turns):
    if not _int(t, 0) or t >= max_turns:
      raise bad("tree.fork_turns", turns, f"turn {t!r} is not in [0, max_turns={max_turns})")
    if i and t <= turns[i - 1]:
      raise bad("tree.fork_turns", turns, "must be strictly increasing")
  for name in ("branches", "expand"):
    v = getattr(tree, name)
    if isinstance(v, (tuple, list)) and len(v) != len(turns):
      raise bad(f"tree.{name}", v, f"needs one value, or one per fork turn (fork_turns={turns!r})")
  for k in tree._per_fork("branches"):
    if not _int(k, 2):
      raise bad("tree.branches", tree.branches, "every K must be an int >= 2")
  for e in tree._per_fork("expand"):
    if e is not None and not _int(e, 1):
      raise bad("tree.expand", tree.expand, "must be ints >= 1 or None")
  if not _int(tree.trees, 1):
    raise bad("tree.trees", tree.trees, "must be an int >= 1")
  if tree.select not in SELECTS:
    raise bad("tree.select", tree.select, f"must be one of {SELECTS}")
  for t, _, e, alive in tree.plan():
    if e > alive:
      raise bad("tree.expand", tree.expand,
                f"{e} nodes to expand at fork turn {t}, but a tree has only {alive} then")
  if group_size != tree.group_size():
    raise bad("group_size", group_size,
              f"does not hold the trees (trees={tree.trees}, fork_turns={turns}, branches="
              f"{tree.branches!r}, expand={tree.expand!r}): they need "
              f"group_size={tree.group_size()} ({tree.trees} x {tree.rows_per_tree()} rows)")


def gather_rows(carry, index: jax.Array):
  """Every leaf of a rollout carry with its rows taken from ``index`` int32 [B].

  Rows are the leading axis, except the stacked KV cache's keys and values
  ([L, B, ...]; per-layer buffers are [B, ...]).
  """
  def take(x):
    if isinstance(x, _transformer.KVCache):
      per_layer = isinstance(x.k, tuple)
      kv = lambda a: a[index] if per_layer else a[:, index]  # noqa: E731
      return x.replace(k=jax.tree.map(kv, x.k), v=jax.tree.map(kv, x.v),
                       lengths=x.lengths[index])
    return x[index]
  return jax.tree.map(take, carry, is_leaf=lambda x: isinstance(x, _transformer.KVCache))


def child_keys(keys: jax.Array, child: jax.Array) -> jax.Array:
  """Typed keys [B]: ``fold_in(keys[b], child[b])``, a child's own stream."""
  return jax.vmap(jax.random.fold_in)(keys, child)


def _set_rows(carry, **fields):
  rows = dict(carry[4], **fields)
  return carry[:4] + (rows,) + carry[5:]


def tree_rollout(program, config):
  """The (unjitted) tree rollout ``(params, key, reset_keys=None) -> Trajectory``.

  Args:
    program: the :class:`jagent.rollout._rollout.Program` of ``config``.
    config: a ``RolloutConfig`` with ``tree`` set (already validated).

  Returns:
    the rollout function. Its Trajectory is the chain one (rows group-major,
    row ``b`` in tree ``b // n`` of group ``b // G``) plus ``tree_node``,
    ``tree_parent``, ``tree_depth`` [B, T] and the static ``tree_size = n``;
    rows never forked into have no turn (``row_valid`` False, every node -1).
  """
  tree = config.tree
  b, t_max = config.batch_size, config.max_turns
  n = tree.rows_per_tree()
  plan = tree.plan()
  round_of = np.full((t_max,), -1, np.int32)
  for i, (t, _, _, _) in enumerate(plan):
    round_of[t] = i
  # NumPy here, jnp inside the traced functions: the rollout function may be
  # built while a program traces (a program cache) and run in later traces,
  # so it must close over no array that one trace made.
  tab = lambda j: np.array([p[j] for p in plan], np.int32)  # noqa: E731
  tables = (tab(1), tab(2), tab(3), np.arange(b, dtype=np.int32) % n,
            np.arange(b, dtype=np.int32))

  def fork(t, carry, keys, owner, alive, sel_key):
    k_tab, e_tab, before_tab, slot, rows_b = map(jnp.asarray, tables)
    base = rows_b - slot
    r = jnp.asarray(round_of)[t]
    k, e, before = k_tab[r], e_tab[r], before_tab[r]
    rows = carry[4]
    eligible = alive & ~rows["done"]
    noise = jax.random.uniform(jax.random.fold_in(sel_key, t), (b,))
    if tree.select == "return":
      primary = -jnp.sum(carry[3]["turn_rewards"], axis=1)
    else:
      primary = jnp.zeros((b,), jnp.float32)
    primary = jnp.where(eligible, primary, jnp.inf).reshape(-1, n)
    # Running nodes first, by score, ties at random: the first e are expanded.
    order = jnp.lexsort((-noise.reshape(-1, n), primary), axis=-1).astype(jnp.int32)
    new = (slot >= before) & (slot < before + e * (k - 1))
    rank = jnp.clip((slot - before) // (k - 1), 0, n - 1)
    parent = base + jnp.take_along_axis(order[rows_b // n], rank[:, None], axis=1)[:, 0]
    born = new & eligible[parent]
    parent = jnp.where(born, parent, rows_b)
    expanded = jnp.zeros((b,), bool).at[jnp.where(born, parent, b)].set(True, mode="drop")
    child = jnp.where(born, 1 + (slot - before) % (k - 1), 0)
    carry = program.disown(gather_rows(carry, parent), born)
    forked = born | expanded
    env_keys = carry[5]
    carry = carry[:5] + (jnp.where(forked, child_keys(env_keys, child), env_keys),) + carry[6:]
    keys = keys[parent]
    keys = jnp.where(forked, child_keys(keys, child), keys)
    return carry, keys, owner[parent], alive | born

  def rollout(params, key, reset_keys=None):
    carry, keys, aux = program.start(params, key, reset_keys, row_keys=True)
    slot, rows_b = map(jnp.asarray, tables[3:])
    alive = slot == 0
    carry = _set_rows(carry, done=carry[4]["done"] | ~alive)
    owner = jnp.full((b, t_max), -1, jnp.int32)
    sel_key = jax.random.fold_in(key, 3)  # the split into 3 uses 0..2

    def body(t, c):
      carry, keys, owner, alive = c
      carry, keys, owner, alive = jax.lax.cond(
          jnp.asarray(round_of)[t] >= 0,
          lambda *a: fork(t, *a, sel_key), lambda *a: a, carry, keys, owner, alive)
      before = carry[4]["num_turns"]
      carry = program.turn(params, carry, t, keys, aux)
      took = carry[4]["num_turns"] > before
      owner = owner.at[:, t].set(jnp.where(took, rows_b, owner[:, t]))
      return carry, keys, owner, alive

    carry, _, owner, alive = jax.lax.fori_loop(0, t_max, body, (carry, keys, owner, alive))
    traj = program.finish(carry)
    turn = jnp.arange(t_max, dtype=jnp.int32)[None]
    node = jnp.where(owner >= 0, owner * t_max + turn, -1)
    parent = jnp.pad(node[:, :-1], ((0, 0), (1, 0)), constant_values=-1)
    parent = jnp.where(node >= 0, parent, -1)
    valid = alive if config.history_turns < 0 else traj.row_valid
    return traj.replace(tree_node=node, tree_parent=parent,
                        tree_depth=jnp.where(node >= 0, turn + 1, 0), row_valid=valid,
                        tree_size=n)

  return rollout
