r"""Evaluates a trained run's latest checkpoint on fixed held-out levels.

    python -m experiments.eval --workdir=/tmp/lake_grpo
    python -m experiments.eval --workdir=/tmp/sokoban --env=Sokoban-6x6-1box-altsym-v0 \
        --num_levels=256 --temperature=0.5 --episodes_per_level=4
    python -m experiments.eval --workdir=/tmp/sokoban --greedy

Reads ``<workdir>/config.json`` (written by ``experiments.train``) and the
newest checkpoint of ``<workdir>`` (its ``TrainState`` params), rebuilds the
run's :class:`experiments.common.Experiment`, optionally on another registered
environment (``--env``: a generalisation test, e.g. the alternative-symbol
Sokoban or FrozenLake; the text environment changes while the model,
tokenizer, prompt template and turn/action/token limits stay the run's), and
plays ``--num_levels`` fixed initial states (PRNG keys split from the run's
``eval.seed``, the same held-out levels as the training job's evaluation when
the env and level count are unchanged) ``--episodes_per_level`` times each, at
``--temperature`` (RAGEN validates at 0.5) or greedily (``--greedy``).

Prints the metrics and writes ``<workdir>/eval_<env>.json`` (or ``--output``)::

  {"env": ..., "train_env": ..., "algorithm": ..., "checkpoint_step": ...,
   "num_levels": ..., "group_size": G, "temperature": ..., "greedy": ...,
   "success": ..., "pass_at_group": ..., "score": ..., "actions": ...,
   "turns": ..., "format_valid_frac": ..., ..., "samples": [...]}

``success`` is the share of episodes the environment ended with success,
``pass_at_group`` (pass@G) the share of levels with at least one success
among their G episodes, ``score`` the mean trajectory reward (environment
rewards plus format penalties), ``actions``/``turns`` the mean environment
actions and assistant turns per episode, ``format_valid_frac`` the share of
turns whose reply parsed with only valid actions (see
``jagent.rollout.Trajectory.metrics`` for the rest); ``samples`` are decoded
trajectories of the first levels. With the run's env, level count,
temperature and ``G = 1`` the numbers equal the training job's final
evaluation (``eval_summary.json["rl"]``) for the same checkpoint.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from absl import app
from absl import flags
import ml_collections

import envs_jax
from experiments import common
from jagent import rollout
from jagent import sharding
from jagent import train

CONFIG_FILE = "config.json"

# ``workdir`` may override experiments.train's flag of the same name when both
# modules are imported in one process (tests); run from the command line, each
# module defines its own flags only.
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "The run directory written by experiments.train.", allow_override=True)
_ENV = flags.DEFINE_string(
    "env", None, "A registered environment id to evaluate on (default: the run's).")
_NUM_LEVELS = flags.DEFINE_integer(
    "num_levels", None, "Held-out initial states (default: the run's eval.num_levels).")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", None, "Sampling temperature (default: the run's eval.temperature).")
_GREEDY = flags.DEFINE_bool("greedy", False, "Decode greedily instead of sampling.")
# Not "group_size": the losses benchmark defines that flag, and tests import both.
_GROUP_SIZE = flags.DEFINE_integer(
    "episodes_per_level", 1, "Episodes per initial state (G of pass@G).")
_SAMPLES = flags.DEFINE_integer(
    "samples", None, "Decoded trajectories to save (default: the run's eval.samples).")
_OUTPUT = flags.DEFINE_string(
    "output", None, "Output JSON path (default: <workdir>/eval_<env>.json).")


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config of the run in ``workdir`` (its ``config.json``).

  Raises:
    ValueError: ``workdir`` is not a directory or has no ``config.json``
      (naming the path).
  """
  if not workdir or not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir!r} is not a directory (a run directory of "
                     "experiments.train is needed).")
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise ValueError(f"{path} does not exist: {workdir!r} is not a run directory of "
                     "experiments.train (it writes config.json first).")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def evaluate_run(workdir: str, *, env: str | None = None, num_levels: int | None = None,
                 temperature: float | None = None, greedy: bool = False,
                 group_size: int = 1, samples: int | None = None,
                 output: str | None = None) -> dict[str, Any]:
  """Evaluates the latest checkpoint of ``workdir``; writes and returns the results.

  See the module docstring for what is played and written.

  Args:
    workdir: a run directory of ``experiments.train`` (``config.json`` and at
      least one checkpoint).
    env: a registered environment id (None: the run's ``config.env``).
    num_levels: held-out initial states (None: the run's ``eval.num_levels``).
    temperature: sampling temperature > 0 (None: the run's
      ``eval.temperature``); ignored when ``greedy``.
    greedy: decode greedily.
    group_size: G >= 1 episodes per initial state.
    samples: decoded trajectories to keep (None: the run's ``eval.samples``).
    output: JSON path (None: ``<workdir>/eval_<env>.json``).

  Returns:
    The dict written to ``output`` (metrics as floats, ``samples`` a list).

  Raises:
    ValueError: a missing directory, ``config.json`` or checkpoint (naming
      the path), an unregistered ``env``, ``num_levels`` / ``group_size`` <
      1, a non-positive ``temperature``, or what the Experiment raises for
      the resulting config (naming the field) — all before any compile.
  """
  config = load_config(workdir)
  if env is not None and env not in envs_jax.registered():
    raise ValueError(f"--env={env!r} is not a registered environment; known: "
                     f"{sorted(envs_jax.registered())}")
  for name, v in (("num_levels", num_levels), ("group_size", group_size),
                  ("samples", samples)):
    if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                          or v < (0 if name == "samples" else 1)):
      raise ValueError(f"--{name}={v!r} must be an int >= {0 if name == 'samples' else 1}")
  if temperature is not None and not (temperature > 0 and math.isfinite(temperature)):
    raise ValueError(f"--temperature={temperature!r} must be a positive finite float")
  train_env = config.env
  if env is not None:
    config.env = env
  if num_levels is not None:
    config.eval.num_levels = num_levels
    # Chunks of eval.num_groups levels; keep them dividing the level count.
    config.eval.num_groups = math.gcd(num_levels, config.eval.num_groups)
  if temperature is not None:
    config.eval.temperature = float(temperature)
  if samples is not None:
    config.eval.samples = samples
  # One device, whatever mesh the run trained on (config.mesh): checkpoints
  # restore onto any sharding, and the run's device count need not be here.
  if "mesh" in config:
    config.mesh = ""
  exp = common.Experiment(config)  # validates (naming config.<field>)
  c = config

  ckpt = exp.checkpointer(workdir)
  try:
    step = ckpt.latest_step()
    if step is None:
      raise ValueError(f"no checkpoint in {ckpt.directory}: the run in {workdir!r} has not "
                       "saved one yet (experiments.train saves after SFT).")
    state, _ = ckpt.restore(exp.rl_state_target(), step)  # from any mesh
  finally:
    ckpt.close()

  eval_config = common.eval_rollout_config(c, greedy=greedy, group_size=group_size,
                                           context_size=exp.context_size)
  fn = rollout.make_rollout(exp.text_env, exp.model_config, eval_config, exp.env_params)
  # The training job's evaluation keys: same levels, same sampling key.
  metrics, traj = train.evaluate(sharding.shard_eval_program(fn, exp.mesh), state.params,
                                 exp.eval_keys, exp.eval_key(), c.eval.num_groups)
  result: dict[str, Any] = {
      "env": c.env, "train_env": train_env, "algorithm": c.algorithm,
      "model": c.model_dir or c.model, "workdir": os.path.abspath(workdir),
      "checkpoint_step": int(step), "num_levels": c.eval.num_levels,
      "level_seed": c.eval.seed, "group_size": group_size,
      "temperature": c.eval.temperature, "greedy": bool(greedy),
  }
  result.update({k: float(v) for k, v in metrics.items()})
  result["samples"] = train.decode_samples(sharding.to_host(traj), exp.tokenizer,
                                           c.eval.samples)
  output = output or os.path.join(workdir, f"eval_{c.env}.json")
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  train.write_json(output, result)
  result["output"] = output
  return result


