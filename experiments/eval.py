r"""Evaluates a trained run's latest checkpoint on fixed held-out levels.

    python -m experiments.eval                       # the main job's run (~/jagent_runs/default)
    python -m experiments.eval --workdir=/tmp/lake_grpo --greedy
    python -m experiments.eval --env=Sokoban-6x6-1box-altsym-v0 --num_levels=512
    python -m experiments.eval --env=Sokoban-6x6-1box-altsym-v0 --nolegend

Reads ``<workdir>/config.json`` (written by ``experiments.train``; the default
``--workdir`` is the train job's) and the newest checkpoint of ``<workdir>``
that reads back (its ``TrainState`` params; a damaged newer one is skipped
with one line naming it and why, and ``checkpoint_step`` says which was
played), rebuilds the run's
:class:`experiments.experiment.Experiment` and plays ``--num_levels`` fixed
initial states (PRNG keys split from the run's ``eval.seed``, the same
held-out levels as the training job's evaluation when the env and level count
are unchanged) ``--episodes_per_level`` times each, at ``--temperature``
(RAGEN validates at 0.5) or greedily (``--greedy``).

**Another environment** (``--env``: a generalisation test, e.g. RAGEN's
Sokoban -> alternative symbols, or Bandit -> BanditTest) is played as that
environment defines its episodes (:func:`cross_env_config`): its own turn and
action budgets (``envs_jax.agent_defaults``), its reply budget (plus whatever
the run added to its own env's, e.g. for thinking), and its system message;
the model, tokenizer, chat template and reply format stay the run's. The
target's legend (``env.legend``, else its ``instructions``) is appended to the
system message, which every turn's context holds, so a model trained on one
symbol set is told what the other's symbols mean (``--nolegend``: the target's
system message alone). An environment whose symbols the run's tokenizer cannot
render as single tokens, or whose prompt does not fit the model's context, is
refused with a ValueError naming ``--env`` before anything compiles.

Prints the metrics and writes ``<workdir>/<output_name(...)>`` (or
``--output``): one file per (env, greedy or temperature, levels, episodes per
level, legend), e.g. ``eval_Sokoban-6x6-1box-v0_t0.5_512levels.json`` and
``eval_Sokoban-6x6-1box-v0_greedy_512levels.json``, so evaluations of one run
never overwrite each other::

  {"env": ..., "train_env": ..., "algorithm": ..., "checkpoint_step": ...,
   "num_levels": ..., "group_size": G, "temperature": ..., "greedy": ...,
   "legend": ..., "system": ..., "max_turns": ..., "max_actions_per_traj": ...,
   "max_tokens_per_turn": ..., "success": ..., "pass_at_group": ...,
   "score": ..., "actions": ..., "turns": ..., "format_valid_frac": ..., ...,
   "samples": [...]}

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
from experiments import blocks
from experiments import cli
from experiments import common
from experiments import experiment
from experiments import fields
from experiments import spec
import jagent
from jagent import rollout
from jagent import sharding
from jagent import train

CONFIG_FILE = "config.json"

# ``workdir`` may override experiments.train's flag of the same name when both
# modules are imported in one process (tests); run from the command line, each
# module defines its own flags only. Both default to common.DEFAULT_WORKDIR.
_WORKDIR = flags.DEFINE_string(
    "workdir", common.DEFAULT_WORKDIR, "The run directory written by experiments.train.",
    allow_override=True)
_ENV = flags.DEFINE_string(
    "env", None, "A registered environment id to evaluate on (default: the run's), played "
    "with its own episode limits and system message.")
_LEGEND = flags.DEFINE_bool(
    "legend", True, "With --env: append the target env's legend (else its instructions) to "
    "the system message. --nolegend: its system message alone.")
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
    "output", None, "Output JSON path (default: <workdir>/eval_<env>_<greedy|tT>_"
    "<N>levels[_G<g>][_legend].json).")


def output_name(env: str, *, greedy: bool, temperature: float, num_levels: int,
                group_size: int = 1, legend: bool = False) -> str:
  """The file name of an evaluation: what was played, so none overwrites another.

  ``eval_<env>_<greedy | t<temperature>>_<num_levels>levels`` then ``_G<g>``
  for ``group_size`` g > 1 episodes per level and ``_legend`` when a legend
  was added to the prompt (a cross-env evaluation, :func:`cross_env_config`),
  e.g. ``eval_Sokoban-6x6-1box-altsym-v0_t0.5_512levels_legend.json``.
  """
  how = "greedy" if greedy else f"t{temperature:g}"
  return (f"eval_{env}_{how}_{num_levels}levels" + (f"_G{group_size}" if group_size > 1 else "")
          + ("_legend" if legend else "") + ".json")


def legend_text(env_id: str) -> str | None:
  """What a prompt must tell a model about ``env_id``'s text: its legend, else its instructions.

  ``env.legend`` (grid games: each symbol's meaning), else
  ``env.instructions`` (e.g. Bandit's one sentence); None when it has neither.
  """
  env, _ = envs_jax.make(env_id)
  return getattr(env, "legend", None) or env.instructions


def cross_env_config(config: ml_collections.ConfigDict, env: str, *, legend: bool = True
                     ) -> tuple[ml_collections.ConfigDict, bool]:
  """The run's ``config`` set up to play registered environment ``env`` as ``env`` defines it.

  A copy of ``config`` with ``env``, and, when ``env`` is not the run's own
  (``config.env``):

  - ``rollout.max_turns`` and ``rollout.max_actions_per_traj``: ``env``'s
    :class:`envs_jax.AgentDefaults` (Bandit-v0 is one pull, not the 5 turns of
    a Sokoban run);
  - ``rollout.max_tokens_per_turn``: ``env``'s reply budget plus what the
    run's budget exceeds its own env's default by (a run that thinks keeps
    that room);
  - ``prompt.system``: ``env``'s system message, then (``legend``) a newline
    and :func:`legend_text` of ``env``. The system message opens every
    turn's context, including the one-turn rows of ``rollout.history_turns =
    0``; the default prompt has no instructions, so without it a model
    trained on ``#_O√XPS`` is never told what ``W.GCBA@`` mean;
  - ``prompt.instructions``: cleared, so a prompt that shows
    ``{instructions}`` shows ``env``'s own (a run's own text was written for
    its env).

  Model, tokenizer, chat template, reply format (``prompt.think``,
  ``prompt.max_actions_per_turn``) and evaluation levels stay the run's.

  Args:
    config: a run's config (``config.json``).
    env: a registered environment id.
    legend: append the target's legend to the system message.

  Returns:
    ``(config, legend_added)``: the new config, and whether a legend was
    added (False for the run's own env, ``legend=False``, or an env with
    neither legend nor instructions).

  Raises:
    ValueError: ``env`` is not registered, or it or the run's env has no
      ``agent_defaults`` (naming ``--env``).
  """
  if env not in envs_jax.registered():
    raise fields.ConfigError(f"--env={env!r} is not a registered environment; known: "
                             f"{sorted(envs_jax.registered())}")
  config = ml_collections.ConfigDict(config.to_dict())
  if env == config.env:
    return config, False
  own, target = envs_jax.agent_defaults(config.env), envs_jax.agent_defaults(env)
  if own is None or target is None:
    raise fields.ConfigError(f"--env={env!r}: {env if target is None else config.env} has no "
                             "agent_defaults (episode limits) to evaluate with")
  r = config.rollout
  extra = max(0, r.max_tokens_per_turn - own.max_tokens_per_turn)
  r.update(dict(max_turns=target.max_turns, max_actions_per_traj=target.max_actions_per_traj,
                max_tokens_per_turn=target.max_tokens_per_turn + extra))
  text = legend_text(env) if legend else None
  config.prompt.system = target.system + (f"\n{text}" if text else "")
  config.prompt.instructions = ""
  config.env = env
  return config, bool(text)


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The config of the run in ``workdir`` (its ``config.json``, upgraded: :func:`spec.upgrade`).

  Raises:
    ValueError: ``workdir`` is not a directory or has no ``config.json``
      (naming the path).
  """
  if not workdir or not os.path.isdir(workdir):
    raise fields.ConfigError(f"--workdir={workdir!r} is not a directory (a run directory of "
                             "experiments.train is needed).")
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise fields.ConfigError(f"{path} does not exist: {workdir!r} is not a run directory of "
                             "experiments.train (it writes config.json first).")
  with open(path) as f:
    return spec.upgrade(ml_collections.ConfigDict(json.load(f)))


def evaluate_run(workdir: str, *, env: str | None = None, num_levels: int | None = None,
                 temperature: float | None = None, greedy: bool = False,
                 group_size: int = 1, samples: int | None = None,
                 output: str | None = None, legend: bool = True) -> dict[str, Any]:
  """Evaluates the latest checkpoint of ``workdir``; writes and returns the results.

  See the module docstring for what is played and written.

  Args:
    workdir: a run directory of ``experiments.train`` (``config.json`` and at
      least one checkpoint).
    env: a registered environment id (None: the run's ``config.env``); another
      env is played with its own limits and prompt (:func:`cross_env_config`).
    num_levels: held-out initial states (None: the run's ``eval.num_levels``).
    temperature: sampling temperature > 0 (None: the run's
      ``eval.temperature``); ignored when ``greedy``.
    greedy: decode greedily.
    group_size: G >= 1 episodes per initial state.
    samples: decoded trajectories to keep (None: the run's ``eval.samples``).
    output: JSON path (None: ``<workdir>/`` + :func:`output_name`).
    legend: on another env, tell the model its legend in the system message.

  Returns:
    The dict written to ``output`` (metrics as floats, ``samples`` a list,
    ``output`` the path).

  Raises:
    ValueError: a missing directory, ``config.json`` or checkpoint (naming
      the path), an unregistered ``env``, one whose symbols the run's
      tokenizer cannot render or whose prompt the model's context cannot
      hold (naming ``--env``), ``num_levels`` / ``group_size`` < 1, a
      non-positive ``temperature``, or what the Experiment raises for the
      resulting config (naming the field) — all before any compile.
  """
  config = load_config(workdir)
  for name, v in (("num_levels", num_levels), ("group_size", group_size),
                  ("samples", samples)):
    if v is not None:
      jagent.check_int(f"--{name}", v, 0 if name == "samples" else 1, error=fields.ConfigError)
  if temperature is not None and not (temperature > 0 and math.isfinite(temperature)):
    raise fields.ConfigError(f"--temperature={temperature!r} must be a positive finite float")
  train_env = config.env
  config, legend_added = cross_env_config(config, env or train_env, legend=legend)
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
  config.mesh = ""
  try:
    exp = experiment.Experiment(config)  # validates (naming config.<field>)
  except ValueError as e:
    if config.env == train_env:
      raise
    hint = " (its prompt included the legend; --nolegend leaves it out)" if legend_added else ""
    raise fields.ConfigError(f"--env={config.env!r} cannot be played by the run in {workdir!r} "
                             f"(trained on {train_env}): {e}{hint}") from e
  c = config

  ckpt = exp.checkpointer(workdir)
  try:
    if ckpt.latest_step() is None:
      raise fields.ConfigError(f"no checkpoint in {ckpt.directory}: the run in {workdir!r} has not "
                               "saved one yet (experiments.train saves after SFT).")
    # The newest checkpoint that reads back (from any mesh); a damaged one is skipped.
    step, state, _, skipped = exp.restore_newest(ckpt, workdir)
  finally:
    ckpt.close()
  for line in skipped:
    print(line, flush=True)

  eval_config = blocks.eval_rollout_config(c, greedy=greedy, group_size=group_size,
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
      "legend": legend_added, "system": c.prompt.system,
      **{k: c.rollout[k] for k in ("max_turns", "max_actions_per_traj",
                                   "max_tokens_per_turn")},
  }
  result.update({k: float(v) for k, v in metrics.items()})
  result["samples"] = train.decode_samples(sharding.to_host(traj), exp.tokenizer,
                                           c.eval.samples)
  output = output or os.path.join(workdir, output_name(
      c.env, greedy=greedy, temperature=c.eval.temperature, num_levels=c.eval.num_levels,
      group_size=group_size, legend=legend_added))
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  train.write_json(output, result)
  result["output"] = output
  return result


def _print(result: dict[str, Any]) -> None:
  how = "greedy" if result["greedy"] else f"temperature {result['temperature']}"
  print(f"{result['env']} (trained on {result['train_env']}, {result['algorithm']}), "
        f"checkpoint step {result['checkpoint_step']}, {result['num_levels']} levels x "
        f"G={result['group_size']}, {how}, {result['max_turns']} turns / "
        f"{result['max_actions_per_traj']} actions / {result['max_tokens_per_turn']} reply "
        f"tokens{', legend in the prompt' if result['legend'] else ''}:")
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
    raise app.UsageError("--workdir is empty (a run directory of experiments.train; default "
                         f"{common.DEFAULT_WORKDIR}).")
  if _OUTPUT.value:  # written after the evaluation: refused before it
    cli.check_writable(os.path.dirname(os.path.abspath(_OUTPUT.value)), "--output")
  else:
    cli.check_writable(_WORKDIR.value, "--workdir")
  common.setup_compilation_cache()
  result = evaluate_run(
      _WORKDIR.value, env=_ENV.value, num_levels=_NUM_LEVELS.value,
      temperature=_TEMPERATURE.value, greedy=_GREEDY.value, group_size=_GROUP_SIZE.value,
      samples=_SAMPLES.value, output=_OUTPUT.value, legend=_LEGEND.value)
  _print(result)


if __name__ == "__main__":
  cli.run(main)
