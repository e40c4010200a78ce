r"""Many runs of one config as one vmapped program per stage (PureJaxRL style).

    python -m experiments.sweep --config=experiments/configs/tiny.py:Bandit-v0,starpo_s \
        --seeds=4 --workdir=/tmp/bandit_sweep
    python -m experiments.sweep --config=experiments/configs/tiny.py:Bandit-v0,starpo_s \
        --seeds=2 --sweep=rl.learning_rate=1e-4,3e-4,1e-3

Run ``i`` of ``--seeds=N`` is the run of :mod:`experiments.train` with
``config.seed + i``; ``--sweep=<field>=<v1>,<v2>,...`` adds the values of one
float hyperparameter (every seed for every value: ``N x V`` runs). The runs
share one program per stage: the run's own stage programs
(:class:`experiments.stages.Stages`, those :mod:`experiments.train` runs),
vmapped over a leading run axis of the TrainState and of the keys
(:func:`experiments.stages.over_runs`, as PureJaxRL's
``jax.jit(jax.vmap(train))(keys)``, https://github.com/luchris429/purejaxrl):

1. SFT: ``sft.steps`` :func:`jagent.train.sft_step` updates (``lax.scan``) on
   each run's own demonstrations and minibatch draws. With ``--sft_dir`` the
   parameters after SFT are written there, and a later sweep whose runs
   have the same SFT fields (another algorithm, other RL fields) reads them
   back instead of running SFT (:mod:`experiments.sft_store`).
2. RL: ``rl.steps`` :func:`jagent.train.rl_iteration` iterations (rollout ->
   filter -> advantages -> updates) with each run's rollout keys, ``lax.scan``
   over ``--chunk_steps`` keys a call (default ``eval.every``, else a tenth
   of the steps; the results do not depend on it), a progress line after
   each call (steps, seconds, reward and training success per run) and a
   warning when a run trained nothing ``--warn_after`` steps in a row (the
   filter kept no group: ``train/skipped_steps`` of experiments.train).
3. Evaluation after SFT and after RL on the fixed held-out levels, at
   ``eval.temperature`` and (``eval.greedy``) greedily.

Each run's keys, demonstrations and minibatches are those of
:class:`experiments.experiment.Experiment` for its config. With
``--batching=map`` (``lax.map`` over the runs inside the same programs) every
run equals its separate run (:mod:`experiments.train`'s stages) bit for bit.
With ``vmap`` (the default) the batched operations round differently (~1e-7),
and training amplifies that: Adam's normalised first updates flip on
near-zero gradients and the flipped parameters change later samples, so the
runs follow the same distribution as the separate runs but not the same
trajectory (measured on CPU: parameters 1e-6 to 3e-5 apart after one update,
up to 0.1 after 40 SFT and 3 RL steps). Only hyperparameters that enter the
program as values can be swept (:data:`SWEEPABLE`: the learning rates); one that changes shapes or
static configuration (group counts, model, algorithm, ...) needs one program
per value: run those separately (``experiments.compare --set``).

With LoRA (``config.lora.rank > 0``) on a loaded base (``config.model_dir``)
the runs share ONE copy of the frozen base: only the adapters, their
optimizer state and the keys carry the run axis (the programs take the base
unbatched, ``in_axes=None``), so R runs of a 0.5B policy hold one base, not
R. The base is loaded once. Runs whose bases differ (a random base per seed,
``model_dir`` empty) keep a base each (the summary's ``"shared_base"``).

Prints a table of per-run success, ``train/skipped_steps`` (RL steps that
trained nothing; a sweep none of whose steps trained says so under the
table) and mean +- std (sample std over the seeds of each value) and writes
``<workdir>/sweep_summary.json``::

  {"env": ..., "algorithm": ..., "field": "rl.learning_rate" | null, "batching": "vmap",
   "rl_steps": ...,
   "runs": [{"seed": 0, "value": ..., "sft": {"success": ..., "greedy_success": ...,
             ...}, "rl": {...}, "rl_train_success": ..., "skipped_steps": ...,
             "curves": {"rollout/success": [<per RL step>], ...}}, ...],
   "groups": [{"value": ..., "seeds": [...], "sft": {"success": {"mean": ..., "std": ...},
               ...}, "rl": {...}}, ...],
   "seconds": {"sft": ..., "rl": ..., "eval": ..., "total": ...}}
"""

