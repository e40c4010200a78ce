"""Evaluation on fixed held-out initial states: one program per chunk of levels.

:func:`eval_program` is the pure program of one chunk (rollout and its
metrics); jit it (one device), :func:`jagent.sharding.shard_eval_program` it
(a mesh) or vmap it over runs (a sweep). :func:`evaluate` runs any of those
over the chunks of a fixed level set and averages, so every caller evaluates
the same way.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from jagent._src import checks
from jagent.rollout import _trajectory

EvalProgram = Callable[[Any, jax.Array, jax.Array],
                       tuple[_trajectory.Trajectory, dict[str, jax.Array]]]


def eval_program(rollout_fn: Callable[..., _trajectory.Trajectory]) -> EvalProgram:
  """The pure program of one evaluation chunk: a rollout and its metrics.

  The metrics are computed inside the program, not eagerly afterwards: on a
  mesh spanning processes each eager reduction would be its own collective
  program, dispatched asynchronously, and two CPU (gloo) processes then
  deadlocked (measured with jax 0.10.2).

  Args:
    rollout_fn: ``rollout_fn(params, key, reset_keys) -> Trajectory`` of
      ``B = num_groups x G`` rows (:func:`jagent.rollout.make_rollout`).

  Returns:
    ``program(params, key, reset_keys) -> (trajectory, metrics)``: ``key`` a
    typed PRNG key ``[]`` (sampling), ``reset_keys`` typed PRNG keys
    ``[num_groups]`` (the initial states), metrics
    :meth:`jagent.rollout.Trajectory.metrics`'s dict of float32 ``[]``. Not
    jitted: jit, shard or vmap it.
  """
  def program(params, key, reset_keys):
    traj = rollout_fn(params, key, reset_keys)
    return traj, traj.metrics()

  return program


def evaluate(program: EvalProgram, params: Any, reset_keys: jax.Array, key: jax.Array,
             num_groups: int) -> tuple[dict[str, Any], _trajectory.Trajectory]:
  """Success and friends on a fixed set of initial states, chunk by chunk.

  Chunk ``i`` plays ``reset_keys[i * num_groups:(i + 1) * num_groups]``
  sampled with ``jax.random.fold_in(key, i)``; the metrics are averaged over
  the chunks in float64 on the host. Chunks run one program at a time (each
  waits for the previous one's metrics): a multi-process CPU run must not
  overlap two programs with collectives.

  Args:
    program: a jitted :func:`eval_program` (or
      :func:`jagent.sharding.shard_eval_program`, or one vmapped over a
      leading run axis R of ``params`` and ``key``).
    params: policy parameters (with the run axis when ``program`` has one).
    reset_keys: typed PRNG keys ``[M]`` of the initial states, M a multiple
      of ``num_groups`` (e.g. fixed validation seeds).
    key: the sampling key, a typed PRNG key ``[]`` (or ``[R]``: one per run).
    num_groups: levels per chunk (the rollout config's ``num_groups``).

  Returns:
    ``(metrics, first_chunk)``: the metrics averaged over all M x G episodes
    (``success``, ``pass_at_group``, ``score``, ``actions``, ``turns``,
    ``format_valid_frac``, ...; see ``Trajectory.metrics``), floats (float64
    ``[R]`` arrays with a run axis), and the first chunk's trajectories (for
    decoded samples).

  Raises:
    ValueError: M not a multiple of ``num_groups`` (before anything runs).
  """
  m = reset_keys.shape[0]
  checks.check_int("num_groups", num_groups, 1)
  if m % num_groups:
    raise ValueError(f"{m} evaluation states is not a multiple of num_groups={num_groups!r}")
  fold = jax.random.fold_in if key.ndim == 0 else jax.vmap(jax.random.fold_in, (0, None))
  chunks = m // num_groups
  sums: dict[str, np.ndarray] = {}
  first = None
  for i in range(chunks):
    traj, metrics = program(params, fold(key, i), reset_keys[i * num_groups:(i + 1) * num_groups])
    first = traj if first is None else first
    for k, v in jax.device_get(metrics).items():  # waits: one program at a time
      sums[k] = sums.get(k, 0.0) + np.asarray(v, np.float64)
  return {k: float(v) / chunks if v.ndim == 0 else v / chunks for k, v in sums.items()}, first


def decode_samples(traj: _trajectory.Trajectory, tokenizer, num: int = 4) -> list[dict]:
  """The first ``num`` episodes as text with their outcome (for inspection).

  Args:
    traj: a :class:`jagent.rollout.Trajectory` on the host or one device
      (gather a sharded one first, :func:`jagent.sharding.to_host`).
    tokenizer: a :class:`jagent.tokenizers.Tokenizer` (its ``decode``).
    num: episodes to decode (fewer when the trajectory has fewer).

  Returns:
    One dict per episode: ``text`` (the decoded tokens up to ``length`` of
    the episode's row; an episode in several rows, one per turn, gives each
    taken turn's row, its whole context and reply, under a ``=== turn t
    ===`` line), ``score``
    (float), ``success`` (bool), ``turns`` (int) and ``end_reason`` (a name
    of ``END_REASONS``); from a tree rollout (``traj.tree_size > 0``) also
    ``tree`` (the episode's tree, ``b // tree_size``), ``tree_nodes`` and
    ``tree_parents`` (the node of each taken turn and its parent, -1 = the
    initial state: episodes that share a node share that turn).
  """
  out = []
  text = lambda r: tokenizer.decode(  # noqa: E731
      np.asarray(traj.tokens[r, :int(traj.length[r])]).tolist())
  row_episode, row_turn = np.asarray(traj.row_episode), np.asarray(traj.row_turn)
  for b in range(min(num, traj.scores.shape[0])):
    turns = int(traj.num_turns[b])
    rows = np.flatnonzero(row_episode == b)
    if len(rows) == 1:  # the whole conversation
      body = text(rows[0])
    else:  # one row per turn: the rows of the turns taken
      body = "\n".join(f"=== turn {row_turn[r] + 1} ===\n{text(r)}"
                       for r in rows if row_turn[r] < turns)
    out.append({
        "text": body, "score": float(traj.scores[b]), "success": bool(traj.success[b]),
        "turns": turns, "end_reason": _trajectory.END_REASONS[int(traj.end_reason[b])],
    })
    if traj.tree_size:
      out[-1].update(tree=b // traj.tree_size,
                     tree_nodes=np.asarray(traj.tree_node[b, :turns]).tolist(),
                     tree_parents=np.asarray(traj.tree_parent[b, :turns]).tolist())
  return out


def held_out_reset_keys(env: Any, env_params: Any, candidates: jax.Array,
                        trained: jax.Array, num_levels: int) -> tuple[jax.Array, int]:
  """Evaluation levels held out of the levels a run trained on.

  Two reset keys give the same level when their initial states render the
  same symbols (``env.render_symbols``: what the agent reads). Small level
  spaces repeat often: 35% of 512 random Sokoban-6x6 levels were among the
  4,128 levels of a default main job (docs/results.md), so a success rate on
  them partly measures memorisation. This keeps, in order, the first
  ``num_levels`` candidates whose level is not a trained one (repeats among
  the candidates are kept: they are drawn as evaluation levels are).

  Args:
    env: an ``envs_jax.Environment``.
    env_params: its params.
    candidates: typed PRNG keys ``[M]``, in order of preference (M >=
      ``num_levels``; the first ``num_levels`` are the plain evaluation set).
    trained: typed PRNG keys ``[N]`` of every level the run trains on.
    num_levels: how many levels to keep.

  Returns:
    ``(keys, removed)``: typed PRNG keys ``[num_levels]`` and how many of the
    first ``num_levels`` candidates were replaced for being trained levels.

  Raises:
    ValueError: fewer than ``num_levels`` candidates are not trained levels
      (a game with few distinct levels, such as Bandit's one).
  """
  def levels(keys):
    states = jax.vmap(lambda k: env.reset(k, env_params)[1])(keys)
    return jax.vmap(env.render_symbols)(states)

  render = jax.jit(levels)
  seen = {row.tobytes() for row in np.asarray(render(trained))}
  fresh = np.asarray([row.tobytes() not in seen for row in np.asarray(render(candidates))])
  kept = np.flatnonzero(fresh)[:num_levels]
  if kept.size < num_levels:
    raise ValueError(f"held_out_reset_keys: only {kept.size} of {candidates.shape[0]} "
                     f"candidate levels are not among the {trained.shape[0]} trained "
                     f"ones; {num_levels} needed (a game with few distinct levels)")
  return candidates[kept], int(np.sum(~fresh[:num_levels]))
