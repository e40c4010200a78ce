"""Composable environment wrappers: time limit (truncation) and auto-reset.

A wrapper's state contains the inner state and never mutates it; static
metadata (symbols, action names, legend, ...) and the agent hooks
(instructions, agent defaults, expert answers) are delegated to the inner env.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from envs_jax._src import checks
from envs_jax._src import environment


class Wrapper(environment.Environment):
  """Base wrapper: forwards everything to ``self.env`` unless overridden."""

  def __init__(self, env: environment.Environment):
    self.env = env

  def __getattr__(self, name: str) -> Any:
    # Only called when normal lookup fails: delegate static metadata.
    if name == "env":
      raise AttributeError(name)
    return getattr(self.env, name)

  @property
  def symbols(self) -> tuple[str, ...]:  # type: ignore[override]
    return self.env.symbols

  @property
  def action_names(self) -> tuple[str, ...]:  # type: ignore[override]
    return self.env.action_names

  @property
  def default_params(self):
    return self.env.default_params

  # The base class defines these, so __getattr__ would not reach the inner env.
  @property
  def instructions(self) -> str | None:  # type: ignore[override]
    return self.env.instructions

  @property
  def agent_defaults(self) -> environment.AgentDefaults | None:  # type: ignore[override]
    return self.env.agent_defaults

  @property
  def expert_think_text(self) -> str:  # type: ignore[override]
    return self.env.expert_think_text

  @property
  def expert_defaults(self):  # type: ignore[override]
    return self.env.expert_defaults

  def expert_options(self, options):
    return self.env.expert_options(options)

  def expert_answers(self, states, params, **kwargs):
    return self.env.expert_answers(states, params, **kwargs)

  def random_answers(self, states, rng, **kwargs):
    return self.env.random_answers(states, rng, **kwargs)

  @property
  def name(self) -> str:
    return self.env.name

  @property
  def unwrapped(self) -> environment.Environment:
    env = self.env
    while isinstance(env, Wrapper):
      env = env.env
    return env

  def reset_env(self, key, params):
    return self.env.reset_env(key, params)

  def step_env(self, key, state, action, params):
    return self.env.step_env(key, state, action, params)

  def observation(self, state):
    return self.env.observation(state)

  def render_symbols(self, state):
    return self.env.render_symbols(state)

  def sample_action(self, key):
    return self.env.sample_action(key)

  def __repr__(self) -> str:
    return f"{type(self).__name__}({self.env!r})"


@struct.dataclass
class TimeLimitState:
  """State of :class:`TimeLimit`.

  Attributes:
    env_state: the inner environment's state.
    steps: int32 scalar, steps taken in the current episode.
  """

  env_state: Any
  steps: jax.Array  # shape=(), dtype=int32


class TimeLimit(Wrapper):
  """Ends episodes after ``max_steps`` steps by truncation, not termination.

  ``truncated`` becomes True on the step that reaches ``max_steps`` unless the
  inner env terminated on that same step (termination wins, as in
  gymnasium's ``TimeLimit``). This is the action budget of an agent episode
  (RAGEN's ``max_actions_per_traj``) as well as the env's own step limit.

  Raises:
    ValueError: if ``max_steps`` is not a positive int.
  """

  def __init__(self, env: environment.Environment, max_steps: int):
    super().__init__(env)
    self.max_steps = checks.check_int("TimeLimit", "max_steps", max_steps, 1)

  def reset_env(self, key, params):
    obs, state = self.env.reset_env(key, params)
    return obs, TimeLimitState(env_state=state, steps=jnp.zeros((), jnp.int32))

  def step_env(self, key, state: TimeLimitState, action, params):
    obs, env_state, reward, terminated, truncated, info = self.env.step_env(
        key, state.env_state, action, params
    )
    steps = state.steps + 1
    truncated = jnp.logical_or(truncated, steps >= self.max_steps)
    truncated = jnp.logical_and(truncated, jnp.logical_not(terminated))
    return (obs, TimeLimitState(env_state=env_state, steps=steps), reward,
            terminated, truncated, info)

  def observation(self, state: TimeLimitState):
    return self.env.observation(state.env_state)

  def render_symbols(self, state: TimeLimitState):
    return self.env.render_symbols(state.env_state)


class AutoReset(Wrapper):
  """Resets the inner env in the same step that ends an episode.

  When the inner step returns ``terminated | truncated``, the returned
  observation and state are those of a fresh episode (reset from a key split
  off the step key), while ``reward``, ``terminated`` and ``truncated`` still
  describe the finished step. ``info["final_observation"]`` always holds the
  observation reached by the step before any reset (gymnax 1.0 convention),
  so the structure of ``info`` does not depend on the inputs.
  """

  def step_env(self, key, state, action, params):
    key_step, key_reset = jax.random.split(key)
    obs_st, state_st, reward, terminated, truncated, info = self.env.step_env(
        key_step, state, action, params
    )
    obs_re, state_re = self.env.reset_env(key_reset, params)
    done = jnp.logical_or(terminated, truncated)
    state = environment.tree_select(done, state_re, state_st)
    obs = environment.tree_select(done, obs_re, obs_st)
    info = dict(info)
    info["final_observation"] = obs_st
    return obs, state, reward, terminated, truncated, info

