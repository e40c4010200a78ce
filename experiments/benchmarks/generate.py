r"""Generation throughput: ours vs transformers on PyTorch CPU, and the roofline.

    python -m experiments.benchmarks.generate [--batch=64] [--prompt=32] [--new=128]
        [--attention_impls=auto]

For the ``tiny`` and ``small-10m`` configs (random weights, float32):
- ``ours``: generated tokens/s of ``jagent.models.generate`` (one jit: prefill
  + while-loop decode, temperature 1 sampling, no EOS so every row runs to
  ``--new`` tokens), best of ``--repeats`` after a warm-up compile, timed in
  rounds interleaved with ``hf`` (``timing.interleaved_seconds``);
- ``hf``: the same weights exported with ``save_hf_checkpoint`` and loaded by
  ``transformers.Qwen2ForCausalLM`` (its default attention), timed
  ``model.generate(do_sample=True, min_new_tokens=max_new_tokens)`` with torch
  using every core (needs the ``hf`` extra: ``pip install -e .[hf]``; without
  it the column stays empty and a line above the table says why);
- ``decode_ms``: one decode step (batch ``--batch``, cache of prompt + new
  slots, filled from the prompt on, one token per row and step, picked by the
  library's greedy sampler) timed inside a jitted ``fori_loop``;
  ``roofline_ms``: bytes read per step (all weights + the whole K/V cache,
  which every decode step attends over) divided by the measured copy
  bandwidth (``np.copyto`` of a 256 MiB array); ``compute_ms``: the step's
  matmul FLOPs (``roofline.decode_step_flops``) divided by the measured rate of a
  1024^3 float32 matmul; ``x max``: the step against the larger of the two
  (at batch 64 the ~10M config is compute-bound on a 2-core AVX2 CPU, so the
  memory roofline alone cannot be reached there).

With several ``--attention_impls`` (``ModelConfig.attention_impl`` values,
e.g. ``reference,xla``) each config gets one row per implementation, all
timed in the same interleaved rounds; ``x first`` is a row's generation
time over the first implementation's.

Prints a table and one JSON line per config and implementation. Speed is
measured here, never in tests.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import peers
from experiments.benchmarks import roofline
from experiments.benchmarks import timing
from jagent import models



def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagValues:
  """Defines the command's flags on ``flag_values`` (by ``__main__`` only).

  Not at import, so other programs (``experiments.benchmarks.accelerator``)
  can import this module's functions next to their own flags.
  """
  flags.DEFINE_integer("batch", 64, "Rows generated in parallel.", flag_values=flag_values)
  flags.DEFINE_integer("prompt", 32, "Prompt tokens per row.", flag_values=flag_values)
  flags.DEFINE_integer("new", 128, "New tokens per row.", flag_values=flag_values)
  flags.DEFINE_integer("repeats", 5, "Timed repeats; the best is reported.",
                       flag_values=flag_values)
  flags.DEFINE_list("configs", ["tiny", "small-10m"], "Named model configs.",
                    flag_values=flag_values)
  flags.DEFINE_bool("hf", True, "Also time transformers (if installed).",
                    flag_values=flag_values)
  flags.DEFINE_list("attention_impls", ["auto"],
                    "ModelConfig.attention_impl values timed side by side.",
                    flag_values=flag_values)
  return flag_values


def ours(params, config, prompt, new):
  """A compiled call of ``models.generate`` (new key each call)."""
  b, p = prompt.shape
  sp = models.SamplingConfig(max_new_tokens=new, temperature=1.0)
  lengths = jnp.full((b,), p, jnp.int32)
  counter = itertools.count()

  def run():
    key = jax.random.fold_in(jax.random.key(0), next(counter))
    return models.generate(params, prompt, lengths, key, config=config, sampling=sp)

  jax.block_until_ready(run())
  return run


def decode_step_seconds(params, config, batch, prompt, new, repeats):
  """Seconds per single-token decode step with a cache of ``prompt + new`` slots.

  Starting from ``prompt`` filled slots, times jitted ``fori_loop``s of
  ``new // 8`` and ``new`` decode steps (each appends one token per row, as
  in generation) and divides the difference by the extra steps, so the fixed
  per-call costs (copying the non-donated cache in, allocating outputs)
  cancel.
  """
  cache = models.init_cache(config, batch, prompt + new, lengths=jnp.full((batch,), prompt))
  greedy = models.SamplingConfig(max_new_tokens=1, greedy=True)
  key = jax.random.key(0)
  steps = (max(new // 8, 1), new)

  def make(n):
    @jax.jit
    def loop(params, cache):
      # The weights and cache in the form models.generate's decode loop carries.
      params, cache = models.per_layer_form(params, cache)

      def body(_, carry):
        tok, cache = carry
        logits, cache = models.apply(
            params, tok[:, None], cache.lengths[:, None], cache, config=config,
            num_tokens=jnp.ones((batch,), jnp.int32))
        return models.sample_logits(logits[:, 0], key, greedy)[0], cache
      return jax.lax.fori_loop(0, n, body, (jnp.zeros((batch,), jnp.int32), cache))
    return loop

  short, long = make(steps[0]), make(steps[1])
  t_short = timing.best_seconds(lambda: short(params, cache), repeats)
  t_long = timing.best_seconds(lambda: long(params, cache), repeats)
  return max(t_long - t_short, 1e-9) / (steps[1] - steps[0])


def hf_missing(enabled: bool = True) -> str | None:
  """Why the ``hf`` column stays empty: ``--nohf``, or :func:`peers.missing` torch/transformers."""
  if not enabled:
    return "--nohf was given"
  return peers.missing(("torch", "transformers"), "hf")


def hf_model(params, config, device: str = "cpu"):
  """``params`` exported with ``save_hf_checkpoint`` and loaded by transformers on ``device``.

  Args:
    params: the model's parameters (any device; gathered to the host).
    config: their ``jagent.models.ModelConfig``; the torch model computes in
      ``config.dtype`` (e.g. ``torch.bfloat16`` for "bfloat16").
    device: a torch device name ("cpu", "cuda").

  Returns:
    The ``transformers`` model (eval mode; its default attention).

  Raises:
    ImportError: torch or transformers is not installed (:func:`hf_missing`).
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    models.save_hf_checkpoint(params, config, tmp)
    # use_kernels=False: transformers' own PyTorch layers (its default swaps in
    # kernels fetched from the Hugging Face Hub, a download at run time).
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp, dtype=getattr(torch, config.dtype), use_kernels=False)
  return model.to(device).eval()


