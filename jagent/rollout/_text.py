"""The text layer: an environment, a tokenizer and a prompt, rendered on device.

A :class:`TextEnv` turns environment states into the token ids of each turn's
prompt inside ``jit`` and checks, once on the host at construction, that those
ids are exactly what the tokenizer produces for the same text.

The conversation follows RAGEN's multi-turn protocol (``ragen/llm_agent/ctx_manager.py``):
a system message, a first user message (instructions, then ``Turn 1`` with the
state), then per turn the assistant's reply and a user message with the
previous turn's reward and the next state; each assistant turn is primed with
``<think>`` (or nothing in answer-only mode). In token space, the prompt of a
turn is everything between two replies:

* turn 1: chat prefix, system text, user header, first user text, the
  generation prompt (assistant header) and the primer;
* turn k > 1: the end of the previous assistant message (without the EOS token
  when the model sampled it itself, because the sampled EOS is already in the
  sequence), the user header, the next user text, the generation prompt and
  the primer.

User texts are ``str.format`` templates (:class:`PromptConfig`) over the fields
``{instructions}``, ``{format_hint}`` (fixed text), ``{turn}``,
``{actions_left}`` (integers), ``{reward}`` (a float, written as
``str(round(x, 2))``) and ``{state}`` (the environment's rendering).

Rendering on device: each piece of fixed text is tokenized once on the host;
each environment symbol, digit, "." and "-" maps to its own token ids (a
``[num_symbols, width]`` table); a prompt is the concatenation of these pieces,
compacted into a fixed-width buffer. This equals tokenizing the whole text only
when the tokenizer never merges across piece boundaries. That holds for the
shipped tiny tokenizer (its grid symbols and newline are single pieces) and is
checked on many random states at construction; a tokenizer that disagrees
raises ``ValueError`` naming the first mismatch instead of silently training
on text the tokenizer would never produce.
"""

from __future__ import annotations

import collections
import dataclasses
import string
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from envs_jax._src import environment as _environment
from jagent._src import fingerprint as _fingerprint
from jagent._src.errors import FieldError
from jagent.tokenizers import _base as _tok_base

# Fields a user text may use; the first two are fixed text, the rest dynamic.
STATIC_FIELDS = ("instructions", "format_hint")
DYNAMIC_FIELDS = ("turn", "actions_left", "reward", "state")
_INT_DIGITS = 3  # turn numbers and action budgets below 1000
_REWARD_INT_DIGITS = 3
_REWARD_FRAC_DIGITS = 2

# The jitted draws of TextEnv._draw, keyed on everything they close over
# (TextEnv._draw_key), least recently used dropped past 32: a process that
# builds the same TextEnv again (an experiment per run of a sweep, per
# evaluation, ...) reuses the compiled program instead of compiling another.
_DRAWS: collections.OrderedDict = collections.OrderedDict()
_MAX_DRAWS = 32

THINK_HINT = ("Reply as <think> [your reasoning] </think> <answer> [your answer] </answer> "
              "and nothing else.")
ANSWER_HINT = "Reply as <answer> [your answer] </answer> and nothing else."


def default_instructions(env: _environment.Environment) -> str:
  """The environment's own instruction text (:attr:`Environment.instructions`).

  Args:
    env: an environment (wrappers forward the property).

  Returns:
    The instructions placed in the first user message: the goal and rules,
    the symbol legend of grid games and the answer format of the actions.

  Raises:
    ValueError: for an environment without instructions; pass
      ``PromptConfig(instructions=...)`` for it.
  """
  text = getattr(env, "instructions", None)
  if text is None:
    base = env.unwrapped if hasattr(env, "unwrapped") else env
    raise ValueError(f"no default instructions for environment {type(base).__name__}; "
                     "pass PromptConfig(instructions=...)")
  return text


