r"""The main job: SFT warm start, then RL, evaluated on fixed held-out levels.

    python -m experiments.train                      # the default config and workdir
    python -m experiments.train --config=experiments/configs/tiny.py:FrozenLake-4x4-v0,grpo \
        --config.rl.steps=100 --workdir=/tmp/lake_grpo

Stages (each checkpointed; an existing workdir resumes where it stopped):
1. SFT: behaviour cloning on ``sft.num_demos`` expert demonstrations (BFS
   solvers rendered as assistant replies, ``jagent.rollout.demonstrations``),
   because a tiny model starts at zero success.
2. RL: ``rl.steps`` iterations of rollout (``rollout.num_groups`` initial
   states x ``rollout.group_size``) -> uncertainty filter (kept groups gathered
   into a smaller batch) -> the objective ``algorithm`` (advantages, losses)
   -> updates.
3. Evaluation on ``eval.num_levels`` fixed held-out initial states (seeds from
   ``eval.seed``) at temperature ``eval.temperature`` (RAGEN: 0.5) and
   greedily (``eval.greedy``), after SFT, every ``eval.every`` RL steps and at
   the end; each prints one line under the progress bar with 95% Wilson
   intervals over the levels (:func:`evaluation_line`).

The stages are :class:`experiments.stages.Stages`' programs (those
``experiments.sweep`` vmaps), run K steps a program call: K is the
evaluation/checkpoint/diagnostics interval (``--chunk_steps`` overrides it;
the results do not depend on it), and the per-step records are unstacked
from each call's metrics.

A step whose filter kept no group trains nothing: its update metrics are not
written (rather than as zeros), ``train/skipped_steps`` counts it, the bar
shows ``skipped=N``, and ``--config.rl.empty_stop_steps=N`` stops the run
after N such steps in a row (RAGEN's ``rollout_filter_empty_stop_steps``).
absl's INFO messages (orbax, jax) are off unless ``--verbosity=0`` is passed
(``experiments.common.quiet_logs``).

Writes to ``--workdir``: ``metrics.jsonl`` and TensorBoard events (every
step), ``curves.png`` (the key curves first: held-out success against the SFT
baseline, training success, in-group reward std, entropy, prompt-reply mutual
information, grad norm; see :func:`curve_panels`), ``samples/<stage>.json`` (decoded trajectories),
checkpoints, ``policy/`` (a Hugging Face directory of the final policy) and
``eval_summary.json``::

  {"env": ..., "algorithm": ..., "sft": {"success": ..., "success_ci95": [lo, hi], ...},
   "rl": {"success": ..., ...}, "steps": ..., "stopped": null or why, "seconds": ...}

Devices: ``--config.mesh="data:8"`` (or ``"data:2,fsdp:2,tensor:2"``, see
``jagent.sharding.make_mesh``; default ``""``: one device) runs the stages on
a mesh of every device jax sees. Several processes (hosts): start the same
command on each with ``--distributed`` (``jax.distributed.initialize``; on
Cloud TPU, Slurm and Open MPI the coordinator, process count and id are
detected, elsewhere pass ``--coordinator_address=host:port``,
``--num_processes`` and ``--process_id``); the mesh then spans all processes'
devices, every process writes its part of each checkpoint (same
``--workdir`` on a shared file system) and process 0 writes everything else.
"""

from __future__ import annotations

import json
import math
import os
import time

from absl import flags
from absl import logging
import jax
import tqdm

from experiments import cli
from experiments import common
from experiments import experiment
from experiments import fields
from experiments import stages
from experiments import stats

_CONFIG = cli.define_config_flag()  # a bad --config ends the program with one line
_WORKDIR = flags.DEFINE_string(
    "workdir", common.DEFAULT_WORKDIR, "Output directory; an existing run there resumes.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False,
    "Call jax.distributed.initialize before anything else (multi-process runs). Without "
    "the three flags below jax detects them (Cloud TPU, Slurm, Open MPI).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0's coordinator (--distributed).")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Number of processes (--distributed).")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None, "This process's id in [0, num_processes) (--distributed).")
_CHUNK = flags.DEFINE_integer(
    "chunk_steps", 0, "Steps per program call (0: the evaluation/checkpoint/diagnostics "
    "interval); the results do not depend on it.", lower_bound=0)

