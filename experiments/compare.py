r"""Runs a grid of env x algorithm training runs and prints one comparison table.

    python -m experiments.compare --envs=FrozenLake-4x4-v0,Bandit-v0 \
        --algorithms=starpo_s,ppo,grpo --runs_dir=/tmp/compare \
        --set=rl.steps=100 --set=Bandit-v0:sft.expert=random

Each cell is a full :func:`experiments.train.run` of the tiny config
(``experiments/configs/tiny.py:<env>,<algorithm>``) in
``<runs_dir>/<env>_<algorithm>`` (an unfinished cell resumes, a finished one,
with its ``eval_summary.json``, is only re-read), so the table is the RAGEN
comparison (its Table 1: StarPO-S vs PPO vs GRPO per environment) at our
scale. ``--set=<field>=<value>`` changes a config field in every cell;
``--set=<scope>:<field>=<value>`` only in the cells of that scope: an env id,
an algorithm, or ``<env>,<algorithm>``. The table (Markdown) goes to stdout
and ``<runs_dir>/comparison.md``: success after SFT and after RL at the
evaluation temperature, greedy success after RL, the RL gain, and minutes.

With ``--seeds=N`` (N >= 2) each cell is N seeds as one vmapped
:func:`experiments.sweep.sweep` (``<runs_dir>/<env>_<algorithm>/sweep_summary.json``),
and every algorithm of an env starts RL from the same SFT parameters per seed
(SFT reads no algorithm field: the env's first cell to run writes them to
``<runs_dir>/<env>_sft/``, :mod:`experiments.sft_store`, and every later cell,
in this process or a later one, reads them back). An env's cells are all
evaluated on one level set, held out of every cell's training levels (cells
with more RL steps train on more levels). The table gives mean +- std over the
seeds and the in-group reward std of the last 20% of RL steps, and
``<runs_dir>/comparison_<env>.png`` draws
training success, in-group reward std, policy entropy and reply format per
step: one line per algorithm (the mean of the seeds' EMA curves), the seeds'
range shaded (RAGEN's Fig. 3 at our scale)::

    python -m experiments.compare --envs=Bandit-v0 --algorithms=starpo_s,ppo,grpo,gigpo \
        --seeds=3 --runs_dir=/tmp/compare3
"""

from __future__ import annotations

import ast
import functools
import json
import os

from absl import flags

import numpy as np

from experiments import cli
from experiments import common
from experiments import fields
from experiments import sweep
from experiments import train as train_job
from experiments.configs import tiny
from jagent import train


TOKENS = "rollout/sampled_tokens"  # a step's sampled (loss-masked) reply tokens