from __future__ import annotations

import math
import os
import time

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments import cli
from experiments import common
from experiments import experiment
from experiments import fields
from experiments import programs
from experiments import sft_store
from experiments import spec
from experiments import stages
import jagent
from jagent import models
from jagent import train
from jagent import transforms

# Config fields a sweep can vmap: they enter the program as float32 values.
SWEEPABLE = stages.SWEEPABLE
# Evaluation figures kept per stage (the greedy ones when eval.greedy).
EVAL_KEYS = ("success", "score", "format_valid_frac")
# RL metrics kept per step of each run (the summary's "curves"): what a
# comparison plots (training success, in-group reward std before and after
# the filter, policy entropy, reply format) and its x axis at equal budgets
# (sampled tokens).
CURVE_KEYS = ("rollout/success", "rollout/format_valid_frac", "filter/reward_std_before",
              "filter/reward_std_after", "actor/entropy", "rollout/sampled_tokens")


def parse_sweep(spec: str | None, config) -> tuple[str | None, tuple[float, ...]]:
  """Parses ``<field>=<v1>,<v2>,...`` into ``(field, values)``.

  Args:
    spec: the ``--sweep`` text, or None / ``""`` for no sweep.
    config: the base config (to tell a missing field from a static one).

  Returns:
    ``(field, values)``; ``(None, (nan,))`` without a sweep.

  Raises:
    ValueError: naming the spec: no ``=`` or no value, a field the config
      lacks, a field that cannot be vmapped (not in :data:`SWEEPABLE`), or a
      value that is not a positive finite float.
  """
  if not spec:
    return None, (math.nan,)
  field, sep, text = spec.partition("=")
  if not sep or not text.strip():
    raise fields.ConfigError(f"--sweep={spec!r}: expected <field>=<v1>,<v2>,... "
                             f"(e.g. rl.learning_rate=1e-4,3e-4)")
  try:
    fields.config_field(config, field)
  except fields.ConfigError as e:
    raise fields.ConfigError(f"--sweep={spec!r}: {e}") from None
  if field not in SWEEPABLE:
    raise fields.ConfigError(
        f"--sweep={spec!r}: {field!r} cannot be vmapped: it changes shapes or static "
        f"configuration, so each value is its own program (run them separately, e.g. "
        f"experiments.compare --set); sweepable fields: {SWEEPABLE}")
  values = []
  for item in text.split(","):
    try:
      v = float(item)
    except ValueError:
      raise fields.ConfigError(f"--sweep={spec!r}: {item!r} is not a float") from None
    if not (v > 0 and math.isfinite(v)):
      raise fields.ConfigError(f"--sweep={spec!r}: {field} must be a positive finite float; "
                               f"got {item!r}")
    values.append(v)
  return field, tuple(values)


def _set(config, field: str, value: float) -> None:
  *parents, name = field.split(".")
  node = config
  for p in parents:
    node = node[p]
  node[name] = value


