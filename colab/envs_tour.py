# %% [markdown]
# # envs_jax tour: jit-compiled, batched text-agent environments
#
# Make, reset, step, render and vmap the RAGEN environments (Sokoban, FrozenLake, Bandit,
# Countdown) and RAGEN-2's (CoordSokoban, CoordFrozenLake, Sudoku, 2048, the 2x2 Rubik's
# cube) in pure JAX; the last cell visits every registered id. Open
# `colab/envs_tour.ipynb` in Colab or Jupyter from your clone. `colab/envs_tour.py` is its
# `# %%` twin: the test suite runs the twin and checks that the notebook's cells are the
# same, so neither can rot.

# %%
# On Colab (jagent is not on PyPI), install it from your copy first: a wheel built in
# your clone (`pip wheel --no-deps -w dist .` there; upload the .whl), e.g.
#   !pip install -q /content/jagent-0.1.0.dev0-py3-none-any.whl
# or the clone itself, uploaded or on a mounted Drive: !pip install -q -e /content/jagent
import jax
import jax.numpy as jnp

import envs_jax

print(envs_jax.registered())

# %% [markdown]
# ## Make, reset, render
# `make` returns the static env object and its default params (a pytree).

# %%
env, params = envs_jax.make("Sokoban-6x6-1box-v0")
obs, state = env.reset(jax.random.key(0), params)
print(env.legend)
print(env.render_text(state))
print("actions:", env.action_names)

# %% [markdown]
# ## Step: solve the level with the host BFS solver
# `solve_sokoban` returns the optimal action sequence; every step is a pure function.

# %%
level = state.env_state  # the registered env is wrapped in TimeLimit
plan = envs_jax.solve_sokoban(level.fixed, level.boxes, level.player)
print("optimal plan:", [env.action_names[a] for a in plan.actions])
step = jax.jit(env.step)
total = 0.0
for a in plan.actions:
  obs, state, reward, terminated, truncated, info = step(jax.random.key(1), state, a, params)
  total += float(reward)
print(env.render_text(state))
print(f"return {total:.1f}, terminated={bool(terminated)}, success={bool(info['success'])}")
assert bool(terminated) and bool(info["success"])

# %% [markdown]
# ## vmap: 1024 levels and 50 random steps as one XLA program

# %%
keys = jax.random.split(jax.random.key(2), 1024)
obs, states = jax.vmap(env.reset, in_axes=(0, None))(keys, params)


@jax.jit
def random_rollout(states, key):
  """50 random steps; rewards after an episode ends are masked out."""
  def body(carry, key):
    states, alive = carry
    k_act, k_step = jax.random.split(key)
    actions = jax.random.randint(k_act, (1024,), 0, env.num_actions)
    _, states, reward, terminated, truncated, info = jax.vmap(
        env.step, in_axes=(0, 0, 0, None))(jax.random.split(k_step, 1024), states,
                                           actions, params)
    solved = alive & info["success"]
    return (states, alive & ~(terminated | truncated)), (reward * alive, solved)
  alive = jnp.ones((1024,), bool)
  return jax.lax.scan(body, (states, alive), jax.random.split(key, 50))


(states, _), (rewards, solved) = random_rollout(states, jax.random.key(3))
print("random policy: mean return", float(rewards.sum(0).mean()),
      "success rate", float(solved.any(0).mean()))


# %% [markdown]
# ## Device-side rendering for the text layer
# `render_symbols` gives fixed-length symbol ids; their join is exactly `render_text`.

# %%
ids = jax.jit(jax.vmap(env.render_symbols))(states)
one = jax.tree.map(lambda x: x[0], states)
assert "".join(env.symbols[i] for i in ids[0]) == env.render_text(one)
print(ids.shape, ids.dtype)

# %% [markdown]
# ## Other environments: FrozenLake, Bandit, Countdown

# %%
lake, lake_params = envs_jax.make("FrozenLake-4x4-v0")
_, lake_state = lake.reset(jax.random.key(4), lake_params)
print(lake.render_text(lake_state))

bandit, bandit_params = envs_jax.make("Bandit-v0")
_, bandit_state = bandit.reset(jax.random.key(5), bandit_params)
_, bandit_state, r, *_ = bandit.step(jax.random.key(6), bandit_state,
                                     bandit.action_names.index("Dragon"), bandit_params)
print(bandit.render_text(bandit_state)[-40:])

countdown, cd_params = envs_jax.make("Countdown-v0")
_, cd_state = countdown.reset(jax.random.key(7), cd_params)
print(countdown.render_text(cd_state))
answer = envs_jax.solve_countdown(
    [int(n) for n in cd_state.numbers[: int(cd_state.count)]], int(cd_state.target))
print("solver:", answer)
_, _, reward, *_ = countdown.step(
    jax.random.key(8), cd_state, envs_jax.encode_countdown_answer(answer, countdown.max_answer_bytes), cd_params)
print("reward:", float(reward))
assert float(reward) == 1.0


# %% [markdown]
# ## RAGEN-2's games: each played by its scripted expert
# CoordSokoban and CoordFrozenLake are Sokoban and FrozenLake with the pieces'
# coordinates above the grid; Sudoku's action is answer text (bytes), the others'
# an action id. `expert_answers` (the SFT demonstrations' source) reads unwrapped
# host states and returns answer texts.

# %%
def unwrap(state):
  """The game's own state inside wrapper states (TimeLimit), on the host."""
  while hasattr(state, "env_state"):
    state = state.env_state
  return jax.device_get(state)


def to_action(env, answer):
  """An answer text as ``env``'s action: an action id, or a text game's byte buffer."""
  if env.num_actions:
    return env.action_names.index(answer)
  raw = jnp.frombuffer(answer.encode(), jnp.uint8)
  return jnp.zeros((env.max_answer_bytes,), jnp.uint8).at[: raw.size].set(raw)


def play_expert(name, max_steps, seed=0):
  """Plays ``name`` with its expert until the episode ends or ``max_steps``; prints it."""
  env, params = envs_jax.make(name)
  _, state = env.reset(jax.random.key(seed), params)
  step = jax.jit(env.step)
  total = 0.0
  for t in range(max_steps):
    answer = env.expert_answers([unwrap(state)], [params])[0]
    _, state, reward, terminated, truncated, info = step(
        jax.random.key(t), state, to_action(env, answer), params)
    total += float(reward)
    if terminated or truncated:
      break
  print(env.render_text(state))
  print(f"{name}: {t + 1} expert steps, return {total:.2f}, "
        f"success={bool(info['success'])}\n")
  return info


for name, max_steps in (("CoordSokoban-6x6-1box-v0", 30), ("CoordFrozenLake-4x4-v0", 30),
                        ("Sudoku-4x4-v0", 16), ("RubiksCube-2x2-v0", 20)):
  info = play_expert(name, max_steps)
  if name != "CoordFrozenLake-4x4-v0":  # slippery: the intended move succeeds 1/3 of the time
    assert bool(info["success"]), name
play_expert("Game2048-4x4-v0", 60)  # no solver: a greedy expert, 60 moves

# %% [markdown]
# ## Every registered id: make, a vmapped reset and one random step

# %%
for name in envs_jax.registered():
  env, params = envs_jax.make(name)
  keys = jax.random.split(jax.random.key(9), 4)
  _, states = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
  actions = jax.vmap(env.sample_action)(keys)
  _, states, rewards, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
      keys, states, actions, params)
  first = env.render_text(jax.tree.map(lambda x: x[0], states)).splitlines()
  print(f"{name:28s} rewards {[round(r, 2) for r in rewards.tolist()]}  first line: "
        f"{first[0]!r}")
