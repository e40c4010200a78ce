"""Scripted experts for the shipped games, and demonstrations for SFT warm starts.

RAGEN warm-starts with supervised fine-tuning on replies written by a
breadth-first-search solver (its SFT baseline: Sokoban 74.6%, FrozenLake 23%;
REFERENCE.md section 3). Here an expert is an :class:`Expert` (reply text per
row) played through the host loop (:func:`expert_rollout`), so a
demonstration is a :class:`Trajectory` exactly like an RL rollout's: the
expert's reply tokens are the trained tokens, and SFT and RL share one data
format (``Trajectory.to_batch()``, :func:`jagent.train.sft_step`).

The experts read the JAX state of :class:`JaxEnvAsHost` rows and replan from
it every turn:

* Sokoban / Boxoban: the first ``actions_per_turn`` moves of a fewest-moves
  solution (batched BFS, :func:`envs_jax.solve_sokoban_batch`); a level with
  no solution (a box stuck) or one the search gave up on gets the first
  action name (valid, arbitrary).
* FrozenLake (slippery or not): the first moves of a shortest hole-free path
  from the current position (:func:`envs_jax.solve_frozen_lake`, which
  ignores slipping; replanning every turn recovers from slips). RAGEN's BFS
  demonstrations do the same. Optionally (``frozen_lake_policy=
  "max_success"``) the moves that maximise the probability of reaching the
  goal on slippery ice (value iteration).
* Bandit: the high arm's name.
* Countdown: an expression from :func:`envs_jax.solve_countdown` (``+ -``
  first, then ``+ - * /``).

``make_expert(..., policy="random")`` instead replies uniformly random
actions (Countdown: the numbers shuffled and joined by random ``+``/``-``):
demonstrations of the reply FORMAT only, for a warm start that leaves the
game itself to RL (a randomly initialised tiny model never writes a parsable
answer, so RL alone gets no reward signal).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import numpy as np

from envs_jax._src import bandit as _bandit
from envs_jax._src import countdown as _countdown
from envs_jax._src import countdown_reference as _countdown_reference
from envs_jax._src import frozen_lake as _frozen_lake
from envs_jax._src import frozen_lake_solver as _frozen_lake_solver
from envs_jax._src import sokoban as _sokoban
from envs_jax._src import sokoban_solver as _sokoban_solver
from jagent.rollout import _host
from jagent.rollout import _rollout
from jagent.rollout import _text
from jagent.rollout import _trajectory as tj

# Default think text per game (the reasoning part of think-mode replies).
THINK_TEXTS = {
    "Sokoban": "I follow a shortest solution.",
    "FrozenLake": "I take a shortest safe path to the goal.",
    "Bandit": "Its name suggests the higher reward.",
    "Countdown": "I combine the numbers to reach the target.",
}


# make_expert's policies: the scripted experts, or uniformly random answers.
EXPERT_POLICIES = ("solver", "random")


def _base(env):
  return env.unwrapped if hasattr(env, "unwrapped") else env


def _inner_state(row: Any):
  """The unwrapped JAX state of a :class:`JaxEnvAsHost` row (numpy leaves)."""
  state = getattr(row, "state", None)
  if state is None:
    raise ValueError(f"expert needs JaxEnvAsHost rows after reset (a .state), got {row!r}")
  while hasattr(state, "env_state"):  # TimeLimitState and similar wrapper states
    state = state.env_state
  return jax.device_get(state)


@dataclasses.dataclass(frozen=True)
class _GameExpert:
  """Shared reply formatting: ``<answer>..</answer>``, after ``think..</think>``."""

  think: bool
  think_text: str
  actions_per_turn: int = 1

  def reply(self, answer: str) -> str:
    body = f"<answer>{answer}</answer>"
    return f"{self.think_text}</think>{body}" if self.think else body

  def __call__(self, rows: Sequence[int], envs: Sequence[Any],
               states: Sequence[str]) -> list[str]:
    del rows, states
    return [self.reply(a) for a in self.answers([_inner_state(e) for e in envs], envs)]

  def answers(self, states: list, hosts: Sequence[Any] = ()) -> list[str]:
    """Answer texts (inside ``<answer>``) for the unwrapped JAX states of ``hosts``."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _SokobanExpert(_GameExpert):
  action_names: tuple[str, ...] = _sokoban.ACTION_NAMES
  max_nodes: int = 1_000_000

  def answers(self, states, hosts=()):
    out = [self.action_names[0]] * len(states)
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(states):
      groups.setdefault((np.shape(s.fixed), int(np.sum(s.boxes))), []).append(i)
    for idx in groups.values():
      sols = _sokoban_solver.solve_sokoban_batch(
          np.stack([states[i].fixed for i in idx]), np.stack([states[i].boxes for i in idx]),
          np.stack([states[i].player for i in idx]), max_nodes=self.max_nodes)
      for i, sol in zip(idx, sols):
        if sol.solved and sol.actions:
          out[i] = " || ".join(self.action_names[a]
                               for a in sol.actions[:self.actions_per_turn])
    return out


