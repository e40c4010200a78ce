"""The Trajectory pytree: what a rollout returns and training consumes.

Training reads it through :func:`jagent.train.trajectory_batch` (the sampler
does not know the objectives' :class:`jagent.transforms.Batch`).

Episodes are group-major: episode ``b`` belongs to group ``b // G`` and all
members of a group started from the same initial state. ``B`` is the number
of episodes, ``T`` the maximum number of assistant turns, ``R`` the number of
token rows and ``S`` the context size of one row (padded).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

# Why an episode ended (``Trajectory.end_reason``).
RUNNING = 0  # never left in a finished rollout
TERMINATED = 1  # the environment reached a terminal state (goal, hole, solved, answered)
ENV_TRUNCATED = 2  # the environment's own time limit
ACTION_BUDGET = 3  # max_actions_per_traj environment actions were taken
MAX_TURNS = 4  # max_turns assistant turns were used
CONTEXT_OVERFLOW = 5  # the next turn (prompt + max reply) would not fit in S tokens
END_REASONS = ("running", "terminated", "env_truncated", "action_budget", "max_turns",
               "context_overflow")


# The fields with one entry per token row ([R, ...]); the others are per
# episode ([B, ...]) or per turn ([B, T, ...]).
ROW_FIELDS = ("tokens", "loss_mask", "logprobs", "turn_ids", "token_rewards", "length",
              "row_valid", "row_episode", "row_turn")


@flax.struct.dataclass
class Trajectory:
  """A batch of multi-turn trajectories: B episodes laid out in R token rows.

  One layout: every episode owns ``P = R / B`` consecutive rows
  (episode-major: row r belongs to episode ``row_episode[r] = r // P``, so
  group g's rows are ``[g*G*P, (g+1)*G*P)``), and row r holds the turns
  from ``row_turn[r]`` up to the next row's turn (the episode's last row:
  up to its end). Each sampled token names its turn in ``turn_ids``. Every
  consumer reads the rows through these fields alone: an episode field
  ``[B]`` reaches row r as ``x[row_episode[r]]``, a turn field ``[B, T]``
  as ``x[row_episode[r], row_turn[r] + i]``.

  How the rollout fills the rows is its choice (``history_turns``,
  ``RolloutConfig.history_turns``):

  * ``-1`` (full history, RAGEN's ``full``): ``P = 1``, ``R = B``, row ``b``
    is episode ``b``'s whole conversation (``row_turn`` 0): turn 1's
    prompt, reply 1, turn 2's prompt (end of the assistant message, the
    reward and the next state, the assistant header), reply 2, ... then
    padding.
  * ``k >= 0`` (bounded history, RAGEN's ``limited_multi_turn`` /
    ``single_turn`` with ``max_context_window``): ``P = T``, ``R = B * T``,
    row ``r = b * T + t`` is turn t of episode b with its own context: the
    opening prompt (system message, the first user message's template,
    instructions included, rendered at turn ``w = max(0, t - k)`` with that
    turn's state, turn number and action budget), reply w, then for each
    later turn up to t its prompt exactly as in the full layout (end of the
    previous assistant message, reward, state, header) and, before t, its
    reply exactly as sampled then; then reply t. Only reply t is trained
    (history tokens are context only, each reply is trained once, in its
    own row). Rows of turns not taken (``row_valid`` False) are padding
    with ``length`` 0.

  Only reply tokens, exactly as sampled (the EOS token included when
  sampled), are trained (``loss_mask``).

  Attributes:
    tokens: int32 [R, S] token ids (pad id after ``length``).
    loss_mask: bool [R, S], True on the tokens sampled in that row.
    logprobs: float32 [R, S] sampler log-probabilities of the sampled tokens
      (``log softmax(logits / temperature)``, before top-k/top-p truncation;
      0 elsewhere). A full forward pass over ``tokens`` reproduces them.
    turn_ids: int32 [R, S] 0-based turn of each sampled token, -1 elsewhere.
    token_rewards: float32 [R, S] each turn's reward on its last sampled token.
    length: int32 [R] tokens used.
    row_valid: bool [R] the row holds a turn that was taken (every row of a
      chain rollout with one row per episode).
    row_episode: int32 [R] the row's episode b (``r // P``).
    row_turn: int32 [R] the first turn the row holds (0 with one row per
      episode, ``r % T`` with one row per turn).
    turn_rewards: float32 [B, T] per-turn reward: environment rewards of the
      turn's actions plus ``format_penalty`` when the reply was not valid.
    scores: float32 [B] trajectory score = sum of ``turn_rewards``.
    num_turns: int32 [B] assistant turns taken.
    reply_lengths: int32 [B, T] sampled tokens per turn.
    format_valid: bool [B, T] the turn's reply parsed and every kept action
      was valid (False on turns not taken).
    num_pieces, num_valid, num_executed, num_effective: int32 [B, T] per turn:
      kept answer pieces, valid actions among them, actions executed in the
      environment, and executed actions that changed the state.
    anchor_hashes: int32 [B, T] hash of the environment's rendering at the
      start of each turn (identical states share it; GiGPO's anchors).
    num_actions: int32 [B] environment actions executed.
    success: bool [B] the environment terminated the episode with success.
    terminated: bool [B] the environment reached a terminal state.
    truncated: bool [B] ended by a budget, the turn limit or overflow.
    end_reason: int32 [B] one of the constants above (``END_REASONS``).
    overflow: bool [B] ``end_reason == CONTEXT_OVERFLOW``.
    group_ids: int32 [B] ``b // G``.

    tree_node: int32 [B, T] tree rollouts (``RolloutConfig.tree``): the node
      (agent step) episode b is at in turn t, ``owner * T + t`` where
      ``owner`` is the row that sampled that turn (rows that share a prefix
      share its nodes); -1 on turns not taken. None without a tree.
    tree_parent: int32 [B, T] the node of turn t - 1 (-1 at turn 0: the
      group's initial state; -1 on turns not taken).
    tree_depth: int32 [B, T] depth of the node, ``t + 1`` (the initial state
      is depth 0); 0 on turns not taken.
    group_size: static int G.
    history_turns: static int, the rollout's record of how it filled the
      rows (see above); no consumer needs it.
    tree_size: static int, rows per tree (0: not a tree rollout); tree
      ``b // tree_size`` holds row b, ``G / tree_size`` trees a group.

  A trajectory built by hand with one row per episode takes its three
  ``row_*`` fields from :meth:`one_row_per_episode`. In a tree rollout a
  row's ``loss_mask`` marks only the tokens it sampled itself (a prefix
  copied at a fork is held, not re-sampled), and rows never forked into
  have ``row_valid`` False.
  """

  tokens: jax.Array
  loss_mask: jax.Array
  logprobs: jax.Array
  turn_ids: jax.Array
  token_rewards: jax.Array
  length: jax.Array
  turn_rewards: jax.Array
  scores: jax.Array
  num_turns: jax.Array
  reply_lengths: jax.Array
  format_valid: jax.Array
  num_pieces: jax.Array
  num_valid: jax.Array
  num_executed: jax.Array
  num_effective: jax.Array
  anchor_hashes: jax.Array
  num_actions: jax.Array
  success: jax.Array
  terminated: jax.Array
  truncated: jax.Array
  end_reason: jax.Array
  overflow: jax.Array
  group_ids: jax.Array
  row_valid: jax.Array
  row_episode: jax.Array
  row_turn: jax.Array
  tree_node: jax.Array | None = None
  tree_parent: jax.Array | None = None
  tree_depth: jax.Array | None = None
  group_size: int = flax.struct.field(pytree_node=False, default=1)
  history_turns: int = flax.struct.field(pytree_node=False, default=-1)
  tree_size: int = flax.struct.field(pytree_node=False, default=0)

  @staticmethod
  def one_row_per_episode(num_episodes: int) -> dict[str, jax.Array]:
    """The ``row_*`` fields of ``B = num_episodes`` rows, one per episode.

    Returns:
      ``{"row_valid": bool [B] True, "row_episode": int32 [B] arange(B),
      "row_turn": int32 [B] 0}``, to pass to the constructor.
    """
    return {"row_valid": jnp.ones((num_episodes,), bool),
            "row_episode": jnp.arange(num_episodes, dtype=jnp.int32),
            "row_turn": jnp.zeros((num_episodes,), jnp.int32)}

  @property
  def rows_per_episode(self) -> int:
    """Static int ``P = R / B``: the rows each episode owns."""
    r, b = self.tokens.shape[0], self.scores.shape[0]
    if b == 0 or r % b:
      raise ValueError(f"Trajectory: {r} token rows are not a whole number of rows per "
                       f"episode for {b} episodes (scores)")
    return r // b

  def episode_rows(self, episodes: jax.Array) -> jax.Array:
    """int32 ``[K * P]``: the rows of ``episodes`` (int ``[K]``), episode by episode.

    Rows are episode-major, P to an episode (``row_episode = r // P``), so
    episode b owns rows ``[b * P, (b + 1) * P)``; with ``P = 1`` this is
    ``episodes`` itself.
    """
    p = self.rows_per_episode
    e = jnp.asarray(episodes, jnp.int32)
    return (e[:, None] * p + jnp.arange(p, dtype=jnp.int32)[None]).reshape(-1)

  def take_episodes(self, episodes: jax.Array) -> Trajectory:
    """The trajectory of ``episodes`` (int ``[K]``), in that order.

    Episode fields ``[B, ...]`` gather ``episodes``, the row fields
    (``ROW_FIELDS``) those episodes' rows (:meth:`episode_rows`), and
    ``row_episode`` is renumbered to the new episodes (``r // P``).
    ``group_ids`` and the statics are kept as they are. Jittable.

    Args:
      episodes: int ``[K]`` episode indices in ``[0, B)``.

    Returns:
      a Trajectory of ``K`` episodes and ``K * P`` rows.
    """
    p = self.rows_per_episode
    rows = self.episode_rows(episodes)
    by_row = {f: getattr(self, f)[rows] for f in ROW_FIELDS}
    out = jax.tree.map(lambda x: x[episodes], self.replace(**{f: None for f in ROW_FIELDS}))
    by_row["row_episode"] = jnp.arange(rows.shape[0], dtype=jnp.int32) // p
    return out.replace(**by_row)

  def played(self) -> jax.Array:
    """bool [B]: the episodes that were played.

    Every episode of a chain rollout is. A tree rollout's rows that no fork
    copied a node into (their pick had ended before the fork) hold no turn
    and never ended (``end_reason`` RUNNING, no valid row): they are slots,
    not episodes, and every statistic over episodes leaves them out.
    """
    b = self.scores.shape[0]
    has_row = jnp.any(jnp.asarray(self.row_valid, bool).reshape(b, -1), axis=1)
    return has_row | (self.end_reason != RUNNING)

  def path_weights(self) -> jax.Array:
    """float32 [B]: each played episode's probability of being the one path
    sampled from its initial state, were each fork to keep one child at random.

    A tree's leaves are not independent episodes: a root that ends before
    its first fork is one episode, one that reaches a fork with K branches
    is K, so a plain mean over leaves under-weights episodes that end early
    (short successes). Weighting leaf b by ``prod_t 1 / fanout(parent of its
    turn-t node)`` (fanout: the distinct nodes sampled from that parent; a
    tree's initial state is the parent of its turn-0 nodes) makes each
    tree's weights sum to 1 and a weighted mean an unbiased estimate of the
    policy's per-episode expectation from that state, whichever nodes were
    chosen to fork: each node's children continue it independently. A
    chain's weights are :meth:`played` (all 1); slots are 0.
    """
    played = jnp.asarray(self.played(), jnp.float32)
    if self.tree_node is None:
      return played
    b, t = self.tree_node.shape
    taken = (jnp.arange(t)[None] < self.num_turns[:, None]) & (self.tree_node >= 0)
    # Parent slots: nodes 0 .. B*T-1, then each tree's initial state.
    tree = jnp.arange(b, dtype=jnp.int32) // self.tree_size
    parent = jnp.where(self.tree_parent >= 0, self.tree_parent, b * t + tree[:, None])
    parent = jnp.where(taken, parent, 0)
    fanout = jnp.zeros(b * t + b // self.tree_size, jnp.float32).at[parent].add(
        jnp.asarray(self.sampled_turns(), jnp.float32))
    inv = jnp.where(taken, 1.0 / jnp.maximum(fanout[parent], 1.0), 1.0)
    return played * jnp.prod(inv, axis=1)

  def sampled_turns(self) -> jax.Array:
    """bool [B, T]: the turns episode b's row sampled itself.

    In a chain every turn taken; in a tree only the turns the row owns
    (``tree_node // T == b``): a prefix copied at a fork was sampled, and its
    environment steps played, once, by the row that owns it. So
    ``sum(sampled_turns())`` counts each environment step once and
    ``sum(loss_mask)`` is the tokens of exactly these turns.
    """
    t = self.turn_rewards.shape[1]
    taken = jnp.arange(t)[None] < self.num_turns[:, None]
    if self.tree_node is None:
      return taken
    own = self.tree_node // t == jnp.arange(self.scores.shape[0])[:, None]
    return taken & (self.tree_node >= 0) & own

  def metrics(self) -> dict[str, jax.Array]:
    """Rollout diagnostics (float32 scalars), RAGEN's Echo Trap set included.

    Keys: ``success``, ``pass_at_group`` (share of groups with a success),
    ``score``, ``reward_std_in_group`` (mean over groups of the in-group std
    of scores; only when ``group_size > 1``: with one rollout per group it is
    0 by construction, not a collapse signal), ``turns``, ``actions``,
    ``reply_tokens`` (per sampled turn), ``valid_action_frac`` (valid / kept
    answer pieces), ``effective_action_frac`` (effective / executed),
    ``format_valid_frac`` (over sampled turns), ``overflow_frac``, and
    ``end/<reason>`` shares.

    Episode statistics are means over the played episodes (:meth:`played`)
    weighted by :meth:`path_weights`, so that a tree's means estimate what a
    chain's plain means do; turn statistics are over the sampled turns
    (:meth:`sampled_turns`, each turn of a tree once). For a chain rollout
    these are plain means over every episode and every turn taken.
    ``reward_std_in_group`` is over the played episodes, unweighted (the
    spread the advantages see).
    """
    g = self.group_size
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    played = self.played()
    w = self.path_weights()
    mean = lambda x: jnp.sum(w * f32(x)) / jnp.maximum(jnp.sum(w), 1e-30)  # noqa: E731
    turns = self.sampled_turns()
    per_turn = lambda num, den: jnp.sum(f32(num) * turns) / jnp.maximum(  # noqa: E731
        jnp.sum(f32(den) * turns), 1.0)
    out = {
        "success": mean(self.success),
        "pass_at_group": jnp.mean(f32(jnp.any((self.success & played).reshape(-1, g), axis=1))),
        "score": mean(self.scores),
        "turns": mean(self.num_turns),
        "actions": mean(self.num_actions),
        "reply_tokens": jnp.sum(f32(self.loss_mask)) / jnp.maximum(jnp.sum(f32(turns)), 1.0),
        "valid_action_frac": per_turn(self.num_valid, self.num_pieces),
        "effective_action_frac": per_turn(self.num_effective, self.num_executed),
        "format_valid_frac": per_turn(self.format_valid, jnp.ones_like(turns)),
        "overflow_frac": mean(self.overflow),
    }
    if g > 1:
      # The std over each group's played episodes (0 with fewer than two).
      s, v = self.scores.reshape(-1, g), f32(played).reshape(-1, g)
      n = jnp.maximum(jnp.sum(v, axis=1, keepdims=True), 1.0)
      mu = jnp.sum(v * s, axis=1, keepdims=True) / n
      out["reward_std_in_group"] = jnp.mean(jnp.sqrt(jnp.sum(v * (s - mu) ** 2, axis=1) / n[:, 0]))
    for i, name in enumerate(END_REASONS[1:], start=1):
      out[f"end/{name}"] = mean(self.end_reason == i)
    return out
