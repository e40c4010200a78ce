r"""Accelerator acceptance: one command that checks and measures a new GPU or TPU host.

    python -m experiments.benchmarks.accelerator [--model=qwen2.5-0.5b] [--gen_batch=64] \
        [--mfu_batch=8] [--mfu_seq=1024] [--ragen_steps=2] [--peak_tflops=989] \
        [--sections=versions,generate] [--toy]

Sections, each timed and guarded (a failing one shows ``error: ...`` in its
table row and ``"error"`` in the JSON, the others still run, and the command
exits 1):

- ``versions``: jax, jaxlib, flax, optax, torch and transformers (None when
  absent), jax's backend, device kind and count, torch's GPU.
- ``ragen_rl``: RAGEN's StarPO-S setting (``experiments/configs/ragen.py:
  Sokoban-6x6-1box-v0,starpo_s``: Qwen2.5-0.5B architecture, random float32
  weights, 8 groups x 16 rollouts of 5 think-mode turns, a critic model) with
  the shipped tiny tokenizer and ChatML framing in place of a model directory,
  collapse diagnostics off: ``--ragen_steps`` iterations of
  ``experiments.experiment.Experiment.rl_step``; ``first_step_seconds`` (compile
  included), ``step_seconds`` (the best later step) and ``peak_bytes``, jax's
  ``peak_bytes_in_use`` of device 0 (None on CPU, which keeps no statistics).
  It runs first, so the peak is its own (the statistic never resets).
- ``smoke_train``: the main job (``experiments.train.run``) on the tiny config
  (``experiments/configs/tiny.py``, Sokoban 6x6) with a short SFT and
  ``--smoke_rl_steps`` RL steps in a temporary workdir: ``train_seconds`` and
  the held-out success after SFT and after RL (``sft_success``,
  ``rl_success``; a few steps train little, so read them as "the loop runs").
- ``generate``: ``jagent.models.generate`` at ``--model``'s architecture in
  bfloat16 (random weights) against transformers' ``generate`` with the same
  weights on the same device (``experiments.benchmarks.generate``): tokens/s of
  each and ``ratio`` (ours / transformers'), and ``decode_step_ms``, one
  decode step, against ``roofline_ms``: the bytes it must read (weights + the
  whole K/V cache, ``roofline.decode_step_bytes``) over the device's measured
  copy bandwidth (``roofline.device_copy_bandwidth``).
- ``parity``: float32 logits of ``jagent.models.apply`` (matmul precision
  "highest") against transformers on the same device, the weights exported by
  ``jagent.models.save_hf_checkpoint``: ``max_abs_diff`` over ``--parity_batch``
  x ``--parity_seq`` random tokens, and ``max_abs_logit`` for scale.
- ``mfu``: one SFT step of ``--model`` (bfloat16 activations over float32
  weights, AdamW; ``scaling.measure_mfu`` on one device): ``tflops_per_s`` =
  ``roofline.train_step_flops`` (``6 x N x T`` plus attention) / step
  seconds, and ``mfu`` = that / the device's dense bf16 peak
  (``--peak_tflops``, else ``roofline.peak_tflops(device_kind)``; None for an
  unknown kind).

Without torch and transformers (``pip install -e .[hf]``), or where torch
sees no device of jax's backend (a TPU host, a CPU-only torch on a GPU host),
the transformers figures are None and ``hf_skipped`` (``generate``) or
``skipped`` (``parity``) says why; those sections do not fail.

Sizes: accelerator defaults (:func:`default_sizes`); on a CPU backend (or
with ``--toy``) toy sizes instead (tiny models, a few steps: every section in
a minute or two, as the test suite runs it). Any size flag overrides either.
Unless set, ``XLA_PYTHON_CLIENT_PREALLOCATE=false``: jax takes device memory
as it needs it instead of 75% up front, so the RAGEN step (60-71 GiB
estimated on one device, +-30%, docs/scaling.md) can use most of an 80 GB GPU
and torch gets what jax leaves.

Prints one table (a row per section as it finishes) and one JSON line with
every figure. Speed is measured here, never in tests.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments import common
from experiments import experiment
from experiments import stats
from experiments import train as train_job
from experiments.benchmarks import generate
from experiments.benchmarks import roofline
from experiments.benchmarks import timing
from experiments.configs import ragen
from experiments.configs import tiny
import jagent
from jagent import models

SECTIONS = ("versions", "ragen_rl", "smoke_train", "generate", "parity", "mfu")
_ENV = "Sokoban-6x6-1box-v0,starpo_s"


@dataclasses.dataclass(frozen=True)
class Sizes:
  """The sizes of every section (each a flag of the same name).

  Attributes:
    model: the ``jagent.models`` named config of ``generate``, ``parity`` and
      ``mfu`` (random weights).
    smoke_model: the smoke train's model (``config.model``).
    smoke_sft_steps: its SFT steps (``sft.steps``; ``sft.num_demos`` is
      ``smoke_sft_demos``).
    smoke_sft_demos: its SFT demonstrations.
    smoke_rl_steps: its RL steps.
    smoke_groups: its rollout groups (``rollout.num_groups``, ``group_size``
      ``smoke_group_size``).
    smoke_group_size: its rollouts per group.
    smoke_eval_levels: its held-out levels (one evaluation chunk).
    gen_batch, gen_prompt, gen_new: rows, prompt tokens and new tokens of
      ``generate``.
    parity_batch, parity_seq: the random tokens of ``parity``.
    mfu_batch, mfu_seq: the random tokens of the ``mfu`` SFT step.
    ragen_model: ``ragen_rl``'s ``config.model``.
    ragen_steps: its RL iterations (the first includes the compile).
    ragen_groups, ragen_group_size, ragen_turns, ragen_tokens_per_turn: its
      rollout sizes; 0 keeps the RAGEN config's (8, 16, 5, 400).
    repeats: timed calls of ``generate`` and ``mfu`` (the best is kept).
  """

  model: str = "qwen2.5-0.5b"
  smoke_model: str = "micro"
  smoke_sft_steps: int = 50
  smoke_sft_demos: int = 32
  smoke_rl_steps: int = 3
  smoke_groups: int = 16
  smoke_group_size: int = 8
  smoke_eval_levels: int = 64
  gen_batch: int = 64
  gen_prompt: int = 128
  gen_new: int = 128
  parity_batch: int = 2
  parity_seq: int = 128
  mfu_batch: int = 8
  mfu_seq: int = 1024
  ragen_model: str = "qwen2.5-0.5b"
  ragen_steps: int = 2
  ragen_groups: int = 0
  ragen_group_size: int = 0
  ragen_turns: int = 0
  ragen_tokens_per_turn: int = 0
  repeats: int = 3


# CPU: tiny models and a few steps, every section in a minute or two on 2 cores.
TOY_SIZES = Sizes(
    model="tiny", smoke_model="nano", smoke_sft_steps=4, smoke_sft_demos=8,
    smoke_rl_steps=3, smoke_groups=4, smoke_group_size=2, smoke_eval_levels=4,
    gen_batch=2, gen_prompt=8, gen_new=16, parity_batch=2, parity_seq=16, mfu_batch=2,
    mfu_seq=32, ragen_model="nano", ragen_steps=2, ragen_groups=4, ragen_group_size=2,
    ragen_turns=2, ragen_tokens_per_turn=8, repeats=1)

_MODEL_FIELDS = ("model", "smoke_model", "ragen_model")
# Fields where 0 means "the config's own value".
_ZERO_KEEPS = ("ragen_groups", "ragen_group_size", "ragen_turns", "ragen_tokens_per_turn")


def default_sizes(toy: bool | None = None) -> Sizes:
  """:data:`TOY_SIZES` on a CPU backend (or with ``toy``), else the accelerator ``Sizes()``."""
  if toy is None:
    toy = jax.default_backend() == "cpu"
  return TOY_SIZES if toy else Sizes()


def check_sizes(sizes: Sizes) -> None:
  """Raises ValueError naming the first bad size (as its flag), before anything compiles."""
  names = models.config_names()
  for f in dataclasses.fields(sizes):
    v = getattr(sizes, f.name)
    if f.name in _MODEL_FIELDS:
      if v not in names:
        raise ValueError(f"--{f.name}={v!r}: must be one of {names}")
      continue
    jagent.check_int(f"--{f.name}", v, 0 if f.name in _ZERO_KEEPS else 1)
  cfg = models.get_config(sizes.model)
  for flag, n in (("gen_prompt + gen_new", sizes.gen_prompt + sizes.gen_new),
                  ("parity_seq", sizes.parity_seq), ("mfu_seq", sizes.mfu_seq)):
    if n > cfg.max_position:
      raise ValueError(f"--{flag}={n}: {sizes.model} has {cfg.max_position} positions")


def hf_device() -> tuple[str | None, str | None]:
  """Where transformers runs beside jax: ``(torch device, None)`` or ``(None, why not)``.

  "cpu" on jax's CPU backend, "cuda" on its GPU backend when torch sees a
  GPU; otherwise None and the reason (torch or transformers missing, torch
  without a GPU, a backend torch does not run on).
  """
  why = generate.hf_missing()
  if why:
    return None, why
  backend = jax.default_backend()
  if backend == "cpu":
    return "cpu", None
  import torch  # pylint: disable=g-import-not-at-top
  if backend == "gpu" and torch.cuda.is_available():
    return "cuda", None
  if backend == "gpu":
    return None, f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False)"
  return None, f"torch has no {backend} device to run transformers beside jax"


def _version(dist: str) -> str | None:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


def versions(sizes: Sizes) -> dict[str, Any]:
  """Package versions and the devices (``versions`` section)."""
  del sizes
  out = {name: _version(name) for name in
         ("jax", "jaxlib", "flax", "optax", "torch", "transformers")}
  devices = jax.devices()
  out.update(backend=jax.default_backend(), device_kind=devices[0].device_kind,
             device_count=len(devices), process_count=jax.process_count())
  device, why = hf_device()
  out["torch_device"] = device
  if device == "cuda":
    import torch  # pylint: disable=g-import-not-at-top
    out["torch_gpu"] = torch.cuda.get_device_name(0)
  out["hf_skipped"] = why
  return out


def ragen_config(sizes: Sizes):
  """RAGEN's StarPO-S config with the tiny tokenizer, ChatML and random weights at ``sizes``."""
  c = ragen.get_config(_ENV)
  c.tokenizer = "tiny"
  c.prompt.chat_template = "chatml"
  c.model_dir = ""
  c.model = sizes.ragen_model
  c.diagnostics.every = 0
  for field, value in (("num_groups", sizes.ragen_groups), ("group_size", sizes.ragen_group_size),
                       ("max_turns", sizes.ragen_turns),
                       ("max_tokens_per_turn", sizes.ragen_tokens_per_turn)):
    if value:
      c.rollout[field] = value
  if sizes.ragen_groups or sizes.ragen_group_size:
    c.rl.num_minibatches = 1  # ragen.py's 32-row minibatches assume 8 x 16 rollouts
  return c