@dataclasses.dataclass(frozen=True)
class _RandomExpert(_GameExpert):
  """Uniformly random answers in the game's format (see the module docstring)."""

  action_names: tuple[str, ...] = ()  # empty: Countdown expressions
  rng: np.random.Generator = dataclasses.field(default_factory=np.random.default_rng)

  def answers(self, states, hosts=()):
    if self.action_names:
      picks = self.rng.integers(len(self.action_names), size=(len(states), self.actions_per_turn))
      return [" || ".join(self.action_names[a] for a in row) for row in picks]
    out = []
    for s in states:
      nums = [int(x) for x in self.rng.permutation(np.asarray(s.numbers)[:int(s.count)])]
      ops = self.rng.choice(["+", "-"], size=len(nums) - 1)
      out.append(" ".join([str(nums[0])] + [f"{o} {n}" for o, n in zip(ops, nums[1:])]))
    return out


@functools.lru_cache(maxsize=4096)
def _frozen_lake_model(tiles_bytes: bytes, n: int, success_rate: float, gamma: float):
  """(P [S, 4, S] transition probabilities, Q [S, 4] discounted reach values)."""
  tiles = np.frombuffer(tiles_bytes, np.int8).reshape(n, n)
  cells = n * n
  p = np.zeros((cells, 4, cells))
  slip = (1.0 - success_rate) / 2
  for r in range(n):
    for c in range(n):
      s = r * n + c
      for a in range(4):
        if tiles[r, c] != _frozen_lake.FROZEN:  # absorbing
          p[s, a, s] = 1.0
          continue
        for move, prob in ((a, success_rate), ((a + 3) % 4, slip), ((a + 1) % 4, slip)):
          dr, dc = _frozen_lake._DELTAS[move]  # pylint: disable=protected-access
          rr, cc = min(max(r + dr, 0), n - 1), min(max(c + dc, 0), n - 1)
          p[s, a, rr * n + cc] += prob
  goal = (tiles.reshape(-1) == _frozen_lake.GOAL).astype(np.float64)
  stop = tiles.reshape(-1) != _frozen_lake.FROZEN
  v = goal
  for _ in range(1000):  # value iteration; gamma < 1 contracts
    v_new = np.where(stop, goal, gamma * (p @ v).max(axis=1))
    if np.max(np.abs(v_new - v)) < 1e-12:
      break
    v = v_new
  return p, p @ v


@dataclasses.dataclass(frozen=True)
class _FrozenLakeExpert(_GameExpert):
  action_names: tuple[str, ...] = _frozen_lake.FrozenLake.action_names
  policy: str = "shortest"
  gamma: float = 0.9

  def answers(self, states, hosts=()):
    out = []
    for i, s in enumerate(states):
      tiles, player = np.asarray(s.tiles, np.int8), np.asarray(s.player)
      if self.policy == "shortest":
        path = _frozen_lake_solver.solve_frozen_lake(tiles, player)
        path = path[:self.actions_per_turn] if path else (0,)
      else:
        n = tiles.shape[0]
        rate = float(np.asarray(hosts[i].env_params.success_rate))
        p, q = _frozen_lake_model(tiles.tobytes(), n, rate, self.gamma)
        belief = np.zeros(n * n)
        belief[player[0] * n + player[1]] = 1.0
        path = []
        for _ in range(self.actions_per_turn):  # open loop: best action for the belief
          a = int(np.argmax(belief @ q))
          path.append(a)
          belief = belief @ p[:, a]
      out.append(" || ".join(self.action_names[a] for a in path))
    return out