def run_configs(config, seeds: int = 1, sweep: str | None = None) -> tuple[str | None, list]:
  """The configs of the runs: seeds ``config.seed + i`` for every swept value.

  Args:
    config: the base config (``experiments/configs/*.py``).
    seeds: runs per value (an int >= 1).
    sweep: ``<field>=<v1>,<v2>,...`` or None (see :func:`parse_sweep`).

  Returns:
    ``(field, [(seed, value, config), ...])``, value-major (``value`` NaN
    without a sweep).

  Raises:
    ValueError: a bad ``seeds`` or ``sweep`` (see :func:`parse_sweep`), a
      non-empty ``config.mesh``, a nonzero ``config.rl.empty_stop_steps``, or
      a bad config (:func:`experiments.spec.validate`, naming the field),
      all before anything compiles.
  """
  jagent.check_int("--seeds", seeds, 1, error=fields.ConfigError)
  config = spec.upgrade(config)
  if config.mesh:
    raise fields.ConfigError(f"config.mesh={config.mesh!r}: a sweep runs its runs as one program "
                             "on one device (vmapped); leave config.mesh empty (sharded sweeps "
                             "are not supported)")
  if config.rl.empty_stop_steps:
    raise fields.ConfigError(f"config.rl.empty_stop_steps={config.rl.empty_stop_steps!r}: a sweep "
                             "runs rl.steps iterations as one program and cannot stop a run early; "
                             "set it to 0 (experiments.train stops)")
  field, values = parse_sweep(sweep, config)
  out = []
  for value in values:
    for i in range(seeds):
      c = config.copy_and_resolve_references()
      c.seed = config.seed + i
      if field is not None:
        _set(c, field, value)
      spec.validate(c)
      out.append((c.seed, value, c))
  return field, out


# ------------------------------------------------------------------ programs
# The runs' batching of the stage programs (experiments.stages.over_runs).
BATCHINGS = stages.BATCHINGS
chunk_steps = stages.chunk_steps


def _hparams(field: str | None, prefix: str, values):
  """The chunk's ``hparams``: the swept value when ``field`` is one of this stage's."""
  return {field: values} if field and field.startswith(prefix) else {}


def sft_program(st: stages.Stages, field: str | None, batching: str = "vmap"):
  """The SFT stage of R runs as one program: ``jit`` of :func:`experiments.stages.over_runs`
  of :attr:`experiments.stages.Stages.sft_chunk`.

  ``(states, frozen, tokens, masks, indices, values) -> (params, metrics)``.

  ``frozen``: the runs' shared LoRA bases (:func:`experiments.stages.stack_sharing_bases`;
  ``[]`` for none), unbatched; ``states`` and the returned params lack them then.
  Per run (leading axis R): an SFT TrainState, its demonstrations' tokens
  and loss masks ``[D, S]``, its minibatch indices ``[steps, batch]`` and the
  swept value (the SFT learning rate when ``field == "sft.learning_rate"``,
  else unused). The metrics are :func:`jagent.train.sft_step`'s, ``[R, steps]``.
  """
  def one(state, frozen, tokens, mask, indices, value):
    state, metrics = st.sft_chunk(stages.join(state, frozen),
                                  transforms.Batch(tokens=tokens, loss_mask=mask), indices,
                                  _hparams(field, "sft.", value))
    return stages.cut(state, frozen).params, metrics

  key = ("sweep_sft", st.keys["sft"], field == "sft.learning_rate", batching)
  return programs.shared_program(
      key, lambda: jax.jit(stages.over_runs(one, batching, (0, None, 0, 0, 0, 0))))


def rl_program(st: stages.Stages, field: str | None, batching: str = "vmap"):
  """The RL stage of R runs as one program: ``jit`` of :func:`experiments.stages.over_runs`
  of :attr:`experiments.stages.Stages.rl_chunk`.

  ``(states, frozen, keys, values) -> (states, metrics)``.

  ``frozen``: the shared LoRA bases, unbatched, as in :func:`sft_program`.
  Per run (leading axis R): an RL TrainState, its rollout keys ``[K]``
  and the swept value (an RL learning rate when ``field`` is one, else
  unused). The metrics are ``jagent.train.rl_iteration``'s, ``[R, K]``.
  """
  def one(state, frozen, keys, value):
    state, metrics = st.rl_chunk(stages.join(state, frozen), keys, _hparams(field, "rl.", value))
    return stages.cut(state, frozen), metrics

  return programs.shared_program(
      ("sweep_rl", st.keys["rl"], field if field and field.startswith("rl.") else None, batching),
      lambda: jax.jit(stages.over_runs(one, batching, (0, None, 0, 0))))