def _print(result: dict[str, Any]) -> None:
  how = "greedy" if result["greedy"] else f"temperature {result['temperature']}"
  print(f"{result['env']} (trained on {result['train_env']}, {result['algorithm']}), "
        f"checkpoint step {result['checkpoint_step']}, {result['num_levels']} levels x "
        f"G={result['group_size']}, {how}:")
  for k in ("success", "pass_at_group", "score", "actions", "turns", "format_valid_frac",
            "valid_action_frac", "effective_action_frac", "reply_tokens", "overflow_frac"):
    if k in result:
      print(f"  {k:24s} {result[k]:.4f}")
  if result["samples"]:
    s = result["samples"][0]
    print(f"sample 0 (score {s['score']}, success {s['success']}, {s['end_reason']}):")
    print(s["text"])
  print(f"wrote {result['output']}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required (a run directory of experiments.train).")
  common.setup_compilation_cache()
  result = evaluate_run(
      _WORKDIR.value, env=_ENV.value, num_levels=_NUM_LEVELS.value,
      temperature=_TEMPERATURE.value, greedy=_GREEDY.value, group_size=_GROUP_SIZE.value,
      samples=_SAMPLES.value, output=_OUTPUT.value)
  _print(result)


if __name__ == "__main__":
  app.run(main)