def memory_peak_bytes() -> int | None:
  """Device 0's ``peak_bytes_in_use`` since the process started (None on CPU)."""
  stats = jax.devices()[0].memory_stats()
  return None if not stats else stats.get("peak_bytes_in_use")


def ragen_rl(sizes: Sizes) -> dict[str, Any]:
  """Seconds per RL step of RAGEN's setting and the device's peak memory (``ragen_rl``)."""
  c = ragen_config(sizes)
  exp = experiment.Experiment(c)
  state = exp.rl_state(exp.init_params())
  seconds, m = [], {}
  for step in range(sizes.ragen_steps):
    state, m = exp.rl_step(state, step)
    seconds.append(m["time/step_seconds"])
  peak = memory_peak_bytes()
  return dict(model=c.model, num_params=exp.model_config.num_params(),
              rollout_rows=exp.rollout_config.batch_size, context=exp.context_size,
              trained_rows=exp.num_keep * exp.rollout_config.group_size,
              sampled_tokens=m.get("rollout/sampled_tokens"),
              first_step_seconds=seconds[0],
              step_seconds=min(seconds[1:]) if len(seconds) > 1 else None,
              all_step_seconds=seconds, peak_bytes=peak,
              peak_gib=None if peak is None else peak / 2.0 ** 30)


