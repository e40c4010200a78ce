"""Whole multi-turn rollouts as one jit-compiled program.

:func:`make_rollout` returns a jitted ``rollout(params, key, reset_keys=None)
-> Trajectory``. One call plays up to ``max_turns`` turns for ``B = num_groups
x group_size`` episodes with no host round trip: per turn it renders the
prompt tokens on device (:class:`TextEnv`), prefills only those new tokens into
the KV cache kept from earlier turns, decodes until ``</answer>``, EOS or
``max_tokens_per_turn`` (:func:`jagent.models.generate`), parses the reply
from its bytes (:func:`parse_reply`), executes the valid actions in order
(stopping at the end of the episode and at ``max_actions_per_traj``), and
records the turn's reward (RAGEN's protocol, ``ragen/llm_agent/ctx_manager.py``).
Finished episodes stop generating (masked rows); an episode whose next turn
would not fit in the context ends as truncated with reason
``CONTEXT_OVERFLOW``.

With ``RolloutConfig.history_turns = k >= 0`` (RAGEN's ``context_window_mode``
with ``max_context_window``) every turn is its own row of S tokens, ``S =
first_width + N + min(k, max_turns - 1) * (next_width + N)``: per episode the
program keeps the token segments already rendered or sampled at each turn
([B, T, W] buffers: the opening prompt, the later-turn prompt, the reply),
scatters the window ``[opening at turn t - k | prompts and replies of the k
turns before t | turn t's prompt]`` into a fresh [B, S] row, prefills it from
an empty KV cache and samples turn t's reply after it. Nothing is
re-tokenized and nothing leaves the device; see :class:`Trajectory` for the
layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jagent._src.errors import FieldError
from jagent._src import checks
from jagent.losses import _shaping
from jagent.models import _config as _model_config
from jagent.models import _sampling
from jagent.models import _transformer
from jagent.rollout import _parse
from jagent.rollout import _text
from jagent.rollout import _tree
from jagent.rollout import _trajectory as tj


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Static settings of a rollout (RAGEN v1 defaults where they apply).

  Attributes:
    num_groups: initial states per call.
    group_size: G rollouts per initial state (they start identical).
    max_turns: assistant turns per episode (RAGEN: 5).
    max_tokens_per_turn: N, sampled tokens per reply at most.
    max_actions_per_traj: environment actions per episode at most (RAGEN: 10).
    context_size: S, tokens per trajectory; None = enough for ``max_turns``
      full turns.
    temperature, top_k, top_p, greedy: sampling (RAGEN trains at T = 1 and
      validates at T = 0.5).
    format_penalty: added to a turn's reward when its reply is not valid
      (``jagent.losses.FORMAT_PENALTY``, RAGEN's es_manager: -0.1). The
      trajectory's rewards hold it, and no objective adds it again
      (``jagent.train.trajectory_batch`` leaves ``format_valid`` out).
    history_turns: k, the bounded history (RAGEN's ``context_window_mode`` /
      ``max_context_window``, ``ragen/llm_agent/ctx_manager.py``). -1: one
      sequence per episode holding every turn (RAGEN's ``full``). k >= 0:
      each turn is its own row, whose context is the opening (system message
      and the first user message's template, instructions included) at turn
      ``max(0, t - k)``, then the later turns up to t exactly as in the full
      conversation; k = 0 is RAGEN's ``single_turn``. See
      :class:`Trajectory` for the row layout.
    tree: None (independent episodes), or a :class:`TreeConfig`: each
      group's ``group_size`` rows grow as trees forked at chosen turns
      (``group_size`` must equal ``tree.group_size()``).
    merge_lora: with a :class:`jagent.models.LoraParams` policy, sample with
      the adapters folded into a merged copy of the weights (the default;
      :attr:`jagent.models.SamplingConfig.merge_lora`) or, False, apply them
      at every step: no merged copy of the base while sampling (a float32
      copy of every adapted weight), for slower decoding.
    prefill_chunk: prefill prompts longer than this many tokens in chunks
      of it (:attr:`jagent.models.SamplingConfig.prefill_chunk`); 0 (the
      default): each prompt in one forward.

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming the bad field.
  """

  num_groups: int = 8
  group_size: int = 16
  max_turns: int = 5
  max_tokens_per_turn: int = 64
  max_actions_per_traj: int = 10
  context_size: int | None = None
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False
  format_penalty: float = _shaping.FORMAT_PENALTY
  history_turns: int = -1
  merge_lora: bool = True
  tree: _tree.TreeConfig | None = None
  prefill_chunk: int = 0

  def __post_init__(self):
    for name in ("num_groups", "group_size", "max_turns", "max_tokens_per_turn",
                 "max_actions_per_traj"):
      checks.check_int(name, getattr(self, name), 1, owner="RolloutConfig")
    if self.context_size is not None:
      checks.check_int("context_size", self.context_size, 1,
                       why="must be a positive int or None", owner="RolloutConfig")
    if not isinstance(self.format_penalty, (int, float)) or not -float("inf") < (
        self.format_penalty) <= 0:
      # One sign everywhere: the (non-positive) reward added to a bad turn.
      raise FieldError("RolloutConfig", "format_penalty", self.format_penalty,
                       "must be a finite float <= 0", "the reward added to a bad turn; RAGEN: -0.1")
    checks.check_int("history_turns", self.history_turns, -1,
                     why="must be an int >= -1 (-1: the full history; k >= 0: the last k turns)",
                     owner="RolloutConfig")
    if not isinstance(self.merge_lora, bool):
      raise FieldError("RolloutConfig", "merge_lora", self.merge_lora, "must be a bool")
    if self.tree is not None:
      _tree.check_tree(self.tree, max_turns=self.max_turns, group_size=self.group_size)
    self.sampling()  # validates temperature / top_k / top_p / prefill_chunk

  @property
  def batch_size(self) -> int:
    """B = num_groups * group_size."""
    return self.num_groups * self.group_size

  @property
  def rows_per_episode(self) -> int:
    """P: a Trajectory's rows per episode, 1 (``history_turns = -1``) or ``max_turns``."""
    return 1 if self.history_turns < 0 else self.max_turns

  def sampling(self, eos_id: int | None = None, stop_strings=()) -> _sampling.SamplingConfig:
    """The :class:`jagent.models.SamplingConfig` of one reply."""
    return _sampling.SamplingConfig(
        max_new_tokens=self.max_tokens_per_turn, temperature=self.temperature,
        top_k=self.top_k, top_p=self.top_p, greedy=self.greedy,
        eos_ids=() if eos_id is None else (eos_id,), stop_strings=tuple(stop_strings),
        merge_lora=self.merge_lora, prefill_chunk=self.prefill_chunk)


