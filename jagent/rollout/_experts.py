"""The scripted expert of any game, and demonstrations for SFT warm starts.

RAGEN warm-starts with supervised fine-tuning on replies written by a
breadth-first-search solver (its SFT baseline: Sokoban 74.6%, FrozenLake 23%;
arXiv 2504.20073). Here an expert is an :class:`Expert` (reply text per
row) played through the host loop (:func:`expert_rollout`), so a
demonstration is a :class:`Trajectory` exactly like an RL rollout's: the
expert's reply tokens are the trained tokens, and SFT and RL share one data
format (:func:`jagent.train.trajectory_batch`, :func:`jagent.train.sft_step`).

The expert reads the JAX state of :class:`JaxEnvAsHost` rows every turn and
asks the game for its answers: the solver is the environment's own
:meth:`envs_jax.Environment.expert_answers` (Sokoban: batched BFS; FrozenLake:
a shortest hole-free path, or the most likely safe route; Bandit: the high
arm; Countdown: a solved expression), so this module knows no game.

``make_expert(..., policy="random")`` instead replies the game's
:meth:`~envs_jax.Environment.random_answers` (uniformly random actions;
Countdown: the numbers shuffled and joined by random ``+``/``-``):
demonstrations of the reply FORMAT only, for a warm start that leaves the
game itself to RL (a randomly initialised tiny model never writes a parsable
answer, so RL alone gets no reward signal).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from envs_jax._src import environment as _environment
from jagent._src import checks
from jagent.rollout import _host
from jagent.rollout import _rollout
from jagent.rollout import _text
from jagent.rollout import _trajectory as tj

# make_expert's policies: the game's scripted expert, or uniformly random answers.
EXPERT_POLICIES = ("solver", "random")


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
  """Replies ``<answer>..</answer>`` (after ``think..</think>``) with the game's answers.

  Attributes:
    env: the environment whose answer hooks are called.
    think, think_text, actions_per_turn: see :func:`make_expert`.
    options: the game's expert settings passed to ``env.expert_answers``
      (checked by ``env.expert_options``).
    rng: None: the game's solver; a generator: its random answers.
  """

  env: Any
  think: bool
  think_text: str
  actions_per_turn: int = 1
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  rng: np.random.Generator | None = None

  def reply(self, answer: str) -> str:
    body = f"<answer>{answer}</answer>"
    return f"{self.think_text}</think>{body}" if self.think else body

  def __call__(self, rows: Sequence[int], envs: Sequence[Any],
               states: Sequence[str]) -> list[str]:
    del rows, states
    return [self.reply(a) for a in self.answers([_inner_state(e) for e in envs], envs)]

  def answers(self, states: list, hosts: Sequence[Any] = ()) -> list[str]:
    """Answer texts (inside ``<answer>``) for the unwrapped JAX states of ``hosts``.

    A host without params (or none given) passes None to the game's expert.
    """
    if self.rng is not None:
      return self.env.random_answers(states, self.rng, actions_per_turn=self.actions_per_turn)
    params = [getattr(h, "env_params", None) for h in hosts] or [None] * len(states)
    return self.env.expert_answers(states, params, actions_per_turn=self.actions_per_turn,
                                   **self.options)


def make_expert(env, *, think: bool, actions_per_turn: int = 1,
                think_text: str | None = None, policy: str = "solver", seed: int = 0,
                **options: Any) -> _host.Expert:
  """The scripted :class:`Expert` of a game (see the module docstring).

  Args:
    env: an ``envs_jax`` environment (wrappers forward the hooks) that
      implements :meth:`~envs_jax.Environment.expert_answers` (for
      ``policy="solver"``). Rows must be :class:`JaxEnvAsHost` of it (the
      expert reads their state).
    think: write ``think_text</think><answer>..</answer>`` (the prompt's
      ``PromptConfig.think``); False: ``<answer>..</answer>``.
    actions_per_turn: moves per reply in multi-action games (at most the
      prompt's ``max_actions_per_turn``, or the parser drops the rest).
    think_text: the reasoning text (default the env's ``expert_think_text``).
    policy: ``"solver"`` (the game's expert) or ``"random"``: the game's
      uniformly random answers (``actions_per_turn`` actions per reply;
      Countdown: the numbers shuffled, joined by random ``+``/``-``), i.e.
      demonstrations of the reply format only.
    seed: seed of the ``"random"`` policy's numpy generator.
    **options: the game's own expert settings, passed to its
      ``expert_answers`` every turn: the names and defaults of
      ``env.expert_defaults`` (e.g. Sokoban's search cap ``max_nodes``),
      checked here by ``env.expert_options``.

  Returns:
    An :class:`Expert`: ``expert(rows, envs, states) -> list[str]``.

  Raises:
    ValueError: an environment without an expert (not an ``envs_jax``
      environment, or one that does not implement ``expert_answers`` for the
      solver policy), a non-bool ``think``, ``actions_per_turn`` not an
      int >= 1, a think text containing ``</think>``, an unknown ``policy``,
      or (from the game, naming it) an option its expert does not take or a
      bad value of one.
  """
  if policy not in EXPERT_POLICIES:
    raise ValueError(f"make_expert: policy={policy!r}; use one of {EXPERT_POLICIES}")
  if not isinstance(think, bool):
    raise ValueError(f"make_expert: think must be a bool, got {think!r}")
  checks.check_int("make_expert: actions_per_turn", actions_per_turn, 1)
  base = env.unwrapped if hasattr(env, "unwrapped") else env
  if not isinstance(base, _environment.Environment) or (
      policy == "solver"
      and type(base).expert_answers is _environment.Environment.expert_answers):
    raise ValueError(f"make_expert: no expert for environment {base!r}; implement "
                     "Environment.expert_answers, or write an Expert (rows, envs, "
                     "states -> reply texts) for it")
  options = base.expert_options(options)
  text = env.expert_think_text if think_text is None else think_text
  if "</think>" in text:
    raise ValueError(f"make_expert: think_text {text!r} contains </think>")
  return _GameExpert(
      env=env, think=think, think_text=text, actions_per_turn=actions_per_turn,
      options=options, rng=np.random.default_rng(seed) if policy == "random" else None)


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
  ``reset_keys``. :func:`jagent.train.trajectory_batch` of it feeds :func:`jagent.train.sft_step`
  (token-mean NLL of the expert's reply tokens, EOS included). RAGEN's SFT
  baseline trains on BFS demonstrations rendered as assistant replies.

  Args:
    text_env: the game, tokenizer and prompt (:class:`TextEnv`); its
      ``env_params`` are used and ``prompt.think`` sets the reply format.
    key: PRNG key of the episodes (initial states unless ``reset_keys``).
    config: :class:`RolloutConfig`: turn, action and reply-length limits,
      group size and context size (sampling fields unused).
    num_groups: overrides ``config.num_groups``.
    actions_per_turn: moves per reply (multi-action games).
    reset_keys: optional [num_groups] keys of the initial states.
    expert: a custom :class:`Expert` instead of :func:`make_expert`'s.

  Returns:
    A :class:`Trajectory` (``logprobs`` 0; ``anchor_hashes`` as the device
    rollout's).

  Raises:
    ValueError: ``actions_per_turn`` above the prompt's
      ``max_actions_per_turn``; a bad ``num_groups``; a context too short
      for ``config.history_turns`` (as :func:`make_rollout`); the errors of
      :func:`make_expert` and :func:`expert_rollout` (e.g. a reply longer
      than ``config.max_tokens_per_turn``).
  """
  if num_groups is not None:
    config = dataclasses.replace(config, num_groups=num_groups)
  max_k = text_env.prompt.max_actions_per_turn
  checks.check_int("demonstrations: actions_per_turn", actions_per_turn, 1, max_k,
                   why=f"must be an int in [1, PromptConfig.max_actions_per_turn={max_k}]")
  if config.history_turns >= 0:  # a window that cannot fit fails here, as in make_rollout
    _rollout.check_context_size(text_env, config)
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