def _parse_value(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply_overrides(config, env: str, overrides: list[str]):
  """Applies ``[<scope>:]<field>=<value>`` strings to ``config`` (in place).

  A scoped override applies when its scope is ``env``, ``config.algorithm``
  or ``"<env>,<algorithm>"``.

  Raises:
    ValueError: an override without ``=``.
    ConfigError: a field the config lacks (naming the closest ones).
  """
  for item in overrides:
    target, sep, value = item.partition("=")
    if not sep:
      raise fields.ConfigError(f"--set={item!r}: expected [<scope>:]<field>=<value>")
    scope, colon, field = target.rpartition(":")
    if colon and scope not in (env, config.algorithm, f"{env},{config.algorithm}"):
      continue
    try:
      fields.config_field(config, field)
    except fields.ConfigError as e:
      raise fields.ConfigError(f"--set={item!r}: {e}") from None
    group, _, name = field.rpartition(".")
    (fields.config_field(config, group) if group else config)[name] = _parse_value(value)
  return config


def table(rows: list[dict]) -> str:
  """Markdown table of :func:`experiments.train.run` summaries."""
  lines = ["| env | algorithm | SFT success | RL success | RL greedy | gain | minutes |",
           "|---|---|---|---|---|---|---|"]
  for s in rows:
    sft, rl = s["sft"]["success"], s["rl"]["success"]
    lines.append(
        f"| {s['env']} | {s['algorithm']} | {sft:.3f} | {rl:.3f} | "
        f"{s['rl'].get('greedy_success', float('nan')):.3f} | {100 * (rl - sft):+.1f} | "
        f"{s.get('seconds', float('nan')) / 60:.1f} |")
  return "\n".join(lines)


def _mean_std(xs, mean_format: str = ".3f", std_format: str = ".3f") -> str:
  m = sweep.mean_std(xs)
  return f"{m['mean']:{mean_format}} ± {m['std']:{std_format}}"


def tail_mean(values, fraction: float = 0.2) -> float:
  """Mean of the finite values of the last ``fraction`` of a per-step series."""
  x = np.asarray(values, np.float64)
  tail = x[len(x) - max(1, round(fraction * len(x))):]
  tail = tail[np.isfinite(tail)]
  return float(np.mean(tail)) if tail.size else float("nan")


def seed_table(summaries: list[dict]) -> str:
  """Markdown table of :func:`experiments.sweep.sweep` summaries, one row a cell.

  Columns: success after SFT and after RL (T = the evaluation temperature),
  greedy success after RL and the gain RL - SFT (points), each mean ± std
  over the seeds; the gain of each seed; the in-group reward std of training
  rollouts (before the filter) averaged over the last 20% of RL steps, mean ±
  std over seeds (0: collapsed, RAGEN's Echo Trap); the RL stage's sampled
  reply tokens in millions, mean ± std over seeds (the budget at which tree
  and chain rollouts compare); and minutes of the sweep (SFT counted only in
  the cell that ran it).
  """
  lines = ["| env | algorithm | seeds | SFT success | RL success | RL greedy | gain (points) "
           "| gain per seed | reward std, last 20% | sampled tokens (M) | minutes |",
           "|" + "---|" * 11]
  for s in summaries:
    runs = s["runs"]
    sft = [r["sft"]["success"] for r in runs]
    rl = [r["rl"]["success"] for r in runs]
    greedy = [r["rl"].get("greedy_success", float("nan")) for r in runs]
    gains = [100 * (b - a) for a, b in zip(sft, rl)]
    stds = [tail_mean(r.get("curves", {}).get("filter/reward_std_before", [float("nan")]))
            for r in runs]
    tokens = [float(np.nansum(r["curves"][TOKENS])) / 1e6 if TOKENS in r.get("curves", {})
              else float("nan") for r in runs]
    lines.append(
        f"| {s['env']} | {s['algorithm']} | {len(runs)} | {_mean_std(sft)} | {_mean_std(rl)} | "
        f"{_mean_std(greedy)} | {_mean_std(gains, '+.1f', '.1f')} | "
        f"{', '.join(f'{g:+.1f}' for g in gains)} | {_mean_std(stds)} | "
        f"{_mean_std(tokens, '.2f', '.2f')} | {s['seconds']['total'] / 60:.1f} |")
  return "\n".join(lines)


def plot_comparison(summaries: list[dict], path: str) -> None:
  """``comparison_<env>.png``: the training curves of one env's cells.

  One line per algorithm (mean of the seeds' EMA curves), the seeds' range
  shaded (``jagent.train.plot_seed_curves``), against the total of sampled
  tokens when every cell's curves hold ``rollout/sampled_tokens``, else
  against the step.
  """
  curves = {s["algorithm"]: {k: np.asarray([r["curves"][k] for r in s["runs"]], np.float64)
                             for k in s["runs"][0].get("curves", {})} for s in summaries}
  steps = max((len(c) for s in summaries for c in s["runs"][0].get("curves", {}).values()),
              default=1)
  # An EMA time constant of ~steps/20 (0.96 at 500 steps, 0.33 at 30).
  smoothing = round(float(np.clip(1.0 - 20.0 / steps, 0.0, 0.96)), 2)
  P = functools.partial(train.PlotPanel, smoothing=smoothing)  # pylint: disable=invalid-name
  panels = (P("Training success (share of episodes, T=1)", "rollout/success", ylim=(0, 1)),
            P("In-group reward std before the filter", "filter/reward_std_before",
              ylim=(0, None)),
            P("Policy entropy (nats/token)", "actor/entropy", ylim=(0, None)),
            P("Valid reply format (share of turns)", "rollout/format_valid_frac",
              ylim=(0, 1.02)))
  seeds = len(summaries[0]["runs"])
  # Against sampled tokens when every cell logged them: cells that sample
  # differently per step (tree and chain rollouts) then line up at equal budgets.
  by_tokens = all(TOKENS in c for c in curves.values())
  train.plot_seed_curves(curves, path, panels, title=(
      f"{summaries[0]['env']}, {seeds} seeds from one SFT start "
      f"(seeds' mean of EMA {smoothing:g}; band: min-max)"),
      x_key=TOKENS if by_tokens else None,
      x_label="sampled tokens (seeds' mean total)" if by_tokens else None)


def _run_seeds(envs, algorithms, overrides, runs_dir, seeds) -> str:
  """The ``--seeds >= 2`` grid (module docstring); returns the table."""
  # Every cell's config is checked before the first one compiles.
  configs = {}
  for env in envs:
    for algorithm in algorithms:
      configs[env, algorithm] = apply_overrides(tiny.get_config(f"{env},{algorithm}"), env,
                                                overrides)
      sweep.run_configs(configs[env, algorithm], seeds)
  rows = []
  for env in envs:
    env_rows = []
    for algorithm in algorithms:
      config = configs[env, algorithm]
      workdir = os.path.join(runs_dir, f"{env}_{algorithm}")
      done = os.path.join(workdir, "sweep_summary.json")
      if os.path.exists(done):
        with open(done) as f:
          summary = json.load(f)
      else:
        # Every cell of an env is evaluated on one level set, held out of all the cells' levels.
        others = [configs[env, a] for a in algorithms if a != algorithm]
        summary = sweep.sweep(config, workdir, seeds=seeds, progress=True,
                              sft_dir=os.path.join(runs_dir, f"{env}_sft"), also_held_out=others)
        for k in ("sft_params", "params", "frozen"):
          summary.pop(k)
      env_rows.append(summary)
      print(seed_table(env_rows[-1:]).splitlines()[-1], flush=True)
    plot_comparison(env_rows, os.path.join(runs_dir, f"comparison_{env}.png"))
    rows.extend(env_rows)
  return seed_table(rows)


def _define_flags():
  """Defines this program's flags (only when run as a program: importing the
  module for :func:`apply_overrides` must not clash with other modules' flags,
  e.g. the benchmarks' ``--envs`` and ``--algorithms``)."""
  flags.DEFINE_list("envs", ["FrozenLake-4x4-v0", "Bandit-v0"], "Environment ids.")
  flags.DEFINE_list("algorithms", ["starpo_s", "ppo", "grpo"],
                    "Algorithm names (jagent.transforms registry).")
  flags.DEFINE_string(
      "runs_dir", os.path.join(os.path.expanduser("~"), "jagent_runs", "compare"),
      "Parent directory of the runs.")
  flags.DEFINE_multi_string(
      "set", [], "[<scope>:]<field>=<value> config overrides; scope: an env id, an algorithm "
      "or <env>,<algorithm> (value parsed as a Python literal when possible).")
  flags.DEFINE_integer(
      "seeds", 1, "1: one experiments.train run per cell. N >= 2: N seeds per cell as one "
      "vmapped experiments.sweep, every algorithm of an env from the same SFT parameters; "
      "mean ± std table and <runs_dir>/comparison_<env>.png.", lower_bound=1)


def main(argv):
  del argv
  fl = flags.FLAGS
  cli.check_writable(fl.runs_dir, "--runs_dir")
  common.setup_compilation_cache()
  if fl.seeds > 1:
    os.makedirs(fl.runs_dir, exist_ok=True)
    text = _run_seeds(fl.envs, fl.algorithms, fl.set, fl.runs_dir, fl.seeds)
    train.write_text(os.path.join(fl.runs_dir, "comparison.md"), text + "\n")
    print(text)
    return
  rows = []
  for env in fl.envs:
    for algorithm in fl.algorithms:
      config = apply_overrides(tiny.get_config(f"{env},{algorithm}"), env, fl.set)
      workdir = os.path.join(fl.runs_dir, f"{env}_{algorithm}")
      done = os.path.join(workdir, "eval_summary.json")
      if os.path.exists(done):
        with open(done) as f:
          rows.append(json.load(f))
      else:
        rows.append(train_job.run(config, workdir))
      print(table(rows[-1:]).splitlines()[-1], flush=True)
  text = table(rows)
  os.makedirs(fl.runs_dir, exist_ok=True)
  train.write_text(os.path.join(fl.runs_dir, "comparison.md"), text + "\n")
  print(text)


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