def _turns_per_row(config: RolloutConfig) -> int:
  """Turns one token row holds at most: all of them, or the k history turns + 1."""
  if config.history_turns < 0:
    return config.max_turns
  return min(config.history_turns + 1, config.max_turns)


def min_context_size(text_env: _text.TextEnv, config: RolloutConfig) -> int:
  """Room for the opening prompt and reply plus ``_turns_per_row - 1`` later turns.

  The windowed opening (``history_turns >= 0``) is the first prompt's
  template at the window's first turn, so a row is never longer than the
  first ``history_turns + 1`` turns of a full conversation.
  """
  n = config.max_tokens_per_turn
  return text_env.first_width + n + (_turns_per_row(config) - 1) * (text_env.next_width + n)


def context_size(text_env: _text.TextEnv, config: RolloutConfig) -> int:
  """S: ``config.context_size`` or room for the turns of one row.

  ``history_turns = -1``: ``max_turns`` full turns. ``k >= 0``: the
  opening, k history turns, the current prompt and one reply (fewer when
  ``max_turns <= k``).
  """
  if config.context_size is not None:
    return config.context_size
  return min_context_size(text_env, config)


def first_reply_prompt_tokens(text_env: _text.TextEnv, config: RolloutConfig) -> int:
  """Tokens of context before a row's first reply, at most.

  A row's first reply follows turn 1's prompt when the row holds the whole
  episode (``history_turns = -1``), and a turn's window (everything in the
  row's context but its own reply budget) when each turn is a row. E.g. the
  prompt buffer :func:`jagent.train.collapse_metrics` scores a row's first
  reply against.
  """
  if config.history_turns < 0:
    return text_env.first_width
  return context_size(text_env, config) - config.max_tokens_per_turn


