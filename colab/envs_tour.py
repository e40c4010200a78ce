# %% [markdown]
# # envs_jax tour: jit-compiled, batched text-agent environments
#
# Make, reset, step, render and vmap the RAGEN environments (Sokoban, FrozenLake, Bandit,
# Countdown) in pure JAX. Open `colab/envs_tour.ipynb` in Colab or Jupyter from your clone.
# `colab/envs_tour.py` is its `# %%` twin: the test suite runs the twin and checks that
# the notebook's cells are the same, so neither can rot.

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