def eval_program(st: stages.Stages, greedy: bool = False, batching: str = "vmap"):
  """The evaluation chunk of R runs as one program: ``jit`` of
  :func:`experiments.stages.over_runs` of :attr:`experiments.stages.Stages.eval_chunk`.

  ``(params, frozen, keys, reset_keys) -> (trajectories, {metric: [R]})``
  over a leading run axis of ``params`` and ``keys`` (``frozen``: the shared
  LoRA bases, unbatched, as in :func:`sft_program`; ``reset_keys``, one chunk
  of the fixed levels, shared by the runs); ``jagent.train.evaluate`` runs it
  over the chunks as :meth:`experiments.experiment.Experiment.evaluate` does.
  """
  def one(params, frozen, keys, reset_keys):
    return st.eval_chunk(stages.join(params, frozen), keys, reset_keys, greedy=greedy)

  key = ("sweep_eval", st.rollout_key("eval_greedy" if greedy else "eval_temp"), batching)
  return programs.shared_program(
      key, lambda: jax.jit(stages.over_runs(one, batching, (0, None, 0, None))))


# ---------------------------------------------------------------------- sweep
def _initial_params(exps) -> list:
  """Each run's initial policy; a LoRA base from ``config.model_dir`` is loaded
  once and shared (the same arrays in every run's tree)."""
  first = exps[0].init_params()
  if exps[0].lora_config is None or not exps[0].config.model_dir:
    return [first] + [e.init_params() for e in exps[1:]]
  return [first] + [e.with_lora(first.base) for e in exps[1:]]


def _evaluate(exp, st, params, frozen, keys, batching) -> list[dict]:
  """Per run: the :data:`EVAL_KEYS` figures (and ``greedy_*``)."""
  def figures(greedy):
    program = eval_program(st, greedy, batching)
    m, _ = train.evaluate(lambda p, k, rk: program(p, frozen, k, rk), params, exp.eval_keys,
                          keys, exp.config.eval.num_groups)
    return m

  m = figures(False)
  out = [{k: float(m[k][i]) for k in EVAL_KEYS} for i in range(len(keys))]
  if exp.config.eval.greedy:
    g = figures(True)
    for i, o in enumerate(out):
      o.update({f"greedy_{k}": float(g[k][i]) for k in EVAL_KEYS})
  return out


def _skipped(metrics) -> np.ndarray:
  """bool ``[R, steps]``: the steps whose filter kept no group (no update applied)."""
  return np.asarray(metrics["train/updates_applied"]) <= 0


def chunk_lines(start: int, stop: int, steps: int, seconds: float, metrics: dict,
                streaks: list[int], seeds: list[int], warn_after: int) -> list[str]:
  """The progress line of RL steps ``start+1..stop`` and any warnings; updates ``streaks``.

  The line: the steps, their seconds, and per run the mean training reward
  (``rollout/score``) and training success over the chunk, e.g.
  ``sweep RL steps 1-20 of 100 (31.2 s): reward per run -0.10 0.25; training
  success per run 0.00 0.31``. A warning names each run whose steps that
  trained nothing (``train/updates_applied`` 0: the filter kept no group,
  e.g. every reply's format invalid or every group's reward std 0) reached
  ``warn_after`` in a row in this chunk (once per such streak), with the
  streak's mean format-valid fraction and in-group reward std.

  Args:
    start: the chunk's first step (0-based); ``stop``: one past its last.
    steps: the run's RL steps (``rl.steps``).
    seconds: the chunk's wall time.
    metrics: the chunk's RL metrics, each ``[R, stop - start]``.
    streaks: per run, the steps in a row that trained nothing before this
      chunk; updated in place.
    seeds: per run, its seed (named in warnings).
    warn_after: the streak length that warns (>= 1).

  Returns:
    the progress line, then the warnings.
  """
  score = np.mean(np.asarray(metrics["rollout/score"], np.float64), axis=1)
  success = np.mean(np.asarray(metrics["rollout/success"], np.float64), axis=1)
  lines = [f"sweep RL steps {start + 1}-{stop} of {steps} ({seconds:.1f} s): reward per run "
           + " ".join(f"{x:.2f}" for x in score) + "; training success per run "
           + " ".join(f"{x:.2f}" for x in success)]
  skipped = _skipped(metrics)
  fmt = np.asarray(metrics["rollout/format_valid_frac"], np.float64)
  std = np.asarray(metrics["filter/reward_std_before"], np.float64)
  for i, row in enumerate(skipped):
    for j, empty in enumerate(row):
      streaks[i] = streaks[i] + 1 if empty else 0
      if empty and streaks[i] == warn_after:  # the streak just reached it
        first = start + j + 2 - warn_after  # 1-based
        lo = max(0, j + 1 - warn_after)
        lines.append(
            f"warning: run {i} (seed {seeds[i]}) trained nothing for {warn_after} RL steps in a "
            f"row (steps {first}-{start + j + 1}: the filter kept no group; format-valid "
            f"{np.mean(fmt[i, lo:j + 1]):.2f}, in-group reward std "
            f"{np.mean(std[i, lo:j + 1]):.2f} over this chunk's part of them)")
  return lines