def group_reset_keys(key: jax.Array, num_groups: int) -> jax.Array:
  """The reset keys of the groups a rollout with ``key`` plays (no ``reset_keys`` given).

  :func:`make_rollout`, :func:`jagent.rollout.host_rollout` and
  :func:`jagent.rollout.expert_rollout` all split ``key`` into (reset,
  sample, env) keys and the reset key into one key per group; this is that
  derivation, so a caller can list the levels a run trains on (e.g. to hold
  evaluation levels out of them) without playing them.

  Args:
    key: the rollout's typed PRNG key ``[]``.
    num_groups: G.

  Returns:
    typed PRNG keys ``[G]``; group g's initial state is
    ``env.reset(keys[g], env_params)``.
  """
  return jax.random.split(jax.random.split(key, 3)[0], num_groups)


def _hash(symbols: jax.Array) -> jax.Array:
  """int32 [...] polynomial hash of int32 [..., n] symbol ids (wrapping)."""
  weights = jnp.asarray(np.array([pow(1000003, k, 2**32) for k in range(symbols.shape[-1])],
                                 np.uint32))
  weights = weights.reshape((1,) * (symbols.ndim - 1) + (-1,))
  h = jnp.sum(symbols.astype(jnp.uint32) * weights, axis=-1, dtype=jnp.uint32)
  return jax.lax.bitcast_convert_type(h, jnp.int32)


def _scatter_rows(buf, start, values, count):
  """buf[b, start[b] + j] = values[b, j] for j < count[b] (others dropped)."""
  b, w = values.shape
  cols = start[:, None] + jnp.arange(w, dtype=jnp.int32)[None]
  cols = jnp.where(jnp.arange(w)[None] < count[:, None], cols, buf.shape[1])
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], cols.shape)
  return buf.at[rows, cols].set(values.astype(buf.dtype), mode="drop")


def check_context_size(text_env: _text.TextEnv, config: RolloutConfig) -> int:
  """S (:func:`context_size`), checked to hold one row of ``config``'s layout.

  Raises:
    ValueError: naming ``RolloutConfig.context_size`` (and
      ``RolloutConfig.history_turns``): S cannot hold turn 1's prompt and one
      reply, or (``history_turns >= 0``) the opening, k later turns and
      their replies.
  """
  s_max = context_size(text_env, config)
  n_max = config.max_tokens_per_turn
  if text_env.first_width + n_max > s_max:
    raise ValueError(
        f"RolloutConfig.context_size={s_max} cannot hold turn 1's prompt "
        f"({text_env.first_width} tokens) plus max_tokens_per_turn={n_max}")
  if config.history_turns >= 0 and s_max < min_context_size(text_env, config):
    raise ValueError(
        f"RolloutConfig.context_size={s_max} cannot hold a row of "
        f"RolloutConfig.history_turns={config.history_turns}: the opening prompt "
        f"({text_env.first_width} tokens), {_turns_per_row(config) - 1} later turns "
        f"({text_env.next_width} prompt tokens each) and their replies "
        f"(max_tokens_per_turn={n_max} each) need {min_context_size(text_env, config)}")
  return s_max


class Program(NamedTuple):
  """The pieces of a rollout program (traced inside one jit; see :func:`make_rollout`).

  ``carry`` is a tuple whose every leaf has the batch B as its leading axis
  (the KV cache's stacked keys and values: axis 1; in per-layer form,
  :func:`jagent.models.per_layer_form`, axis 0), so a fork is one gather over it;
  ``carry[4]`` is the per-episode bookkeeping dict (``done``, ...).

  Attributes:
    start: ``(params, key, reset_keys=None, row_keys=False) -> (carry,
      sample_key, aux)``; ``row_keys``: sampling and env keys per row [B].
    turn: ``(params, carry, t, sample_key, aux) -> carry``, plays turn t.
    finish: ``carry -> Trajectory``.
    disown: ``(carry, new) -> carry``: rows ``new`` bool [B] sampled none of
      the tokens they hold (loss mask, log-probs, turn ids and token rewards
      cleared; with turn rows, ``row_valid`` too).
  """
  start: Callable[..., Any]
  turn: Callable[..., Any]
  finish: Callable[..., tj.Trajectory]
  disown: Callable[..., Any]


def _step_keys(key: jax.Array, b: int) -> tuple[jax.Array, jax.Array]:
  """(next key, keys [B] of one environment step) from one key [] or per-row keys [B]."""
  if jnp.ndim(key) == 0:
    key, sub = jax.random.split(key)
    return key, jax.random.split(sub, b)
  pair = jax.vmap(jax.random.split)(key)
  return pair[:, 0], pair[:, 1]


