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
"""

from __future__ import annotations

import ast
import json
import os

from absl import flags

from experiments import cli
from experiments import common
from experiments import train as train_job
from experiments.configs import tiny
from jagent import train


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
      raise ValueError(f"--set={item!r}: expected [<scope>:]<field>=<value>")
    scope, colon, field = target.rpartition(":")
    if colon and scope not in (env, config.algorithm, f"{env},{config.algorithm}"):
      continue
    try:
      common.config_field(config, field)
    except common.ConfigError as e:
      raise common.ConfigError(f"--set={item!r}: {e}") from None
    group, _, name = field.rpartition(".")
    (common.config_field(config, group) if group else config)[name] = _parse_value(value)
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


def main(argv):
  del argv
  fl = flags.FLAGS
  common.setup_compilation_cache()
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
