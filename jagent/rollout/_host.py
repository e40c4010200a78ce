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

:func:`expert_rollout` runs the same loop with an :class:`Expert` (a
scripted policy writing reply text) in place of the model: expert
demonstrations for SFT warm starts come out as the same :class:`Trajectory`
that RL consumes (see :func:`jagent.rollout.demonstrations`).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Protocol, Sequence

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


class Expert(Protocol):
  """A scripted policy for :func:`expert_rollout`: writes the reply text of rows.

  Called once per turn with the rows still playing; returns one reply per
  row, the full assistant text after the generation prompt, e.g.
  ``"<answer>Up || Left</answer>"`` in answer-only mode or
  ``"I push the box.</think><answer>Up</answer>"`` in think mode (the
  ``<think>`` primer is already in the prompt). The loop appends the EOS
  token. :func:`jagent.rollout.make_expert` builds experts for the shipped
  games.
  """

  def __call__(self, rows: Sequence[int], envs: Sequence[HostEnv],
               states: Sequence[str]) -> Sequence[str]:
    """Reply texts of ``rows`` (batch indices), given their envs and state texts."""


# Jitted reset / step+render of each environment object, shared by all the
# JaxEnvAsHost rows that wrap it (one compile per environment, not per row).
_JITTED: "weakref.WeakKeyDictionary[Any, tuple[Callable, Callable]]" = (
    weakref.WeakKeyDictionary())


def _jitted(env) -> tuple[Callable, Callable]:
  try:
    return _JITTED[env]
  except (KeyError, TypeError):
    pass

  def reset(key, params):
    _, state = env.reset(key, params)
    return state, env.render_symbols(state)

  def step(key, state, action, params):
    _, state, r, te, tr, info = env.step(key, state, action, params)
    eff = info.get("action_effective", jnp.ones((), bool))
    return state, env.render_symbols(state), (r, te, tr, info["success"], eff)

  fns = (jax.jit(reset), jax.jit(step))
  try:
    _JITTED[env] = fns
  except TypeError:  # not weak-referenceable: no sharing
    pass
  return fns


class JaxEnvAsHost:
  """A JAX environment behind the :class:`HostEnv` interface (eager, one row).

  Reset and step run jit-compiled together with ``env.render_symbols``;
  rows wrapping the same environment object share the compiled functions.

  Args:
    env: an ``envs_jax`` environment.
    env_params: its params (default ``env.default_params``).
    instructions: default :func:`default_instructions`.

  Attributes:
    state: the JAX state of the current episode (None before ``reset``).
    render_ids: int32 numpy [render_length] ``env.render_symbols(state)``
      (the state text is the join of these symbols).
  """

  def __init__(self, env, env_params=None, instructions: str | None = None):
    self.env = env
    self.env_params = env.default_params if env_params is None else env_params
    self.action_names = tuple(env.action_names)
    self.instructions = (instructions if instructions is not None
                         else _text.default_instructions(env))
    self.max_answer_bytes = int(getattr(env, "max_answer_bytes", 128))
    self._reset, self._step = _jitted(env)
    self._symbols = tuple(env.symbols)
    self.state = None
    self.render_ids = None

  def _text(self, ids) -> str:
    self.render_ids = np.asarray(ids)
    return "".join(self._symbols[i] for i in self.render_ids)

  def reset(self, key: jax.Array) -> str:
    """Resets from ``key``; returns ``env.render_text`` of the state."""
    self.state, ids = self._reset(key, self.env_params)
    return self._text(ids)

  def step(self, action: str | bytes, key: jax.Array) -> HostStep:
    """Steps with an action name (case-insensitive) or answer bytes.

    Raises:
      ValueError: an action name the environment does not have.
    """
    if self.action_names:
      lookup = {n.lower(): i for i, n in enumerate(self.action_names)}
      if action.lower() not in lookup:
        raise ValueError(f"unknown action {action!r}; actions: {self.action_names}")
      a = np.int32(lookup[action.lower()])
    else:
      buf = np.zeros((self.max_answer_bytes,), np.uint8)
      raw = bytes(action)[:self.max_answer_bytes]
      buf[:len(raw)] = np.frombuffer(raw, np.uint8)
      a = buf
    self.state, ids, out = self._step(key, self.state, a, self.env_params)
    r, te, tr, succ, eff = jax.device_get(out)
    return HostStep(state=self._text(ids), reward=float(r), terminated=bool(te),
                    truncated=bool(tr), success=bool(succ), effective=bool(eff))