def make_rollout(text_env: _text.TextEnv, model_config: _model_config.ModelConfig,
                 config: RolloutConfig, env_params: Any = None
                 ) -> Callable[..., tj.Trajectory]:
  """Builds the jitted rollout of ``text_env`` for one model and config.

  With ``config.tree`` set, each group's episodes grow as trees that fork
  at chosen turns (:class:`jagent.rollout.TreeConfig`), in the same one
  program; the Trajectory then records the tree (``tree_node``, ...).

  Args:
    text_env: the game, tokenizer and prompt (:class:`TextEnv`).
    model_config: the policy's :class:`jagent.models.ModelConfig`.
    config: :class:`RolloutConfig`.
    env_params: environment params (default ``text_env.env_params``).

  Returns:
    ``rollout(params, key, reset_keys=None) -> Trajectory``, jit-compiled once
    per (text_env, model_config, config). ``reset_keys``: optional PRNG keys
    [num_groups] of the initial states (e.g. fixed validation seeds); by
    default they are drawn from ``key``. Row ``b`` starts from
    ``reset_keys[b // group_size]``.

  Raises:
    ValueError: the context cannot hold turn 1's prompt and one reply, the
      tokenizer and model disagree on the vocabulary, or the model's pad id is
      not a valid token.
  """
  program = make_program(text_env, model_config, config, env_params)
  if config.tree is not None:
    return jax.jit(_tree.tree_rollout(program, config))

  def rollout(params, key, reset_keys=None):
    carry, k_sample, aux = program.start(params, key, reset_keys)
    carry = jax.lax.fori_loop(
        0, config.max_turns, lambda t, c: program.turn(params, c, t, k_sample, aux), carry)
    return program.finish(carry)

  return jax.jit(rollout)