# The metrics the panels of curves.png draw (curve_panels), RAGEN's Echo Trap
# diagnostics among them (Wang et al., arXiv 2504.20073). (Every key of the ~80 in
# metrics.jsonl would take ~20 s to draw and be unreadable.)
CURVE_KEYS = (
    "eval/sft/success", "eval/success", "eval/rl/success", "eval/sft/greedy_success",
    "eval/greedy_success", "eval/rl/greedy_success", "rollout/success",
    "rollout/pass_at_group", "filter/reward_std_before", "filter/reward_std_after",
    "actor/entropy", "collapse/reply_entropy", "collapse/mutual_info",
    "collapse/mutual_info_max", "train/grad_norm",
    "train/grad_norm_max", "policy/clip_frac", "rollout/reply_tokens",
    "rollout/valid_action_frac", "rollout/effective_action_frac", "rollout/score", "sft/nll",
    "throughput/rollout_tokens_per_s")


def curve_smoothing(rl_steps: int) -> float:
  """The EMA weight of curves.png's per-step series: a window of ~1/20 of the run.

  ``1 - 20 / rl_steps`` (time constant ``rl_steps / 20`` steps), within
  ``[0.5, 0.98]``, to two decimals: 0.96 for 500 steps, 0.8 for 100, 0.5 up
  to 40.
  """
  return round(min(0.98, max(0.5, 1.0 - 20.0 / max(rl_steps, 1))), 2)


def curve_panels(config, held_out_removed: int | None = None) -> tuple:
  """The panels of ``curves.png`` for a run of ``config`` (``jagent.train.PlotPanel``).

  The key panels first (two rows at four a row): held-out success at the
  evaluation temperature and greedy, each against its SFT value as a dashed
  line (the evaluations after SFT, every ``eval.every`` steps and after RL as
  points on a 0-1 axis); training success; the in-group reward std before and
  after the filter; policy entropy (with RAGEN-2's reply entropy ``H(Z|X)``
  when written); the mutual information ``I(X;Z)`` of prompts and replies
  against its bound (when written) and the grad norm against the clipping
  threshold. Then clip fraction, reply length, valid actions, score,
  SFT NLL and rollout throughput. Per-step series are drawn raw and faint under
  an EMA (:func:`curve_smoothing`); a step that trained nothing is a gap in
  the update metrics (entropy, grad norm, clip fraction, kept std: not
  written), not a drop to 0; panels whose metrics a run does not write are
  left out.

  Args:
    config: the run's config (``experiments/configs/tiny.py``'s fields).
    held_out_removed: the run's ``experiment.Experiment.eval_levels_removed``: -1
      when the game has too few distinct levels to hold any out, so the plain
      levels were evaluated (and the run warned); the evaluation panels then
      say "plain levels", as they do without ``eval.held_out``.

  Returns:
    a tuple of ``jagent.train.PlotPanel``; the keys they draw (lines and
    baselines) are :data:`CURVE_KEYS`.
  """
  from jagent import train  # pylint: disable=g-import-not-at-top
  P, S = train.PlotPanel, train.PlotSeries  # pylint: disable=invalid-name
  ev, ro = config.eval, config.rollout
  smooth = curve_smoothing(config.rl.steps)
  steps = (0, config.rl.steps)  # one x axis for every RL panel
  rl = {"smoothing": smooth, "min_step": 1, "xlim": steps}  # SFT writes steps <= 0
  held_out = ev.held_out and held_out_removed != -1
  levels = f"{ev.num_levels} {'held-out' if held_out else 'plain'} levels"
  # RAGEN-2's collapse/*: a few steps only.
  every = f", every {config.diagnostics.every} steps" if config.diagnostics.every else ""
  grad_norm = [S("train/grad_norm", "mean over updates")]
  if config.rl.num_minibatches * config.rl.ppo_epochs > 1:  # else max == mean
    grad_norm.append(S("train/grad_norm_max", "max over updates"))
  return (
      P(f"Eval success (T={ev.temperature:g}, {levels})",
        S(("eval/sft/success", "eval/success", "eval/rl/success"), "evaluations",
          sparse=True),
        ylim=(0.0, 1.0), xlim=steps, baseline="eval/sft/success", baseline_label="after SFT"),
      P(f"Eval greedy success ({levels})",
        S(("eval/sft/greedy_success", "eval/greedy_success", "eval/rl/greedy_success"),
          "evaluations", sparse=True),
        ylim=(0.0, 1.0), xlim=steps, baseline="eval/sft/greedy_success",
        baseline_label="after SFT"),
      P(f"Training success (rollouts, T={ro.temperature:g}, "
        f"{ro.num_groups * ro.group_size} episodes/step)",
        (S("rollout/success", "success"),
         S("rollout/pass_at_group", f"pass@{ro.group_size} (any of its group)")),
        ylim=(0.0, 1.0), **rl),
      P("In-group reward std (episode return)",
        (S("filter/reward_std_before", "all groups (before filter)"),
         S("filter/reward_std_after", "kept groups (after filter)")), **rl),
      P("Policy entropy (nats/token)",
        (S("actor/entropy", "training batch"),
         S("collapse/reply_entropy", f"reply entropy H(Z|X){every}", sparse=True)), **rl),
      P("Mutual information I(X;Z), prompt vs reply (nats/token)",
        S("collapse/mutual_info", f"I(X;Z){every}", sparse=True),
        baseline="collapse/mutual_info_max", baseline_label="bound log(prompts)", **rl),
      P("Grad norm (L2, before clipping)",
        tuple(grad_norm), baseline=config.rl.max_grad_norm, baseline_label="clipped at",
        **rl),
      P("PPO clip fraction (share of reply tokens)", "policy/clip_frac", **rl),
      P("Reply length (tokens/turn)", "rollout/reply_tokens", **rl),
      P("Valid actions (share)",
        (S("rollout/valid_action_frac", "valid / parsed"),
         S("rollout/effective_action_frac", "moved the state / executed")),
        ylim=(0.0, 1.0), **rl),
      P(f"Training score (episode return, T={ro.temperature:g})", "rollout/score", **rl),
      P("SFT NLL (nats/token, the steps before RL)", S("sft/nll", sparse=True),
        xlim=(-config.sft.steps, 0)),
      P("Rollout throughput (sampled tokens/s)", "throughput/rollout_tokens_per_s", **rl),
  )