@dataclasses.dataclass(frozen=True)
class _BanditExpert(_GameExpert):
  high_name: str = ""

  def answers(self, states, hosts=()):
    return [self.high_name] * len(states)


@dataclasses.dataclass(frozen=True)
class _CountdownExpert(_GameExpert):

  def answers(self, states, hosts=()):
    out = []
    for s in states:
      nums = [int(x) for x in np.asarray(s.numbers)[:int(s.count)]]
      target = int(s.target)
      expr = (_countdown_reference.solve(nums, target, plus_minus_only=True)
              or _countdown_reference.solve(nums, target)
              or " + ".join(str(n) for n in nums))  # right numbers, wrong value
      out.append(expr)
    return out


def make_expert(env, *, think: bool, actions_per_turn: int = 1,
                think_text: str | None = None, max_nodes: int = 1_000_000,
                frozen_lake_policy: str = "shortest", gamma: float = 0.9,
                policy: str = "solver", seed: int = 0) -> _host.Expert:
  """The scripted :class:`Expert` of a shipped game (see the module docstring).

  Args:
    env: an ``envs_jax`` environment (wrappers are looked through): Sokoban
      (any size, Boxoban included), FrozenLake, Bandit or Countdown. Rows
      must be :class:`JaxEnvAsHost` of it (the expert reads their state).
    think: write ``think_text</think><answer>..</answer>`` (the prompt's
      ``PromptConfig.think``); False: ``<answer>..</answer>``.
    actions_per_turn: moves per reply in Sokoban and FrozenLake (at most the
      prompt's ``max_actions_per_turn``, or the parser drops the rest).
    think_text: the reasoning text (default :data:`THINK_TEXTS` per game).
    max_nodes: Sokoban's per-level BFS node cap (a capped search replies
      with the first action name).
    frozen_lake_policy: ``"shortest"`` (RAGEN's BFS demonstrations: a
      shortest hole-free path, slips ignored) or ``"max_success"``: the
      action maximising the discounted probability of reaching the goal
      under the row's ``success_rate`` (value iteration on the map; later
      actions of a reply maximise it for the belief over positions after
      the earlier ones). A shortest path on deterministic ice; on slippery
      4x4 ice with 5 turns x 2 actions it succeeds about 48% of episodes
      where "shortest" succeeds 36% (and random actions 21%).
    gamma: the discount of ``"max_success"`` (in (0, 1); smaller prefers
      shorter routes).
    policy: ``"solver"`` (the scripted experts above) or ``"random"``:
      uniformly random actions (``actions_per_turn`` per reply; Countdown:
      the numbers shuffled, joined by random ``+``/``-``), i.e.
      demonstrations of the reply format only.
    seed: seed of the ``"random"`` policy's numpy generator.

  Returns:
    An :class:`Expert`: ``expert(rows, envs, states) -> list[str]``.

  Raises:
    ValueError: an environment without an expert here, a non-bool ``think``,
      ``actions_per_turn`` or ``max_nodes`` not an int >= 1, a think text
      containing ``</think>``, an unknown ``frozen_lake_policy`` or ``gamma``
      outside (0, 1), an unknown ``policy``.
  """
  if policy not in EXPERT_POLICIES:
    raise ValueError(f"make_expert: policy={policy!r}; use one of {EXPERT_POLICIES}")
  if not isinstance(think, bool):
    raise ValueError(f"make_expert: think must be a bool, got {think!r}")
  for name, v in (("actions_per_turn", actions_per_turn), ("max_nodes", max_nodes)):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ValueError(f"make_expert: {name} must be an int >= 1, got {v!r}")
  if frozen_lake_policy not in ("shortest", "max_success"):
    raise ValueError(f"make_expert: frozen_lake_policy={frozen_lake_policy!r}; use "
                     "'shortest' or 'max_success'")
  if not 0.0 < gamma < 1.0:
    raise ValueError(f"make_expert: gamma={gamma!r} must be in (0, 1)")
  base = _base(env)
  kind = next((k for k, cls in (("Sokoban", _sokoban.Sokoban),
                                ("FrozenLake", _frozen_lake.FrozenLake),
                                ("Bandit", _bandit.Bandit),
                                ("Countdown", _countdown.Countdown))
               if isinstance(base, cls)), None)
  if kind is None:
    raise ValueError(f"make_expert: no expert for environment {base!r}; write an "
                     "Expert (rows, envs, states -> reply texts) for it")
  text = THINK_TEXTS[kind] if think_text is None else think_text
  if "</think>" in text:
    raise ValueError(f"make_expert: think_text {text!r} contains </think>")
  common = dict(think=think, think_text=text, actions_per_turn=actions_per_turn)
  if policy == "random":
    return _RandomExpert(action_names=() if kind == "Countdown" else tuple(base.action_names),
                         rng=np.random.default_rng(seed), **common)
  if kind == "Sokoban":
    return _SokobanExpert(action_names=tuple(base.action_names), max_nodes=max_nodes,
                          **common)
  if kind == "FrozenLake":
    return _FrozenLakeExpert(action_names=tuple(base.action_names),
                             policy=frozen_lake_policy, gamma=float(gamma), **common)
  if kind == "Bandit":
    return _BanditExpert(high_name=base.action_names[_bandit.HIGH_ARM], **common)
  return _CountdownExpert(**common)