def make_program(text_env: _text.TextEnv, model_config: _model_config.ModelConfig,
                 config: RolloutConfig, env_params: Any = None) -> Program:
  """The :class:`Program` (start, turn, finish, disown) behind :func:`make_rollout`.

  Same arguments and errors as :func:`make_rollout`; nothing is compiled.
  """
  tok = text_env.tokenizer
  if tok.vocab_size > model_config.vocab_size:
    raise ValueError(f"tokenizer vocab_size {tok.vocab_size} > model vocab_size "
                     f"{model_config.vocab_size}")
  s_max = check_context_size(text_env, config)
  n_max = config.max_tokens_per_turn
  env = text_env.env
  env_params = text_env.env_params if env_params is None else env_params
  spec = text_env.parse_spec()
  free_text = env.num_actions == 0
  sampling = config.sampling(text_env.eos_id, text_env.stop_strings)
  table_np, table_len_np = tok.token_bytes()
  max_bytes = n_max * table_np.shape[1]
  pad_id = model_config.pad_id if model_config.pad_id is not None else (tok.pad_id or 0)
  b_size, g_size, t_max = config.batch_size, config.group_size, config.max_turns
  k_actions = spec.max_actions_per_turn

  def play(state, rows, step_key, out, active, anchor, t):
    """Parses one turn's replies, plays their actions and books the turn."""
    n = out.lengths
    # Parse the reply (without a sampled EOS) and play its actions.
    parsed = _parse.parse_tokens(out.tokens, n - out.eos.astype(jnp.int32),
                                 jnp.asarray(table_np), jnp.asarray(table_len_np), spec,
                                 max_bytes)
    budget_left = config.max_actions_per_traj - rows["actions"]

    def act(j, c):
      st, reward, term, trunc, succ, used, effective, env_key = c
      env_key, keys = _step_keys(env_key, b_size)
      go = active & (j < parsed.num_actions) & ~term & ~trunc & (used < budget_left)
      action = parsed.answer if free_text else jnp.maximum(parsed.actions[:, j], 0)
      _, nst, r, te, tr, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
          keys, st, action, env_params)
      st = jax.tree.map(lambda a, b_: jnp.where(
          go.reshape(go.shape + (1,) * (a.ndim - 1)), a, b_), nst, st)
      eff = info.get("action_effective", jnp.ones_like(go))
      return (st, reward + jnp.where(go, r, 0.0), term | (go & te), trunc | (go & tr),
              succ | (go & te & info["success"]), used + go.astype(jnp.int32),
              effective + (go & eff).astype(jnp.int32), env_key)

    zeros_i = jnp.zeros((b_size,), jnp.int32)
    zeros_b = jnp.zeros((b_size,), bool)
    state, env_reward, term, env_trunc, succ, used, effective, step_key = jax.lax.fori_loop(
        0, 1 if free_text else k_actions, act,
        (state, jnp.zeros((b_size,), jnp.float32), zeros_b, zeros_b, zeros_b, zeros_i,
         zeros_i, step_key))
    turn_reward = jnp.where(
        active, env_reward + jnp.where(parsed.format_valid, 0.0, config.format_penalty), 0.0)
    actions = rows["actions"] + used
    ended = active & (term | env_trunc | (actions >= config.max_actions_per_traj)
                      | (t == t_max - 1))
    reason = jnp.where(term, tj.TERMINATED, jnp.where(
        env_trunc, tj.ENV_TRUNCATED, jnp.where(
            actions >= config.max_actions_per_traj, tj.ACTION_BUDGET, tj.MAX_TURNS)))
    rows["end_reason"] = jnp.where(ended, reason, rows["end_reason"])
    rows["terminated"] = rows["terminated"] | (active & term)
    rows["truncated"] = rows["truncated"] | (ended & ~term)
    rows["success"] = rows["success"] | (active & succ)
    rows["actions"] = actions
    rows["num_turns"] = rows["num_turns"] + active.astype(jnp.int32)
    rows["done"] = rows["done"] | ended
    rows["eos"] = out.eos
    rows["last_reward"] = turn_reward
    per_turn = dict(
        turn_rewards=turn_reward, reply_lengths=n,
        format_valid=active & parsed.format_valid,
        num_pieces=jnp.where(active, parsed.num_pieces, 0),
        num_valid=jnp.where(active, parsed.num_actions, 0),
        num_executed=used, num_effective=effective,
        anchor_hashes=jnp.where(active, anchor, 0))
    return state, rows, step_key, turn_reward, per_turn

  def run_turn(params, carry, t, prompt, prompt_len, key):
    (state, cache, bufs, turn_bufs, rows, step_key) = carry
    tokens, mask, logps, turn_ids, tok_rewards = bufs
    done = rows["done"]
    active = ~done
    width = prompt.shape[1]
    pos = cache.lengths
    # Context overflow (or a state rendering longer than its buffer).
    fits = (pos + prompt_len + n_max <= s_max) & (prompt_len <= width)
    overflow_now = active & ~fits
    active = active & fits
    rows = dict(rows)
    rows["end_reason"] = jnp.where(overflow_now, tj.CONTEXT_OVERFLOW, rows["end_reason"])
    rows["truncated"] = rows["truncated"] | overflow_now
    rows["done"] = done | overflow_now
    anchor = _hash(jax.vmap(env.render_symbols)(state))
    plen = jnp.where(active, prompt_len, 0)
    tokens = _scatter_rows(tokens, pos, prompt, plen)
    out = _sampling.generate(
        params, prompt, plen, _sampling.fold_in(key, t), cache, config=model_config,
        sampling=sampling, active=active,
        token_table=(jnp.asarray(table_np), jnp.asarray(table_len_np)))
    n = out.lengths
    start = pos + plen
    tokens = _scatter_rows(tokens, start, out.tokens, n)
    mask = _scatter_rows(mask, start, jnp.ones_like(out.tokens, bool), n)
    logps = _scatter_rows(logps, start, out.logprobs, n)
    turn_ids = _scatter_rows(turn_ids, start, jnp.full_like(out.tokens, t), n)
    state, rows, step_key, turn_reward, per_turn = play(state, rows, step_key, out, active, anchor, t)
    last = start + n - 1
    tok_rewards = _scatter_rows(tok_rewards, jnp.maximum(last, 0), turn_reward[:, None],
                                active.astype(jnp.int32))
    turn_bufs = {k: v.at[:, t].set(per_turn[k].astype(v.dtype)) for k, v in turn_bufs.items()}
    bufs = (tokens, mask, logps, turn_ids, tok_rewards)
    return (state, out.cache, bufs, turn_bufs, rows, step_key)

  def initial_books():
    """Zero per-turn buffers [B, T] and per-episode bookkeeping [B]."""
    turn_bufs = dict(
        turn_rewards=jnp.zeros((b_size, t_max), jnp.float32),
        reply_lengths=jnp.zeros((b_size, t_max), jnp.int32),
        format_valid=jnp.zeros((b_size, t_max), bool),
        num_pieces=jnp.zeros((b_size, t_max), jnp.int32),
        num_valid=jnp.zeros((b_size, t_max), jnp.int32),
        num_executed=jnp.zeros((b_size, t_max), jnp.int32),
        num_effective=jnp.zeros((b_size, t_max), jnp.int32),
        anchor_hashes=jnp.zeros((b_size, t_max), jnp.int32))
    zi = jnp.zeros((b_size,), jnp.int32)
    zb = jnp.zeros((b_size,), bool)
    rows = dict(done=zb, end_reason=zi, terminated=zb, truncated=zb, success=zb,
                actions=zi, num_turns=zi, eos=zb, last_reward=jnp.zeros((b_size,), jnp.float32))
    return turn_bufs, rows

  def initial_states(key, reset_keys, row_keys=False):
    """The sampling and env keys, and the B initial states (group-major).

    ``row_keys``: one sampling and one env key per row ([B] each, split
    from the rollout's), so that a row's draws depend on its own keys only.
    """
    _, k_sample, k_env = jax.random.split(key, 3)
    if reset_keys is None:
      reset_keys = group_reset_keys(key, config.num_groups)
    reset_rows = jnp.repeat(reset_keys, g_size, axis=0)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(reset_rows, env_params)
    if row_keys:
      k_sample, k_env = jax.random.split(k_sample, b_size), jax.random.split(k_env, b_size)
    return k_sample, k_env, state

  def episode_fields(turn_bufs, rows):
    """The per-turn [B, T] and per-episode [B] fields of the Trajectory."""
    return dict(
        scores=jnp.sum(turn_bufs["turn_rewards"], axis=1), num_turns=rows["num_turns"],
        num_actions=rows["actions"], success=rows["success"], terminated=rows["terminated"],
        truncated=rows["truncated"], end_reason=rows["end_reason"],
        overflow=rows["end_reason"] == tj.CONTEXT_OVERFLOW,
        group_ids=jnp.arange(b_size, dtype=jnp.int32) // g_size, group_size=g_size,
        **turn_bufs)

  def start(params, key, reset_keys=None, row_keys=False):
    k_sample, k_env, state = initial_states(key, reset_keys, row_keys)
    cache = _transformer.init_cache(model_config, b_size, s_max)
    bufs = (jnp.full((b_size, s_max), pad_id, jnp.int32),
            jnp.zeros((b_size, s_max), bool),
            jnp.zeros((b_size, s_max), jnp.float32),
            jnp.full((b_size, s_max), -1, jnp.int32),
            jnp.zeros((b_size, s_max), jnp.float32))
    turn_bufs, rows = initial_books()
    # Turn 1's prompt is long: prefill all but its last token here, so that
    # every turn (traced once, in one loop) feeds at most next_width tokens.
    first, first_len = jax.vmap(text_env.first_prompt)(
        state, jnp.full((b_size,), config.max_actions_per_traj, jnp.int32))
    head = jnp.maximum(first_len - 1, 0)
    w1 = first.shape[1]
    _, cache = _sampling.prefill(params, first, head, cache, config=model_config,
                                 chunk=config.prefill_chunk)
    # Split once (weights and cache): every turn's generate then reads each
    # layer's weights and writes each layer's buffer in place, with no
    # per-turn copies of slices.
    turn_params, cache = _transformer.per_layer_form(params, cache)
    tokens = _scatter_rows(bufs[0], jnp.zeros((b_size,), jnp.int32), first, head)
    bufs = (tokens,) + bufs[1:]
    first_last = jnp.take_along_axis(first, head[:, None], axis=1)  # [B, 1]
    wn = max(text_env.next_width, 1)
    first_last = jnp.pad(first_last, ((0, 0), (0, wn - 1)), constant_values=pad_id)
    carry = (state, cache, bufs, turn_bufs, rows, k_env)
    return carry, k_sample, (first_last, first_len, turn_params)

  def turn(params, carry, t, k_sample, aux):
    del params  # the split form start returned, in aux
    first_last, first_len, params = aux
    w1, wn = text_env.first_width, max(text_env.next_width, 1)
    state, _, _, _, rows, _ = carry
    left = config.max_actions_per_traj - rows["actions"]
    prompt, plen = jax.vmap(text_env.next_prompt)(
        state, jnp.full((b_size,), t + 1, jnp.int32), left, rows["last_reward"], rows["eos"])
    first_turn = t == 0
    prompt = jnp.where(first_turn, first_last, prompt)
    # A turn-1 rendering longer than its buffer reports as overflow (plen > wn).
    plen = jnp.where(first_turn, jnp.where(first_len <= w1, 1, wn + 1), plen)
    return run_turn(params, carry, t, prompt, plen, k_sample)

  def finish(carry):
    _, cache, bufs, turn_bufs, rows, _ = carry
    tokens, mask, logps, turn_ids, tok_rewards = bufs
    return tj.Trajectory(
        tokens=tokens, loss_mask=mask, logprobs=logps, turn_ids=turn_ids,
        token_rewards=tok_rewards, length=cache.lengths,
        **tj.Trajectory.one_row_per_episode(b_size), **episode_fields(turn_bufs, rows))

  def disown(carry, new):
    """Rows ``new`` [B] (just forked into) sampled none of the tokens they hold."""
    state, cache, (tokens, mask, logps, turn_ids, tok_rewards), turn_bufs, rows, key = carry
    keep = ~new[:, None]
    bufs = (tokens, mask & keep, jnp.where(keep, logps, 0.0), jnp.where(keep, turn_ids, -1),
            jnp.where(keep, tok_rewards, 0.0))
    return (state, cache, bufs, turn_bufs, rows, key)

  if config.history_turns < 0:
    return Program(start, turn, finish, disown)

  # Bounded history: every turn's row is assembled on device from the token
  # segments rendered at earlier turns (openings, prompts, sampled replies),
  # then prefilled from an empty cache: the window is short, and the KV of
  # the previous row's tokens sits at other positions in the new row.
  k_hist = config.history_turns
  slots = min(k_hist, t_max - 1)  # history turns a row can hold
  wf, wn = text_env.first_width, max(text_env.next_width, 1)
  wu = max(wf, wn)
  p_max = s_max - n_max  # the prompt part of a row

  def windowed_turn(params, carry, t, key):
    state, segs, outs, turn_bufs, rows, step_key = carry
    left = config.max_actions_per_traj - rows["actions"]
    turn = jnp.full((b_size,), t + 1, jnp.int32)
    f_tok, f_len = jax.vmap(text_env.first_prompt)(state, left, turn)
    x_tok, x_len = jax.vmap(text_env.next_prompt)(
        state, turn, left, rows["last_reward"], rows["eos"])
    pad_to = lambda a: jnp.pad(a, ((0, 0), (0, wu - a.shape[1])), constant_values=pad_id)
    segs = dict(segs)
    segs["first"] = segs["first"].at[:, t].set(pad_to(f_tok))
    segs["first_len"] = segs["first_len"].at[:, t].set(f_len)
    segs["next"] = segs["next"].at[:, t].set(pad_to(x_tok))
    segs["next_len"] = segs["next_len"].at[:, t].set(x_len)
    w0 = jnp.maximum(t - k_hist, 0)

    def user(j):  # the prompt of turn j in this row: the opening, or as in full
      opening = j == w0
      toks = jnp.where(opening, segs["first"][:, j], segs["next"][:, j])
      n = jnp.where(opening, segs["first_len"][:, j], segs["next_len"][:, j])
      return toks, n, n <= jnp.where(opening, wf, wn)  # a rendering cut by its buffer

    row = jnp.full((b_size, s_max), pad_id, jnp.int32)
    off = jnp.zeros((b_size,), jnp.int32)
    ok = jnp.ones((b_size,), bool)
    for i in range(slots):
      j = t - slots + i
      taken = j >= 0
      jj = jnp.maximum(j, 0)
      toks, n, fit = user(jj)
      n = jnp.where(taken, n, 0)
      ok = ok & (fit | ~taken)
      row = _scatter_rows(row, off, toks, n)
      off = off + n
      n = jnp.where(taken, segs["reply_len"][:, jj], 0)
      row = _scatter_rows(row, off, segs["reply"][:, jj], n)
      off = off + n
    toks, n, fit = user(t)
    row = _scatter_rows(row, off, toks, n)
    plen = off + n
    active = ~rows["done"]
    fits = ok & fit & (plen + n_max <= s_max)
    overflow_now = active & ~fits
    active = active & fits
    rows = dict(rows)
    rows["end_reason"] = jnp.where(overflow_now, tj.CONTEXT_OVERFLOW, rows["end_reason"])
    rows["truncated"] = rows["truncated"] | overflow_now
    rows["done"] = rows["done"] | overflow_now
    anchor = _hash(jax.vmap(env.render_symbols)(state))
    plen = jnp.where(active, plen, 0)
    row = jnp.where(active[:, None], row, pad_id)
    out = _sampling.generate(
        params, row[:, :p_max], plen, _sampling.fold_in(key, t),
        _transformer.init_cache(model_config, b_size, s_max), config=model_config,
        sampling=sampling, active=active,
        token_table=(jnp.asarray(table_np), jnp.asarray(table_len_np)))
    n = out.lengths
    state, rows, step_key, turn_reward, per_turn = play(state, rows, step_key, out, active,
                                                        anchor, t)
    segs["reply"] = segs["reply"].at[:, t].set(out.tokens)
    segs["reply_len"] = segs["reply_len"].at[:, t].set(n)
    put = lambda buf, fill, vals, count, start=plen: _scatter_rows(
        jnp.full((b_size, s_max), fill, buf.dtype), start, vals, count)
    new = dict(
        tokens=_scatter_rows(row, plen, out.tokens, n),
        loss_mask=put(outs["loss_mask"], False, jnp.ones_like(out.tokens, bool), n),
        logprobs=put(outs["logprobs"], 0.0, out.logprobs, n),
        turn_ids=put(outs["turn_ids"], -1, jnp.full_like(out.tokens, t), n),
        token_rewards=put(outs["token_rewards"], 0.0, turn_reward[:, None],
                          active.astype(jnp.int32), jnp.maximum(plen + n - 1, 0)),
        length=jnp.where(active, plen + n, 0), row_valid=active)
    outs = {f: outs[f].at[:, t].set(new[f].astype(outs[f].dtype)) for f in outs}
    turn_bufs = {k: v.at[:, t].set(per_turn[k].astype(v.dtype)) for k, v in turn_bufs.items()}
    return (state, segs, outs, turn_bufs, rows, step_key)

  def windowed_start(params, key, reset_keys=None, row_keys=False):
    k_sample, k_env, state = initial_states(key, reset_keys, row_keys)
    bt = (b_size, t_max)
    segs = dict(first=jnp.full(bt + (wu,), pad_id, jnp.int32), first_len=jnp.zeros(bt, jnp.int32),
                next=jnp.full(bt + (wu,), pad_id, jnp.int32), next_len=jnp.zeros(bt, jnp.int32),
                reply=jnp.full(bt + (n_max,), pad_id, jnp.int32),
                reply_len=jnp.zeros(bt, jnp.int32))
    outs = dict(tokens=jnp.full(bt + (s_max,), pad_id, jnp.int32),
                loss_mask=jnp.zeros(bt + (s_max,), bool),
                logprobs=jnp.zeros(bt + (s_max,), jnp.float32),
                turn_ids=jnp.full(bt + (s_max,), -1, jnp.int32),
                token_rewards=jnp.zeros(bt + (s_max,), jnp.float32),
                length=jnp.zeros(bt, jnp.int32), row_valid=jnp.zeros(bt, bool))
    turn_bufs, rows = initial_books()
    carry = (state, segs, outs, turn_bufs, rows, k_env)
    return carry, k_sample, None

  def windowed_finish(carry):
    _, _, outs, turn_bufs, rows, _ = carry
    r_size = b_size * t_max
    flat = {f: v.reshape((r_size,) + v.shape[2:]) for f, v in outs.items()}
    r = jnp.arange(r_size, dtype=jnp.int32)
    return tj.Trajectory(row_episode=r // t_max, row_turn=r % t_max,
                         history_turns=k_hist, **flat, **episode_fields(turn_bufs, rows))

  def windowed_disown(carry, new):
    """Rows ``new`` [B] (just forked into) took none of the turn rows they hold."""
    state, segs, outs, turn_bufs, rows, key = carry
    keep = ~new[:, None, None]
    outs = dict(outs, loss_mask=outs["loss_mask"] & keep,
                logprobs=jnp.where(keep, outs["logprobs"], 0.0),
                turn_ids=jnp.where(keep, outs["turn_ids"], -1),
                token_rewards=jnp.where(keep, outs["token_rewards"], 0.0),
                row_valid=outs["row_valid"] & keep[:, :, 0])
    return (state, segs, outs, turn_bufs, rows, key)

  return Program(windowed_start, lambda params, carry, t, key, aux: windowed_turn(
      params, carry, t, key), windowed_finish, windowed_disown)