def smoke_config(sizes: Sizes):
  """The tiny config (Sokoban 6x6, StarPO-S) at the smoke train's ``sizes``."""
  c = tiny.get_config(_ENV)
  c.model = sizes.smoke_model
  c.rollout.update(dict(num_groups=sizes.smoke_groups, group_size=sizes.smoke_group_size))
  c.sft.update(dict(num_demos=sizes.smoke_sft_demos, steps=sizes.smoke_sft_steps,
                    batch_size=min(c.sft.batch_size, sizes.smoke_sft_demos),
                    warmup_steps=min(c.sft.warmup_steps, sizes.smoke_sft_steps)))
  c.rl.update(dict(steps=sizes.smoke_rl_steps, warmup_steps=0, num_microbatches=1))
  c.eval.update(dict(num_levels=sizes.smoke_eval_levels, num_groups=sizes.smoke_eval_levels,
                     every=0, greedy=False, samples=1))
  c.checkpoint.update(dict(every=0, keep=1))
  c.diagnostics.every = 0
  return c


def smoke_train(sizes: Sizes) -> dict[str, Any]:
  """The main job on the tiny config, SFT then a few RL steps (``smoke_train``)."""
  c = smoke_config(sizes)
  with tempfile.TemporaryDirectory() as workdir:
    t0 = time.perf_counter()
    summary = train_job.run(c, workdir, progress=False)
    sec = time.perf_counter() - t0
  return dict(model=c.model, sft_steps=c.sft.steps, rl_steps=summary["steps"],
              eval_levels=c.eval.num_levels, train_seconds=sec,
              sft_success=summary["sft"]["success"], rl_success=summary["rl"]["success"])


