r"""Scale-out overhead: sharded rollout and train step on 1, 2, 4, 8 devices; MFU.

    python -m experiments.benchmarks.scaling [--devices=1,2,4,8] [--repeats=3] \
        [--config=experiments/configs/tiny.py:Sokoban-6x6-1box-v0,starpo_s] \
        [--config.model=micro] [--mfu=auto] [--mfu_models=tiny,small-10m] \
        [--mfu_lora_rank=16] [--peak_tflops=989]

For each N of ``--devices``: the config (default: the main job's tiny config,
``micro`` model, 8 groups x 8 rows of Sokoban) on a ``data:N`` mesh of the
first N devices (``experiments.experiment.Experiment`` with ``config.mesh``):

- ``rollout``: ``jagent.sharding.shard_rollout`` of the RL rollout (``B =
  num_groups x group_size`` rows over the N devices), the same parameters and
  key for every N: steps/s (rollout calls), sampled tokens/s, env turns/s;
- ``train``: ``jagent.sharding.shard_train_step`` (state donated) on the
  trained rows of one such rollout (the StarPO-S kept groups, as in an RL
  iteration): steps/s and context tokens/s (kept rows x context, padding
  included).

Each is compiled first (``compile s``), then timed ``--repeats`` times
(best kept; ``worst s`` shows the spread) and divided by the N = 1 rate
(``x 1 dev``). On CPU the devices are fake (``XLA_FLAGS=
--xla_force_host_platform_device_count=8``, set here when absent) and share
the machine's cores, so the ratio measures the overhead of partitioning
(collectives, smaller per-device programs), not a speed-up: with 2 cores no
more than ~2x is possible and ~1x means no overhead.

With an accelerator backend (or ``--mfu=on``): model FLOP/s utilisation of an
SFT train step (one forward and backward pass, AdamW) of each
``--mfu_models`` config on the largest N (an ``fsdp:N`` mesh), random tokens
``--mfu_batch`` x ``--mfu_seq``: ``6 x params x tokens / seconds`` (Kaplan et
al. 2020's estimate of a training step's FLOPs, https://arxiv.org/abs/2001.08361;
attention's own FLOPs are not counted) over ``--peak_tflops`` (per device,
dense bf16/fp32 peak of the chip, e.g. 989 for an H100 SXM's bf16) times the
device count. Without ``--peak_tflops`` only the achieved TFLOP/s is shown.

``--mfu_lora_rank=r`` (> 0) adds, for each MFU model, the same step with
rank-r all-linear LoRA adapters on the frozen model (``jagent.models.LoraParams``:
only the adapters get gradients and AdamW moments), so the train-step time
with and without LoRA can be compared (``x full``: full step seconds / LoRA
step seconds). Its TFLOP/s and MFU still count ``6 x params x tokens`` (the
full model's FLOPs; a LoRA step does fewer: no weight gradients of the base),
so read them as full-model-equivalent rates.

Prints tables, a summary line and one JSON line. Speed is measured here, never
in tests (timings on a shared machine are noisy: compare ``best s`` with
``worst s``).
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any, Callable

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from experiments import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import experiment  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import spec  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments.benchmarks import roofline  # pylint: disable=g-import-not-at-top
from experiments.benchmarks import timing  # pylint: disable=g-import-not-at-top
import jagent  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import train  # pylint: disable=g-import-not-at-top,wrong-import-position
from jagent import transforms  # pylint: disable=g-import-not-at-top,wrong-import-position


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagValues:
  """Defines the command's flags on ``flag_values`` (by ``__main__`` only).

  Not at import, so other programs (``experiments.benchmarks.accelerator``)
  can import :func:`measure_mfu` next to their own flags.
  """
  fv = {"flag_values": flag_values}
  config_flags.DEFINE_config_file(
      "config", str(pathlib.Path(__file__).parent.parent / "configs" / "tiny.py"),
      "The run's config (experiments/configs/*.py[:arg]); its mesh is set per N.", **fv)
  flags.DEFINE_list(
      "devices", [], "Device counts N (a data:N mesh of the first N devices); default: the "
      "powers of two up to the device count (1,2,4,8 with the 8 fake CPU devices).", **fv)
  flags.DEFINE_integer("repeats", 3, "Timed calls per row; the best is reported.", **fv)
  flags.DEFINE_enum("mfu", "auto", ["auto", "on", "off"],
                    "Model FLOP/s utilisation rows: auto = only on an accelerator.", **fv)
  flags.DEFINE_list("mfu_models", ["tiny", "small-10m"],
                    "jagent.models named configs for the MFU rows.", **fv)
  flags.DEFINE_integer("mfu_batch", 64, "Rows of the MFU train step.", **fv)
  flags.DEFINE_integer("mfu_seq", 512, "Tokens per row of the MFU train step.", **fv)
  flags.DEFINE_integer(
      "mfu_lora_rank", 0, "> 0: also time each MFU model's step with rank-r all-linear LoRA "
      "adapters on the frozen model (0: full fine-tuning only).", **fv)
  flags.DEFINE_float("peak_tflops", None,
                     "Peak dense TFLOP/s of ONE device (the chip's datasheet value).", **fv)
  return flag_values


def _check_int(name: str, v: Any, low: int = 1) -> int:
  """``--name``'s value (an int, or a list flag's string entry) as an int >= ``low``."""
  if isinstance(v, str) and v.strip().lstrip("-").isdigit():
    v = int(v)
  return jagent.check_int(f"--{name}", v, low)


def parse_devices(values, available: int) -> list[int]:
  """``--devices`` as ints in ``[1, available]``, in the given order.

  An empty ``values`` gives the powers of two up to ``available``.

  Raises:
    ValueError: an entry that is not an int >= 1 or exceeds ``available``.
  """
  if not values:
    return [2 ** i for i in range(available.bit_length()) if 2 ** i <= available]
  out = [_check_int("devices", v) for v in values]
  for n in out:
    if n > available:
      raise ValueError(f"--devices={','.join(map(str, out))}: {n} devices requested, jax "
                       f"sees {available} ({jax.default_backend()})")
  return out


def _timed(fn: Callable[[], Any], repeats: int) -> dict[str, Any]:
  """Best and worst of ``repeats`` timed calls of ``fn`` (already compiled)."""
  secs = [timing.best_seconds(fn, 1, warmup=False) for _ in range(repeats)]
  return {"seconds": min(secs), "worst_seconds": max(secs), "all_seconds": secs}


def trained_rows(exp: experiment.Experiment, traj) -> transforms.Batch:
  """The rows an RL iteration trains on: the filter's kept groups (host arrays)."""
  kept, _ = train.compact_groups(jax.device_get(traj), exp.num_keep, exp.filter_config)
  return jax.device_get(train.trajectory_batch(kept))


