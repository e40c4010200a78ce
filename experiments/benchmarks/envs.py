r"""Environment throughput: ours vs peers, side by side in one process.

    python -m experiments.benchmarks.envs [--batch=1024] [--scan_steps=100] [--envs=...]

For every registered env (uniformly random actions, batch ``--batch``):
- ``jit_vmap``: steps/s of ``jit(vmap(step))`` called from Python each step;
- ``scan_vmap``: steps/s of ``lax.scan`` over ``vmap(step)``, one program;
- ``scan_autoreset``: the same under :class:`envs_jax.AutoReset` (every step
  also computes a reset, so this includes level generation);
- ``levels``: initial states/s of ``jit(vmap(reset))`` (the level generator).
Peers, where installed (``pip install -e .[bench]``): Jumanji 1.1.2 Sokoban on
the same Boxoban levels (same modes; compared with our Boxoban env), Jumanji's
Game2048 (4x4) and RubiksCube (``cube_size=2``, our scramble depth and move
limit) beside ours, and the
plain Python loops RAGEN runs (gym-sokoban for Sokoban, gymnasium for
FrozenLake: one env, one step per call). Prints a table, then one JSON line per
env with the ratios ours/peer. Speed is measured here, never in tests.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from experiments.benchmarks import peers
from experiments.benchmarks import timing

_BATCH = flags.DEFINE_integer("batch", 1024, "Environments stepped in parallel.")
_SCAN_STEPS = flags.DEFINE_integer("scan_steps", 100, "Steps per scanned program.")
_CALLS = flags.DEFINE_integer("calls", 50, "Python-side calls of jit(vmap(step)).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats; the best is reported.")
_PY_STEPS = flags.DEFINE_integer("python_steps", 3000, "Steps of Python peer loops.")
_ENVS = flags.DEFINE_list("envs", None, "Env ids to run (default: all registered).")

# Our env id -> (peer name, factory returning (env, step)) for plain Python loops.
PYTHON_PEERS = {
    "FrozenLake-4x4-v0": ("gymnasium", peers.gymnasium_frozen_lake),
    "Sokoban-6x6-1box-v0": ("gym-sokoban", lambda: peers.gym_sokoban(6, 1)),
    "Sokoban-8x8-2box-v0": ("gym-sokoban", lambda: peers.gym_sokoban(8, 2)),
}
# Our env id -> factory of Jumanji's ``(reset, step, sample_action)`` for the same game.
JUMANJI_PEERS: dict[str, Callable[[], tuple]] = {
    "Boxoban-unfiltered-test-v0": lambda: jumanji_boxoban("unfiltered-test"),
    "Game2048-4x4-v0": lambda: jumanji_env(peers.make_jumanji_game_2048(), 4, lambda a: a),
    "RubiksCube-2x2-v0": lambda: jumanji_env(peers.make_jumanji_rubiks_cube(), 12,
                                             jumanji_cube_action),
}


def best_rate(fn: Callable[[], Any], units: float, repeats: int) -> float:
  """Best units/s over ``repeats`` timed calls of ``fn`` (after one warm-up)."""
  return units / timing.best_seconds(fn, repeats)


def bench_batched(reset: Callable[[jax.Array], Any],
                  step: Callable[[Any, jax.Array, jax.Array], tuple[Any, jax.Array]],
                  sample_action: Callable[[jax.Array], jax.Array],
                  batch: int, scan_steps: int, calls: int, repeats: int,
                  prefix: str = "") -> dict[str, float]:
  """Steps/s of ``jit(vmap(step))`` and of a scanned ``vmap(step)``; levels/s.

  Random actions and per-step keys are drawn before timing, so the rates
  measure the environment, not the random number generator.

  Args:
    reset: ``key -> state`` for one env.
    step: ``(state, action, key) -> (state, reward)`` for one env.
    sample_action: ``key -> action`` for one env.
    batch, scan_steps, calls, repeats: sizes, see the flags.
    prefix: prepended to the result keys.

  Returns:
    ``{prefix + "jit_vmap", prefix + "scan_vmap", prefix + "levels"}`` rates.
  """
  steps = max(scan_steps, calls)
  k_act, k_step, k_reset = jax.random.split(jax.random.key(0), 3)
  actions = jax.vmap(jax.vmap(sample_action))(
      jax.random.split(k_act, (steps, batch)))
  step_keys = jax.random.split(k_step, (steps, batch))
  reset_keys = jax.random.split(k_reset, batch)

  batched_step = jax.vmap(step)
  reset_b = jax.jit(jax.vmap(reset))
  state = reset_b(reset_keys)
  levels = best_rate(lambda: reset_b(reset_keys), batch, repeats)

  step_b = jax.jit(batched_step)
  per_call = [(jax.tree.map(lambda x, t=t: x[t], actions), step_keys[t])
              for t in range(calls)]

  def run_calls():
    s, r = state, None
    for a, k in per_call:
      s, r = step_b(s, a, k)
    return r

  jit_rate = best_rate(run_calls, batch * calls, repeats)

  @jax.jit
  def scanned(s, xs):
    return jax.lax.scan(lambda c, x: batched_step(c, *x), s, xs)[1]

  xs = jax.tree.map(lambda x: x[:scan_steps], (actions, step_keys))
  scan_rate = best_rate(lambda: scanned(state, xs), batch * scan_steps, repeats)
  return {prefix + "jit_vmap": jit_rate, prefix + "scan_vmap": scan_rate,
          prefix + "levels": levels}


def ours(env: envs_jax.Environment, params: Any, auto_reset: bool):
  """``(reset, step, sample_action)`` of one of our envs."""
  env = envs_jax.AutoReset(env) if auto_reset else env

  def reset(key):
    return env.reset(key, params)[1]

  def step(state, action, key):
    _, state, reward, *_ = env.step(key, state, action, params)
    return state, reward

  return reset, step, env.sample_action


def jumanji_boxoban(subset: str):
  """``(reset, step, sample_action)`` of Jumanji's Sokoban on our Boxoban levels."""
  jenv = peers.make_jumanji_boxoban(subset)
  to_j = jnp.asarray(peers.ACTION_TO_JUMANJI)

  def reset(key):
    return jenv.reset(key)[0]

  def step(state, action, key):
    del key  # Jumanji's Sokoban is deterministic and takes no key.
    state, timestep = jenv.step(state, action)
    return state, timestep.reward

  def sample_action(key):  # our action order, mapped to Jumanji's
    return to_j[jax.random.randint(key, (), 0, 4)]

  return reset, step, sample_action