def mean_std(xs) -> dict:
  """``{"mean", "std"}`` of a sequence of floats: the sample std (ddof 1), 0 for one value."""
  xs = np.asarray(xs, np.float64)
  return {"mean": float(np.mean(xs)), "std": float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0}


def hold_out(exps, seeds: int, also_held_out=()) -> None:
  """Gives every run one evaluation level set, held out of all their training levels.

  Sets each ``exps[i].eval_keys`` and ``eval_levels_removed``
  (:meth:`experiments.experiment.Experiment.held_out_keys`) to the levels of
  the first run's plain set that no run trained on, nor any run of the sweeps
  of ``also_held_out`` (base configs, each expanded to ``seeds`` runs by
  :func:`run_configs`).
  """
  trained = [e.trained_reset_keys() for e in exps] + [
      spec.trained_reset_keys(other) for base in also_held_out
      for _, _, other in run_configs(base, seeds)[1]]
  held, removed = exps[0].held_out_keys(jnp.concatenate(trained))
  for e in exps:
    e.eval_keys, e.eval_levels_removed = held, removed


def sweep(config, workdir: str | None = None, *, seeds: int = 1,
          sweep_spec: str | None = None, batching: str = "vmap", sft_params=None,
          sft_dir: str | None = None, also_held_out=(), chunk: int | None = None,
          progress: bool = False, warn_after: int = 10) -> dict:
  """Runs the sweep (see the module docstring); returns the summary.

  Args:
    config: the base config.
    workdir: where ``sweep_summary.json`` goes (None: nowhere).
    seeds: runs per value (seeds ``config.seed + i``).
    sweep_spec: ``<field>=<v1>,<v2>,...`` (see :func:`parse_sweep`) or None.
    batching: ``"vmap"`` or ``"map"`` (see :func:`experiments.stages.over_runs`).
    sft_params: the runs' policy parameters after SFT, leading run axis (the
      ``"sft_params"`` of an earlier sweep with the same seeds and SFT
      fields), to start RL from instead of running SFT; None: run SFT. SFT
      reads no RL or algorithm field, so sweeps of several algorithms can
      share one SFT stage (:mod:`experiments.compare`). LoRA adapters
      without their base (a shared-base sweep's) get it loaded once.
    sft_dir: a directory for the runs' parameters after SFT
      (:mod:`experiments.sft_store`): when it holds those of runs with the
      same SFT fields, RL starts from them; when it holds none, SFT runs and
      writes them there. Ignored when ``sft_params`` is given.
    also_held_out: base configs of other sweeps (same ``seeds``) whose
      training levels the evaluation levels avoid too, so that sweeps which
      train on different levels (e.g. more RL steps) are evaluated on one
      level set (:mod:`experiments.compare`). Used with ``eval.held_out``.
    chunk: RL steps per call of the RL program (:func:`chunk_steps`; None
      or 0: ``eval.every``, else a tenth of ``rl.steps``). The results do
      not depend on it.
    progress: print a line after SFT, after each chunk of RL steps
      (:func:`chunk_lines`: reward and training success per run, warnings
      of runs that trained nothing ``warn_after`` steps in a row) and after
      each evaluation (success per run).
    warn_after: see ``progress``.

  Returns:
    The summary dict (module docstring; each run's ``"curves"`` holds its
    per-step RL metrics of :data:`CURVE_KEYS`; ``"shared_base"``: whether
    the runs shared one LoRA base), plus ``"sft_params"`` and ``"params"``:
    the policy parameters after SFT and after RL, with a leading run axis,
    and ``"frozen"``: the shared bases (``[]`` for none; then ``"params"``
    hold each run's adapters without base, and
    ``jagent.models.join_frozen(jax.tree.map(lambda x: x[i], params), frozen)``
    is run ``i``'s policy). These three are not written to the JSON.

  Raises:
    ValueError: a bad ``seeds``, ``sweep_spec``, ``batching``, config or
      ``sft_params`` (leading axis not the number of runs), or an
      ``sft_dir`` that holds the SFT parameters of other runs, before
      anything compiles.
    CheckpointError: the parameters in ``sft_dir`` do not read back.
  """
  t_start = time.perf_counter()
  chunk = chunk_steps(config, chunk)
  say = (lambda line: print(line, flush=True)) if progress else (lambda line: None)
  if batching not in BATCHINGS:
    raise fields.ConfigError(f"--batching={batching!r}: must be one of {BATCHINGS}")
  field, runs = run_configs(config, seeds, sweep_spec)
  exps = [experiment.Experiment(c) for _, _, c in runs]
  exp = exps[0]
  # One spec's programs for every run (they differ only in seeds and swept
  # values: arguments); no diagnostics (under vmap its lax.cond runs every step).
  st = stages.make_stages(exp.spec, diagnostics=False)
  c = exp.config
  values = jnp.asarray([0.0 if field is None else v for _, v, _ in runs], jnp.float32)
  seconds = {}

  if sft_params is not None:
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(sft_params)}
    if sizes != {len(exps)}:
      raise ValueError(f"sft_params: leading axes {sorted(sizes, key=str)}, expected "
                       f"{len(exps)} (one per run)")

  # ---- SFT.
  t0 = time.perf_counter()
  frozen = []  # the runs' one shared copy of their LoRA bases ([]: none shared)
  initial = []
  if sft_params is None and sft_dir:
    def target():
      initial.extend(_initial_params(exps))
      return stages.stack_sharing_bases(initial)[0]
    sft_params = sft_store.load(sft_dir, [e.config for e in exps], target)
  if sft_params is not None:
    params = sft_params
    # An earlier shared-base sweep's adapters (no base): load their base once
    # (the restore target above holds it already).
    lora = lambda x: isinstance(x, models.LoraParams)  # noqa: E731
    if any(x.base is None for x in jax.tree.leaves(params, is_leaf=lora) if lora(x)):
      frozen = models.split_frozen(initial[0] if initial else exp.init_params())[1]
  else:
    initial = _initial_params(exps)
    if c.sft.steps:
      demos = [e.demonstrations() for e in exps]
      batches = [train.trajectory_batch(d) for d in demos]
      states, state_frozen = stages.stack_sharing_bases(
          [e.sft_state(p) for e, p in zip(exps, initial)])
      indices = jnp.asarray(np.stack([e.sft_batch_indices(d.row_valid)
                                      for e, d in zip(exps, demos)]))
      params, _ = sft_program(st, field, batching)(
          states, state_frozen, jnp.stack([b.tokens for b in batches]),
          jnp.stack([b.loss_mask for b in batches]), indices, values)
      frozen = models.split_frozen(initial[0])[1] if state_frozen else []
    else:
      params, frozen = stages.stack_sharing_bases(initial)
    if sft_dir:  # SFT ran: later sweeps of these runs read it back
      sft_store.save(sft_dir, [e.config for e in exps], params)
  params = sft_params = jax.block_until_ready(params)
  seconds["sft"] = time.perf_counter() - t0

  t0 = time.perf_counter()
  if c.eval.held_out:
    hold_out(exps, seeds, also_held_out)
  eval_keys = jnp.stack([e.eval_key() for e in exps])
  say(f"sweep SFT: {seconds['sft']:.1f} s")
  sft_eval = _evaluate(exp, st, params, frozen, eval_keys, batching)
  seconds["eval"] = time.perf_counter() - t0
  say(f"sweep eval after SFT ({seconds['eval']:.1f} s): success per run "
      + " ".join(f"{e['success']:.3f}" for e in sft_eval))

  # ---- RL.
  t0 = time.perf_counter()
  run_params = [stages.join(jax.tree.map(lambda x, i=i: x[i], params), frozen)
                for i in range(len(exps))]
  states, state_frozen = stages.stack_sharing_bases(
      [e.rl_state(p) for e, p in zip(exps, run_params)])
  del run_params
  if frozen and not state_frozen:  # an RL state whose bases differ by run: each keeps its own
    frozen = []
  train_success = [math.nan] * len(exps)
  curves = [{} for _ in exps]
  skipped = [0] * len(exps)
  if c.rl.steps:
    keys = jnp.stack([jnp.stack([e.rl_key(s) for s in range(c.rl.steps)]) for e in exps])
    program = rl_program(st, field, batching)
    parts, streaks = [], [0] * len(exps)
    for start in range(0, c.rl.steps, chunk):  # the same scan, K keys a call
      t_chunk = time.perf_counter()
      states, m = program(states, state_frozen, keys[:, start:start + chunk], values)
      m = jax.device_get(m)
      parts.append(m)
      for line in chunk_lines(start, min(start + chunk, c.rl.steps), c.rl.steps,
                              time.perf_counter() - t_chunk, m, streaks,
                              [seed for seed, _, _ in runs], warn_after):
        say(line)
    metrics = {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}
    skipped = [int(x) for x in _skipped(metrics).sum(axis=1)]
    train_success = [float(x) for x in np.asarray(metrics["rollout/success"])[:, -1]]
    curves = [{k: [float(v) for v in np.asarray(metrics[k])[i]]
               for k in CURVE_KEYS if k in metrics} for i in range(len(exps))]
  params = jax.block_until_ready(states.params)
  seconds["rl"] = time.perf_counter() - t0

  t0 = time.perf_counter()
  rl_eval = _evaluate(exp, st, params, frozen, eval_keys, batching)
  say(f"sweep eval after RL ({time.perf_counter() - t0:.1f} s): success per run "
      + " ".join(f"{e['success']:.3f}" for e in rl_eval))
  seconds["eval"] += time.perf_counter() - t0
  seconds["total"] = time.perf_counter() - t_start

  out_runs = [{"seed": seed, "value": None if field is None else value, "sft": s, "rl": r,
               "rl_train_success": t, "skipped_steps": k, "curves": cv}
              for (seed, value, _), s, r, t, k, cv in zip(runs, sft_eval, rl_eval, train_success,
                                                          skipped, curves)]
  groups = []
  for value in dict.fromkeys(r["value"] for r in out_runs):
    members = [r for r in out_runs if r["value"] == value]
    groups.append({"value": value, "seeds": [r["seed"] for r in members],
                   **{stage: {k: mean_std([r[stage][k] for r in members])
                              for k in members[0][stage]} for stage in ("sft", "rl")}})
  summary = {"env": c.env, "algorithm": c.algorithm, "field": field, "batching": batching,
             "rl_steps": c.rl.steps, "runs": out_runs, "num_levels": c.eval.num_levels,
             "held_out_removed": int(getattr(exp, "eval_levels_removed", 0)),
             "held_out_base_runs": list(getattr(exp, "held_out_base_runs", [])),
             "shared_base": bool(frozen),
             "groups": groups, "seconds": {k: round(v, 2) for k, v in seconds.items()}}
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    train.write_json(os.path.join(workdir, "sweep_summary.json"), summary)
  return {**summary, "sft_params": sft_params, "params": params, "frozen": frozen}