def measure_mesh(config, n: int, params, batch, repeats: int) -> dict[str, Any]:
  """Rollout and train-step rows of ``config`` on a ``data:n`` mesh.

  Args:
    config: the run's config (not modified).
    n: devices (the first ``n`` of ``jax.devices()``).
    params: the policy parameters (host arrays).
    batch: the train step's ``transforms.Batch`` (host arrays), or None for
      :func:`trained_rows` of this mesh's rollout.
    repeats: timed calls per row.

  Returns:
    ``{"devices": n, "mesh": {...}, "rollout": {...}, "train": {...},
    "batch": the Batch trained on}`` with seconds, compile seconds and rates.
  """
  c = config.copy_and_resolve_references()
  c.mesh = f"data:{n}"
  exp = experiment.Experiment(c, devices=jax.devices()[:n])
  mesh = exp.mesh
  key = exp.rl_key(0)
  # Rollout.
  fn = sharding.shard_rollout(exp.text_env, exp.model_config, exp.rollout_config, mesh,
                              env_params=exp.env_params)
  placed = jax.device_put(params, exp.param_shardings())
  t0 = time.perf_counter()
  traj = jax.block_until_ready(fn(placed, key))
  rollout = {"compile_seconds": time.perf_counter() - t0}
  tokens = float(np.sum(np.asarray(traj.loss_mask)))
  turns = float(np.sum(np.asarray(traj.num_turns)))
  rollout.update(_timed(lambda: fn(placed, key), repeats))
  sec = rollout["seconds"]
  rollout.update(rows=int(traj.tokens.shape[0]), sampled_tokens=tokens, env_turns=turns,
                 steps_per_s=1.0 / sec, tokens_per_s=tokens / sec, turns_per_s=turns / sec)
  if batch is None:
    batch = trained_rows(exp, traj)
  if batch.tokens.shape[0] % n:
    raise ValueError(f"config: the {batch.tokens.shape[0]} trained rows (kept groups x "
                     f"group_size) are not divisible by data:{n}")
  # Train step (state donated: each call takes the previous call's state).
  state = exp.rl_state(placed)
  step = sharding.shard_train_step(exp.objective, exp.train_config, mesh,
                                   sharding.train_state_shardings(state, mesh))
  rows = sharding.shard_rows(batch, mesh)
  holder = {"state": state}

  def one_step():
    holder["state"], m = step(holder["state"], rows)
    return m

  t0 = time.perf_counter()
  jax.block_until_ready(one_step())
  trained = {"compile_seconds": time.perf_counter() - t0}
  trained.update(_timed(one_step, repeats))
  sec = trained["seconds"]
  context = float(np.prod(batch.tokens.shape))
  trained.update(rows=int(batch.tokens.shape[0]), context_tokens=context,
                 steps_per_s=1.0 / sec, tokens_per_s=context / sec)
  return {"devices": n, "mesh": dict(mesh.shape), "rollout": rollout, "train": trained,
          "batch": batch}