def _key_rows(keys: jax.Array) -> Callable[[int], jax.Array]:
  """``f(b) = keys[b]``, without one device slice per row (fast on the host)."""
  if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
    impl = jax.random.key_impl(keys)
    data = np.asarray(jax.random.key_data(keys))
    return lambda b: jax.random.wrap_key_data(data[b], impl=impl)
  data = np.asarray(keys)  # raw uint32 keys
  return lambda b: data[b]


def _hash_text(symbols: np.ndarray) -> int:
  weights = np.array([pow(1000003, k, 2**32) for k in range(len(symbols))], np.uint64)
  h = int(np.sum(symbols.astype(np.uint64) * weights) % (2**32))
  return h - 2**32 if h >= 2**31 else h


# A replier writes one turn's replies: (turn, active [B], seq, new prompt ids,
# state texts) -> (reply ids per row, their logprobs per row, eos [B]); rows
# that are not active get empty replies.
_Replier = Callable[[int, np.ndarray, list, list, list],
                    tuple[list, list, np.ndarray]]


def _model_replier(params, key, *, model_config, config, conversation, context_size,
                   reencode) -> _Replier:
  """Replies sampled by the policy with :func:`jagent.models.generate`."""
  tok = conversation.tokenizer
  b_size = config.batch_size
  sampling = config.sampling(conversation.eos_id, _text.TextEnv.stop_strings)
  table, table_len = tok.token_bytes()
  token_table = (jnp.asarray(table), jnp.asarray(table_len))
  pad = model_config.pad_id if model_config.pad_id is not None else (tok.pad_id or 0)
  cache = [None if reencode else _transformer.init_cache(model_config, b_size, context_size)]

  def reply(t, active, seq, new, states):
    del states
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
      cache_in = cache[0]
    gen = _sampling.generate(
        params, prompt, plen, jax.random.fold_in(key, t), cache_in,
        config=model_config, sampling=sampling, active=active, token_table=token_table)
    cache[0] = gen.cache
    toks, lps, lens, eos = (np.asarray(x) for x in (
        gen.tokens, gen.logprobs, gen.lengths, gen.eos))
    ids = [[int(x) for x in toks[b, :lens[b]]] if active[b] else [] for b in range(b_size)]
    logps = [lps[b, :lens[b]] if active[b] else lps[b, :0] for b in range(b_size)]
    return ids, logps, eos.astype(bool)

  return reply


def _expert_replier(expert: Expert, envs, *, conversation, config) -> _Replier:
  """Replies written by ``expert``: ``encode(text) + [eos]``, logprobs 0."""
  tok = conversation.tokenizer
  b_size, n_max = config.batch_size, config.max_tokens_per_turn

  def reply(t, active, seq, new, states):
    del t, seq, new
    rows = [int(b) for b in np.flatnonzero(active)]
    texts = list(expert(rows, [envs[b] for b in rows], [states[b] for b in rows]))
    if len(texts) != len(rows):
      raise ValueError(f"expert returned {len(texts)} replies for {len(rows)} rows")
    ids = [[] for _ in range(b_size)]
    for b, text in zip(rows, texts):
      if not isinstance(text, str):
        raise ValueError(f"expert reply for row {b} is {text!r}, not a str")
      ids[b] = list(tok.encode(text)) + [conversation.eos_id]
      if len(ids[b]) > n_max:
        raise ValueError(
            f"expert reply {text!r} for row {b} is {len(ids[b])} tokens with EOS, more "
            f"than RolloutConfig.max_tokens_per_turn={n_max}")
    logps = [np.zeros(len(x), np.float32) for x in ids]
    return ids, logps, np.asarray(active, bool).copy()

  return reply