def curve_title(config) -> str:
  """The title of ``curves.png``: env, algorithm, model, RL steps and seed of ``config``."""
  return (f"{config.env} · {config.algorithm} · model {config.model} · "
          f"{config.rl.steps} RL steps · seed {config.seed}")


class _NoWriter:
  """The metrics writer of processes other than 0: writes nothing."""

  def write(self, step, metrics):
    del step, metrics

  def plot(self, path, keys=None, **kwargs):
    del path, keys, kwargs

  def close(self):
    pass


def warn_collapse(config, step: int, metrics: dict, *, progress: bool = True,
                  recent: list[dict] | None = None) -> str | None:
  """Logs the Echo Trap warning of logged step ``step`` (``stats.collapse_alert``), if any.

  ``recent``: the metrics of the steps since the previous diagnosed step
  (this one's last), whose means the per-step floors compare.

  With ``progress`` the line is written once, under the progress bar
  (``tqdm.write``), and logged at INFO (``--verbosity=0`` shows it there
  too); without, it goes to ``logging.warning``. It is returned (None
  without a warning).
  """
  line = stats.collapse_alert(config, step, metrics, recent)
  if line and progress:
    tqdm.tqdm.write(line)
    logging.info(line)
  elif line:
    logging.warning(line)
  return line


def initialize_distributed(distributed: bool, coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None) -> None:
  """``jax.distributed.initialize`` for a multi-process run (before any jax work).

  Args:
    distributed: False does nothing (a single process).
    coordinator_address: ``host:port`` of process 0, or None to let jax
      detect it (Cloud TPU, Slurm, Open MPI, Kubernetes).
    num_processes: the process count, or None (detected).
    process_id: this process's id in ``[0, num_processes)``, or None
      (detected).

  Raises:
    ValueError: a coordinator, count or id given without ``distributed``, or
      a ``process_id`` outside ``[0, num_processes)``.
  """
  given = {k: v for k, v in (("coordinator_address", coordinator_address),
                             ("num_processes", num_processes),
                             ("process_id", process_id)) if v is not None}
  if not distributed:
    if given:
      raise fields.ConfigError(f"--{next(iter(given))}={next(iter(given.values()))!r} needs "
                               "--distributed.")
    return
  if num_processes is not None and num_processes < 1:
    raise fields.ConfigError(f"--num_processes={num_processes!r} must be >= 1.")
  if process_id is not None and (process_id < 0 or (
      num_processes is not None and process_id >= num_processes)):
    raise fields.ConfigError(f"--process_id={process_id!r} must be in [0, --num_processes="
                             f"{num_processes}).")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)
  logging.info("process %d of %d, %d local of %d devices", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())