def measure_mfu(model: str, batch: int, seq: int, repeats: int, peak_tflops: float | None,
                num_devices: int | None = None, lora_rank: int = 0, *,
                dtype: str | None = None, attention_flops: bool = False) -> dict[str, Any]:
  """Model FLOP/s utilisation of one SFT step of ``model`` on ``num_devices``.

  An ``fsdp`` mesh of the first ``num_devices`` devices (default: all).

  FLOPs per step: ``roofline.train_step_flops``: ``6 x num_params x batch x
  seq`` (forward 2, backward 4 per parameter and token), plus the attention
  scores with ``attention_flops``; also with LoRA (full-model-equivalent, see
  the module docstring).

  Args:
    model: a ``jagent.models`` config name (random weights).
    batch, seq: the random-token batch ``[batch, seq]`` (int32).
    repeats: timed calls (best kept).
    peak_tflops: one device's peak, or None (no MFU).
    num_devices: the first this many devices (default: all).
    lora_rank: > 0: train rank-``lora_rank`` all-linear adapters (alpha
      ``2 x rank``) on the frozen model instead of every weight.
    dtype: the activation dtype (``ModelConfig.dtype``, e.g. "bfloat16":
      mixed precision over float32 weights); None: the named config's.
    attention_flops: count the attention term of
      ``roofline.train_step_flops`` (PaLM's model FLOPs).

  Returns:
    the row's dict (``lora_rank`` included; seconds, TFLOP/s, tokens/s, MFU).

  Raises:
    ValueError: an unknown model, ``batch`` not divisible by the device
      count, or a negative ``lora_rank``.
  """
  lora_rank = _check_int("mfu_lora_rank", lora_rank, 0)
  if model not in models.config_names():
    raise ValueError(f"--mfu_models: {model!r} is not one of {models.config_names()}")
  cfg = models.get_config(model, **({"dtype": dtype} if dtype else {}))
  if seq > cfg.max_position:
    raise ValueError(f"--mfu_seq={seq}: {model} has {cfg.max_position} positions")
  n = jax.device_count() if num_devices is None else num_devices
  if batch % n:
    raise ValueError(f"--mfu_batch={batch}: not divisible by the {n} devices")
  mesh = sharding.make_mesh("fsdp:-1", jax.devices()[:n])
  tc = train.TrainConfig(model=cfg, actor_optimizer=train.OptimizerConfig(learning_rate=1e-5))

  def make(k):
    base = models.init(cfg, k)
    if not lora_rank:
      return base
    lora = models.LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank)
    return models.init_lora(base, cfg, lora, jax.random.fold_in(k, 1))

  abstract = jax.eval_shape(make, jax.random.key(0))
  params = jax.jit(make, out_shardings=sharding.param_shardings(abstract, mesh))(
      jax.random.key(0))
  state_abstract = jax.eval_shape(lambda p: train.init_train_state(p, jax.random.key(1),
                                                                   config=tc), params)
  shardings = sharding.train_state_shardings(state_abstract, mesh)
  state = jax.jit(lambda p: train.init_train_state(p, jax.random.key(1), config=tc),
                  out_shardings=shardings)(params)
  rng = np.random.default_rng(0)
  data = transforms.Batch(tokens=rng.integers(1, cfg.vocab_size, (batch, seq)).astype(np.int32),
                          loss_mask=np.ones((batch, seq), np.float32))
  data = sharding.shard_rows(data, mesh)
  step = sharding.shard_sft_step(tc, mesh, shardings)
  holder = {"state": state}

  def one_step():
    holder["state"], m = step(holder["state"], data)
    return m

  t0 = time.perf_counter()
  jax.block_until_ready(one_step())
  out = {"model": model, "params": cfg.num_params(), "lora_rank": lora_rank, "devices": n,
         "batch": batch, "seq": seq, "compile_seconds": time.perf_counter() - t0}
  out.update(_timed(one_step, repeats))
  flops = roofline.train_step_flops(cfg, batch, seq, attention=attention_flops)
  out["flops_per_step"] = flops
  out["tflops_per_s"] = flops / out["seconds"] / 1e12
  out["tokens_per_s"] = batch * seq / out["seconds"]
  out["peak_tflops_per_device"] = peak_tflops
  out["mfu"] = (None if not peak_tflops
                else out["tflops_per_s"] / (peak_tflops * n))
  return out