@dataclasses.dataclass(frozen=True)
class PromptConfig:
  """The prompt of a multi-turn text game (static, hashable).

  Attributes:
    system: the system message.
    instructions: the game's instructions (None: :func:`default_instructions`).
    first_turn: user text of turn 1 (a ``str.format`` template over
      ``instructions, format_hint, turn, actions_left, reward, state``).
    next_turn: user text of later turns; ``{reward}`` is the previous turn's
      reward (environment rewards plus the format penalty).
    think: replies are ``<think>..</think><answer>..</answer>`` and the
      assistant turn is primed with ``<think>``; False: answer only.
    max_actions_per_turn: actions kept from one reply (RAGEN v1: 5).
    chat_template: "chatml", "llama3", a callable, or None for the
      tokenizer's own template.

  Raises:
    jagent.FieldError: (a ValueError) from ``__post_init__``, naming an unknown template field.
  """

  system: str = "You are a helpful assistant who plays text games well."
  instructions: str | None = None
  first_turn: str = ("{instructions}\nTurn {turn}:\nState:\n{state}\nYou have "
                     "{actions_left} actions left. {format_hint}\n")
  next_turn: str = ("Reward:\n{reward}\n\nTurn {turn}:\nState:\n{state}\nYou have "
                    "{actions_left} actions left. {format_hint}\n")
  think: bool = True
  max_actions_per_turn: int = 5
  chat_template: str | Callable[..., str] | None = None

  def __post_init__(self):
    for name in ("first_turn", "next_turn"):
      text = getattr(self, name)
      for _, field, spec, conv in string.Formatter().parse(text):
        if field is None:
          continue
        if field not in STATIC_FIELDS + DYNAMIC_FIELDS or spec or conv:
          raise FieldError(
              "PromptConfig", name, text, f"uses {{{field}}}; allowed fields (no format "
              f"specs) are {STATIC_FIELDS + DYNAMIC_FIELDS}", show_value=False)
    if self.max_actions_per_turn < 1:
      raise FieldError("PromptConfig", "max_actions_per_turn", self.max_actions_per_turn,
                       "must be >= 1")

  @classmethod
  def compact(cls, **overrides) -> "PromptConfig":
    """A short prompt for tiny CPU models: instructions once, terse turns.

    The format hint is given once in turn 1 and later turns carry only the
    reward and the state, so a 5-turn Sokoban episode fits in about 500
    tokens of the tiny tokenizer.
    """
    kw = dict(system="You are a helpful assistant.",
              first_turn="{instructions}\n{format_hint}\nTurn {turn}:\n{state}\n",
              next_turn="Reward:\n{reward}\nTurn {turn}:\n{state}\n")
    kw.update(overrides)
    return cls(**kw)


def format_reward(x: float) -> str:
  """Host text of a reward: ``str(round(float32(x), 2))`` (the device rendering)."""
  return str(round(float(np.float32(x)), _REWARD_FRAC_DIGITS))


def _cached_draw(key: tuple, build: Callable[[], Callable]) -> Callable:
  """The draw cached under ``key``, or ``build()`` (not cached if ``key`` is unhashable)."""
  try:
    draw = _DRAWS.get(key)
  except TypeError:  # e.g. an unhashable static field of a params pytree
    return build()
  if draw is None:
    draw = _DRAWS[key] = build()
    while len(_DRAWS) > _MAX_DRAWS:
      _DRAWS.popitem(last=False)
  _DRAWS.move_to_end(key)
  return draw


class _Part:
  """One piece of a prompt: fixed tokens, or symbol ids rendered on device."""

  def __init__(self, const: np.ndarray | None = None, field: str | None = None):
    self.const = const
    self.field = field


def _split_template(template, sentinels: Sequence[str], messages) -> list[str]:
  """Renders ``messages`` and cuts the text at each sentinel, in order."""
  text = template(messages, add_generation_prompt=True)
  out = []
  for s in sentinels:
    i = text.find(s)
    if i < 0:
      raise ValueError(f"chat template dropped the content of a message ({s!r}); "
                       "it cannot be rendered turn by turn")
    out.append(text[:i])
    text = text[i + len(s):]
  out.append(text)
  return out