def announce(line: str, progress: bool = True) -> str:
  """Logs ``line`` (INFO) and, with ``progress``, writes it under the progress bar; returns it."""
  logging.info(line)
  if progress:
    tqdm.tqdm.write(line)
  return line


def evaluation_line(config, label: str, step: int, metrics: dict) -> str:
  """The one line of an evaluation, e.g. after RL at step 500::

    eval after RL (step 500): success 0.479 [0.436, 0.523] at T=0.5, greedy 0.471
    [0.428, 0.515] (512 levels, 95% Wilson intervals)

  Args:
    config: the run's config (``eval.temperature``, ``eval.num_levels``).
    label: ``"after SFT"``, ``"during RL"`` (every ``eval.every`` steps) or
      ``"after RL"``.
    step: the RL step of the evaluation (0 after SFT).
    metrics: ``success`` and ``success_ci95`` (and, with a greedy
      evaluation, ``greedy_success`` and ``greedy_success_ci95``), as
      :meth:`experiments.experiment.Experiment.evaluate_all` returns them.
  """
  def rate(key):
    lo, hi = metrics[f"{key}_ci95"]
    return f"{metrics[key]:.3f} [{lo:.3f}, {hi:.3f}]"

  line = (f"eval {label} (step {step}): success {rate('success')} at "
          f"T={config.eval.temperature:g}")
  if "greedy_success" in metrics:
    line += f", greedy {rate('greedy_success')}"
  return line + f" ({config.eval.num_levels} levels, 95% Wilson intervals)"


def _postfix(m: dict, skipped: int, mutual_info: float | None) -> dict:
  """The progress bar's postfix of a step's metrics ``m``; ``-`` for what it did not measure."""
  def fmt(key):
    v = m.get(key, math.nan)
    return f"{v:.2f}" if math.isfinite(v) else "-"

  out = {"success": fmt("rollout/success"), "score": fmt("rollout/score"),
         "std": fmt("filter/reward_std_before"), "entropy": fmt("actor/entropy")}
  if mutual_info is not None:
    out["mi"] = f"{mutual_info:.2f}"
  if skipped:
    out["skipped"] = str(skipped)
  return out


# Config fields a resumed run may change: how long it trains and how it
# checkpoints and reports, not what it trains.
RESUMABLE_CHANGES = ("rl.steps", "checkpoint.every", "checkpoint.keep", "eval.every",
                     "eval.samples")


def _flat(tree, prefix=""):
  if not isinstance(tree, dict):
    return {prefix: tree}
  out = {}
  for k, v in tree.items():
    out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
  return out


def check_resumable(config, workdir: str) -> None:
  """Refuses to resume ``workdir``'s checkpoints under another config.

  A checkpoint is resumed only by the config that wrote it (its
  ``config.json``), up to :data:`RESUMABLE_CHANGES`; otherwise a changed
  default or flag would silently continue (or, when finished, re-report) the
  old run. Fields that only one of the two configs has (added or removed
  since) are not compared; a workdir without ``config.json`` is not checked.

  Raises:
    ConfigError: (a ValueError) naming the differing fields (old -> new, at
      most 8) and what to do, before anything is restored.
  """
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return
  with open(path) as f:
    old = _flat(json.load(f))
  new = _flat(json.loads(config.to_json_best_effort()))
  # Fields one side lacks (added or removed since) are not compared.
  diffs = [k for k in sorted(set(old) & set(new))
           if old[k] != new[k] and k not in RESUMABLE_CHANGES]
  if diffs:
    shown = ", ".join(f"config.{k}: {old[k]!r} -> {new[k]!r}" for k in diffs[:8])
    more = f" and {len(diffs) - 8} more" if len(diffs) > 8 else ""
    raise fields.ConfigError(
        f"--workdir={workdir} holds checkpoints of another config ({shown}{more}); a run "
        f"resumes only under the config that wrote it (up to {', '.join(RESUMABLE_CHANGES)}). "
        "Pass a new --workdir, or delete that one to start over.")