def _play(replier: _Replier, key, envs, conversation, *, config, context_size, pad,
          reset_keys, reencode, anchor_symbols) -> tj.Trajectory:
  """The turn loop shared by :func:`host_rollout` and :func:`expert_rollout`."""
  b_size, g, t_max = config.batch_size, config.group_size, config.max_turns
  if len(envs) != b_size:
    raise ValueError(f"got {len(envs)} envs for RolloutConfig.batch_size {b_size}")
  tok = conversation.tokenizer
  n_max = config.max_tokens_per_turn
  spec = conversation.parse_spec()
  free_text = not spec.action_names
  k_actions = 1 if free_text else spec.max_actions_per_turn
  table, table_len = tok.token_bytes()
  _, _, env_key = jax.random.split(key, 3)  # the middle key samples replies
  if reset_keys is None:
    reset_keys = _rollout.group_reset_keys(key, config.num_groups)
  reset_key = _key_rows(reset_keys)
  states = [envs[b].reset(reset_key(b // g)) for b in range(b_size)]

  k_hist = config.history_turns
  window = k_hist >= 0
  r_size = b_size * t_max if window else b_size
  seq = [[] for _ in range(b_size)]  # the token sequence of each episode's current row
  row_seq = [[] for _ in range(r_size)]
  text_segments = [[] for _ in range(b_size)]  # alternating prompt text / reply ids
  # Bounded history: per episode and turn, (opening text, prompt text, reply ids).
  hist = [[] for _ in range(b_size)]
  out = dict(
      loss_mask=np.zeros((r_size, context_size), bool),
      logprobs=np.zeros((r_size, context_size), np.float32),
      turn_ids=np.full((r_size, context_size), -1, np.int32),
      token_rewards=np.zeros((r_size, context_size), np.float32))
  row_valid = np.zeros(r_size, bool) if window else np.ones(r_size, bool)
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

  for t in range(t_max):
    texts = []
    openings = []
    for b in range(b_size):
      left = config.max_actions_per_traj - actions[b]
      texts.append(conversation.first_text(states[b], config.max_actions_per_traj) if t == 0
                   else conversation.next_text(states[b], t + 1, left, last_reward[b], eos[b]))
      if window:
        openings.append(conversation.first_text(states[b], left, t + 1))
    new = []
    if window:  # every row starts afresh: its window is re-encoded from the texts
      seq = [[] for _ in range(b_size)]
    for b in range(b_size):
      if window:  # RAGEN's ctx_manager: the last k turns' messages, re-encoded
        w0 = max(0, t - k_hist)
        segs = []
        for j in range(w0, min(t, len(hist[b]))):
          opening, prompt_text, reply = hist[b][j]
          segs += [opening if j == w0 else prompt_text, reply]
        segs.append(openings[b] if t == w0 else texts[b])
        ids = []
        for x in segs:
          ids += tok.encode(x) if isinstance(x, str) else list(x)
        new.append(ids)
      elif reencode:  # RAGEN: re-tokenize every text segment of the conversation
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
    reply_ids, reply_lps, eos_now = replier(t, active, seq, new, states)
    replies = []
    for b in range(b_size):
      if active[b]:
        row = b * t_max + t if window else b
        seq[b] += new[b]
        s0 = len(seq[b])
        reply = reply_ids[b]
        n = len(reply)
        seq[b] += reply
        row_seq[row] = seq[b]
        row_valid[row] = True
        text_segments[b].append(reply)
        if window:
          hist[b].append((openings[b], texts[b], list(reply)))
        out["loss_mask"][row, s0:s0 + n] = True
        out["logprobs"][row, s0:s0 + n] = reply_lps[b]
        out["turn_ids"][row, s0:s0 + n] = t
        body = reply[:n - int(eos_now[b])]
        replies.append(b"".join(bytes(table[i, :table_len[i]]) for i in body))
      else:
        replies.append(b"")
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
      row_key = _key_rows(jax.random.split(sub, b_size))
      for b in range(b_size):
        p = parsed[b]
        if not (active[b] and j < p["num_actions"] and not term[b] and not trunc[b]
                and used[b] < budget_left[b]):
          continue
        act = p["answer"] if free_text else spec.action_names[p["actions"][j]]
        step = envs[b].step(act, row_key(b))
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
      out["token_rewards"][b * t_max + t if window else b, s_last] = r
      per_turn["turn_rewards"][b, t] = r
      per_turn["reply_lengths"][b, t] = len(reply_ids[b])
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
  tokens = np.full((r_size, context_size), pad, np.int32)
  for r in range(r_size):
    tokens[r, :len(row_seq[r])] = row_seq[r]
  rows = np.arange(r_size, dtype=np.int32)
  return tj.Trajectory(
      tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(out["loss_mask"]),
      logprobs=jnp.asarray(out["logprobs"]), turn_ids=jnp.asarray(out["turn_ids"]),
      token_rewards=jnp.asarray(out["token_rewards"]),
      length=jnp.asarray([len(s) for s in row_seq], jnp.int32),
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
      group_ids=jnp.arange(b_size, dtype=jnp.int32) // g,
      row_valid=jnp.asarray(row_valid),
      row_episode=jnp.asarray(rows // t_max if window else rows),
      row_turn=jnp.asarray(rows % t_max if window else np.zeros_like(rows)),
      group_size=g, history_turns=k_hist)


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
      cache across turns and prefills only the new tokens. With
      ``config.history_turns >= 0`` every row's window is re-encoded from its
      texts (the opening, prompts and reply ids of the last k turns, as
      RAGEN's ``ctx_manager.py`` builds its messages) and prefilled from an
      empty cache, whatever ``reencode`` says.
    anchor_symbols: optional ``f(b) -> int array`` giving row b's state
      symbols for ``anchor_hashes`` (JAX environments); default hashes 0.

  Returns:
    A :class:`Trajectory` with the fields and layout of :func:`make_rollout`'s
    (``config.history_turns``: one row per episode, or per turn).

  Raises:
    ValueError: ``len(envs) != config.batch_size``.
  """
  tok = conversation.tokenizer
  pad = model_config.pad_id if model_config.pad_id is not None else (tok.pad_id or 0)
  _, k_sample, _ = jax.random.split(key, 3)
  replier = _model_replier(params, k_sample, model_config=model_config, config=config,
                           conversation=conversation, context_size=context_size,
                           reencode=reencode or config.history_turns >= 0)
  return _play(replier, key, envs, conversation, config=config, context_size=context_size,
               pad=pad, reset_keys=reset_keys, reencode=reencode,
               anchor_symbols=anchor_symbols)


def expert_rollout(
    expert: Expert,
    key: jax.Array,
    envs: Sequence[HostEnv],
    conversation: _text.Conversation,
    *,
    config: _rollout.RolloutConfig,
    context_size: int,
    reset_keys: jax.Array | None = None,
    reencode: bool = False,
    anchor_symbols=None,
    pad_id: int | None = None,
) -> tj.Trajectory:
  """:func:`host_rollout` with an :class:`Expert` writing the replies (demonstrations).

  Each turn, the expert writes the reply text of every row still playing;
  the reply's tokens are ``tokenizer.encode(text) + [eos_id]`` (trained:
  ``loss_mask`` True, ``logprobs`` 0, EOS counted as sampled so the next
  prompt omits it as after a model's EOS). Everything else (prompts,
  parsing by :func:`reference_parse`, actions, rewards, end reasons,
  budgets, context overflow, groups, keys) is :func:`host_rollout`'s loop,
  so a demonstration is exactly the trajectory a policy that sampled those
  tokens would have produced. This is RAGEN's SFT-on-BFS-demonstrations
  data, but in the RL rollout's format (SFT trains the token-mean NLL of the
  reply tokens, :func:`jagent.train.sft_step`).

  Args:
    expert: the :class:`Expert` (e.g. :func:`jagent.rollout.make_expert`).
    key: the rollout key (split like :func:`host_rollout`'s, so the same key
      gives the same initial states).
    envs: B host environments; row ``b`` plays ``envs[b]``.
    conversation: the host text layer (:class:`Conversation`).
    config: :class:`RolloutConfig` (turn, action and reply-length limits;
      sampling settings are not used).
    context_size: S, tokens per trajectory.
    reset_keys: optional [num_groups] keys of the initial states.
    reencode: tokenize prompts as RAGEN does (see :func:`host_rollout`).
    anchor_symbols: as :func:`host_rollout`'s.
    pad_id: the padding id of ``tokens`` (default the tokenizer's, or 0).

  Returns:
    A :class:`Trajectory` with the fields and layout of :func:`make_rollout`'s:
    with ``config.history_turns >= 0`` one row per turn, each reply trained
    in its own row after its bounded-history context.

  Raises:
    ValueError: ``len(envs) != config.batch_size``; the expert returned the
      wrong number of replies, a non-str reply, or a reply longer than
      ``config.max_tokens_per_turn`` tokens with its EOS.
  """
  tok = conversation.tokenizer
  pad = pad_id if pad_id is not None else (tok.pad_id or 0)
  replier = _expert_replier(expert, envs, conversation=conversation, config=config)
  return _play(replier, key, envs, conversation, config=config, context_size=context_size,
               pad=pad, reset_keys=reset_keys, reencode=reencode,
               anchor_symbols=anchor_symbols)
