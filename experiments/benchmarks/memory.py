r"""Per-device memory of a run config on device meshes: persistent state + temporaries.

    python -m experiments.benchmarks.memory \
        --config=experiments/configs/ragen.py:Sokoban-6x6-1box-v0,starpo_s \
        --config.tokenizer=tiny --config.prompt.chat_template=chatml \
        [--meshes='data:1;data:8;fsdp:8'] [--layers=2] \
        [--config.remat=False] [--config.rl.num_microbatches=1]

``--meshes`` is a ``;``-separated list of ``jagent.sharding.make_mesh`` specs
(quote it in a shell); inside one spec ``,`` joins axes, so
``'data:1;data:2,fsdp:4'`` is two meshes, the second of 8 devices. Each mesh
uses the first ``data x fsdp x tensor`` devices (a ``-1`` size: all of
them). On CPU the devices are fake (``XLA_FLAGS=
--xla_force_host_platform_device_count=8``, set here when absent). The
defaults (the RAGEN StarPO-S config, ``data:1;data:8;fsdp:8``, the model's
own depth) give the per-device memory table of docs/scaling.md.

For every mesh (``experiments.experiment.Experiment`` with ``config.mesh``, so
``rl.num_microbatches=-1`` resolves to one row per device and
``config.remat`` applies):

1. ``state``: the persistent ``TrainState`` bytes per device, exact:
   ``jax.eval_shape`` of ``Experiment.rl_state`` and
   ``jagent.sharding.train_state_shardings``, summing every leaf's
   ``sharding.shard_shape(shape) x itemsize`` (policy, AdamW moments, critic,
   reference, counters) at the config's layer count.
2. Temporaries, per device (XLA's ``compiled.memory_analysis()
   .temp_size_in_bytes`` of the SPMD-partitioned program), of
   ``rollout``: the train rollout (``jagent.rollout.make_rollout``, parameters
   by their logical axes, trajectory rows over ``data x fsdp``, as
   ``jagent.sharding.shard_rollout``) and ``train``: the train step
   (``jagent.train.train_step``, state donated, as
   ``jagent.sharding.shard_train_step``) on the kept rows (``num_keep x
   group_size`` rows of the context length). Both are jitted with explicit
   shardings and compiled from abstract inputs (``jax.ShapeDtypeStruct`` with
   shardings): nothing is allocated. By default they are compiled at the
   config's own ``L`` layers: the layers are one scanned block, so that
   compiles about as fast as 2 layers. ``--layers=n`` compiles at ``n``
   layers instead (e.g. to compare compile seconds with the full depth);
   ``--layers=a,b`` compiles at both and extrapolates linearly to ``L``,
   ``t(L) = t(a) + (L - a) (t(b) - t(a)) / (b - a)``, which assumes every
   layer adds its own buffers: true of an unrolled model, not of a scanned
   one, whose buffers are reused across layers.
3. ``total``: state + the larger of the two temporaries (the two programs
   run one after the other in an RL iteration), and the compile seconds of
   the mesh's programs.

XLA:CPU's buffer assignment stands in for GPU/TPU's (same HLO, different
fusion and scheduling): read the temporaries as estimates (+-30%). Prints a
header line, a Markdown table and one JSON line. A LoRA config
(``--config.lora.rank=64``) is measured with its adapters: the frozen base
(the policy's and the critic's copy), the adapters and their AdamW moments.

``--compare_lora`` instead compares the persistent state per device with and
without LoRA (``--lora_rank``, all-linear adapters) for each of
``--compare_models`` (default: Qwen2.5 0.5B, 1.5B and 3B) on each mesh of
``--meshes``; exact and cheap (``jax.eval_shape``, nothing compiled, so no
temporaries)::

    python -m experiments.benchmarks.memory --compare_lora \
        --config.tokenizer=tiny --config.prompt.chat_template=chatml \
        --meshes='data:1;fsdp:8' [--sweep_runs=4]

It also gives the state of ``--sweep_runs`` runs of one ``experiments.sweep``
program: full fine-tuning stacks every run's state; LoRA on a loaded base
holds one copy of the frozen bases and each run's adapters and moments.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pathlib
import time
from typing import Any

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from experiments import experiment  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import spec  # pylint: disable=g-import-not-at-top,wrong-import-position
import jagent  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import rollout  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import train  # pylint: disable=g-import-not-at-top,wrong-import-position

DEFAULT_CONFIG = (str(pathlib.Path(__file__).parent.parent / "configs" / "ragen.py")
                  + ":Sokoban-6x6-1box-v0,starpo_s")
DEFAULT_MESHES = "data:1;data:8;fsdp:8"
DEFAULT_LAYERS = ()
STATE_FIELDS = ("params", "opt_state", "critic_params", "critic_opt_state", "ref_params")
COMPARE_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b")
GiB = 2.0 ** 30


def define_flags(flag_values: flags.FlagValues = flags.FLAGS,
                 argv: list[str] | None = None) -> flags.FlagValues:
  """Defines ``--config``, ``--meshes`` and ``--layers`` on ``flag_values``.

  Called by ``__main__`` on the global flags; a test passes its own
  ``flags.FlagValues()`` (other modules define ``--config`` globally too)
  and the ``argv`` it will parse (``config_flags`` reads the
  ``--config.*`` overrides to define from it; default ``sys.argv``).
  """
  config_flags.DEFINE_config_file(
      "config", DEFAULT_CONFIG,
      "The run's config (experiments/configs/*.py[:arg]); its mesh is set per --meshes. "
      "The RAGEN config needs --config.tokenizer=tiny --config.prompt.chat_template=chatml "
      "without a model directory.", flag_values=flag_values, sys_argv=argv)
  flags.DEFINE_string("meshes", DEFAULT_MESHES,
                      "';'-separated make_mesh specs, e.g. 'data:1;data:8;data:2,fsdp:4'.",
                      flag_values=flag_values)
  flags.DEFINE_list("layers", list(DEFAULT_LAYERS),
                    "Empty (the default): compile at the config's own layer count; one "
                    "count n: compile at n layers; two counts a < b: compile at both and "
                    "extrapolate linearly to the config's count.", flag_values=flag_values)
  flags.DEFINE_bool("compare_lora", False,
                    "Compare the persistent state per device without and with LoRA "
                    "(--lora_rank, all-linear) for each --compare_models on each --meshes "
                    "(no compile).", flag_values=flag_values)
  flags.DEFINE_list("compare_models", list(COMPARE_MODELS),
                    "jagent.models named configs of --compare_lora.", flag_values=flag_values)
  flags.DEFINE_integer("lora_rank", 64, "The adapters' rank in --compare_lora.",
                       flag_values=flag_values)
  flags.DEFINE_integer("sweep_runs", 4, "Runs of one experiments.sweep program whose state "
                       "--compare_lora also reports.", flag_values=flag_values)
  return flag_values


def parse_meshes(spec: str, available: int) -> list[tuple[str, int]]:
  """``--meshes`` as ``[(mesh spec, devices)]``, in the given order.

  Args:
    spec: ``;``-separated :func:`jagent.sharding.parse_mesh_spec` specs.
    available: devices jax sees.

  Returns:
    each spec with its device count: the product of its sizes, or
    ``available`` for a spec with a ``-1`` size.

  Raises:
    ValueError: an empty list or entry, a bad spec, or one needing more than
      ``available`` devices.
  """
  entries = [s.strip() for s in spec.split(";")]
  if not spec.strip() or any(not s for s in entries):
    raise ValueError(f"--meshes={spec!r}: needs ';'-separated mesh specs like "
                     "'data:1;data:8;fsdp:8' (no empty entry)")
  out = []
  for s in entries:
    fits = []
    for n in range(1, available + 1):
      try:
        sharding.parse_mesh_spec(s, n)
        fits.append(n)
      except ValueError:
        pass
    if not fits:
      try:  # the spec's own error, or the device count
        sharding.parse_mesh_spec(s, available)
      except ValueError as e:
        raise ValueError(f"--meshes={spec!r}: {e} (jax sees {available} devices, "
                         f"{jax.default_backend()})") from None
    out.append((s, max(fits)))
  return out


def parse_layers(values) -> tuple[int, ...]:
  """``--layers`` as ``()``, one int ``(n,)`` with ``n >= 1`` or two ``(a, b)``, ``1 <= a < b``.

  Raises:
    ValueError: anything else.
  """
  try:
    out = tuple(int(v) for v in values)
  except (TypeError, ValueError):
    raise ValueError(f"--layers={','.join(map(str, values))}: must be ints") from None
  if len(out) > 2 or (out and out[0] < 1) or (len(out) == 2 and not out[0] < out[1]):
    raise ValueError(f"--layers={','.join(map(str, values))}: must be empty, one layer "
                     "count n >= 1, or two counts a < b, each >= 1")
  return out


def with_layers(exp: experiment.Experiment, num_layers: int) -> experiment.Experiment:
  """A shallow copy of ``exp`` whose model (and train config's model) has ``num_layers``.

  Everything else (mesh, micro-batches, remat, rollout, objective) is kept;
  ``exp`` itself is not changed.
  """
  out = copy.copy(exp)
  out.model_config = exp.model_config.replace(num_layers=num_layers)
  out.train_config = dataclasses.replace(exp.train_config, model=out.model_config)
  return out


def abstract_state(exp: experiment.Experiment):
  """``(TrainState of ShapeDtypeStructs with shardings, its shardings)``; nothing allocated."""
  state = jax.eval_shape(
      lambda k: exp.rl_state(exp.with_lora(models.init(exp.model_config, k))),
      jax.random.key(0))
  shardings = sharding.train_state_shardings(state, exp.mesh)
  return _with_shardings(state, shardings), shardings


def _with_shardings(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def _device_bytes(tree) -> int:
  """Bytes one device holds of ``tree``'s sharded ShapeDtypeStructs (the largest shard)."""
  return sum(int(np.prod(x.sharding.shard_shape(x.shape))) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def state_bytes(exp: experiment.Experiment) -> dict[str, int]:
  """Persistent TrainState bytes per device on ``exp.mesh``, by field.

  Returns:
    ``{"params", "opt_state", "critic_params", "critic_opt_state",
    "ref_params", "other" (step, key, counters, objective state), "total",
    "frozen" (the LoRA bases among them; 0 without LoRA)}`` in bytes (0 for
    absent fields); exact (shapes and shardings only).
  """
  state, _ = abstract_state(exp)
  out = {f: _device_bytes(getattr(state, f)) for f in STATE_FIELDS}
  out["total"] = _device_bytes(state)
  out["other"] = out["total"] - sum(out[f] for f in STATE_FIELDS)
  out["frozen"] = _device_bytes(models.split_frozen(state)[1])
  return out


def compare_lora(config, meshes: str, model_names, rank: int, sweep_runs: int = 4
                 ) -> dict[str, Any]:
  """Persistent state per device without and with LoRA, per model and mesh.

  For each named model and each mesh: ``config`` with ``model`` set (random
  weights, ``model_dir`` empty: only shapes matter) and ``lora.rank`` 0
  (``"full"``: every weight, its AdamW moments, the critic's) or ``rank``
  with all-linear adapters (``"lora"``: the frozen base of the policy and of
  a model critic, the adapters and their moments), measured by
  :func:`state_bytes`.

  Args:
    config: the run's config (e.g. RAGEN's StarPO-S, a separate model critic).
    meshes: ``--meshes`` (see :func:`parse_meshes`).
    model_names: ``jagent.models`` config names.
    rank: the adapters' rank (>= 1).
    sweep_runs: R, the runs of one ``experiments.sweep`` program (>= 1).

  Returns:
    ``{"env", "algorithm", "critic", "rank", "sweep_runs", "rows": [{"model",
    "num_params", "mesh", "devices", "full": state_bytes, "lora": state_bytes,
    "sweep": {"full", "lora_shared_base"}}]}``; ``sweep`` in bytes per device:
    ``R x full total`` (each run its own weights) and ``frozen + R x (LoRA
    total - frozen)`` (one base shared by the runs' adapters).

  Raises:
    ValueError: an unknown model, a bad rank, run count or mesh, before
      anything is built.
  """
  specs = parse_meshes(meshes, jax.device_count())
  unknown = [m for m in model_names if m not in models.config_names()]
  if unknown or not model_names:
    raise ValueError(f"--compare_models={','.join(model_names)}: each must be one of "
                     f"{models.config_names()}")
  jagent.check_int("--lora_rank", rank, 1)
  jagent.check_int("--sweep_runs", sweep_runs, 1)

  def sweep_state(full, lora):
    return dict(full=sweep_runs * full["total"],
                lora_shared_base=lora["frozen"] + sweep_runs * (lora["total"] - lora["frozen"]))

  def variant(name, spec, n, r):
    c = config.copy_and_resolve_references()
    c.model, c.model_dir, c.mesh = name, "", spec
    c.lora.update(dict(rank=r, target_modules="all-linear"))
    return experiment.Experiment(c, devices=jax.devices()[:n])

  exps = {(m, spec, r): variant(m, spec, n, r)  # every config checked first
          for m in model_names for spec, n in specs for r in (0, rank)}
  rows = []
  for m in model_names:
    for spec, n in specs:
      full, lora = state_bytes(exps[m, spec, 0]), state_bytes(exps[m, spec, rank])
      rows.append(dict(model=m, num_params=models.get_config(m).num_params(), mesh=spec,
                       devices=n, full=full, lora=lora, sweep=sweep_state(full, lora)))
  exp = exps[model_names[0], specs[0][0], 0]
  return dict(env=exp.config.env, algorithm=exp.config.algorithm,
              critic=exp.config.rl.critic if exp.needs.critic else None, rank=rank,
              sweep_runs=sweep_runs, rows=rows,
              backend=jax.default_backend())


def report_compare(res: dict[str, Any]) -> None:
  """Prints :func:`compare_lora`'s header line, Markdown table (GiB) and JSON line."""
  print(f"LoRA memory comparison: {res['env']} {res['algorithm']}, critic {res['critic']}; "
        f"persistent state per device (params, AdamW moments, critic), rank {res['rank']} "
        "all-linear; exact, temporaries not included")
  runs = res["sweep_runs"]
  print("| model | params | mesh | full GiB | LoRA GiB | of which frozen base GiB | "
        f"LoRA / full | {runs} runs full GiB | {runs} runs LoRA, one base GiB |")
  print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
  for r in res["rows"]:
    full, lora = r["full"]["total"], r["lora"]["total"]
    print(f"| {r['model']} | {r['num_params']:,} | {r['mesh']} | {full / GiB:,.2f} | "
          f"{lora / GiB:,.2f} | {r['lora']['frozen'] / GiB:,.2f} | {lora / full:.2f} | "
          f"{r['sweep']['full'] / GiB:,.2f} | {r['sweep']['lora_shared_base'] / GiB:,.2f} |")
  print(json.dumps(res, default=float))


def _compile(jitted, mesh, *args) -> dict[str, Any]:
  """Compiles ``jitted`` on abstract ``args`` for ``mesh``: per-device bytes and seconds."""
  t0 = time.perf_counter()
  with sharding.activation_rules(mesh):
    analysis = jitted.lower(*args).compile().memory_analysis()
  sec = time.perf_counter() - t0
  if analysis is None:
    raise RuntimeError(f"no XLA memory analysis on the {jax.default_backend()} backend")
  return dict(temp_bytes=int(analysis.temp_size_in_bytes),
              argument_bytes=int(analysis.argument_size_in_bytes),
              output_bytes=int(analysis.output_size_in_bytes),
              alias_bytes=int(analysis.alias_size_in_bytes), compile_seconds=sec)


def program_memory(exp: experiment.Experiment) -> dict[str, dict[str, Any]]:
  """Compiles the rollout and the train step of ``exp`` (its layer count) abstractly.

  Both compile under ``jagent.sharding.activation_rules`` of the mesh, as
  ``jagent.sharding``'s step wrappers run them.

  Returns:
    ``{"rollout": ..., "train": ...}``, each :func:`_compile`'s dict
    (``temp_bytes`` etc. per device, ``compile_seconds``).
  """
  mesh = exp.mesh
  rep = sharding.replicated(mesh)
  state, shardings = abstract_state(exp)
  key = _with_shardings(jax.eval_shape(lambda: jax.random.key(0)), rep)
  # The rollout (built here, not Experiment.rollout_fn: its shared program is
  # keyed by the config, which does not see a changed layer count).
  fn = rollout.make_rollout(exp.text_env, exp.model_config, exp.rollout_config,
                            exp.env_params)
  traj = jax.eval_shape(fn, state.params, key)
  jitted = jax.jit(lambda p, k: fn(p, k), in_shardings=(shardings.params, rep),
                   out_shardings=sharding.rows_shardings(traj, mesh))
  out = {"rollout": _compile(jitted, mesh, state.params, key)}
  # The train step on the kept rows.
  # The kept groups' rows as the filter leaves them (turn rows included).
  kept, _ = jax.eval_shape(lambda t: train.compact_groups(t, exp.num_keep), traj)
  batch = jax.eval_shape(train.trajectory_batch, kept)
  batch_shardings = sharding.rows_shardings(batch, mesh)
  objective, config = exp.objective, exp.train_config
  jitted = jax.jit(lambda s, b: train.train_step(s, b, objective=objective, config=config),
                   in_shardings=(shardings, batch_shardings), out_shardings=(shardings, rep),
                   donate_argnums=0)
  out["train"] = _compile(jitted, mesh, state, _with_shardings(batch, batch_shardings))
  return out


def _check_trained_rows(exp: experiment.Experiment, spec: str, row_devices: int) -> None:
  rows = exp.num_keep * exp.rollout_config.group_size
  if rows % row_devices:
    raise ValueError(f"config.mesh={spec!r}: the {rows} trained rows (kept groups x "
                     f"group_size) are not divisible by data x fsdp = {row_devices}")


def measure_mesh(config, spec: str, num_devices: int, layers: tuple[int, ...]
                 ) -> dict[str, Any]:
  """One mesh's row: exact state, extrapolated temporaries, total, compile seconds.

  Args:
    config: the run's config (not modified).
    spec: the mesh spec (``config.mesh`` of this row).
    num_devices: the first ``num_devices`` devices make the mesh.
    layers: ``()`` or ``(a, b)`` (see :func:`parse_layers`).

  Returns:
    the row's dict; bytes per device.

  Raises:
    ValueError: the mesh does not split the config's rows (from
      ``Experiment``, naming ``config.mesh``), before any compile.
  """
  c = config.copy_and_resolve_references()
  c.mesh = spec
  exp = experiment.Experiment(c, devices=jax.devices()[:num_devices])
  _check_trained_rows(exp, spec, sharding.rows_size(exp.mesh))
  num_layers = exp.model_config.num_layers
  state = state_bytes(exp)
  at = {}
  for n in (layers or (num_layers,)):
    at[n] = program_memory(with_layers(exp, n))
    logging.info("mesh %s, %d layers: %s", spec, n, {
        k: f"{v['temp_bytes'] / GiB:.3f} GiB temp, {v['compile_seconds']:.1f} s"
        for k, v in at[n].items()})
  programs = {}
  for name in ("rollout", "train"):
    measured = {n: at[n][name] for n in at}
    if len(layers) == 2:
      a, b = layers
      per_layer = (measured[b]["temp_bytes"] - measured[a]["temp_bytes"]) / (b - a)
      temp = measured[a]["temp_bytes"] + (num_layers - a) * per_layer
    else:
      (n,) = layers or (num_layers,)
      per_layer, temp = None, measured[n]["temp_bytes"]
    programs[name] = dict(
        temp_bytes=int(round(temp)), per_layer_bytes=per_layer,
        measured={str(n): m for n, m in measured.items()},
        compile_seconds=sum(m["compile_seconds"] for m in measured.values()))
  temp = max(programs["rollout"]["temp_bytes"], programs["train"]["temp_bytes"])
  return dict(mesh=spec, shape=dict(exp.mesh.shape), devices=num_devices,
              num_microbatches=exp.train_config.num_microbatches,
              num_minibatches=exp.train_config.num_minibatches,
              state=state, rollout=programs["rollout"], train=programs["train"],
              total_bytes=state["total"] + temp,
              compile_seconds=sum(p["compile_seconds"] for p in programs.values()))


def run(config, meshes: str, layers) -> dict[str, Any]:
  """Every mesh's row (see the module docstring); returns the results.

  Raises:
    ValueError: a bad ``--meshes`` or ``--layers``, or a config a mesh cannot
      split, before anything compiles.
  """
  specs = parse_meshes(meshes, jax.device_count())
  layers = parse_layers(layers)
  exp = experiment.Experiment(config)  # validates; the config's shapes
  for mesh, n in specs:  # every mesh's rows, before any compile
    c = config.copy_and_resolve_references()
    c.mesh = mesh
    spec.validate(c, n)
    data, fsdp, _ = sharding.parse_mesh_spec(mesh, n)
    _check_trained_rows(exp, mesh, data * fsdp)
  mc = exp.model_config
  c = exp.config
  out_rows = [measure_mesh(config, spec, n, layers) for spec, n in specs]
  return dict(env=c.env, algorithm=c.algorithm, model=c.model_dir or c.model,
              num_params=mc.num_params(), num_layers=mc.num_layers,
              dtype=mc.dtype,
              remat=bool(mc.remat), layers=list(layers),
              rollout_rows=exp.rollout_config.batch_size,
              trained_rows=exp.num_keep * exp.rollout_config.group_size,
              context=exp.context_size, critic=bool(exp.needs.critic),
              reference=bool(exp.needs.reference), rows=out_rows,
              backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind)


def _unit(res: dict[str, Any]) -> tuple[str, float]:
  top = max(r["total_bytes"] for r in res["rows"])
  for name, size in (("GiB", 2.0 ** 30), ("MiB", 2.0 ** 20)):
    if top >= size:
      return name, size
  return "KiB", 2.0 ** 10


def report(res: dict[str, Any]) -> None:
  """Prints a header line, the Markdown table and one JSON line."""
  layers = res["layers"]
  how = ("compiled at full depth" if not layers else
         f"extrapolated from {layers[0]} and {layers[1]} layers" if len(layers) == 2 else
         f"compiled at {layers[0]} layers (not the model's {res['num_layers']})")
  print(f"memory benchmark: {res['env']} {res['algorithm']}, model {res['model']} "
        f"({res['num_params']:,} parameters, {res['num_layers']} layers, remat "
        f"{'on' if res['remat'] else 'off'}), critic {res['critic']}, reference "
        f"{res['reference']}; rollout {res['rollout_rows']} rows, train "
        f"{res['trained_rows']} rows x {res['context']} tokens; temporaries {how}; "
        f"backend {res['backend']} ({res['device_kind']})")
  unit, size = _unit(res)
  print(f"| mesh | devices | micro-batches | state {unit} | rollout temp {unit} | "
        f"train temp {unit} | total {unit} | rollout compile s | train compile s |")
  print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
  for r in res["rows"]:
    print(f"| {r['mesh']} | {r['devices']} | {r['num_microbatches']} | "
          f"{r['state']['total'] / size:,.2f} | {r['rollout']['temp_bytes'] / size:,.2f} | "
          f"{r['train']['temp_bytes'] / size:,.2f} | {r['total_bytes'] / size:,.2f} | "
          f"{r['rollout']['compile_seconds']:.1f} | {r['train']['compile_seconds']:.1f} |")
  print(json.dumps(res, default=float))


def main(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """Runs the benchmark with ``flag_values`` (see :func:`define_flags`)."""
  del argv
  if flag_values.compare_lora:
    report_compare(compare_lora(flag_values.config, flag_values.meshes,
                                flag_values.compare_models, flag_values.lora_rank,
                                flag_values.sweep_runs))
    return
  report(run(flag_values.config, flag_values.meshes, flag_values.layers))


if __name__ == "__main__":
  define_flags()
  app.run(main)