def generation(sizes: Sizes) -> dict[str, Any]:
  """bfloat16 generation against transformers, and the decode step's roofline (``generate``)."""
  b, p, n = sizes.gen_batch, sizes.gen_prompt, sizes.gen_new
  cfg = models.get_config(sizes.model, dtype="bfloat16", param_dtype="bfloat16")
  params = models.init(cfg, jax.random.key(0))
  prompt = jax.random.randint(jax.random.key(1), (b, p), 3, cfg.vocab_size)
  device, why = hf_device()
  fns = {"ours": (generate.ours(params, cfg, prompt, n), jax.block_until_ready)}
  if device:
    fns["hf"] = (generate.hf_generate(params, cfg, prompt, n, device=device), lambda _: None)
  best = {k: min(v) for k, v in timing.interleaved_seconds(fns, sizes.repeats).items()}
  ours_tps = b * n / best["ours"]
  hf_tps = b * n / best["hf"] if "hf" in best else None
  step = generate.decode_step_seconds(params, cfg, b, p, n, sizes.repeats)
  bandwidth = roofline.device_copy_bandwidth()
  weight_bytes, kv_bytes = roofline.decode_step_bytes(params, cfg, b, p + n)
  roof = (weight_bytes + kv_bytes) / bandwidth
  return dict(model=sizes.model, dtype=cfg.dtype, num_params=cfg.num_params(), batch=b,
              prompt=p, new=n, ours_tokens_per_s=ours_tps, hf_tokens_per_s=hf_tps,
              ratio=None if hf_tps is None else ours_tps / hf_tps, hf_device=device,
              hf_skipped=why, decode_step_ms=step * 1e3, roofline_ms=roof * 1e3,
              times_roofline=step / roof, weight_bytes=weight_bytes, kv_bytes=kv_bytes,
              copy_gb_per_s=bandwidth / 1e9)


