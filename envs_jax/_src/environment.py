"""The environment interface shared by every jagent environment.

An environment object holds only static configuration (sizes, symbol tables,
action names). Everything that changes lives in a ``flax.struct`` state pytree,
and everything tunable lives in an ``EnvParams`` pytree passed on every call,
so ``jax.vmap`` works over keys, states and params alike (gymnax 1.0 style).

Signatures::

    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)

``terminated`` means the MDP reached a terminal state (goal, hole, solved);
``truncated`` means an external budget ended the episode (time limit, action
budget). They are never merged: a value function bootstraps on truncation only.

Text: every environment has a symbol table ``env.symbols`` (a tuple of
strings; id 0 is always the empty padding symbol ``""``). The device-side
``env.render_symbols(state)`` returns a fixed-length int32 vector of symbol ids
whose texts, concatenated, equal the host-side ``env.render_text(state)``
exactly. The text layer maps symbol ids to tokenizer ids later.

What the agent layer needs of a game lives on the game too, so that adding an
environment touches no code in ``jagent``: :attr:`Environment.instructions`
(the prompt's rules text), :attr:`Environment.agent_defaults` (episode budgets
a config starts from), and the expert hooks :meth:`Environment.expert_answers`
and :meth:`Environment.random_answers` that ``jagent.rollout.make_expert``
calls for SFT demonstrations.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import types
from typing import Any, Generic, Mapping, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

EnvState = TypeVar("EnvState")
EnvParams = TypeVar("EnvParams")

# (obs, state, reward, terminated, truncated, info)
StepResult = tuple[Any, Any, jax.Array, jax.Array, jax.Array, dict[str, jax.Array]]

PAD_SYMBOL = ""


@dataclasses.dataclass(frozen=True)
class AgentDefaults:
  """An environment's episode budgets and system message for agent configs.

  ``experiments/configs/tiny.py`` reads these instead of a per-game table.
  RAGEN's multi-turn games use 5 turns and 10 actions per episode.

  Attributes:
    max_turns: replies per episode.
    max_actions_per_traj: environment actions per episode.
    max_tokens_per_turn: reply budget in tokens of the shipped tiny
      tokenizer: the longest expert reply (EOS included) plus 2 tokens of
      slack.
    system: the system message of the tiny config's prompt.
  """

  max_turns: int
  max_actions_per_traj: int
  max_tokens_per_turn: int
  system: str


class Environment(abc.ABC, Generic[EnvState, EnvParams]):
  """Abstract base of a pure, jittable, batched environment.

  Subclasses implement :meth:`default_params`, :meth:`reset_env`,
  :meth:`step_env`, :meth:`observation` and :meth:`render_symbols`, and set the
  class/instance attributes ``symbols`` and ``action_names``. A game that
  agents train on also sets :attr:`instructions` and ``agent_defaults`` and,
  for SFT demonstrations, implements :meth:`expert_answers` (its own solver
  settings named in ``expert_defaults`` and checked by :meth:`expert_options`).

  Attributes:
    symbols: tuple of str. ``symbols[i]`` is the text of symbol id ``i``;
      ``symbols[0] == ""`` pads fixed-length renderings.
    action_names: tuple of str. ``action_names[a]`` is the name of discrete
      action ``a`` as a model writes it (RAGEN's names, case as in the prompt).
      Empty for free-text environments (Countdown), whose action is a byte
      buffer.
    agent_defaults: the :class:`AgentDefaults` configs start from; None:
      a config must set the budgets itself.
    expert_think_text: the reasoning text of the expert's think-mode replies.
    expert_defaults: the settings this game's expert takes (keyword options
      of :meth:`expert_answers`, e.g. Sokoban's ``max_nodes``) and their
      defaults; empty for an expert without settings.
  """

  symbols: tuple[str, ...] = (PAD_SYMBOL,)
  action_names: tuple[str, ...] = ()
  agent_defaults: AgentDefaults | None = None
  expert_think_text: str = "I follow the expert's plan."
  expert_defaults: Mapping[str, Any] = types.MappingProxyType({})

  # ----------------------------------------------------------------- params
  @property
  @abc.abstractmethod
  def default_params(self) -> EnvParams:
    """The registered default ``EnvParams`` pytree."""

  # ------------------------------------------------------------- dynamics
  @abc.abstractmethod
  def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[Any, EnvState]:
    """Samples an initial state. Returns ``(obs, state)``."""

  @abc.abstractmethod
  def step_env(
      self, key: jax.Array, state: EnvState, action: Any, params: EnvParams
  ) -> StepResult:
    """One transition from ``state``; no auto-reset, no time limit."""

  @abc.abstractmethod
  def observation(self, state: EnvState) -> jax.Array:
    """The symbolic observation array of ``state`` (shape per env docstring)."""

  def reset(
      self, key: jax.Array, params: EnvParams | None = None
  ) -> tuple[Any, EnvState]:
    """Samples an initial state.

    Args:
      key: a PRNG key (``jax.random.key`` or a raw uint32[2] key).
      params: an ``EnvParams`` pytree; ``None`` uses :attr:`default_params`.

    Returns:
      ``(obs, state)``: the symbolic observation and the state pytree.
    """
    if params is None:
      params = self.default_params
    return self.reset_env(key, params)

  def step(
      self,
      key: jax.Array,
      state: EnvState,
      action: Any,
      params: EnvParams | None = None,
  ) -> StepResult:
    """Advances one step.

    Args:
      key: a PRNG key for stochastic transitions (ignored when deterministic).
      state: the current state pytree.
      action: int32 scalar for discrete-action envs (an index into
        :attr:`action_names`); a per-env array for free-text envs.
      params: an ``EnvParams`` pytree; ``None`` uses :attr:`default_params`.

    Returns:
      ``(obs, state, reward, terminated, truncated, info)`` with ``reward`` a
      float32 scalar, ``terminated``/``truncated`` bool scalars and ``info`` a
      dict of arrays whose structure never depends on the inputs.
    """
    if params is None:
      params = self.default_params
    return self.step_env(key, state, action, params)

  def sample_action(self, key: jax.Array) -> Any:
    """A uniformly random action of the right shape and dtype.

    Discrete envs: int32 scalar uniform over ``[0, num_actions)``. Free-text
    environments override this.

    Raises:
      NotImplementedError: for a free-text env that does not override it.
    """
    if self.num_actions == 0:
      raise NotImplementedError(f"{self.name} has no discrete actions to sample")
    return jax.random.randint(key, (), 0, self.num_actions, dtype=jnp.int32)

  def text_sizing_state(self, key: jax.Array, params: EnvParams) -> EnvState:
    """A random state whose rendering helps size the prompt buffers.

    ``jagent.rollout.TextEnv`` renders a batch of these to set the width of
    a prompt's ``{state}`` field (the longest seen plus a margin; a longer
    state at run time is a prompt overflow) and to check the on-device text
    against the tokenizer. Default: a reset plus 0-3 random actions for a
    discrete game (:func:`random_steps`), a reset otherwise. A game whose
    text grows in states that these rarely reach (Sudoku's feedback and
    valid-number listing) overrides it to draw those too.

    Args:
      key: a typed PRNG key.
      params: the env params.

    Returns:
      One unbatched state (jit- and vmap-able).
    """
    k0, k1 = jax.random.split(key)
    _, state = self.reset(k0, params)
    return random_steps(self, k1, state, params) if self.num_actions else state

  # ----------------------------------------------------------------- text
  @abc.abstractmethod
  def render_symbols(self, state: EnvState) -> jax.Array:
    """Device-side rendering: int32 vector of ids into :attr:`symbols`.

    Fixed length for a given env (padding uses id 0, the empty symbol), so it
    can be computed under ``jit`` and ``vmap``.
    """

  def render_text(self, state: EnvState) -> str:
    """Host-side text of ``state``: the symbols of :meth:`render_symbols`.

    Only for an unbatched state. Raises ``ValueError`` for a batched one.
    """
    ids = np.asarray(jax.device_get(self.render_symbols(state)))
    if ids.ndim != 1:
      raise ValueError(
          "render_text takes one unbatched state; render_symbols gave shape "
          f"{ids.shape}. Index the batch first, e.g. "
          "jax.tree.map(lambda x: x[0], state)."
      )
    return "".join(self.symbols[i] for i in ids)

  @property
  def instructions(self) -> str | None:
    """The rules text of the prompt's first user message, or None if none.

    Goal and rules, the symbol legend of grid games and the answer format
    (see :func:`actions_sentence`). Read by
    ``jagent.rollout.default_instructions``.
    """
    return None

  # ---------------------------------------------------------------- expert
  def expert_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
    """This game's expert settings: ``options`` checked, over :attr:`expert_defaults`.

    :meth:`expert_answers` starts with it, and ``jagent.rollout.make_expert``
    calls it before any episode, so a setting the game's expert does not
    take is refused instead of ignored. A game whose settings have a range
    overrides it (calling this first) to check the values.

    Args:
      options: setting name -> value; names not given take their default.

    Returns:
      Every setting of :attr:`expert_defaults`, ``options`` over the defaults.

    Raises:
      ValueError: naming the game and each option its expert does not take
        (and those it takes); an override also raises on a bad value.
    """
    unknown = sorted(set(options) - set(self.expert_defaults))
    if unknown:
      takes = ", ".join(sorted(self.expert_defaults)) or "none"
      raise ValueError(f"{self.name}: unknown expert option {', '.join(map(repr, unknown))} "
                       f"({self.name}'s expert takes: {takes})")
    return {**self.expert_defaults, **options}

  def expert_answers(self, states: Sequence[EnvState], params: Sequence[EnvParams],
                     *, actions_per_turn: int = 1, **options: Any) -> list[str]:
    """The scripted expert's answer text for each of several states (host side).

    ``jagent.rollout.make_expert`` calls this every turn and wraps each text
    in ``<answer>..</answer>``; a discrete game answers action names joined
    by ``" || "``.

    Args:
      states: unbatched states with numpy leaves (wrapper states removed).
      params: the ``EnvParams`` of each state's episode (None where the
        caller has none; games whose expert reads params require them).
      actions_per_turn: actions per answer, at most.
      **options: the game's own solver settings by name (its
        :attr:`expert_defaults`; checked by :meth:`expert_options`).

    Returns:
      One answer text per state.

    Raises:
      NotImplementedError: for an environment without an expert.
      ValueError: an option the game's expert does not take, or a bad value.
    """
    raise NotImplementedError(f"{self.name} has no expert")

  def random_answers(self, states: Sequence[EnvState], rng: np.random.Generator, *,
                     actions_per_turn: int = 1) -> list[str]:
    """Uniformly random answers in the game's format (host side).

    Demonstrations of the reply format only. Discrete games: for each state,
    ``actions_per_turn`` action names drawn uniformly (one
    ``rng.integers(num_actions, size=(len(states), actions_per_turn))``
    call), joined by ``" || "``.

    Args:
      states: unbatched states with numpy leaves (wrapper states removed).
      rng: the numpy generator drawn from.
      actions_per_turn: actions per answer.

    Returns:
      One answer text per state.

    Raises:
      NotImplementedError: for a free-text environment that does not
        override it.
    """
    if self.num_actions == 0:
      raise NotImplementedError(f"{self.name} has no random answers")
    picks = rng.integers(self.num_actions, size=(len(states), actions_per_turn))
    return [" || ".join(self.action_names[a] for a in row) for row in picks]

  # ------------------------------------------------------------ metadata
  @property
  def name(self) -> str:
    return type(self).__name__

  @property
  def num_actions(self) -> int:
    """Number of discrete actions (0 for free-text environments)."""
    return len(self.action_names)

  def symbol_id(self, text: str) -> int:
    """The id of symbol ``text``; raises ``KeyError`` naming it if absent."""
    try:
      return self.symbols.index(text)
    except ValueError:
      raise KeyError(
          f"symbol {text!r} is not in {self.name}.symbols={self.symbols!r}"
      ) from None

  def __repr__(self) -> str:
    return f"{self.name}()"


def compiled_render(render_symbols):
  """Decorator: a ``render_symbols`` method that runs as one compiled program.

  ``render_text`` calls ``render_symbols`` outside ``jit``, where a long
  rendering would run op by op; the decorated method is jitted once per
  environment object (and inlined when called under an outer ``jit``).

  Args:
    render_symbols: the method ``(self, state) -> int32 ids``.

  Returns:
    The method, jitted per object.
  """
  attr = "_compiled_" + render_symbols.__name__

  @functools.wraps(render_symbols)
  def method(self, state):
    fn = self.__dict__.get(attr)
    if fn is None:
      fn = self.__dict__[attr] = jax.jit(functools.partial(render_symbols, self))
    return fn(state)

  return method


def check_discrete_action(env: Environment, action: Any) -> None:
  """Host-side validation of a concrete discrete action (skipped when traced).

  Raises:
    ValueError: naming the bad value when ``action`` is concrete and outside
      ``[0, env.num_actions)`` or not an integer.
  """
  if isinstance(action, jax.core.Tracer):
    return
  a = np.asarray(action)
  if not np.issubdtype(a.dtype, np.integer):
    raise ValueError(
        f"{env.name}: action must be an integer index into "
        f"{env.action_names!r}, got {action!r} of dtype {a.dtype}"
    )
  if a.size and (a.min() < 0 or a.max() >= env.num_actions):
    raise ValueError(
        f"{env.name}: action {action!r} is out of range [0, {env.num_actions}) "
        f"for actions {env.action_names!r}"
    )


def actions_sentence(action_names: Sequence[str]) -> str:
  """The answer-format sentence of a discrete game's instructions.

  Args:
    action_names: the game's action names (at least one).

  Returns:
    ``"Your actions are A, B; give one or more, separated by ||, for example
    <answer>A || B</answer>."``

  Raises:
    ValueError: for no action names.
  """
  names = tuple(action_names)
  if not names:
    raise ValueError("actions_sentence: a free-text game has no action names")
  example = " || ".join(names[:2]) if len(names) > 1 else names[0]
  return (f"Your actions are {', '.join(names)}; give one or more, separated by ||, "
          f"for example <answer>{example}</answer>.")


def number_symbols(x: jax.Array, digit0_id: int, *, int_digits: int,
                   frac_digits: int = 0, dot_id: int | None = None,
                   minus_id: int | None = None, pad_id: int = 0) -> jax.Array:
  """Symbol ids of a number written as Python's ``str`` writes it.

  The one number renderer of the environments and the text layer.

  * Integer ``x`` (``frac_digits`` 0): its decimal digits, exact for every
    int32 (``int_digits=10``), e.g. ``"-42"``.
  * Float ``x``: rounded to ``frac_digits`` decimals; trailing decimal zeros
    are dropped but one decimal is always kept (``"0.1"``, ``"1.0"``,
    ``"-2.5"``), i.e. ``str(round(float(x), frac_digits))`` while float32
    holds enough digits (at most seven significant ones).

  Magnitudes of ``10**int_digits`` or more saturate at all nines; without a
  ``minus_id`` negative numbers render as 0. Unused slots hold ``pad_id``, so
  joining the symbols of the non-pad ids gives the text.

  Args:
    x: int or float scalar (traced or concrete).
    digit0_id: symbol id of "0"; "1".."9" follow it consecutively.
    int_digits: static number of integer-digit slots (1-10).
    frac_digits: static number of decimal slots (float ``x`` only).
    dot_id: symbol id of "." (required when ``frac_digits > 0``).
    minus_id: symbol id of "-"; None: no sign slot.
    pad_id: id of the unused slots (0 is the empty symbol).

  Returns:
    int32 ``[(minus_id is not None) + int_digits + (1 + frac_digits if
    frac_digits else 0)]``: sign, integer digits, dot, decimals.

  Raises:
    ValueError: ``int_digits`` outside [1, 10], a negative ``frac_digits``,
      decimals of an integer ``x``, more than 9 digits in all for a float,
      or decimals without a ``dot_id``.
  """
  if not 1 <= int_digits <= 10 or frac_digits < 0:
    raise ValueError(f"number_symbols: int_digits={int_digits!r} must be in [1, 10] and "
                     f"frac_digits={frac_digits!r} >= 0")
  if frac_digits and dot_id is None:
    raise ValueError(f"number_symbols: frac_digits={frac_digits} needs a dot_id")
  x = jnp.asarray(x)
  if jnp.issubdtype(x.dtype, jnp.integer):
    if frac_digits:
      raise ValueError(f"number_symbols: frac_digits={frac_digits} for an integer "
                       f"x of dtype {x.dtype}")
    x = x.astype(jnp.int32)
    neg = x < 0
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    mag = jnp.where(neg, ~bits + jnp.uint32(1), bits)  # |x|, also for -2**31
    if minus_id is None:
      mag = jnp.where(neg, jnp.uint32(0), mag)
    ip, fp = mag, None
  else:
    if int_digits + frac_digits > 9:
      raise ValueError(f"number_symbols: int_digits + frac_digits = "
                       f"{int_digits + frac_digits} > 9 overflows int32 for a float x")
    scale = 10 ** frac_digits
    q = jnp.round(jnp.abs(x.astype(jnp.float32)) * scale)
    q = jnp.minimum(q, 10 ** (int_digits + frac_digits) - 1).astype(jnp.int32)
    neg = (x < 0) & (q > 0)
    if minus_id is None:
      q = jnp.where(x < 0, 0, q)
    ip, fp = (q // scale).astype(jnp.uint32), q % scale
  if int_digits < 10:
    ip = jnp.minimum(ip, jnp.uint32(10 ** int_digits - 1))
  int_pows = jnp.asarray([10 ** (int_digits - 1 - k) for k in range(int_digits)],
                         jnp.uint32)
  int_d = ((ip // int_pows) % jnp.uint32(10)).astype(jnp.int32)
  int_show = (ip >= int_pows) | (jnp.arange(int_digits) == int_digits - 1)
  parts = [jnp.where(int_show, digit0_id + int_d, pad_id)]
  if minus_id is not None:
    parts.insert(0, jnp.where(neg, minus_id, pad_id)[None])
  if frac_digits:
    frac_pows = jnp.asarray([10 ** (frac_digits - 1 - k) for k in range(frac_digits)],
                            jnp.int32)
    frac_d = (fp // frac_pows) % 10
    frac_show = ((fp % (frac_pows * 10)) > 0) | (jnp.arange(frac_digits) == 0)
    parts += [jnp.asarray([dot_id], jnp.int32),
              jnp.where(frac_show, digit0_id + frac_d, pad_id)]
  return jnp.concatenate(parts).astype(jnp.int32)


def grid_render_symbols(grid_symbol_ids: jax.Array, newline_id: int) -> jax.Array:
  """Lays an [H, W] grid of symbol ids out as rows joined by a newline symbol.

  Args:
    grid_symbol_ids: int32 [H, W] symbol ids.
    newline_id: the symbol id whose text is ``"\\n"``.

  Returns:
    int32 [H * (W + 1) - 1]: row 0, newline, row 1, ..., row H-1 (no trailing
    newline), matching ``"\\n".join(rows)``.
  """
  grid = jnp.asarray(grid_symbol_ids, jnp.int32)
  h, _ = grid.shape
  nl = jnp.full((h, 1), newline_id, jnp.int32)
  return jnp.concatenate([grid, nl], axis=1).reshape(-1)[:-1]


def random_steps(env: Environment, key: jax.Array, state: EnvState, params: EnvParams,
                 max_steps: int = 3) -> EnvState:
  """``state`` after a uniform number in ``[0, max_steps]`` of ``env.sample_action`` steps.

  jit- and vmap-able (a ``fori_loop`` of ``max_steps`` steps, each kept or
  not). Raises NotImplementedError for an env that cannot sample actions.
  """
  def step(i, carry):
    s, k = carry
    k, ka, ks = jax.random.split(k, 3)
    nxt = env.step(ks, s, env.sample_action(ka), params)[1]
    take = i < jax.random.randint(k, (), 0, max_steps + 1)
    return tree_select(take, nxt, s), k

  return jax.lax.fori_loop(0, max_steps, step, (state, key))[0]


def tree_select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
  """Elementwise ``jax.lax.select`` over two pytrees of identical structure.

  Args:
    pred: bool scalar (broadcast to every leaf).
    on_true: pytree picked where ``pred`` is True.
    on_false: pytree with the same structure, shapes and dtypes.

  Returns:
    A pytree like ``on_true``. Raises ``ValueError`` (from ``jax.tree.map``)
    when the structures differ.
  """
  return jax.tree.map(
      lambda a, b: jax.lax.select(jnp.broadcast_to(pred, jnp.shape(a)), a, b),
      on_true, on_false)
