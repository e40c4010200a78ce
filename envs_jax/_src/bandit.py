"""RAGEN's two-arm bandit (single turn) in pure JAX.

Ids (registered on import, wrapped in a 1-step :class:`~envs_jax.TimeLimit`,
RAGEN's ``max_actions_per_traj=1``; the pull always terminates first):

* ``Bandit-v0``: train names, low arm ``Phoenix``, high arm ``Dragon``.
* ``BanditTest-v0``: test names, low arm ``Trader``, high arm ``Librarian``.

RAGEN-2's name pools (12 train / 8 test pairs drawn per episode) are not
provided: they would make the arm names, and so ``action_names``, change per
episode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from envs_jax._src import environment
from envs_jax._src import registration
from envs_jax._src import wrappers

LOW_ARM = 0
HIGH_ARM = 1

# RAGEN's bandit prompt (``INIT_PROMPT``), cut at the arm names into distinct
# pieces. The text is pieces[_TEMPLATE[0]], name, pieces[_TEMPLATE[1]], name,
# ..., alternating first-shown / second-shown names three times; it ends "\n".
_PROMPT_PIECES = (
    "You are playing a bandit game. Goal: Maximize your total reward by "
    "choosing which arm to pull. \nGame Rules: \n1. There are 2 arms, named ",
    " and ",
    "\n2. Each arm has its own reward distribution, related to their names. "
    "\n3. Analyze the symbolic meaning of each arm's name to guess how their "
    "reward distribution might behave.\n4. Based on the symbolic meaning of "
    "their names, which arm do you think is more likely to give higher "
    "rewards on average? Choose between ",
    ", and output like <answer> ",
    " </answer> or <answer> ",
    " </answer>.\n",
)
_TEMPLATE = (0, 1, 2, 1, 3, 4, 5)  # piece index before/between/after names
_AFTER_NAME = ": "
_AFTER_REWARD = " points"
_DIGITS = tuple(str(d) for d in range(10))
# Reward text: sign, up to _INT_DIGITS integer digits, ".", up to
# _FRAC_DIGITS decimals (trailing zeros dropped, at least one kept).
_INT_DIGITS = 4
_FRAC_DIGITS = 4


@struct.dataclass
class BanditParams:
  """Payouts of :class:`Bandit` (vmappable; RAGEN ``BanditEnvConfig``).

  Attributes:
    low_reward: the low arm always pays this (RAGEN code 0.1; the paper text
      says 0.15).
    high_reward: the high arm pays this with probability ``high_prob``.
    high_miss_reward: the high arm pays this otherwise.
    high_prob: probability of ``high_reward``.
  """

  low_reward: jax.Array  # shape=(), dtype=float32
  high_reward: jax.Array  # shape=(), dtype=float32
  high_miss_reward: jax.Array  # shape=(), dtype=float32
  high_prob: jax.Array  # shape=(), dtype=float32, in [0, 1]


@struct.dataclass
class BanditState:
  """State of :class:`Bandit`.

  Attributes:
    order: arm ids (0 low, 1 high) in the order the prompt names them.
    high_hit: whether the high arm pays ``high_reward`` in this episode
      (drawn at reset, see :class:`Bandit`).
    pulled: the arm pulled (0 low, 1 high), -1 before the pull.
    reward: the reward of the pull, 0 before it.
  """

  order: jax.Array  # shape=(2,), dtype=int32
  high_hit: jax.Array  # shape=(), dtype=bool
  pulled: jax.Array  # shape=(), dtype=int32
  reward: jax.Array  # shape=(), dtype=float32


class Bandit(environment.Environment[BanditState, BanditParams]):
  """RAGEN's two-arm bandit: guess the better arm from its name, pull once.

  At reset the display order of the two arms is shuffled (50/50 from the
  key). The action is the arm's identity, not its display position:
  ``action_names = (low_name, high_name)``, so action 0 is always the low arm
  and the text layer maps the name the model wrote whatever the order shown.

  Payout: the low arm pays ``params.low_reward`` (0.1). The high arm pays
  ``params.high_reward`` (1.0) with probability ``params.high_prob`` (0.25),
  else ``params.high_miss_reward`` (0.0). The high arm's outcome is drawn at
  reset (``state.high_hit``), as in RAGEN, whose per-seed generator makes it a
  function of the seed: group members that share an initial state get the
  same outcome for the same arm. The step key is unused.

  Observation: int32 [2], ``state.order`` (arm ids in display order).

  Action: int32 scalar, 0 = low arm, 1 = high arm (traced out-of-range values
  are clipped).

  Reward: float32, the payout. Termination: every step (one pull per
  episode); there is no auto-reset, a second step pulls again.

  info: ``success`` (bool, the high arm was pulled, RAGEN's ``success``),
  ``action_effective`` (bool, always True as in RAGEN).

  Text: before the pull, RAGEN's prompt naming the arms in display order
  ("You are playing a bandit game. ..."); after it, ``"<arm>: <reward>
  points"`` with the reward written as Python writes the float ("0.1",
  "1.0", "0.0").

  Raises:
    ValueError: if a name is empty, not a str, or the names are equal
      ignoring case.
  """

  def __init__(self, low_name: str = "Phoenix", high_name: str = "Dragon"):
    """Builds the env.

    Args:
      low_name: the low arm's name (RAGEN train: "Phoenix", test: "Trader").
      high_name: the high arm's name (RAGEN train: "Dragon", test:
        "Librarian").

    Raises:
      ValueError: naming the bad name (empty, equal ignoring case, or equal
        to a fixed piece of the text).
    """
    for what, name in (("low_name", low_name), ("high_name", high_name)):
      if not isinstance(name, str) or not name.strip():
        raise ValueError(f"Bandit: {what} must be a non-empty str, got {name!r}")
    if low_name.lower() == high_name.lower():
      raise ValueError(
          f"Bandit: arm names must differ ignoring case, got {low_name!r} twice")
    fixed = _PROMPT_PIECES + (_AFTER_NAME, _AFTER_REWARD) + _DIGITS + (".", "-")
    for name in (low_name, high_name):
      if name in fixed:
        raise ValueError(f"Bandit: arm name {name!r} collides with a text symbol")
    self.low_name = low_name
    self.high_name = high_name
    self.action_names = (low_name, high_name)
    self.symbols = ((environment.PAD_SYMBOL,) + _PROMPT_PIECES
                    + (low_name, high_name, _AFTER_NAME, _AFTER_REWARD)
                    + _DIGITS + (".", "-"))
    self._piece0 = 1
    self._name0 = 1 + len(_PROMPT_PIECES)
    self._after_name = self._name0 + 2
    self._after_reward = self._name0 + 3
    self._digit0 = self._name0 + 4
    self._dot = self._digit0 + 10
    self._minus = self._dot + 1

  # One turn, one pull; "<answer>Librarian</answer>" + EOS is 10 tiny-tokenizer tokens.
  agent_defaults = environment.AgentDefaults(
      max_turns=1, max_actions_per_traj=1, max_tokens_per_turn=12,
      system="You play a bandit game.")
  expert_think_text = "Its name suggests the higher reward."
  # Short: the state text is RAGEN's own prompt, rules included.
  instructions = "You play a two-armed bandit game and pull one arm."

  def expert_answers(self, states, params, *, actions_per_turn=1, **options):
    """The high arm's name for every state (the expert knows the payouts).

    Raises:
      ValueError: any option (this expert has no settings; :meth:`expert_options`).
    """
    del params, actions_per_turn
    self.expert_options(options)
    return [self.high_name] * len(states)

  @property
  def default_params(self) -> BanditParams:
    return BanditParams(
        low_reward=jnp.asarray(0.1, jnp.float32),
        high_reward=jnp.asarray(1.0, jnp.float32),
        high_miss_reward=jnp.asarray(0.0, jnp.float32),
        high_prob=jnp.asarray(0.25, jnp.float32),
    )

  def reset_env(self, key, params):
    k_order, k_pay = jax.random.split(key)
    swap = jax.random.bernoulli(k_order)
    order = jnp.where(swap, jnp.asarray([HIGH_ARM, LOW_ARM], jnp.int32),
                      jnp.asarray([LOW_ARM, HIGH_ARM], jnp.int32))
    high_hit = jax.random.uniform(k_pay, (), jnp.float32) < params.high_prob
    state = BanditState(order=order, high_hit=high_hit,
                        pulled=jnp.asarray(-1, jnp.int32),
                        reward=jnp.zeros((), jnp.float32))
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    del key  # The payout was drawn at reset (RAGEN's per-seed generator).
    environment.check_discrete_action(self, action)
    a = jnp.clip(jnp.asarray(action, jnp.int32), 0, 1)
    high = jnp.where(state.high_hit, params.high_reward, params.high_miss_reward)
    reward = jnp.where(a == HIGH_ARM, high, params.low_reward).astype(jnp.float32)
    new_state = state.replace(pulled=a, reward=reward)
    info = {
        "success": a == HIGH_ARM,
        "action_effective": jnp.ones((), jnp.bool_),
    }
    return (self.observation(new_state), new_state, reward,
            jnp.ones((), jnp.bool_), jnp.zeros((), jnp.bool_), info)

  def observation(self, state):
    """int32 [2]: arm ids (0 low, 1 high) in display order."""
    return state.order

  def render_symbols(self, state):
    """int32 [13]: the prompt before the pull, ``<arm>: <reward> points`` after."""
    names = self._name0 + state.order  # first-shown, second-shown
    parts = []
    for i, piece in enumerate(_TEMPLATE):
      parts.append(jnp.asarray(self._piece0 + piece, jnp.int32))
      if i < len(_TEMPLATE) - 1:
        parts.append(names[i % 2])
    prompt = jnp.stack(parts).astype(jnp.int32)
    number = environment.number_symbols(
        state.reward, self._digit0, int_digits=_INT_DIGITS, frac_digits=_FRAC_DIGITS,
        dot_id=self._dot, minus_id=self._minus)
    pulled = jnp.concatenate([
        (self._name0 + jnp.maximum(state.pulled, 0))[None].astype(jnp.int32),
        jnp.asarray([self._after_name], jnp.int32),
        number,
        jnp.asarray([self._after_reward], jnp.int32),
    ])
    length = max(prompt.shape[0], pulled.shape[0])
    prompt = jnp.pad(prompt, (0, length - prompt.shape[0]))
    pulled = jnp.pad(pulled, (0, length - pulled.shape[0]))
    return jnp.where(state.pulled >= 0, pulled, prompt)

  def __repr__(self) -> str:
    return f"Bandit(low_name={self.low_name!r}, high_name={self.high_name!r})"


registration.register(
    "Bandit-v0",
    lambda **kw: wrappers.TimeLimit(
        Bandit(**{"low_name": "Phoenix", "high_name": "Dragon", **kw}), 1))
registration.register(
    "BanditTest-v0",
    lambda **kw: wrappers.TimeLimit(
        Bandit(**{"low_name": "Trader", "high_name": "Librarian", **kw}), 1))
