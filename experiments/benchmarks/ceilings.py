r"""Success ceilings of the games within the agent's turn budget.

    python -m experiments.benchmarks.ceilings                    # every game's ceiling
    python -m experiments.benchmarks.ceilings --table=2048       # 2048's success threshold
    python -m experiments.benchmarks.ceilings --envs=Sokoban-6x6-1box-v0 --held_out

A game's ceiling is the success of its expert (the env's optimal solver where
one exists) played exactly as the agent plays: the tiny config's prompt,
parser, turn budget (``rollout.max_turns``), action budget
(``rollout.max_actions_per_traj``) and actions per turn, through
:func:`jagent.rollout.demonstrations` (the SFT demonstrations' code path), on
the evaluation levels: ``split(key(eval.seed), num_levels)`` (123, as the
tiny config's evaluation), or with ``--held_out`` the levels held out of
seed 0's tiny run (``Experiment.eval_keys``: what the learning runs are
evaluated on). No learning policy can beat an optimal solver's ceiling.
FrozenLake's expert is ``frozen_lake_policy="max_success"``: it replans
every turn to maximise the discounted (0.9) chance of reaching the goal under
the slip rule; 2048's is greedy (no 2048 solver exists), a lower bound.

``--table=2048`` plays Game2048 with ``target_tile`` 16, 32 and 64 (success:
making that tile, which ends the episode) under its greedy expert and
uniformly random valid moves, the measurement that chose
``Game2048-4x4-v0``'s agent setting (docs/results.md). Prints a markdown
table and one JSON line per row. Success rates are measured here, never in
tests.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from absl import app
from absl import flags
import jax
import numpy as np

import envs_jax
from experiments import experiment
from experiments.configs import tiny
from jagent import rollout

# The games of the learning table (docs/results.md, "Game ceilings within the turn budget").
GAMES = ("CoordSokoban-6x6-1box-v0", "CoordFrozenLake-4x4-v0", "Sudoku-4x4-v0",
         "Game2048-4x4-tile16-v0", "RubiksCube-2x2-v0", "Countdown-v0", "Sokoban-8x8-2box-v0",
         "Sokoban-6x6-1box-v0")
# make_expert settings per game: FrozenLake's most likely route, not its shortest one.
EXPERT_OPTIONS: dict[str, dict[str, Any]] = {
    "CoordFrozenLake-4x4-v0": {"frozen_lake_policy": "max_success"},
    "FrozenLake-4x4-v0": {"frozen_lake_policy": "max_success"},
}
POLICIES = ("solver", "random", "random_valid")


_UP = envs_jax.Game2048.action_names.index("Up")  # the move of a stuck board


class Random2048Valid:
  """An :class:`jagent.rollout.Expert` of 2048: uniformly random valid moves.

  Each move is drawn uniformly among the moves that change the board (Up
  when none does); later moves of one reply are drawn on the board after the
  earlier ones without their spawns (unknown to the player), as the greedy
  expert plans.

  Args:
    actions_per_turn: moves per reply.
    seed: seed of the numpy generator.
  """

  def __init__(self, actions_per_turn: int = 1, seed: int = 0):
    self.actions_per_turn = actions_per_turn
    self.rng = np.random.default_rng(seed)
    self._moves = jax.jit(jax.vmap(envs_jax.Game2048.move_all))

  def __call__(self, rows: Sequence[int], envs: Sequence[Any],
               states: Sequence[str]) -> list[str]:
    del rows, states
    if not envs:
      return []
    boards = np.stack([np.asarray(_board(e), np.int32) for e in envs])
    plans: list[list[int]] = [[] for _ in envs]
    done = np.zeros(len(envs), bool)
    for _ in range(self.actions_per_turn):
      after, _, moved = map(np.asarray, self._moves(boards))
      pick = np.argmax(np.where(moved, self.rng.random(moved.shape), -1.0), axis=1)
      for i, a in enumerate(pick):
        done[i] |= not moved[i, a]
        if not done[i]:
          plans[i].append(int(a))
      boards = after[np.arange(len(envs)), pick]
    return ["<answer>" + " || ".join(envs_jax.Game2048.action_names[a] for a in (p or [_UP]))
            + "</answer>" for p in plans]


def _board(host) -> np.ndarray:
  """The 2048 board of a :class:`jagent.rollout.JaxEnvAsHost` row (wrapper states removed)."""
  state = host.state
  while hasattr(state, "env_state"):
    state = state.env_state
  return jax.device_get(state.board)


def ceiling_config(env_id: str, *, num_levels: int = 512, actions_per_turn: int = 1):
  """The tiny config of ``env_id`` with ``actions_per_turn`` actions a reply.

  The turn and action budgets stay the game's (``envs_jax.AgentDefaults``);
  the reply budget grows by the extra actions' tokens (their names and the
  ``" || "`` separators) so the expert's longer replies fit.

  Args:
    env_id: a registered env id with agent defaults.
    num_levels: ``eval.num_levels``.
    actions_per_turn: ``prompt.max_actions_per_turn`` and
      ``sft.actions_per_turn``, in [1, ``rollout.max_actions_per_traj``].

  Returns:
    An ``ml_collections.ConfigDict`` (``experiments/configs/tiny.py``'s).

  Raises:
    ValueError: ``actions_per_turn`` or ``num_levels`` out of range, naming it.
  """
  c = tiny.get_config(f"{env_id},starpo_s")
  if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
    raise ValueError(f"ceiling_config: num_levels must be an int >= 1, got {num_levels!r}")
  if (isinstance(actions_per_turn, bool) or not isinstance(actions_per_turn, int)
      or not 1 <= actions_per_turn <= c.rollout.max_actions_per_traj):
    raise ValueError(f"ceiling_config: actions_per_turn={actions_per_turn!r} must be an int "
                     f"in [1, {c.rollout.max_actions_per_traj}] (the action budget)")
  c.eval.num_levels = num_levels
  c.eval.num_groups = math.gcd(num_levels, c.eval.num_groups)  # unused here; must divide
  c.prompt.max_actions_per_turn = c.sft.actions_per_turn = actions_per_turn
  # 4 tokens covers " || Right" in the tiny tokenizer; an overlong reply would raise.
  c.rollout.max_tokens_per_turn += 4 * (actions_per_turn - 1)
  return c


def expert(env, policy: str, actions_per_turn: int, options: Mapping[str, Any] | None = None,
           seed: int = 0):
  """The :class:`jagent.rollout.Expert` of ``policy`` for ``env``.

  Args:
    env: an ``envs_jax`` environment (wrappers allowed).
    policy: ``"solver"`` (the game's expert with ``options``), ``"random"``
      (its uniformly random answers) or ``"random_valid"`` (2048 only:
      :class:`Random2048Valid`).
    actions_per_turn: actions per reply.
    options: ``make_expert`` keywords (e.g. ``frozen_lake_policy``).
    seed: the random policies' seed.

  Raises:
    ValueError: an unknown ``policy``, or ``"random_valid"`` for a game other
      than 2048.
  """
  if policy not in POLICIES:
    raise ValueError(f"ceilings: policy={policy!r}; use one of {POLICIES}")
  if policy == "random_valid":
    if not isinstance(env.unwrapped, envs_jax.Game2048):
      raise ValueError(f"ceilings: policy='random_valid' is 2048's, not {env.unwrapped!r}'s")
    return Random2048Valid(actions_per_turn, seed)
  return rollout.make_expert(env, think=False, actions_per_turn=actions_per_turn,
                             policy=policy, seed=seed, **dict(options or {}))


def measure(env_id: str, *, policy: str = "solver", num_levels: int = 512,
            actions_per_turn: int = 1, held_out: bool = False,
            env_kwargs: Mapping[str, Any] | None = None,
            options: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """Success of ``policy`` on ``env_id`` within the tiny config's turn budget.

  Plays one episode per level of the evaluation levels through
  :func:`jagent.rollout.demonstrations` with the tiny config's prompt, budgets
  and parser (:func:`ceiling_config`); the environment's own randomness
  (slips, spawns) comes from ``key(eval.seed)``.

  Args:
    env_id: a registered env id with agent defaults.
    policy: see :func:`expert`.
    num_levels: levels played (one episode each).
    actions_per_turn: actions per reply.
    held_out: the levels held out of seed 0's tiny run
      (``Experiment.eval_keys``) instead of ``split(key(eval.seed), num_levels)``.
    env_kwargs: ``envs_jax.make`` overrides (e.g. 2048's ``target_tile``).
    options: ``make_expert`` keywords (default :data:`EXPERT_OPTIONS`).

  Returns:
    ``{"env", "policy", "env_kwargs", "levels", "held_out", "max_turns",
    "max_actions_per_traj", "actions_per_turn", "success", "actions",
    "turns", "format_valid_frac"}``: ``success`` the share of episodes the
    environment ended with success (float), ``actions`` / ``turns`` the mean
    environment actions and replies per episode.

  Raises:
    ValueError: from :func:`ceiling_config` and :func:`expert`.
  """
  c = ceiling_config(env_id, num_levels=num_levels, actions_per_turn=actions_per_turn)
  ex = experiment.Experiment(c)
  text_env = ex.text_env
  if env_kwargs:
    env, params = envs_jax.make(env_id, **env_kwargs)
    text_env = rollout.TextEnv(env, ex.tokenizer, ex.prompt, env_params=params)
  keys = (ex.eval_keys if held_out
          else jax.random.split(jax.random.key(c.eval.seed), num_levels))
  r = ex.rollout_config
  rc = rollout.RolloutConfig(
      num_groups=num_levels, group_size=1, max_turns=r.max_turns,
      max_tokens_per_turn=r.max_tokens_per_turn, max_actions_per_traj=r.max_actions_per_traj,
      context_size=ex.context_size, history_turns=r.history_turns)
  play = expert(text_env.env, policy, actions_per_turn,
                EXPERT_OPTIONS.get(env_id, {}) if options is None else options)
  traj = rollout.demonstrations(text_env, key=jax.random.key(c.eval.seed), config=rc,
                                actions_per_turn=actions_per_turn, reset_keys=keys,
                                expert=play)
  m = jax.device_get(traj.metrics())
  return {"env": env_id, "policy": policy, "env_kwargs": dict(env_kwargs or {}),
          "levels": num_levels, "held_out": held_out, "max_turns": r.max_turns,
          "max_actions_per_traj": r.max_actions_per_traj, "actions_per_turn": actions_per_turn,
          "success": float(m["success"]), "actions": float(m["actions"]),
          "turns": float(m["turns"]), "format_valid_frac": float(m["format_valid_frac"])}


def ceilings_table(envs: Sequence[str], actions: Sequence[int], num_levels: int,
                   held_out: bool) -> list[dict[str, Any]]:
  """:func:`measure` of each game's solver at each count of actions per turn it allows."""
  rows = []
  for env_id in envs:
    budget = envs_jax.agent_defaults(env_id).max_actions_per_traj
    for k in actions:
      if k <= budget and (k == 1 or budget > envs_jax.agent_defaults(env_id).max_turns):
        rows.append(measure(env_id, num_levels=num_levels, actions_per_turn=k,
                            held_out=held_out))
        print(json.dumps(rows[-1]), flush=True)
  return rows


def table_2048(targets: Sequence[int], actions: Sequence[int], num_levels: int,
               held_out: bool) -> list[dict[str, Any]]:
  """:func:`measure` of 2048's greedy expert and random valid moves per target tile."""
  rows = []
  for t in targets:
    for k in actions:
      for policy in ("solver", "random_valid"):
        rows.append(measure("Game2048-4x4-v0", policy=policy, num_levels=num_levels,
                            actions_per_turn=k, held_out=held_out,
                            env_kwargs={"target_tile": t}))
        print(json.dumps(rows[-1]), flush=True)
  return rows


def define_flags() -> dict[str, Any]:
  """The command line's absl flags (defined on use: other modules define ``num_levels``)."""
  return dict(
      envs=flags.DEFINE_list("envs", list(GAMES), "Env ids of the ceilings table."),
      table=flags.DEFINE_enum("table", "ceilings", ["ceilings", "2048"],
                              "ceilings: every --envs game; 2048: the target tile table."),
      num_levels=flags.DEFINE_integer("num_levels", None,
                                      "Levels (default 512; 2,000 for --table=2048)."),
      held_out=flags.DEFINE_bool("held_out", False, "Levels held out of seed 0's tiny run "
                                 "instead of the plain split."),
      targets=flags.DEFINE_list("targets", ["16", "32", "64"], "--table=2048's target tiles."),
      actions_per_turn=flags.DEFINE_list("actions_per_turn", ["1", "2"],
                                         "Actions per turn (each <= the action budget)."))


def main(argv, f: dict[str, Any]):
  del argv
  actions = [int(k) for k in f["actions_per_turn"].value]
  levels, held_out = f["num_levels"].value, f["held_out"].value
  if f["table"].value == "2048":
    rows = table_2048([int(t) for t in f["targets"].value], actions, levels or 2000, held_out)
    print("\n| target tile | actions per turn | greedy expert | random valid moves |")
    print("|---|---|---|---|")
    for e, r in zip(rows[::2], rows[1::2]):
      print(f"| {e['env_kwargs']['target_tile']} | {e['actions_per_turn']} | "
            f"{e['success']:.3f} | {r['success']:.3f} |")
    return
  rows = ceilings_table(f["envs"].value, actions, levels or 512, held_out)
  print("\n| game | turns | actions | actions per turn | ceiling | mean actions |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['env']} | {r['max_turns']} | {r['max_actions_per_traj']} | "
          f"{r['actions_per_turn']} | {r['success']:.3f} | {r['actions']:.2f} |")


if __name__ == "__main__":
  _flags = define_flags()
  app.run(lambda argv: main(argv, _flags))
