"""Host-loop rollouts: Python environments through the same rollout API.

Environments that cannot be written in JAX (web pages, tools, simulators)
implement :class:`HostEnv` (reset and step on strings); :func:`host_rollout`
plays them turn by turn from Python, generating each reply with the same
jit-compiled sampler, and returns the same :class:`Trajectory` as the
on-device rollout. :class:`JaxEnvAsHost` wraps a JAX environment as a host one;
with ``reencode=True`` the loop re-tokenizes the whole conversation every turn
and prefills it from scratch, as RAGEN does. That is the reference the
on-device rollout is tested against (token-identical under greedy decoding),
and the baseline its benchmark compares to. Unlike RAGEN, replies are kept as
the sampled token ids (RAGEN re-tokenizes their text, so it trains on tokens
the model may never have sampled).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jagent.models import _config as _model_config
from jagent.models import _sampling
from jagent.models import _transformer
from jagent.rollout import _parse
from jagent.rollout import _rollout
from jagent.rollout import _text
from jagent.rollout import _trajectory as tj


@dataclasses.dataclass(frozen=True)
class HostStep:
  """What :meth:`HostEnv.step` returns for one action.

  Attributes:
    state: text of the new state.
    reward: float reward of the action.
    terminated: the game reached a terminal state.
    truncated: the game's own budget ended the episode.
    success: the goal was reached (meaningful when terminated).
    effective: the action changed the state.
  """
  state: str
  reward: float
  terminated: bool
  truncated: bool = False
  success: bool = False
  effective: bool = True


class HostEnv(Protocol):
  """A text game played from Python (one episode at a time per object).

  Attributes:
    action_names: names of the discrete actions, or ``()`` for free-text
      answers (then ``step`` receives the answer text).
    instructions: the game's instructions for the first user message.
  """

  action_names: tuple[str, ...]
  instructions: str

  def reset(self, key: jax.Array) -> str:
    """Starts an episode from a PRNG key; returns the state text."""

  def step(self, action: str | bytes, key: jax.Array) -> HostStep:
    """Plays one action (an action name, or the answer bytes of a free-text game)."""


class JaxEnvAsHost:
  """A JAX environment behind the :class:`HostEnv` interface (eager, one row).

  Args:
    env: an ``envs_jax`` environment.
    env_params: its params (default ``env.default_params``).
    instructions: default :func:`default_instructions`.
  """

  def __init__(self, env, env_params=None, instructions: str | None = None):
    self.env = env
    self.env_params = env.default_params if env_params is None else env_params
    self.action_names = tuple(env.action_names)
    self.instructions = (instructions if instructions is not None
                         else _text.default_instructions(env))
    self.max_answer_bytes = int(getattr(env, "max_answer_bytes", 128))
    self._reset = jax.jit(env.reset)
    self._step = jax.jit(env.step)
    self.state = None

  def reset(self, key: jax.Array) -> str:
    """Resets from ``key``; returns ``env.render_text`` of the state."""
    _, self.state = self._reset(key, self.env_params)
    return self.env.render_text(self.state)

  def step(self, action: str | bytes, key: jax.Array) -> HostStep:
    """Steps with an action name (case-insensitive) or answer bytes.

    Raises:
      ValueError: an action name the environment does not have.
    """
    if self.action_names:
      lookup = {n.lower(): i for i, n in enumerate(self.action_names)}
      if action.lower() not in lookup:
        raise ValueError(f"unknown action {action!r}; actions: {self.action_names}")
      a = jnp.int32(lookup[action.lower()])
    else:
      buf = np.zeros((self.max_answer_bytes,), np.uint8)
      raw = bytes(action)[:self.max_answer_bytes]
      buf[:len(raw)] = np.frombuffer(raw, np.uint8)
      a = jnp.asarray(buf)
    _, self.state, r, te, tr, info = self._step(key, self.state, a, self.env_params)
    return HostStep(state=self.env.render_text(self.state), reward=float(r),
                    terminated=bool(te), truncated=bool(tr), success=bool(info["success"]),
                    effective=bool(info.get("action_effective", True)))


def _hash_text(symbols: np.ndarray) -> int:
  weights = np.array([pow(1000003, k, 2**32) for k in range(len(symbols))], np.uint64)
  h = int(np.sum(symbols.astype(np.uint64) * weights) % (2**32))
  return h - 2**32 if h >= 2**31 else h


def host_rollout(
    params: _transformer.Params,
    key: jax.Array,
    envs: Sequence[HostEnv],
    conversation: _text.Conversation,
    *,
    model_config: _model_config.ModelConfig,
    config: _rollout.RolloutConfig,
    context_size: int,
    reset_keys: jax.Array | None = None,
    reencode: bool = False,
    anchor_symbols=None,
) -> tj.Trajectory:
  """Plays ``envs`` (one per row, ``B = config.batch_size``) turn by turn from Python.

  The protocol, key schedule and bookkeeping follow :func:`make_rollout`, so
  a JAX environment wrapped in :class:`JaxEnvAsHost` gives the same
  trajectory for the same key (token-identical under greedy decoding).
  Replies are generated for all rows at once by
  :func:`jagent.models.generate` and parsed by :func:`reference_parse`.

  Args:
    params: policy parameters.
    key: the rollout key (split like :func:`make_rollout`'s).
    envs: B host environments; row ``b`` plays ``envs[b]``.
    conversation: the host text layer (:class:`Conversation`).
    model_config: the policy's config.
    config: :class:`RolloutConfig` (its sampling, turn and action limits).
    context_size: S, tokens per trajectory.
    reset_keys: optional [num_groups] keys of the initial states.
    reencode: re-tokenize the whole conversation each turn and prefill it
      from an empty cache (RAGEN's way; the reference); False keeps the KV
      cache across turns and prefills only the new tokens.
    anchor_symbols: optional ``f(b) -> int array`` giving row b's state
      symbols for ``anchor_hashes`` (JAX environments); default hashes 0.

  Returns:
    A :class:`Trajectory` with the fields of :func:`make_rollout`'s.

  Raises:
    ValueError: ``len(envs) != config.batch_size``.
  """
  b_size, g, t_max = config.batch_size, config.group_size, config.max_turns
  if len(envs) != b_size:
    raise ValueError(f"host_rollout got {len(envs)} envs for batch_size {b_size}")
  tok = conversation.tokenizer
  n_max = config.max_tokens_per_turn
  sampling = config.sampling(conversation.eos_id, _text.TextEnv.stop_strings)
  spec = conversation.parse_spec()
  free_text = not spec.action_names
  k_actions = 1 if free_text else spec.max_actions_per_turn
  table, table_len = tok.token_bytes()
  pad = model_config.pad_id if model_config.pad_id is not None else (tok.pad_id or 0)
  k_reset, k_sample, env_key = jax.random.split(key, 3)
  if reset_keys is None:
    reset_keys = jax.random.split(k_reset, config.num_groups)
  states = [envs[b].reset(reset_keys[b // g]) for b in range(b_size)]

  seq = [[] for _ in range(b_size)]  # the token sequence of each row
  text_segments = [[] for _ in range(b_size)]  # alternating prompt text / reply ids
  out = dict(
      loss_mask=np.zeros((b_size, context_size), bool),
      logprobs=np.zeros((b_size, context_size), np.float32),
      turn_ids=np.full((b_size, context_size), -1, np.int32),
      token_rewards=np.zeros((b_size, context_size), np.float32))
  per_turn = {k: np.zeros((b_size, t_max), np.int32) for k in (
      "reply_lengths", "num_pieces", "num_valid", "num_executed", "num_effective",
      "anchor_hashes")}
  per_turn["turn_rewards"] = np.zeros((b_size, t_max), np.float32)
  per_turn["format_valid"] = np.zeros((b_size, t_max), bool)
  done = np.zeros(b_size, bool)
  reason = np.zeros(b_size, np.int32)
  terminated = np.zeros(b_size, bool)
  truncated = np.zeros(b_size, bool)
  success = np.zeros(b_size, bool)
  actions = np.zeros(b_size, np.int32)
  num_turns = np.zeros(b_size, np.int32)
  eos = np.zeros(b_size, bool)
  last_reward = np.zeros(b_size, np.float32)
  cache = None if reencode else _transformer.init_cache(model_config, b_size, context_size)

  for t in range(t_max):
    texts = []
    for b in range(b_size):
      left = config.max_actions_per_traj - actions[b]
      texts.append(conversation.first_text(states[b], config.max_actions_per_traj) if t == 0
                   else conversation.next_text(states[b], t + 1, left, last_reward[b], eos[b]))
    new = []
    for b in range(b_size):
      if reencode:  # RAGEN: re-tokenize every text segment of the conversation
        segs = text_segments[b] + [texts[b]]
        full = []
        for s in segs:
          full += tok.encode(s) if isinstance(s, str) else list(s)
        new.append(full[len(seq[b]):])
      else:
        new.append(tok.encode(texts[b]))
    active = ~done
    for b in range(b_size):
      if active[b] and len(seq[b]) + len(new[b]) + n_max > context_size:
        active[b] = False
        done[b], reason[b], truncated[b] = True, tj.CONTEXT_OVERFLOW, True
    for b in range(b_size):
      if active[b]:
        text_segments[b].append(texts[b])
        if anchor_symbols is not None:
          per_turn["anchor_hashes"][b, t] = _hash_text(np.asarray(anchor_symbols(b)))
    starts = np.array([len(s) for s in seq], np.int32)
    if reencode:
      width = context_size  # one shape for every turn: one compile
      prompt = np.full((b_size, width), pad, np.int32)
      plen = np.zeros(b_size, np.int32)
      for b in range(b_size):
        ids = (seq[b] + new[b])[:width]
        prompt[b, :len(ids)] = ids
        plen[b] = len(ids) if active[b] else 0
      cache_in = _transformer.init_cache(model_config, b_size, context_size)
    else:
      width = 1 << max(0, max(len(x) for x in new) - 1).bit_length()  # few shapes
      prompt = np.full((b_size, width), pad, np.int32)
      plen = np.zeros(b_size, np.int32)
      for b in range(b_size):
        if active[b]:
          prompt[b, :len(new[b])] = new[b]
          plen[b] = len(new[b])
      cache_in = cache
    gen = _sampling.generate(
        params, prompt, plen, jax.random.fold_in(k_sample, t), cache_in,
        config=model_config, sampling=sampling, active=active,
        token_table=(jnp.asarray(table), jnp.asarray(table_len)))
    cache = gen.cache
    toks, lps, lens, eos_now = (np.asarray(x) for x in (
        gen.tokens, gen.logprobs, gen.lengths, gen.eos))
    replies = []
    for b in range(b_size):
      if active[b]:
        seq[b] += new[b]
        s0 = len(seq[b])
        reply = [int(x) for x in toks[b, :lens[b]]]
        seq[b] += reply
        text_segments[b].append(reply)
        out["loss_mask"][b, s0:s0 + lens[b]] = True
        out["logprobs"][b, s0:s0 + lens[b]] = lps[b, :lens[b]]
        out["turn_ids"][b, s0:s0 + lens[b]] = t
        body = reply[:len(reply) - int(eos_now[b])]
        replies.append(b"".join(bytes(table[i, :table_len[i]]) for i in body))
      else:
        replies.append(b"")
    del starts
    # Actions, with make_rollout's key schedule (keys are drawn for every row).
    parsed = [_parse.reference_parse(r, spec) for r in replies]
    env_reward = np.zeros(b_size, np.float32)
    term = np.zeros(b_size, bool)
    trunc = np.zeros(b_size, bool)
    succ = np.zeros(b_size, bool)
    used = np.zeros(b_size, np.int32)
    eff = np.zeros(b_size, np.int32)
    budget_left = config.max_actions_per_traj - actions
    for j in range(k_actions):
      env_key, sub = jax.random.split(env_key)
      keys = jax.random.split(sub, b_size)
      for b in range(b_size):
        p = parsed[b]
        if not (active[b] and j < p["num_actions"] and not term[b] and not trunc[b]
                and used[b] < budget_left[b]):
          continue
        act = p["answer"] if free_text else spec.action_names[p["actions"][j]]
        step = envs[b].step(act, keys[b])
        states[b] = step.state
        env_reward[b] = np.float32(env_reward[b] + np.float32(step.reward))
        term[b] |= step.terminated
        trunc[b] |= step.truncated
        succ[b] |= step.terminated and step.success
        used[b] += 1
        eff[b] += int(step.effective)
    for b in range(b_size):
      if not active[b]:
        continue
      p = parsed[b]
      r = np.float32(env_reward[b] + np.float32(0.0 if p["format_valid"]
                                                else config.format_penalty))
      s_last = len(seq[b]) - 1
      out["token_rewards"][b, s_last] = r
      per_turn["turn_rewards"][b, t] = r
      per_turn["reply_lengths"][b, t] = lens[b]
      per_turn["format_valid"][b, t] = p["format_valid"]
      per_turn["num_pieces"][b, t] = p["num_pieces"]
      per_turn["num_valid"][b, t] = p["num_actions"]
      per_turn["num_executed"][b, t] = used[b]
      per_turn["num_effective"][b, t] = eff[b]
      actions[b] += used[b]
      num_turns[b] += 1
      terminated[b] |= term[b]
      success[b] |= succ[b]
      last_reward[b] = r
      eos[b] = eos_now[b]
      if term[b] or trunc[b] or actions[b] >= config.max_actions_per_traj or t == t_max - 1:
        done[b] = True
        truncated[b] = not term[b]
        reason[b] = (tj.TERMINATED if term[b] else tj.ENV_TRUNCATED if trunc[b] else
                     tj.ACTION_BUDGET if actions[b] >= config.max_actions_per_traj
                     else tj.MAX_TURNS)
  tokens = np.full((b_size, context_size), pad, np.int32)
  for b in range(b_size):
    tokens[b, :len(seq[b])] = seq[b]
  return tj.Trajectory(
      tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(out["loss_mask"]),
      logprobs=jnp.asarray(out["logprobs"]), turn_ids=jnp.asarray(out["turn_ids"]),
      token_rewards=jnp.asarray(out["token_rewards"]),
      length=jnp.asarray([len(s) for s in seq], jnp.int32),
      turn_rewards=jnp.asarray(per_turn["turn_rewards"]),
      scores=jnp.asarray(per_turn["turn_rewards"].sum(axis=1, dtype=np.float32)),
      num_turns=jnp.asarray(num_turns), reply_lengths=jnp.asarray(per_turn["reply_lengths"]),
      format_valid=jnp.asarray(per_turn["format_valid"]),
      num_pieces=jnp.asarray(per_turn["num_pieces"]),
      num_valid=jnp.asarray(per_turn["num_valid"]),
      num_executed=jnp.asarray(per_turn["num_executed"]),
      num_effective=jnp.asarray(per_turn["num_effective"]),
      anchor_hashes=jnp.asarray(per_turn["anchor_hashes"]),
      num_actions=jnp.asarray(actions), success=jnp.asarray(success),
      terminated=jnp.asarray(terminated), truncated=jnp.asarray(truncated),
      end_reason=jnp.asarray(reason), overflow=jnp.asarray(reason == tj.CONTEXT_OVERFLOW),
      group_ids=jnp.arange(b_size, dtype=jnp.int32) // g, group_size=g)
