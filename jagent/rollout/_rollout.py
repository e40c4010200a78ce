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
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jagent.models import _config as _model_config
from jagent.models import _sampling
from jagent.models import _transformer
from jagent.rollout import _parse
from jagent.rollout import _text
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
      (RAGEN's es_manager: -0.1). The one home of the format penalty: the
      trajectory's rewards hold it, and no objective adds it again
      (``jagent.train.trajectory_batch`` leaves ``format_valid`` out).

  Raises:
    ValueError: from ``__post_init__``, naming the bad field.
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
  format_penalty: float = -0.1

  def __post_init__(self):
    for name in ("num_groups", "group_size", "max_turns", "max_tokens_per_turn",
                 "max_actions_per_traj"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"RolloutConfig.{name}={v!r}: must be an int >= 1")
    if self.context_size is not None and (
        not isinstance(self.context_size, int) or self.context_size < 1):
      raise ValueError(f"RolloutConfig.context_size={self.context_size!r}: must be a "
                       "positive int or None")
    if not isinstance(self.format_penalty, (int, float)) or not -float("inf") < (
        self.format_penalty) <= 0:
      # One sign everywhere: the (non-positive) reward added to a bad turn.
      raise ValueError(f"RolloutConfig.format_penalty={self.format_penalty!r}: must be a "
                       "finite float <= 0 (the reward added to a bad turn; RAGEN: -0.1)")
    self.sampling()  # validates temperature / top_k / top_p

  @property
  def batch_size(self) -> int:
    """B = num_groups * group_size."""
    return self.num_groups * self.group_size

  def sampling(self, eos_id: int | None = None, stop_strings=()) -> _sampling.SamplingConfig:
    """The :class:`jagent.models.SamplingConfig` of one reply."""
    return _sampling.SamplingConfig(
        max_new_tokens=self.max_tokens_per_turn, temperature=self.temperature,
        top_k=self.top_k, top_p=self.top_p, greedy=self.greedy,
        eos_ids=() if eos_id is None else (eos_id,), stop_strings=tuple(stop_strings))


def context_size(text_env: _text.TextEnv, config: RolloutConfig) -> int:
  """S: ``config.context_size`` or room for ``max_turns`` full turns."""
  if config.context_size is not None:
    return config.context_size
  n = config.max_tokens_per_turn
  return text_env.first_width + n + (config.max_turns - 1) * (text_env.next_width + n)


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


def make_rollout(text_env: _text.TextEnv, model_config: _model_config.ModelConfig,
                 config: RolloutConfig, env_params: Any = None
                 ) -> Callable[..., tj.Trajectory]:
  """Builds the jitted rollout of ``text_env`` for one model and config.

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
  tok = text_env.tokenizer
  if tok.vocab_size > model_config.vocab_size:
    raise ValueError(f"tokenizer vocab_size {tok.vocab_size} > model vocab_size "
                     f"{model_config.vocab_size}")
  s_max = context_size(text_env, config)
  n_max = config.max_tokens_per_turn
  if text_env.first_width + n_max > s_max:
    raise ValueError(
        f"RolloutConfig.context_size={s_max} cannot hold turn 1's prompt "
        f"({text_env.first_width} tokens) plus max_tokens_per_turn={n_max}")
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
    done = done | overflow_now
    anchor = _hash(jax.vmap(env.render_symbols)(state))
    plen = jnp.where(active, prompt_len, 0)
    tokens = _scatter_rows(tokens, pos, prompt, plen)
    out = _sampling.generate(
        params, prompt, plen, jax.random.fold_in(key, t), cache, config=model_config,
        sampling=sampling, active=active,
        token_table=(jnp.asarray(table_np), jnp.asarray(table_len_np)))
    n = out.lengths
    start = pos + plen
    tokens = _scatter_rows(tokens, start, out.tokens, n)
    mask = _scatter_rows(mask, start, jnp.ones_like(out.tokens, bool), n)
    logps = _scatter_rows(logps, start, out.logprobs, n)
    turn_ids = _scatter_rows(turn_ids, start, jnp.full_like(out.tokens, t), n)
    # Parse the reply (without a sampled EOS) and play its actions.
    parsed = _parse.parse_tokens(out.tokens, n - out.eos.astype(jnp.int32),
                                 jnp.asarray(table_np), jnp.asarray(table_len_np), spec,
                                 max_bytes)
    budget_left = config.max_actions_per_traj - rows["actions"]

    def act(j, c):
      st, reward, term, trunc, succ, used, effective, env_key = c
      env_key, sub = jax.random.split(env_key)
      go = active & (j < parsed.num_actions) & ~term & ~trunc & (used < budget_left)
      action = parsed.answer if free_text else jnp.maximum(parsed.actions[:, j], 0)
      keys = jax.random.split(sub, b_size)
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
    last = start + n - 1
    tok_rewards = _scatter_rows(tok_rewards, jnp.maximum(last, 0), turn_reward[:, None],
                                active.astype(jnp.int32))
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
    rows["done"] = done | ended
    rows["eos"] = out.eos
    rows["last_reward"] = turn_reward
    per_turn = dict(
        turn_rewards=turn_reward, reply_lengths=n,
        format_valid=active & parsed.format_valid,
        num_pieces=jnp.where(active, parsed.num_pieces, 0),
        num_valid=jnp.where(active, parsed.num_actions, 0),
        num_executed=used, num_effective=effective,
        anchor_hashes=jnp.where(active, anchor, 0))
    turn_bufs = {k: v.at[:, t].set(per_turn[k].astype(v.dtype)) for k, v in turn_bufs.items()}
    bufs = (tokens, mask, logps, turn_ids, tok_rewards)
    return (state, out.cache, bufs, turn_bufs, rows, step_key)

  def rollout(params, key, reset_keys=None):
    k_reset, k_sample, k_env = jax.random.split(key, 3)
    if reset_keys is None:
      reset_keys = jax.random.split(k_reset, config.num_groups)
    row_keys = jnp.repeat(reset_keys, g_size, axis=0)
    _, state = jax.vmap(env.reset, in_axes=(0, None))(row_keys, env_params)
    cache = _transformer.init_cache(model_config, b_size, s_max)
    bufs = (jnp.full((b_size, s_max), pad_id, jnp.int32),
            jnp.zeros((b_size, s_max), bool),
            jnp.zeros((b_size, s_max), jnp.float32),
            jnp.full((b_size, s_max), -1, jnp.int32),
            jnp.zeros((b_size, s_max), jnp.float32))
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
    # Turn 1's prompt is long: prefill all but its last token here, so that
    # every turn (traced once, in one loop) feeds at most next_width tokens.
    first, first_len = jax.vmap(text_env.first_prompt)(
        state, jnp.full((b_size,), config.max_actions_per_traj, jnp.int32))
    head = jnp.maximum(first_len - 1, 0)
    w1 = first.shape[1]
    _, cache = _transformer.apply(
        params, first, jnp.broadcast_to(jnp.arange(w1, dtype=jnp.int32), first.shape), cache,
        config=model_config, num_tokens=head, logits_at=jnp.zeros((b_size,), jnp.int32))
    tokens = _scatter_rows(bufs[0], jnp.zeros((b_size,), jnp.int32), first, head)
    bufs = (tokens,) + bufs[1:]
    first_last = jnp.take_along_axis(first, head[:, None], axis=1)  # [B, 1]
    wn = max(text_env.next_width, 1)
    first_last = jnp.pad(first_last, ((0, 0), (0, wn - 1)), constant_values=pad_id)
    carry = (state, cache, bufs, turn_bufs, rows, k_env)

    def body(t, carry):
      state, _, _, _, rows, _ = carry
      left = config.max_actions_per_traj - rows["actions"]
      prompt, plen = jax.vmap(text_env.next_prompt)(
          state, jnp.full((b_size,), t + 1, jnp.int32), left, rows["last_reward"], rows["eos"])
      first_turn = t == 0
      prompt = jnp.where(first_turn, first_last, prompt)
      # A turn-1 rendering longer than its buffer reports as overflow (plen > wn).
      plen = jnp.where(first_turn, jnp.where(first_len <= w1, 1, wn + 1), plen)
      return run_turn(params, carry, t, prompt, plen, k_sample)

    carry = jax.lax.fori_loop(0, t_max, body, carry)
    _, cache, bufs, turn_bufs, rows, _ = carry
    tokens, mask, logps, turn_ids, tok_rewards = bufs
    return tj.Trajectory(
        tokens=tokens, loss_mask=mask, logprobs=logps, turn_ids=turn_ids,
        token_rewards=tok_rewards, length=cache.lengths,
        scores=jnp.sum(turn_bufs["turn_rewards"], axis=1), num_turns=rows["num_turns"],
        num_actions=rows["actions"], success=rows["success"], terminated=rows["terminated"],
        truncated=rows["truncated"], end_reason=rows["end_reason"],
        overflow=rows["end_reason"] == tj.CONTEXT_OVERFLOW,
        group_ids=jnp.arange(b_size, dtype=jnp.int32) // g_size, group_size=g_size,
        **turn_bufs)

  return jax.jit(rollout)