def parity(sizes: Sizes) -> dict[str, Any]:
  """float32 logits against transformers' on the same device (``parity``)."""
  device, why = hf_device()
  if device is None:
    return dict(model=sizes.model, max_abs_diff=None, max_abs_logit=None, skipped=why)
  import torch  # pylint: disable=g-import-not-at-top
  b, s = sizes.parity_batch, sizes.parity_seq
  cfg = models.get_config(sizes.model, dtype="float32", param_dtype="float32")
  params = models.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(2), (b, s), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
  # "highest": true float32 matmuls (a GPU's default may use TF32, torch's does not).
  with jax.default_matmul_precision("highest"):
    ours = jax.jit(lambda p, t, q: models.apply(p, t, q, config=cfg)[0])(params, tokens,
                                                                          positions)
    ours = np.asarray(ours, np.float32)
  model = generate.hf_model(params, cfg, device)
  with torch.no_grad():
    ids = torch.from_numpy(np.asarray(tokens, np.int64)).to(device)
    theirs = model(input_ids=ids).logits.float().cpu().numpy()
  return dict(model=sizes.model, dtype=cfg.dtype, batch=b, seq=s, hf_device=device,
              max_abs_diff=float(np.max(np.abs(ours - theirs))),
              max_abs_logit=float(np.max(np.abs(theirs))), skipped=None)


def mfu(sizes: Sizes, peak_tflops: float | None = None) -> dict[str, Any]:
  """Model FLOP/s utilisation of one SFT step of ``sizes.model`` (``mfu``)."""
  # Imported here: its import sets XLA_FLAGS for 8 fake CPU devices, which
  # must not reach this program's backend (already started by now).
  from experiments.benchmarks import scaling  # pylint: disable=g-import-not-at-top
  kind = jax.devices()[0].device_kind
  peak = peak_tflops if peak_tflops is not None else roofline.peak_tflops(kind)
  row = scaling.measure_mfu(sizes.model, sizes.mfu_batch, sizes.mfu_seq, sizes.repeats, peak,
                            num_devices=1, dtype="bfloat16", attention_flops=True)
  row["dtype"] = "bfloat16"
  row["device_kind"] = kind
  return row


# Per section: (function, the figures its table row shows).
_RUNNERS: dict[str, tuple[Callable[..., dict[str, Any]], tuple[str, ...]]] = {
    "versions": (versions, ("jax", "jaxlib", "flax", "optax", "torch", "transformers",
                            "backend", "device_kind", "device_count", "torch_device")),
    "ragen_rl": (ragen_rl, ("model", "step_seconds", "first_step_seconds", "peak_gib")),
    "smoke_train": (smoke_train, ("train_seconds", "sft_success", "rl_success")),
    "generate": (generation, ("ours_tokens_per_s", "hf_tokens_per_s", "ratio",
                              "decode_step_ms", "roofline_ms", "times_roofline",
                              "hf_skipped")),
    "parity": (parity, ("max_abs_diff", "max_abs_logit", "skipped")),
    "mfu": (mfu, ("model", "seconds", "tflops_per_s", "peak_tflops_per_device", "mfu")),
}