def run(config, devices: list[str], repeats: int, mfu: str = "auto",
        mfu_models: list[str] = ("tiny", "small-10m"), mfu_batch: int = 64,
        mfu_seq: int = 512, peak_tflops: float | None = None,
        mfu_lora_rank: int = 0) -> dict[str, Any]:
  """Every row (see the module docstring); returns the results.

  Raises:
    ValueError: a bad flag, or a config whose rows a ``data:N`` mesh cannot
      split (naming ``config.mesh``), before anything compiles.
  """
  repeats = _check_int("repeats", repeats)
  counts = parse_devices(devices, jax.device_count())
  if peak_tflops is not None and not peak_tflops > 0:
    raise ValueError(f"--peak_tflops={peak_tflops!r}: must be > 0")
  with_mfu = mfu == "on" or (mfu == "auto" and jax.default_backend() != "cpu")
  if with_mfu:
    _check_int("mfu_seq", mfu_seq)
    for m in mfu_models:
      if m not in models.config_names():
        raise ValueError(f"--mfu_models: {m!r} is not one of {models.config_names()}")
      if mfu_seq > models.get_config(m).max_position:
        raise ValueError(f"--mfu_seq={mfu_seq}: {m} has {models.get_config(m).max_position} "
                         "positions")
    _check_int("mfu_lora_rank", mfu_lora_rank, 0)
    if _check_int("mfu_batch", mfu_batch) % max(counts):
      raise ValueError(f"--mfu_batch={mfu_batch}: not divisible by the {max(counts)} devices")
  exp = experiment.Experiment(config)  # one device: validates; the shared parameters
  kept_rows = exp.num_keep * exp.rollout_config.group_size
  for n in counts:  # every mesh's rows, before any compile
    c = config.copy_and_resolve_references()
    c.mesh = f"data:{n}"
    spec.validate(c, n)
    if kept_rows % n:
      raise ValueError(f"config: the {kept_rows} trained rows (kept groups x group_size) are "
                       f"not divisible by data:{n}")
  params = jax.device_get(exp.init_params())
  rows, batch = [], None
  for n in counts:  # the first mesh's rollout gives every mesh's train batch
    rows.append(measure_mesh(config, n, params, batch, repeats))
    batch = rows[-1].pop("batch")
  c = exp.config
  base = {k: rows[0][k]["tokens_per_s"] for k in ("rollout", "train")}
  for r in rows:
    for k in ("rollout", "train"):
      r[k]["ratio_to_first"] = r[k]["tokens_per_s"] / base[k]
  ranks = (0, mfu_lora_rank) if mfu_lora_rank else (0,)
  mfu_rows = ([measure_mfu(m, mfu_batch, mfu_seq, repeats, peak_tflops, max(counts), r)
               for m in mfu_models for r in ranks] if with_mfu else [])
  full = {m["model"]: m["seconds"] for m in mfu_rows if not m["lora_rank"]}
  for m in mfu_rows:  # the full step's seconds over this row's (1.0 for the full row)
    m["speedup_to_full"] = full[m["model"]] / m["seconds"]
  return dict(env=c.env, algorithm=c.algorithm, model=c.model_dir or c.model,
              rollout_rows=exp.rollout_config.batch_size,
              trained_rows=int(batch.tokens.shape[0]),
              context=int(batch.tokens.shape[1]), repeats=repeats, rows=rows, mfu=mfu_rows,
              backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
              cpu_count=os.cpu_count(), load_average=os.getloadavg())