class Conversation:
  """Host-side text of the multi-turn protocol (no JAX environment needed).

  The chat template is cut into the pieces that sit between messages by
  rendering it once with sentinel contents, so any template (ChatML, Llama 3,
  a callable) works if it renders earlier messages the same way once later
  ones follow.

  Args:
    tokenizer: the :class:`jagent.tokenizers.Tokenizer` (its ``eos_id`` ends
      replies).
    prompt: the :class:`PromptConfig`.
    instructions: the game's instructions (``{instructions}``).
    action_names: the game's action names (empty: free-text answers).
    max_answer_bytes: width of a free-text answer buffer.

  Attributes:
    generation_prompt: text after a user message up to the reply (the
      assistant header plus the ``<think>`` primer in think mode).
    after_reply: text closing an assistant message and opening the next user
      message; ``after_reply_eos`` is the same without the EOS text, used
      when the model sampled EOS itself.

  Raises:
    ValueError: no ``eos_id``, an unknown template name, or a template that
      cannot be cut into turns.
  """

  def __init__(self, tokenizer: _tok_base.Tokenizer, prompt: PromptConfig,
               instructions: str, action_names: Sequence[str] = (),
               max_answer_bytes: int = 128):
    if tokenizer.eos_id is None:
      raise ValueError(f"tokenizer {tokenizer!r} has no eos_id; a reply cannot end")
    self.tokenizer = tokenizer
    self.prompt = prompt
    self.eos_id = int(tokenizer.eos_id)
    self.instructions = instructions
    self.action_names = tuple(action_names)
    self.max_answer_bytes = int(max_answer_bytes)
    self.format_hint = THINK_HINT if prompt.think else ANSWER_HINT
    template = prompt.chat_template
    if template is None:
      template = tokenizer.apply_chat_template
    elif isinstance(template, str):
      if template not in _tok_base.CHAT_TEMPLATES:
        raise ValueError(f"PromptConfig.chat_template={template!r}; known: "
                         f"{sorted(_tok_base.CHAT_TEMPLATES)} or a callable")
      template = _tok_base.CHAT_TEMPLATES[template]
    sys_s, user_s, asst_s, user2_s = "\x00SYS\x00", "\x00U1\x00", "\x00A1\x00", "\x00U2\x00"
    pre, mid, gen = _split_template(template, [sys_s, user_s], [
        {"role": "system", "content": sys_s}, {"role": "user", "content": user_s}])
    pre2, mid2, gen2, between, gen3 = _split_template(
        template, [sys_s, user_s, asst_s, user2_s], [
            {"role": "system", "content": sys_s}, {"role": "user", "content": user_s},
            {"role": "assistant", "content": asst_s}, {"role": "user", "content": user2_s}])
    if (pre2, mid2, gen2) != (pre, mid, gen[:len(gen2)]) or gen3 != gen:
      raise ValueError("chat template renders earlier turns differently once a reply "
                       "follows; it cannot be rendered turn by turn")
    primer = "<think>" if prompt.think else ""
    self.generation_prompt = gen + primer
    self.first_prefix = pre + prompt.system + mid
    eos_text = tokenizer.decode([self.eos_id])
    self.after_reply = between
    self.after_reply_eos = (between[len(eos_text):]
                            if eos_text and between.startswith(eos_text) else between)

  def first_text(self, state_text: str, actions_left: int, turn: int = 1) -> str:
    """Text of turn 1's prompt: chat prefix, system, first user message, header.

    ``turn`` (1-based) > 1 renders the same opening for a later turn: the
    first message of a bounded-history row (``RolloutConfig.history_turns``).
    """
    return self.first_prefix + self._user_text(
        self.prompt.first_turn, state_text, turn, actions_left, 0.0) + self.generation_prompt

  def next_text(self, state_text: str, turn: int, actions_left: int, reward: float,
                eos_sampled: bool) -> str:
    """Text between reply ``turn - 1`` and reply ``turn`` (``turn`` is 1-based)."""
    lead = self.after_reply_eos if eos_sampled else self.after_reply
    return lead + self._user_text(self.prompt.next_turn, state_text, turn, actions_left,
                                  reward) + self.generation_prompt

  def _user_text(self, template, state_text, turn, actions_left, reward):
    return template.format(instructions=self.instructions, format_hint=self.format_hint,
                           turn=int(turn), actions_left=int(actions_left),
                           reward=format_reward(reward), state=state_text)

  def parse_spec(self):
    """The :class:`jagent.rollout.ParseSpec` of this game's replies."""
    from jagent.rollout import _parse  # pylint: disable=g-import-not-at-top
    return _parse.ParseSpec(action_names=self.action_names, think=self.prompt.think,
                            max_actions_per_turn=self.prompt.max_actions_per_turn,
                            max_answer_bytes=self.max_answer_bytes)