def _fmt(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def _row(name: str, res: dict[str, Any]) -> str:
  if "error" in res:
    shown = f"error: {res['error']}"
  else:
    shown = " ".join(f"{k}={_fmt(res.get(k))}" for k in _RUNNERS[name][1]
                     if not (k in ("hf_skipped", "skipped") and res.get(k) is None))
  return f"| {name} | {res['section_seconds']:.1f} | {shown} |"


def run(sizes: Sizes | None = None, *, sections=SECTIONS, peak_tflops: float | None = None,
        out=None) -> dict[str, Any]:
  """Runs ``sections`` in :data:`SECTIONS` order, prints the table and the JSON line.

  Args:
    sizes: every section's sizes (default: :func:`default_sizes` of the backend).
    sections: names from :data:`SECTIONS` to run (the others are left out).
    peak_tflops: one device's dense peak for ``mfu`` (None: the table's).
    out: the text stream printed to (default ``sys.stdout``).

  Returns:
    ``{section: figures}`` for each section run (each with its wall time,
    ``section_seconds``, and
    ``error`` when it raised), plus ``"sizes"`` and ``"failed"`` (the names of
    the sections that raised).

  Raises:
    ValueError: an unknown section, a bad size (:func:`check_sizes`) or a
      ``peak_tflops`` <= 0, before anything runs.
  """
  out = out or sys.stdout
  sizes = sizes or default_sizes()
  unknown = [s for s in sections if s not in SECTIONS]
  if unknown or not sections:
    raise ValueError(f"--sections={','.join(sections)}: must name some of {SECTIONS}")
  check_sizes(sizes)
  if peak_tflops is not None and not peak_tflops > 0:
    raise ValueError(f"--peak_tflops={peak_tflops!r}: must be > 0")
  print("| section | seconds | figures |", file=out)
  print("| --- | ---: | --- |", file=out)
  results: dict[str, Any] = {}
  for name in SECTIONS:
    if name not in sections:
      continue
    fn = _RUNNERS[name][0]
    t0 = time.perf_counter()
    try:
      res = fn(sizes, peak_tflops) if name == "mfu" else fn(sizes)
    except Exception as e:  # pylint: disable=broad-exception-caught
      traceback.print_exc()  # to stderr; the row and the JSON carry the message
      res = {"error": f"{type(e).__name__}: {e}"}
    res["section_seconds"] = time.perf_counter() - t0
    results[name] = res
    print(_row(name, res), file=out, flush=True)
  results["sizes"] = dataclasses.asdict(sizes)
  results["failed"] = [k for k in SECTIONS if k in results and "error" in results[k]]
  print(json.dumps(results, default=float), file=out, flush=True)
  return results


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagValues:
  """Defines ``--sections``, ``--toy``, ``--peak_tflops`` and one flag per :class:`Sizes` field.

  A size flag left unset takes :func:`default_sizes`' value of the backend.
  """
  fv = {"flag_values": flag_values}
  flags.DEFINE_list("sections", list(SECTIONS), f"Sections to run, of {SECTIONS}.", **fv)
  flags.DEFINE_bool("toy", None, "Toy sizes (default: on a CPU backend only).", **fv)
  flags.DEFINE_float("peak_tflops", None, "Dense bf16 peak TFLOP/s of one device for the MFU "
                     "(default: roofline.PEAK_BF16_TFLOPS by device kind).", **fv)
  for f in dataclasses.fields(Sizes):
    define = flags.DEFINE_string if f.name in _MODEL_FIELDS else flags.DEFINE_integer
    define(f.name, None, f"Sizes.{f.name} (default {getattr(Sizes(), f.name)!r}, toy "
           f"{getattr(TOY_SIZES, f.name)!r}).", **fv)
  return flag_values


def sizes_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> Sizes:
  """:func:`default_sizes` (``--toy`` or the backend) with every size flag that was set."""
  given = {f.name: flag_values[f.name].value for f in dataclasses.fields(Sizes)
           if flag_values[f.name].value is not None}
  return dataclasses.replace(default_sizes(flag_values.toy), **given)


def main(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """Runs :func:`run` with ``flag_values``; exit status 1 when a section failed."""
  del argv
  common.setup_compilation_cache()
  res = run(sizes_from_flags(flag_values), sections=flag_values.sections,
            peak_tflops=flag_values.peak_tflops)
  if res["failed"]:
    sys.exit(1)


if __name__ == "__main__":
  # Before jax starts its backend: take device memory as needed (see above).
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  define_flags()
  app.run(main)