def demonstrations(
    text_env: _text.TextEnv,
    *,
    key: jax.Array,
    config: _rollout.RolloutConfig,
    num_groups: int | None = None,
    actions_per_turn: int = 1,
    reset_keys: jax.Array | None = None,
    expert: _host.Expert | None = None,
) -> tj.Trajectory:
  """Expert demonstrations of ``text_env``'s game as a :class:`Trajectory`.

  Plays ``B = num_groups x config.group_size`` episodes (group size 1 is the
  usual SFT case) with :func:`make_expert` (or ``expert``) through
  :func:`expert_rollout` on :class:`JaxEnvAsHost` rows: the same prompts,
  parsing, rewards and budgets as an RL rollout with the same config, and
  the same initial states as :func:`make_rollout` for the same ``key`` /
  ``reset_keys``. ``to_batch()`` feeds :func:`jagent.train.sft_step`
  (token-mean NLL of the expert's reply tokens, EOS included). RAGEN's SFT
  baseline trains on BFS demonstrations rendered as assistant replies.

  Args:
    text_env: the game, tokenizer and prompt (:class:`TextEnv`); its
      ``env_params`` are used and ``prompt.think`` sets the reply format.
    key: PRNG key of the episodes (initial states unless ``reset_keys``).
    config: :class:`RolloutConfig`: turn, action and reply-length limits,
      group size and context size (sampling fields unused).
    num_groups: overrides ``config.num_groups``.
    actions_per_turn: moves per reply (Sokoban, FrozenLake).
    reset_keys: optional [num_groups] keys of the initial states.
    expert: a custom :class:`Expert` instead of :func:`make_expert`'s.

  Returns:
    A :class:`Trajectory` (``logprobs`` 0; ``anchor_hashes`` as the device
    rollout's).

  Raises:
    ValueError: ``actions_per_turn`` above the prompt's
      ``max_actions_per_turn``; a bad ``num_groups``; the errors of
      :func:`make_expert` and :func:`expert_rollout` (e.g. a reply longer
      than ``config.max_tokens_per_turn``).
  """
  if num_groups is not None:
    config = dataclasses.replace(config, num_groups=num_groups)
  max_k = text_env.prompt.max_actions_per_turn
  if isinstance(actions_per_turn, bool) or not isinstance(actions_per_turn, int) or not (
      1 <= actions_per_turn <= max_k):
    raise ValueError(f"demonstrations: actions_per_turn={actions_per_turn!r} must be an "
                     f"int in [1, PromptConfig.max_actions_per_turn={max_k}]")
  env = text_env.env
  if expert is None:
    expert = make_expert(env, think=text_env.prompt.think, actions_per_turn=actions_per_turn)
  conv = text_env.conversation
  hosts = [_host.JaxEnvAsHost(env, text_env.env_params, instructions=conv.instructions)
           for _ in range(config.batch_size)]
  return _host.expert_rollout(
      expert, key, hosts, conv, config=config,
      context_size=_rollout.context_size(text_env, config), reset_keys=reset_keys,
      anchor_symbols=lambda b: hosts[b].render_ids)