def table(summary: dict) -> str:
  """Markdown table of a :func:`sweep` summary: every run, then mean +- std per value."""
  field = summary["field"]
  greedy = "greedy_success" in summary["runs"][0]["sft"]
  cols = ["SFT success"] + (["SFT greedy"] if greedy else []) + ["RL success"] + (
      ["RL greedy"] if greedy else [])
  keys = [("sft", "success")] + ([("sft", "greedy_success")] if greedy else []) + [
      ("rl", "success")] + ([("rl", "greedy_success")] if greedy else [])
  head = ["run", "seed"] + ([field] if field else []) + cols + ["train/skipped_steps"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for i, r in enumerate(summary["runs"]):
    lines.append("| " + " | ".join(
        [str(i), str(r["seed"])] + ([f"{r['value']:g}"] if field else [])
        + [f"{r[s][k]:.3f}" for s, k in keys] + [str(r.get("skipped_steps", "-"))]) + " |")
  for g in summary["groups"]:
    lines.append("| " + " | ".join(
        ["mean ± std", f"{len(g['seeds'])} seeds"] + ([f"{g['value']:g}"] if field else [])
        + [f"{g[s][k]['mean']:.3f} ± {g[s][k]['std']:.3f}" for s, k in keys] + [""]) + " |")
  steps = summary.get("rl_steps", 0)
  if steps and all(r.get("skipped_steps") == steps for r in summary["runs"]):
    lines.append(f"\nEvery one of the {steps} RL steps of every run trained nothing (the filter "
                 "kept no group: no valid reply format, or zero in-group reward std): the RL "
                 "figures are the SFT policy's, not RL's.")
  return "\n".join(lines)


def _define_flags():
  """Defines this program's flags (only when run as a program: importing the
  module must not clash with other modules' flags, e.g. experiments.train's
  ``--config`` and ``--workdir``)."""
  cli.define_config_flag()
  flags.DEFINE_string(
      "workdir", os.path.join(os.path.expanduser("~"), "jagent_runs", "sweep"),
      "Output directory (sweep_summary.json).")
  flags.DEFINE_integer("seeds", 4, "Runs per value: seeds config.seed + 0 .. seeds - 1.")
  flags.DEFINE_string("sweep", None, "<field>=<v1>,<v2>,...: one float hyperparameter's "
                      f"values (fields: {', '.join(SWEEPABLE)}).")
  flags.DEFINE_enum("batching", "vmap", BATCHINGS,
                    "vmap: the runs in parallel; map: one after the other in the same program "
                    "(each equals its separate run exactly).")
  flags.DEFINE_integer("chunk_steps", 0, "RL steps per program call, a progress line after "
                       "each (0: eval.every, else a tenth of rl.steps); results do not depend "
                       "on it.")
  flags.DEFINE_string("sft_dir", None, "Directory of the runs' parameters after SFT: read back "
                      "when it holds those of runs with the same SFT fields (no SFT runs), "
                      "else written there after SFT (experiments.sft_store).")
  flags.DEFINE_integer("warn_after", 10, "Warn when a run's RL trained nothing (the filter kept "
                       "no group) this many steps in a row.", lower_bound=1)


def main(argv):
  del argv
  fl = flags.FLAGS
  cli.check_writable(fl.workdir, "--workdir")  # written after the sweep: refused before it
  if fl.sft_dir:
    cli.check_writable(fl.sft_dir, "--sft_dir")
  common.setup_compilation_cache()
  summary = sweep(fl.config, fl.workdir, seeds=fl.seeds, sweep_spec=fl.sweep,
                  batching=fl.batching, sft_dir=fl.sft_dir, chunk=fl.chunk_steps,
                  progress=True, warn_after=fl.warn_after)
  print(table(summary))
  print(f"seconds: {summary['seconds']}; summary: "
        f"{os.path.join(fl.workdir, 'sweep_summary.json')}")


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