def _fmt(x, spec):
  return "-" if x is None else format(x, spec)


def report(res: dict[str, Any]) -> None:
  """Prints the tables, a summary line and a JSON line."""
  print(f"scaling benchmark: {res['env']} {res['algorithm']}, model {res['model']}, "
        f"rollout {res['rollout_rows']} rows, train {res['trained_rows']} rows x "
        f"{res['context']} tokens; backend {res['backend']} ({res['device_kind']}), "
        f"{res['cpu_count']} CPUs, load average "
        + " ".join(f"{x:.2f}" for x in res["load_average"]))
  if res["backend"] == "cpu":
    print(f"(fake CPU devices share {res['cpu_count']} cores: the ratios measure the "
          "partitioning overhead, not a speed-up)")
  header = (f"{'devices':>8s}{'stage':>9s}{'compile s':>11s}{'best s':>9s}{'worst s':>9s}"
            f"{'steps/s':>9s}{'tokens/s':>11s}{'x 1st':>7s}")
  print(header)
  print("-" * len(header))
  for r in res["rows"]:
    for k in ("rollout", "train"):
      x = r[k]
      print(f"{r['devices']:8d}{k:>9s}{x['compile_seconds']:11.1f}{x['seconds']:9.3f}"
            f"{x['worst_seconds']:9.3f}{x['steps_per_s']:9.2f}{x['tokens_per_s']:11,.0f}"
            f"{x['ratio_to_first']:7.2f}")
  if res["mfu"]:
    header = (f"{'model':>10s}{'params':>12s}{'LoRA r':>7s}{'devices':>8s}{'batch x seq':>13s}"
              f"{'best s':>9s}{'worst s':>9s}{'tokens/s':>12s}{'TFLOP/s':>9s}{'MFU':>8s}"
              f"{'x full':>7s}")
    print(header)
    print("-" * len(header))
    for m in res["mfu"]:
      print(f"{m['model']:>10s}{m['params']:12,d}{m['lora_rank'] or '-':>7}{m['devices']:8d}"
            f"{m['batch']:>7d} x {m['seq']:<3d}{m['seconds']:9.4f}{m['worst_seconds']:9.4f}"
            f"{m['tokens_per_s']:12,.0f}{m['tflops_per_s']:9.3f}{_fmt(m['mfu'], '8.1%'):>8s}"
            f"{m['speedup_to_full']:7.2f}")
  first, last = res["rows"][0], res["rows"][-1]
  print(f"SUMMARY: {last['devices']} vs {first['devices']} devices: rollout "
        f"{last['rollout']['ratio_to_first']:.2f}x, train step "
        f"{last['train']['ratio_to_first']:.2f}x tokens/s")
  print(json.dumps(res, default=float))


def main(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """Runs the benchmark with ``flag_values`` (see :func:`define_flags`)."""
  del argv
  fv = flag_values
  common.setup_compilation_cache()
  report(run(fv.config, fv.devices, fv.repeats, fv.mfu, fv.mfu_models, fv.mfu_batch,
             fv.mfu_seq, fv.peak_tflops, fv.mfu_lora_rank))


if __name__ == "__main__":
  define_flags()
  app.run(main)