class TextEnv:
  """Binds an environment, a tokenizer and a prompt; renders turns on device.

  Args:
    env: an ``envs_jax`` environment (usually from ``envs_jax.make``).
    tokenizer: a :class:`jagent.tokenizers.Tokenizer` with an ``eos_id``.
    prompt: the :class:`PromptConfig` (default: RAGEN-style full prompt).
    env_params: the environment's params, used to draw verification states
      (default ``env.default_params``).
    verify_states: random states (resets plus random steps) checked on the
      host against ``tokenizer.encode``; 0 skips the check (not advised).
    verify_seed: seed of those states.

  Attributes:
    env, tokenizer, prompt: as given.
    first_width: static width of turn 1's prompt buffer (tokens).
    next_width: static width of a later turn's prompt buffer.
    eos_id: the tokenizer's end-of-turn id (generation stops on it).
    stop_strings: ``("</answer>",)``: generation also stops on it.

  Raises:
    ValueError: no ``eos_id``; an environment symbol that tokenizes to
      nothing; a chat template that cannot be cut into turns; or a tokenizer
      whose ids for a rendered prompt differ from ``encode`` of its text (the
      message names the first differing text and token).
  """

  stop_strings = ("</answer>",)

  def __init__(self, env: _environment.Environment, tokenizer: _tok_base.Tokenizer,
               prompt: PromptConfig | None = None, *, env_params: Any = None,
               verify_states: int = 256, verify_seed: int = 0):
    self.env = env
    self.tokenizer = tokenizer
    self.prompt = prompt = prompt if prompt is not None else PromptConfig()
    instructions = (prompt.instructions if prompt.instructions is not None
                    else default_instructions(env))
    self.conversation = conv = Conversation(
        tokenizer, prompt, instructions, env.action_names,
        int(getattr(env, "max_answer_bytes", 128)))
    self.eos_id = conv.eos_id
    if env_params is None:
      env_params = env.default_params
    self.env_params = env_params
    self._build_symbol_table()
    self._first_parts = self._parts(conv.first_prefix, prompt.first_turn)
    self._next_parts = self._parts(None, prompt.next_turn)
    self._lead = tuple(np.asarray(self.tokenizer.encode(t), np.int32)
                       for t in (conv.after_reply, conv.after_reply_eos))
    # One compile draws the states, which set the width of the {state} field, and
    # renders their prompts into buffers sized for the field's bound; a prompt in
    # the final, narrower buffer is the same one cut at that width.
    drawn = self._draw(max(verify_states, 64), verify_seed)
    self._state_len = self._state_width(drawn["ids"])
    self.first_width = self._width(self._first_parts)
    self.next_width = self._width(self._next_parts, max(len(t) for t in self._lead))
    if verify_states:
      self._check(drawn)

  # ----------------------------------------------------------- host pieces
  def _build_symbol_table(self):
    """Symbols: env symbols, then digits, '.', '-'; each to its token ids."""
    syms = list(self.env.symbols) + [str(d) for d in range(10)] + [".", "-"]
    self._digit0 = len(self.env.symbols)
    self._dot, self._minus = self._digit0 + 10, self._digit0 + 11
    ids = [self.tokenizer.encode(s) if s else [] for s in syms]
    for s, i in zip(syms, ids):
      if s and not i:
        raise ValueError(f"symbol {s!r} tokenizes to no tokens")
    width = max(1, max(len(i) for i in ids))
    table = np.zeros((len(syms), width), np.int32)
    for k, i in enumerate(ids):
      table[k, :len(i)] = i
    self._symbols = tuple(syms)
    self._table = table
    self._table_len = np.array([len(i) for i in ids], np.int32)

  def _state_width(self, ids: np.ndarray) -> int:
    """Token width of the ``{state}`` field.

    ``render_length x`` the longest symbol bounds it; when that is much more
    than the longest rendering seen on the sampled states (games whose
    symbols are long phrases used once, like Bandit's), the width is that
    longest seen plus a margin of 8 median symbols, and a longer state at
    run time is reported as a prompt overflow by the rollout.

    Args:
      ids: int32 [B, n], ``render_symbols`` of the sampled states.
    """
    env_len = self._table_len[:len(self.env.symbols)]
    bound = self._state_bound(ids.shape[-1])
    seen = int(env_len[ids].sum(-1).max())
    margin = 8 * max(1, int(np.median(env_len[1:])))
    return min(bound, seen + margin)

  def _state_bound(self, render_len: int) -> int:
    """Tokens of a state rendering of ``render_len`` symbols, at most."""
    return int(self._table_len[:len(self.env.symbols)].max()) * render_len

  def _draw(self, num_states: int, seed: int, widths: tuple[int, int] | None = None
            ) -> dict[str, Any]:
    """Draws verification states and renders their prompts in one jitted call.

    States are ``env.text_sizing_state`` of ``num_states`` keys (a reset plus
    0-3 random actions in a discrete game); turn numbers (2-39), budgets (0-119), rewards (tenths in
    [-15, 15)) and EOS flags are drawn on the host from ``seed``. The program
    is compiled once per process for equal pieces (:meth:`_draw_key`): a
    TextEnv built again from the same environment settings, params,
    tokenizer and prompt reuses it (the seed is an argument).

    Args:
      num_states: B, the number of states.
      seed: the seed of the keys and of the host draws.
      widths: ``(first, next)`` buffer widths; None: sized for the state
        field's bound (before the widths are known).

    Returns:
      A dict of numpy arrays: ``ids`` int32 [B, n] (``render_symbols``),
      ``first``/``next`` int32 [B, W] tokens with ``first_n``/``next_n``
      int32 [B] lengths, the draws ``turn``, ``left`` int32 [B], ``reward``
      float32 [B], ``eos`` bool [B]; and ``states`` (device pytree, leading
      axis B).
    """
    env, params = self.env, self.env_params
    rng = np.random.default_rng(seed)
    turn = rng.integers(2, 40, num_states).astype(np.int32)
    left = rng.integers(0, 120, num_states).astype(np.int32)
    reward = (rng.integers(-150, 150, num_states) / 10.0).astype(np.float32)
    eos = rng.random(num_states) < 0.5
    lead = max(len(t) for t in self._lead)

    def one(key, turn, left, reward, eos):
      state = env.text_sizing_state(key, params)
      ids = jnp.asarray(env.render_symbols(state), jnp.int32)
      if widths is None:
        bound = self._state_bound(ids.shape[0])
        wf = self._width(self._first_parts, state_len=bound)
        wn = self._width(self._next_parts, lead, state_len=bound)
      else:
        wf, wn = widths
      first = self._render(self._first_parts, wf, state, 1, left, 0.0)
      nxt = self._next_render(wn, state, turn, left, reward, eos)
      return state, ids, first, nxt

    def build():
      @jax.jit
      def draw(seed, turn, left, reward, eos):
        keys = jax.random.split(jax.random.key(seed), num_states)
        return jax.vmap(one)(keys, turn, left, reward, eos)
      return draw

    draw = _cached_draw(self._draw_key(num_states, widths), build)
    states, ids, (first, first_n), (nxt, nxt_n) = draw(
        np.int32(seed), turn, left, reward, eos)
    out = dict(zip(("ids", "first", "first_n", "next", "next_n"),
                   map(np.asarray, (ids, first, first_n, nxt, nxt_n))))
    out.update(turn=turn, left=left, reward=reward, eos=eos, states=states)
    return out

  def _draw_key(self, num_states: int, widths: tuple[int, int] | None) -> tuple:
    """What :meth:`_draw`'s program reads: the environment and its params (by
    content, :func:`jagent._src.fingerprint.fingerprint`), the token tables
    and prompt pieces, the pad id, the batch and the buffer widths."""
    parts = tuple(tuple(p.field if p.const is None else p.const.tobytes() for p in ps)
                  for ps in (self._first_parts, self._next_parts))
    return (_fingerprint.fingerprint(self.env), _fingerprint.fingerprint(self.env_params),
            self._table.shape, self._table.tobytes(), self._table_len.tobytes(), parts,
            tuple(t.tobytes() for t in self._lead), self.tokenizer.pad_id or 0,
            int(num_states), widths)

  def _parts(self, prefix: str | None, template: str) -> list[_Part]:
    parts = []
    text = "" if prefix is None else prefix

    def flush(text):
      if text:
        parts.append(_Part(const=np.asarray(self.tokenizer.encode(text), np.int32)))

    for literal, field, _, _ in string.Formatter().parse(template):
      text += literal
      if field is None:
        continue
      if field == "instructions":
        text += self.conversation.instructions
      elif field == "format_hint":
        text += self.conversation.format_hint
      else:
        flush(text)
        text = ""
        parts.append(_Part(field=field))
    flush(text + self.conversation.generation_prompt)
    return parts

  def _field_max_tokens(self, field: str, state_len: int | None = None) -> int:
    digit_w = int(self._table_len[self._digit0:].max())
    if field in ("turn", "actions_left"):
      return _INT_DIGITS * digit_w
    if field == "reward":
      return (3 + _REWARD_INT_DIGITS + _REWARD_FRAC_DIGITS) * digit_w
    return self._state_len if state_len is None else state_len

  def _width(self, parts, lead: int = 0, state_len: int | None = None) -> int:
    return lead + sum(len(p.const) if p.const is not None
                      else self._field_max_tokens(p.field, state_len) for p in parts)

  # -------------------------------------------------------------- device
  def _field_symbols(self, field, state, turn, actions_left, reward):
    if field == "state":
      return jnp.asarray(self.env.render_symbols(state), jnp.int32)
    if field in ("turn", "actions_left"):
      x = turn if field == "turn" else actions_left
      return _environment.number_symbols(jnp.asarray(x, jnp.int32), self._digit0,
                                         int_digits=_INT_DIGITS)
    return _environment.number_symbols(
        jnp.asarray(reward, jnp.float32), self._digit0, int_digits=_REWARD_INT_DIGITS,
        frac_digits=_REWARD_FRAC_DIGITS, dot_id=self._dot, minus_id=self._minus)

  def _render(self, parts, width, state, turn, actions_left, reward, lead=None):
    """Concatenates the parts of one prompt into ``(int32 [width], length)``."""
    table = jnp.asarray(self._table)
    table_len = jnp.asarray(self._table_len)
    pieces = []  # (tokens [w], valid length)
    if lead is not None:
      pieces.append(lead)
    for p in parts:
      if p.const is not None:
        pieces.append((jnp.asarray(p.const), jnp.int32(len(p.const))))
        continue
      sym = self._field_symbols(p.field, state, turn, actions_left, reward)  # [n]
      toks = table[sym]  # [n, Wt]
      lens = table_len[sym]  # [n]
      start = jnp.cumsum(lens) - lens
      wt = toks.shape[1]
      pos = start[:, None] + jnp.arange(wt)[None]
      pos = jnp.where(jnp.arange(wt)[None] < lens[:, None], pos, sym.shape[0] * wt)
      flat = jnp.zeros((sym.shape[0] * wt,), jnp.int32).at[pos.reshape(-1)].set(
          toks.reshape(-1), mode="drop")
      pieces.append((flat, jnp.sum(lens)))
    out = jnp.full((width,), self.tokenizer.pad_id or 0, jnp.int32)
    offset = jnp.int32(0)
    for toks, n in pieces:
      w = toks.shape[0]
      pos = offset + jnp.arange(w, dtype=jnp.int32)
      pos = jnp.where(jnp.arange(w) < n, pos, width)
      out = out.at[pos].set(toks, mode="drop")
      offset = offset + n
    return out, offset

  def first_prompt(self, state, actions_left, turn=1) -> tuple[jax.Array, jax.Array]:
    """Token ids of turn 1's prompt for one (unbatched) state; vmap for a batch.

    Args:
      state: the initial environment state.
      actions_left: int32 [], the episode's action budget (``{actions_left}``).
      turn: int32 [], the 1-based ``{turn}``; > 1 opens a bounded-history row
        at a later turn (``RolloutConfig.history_turns``).

    Returns:
      ``(tokens int32 [first_width], length int32 [])``, right-padded with the
      tokenizer's pad id.
    """
    return self._render(self._first_parts, self.first_width, state, turn, actions_left, 0.0)

  def next_prompt(self, state, turn, actions_left, reward, eos_sampled
                  ) -> tuple[jax.Array, jax.Array]:
    """Token ids between reply ``turn - 1`` and reply ``turn`` (one state).

    Args:
      state: the environment state after the previous turn's actions.
      turn: int32 [], the 1-based number of the turn about to start (>= 2).
      actions_left: int32 [], environment actions still allowed.
      reward: float32 [], the previous turn's reward.
      eos_sampled: bool [], the previous reply ended with the EOS token (then
        it is not repeated).

    Returns:
      ``(tokens int32 [next_width], length int32 [])``.
    """
    return self._next_render(self.next_width, state, turn, actions_left, reward, eos_sampled)

  def _next_render(self, width, state, turn, actions_left, reward, eos_sampled):
    """:meth:`next_prompt` into a buffer of ``width`` tokens."""
    a, b = self._lead
    w = max(len(a), len(b), 1)
    lead_toks = jnp.where(eos_sampled, jnp.pad(jnp.asarray(b), (0, w - len(b))),
                          jnp.pad(jnp.asarray(a), (0, w - len(a))))
    lead_n = jnp.where(eos_sampled, len(b), len(a)).astype(jnp.int32)
    return self._render(self._next_parts, width, state, turn, actions_left, reward,
                        lead=(lead_toks, lead_n))

  # ---------------------------------------------------------------- host
  def first_text(self, state_text: str, actions_left: int, turn: int = 1) -> str:
    """Host text of turn 1's prompt (what :meth:`first_prompt` tokenizes)."""
    return self.conversation.first_text(state_text, actions_left, turn)

  def next_text(self, state_text: str, turn: int, actions_left: int, reward: float,
                eos_sampled: bool) -> str:
    """Host text of a later turn's prompt (what :meth:`next_prompt` tokenizes)."""
    return self.conversation.next_text(state_text, turn, actions_left, reward, eos_sampled)

  def parse_spec(self):
    """The :class:`jagent.rollout.ParseSpec` of this game's replies."""
    return self.conversation.parse_spec()

  def verify(self, num_states: int = 256, seed: int = 0) -> None:
    """Checks device prompts against ``tokenizer.encode`` on random states.

    States are ``env.text_sizing_state`` of ``num_states`` keys (a reset
    plus 0-3 random actions in a discrete game); turn numbers, budgets,
    rewards and the EOS flag are drawn at random too.

    Raises:
      ValueError: naming the first prompt whose device ids differ from
        ``encode`` of its text, with the differing tokens.
    """
    self._check(self._draw(num_states, seed, (self.first_width, self.next_width)))

  def _check(self, drawn: dict[str, Any]) -> None:
    """Compares each drawn prompt with ``encode`` of its host text (see verify).

    A prompt rendered into a wider buffer than ``first_width`` /
    ``next_width`` is cut at that width, as its rendering there would be.
    """
    env = self.env
    ids, first, first_n, nxt, nxt_n, turn, left, reward, eos = (drawn[k] for k in (
        "ids", "first", "first_n", "next", "next_n", "turn", "left", "reward", "eos"))
    # The host text is env.render_text; the base class's joins the symbols of the
    # ids drawn on device (one state at a time it would run render_symbols eagerly).
    own_text = type(env).render_text is not _environment.Environment.render_text
    for i in range(ids.shape[0]):
      if own_text:
        text = env.render_text(jax.tree.map(lambda x, i=i: x[i], drawn["states"]))
      else:
        text = "".join(env.symbols[j] for j in ids[i])
      checks = ((self.first_text(text, left[i]), first[i, :min(first_n[i], self.first_width)]),
                (self.next_text(text, turn[i], left[i], reward[i], eos[i]),
                 nxt[i, :min(nxt_n[i], self.next_width)]))
      for want_text, got in checks:
        want = self.tokenizer.encode(want_text)
        if list(got) != list(want):
          k = next((j for j in range(min(len(want), len(got))) if want[j] != got[j]),
                   min(len(want), len(got)))
          raise ValueError(
              f"{type(self.tokenizer).__name__} does not tokenize {env.name}'s prompt "
              f"piece by piece: at token {k} of {want_text!r}, encode gives "
              f"{want[k:k + 6]} ({self.tokenizer.decode(want[k:k + 6])!r}) but the "
              f"device rendering gives {list(got[k:k + 6])} "
              f"({self.tokenizer.decode(list(got[k:k + 6]))!r}). Use a tokenizer whose "
              "symbols are single pieces, or another prompt template.")