def hf_generate(params, config, prompt, new, device: str = "cpu"):
  """A warmed-up call of transformers' generate with the same weights (see :func:`hf_missing`).

  On "cpu" torch uses every core; on "cuda" each call waits for the GPU
  (``torch.cuda.synchronize``) so its wall time includes the work.
  """
  import torch  # pylint: disable=g-import-not-at-top
  if device == "cpu":
    torch.set_num_threads(os.cpu_count() or 1)
  model = hf_model(params, config, device)
  ids = torch.from_numpy(np.asarray(prompt, np.int64)).to(device)
  mask = torch.ones_like(ids)

  def run():
    with torch.no_grad():
      out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0,
                           top_k=0, top_p=1.0, max_new_tokens=new, min_new_tokens=new,
                           eos_token_id=None, pad_token_id=config.pad_id)
    if device != "cpu":
      torch.cuda.synchronize()
    return out
  out = run()
  assert out.shape == (prompt.shape[0], prompt.shape[1] + new), out.shape
  return run


def main(argv, flag_values: flags.FlagValues = flags.FLAGS):
  """Runs the benchmark with ``flag_values`` (see :func:`define_flags`)."""
  del argv
  fv = flag_values
  b, p, n = fv.batch, fv.prompt, fv.new
  bw = roofline.copy_bandwidth()
  rate = roofline.matmul_flops_per_s()
  print(f"devices={jax.devices()} copy bandwidth {bw / 1e9:.1f} GB/s; matmul "
        f"{rate / 1e9:.0f} GFLOP/s; batch {b}, prompt {p}, new {n}")
  impls = fv.attention_impls
  for impl in impls:
    models.ModelConfig(attention_impl=impl)  # a bad name fails before any compile
  header = (f"{'config':>10} {'impl':>9} {'params':>8} {'ours tok/s':>11} {'hf tok/s':>9} "
            f"{'ratio':>6} {'x first':>7} {'decode ms':>9} {'roofline ms':>11} {'x roof':>6} "
            f"{'compute ms':>10} {'x max':>6}")
  skipped = hf_missing(fv.hf)
  if skipped:
    print(f"hf column empty: {skipped}")
  print(header)
  rows = []
  for name in fv.configs:
    base = models.get_config(name)
    params = models.init(base, jax.random.key(0))
    prompt = jax.random.randint(jax.random.key(1), (b, p), 3, base.vocab_size)
    configs = {impl: base.replace(attention_impl=impl) for impl in impls}
    fns = {impl: (ours(params, configs[impl], prompt, n), jax.block_until_ready)
           for impl in impls}
    hf_run = None if skipped else hf_generate(params, base, prompt, n)
    if hf_run is not None:
      fns["hf"] = (hf_run, lambda _: None)
    best = {k: min(v) for k, v in timing.interleaved_seconds(fns, fv.repeats).items()}
    hf_tps = b * n / best["hf"] if "hf" in best else None
    slots = p + n
    weight_bytes, kv_bytes = roofline.decode_step_bytes(params, base, b, slots)
    roof = (weight_bytes + kv_bytes) / bw
    compute = roofline.decode_step_flops(base, b, slots) / rate
    for impl in impls:
      config = configs[impl]
      ours_tps = b * n / best[impl]
      x_first = best[impl] / best[impls[0]]
      step = decode_step_seconds(params, config, b, p, n, fv.repeats)
      times_max = step / max(roof, compute)
      row = dict(config=name, attention_impl=impl, params=config.num_params(), batch=b,
                 prompt=p, new=n, ours_tokens_per_s=round(ours_tps, 1),
                 hf_tokens_per_s=None if hf_tps is None else round(hf_tps, 1),
                 ratio=None if hf_tps is None else round(ours_tps / hf_tps, 2),
                 hf_skipped=skipped, times_first_impl=round(x_first, 3),
                 decode_step_ms=round(step * 1e3, 3), roofline_ms=round(roof * 1e3, 3),
                 times_roofline=round(step / roof, 2), weight_mb=round(weight_bytes / 1e6, 2),
                 kv_mb=round(kv_bytes / 1e6, 2), copy_gb_per_s=round(bw / 1e9, 2),
                 compute_roofline_ms=round(compute * 1e3, 3),
                 times_max_roofline=round(times_max, 2),
                 matmul_gflop_per_s=round(rate / 1e9, 1))
      rows.append(row)
      hf_s = "-" if hf_tps is None else f"{hf_tps:9.0f}"
      ratio = "-" if hf_tps is None else f"{ours_tps / hf_tps:6.2f}"
      print(f"{name:>10} {impl:>9} {config.num_params() / 1e6:7.2f}M {ours_tps:11.0f} "
            f"{hf_s:>9} {ratio:>6} {x_first:7.3f} {step * 1e3:9.3f} {roof * 1e3:11.3f} "
            f"{step / roof:6.2f} {compute * 1e3:10.3f} {times_max:6.2f}")
  for row in rows:
    print(json.dumps(row))


if __name__ == "__main__":
  define_flags()
  app.run(main)