def jumanji_env(jenv, num_actions: int, to_jumanji: Callable[[jax.Array], jax.Array]):
  """``(reset, step, sample_action)`` of a Jumanji env; actions drawn in our order.

  Args:
    jenv: a Jumanji environment (its own key in the state drives any chance).
    num_actions: our number of actions.
    to_jumanji: our int32 action -> Jumanji's action.
  """

  def reset(key):
    return jenv.reset(key)[0]

  def step(state, action, key):
    del key  # Jumanji keeps its key in the state.
    state, timestep = jenv.step(state, action)
    return state, timestep.reward

  def sample_action(key):
    return to_jumanji(jax.random.randint(key, (), 0, num_actions))

  return reset, step, sample_action


def jumanji_cube_action(action: jax.Array) -> jax.Array:
  """Our cube action (U U' ... B B') as Jumanji's ``[face, depth, amount]`` (cube_size 2)."""
  from jumanji.environments.logic.rubiks_cube import utils as jutils  # pylint: disable=g-import-not-at-top
  flat = jnp.asarray(peers.CUBE_ACTION_TO_JUMANJI)[action]
  return jutils.unflatten_action(flat, cube_size=2)


def python_loop_rate(factory: Callable[[], Any], steps: int) -> float:
  """Steps/s of one Python peer env stepped in a plain loop (RAGEN style)."""
  env, step = factory()
  actions = np.random.default_rng(0).integers(0, 4, size=steps)
  t0 = time.perf_counter()
  for a in actions:
    if step(env, int(a)):
      env.reset()
  return steps / (time.perf_counter() - t0)


def run_env(env_id: str) -> dict[str, Any]:
  """All measurements for one registered env id."""
  sizes = dict(batch=_BATCH.value, scan_steps=_SCAN_STEPS.value, calls=_CALLS.value,
               repeats=_REPEATS.value)
  env, params = envs_jax.make(env_id)
  row: dict[str, Any] = {"env": env_id, "batch": _BATCH.value}
  row.update(bench_batched(*ours(env, params, auto_reset=False), **sizes))
  row["scan_autoreset"] = bench_batched(*ours(env, params, auto_reset=True),
                                        **sizes)["scan_vmap"]

  if env_id in JUMANJI_PEERS and peers.HAVE_JUMANJI:
    row.update(bench_batched(*JUMANJI_PEERS[env_id](), **sizes, prefix="jumanji_"))
    row["ratio_jit_vmap_vs_jumanji"] = row["jit_vmap"] / row["jumanji_jit_vmap"]
    row["ratio_scan_vmap_vs_jumanji"] = row["scan_vmap"] / row["jumanji_scan_vmap"]

  if env_id in PYTHON_PEERS:
    name, factory = PYTHON_PEERS[env_id]
    try:
      rate = python_loop_rate(factory, _PY_STEPS.value)
    except ImportError as e:
      print(f"[{env_id}] python peer {name} skipped: {e}")
    else:
      row["python_peer"] = name
      row["python_peer_steps"] = rate
      row["ratio_scan_vmap_vs_python"] = row["scan_vmap"] / rate
      row["ratio_jit_vmap_vs_python"] = row["jit_vmap"] / rate
  return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}


def main(argv):
  del argv
  rows = [run_env(env_id) for env_id in (_ENVS.value or envs_jax.registered())]
  cols = ("jit_vmap", "scan_vmap", "scan_autoreset", "levels")
  header = f"{'env':30s}" + "".join(f"{c:>16s}" for c in cols) + "  ratios ours/peer"
  print(header)
  print("-" * len(header))
  for r in rows:
    ratios = ", ".join(f"{k[len('ratio_'):]}={v:,.1f}" for k, v in r.items()
                       if k.startswith("ratio_"))
    print(f"{r['env']:30s}" + "".join(f"{r[c]:16,.0f}" for c in cols) + "  " + ratios)
    if "jumanji_jit_vmap" in r:
      print(f"{'  Jumanji (same game)':30s}{r['jumanji_jit_vmap']:16,.0f}"
            f"{r['jumanji_scan_vmap']:16,.0f}{'':>16s}{r['jumanji_levels']:16,.0f}")
    if "python_peer" in r:
      print(f"{'  ' + r['python_peer'] + ' (Python loop)':30s}{r['python_peer_steps']:16,.0f}")
  for r in rows:
    print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
