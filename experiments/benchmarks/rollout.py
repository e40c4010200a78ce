r"""Multi-turn rollout throughput: the on-device rollout vs host-loop baselines.

    python -m experiments.benchmarks.rollout [--env=Sokoban-6x6-1box-v0] \
        [--num_groups=8] [--group_size=16] [--max_turns=5] \
        [--max_tokens_per_turn=32] [--model=tiny] [--repeats=3] \
        [--history_turns=0,2] [--norl_step] [--tree_fork_turns=1,2] \
        [--tree_branches=2,4] [--notree]

Same model (``--model``, random weights), tokenizer (the tiny one), prompt
(``PromptConfig.compact()``, think mode), batch ``B = num_groups x
group_size``, turns, reply budget, context size and key for every row of the
table. Sampling is at temperature 1, so random weights reply with arbitrary
tokens until ``</answer>``, EOS or ``--max_tokens_per_turn``; the mean reply
length is printed so the rates compare equal work. Rows:

- ``on-device``: :func:`jagent.rollout.make_rollout`, the whole rollout as one
  jit-compiled program (prompts rendered, replies parsed and envs stepped on
  device, KV cache kept across turns);
- ``host re-encode (RAGEN)``: :func:`jagent.rollout.host_rollout` with
  ``reencode=True``: each turn re-tokenizes the whole conversation on the
  host and prefills it from an empty cache, as RAGEN does, with the env
  stepped from Python (:class:`jagent.rollout.JaxEnvAsHost`, one env per row);
  this is the baseline of the goal (on-device >= 3x);
- ``host incremental``: the same host loop with ``reencode=False`` (KV cache
  kept, only the new turn's tokens tokenized and prefilled; host env stepping
  and host parsing);
- ``on-device, history_turns=k`` (one row per k of ``--history_turns``):
  the same program with bounded-history contexts
  (``RolloutConfig.history_turns``): one row per turn, its window of the
  last k turns assembled on device and prefilled from an empty cache, with
  its own (shorter) context size;
- ``on-device tree ...`` (``--tree``): the same program with
  ``RolloutConfig.tree``: each group's episodes grow as trees that fork the
  environment state and KV cache at ``--tree_fork_turns`` into
  ``--tree_branches`` children per node (every node expands), so the copied
  prefixes are sampled and stepped once. Its group holds
  ``round(group_size * max_turns / TreeConfig.full_turns(max_turns))``
  trees: the chain's sampled-turn budget when every episode plays all its
  turns (random weights: it does), so both rows sample about the same
  tokens. The default shape is Tree-GRPO's (Ji et al., arXiv 2509.21240,
  Sec. 3.1: a few chains, nodes expanded at early steps, trees of 4-8
  leaves): forks at turns 1 and 2 of 5 with K = 2 then 4, 8 episodes in
  27 sampled turns instead of 40, at most 40 / 27 = 1.48x the trajectories
  a token (Tree-GRPO reports ~1.5x). Forking at turn 0 would share no
  sampled token (only the first prompt), and forking later shares more but
  leaves the siblings fewer turns to differ in; 3 trees of 8 a group for
  the chain's 16 episodes. Compared with the on-device chain: finished
  trajectories (played episodes that ended) per sampled token (the sum of
  ``loss_mask``), env turns (each environment step once,
  ``Trajectory.sampled_turns``) per trajectory and wall-clock seconds per
  trajectory, and tree / chain of each (goal: >= 1.4x trajectories a token);
- ``sampler only``: ``max_turns`` calls of :func:`jagent.models.generate` on
  the same shapes inside one jit, no environment, rendering or parsing: an
  estimate of the model's share of the on-device time.

Column ``RL step s`` (on the on-device rows, ``--rl_step``): one whole RL
step with that row's ``history_turns`` (rollout -> StarPO-S filter ->
advantages -> update as one program,
:meth:`experiments.experiment.Experiment.rl_step`) of the main job's config,
``experiments/configs/tiny.py:<env>,starpo_s`` (its answer-only prompt and
filter), with this run's ``--model``, batch, turns and reply budget, random
weights (no SFT). The columns ``vs k=-1`` divide a bounded-history row's
env turns/s and RL step time by the full-history row's. The table of
docs/results.md (k = -1, 0, 2 with the main job's model and batch)::

    python -m experiments.benchmarks.rollout --model=micro --num_groups=8 \
        --group_size=8 --max_tokens_per_turn=6 --history_turns=0,2

Every row is warmed up once (compiles; the host loops compile a few shapes),
then the rows are timed round-robin, ``--repeats`` rounds, with the same key
every call, and each row's best call is kept (``worst s`` shows the spread on
a shared machine). Env turns =
sum of ``Trajectory.sampled_turns()`` (``num_turns`` for a chain; a tree's
shared turns once); generated tokens = sum of ``loss_mask``.
Memory: the process's peak resident set (``getrusage``; it only grows, so each
row shows the peak so far) and the compiled on-device program's memory
analysis (arguments + outputs + temporaries). Prints a table, the ratios, one
summary line and one JSON line. Speed is measured here, never in tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from experiments.benchmarks import rss
from experiments.benchmarks import timing
import jagent
from jagent import models
from jagent import rollout
from jagent import tokenizers

_MODEL = flags.DEFINE_string("model", "tiny", "jagent.models named config (random weights).")
_ENV = flags.DEFINE_string("env", "Sokoban-6x6-1box-v0", "Registered envs_jax id.")
_GROUPS = flags.DEFINE_integer("num_groups", 8, "Initial states per rollout.")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 16, "Rollouts per initial state.")
_TURNS = flags.DEFINE_integer("max_turns", 5, "Assistant turns per episode at most.")
_TOKENS = flags.DEFINE_integer("max_tokens_per_turn", 32, "Sampled tokens per reply at most.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per row; the best is reported.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and of the rollout key.")
_VERIFY = flags.DEFINE_integer("verify_states", 64,
                               "States TextEnv checks against the tokenizer at build.")
_HISTORY = flags.DEFINE_list(
    "history_turns", [], "Extra on-device rows with RolloutConfig.history_turns = each k "
    "(>= 0), e.g. 0,2; the first row is always the full history (-1).")
_SAMPLER = flags.DEFINE_bool("sampler_only", True,
                             "Also time the sampler alone on the same shapes.")
_RL_STEP = flags.DEFINE_bool(
    "rl_step", True, "Also time one RL step (rollout + filter + update, the main job's "
    "experiments/configs/tiny.py) for each on-device row's history_turns.")

_TREE = flags.DEFINE_bool("tree", True, "Also time a tree rollout (RolloutConfig.tree) against "
                          "the on-device chain at an equal sampled-token budget.")
_TREE_FORKS = flags.DEFINE_list("tree_fork_turns", ["1", "2"],
                                "The tree row's fork turns (0-based).")
_TREE_BRANCHES = flags.DEFINE_list("tree_branches", ["2", "4"],
                                   "The tree row's children per expanded node, one per fork.")

GOAL = 3.0  # the target: the on-device rollout is >= 3x the RAGEN-style host loop
TREE_GOAL = 1.4  # trees: finished trajectories per sampled token, tree / chain


def compiled_memory(compiled: Any) -> dict[str, int] | None:
  """Bytes of a compiled program (XLA memory analysis).

  Args:
    compiled: ``jax.jit(f).lower(*args).compile()``.

  Returns:
    ``{"argument_bytes", "output_bytes", "temp_bytes", "total_bytes"}``
    (total = the three summed; aliased outputs are counted twice), or None
    when the backend gives no analysis.
  """
  try:
    analysis = compiled.memory_analysis()
  except (AttributeError, NotImplementedError, RuntimeError):
    return None
  if analysis is None:
    return None
  out = {name: int(getattr(analysis, f"{name}_size_in_bytes", 0) or 0)
         for name in ("argument", "output", "temp")}
  out = {f"{k}_bytes": v for k, v in out.items()}
  out["total_bytes"] = sum(out.values())
  return out


def device_peak_mb() -> float | None:
  """Peak bytes in use on the first device (MiB), when the backend reports it."""
  try:
    stats = jax.local_devices()[0].memory_stats()
  except (AttributeError, NotImplementedError, RuntimeError):
    return None
  if not stats or "peak_bytes_in_use" not in stats:
    return None
  return stats["peak_bytes_in_use"] / 2**20


def warm_up(name: str, fn: Callable[[], Any], extra_seconds: float = 0.0) -> dict[str, Any]:
  """Calls ``fn`` once (compiles) and counts the work of its result.

  Args:
    name: the row's label.
    fn: ``() -> Trajectory``, or ``() -> array`` for the sampler-only row
      (no counts). The same key every call, so every call does the same work
      and the host loops compile nothing new after the warm-up.
    extra_seconds: compile time spent before (added to the warm-up time).

  Returns:
    The row so far: name, ``fn``, warm-up seconds (compile + first call),
    env turns, generated tokens and finished trajectories (None without a
    Trajectory), mean reply length and the process's peak RSS after the
    warm-up.
  """
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  row = dict(name=name, fn=fn, warmup_seconds=extra_seconds + time.perf_counter() - t0,
             env_turns=None, tokens=None, mean_reply=None, trajectories=None)
  if hasattr(out, "num_turns"):
    row["env_turns"] = int(np.sum(np.asarray(out.sampled_turns())))
    row["tokens"] = int(np.sum(np.asarray(out.loss_mask)))
    row["trajectories"] = int(np.sum(np.asarray(out.played() & (out.end_reason != 0))))
    row["mean_reply"] = row["tokens"] / max(row["env_turns"], 1)
  row["peak_rss_mb"] = rss.peak_rss_mb()
  return row


def time_rounds(rows: list[dict[str, Any]], repeats: int) -> None:
  """Times every row ``repeats`` times, interleaved (round-robin), in place.

  Interleaving (``timing.interleaved_seconds``) gives every row the same
  chance of a quiet moment on a shared machine; the best call of each row is
  kept (``seconds``, and the rates ``turns_per_s``, ``tokens_per_s``);
  ``all_seconds`` lists every call.
  """
  secs = timing.interleaved_seconds(
      {i: (row["fn"], jax.block_until_ready) for i, row in enumerate(rows)}, repeats)
  for i, row in enumerate(rows):
    del row["fn"]
    row["all_seconds"] = secs[i]
    row["seconds"] = sec = min(row["all_seconds"])
    row["turns_per_s"] = None if row["env_turns"] is None else row["env_turns"] / sec
    row["tokens_per_s"] = None if row["tokens"] is None else row["tokens"] / sec


def sampler_only(params, model_config, text_env, config, s_max):
  """``key -> tokens``: the rollout's ``generate`` calls alone, in one jit.

  Turn 1 prefills ``first_width`` tokens, later turns ``next_width`` (random
  ids, full length), each followed by a reply with the rollout's sampling
  (EOS, ``</answer>``, ``max_tokens_per_turn``), into one KV cache of
  ``s_max`` slots. No environment, rendering, parsing or bookkeeping.
  """
  b = config.batch_size
  sampling = config.sampling(text_env.eos_id, text_env.stop_strings)
  table, table_len = text_env.tokenizer.token_bytes()
  vocab = text_env.tokenizer.vocab_size

  @jax.jit
  def run(params, key):
    # Split once, weights and cache, as the rollout does (models.per_layer_form).
    params, cache = models.per_layer_form(params, models.init_cache(model_config, b, s_max))
    out = None
    for t in range(config.max_turns):
      width = text_env.first_width if t == 0 else text_env.next_width
      k_prompt, k_gen = jax.random.split(jax.random.fold_in(key, t))
      prompt = jax.random.randint(k_prompt, (b, width), 3, vocab)
      out = models.generate(params, prompt, jnp.full((b,), width, jnp.int32), k_gen, cache,
                            config=model_config, sampling=sampling,
                            token_table=(jnp.asarray(table), jnp.asarray(table_len)))
      cache = out.cache
    return out.tokens

  return lambda key: run(params, key)


def rl_stepper(config) -> tuple[Callable[[], dict[str, float]], Any]:
  """``(step, experiment)``: ``step()`` runs one RL step of ``config`` in place.

  Each call is :meth:`experiments.experiment.Experiment.rl_step` at step 0 (the
  same rollout key every call, so every call does comparable work) on the
  state the previous call returned (the state is donated); it returns that
  step's float metrics. The first call compiles.
  """
  from experiments import experiment  # pylint: disable=g-import-not-at-top
  exp = experiment.Experiment(config)  # validates (naming config fields) before compiling
  holder = {"state": exp.rl_state(exp.init_params())}

  def step():
    holder["state"], metrics = exp.rl_step(holder["state"], 0)
    return metrics

  return step, exp


def tree_shape(group_size: int, max_turns: int, fork_turns, branches) -> rollout.TreeConfig:
  """The tree row's :class:`jagent.rollout.TreeConfig` at the chain's token budget.

  Every node expands (``expand=None``); the group holds
  ``max(1, round(group_size * max_turns / full_turns))`` trees, so it samples
  about the turns of ``group_size`` chain episodes that play ``max_turns``.

  Raises:
    ValueError: fork turns or branches not ints, naming the flag; a bad
      shape, naming the ``RolloutConfig.tree`` field (before compiling).
  """
  try:
    forks = tuple(int(t) for t in fork_turns)
  except ValueError:
    raise ValueError(f"--tree_fork_turns={fork_turns!r}: must be ints") from None
  try:
    ks = tuple(int(k) for k in branches)
  except ValueError:
    raise ValueError(f"--tree_branches={branches!r}: must be ints") from None
  tree = rollout.TreeConfig(fork_turns=forks, branches=ks[0] if len(ks) == 1 else ks)
  # A bad shape fails here, naming its field (no fork turn: before any size).
  rollout.RolloutConfig(num_groups=1, group_size=tree.group_size() if forks else 1,
                        max_turns=max_turns, tree=tree)
  trees = max(1, round(group_size * max_turns / tree.full_turns(max_turns)))
  return dataclasses.replace(tree, trees=trees)


def tree_vs_chain(chain: dict[str, Any], tree: dict[str, Any]) -> dict[str, Any]:
  """Per-trajectory rates of the chain and tree rows and tree / chain of each.

  Returns:
    ``{"chain": ..., "tree": ..., "ratio": ...}``, each with
    ``trajectories_per_1k_tokens``, ``env_turns_per_trajectory`` and
    ``seconds_per_trajectory`` (ratios: tree's / chain's).
  """
  def rates(r):
    n = r["trajectories"]
    return {"trajectories_per_1k_tokens": 1000.0 * n / r["tokens"],
            "env_turns_per_trajectory": r["env_turns"] / n,
            "seconds_per_trajectory": r["seconds"] / n}
  c, t = rates(chain), rates(tree)
  return {"chain": c, "tree": t, "ratio": {k: t[k] / c[k] for k in c}}


def run(model: str, env_id: str, num_groups: int, group_size: int, max_turns: int,
        max_tokens_per_turn: int, repeats: int, seed: int = 0, verify_states: int = 64,
        with_sampler: bool = True, history_turns=(), with_rl_step: bool = True,
        tree_forks=None, tree_branches=("2", "4")) -> dict[str, Any]:
  """Builds the model, env and rollouts, times every row; returns the results.

  ``history_turns``: k >= 0 of the extra bounded-history on-device rows.
  ``with_rl_step``: also time one RL step (``configs/tiny.py``'s
  ``benchmark_config``) for each
  on-device row's k (-1 and ``history_turns``), in the same rounds.
  ``tree_forks`` (None: no tree row) and ``tree_branches``: the tree row's
  shape (:func:`tree_shape`).

  Raises:
    ValueError: a bad size, repeat count, model, env name, history_turns or
      tree shape (before compiling).
  """
  try:
    history_turns = [int(k) for k in history_turns]
  except ValueError:
    raise ValueError(f"--history_turns={history_turns!r}: must be ints >= 0") from None
  if any(k < 0 for k in history_turns):
    raise ValueError(f"--history_turns={history_turns!r}: must be ints >= 0 (-1, the full "
                     "history, is always the first row)")
  jagent.check_int("--repeats", repeats, 1)
  if model not in models.config_names():
    raise ValueError(f"--model={model!r}: known configs are {models.config_names()}")
  config = rollout.RolloutConfig(num_groups=num_groups, group_size=group_size,
                                 max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn,
                                 temperature=1.0)
  tree = None if tree_forks is None else tree_shape(group_size, max_turns, tree_forks,
                                                    tree_branches)
  rl_configs = {}
  if with_rl_step:
    from experiments import spec  # pylint: disable=g-import-not-at-top
    from experiments.configs import tiny  # pylint: disable=g-import-not-at-top
    for k in [-1, *history_turns]:
      rl_configs[k] = tiny.benchmark_config(env_id, "starpo_s", model, num_groups, group_size,
                                            max_turns, max_tokens_per_turn, k, seed)
      spec.validate(rl_configs[k])  # a bad config fails here, naming its field
  env, env_params = envs_jax.make(env_id)
  tok = tokenizers.load_tiny_tokenizer()
  model_config = models.get_config(model)
  text_env = rollout.TextEnv(env, tok, rollout.PromptConfig.compact(), env_params=env_params,
                             verify_states=verify_states)
  s_max = rollout.context_size(text_env, config)
  params = models.init(model_config, jax.random.key(seed))
  key = jax.random.key(seed + 1)
  rows = []

  device_fn = rollout.make_rollout(text_env, model_config, config, env_params)
  t0 = time.perf_counter()
  compiled = device_fn.lower(params, key).compile()
  rows.append(warm_up("on-device (make_rollout)", lambda: compiled(params, key),
                      time.perf_counter() - t0))
  rows[0]["history_turns"] = -1
  memory = compiled_memory(compiled)
  device_peak = device_peak_mb()
  if with_sampler:
    sampler = sampler_only(params, model_config, text_env, config, s_max)
    rows.append(warm_up("sampler only (no env; estimate)", lambda: sampler(key)))
  hosts = [rollout.JaxEnvAsHost(env, env_params) for _ in range(config.batch_size)]
  for name, reencode in (("host re-encode (RAGEN)", True), ("host incremental KV", False)):
    def host(reencode=reencode):
      return rollout.host_rollout(params, key, hosts, text_env.conversation,
                                  model_config=model_config, config=config,
                                  context_size=s_max, reencode=reencode)
    rows.append(warm_up(name, host))
  contexts = {}
  for k in history_turns:
    k_config = dataclasses.replace(config, history_turns=k)
    contexts[k] = rollout.context_size(text_env, k_config)
    fn = rollout.make_rollout(text_env, model_config, k_config, env_params)
    rows.append(warm_up(f"on-device, history_turns={k}", lambda fn=fn: fn(params, key)))
    rows[-1]["history_turns"] = k
  tree_info = None
  if tree is not None:
    t_config = dataclasses.replace(config, group_size=tree.group_size(), tree=tree)
    fn = rollout.make_rollout(text_env, model_config, t_config, env_params)
    ks = tree.branches if isinstance(tree.branches, tuple) else (tree.branches,)
    rows.append(warm_up(f"on-device tree (K {','.join(map(str, ks))})",
                        lambda fn=fn: fn(params, key)))
    tree_info = dict(fork_turns=list(tree.fork_turns), branches=list(ks), trees=tree.trees,
                     rows_per_tree=tree.rows_per_tree(), group_size=tree.group_size(),
                     batch=t_config.batch_size, full_turns=tree.full_turns(max_turns),
                     context_size=rollout.context_size(text_env, t_config), row=rows[-1]["name"])
  steps, rl_info = [], None
  for k, rl_config in rl_configs.items():
    step, exp = rl_stepper(rl_config)
    entry = warm_up(f"RL step, history_turns={k}", step)
    entry["history_turns"] = k
    steps.append(entry)
    rl_info = dict(config=f"experiments/configs/tiny.py:{env_id},starpo_s",
                   algorithm=exp.config.algorithm, model=model, batch=config.batch_size,
                   kept_groups=exp.num_keep, sft_steps=0)
  time_rounds(rows + steps, repeats)
  if with_sampler:
    rows[1]["share_of_device"] = rows[1]["seconds"] / rows[0]["seconds"]
  by_k = {r["history_turns"]: r for r in rows if "history_turns" in r}
  for entry in steps:
    row = by_k[entry["history_turns"]]
    row["rl_step_seconds"] = entry["seconds"]
    row["rl_step_all_seconds"] = entry["all_seconds"]
    row["rl_step_warmup_seconds"] = entry["warmup_seconds"]
  full = by_k[-1]
  for k, row in by_k.items():
    if k >= 0:
      row["vs_full_history"] = {
          "turns_per_s": row["turns_per_s"] / full["turns_per_s"],
          "tokens_per_s": row["tokens_per_s"] / full["tokens_per_s"],
          "rl_step_seconds": (row["rl_step_seconds"] / full["rl_step_seconds"]
                              if "rl_step_seconds" in row else None)}

  by_name = {r["name"]: r for r in rows}
  dev = by_name["on-device (make_rollout)"]
  if tree_info is not None:
    tree_info.update(tree_vs_chain(dev, by_name[tree_info["row"]]))
  ratios = {}
  for key_name, base in (("ragen", "host re-encode (RAGEN)"),
                         ("incremental", "host incremental KV")):
    ratios[f"turns_vs_{key_name}"] = dev["turns_per_s"] / by_name[base]["turns_per_s"]
    ratios[f"tokens_vs_{key_name}"] = dev["tokens_per_s"] / by_name[base]["tokens_per_s"]
  return dict(model=model, env=env_id, batch=config.batch_size, num_groups=num_groups,
              group_size=group_size, max_turns=max_turns,
              max_tokens_per_turn=max_tokens_per_turn, context_size=s_max,
              history_context_sizes=contexts,
              first_width=text_env.first_width, next_width=text_env.next_width,
              repeats=repeats, rows=rows, ratios=ratios, rl_step=rl_info, tree=tree_info,
              compiled_memory=memory,
              device_peak_mb=device_peak, backend=jax.default_backend(),
              cpu_count=os.cpu_count(), load_average=os.getloadavg())


def _fmt(x, spec):
  return "-" if x is None else format(x, spec)


def report(res: dict[str, Any]) -> None:
  """Prints the table, the ratios, the memory, a summary line and a JSON line."""
  print(f"rollout benchmark: model {res['model']}, env {res['env']}, batch {res['batch']} "
        f"({res['num_groups']} x {res['group_size']}), {res['max_turns']} turns, "
        f"{res['max_tokens_per_turn']} tokens/turn, context {res['context_size']}, "
        f"backend {res['backend']} ({res['cpu_count']} CPUs), load average "
        + " ".join(f"{x:.2f}" for x in res["load_average"]))
  header = (f"{'rollout':34s}{'best s':>9s}{'worst s':>9s}{'compile+1st s':>14s}{'env turns':>10s}"
            f"{'turns/s':>10s}{'tokens':>8s}{'tokens/s':>10s}{'mean reply':>11s}"
            f"{'peak RSS MB':>12s}{'RL step s':>10s}{'turns/s vs k=-1':>16s}"
            f"{'step s vs k=-1':>15s}")
  print(header)
  print("-" * len(header))
  for r in res["rows"]:
    vs = r.get("vs_full_history", {})
    print(f"{r['name']:34s}{r['seconds']:9.3f}{max(r['all_seconds']):9.3f}"
          f"{r['warmup_seconds']:14.1f}"
          f"{_fmt(r['env_turns'], 'd'):>10s}{_fmt(r['turns_per_s'], ',.1f'):>10s}"
          f"{_fmt(r['tokens'], 'd'):>8s}{_fmt(r['tokens_per_s'], ',.0f'):>10s}"
          f"{_fmt(r['mean_reply'], '.1f'):>11s}{r['peak_rss_mb']:12.0f}"
          f"{_fmt(r.get('rl_step_seconds'), '.3f'):>10s}"
          f"{_fmt(vs.get('turns_per_s'), '.2f'):>16s}"
          f"{_fmt(vs.get('rl_step_seconds'), '.2f'):>15s}")
  rl = res.get("rl_step")
  if rl is not None:
    print(f"RL step s: one RL step (rollout + filter + update, Experiment.rl_step) of "
          f"{rl['config']} ({rl['algorithm']}, {rl['kept_groups']} of "
          f"{res['num_groups']} groups kept), model {rl['model']}, batch {rl['batch']}, random "
          "weights, the same key every call; vs k=-1: a row's value / the full-history row's")
  for k, s in res.get("history_context_sizes", {}).items():
    print(f"history_turns={k}: context {s} tokens a row, one row per turn")
  q = res["ratios"]
  print(f"on-device / host re-encode (RAGEN-style, the baseline): "
        f"{q['turns_vs_ragen']:.2f}x env turns/s, {q['tokens_vs_ragen']:.2f}x tokens/s")
  print(f"on-device / host incremental KV: {q['turns_vs_incremental']:.2f}x env turns/s, "
        f"{q['tokens_vs_incremental']:.2f}x tokens/s")
  for r in res["rows"]:
    if "share_of_device" in r:
      print(f"the sampler alone (same shapes, no env) takes {r['share_of_device']:.0%} of the "
            "on-device rollout's time "
            "(the rest: env steps, prompt rendering, parsing, bookkeeping)")
  mem = res["compiled_memory"]
  if mem is not None:
    print(f"on-device program memory (XLA analysis): arguments "
          f"{mem['argument_bytes'] / 2**20:.1f} MiB + outputs {mem['output_bytes'] / 2**20:.1f} "
          f"MiB + temporaries {mem['temp_bytes'] / 2**20:.1f} MiB = "
          f"{mem['total_bytes'] / 2**20:.1f} MiB")
  else:
    print("on-device program memory: no XLA memory analysis on this backend")
  if res["device_peak_mb"] is not None:
    print(f"device peak memory after the on-device rows: {res['device_peak_mb']:.1f} MiB")
  tr = res.get("tree")
  if tr is not None:
    print(f"tree vs chain (on-device, full history): forks at turns {tr['fork_turns']}, K "
          f"{tr['branches']}, {tr['trees']} trees of {tr['rows_per_tree']} a group "
          f"({tr['group_size']} episodes, {tr['full_turns'] * tr['trees']} sampled turns "
          f"when every episode plays {res['max_turns']} turns; the chain: {res['group_size']}, "
          f"{res['group_size'] * res['max_turns']})")
    head = (f"{'':8s}{'trajectories':>13s}{'sampled tokens':>15s}{'env turns':>10s}"
            f"{'traj / 1k tokens':>17s}{'env turns / traj':>17s}{'s / traj':>10s}")
    print(head)
    rows = {r["name"]: r for r in res["rows"]}
    for name, r, v in (("chain", rows["on-device (make_rollout)"], tr["chain"]),
                       ("tree", rows[tr["row"]], tr["tree"])):
      print(f"{name:8s}{r['trajectories']:13d}{r['tokens']:15d}{r['env_turns']:10d}"
            f"{v['trajectories_per_1k_tokens']:17.2f}{v['env_turns_per_trajectory']:17.2f}"
            f"{v['seconds_per_trajectory']:10.4f}")
    v = tr["ratio"]
    print(f"{'tree / chain':36s}{v['trajectories_per_1k_tokens']:17.2f}x"
          f"{v['env_turns_per_trajectory']:16.2f}x{v['seconds_per_trajectory']:9.2f}x")
    print(f"TREE: {v['trajectories_per_1k_tokens']:.2f}x the finished trajectories per sampled "
          f"token of the chain; goal >= {TREE_GOAL:g}x: "
          f"{'met' if v['trajectories_per_1k_tokens'] >= TREE_GOAL else 'NOT met'}")
  ratio = min(q["turns_vs_ragen"], q["tokens_vs_ragen"])
  print(f"SUMMARY: on-device rollout is {q['turns_vs_ragen']:.2f}x (env turns/s) and "
        f"{q['tokens_vs_ragen']:.2f}x (tokens/s) the RAGEN-style host loop; goal >= "
        f"{GOAL:g}x: {'met' if ratio >= GOAL else 'NOT met'}")
  print(json.dumps(res, default=float))


def main(argv):
  del argv
  report(run(_MODEL.value, _ENV.value, _GROUPS.value, _GROUP_SIZE.value, _TURNS.value,
             _TOKENS.value, _REPEATS.value, seed=_SEED.value, verify_states=_VERIFY.value,
             with_sampler=_SAMPLER.value, history_turns=_HISTORY.value,
             with_rl_step=_RL_STEP.value,
             tree_forks=_TREE_FORKS.value if _TREE.value else None,
             tree_branches=_TREE_BRANCHES.value))


if __name__ == "__main__":
  app.run(main)