def run(config, workdir: str, *, progress: bool = True, chunk: int | None = None) -> dict:
  """Runs SFT, RL and evaluation (resuming from ``workdir``); returns the summary.

  The stages run as :class:`experiments.stages.Stages`' chunks on the run's
  mesh, ``chunk`` steps a program call (None or 0: RL's
  :func:`experiments.stages.train_chunk`, the evaluation/checkpoint/diagnostics
  interval, and SFT's :func:`experiments.stages.sft_chunk_end`); every chunk
  ends on the steps that evaluate, checkpoint, warn or may stop, and the
  per-step records (``metrics.jsonl``, the progress bar) are unstacked from
  the chunk's metrics. The results do not depend on ``chunk``.

  In a multi-process run every process calls it with the same config and
  ``workdir``; checkpoints are written by all, every other file by process
  0, and every process returns the summary.

  A step that applied no update (``train/updates_applied`` 0: the filter
  kept no group) writes no update metrics (NaN, left out of
  ``metrics.jsonl``) and counts in ``train/skipped_steps`` and the progress
  bar's ``skipped``; after ``rl.empty_stop_steps`` (> 0) such steps in a row
  the run stops there (RAGEN's ``rollout_filter_empty_stop_steps``), still
  evaluates, and the summary's ``stopped`` says why (None when it ran every
  step). The final checkpoint is written after the final evaluation and holds
  its result, so a rerun of a finished run, or of one killed before its
  summary, evaluates nothing again and writes each record once.

  Raises:
    ValueError: a bad config (naming the field), or a ``workdir`` holding
      checkpoints of another config (:func:`check_resumable`), before
      anything compiles.
  """
  from jagent import train  # pylint: disable=g-import-not-at-top
  t_start = time.time()
  exp = experiment.Experiment(config)  # validates the whole config first
  config = exp.config  # upgraded (experiments.spec.upgrade)
  rl_chunk = stages.train_chunk(config, chunk)  # a bad chunk fails here
  primary = exp.is_primary
  os.makedirs(workdir, exist_ok=True)
  progress = progress and primary
  ckpt = exp.checkpointer(workdir)
  last = ckpt.latest_step()
  if last is not None:
    check_resumable(config, workdir)
    # The newest checkpoint that reads back (a damaged one is skipped, said, kept).
    last, state, meta, skipped = exp.restore_newest(ckpt, workdir)  # onto config.mesh
    for line in skipped:
      announce(line, progress)
  if primary:
    train.write_text(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
  # Without a checkpoint the run starts over: drop every record of an attempt
  # that died before checkpoint 0 (its SFT records, steps -sft.steps+1..0).
  resume_step = last if last is not None else -config.sft.steps - 1
  writer = (train.MetricsWriter(workdir, resume_step=resume_step, tensorboard=True) if primary
            else _NoWriter())
  steps = config.rl.steps
  # Host counters of the steps that trained nothing: in all, and in a row.
  counts = {"skipped_steps": 0, "empty_streak": 0}
  if last is None:  # ---- SFT warm start, then the RL state at step 0.
    params = exp.sft(writer, progress=progress, chunk=chunk)
    summary = {"env": config.env, "algorithm": config.algorithm,
               "sft": exp.evaluate_all(params, "sft", workdir)}
    writer.write(0, {f"eval/sft/{k}": v for k, v in summary["sft"].items()
                     if isinstance(v, float)})
    announce(evaluation_line(config, "after SFT", 0, summary["sft"]), progress)
    state = exp.rl_state(params)
    ckpt.save(0, state, {"summary": summary, "seconds": time.time() - t_start, **counts})
  else:  # ---- resume (restored above).
    summary = meta["summary"]
    counts = {k: int(meta.get(k, 0)) for k in counts}  # absent in runs saved before them
    t_start -= meta.get("seconds", 0.0)
    announce(f"resuming from step {last} of {steps} in {workdir}", progress)
  saved = int(state.step)

  def save():
    nonlocal saved
    ckpt.save(int(state.step), state,
              {"summary": summary, "seconds": time.time() - t_start, **counts})
    saved = int(state.step)

  if "rl" not in summary:  # ---- RL, then the final evaluation (else: both done).
    stop_after = config.rl.empty_stop_steps
    stopped = None
    bar = tqdm.tqdm(total=steps, initial=int(state.step), disable=not progress,
                    desc=f"{config.algorithm} on {config.env}")
    mutual_info = None
    # The steps since the last diagnosed one (after a resume: since the resume),
    # kept only when the diagnostics run: otherwise nothing ever empties it.
    recent = []
    every = config.diagnostics.every
    ckpt_every = config.checkpoint.every  # 0: only after the last step
    start = int(state.step)
    while start < steps and stopped is None:
      # One program call: the chunk ends on every evaluation, checkpoint,
      # diagnosed step and possible stop, so the host acts at its end.
      stop = stages.chunk_end(config, start, rl_chunk, counts["empty_streak"])
      state, records = exp.rl_chunk(state, start, stop)  # time/step_seconds included
      for step, m in zip(range(start, stop), records):
        if m["train/updates_applied"] > 0:
          counts["empty_streak"] = 0
        else:
          counts["skipped_steps"] += 1
          counts["empty_streak"] += 1
        m["train/skipped_steps"] = float(counts["skipped_steps"])
        if stop_after and counts["empty_streak"] >= stop_after:
          stopped = (f"stopped after step {step + 1} of {steps}: {counts['empty_streak']} "
                     f"steps in a row trained nothing (the filter kept no group; "
                     f"rl.empty_stop_steps={stop_after})")
        if (config.eval.every and (step + 1) % config.eval.every == 0 and step + 1 < steps
            and stopped is None):  # (the final evaluation follows a stop)
          ev = exp.evaluate(state.params)  # the chunk's last step (chunk_end)
          ev.update(exp.evaluate_greedy(state.params))
          m.update({f"eval/{k}": v for k, v in ev.items()})
          announce(evaluation_line(config, "during RL", step + 1,
                                   {**ev, **exp.success_intervals(ev)}), progress)
        writer.write(step + 1, m)
        if every:
          recent.append(m)
          if stats.diagnostics_due(step, every):  # a diagnosed step: the window ends here
            warn_collapse(config, step + 1, m, progress=progress, recent=recent)
            recent = []
            mi = m.get("collapse/mutual_info", math.nan)
            mutual_info = mi if math.isfinite(mi) else mutual_info  # the last diagnosed
        bar.update(1)
        bar.set_postfix(_postfix(m, counts["skipped_steps"], mutual_info))
      if (stopped is None and ckpt_every and stop % ckpt_every == 0 and stop < steps):
        save()
      start = stop
    bar.close()
    if stopped is not None:
      announce(stopped, progress)
    summary["rl"] = exp.evaluate_all(state.params, "rl", workdir)
    summary["steps"] = int(state.step)
    summary["stopped"] = stopped
    writer.write(int(state.step), {f"eval/rl/{k}": v for k, v in summary["rl"].items()
                                   if isinstance(v, float)})
    announce(evaluation_line(config, "after RL", int(state.step), summary["rl"]), progress)
    if saved != int(state.step):  # (a run saved before this order has it already)
      save()  # after the evaluation it holds: a rerun writes no record twice
  ckpt.close()
  summary["seconds"] = round(time.time() - t_start, 1)
  writer.plot(os.path.join(workdir, "curves.png"), panels=curve_panels(
      config, getattr(exp, "eval_levels_removed", None)), ncols=4,
              title=curve_title(config))
  writer.close()
  exp.export(workdir, state.params)
  if primary:
    # Whole or not at all: its presence marks a finished run (experiments.compare).
    train.write_json(os.path.join(workdir, "eval_summary.json"), summary)
  return summary


def stopped_line(config, workdir: str) -> str:
  """The line of a run ended by SIGTERM: which checkpoint a rerun resumes from.

  Reads the newest checkpoint on disk (a save is renamed into place whole,
  so one cut short is not listed), e.g. ``stopped by SIGTERM; rerunning the
  same command resumes from checkpoint 30 of 40 RL steps in /w``.
  """
  from jagent import train  # pylint: disable=g-import-not-at-top
  last = (train.Checkpointer(workdir, keep=config.checkpoint.keep, async_save=False)
          .latest_step() if os.path.isdir(workdir) else None)
  if last is None:
    return ("stopped by SIGTERM before the first checkpoint (written after SFT); rerunning "
            "the same command starts the run over")
  return (f"stopped by SIGTERM; rerunning the same command resumes from checkpoint {last} "
          f"of {config.rl.steps} RL steps in {workdir}")


def main(argv):
  del argv
  initialize_distributed(_DISTRIBUTED.value, _COORDINATOR.value, _NUM_PROCESSES.value,
                         _PROCESS_ID.value)
  cli.check_writable(_WORKDIR.value, "--workdir")
  common.setup_compilation_cache()
  try:
    summary = run(_CONFIG.value, _WORKDIR.value, chunk=_CHUNK.value)
  except cli.Terminated:
    raise cli.Terminated(stopped_line(_CONFIG.value, _WORKDIR.value)) from None
  if jax.process_index() == 0:
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
  cli.run(main)
