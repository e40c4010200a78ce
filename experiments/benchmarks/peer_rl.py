r"""A whole RL iteration side by side: jagent vs Google Tunix's agentic GRPO.

    python -m experiments.benchmarks.peer_rl --setup    # once: Tunix's own virtualenv
    python -m experiments.benchmarks.peer_rl [--iterations=3] [--model=tiny] \
        [--env=Sokoban-6x6-1box-v0] [--num_groups=8] [--group_size=8]

Both frameworks train the same policy on the same game, one RL iteration
(rollout of N x G multi-turn episodes, group-normalised GRPO advantages,
one policy update) after another:

- the same model: ``--model`` (a ``jagent.models`` Qwen2 config, random
  init with ``--seed``); Tunix loads the very same weights
  (``jagent.models.save_hf_checkpoint`` -> Tunix's
  ``tunix.models.qwen2.params.create_model_from_safe_tensors``), float32;
- the same tokenizer (the shipped tiny SentencePiece model), prompt text
  (the main job's, ``experiments/configs/tiny.py``: ChatML, system message,
  the state each turn, answer-only replies) and reply parsing (RAGEN's
  ``<answer>`` regex); the Tunix side checks that its turn-1 prompt text
  equals ours;
- the same levels: iteration k of both plays the N levels of our
  generator drawn from the key of RL step k (``Experiment.rl_key``); the
  Tunix side resets a ``BaseTaskEnv`` to each of them (its initial state
  texts are checked against ours) and steps it with our dynamics
  (``jagent.rollout.JaxEnvAsHost``);
- the same sizes and rules: N = ``--num_groups`` levels x G =
  ``--group_size`` rollouts, the game's turn limit (Sokoban: 5), action
  budget and per-turn reply budget (Sokoban: 6 tokens), temperature 1,
  the whole conversation as one sequence (``history_turns=-1``: Tunix's
  only layout), GRPO advantages ``(r - mean) / (std + eps)`` per group of
  the episode's summed reward, the clipped surrogate (eps 0.2) with each
  episode weighted alike (seq-mean-token-mean), no KL term and no
  reference model, the sampler's log-probs as the old log-probs, one Adam
  update on all N x G episodes per iteration (lr 1e-4, gradients clipped
  at norm 1).

Columns, per framework: ``iteration s``: median wall seconds of one RL
iteration over ``--iterations`` iterations after ``--warmup`` (best in
``best s``); ``rollout s`` / ``update s``: its split where the framework
exposes it (jagent runs the iteration as one program: its rollout program
is timed alone on the same levels and weights, and ``update s`` is the
rest; Tunix: the time from the previous update to ``update_actor``, which
includes the per-group advantages computed as groups finish, and
``update_actor`` itself); env turns/s and generated tokens/s over the
timed iterations; ``warm-up s``: the first iteration (compiles included);
``setup s``: building the model and programs before it; peak RSS of each
process (Tunix runs in its own). Ratios are Tunix / jagent seconds (and
jagent / Tunix rates). The last line is one JSON object with
``jagent_iteration_s``, ``tunix_iteration_s`` and ``ratio_iteration``.

Tunix (``google-tunix`` 0.1.7) pins ``safetensors<0.8`` (jagent pins
0.8.0), so it cannot join jagent's environment: ``--setup`` creates a
virtualenv at ``--peer_venv`` (default ``~/.cache/jagent/peer_venv``) with
``google-tunix==0.1.7`` and jagent's jax, and the Tunix side runs there as
a subprocess (:mod:`experiments.benchmarks.peer_rl_tunix`), handed the
spec and the weights as files and answering with a JSON file. Without
that virtualenv (or with ``--peer=none``) only jagent's side runs and the
Tunix columns say why they are empty. Speed is measured here, never in
tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np

from experiments.benchmarks import timing
from experiments.configs import tiny
from jagent import models
from jagent import rollout

_MODEL = flags.DEFINE_string("model", "tiny", "jagent.models named config (random weights).")
_ENV = flags.DEFINE_string("env", "Sokoban-6x6-1box-v0", "Registered envs_jax id.")
_GROUPS = flags.DEFINE_integer("num_groups", 8, "Levels per iteration (N).")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 8, "Rollouts per level (G).")
_TURNS = flags.DEFINE_integer("max_turns", 0, "Turns per episode at most (0: the game's).")
_TOKENS = flags.DEFINE_integer("max_tokens_per_turn", 0,
                               "Reply budget in tokens (0: the game's).")
_WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed first iterations (compiles).")
_ITERATIONS = flags.DEFINE_integer("iterations", 3, "Timed iterations after the warm-up.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and levels (config.seed).")
_PEER = flags.DEFINE_enum("peer", "tunix", ["tunix", "none"],
                          "The peer to run (none: jagent's side only).")
_PEER_VENV = flags.DEFINE_string(
    "peer_venv", os.path.join(os.path.expanduser("~"), ".cache", "jagent", "peer_venv"),
    "The peer's virtualenv (created by --setup).")
_CONCURRENCY = flags.DEFINE_integer(
    "tunix_concurrency", 0, "Tunix's max_concurrency (episodes played at once; 0: all N x G).")
_SETUP = flags.DEFINE_bool("setup", False, "Create the peer virtualenv and exit.")

TUNIX_REQUIREMENT = "google-tunix==0.1.7"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def setup_commands(venv: str) -> list[list[str]]:
  """The commands that create the peer virtualenv (Tunix with jagent's jax version)."""
  pip = os.path.join(venv, "bin", "pip")
  return [[sys.executable, "-m", "venv", venv],
          [pip, "install", TUNIX_REQUIREMENT, f"jax=={jax.__version__}",
           f"jaxlib=={jax.__version__}"]]


def peer_python(venv: str) -> str | None:
  """The peer virtualenv's python when Tunix is installed there, else None."""
  python = os.path.join(venv, "bin", "python")
  if not os.path.exists(python):
    return None
  probe = subprocess.run([python, "-c", "import tunix.rl.agentic.agentic_grpo_learner"],
                         capture_output=True, text=True, check=False)
  return python if probe.returncode == 0 else None


def grpo_config(model: str, env_id: str, num_groups: int, group_size: int, max_turns: int,
                max_tokens_per_turn: int, seed: int):
  """The jagent config both sides follow (see the module docstring).

  ``experiments/configs/tiny.py:<env_id>,grpo`` at these sizes (0: the
  game's turn limit and reply budget), the whole history per sequence, no
  KL, entropy bonus or dual clip, each episode weighted alike, no SFT and
  no diagnostics.

  Raises:
    ValueError: from :func:`experiments.common.validate`, naming the field.
  """
  from experiments import common  # pylint: disable=g-import-not-at-top
  import envs_jax  # pylint: disable=g-import-not-at-top
  game = envs_jax.agent_defaults(env_id)
  if game is None:
    raise ValueError(f"--env={env_id!r}: no agent_defaults (not a registered game)")
  c = tiny.benchmark_config(env_id, "grpo", model, num_groups, group_size,
                             max_turns or game.max_turns,
                             max_tokens_per_turn or game.max_tokens_per_turn, -1, seed)
  c.algorithm_kwargs = {"kl_coef": 0.0, "entropy_coef": 0.0, "dual_clip": None,
                        "aggregation": "seq-mean-token-mean"}
  common.validate(c)
  return c


def level_keys(exp, steps: int) -> list[list[list[int]]]:
  """Per RL step, the raw key data of its N levels (``group_reset_keys`` of ``rl_key``)."""
  n = exp.config.rollout.num_groups
  return [np.asarray(jax.random.key_data(rollout.group_reset_keys(exp.rl_key(s), n))).tolist()
          for s in range(steps)]


def level_texts(exp, keys: list[list[list[int]]]) -> list[list[str]]:
  """The initial state text of every level of ``keys`` (as JaxEnvAsHost renders it)."""
  host = rollout.JaxEnvAsHost(exp.env, exp.env_params)
  impl = jax.random.key_impl(exp.rl_key(0))
  return [[host.reset(jax.random.wrap_key_data(np.asarray(k, np.uint32), impl=impl))
           for k in step] for step in keys]


def _summary(iters: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
  timed = iters[warmup:]
  secs = [it["seconds"] for it in timed]
  total = sum(secs)
  out = dict(iteration_s=statistics.median(secs), best_s=min(secs), all_seconds=secs,
             warmup_s=sum(it["seconds"] for it in iters[:warmup]),
             turns_per_s=sum(it["env_turns"] for it in timed) / total,
             tokens_per_s=sum(it["tokens"] for it in timed) / total,
             env_turns=[it["env_turns"] for it in timed],
             tokens=[it["tokens"] for it in timed])
  for k in ("rollout_s", "update_s", "rollout_advantage_s", "advantage_s"):
    if all(k in it for it in timed):
      out[k] = statistics.median(it[k] for it in timed)
  return out


def run_jagent(config, warmup: int, iterations: int) -> tuple[dict[str, Any], Any]:
  """Times ``warmup + iterations`` RL steps of ``config``; returns (results, experiment)."""
  from experiments import common  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  exp = common.Experiment(config)
  state = exp.rl_state(exp.init_params())
  params0 = jax.device_get(state.params)
  setup_s = time.perf_counter() - t0
  iters = []
  for s in range(warmup + iterations):
    t = time.perf_counter()
    state, m = exp.rl_step(state, s)
    iters.append(dict(seconds=time.perf_counter() - t, env_turns=int(m["rollout/env_turns"]),
                      tokens=int(m["rollout/sampled_tokens"])))
  # The rollout alone (the same program the iteration runs first), same levels.
  roll = exp.rollout_fn("train")
  t = time.perf_counter()
  compiled = roll.lower(state.params, exp.rl_key(0)).compile()
  rollout_compile_s = time.perf_counter() - t
  for s in range(warmup, warmup + iterations):
    t = time.perf_counter()
    jax.block_until_ready(compiled(state.params, exp.rl_key(s)))
    iters[s]["rollout_s"] = time.perf_counter() - t
    iters[s]["update_s"] = iters[s]["seconds"] - iters[s]["rollout_s"]
  out = _summary(iters, warmup)
  out.update(setup_s=setup_s, rollout_compile_s=rollout_compile_s,
             peak_rss_mb=timing.peak_rss_mb(), iterations=iters,
             jax_version=jax.__version__)
  return out, (exp, params0)


def peer_spec(exp, params_dir: str, keys, warmup: int, iterations: int,
              concurrency: int) -> dict[str, Any]:
  """The JSON spec of the Tunix side (``peer_rl_tunix``): sizes, prompt, levels, weights."""
  c = exp.config
  r = exp.rollout_config
  prompt = exp.prompt
  return dict(
      env=c.env, model=dataclasses.asdict(exp.model_config), checkpoint=params_dir,
      prompt=dict(system=prompt.system, instructions=prompt.instructions,
                  first_turn=prompt.first_turn, next_turn=prompt.next_turn,
                  think=prompt.think, max_actions_per_turn=prompt.max_actions_per_turn),
      rollout=dict(num_groups=r.num_groups, group_size=r.group_size, max_turns=r.max_turns,
                   max_tokens_per_turn=r.max_tokens_per_turn,
                   max_actions_per_traj=r.max_actions_per_traj,
                   format_penalty=r.format_penalty, temperature=r.temperature),
      train=dict(learning_rate=c.rl.learning_rate, max_grad_norm=c.rl.max_grad_norm,
                 clip_eps=0.2),
      # Tunix's sampler pads every prompt to max_prompt_length, and moves to
      # the next power of two of a longer one; the re-tokenized conversation
      # can exceed our context size (decoded random replies re-encode to more
      # tokens), so it gets that power of two from the start.
      context_size=exp.context_size,
      max_prompt_length=1 << (exp.context_size - 1).bit_length(),
      levels=keys, warmup=warmup, iterations=iterations,
      max_concurrency=concurrency or r.num_groups * r.group_size)


def run_tunix(python: str, spec: dict[str, Any], workdir: str) -> dict[str, Any]:
  """Runs ``peer_rl_tunix`` in the peer virtualenv; returns its result JSON.

  Raises:
    RuntimeError: the subprocess failed (its last output lines attached).
  """
  spec_path = os.path.join(workdir, "spec.json")
  out_path = os.path.join(workdir, "result.json")
  with open(spec_path, "w") as f:
    json.dump(spec, f)
  env = dict(os.environ)
  env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  proc = subprocess.run([python, "-m", "experiments.benchmarks.peer_rl_tunix", spec_path,
                         out_path], cwd=_ROOT, env=env, capture_output=True, text=True,
                        check=False)
  if proc.returncode != 0 or not os.path.exists(out_path):
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    raise RuntimeError(f"the Tunix side failed (exit {proc.returncode}):\n{tail}")
  with open(out_path) as f:
    return json.load(f)


def _fmt(x, spec: str) -> str:
  return "-" if x is None else format(x, spec)


def report(res: dict[str, Any]) -> None:
  """Prints the table, the ratios, the account of the difference and the JSON line."""
  j, t = res["jagent"], res.get("tunix")
  print(f"peer RL benchmark: model {res['model']} ({res['params'] / 1e6:.2f}M params), env "
        f"{res['env']}, {res['num_groups']} levels x {res['group_size']} rollouts, "
        f"{res['max_turns']} turns, {res['max_tokens_per_turn']} tokens/reply, context "
        f"{res['context_size']}, GRPO (no KL), {res['iterations']} timed iterations after "
        f"{res['warmup']}; backend {res['backend']} ({res['cpu_count']} CPUs), load average "
        + " ".join(f"{x:.2f}" for x in res["load_average"]))
  header = (f"{'framework':22s}{'iteration s':>12s}{'best s':>9s}{'rollout s':>10s}"
            f"{'update s':>9s}{'turns/s':>9s}{'tokens/s':>9s}{'warm-up s':>10s}"
            f"{'setup s':>8s}{'peak RSS MB':>12s}")
  print(header)
  print("-" * len(header))
  rows = [("jagent " + j["jax_version"], j)]
  if t is not None:
    rows.append((f"tunix {t['tunix_version']}", t))
  for name, r in rows:
    rollout_s = r.get("rollout_s", r.get("rollout_advantage_s"))
    print(f"{name:22s}{r['iteration_s']:12.3f}{r['best_s']:9.3f}{_fmt(rollout_s, '.3f'):>10s}"
          f"{_fmt(r.get('update_s'), '.3f'):>9s}{r['turns_per_s']:9.1f}{r['tokens_per_s']:9.0f}"
          f"{r['warmup_s']:10.1f}{r['setup_s']:8.1f}{r['peak_rss_mb']:12.0f}")
  if t is None:
    print(f"tunix: skipped ({res['tunix_skipped']})")
  else:
    q = res["ratios"]
    print(f"tunix / jagent: {q['iteration']:.2f}x seconds per iteration (rollout "
          f"{_fmt(q['rollout'], '.2f')}x, update {_fmt(q['update'], '.2f')}x); jagent / "
          f"tunix: {q['turns_per_s']:.2f}x env turns/s, {q['tokens_per_s']:.2f}x tokens/s, "
          f"{q['peak_rss']:.2f}x peak RSS (tunix / jagent)")
    print("split: jagent's rollout is its rollout program timed alone, update = the rest "
          "(advantages + one update); tunix's rollout column is previous update -> "
          "update_actor (rollout + per-group advantages, "
          f"{t['advantage_s']:.3f} s of them, overlapped), update = update_actor")
    for line in res["account"]:
      print(line)
  print(json.dumps(res, default=float))


def account(res: dict[str, Any]) -> list[str]:
  """Where the difference comes from, in numbers of this run (printed lines)."""
  j, t = res["jagent"], res["tunix"]
  turns = statistics.median(t["env_turns"])
  b = res["num_groups"] * res["group_size"]
  return [
      f"why: tunix plays each episode as its own coroutine: {turns:.0f} sampler calls of "
      f"batch 1 per iteration (jagent: {res['max_turns']} batched turns of {b} rows inside "
      "one compiled program, env steps and parsing on device)",
      f"why: each tunix call re-renders and re-tokenizes the whole conversation on the host "
      f"and prefills it from an empty cache, left-padded to max_prompt_length="
      f"{t['max_prompt_length']}: {turns * t['max_prompt_length']:.0f} prefilled positions "
      f"per iteration (longest re-tokenized prompt {t['longest_prompt']} tokens; jagent's "
      f"whole episode fits {res['context_size']}); jagent keeps the KV cache across turns and "
      "prefills only each turn's new tokens",
      f"why: tunix steps the game from Python threads (JaxEnvAsHost, one jitted call per "
      f"action) and builds each group's batch on the host; its update "
      f"({_fmt(t.get('update_s'), '.3f')} s) vs jagent's update + advantages "
      f"({_fmt(j.get('update_s'), '.3f')} s) is the trainer-side difference",
  ]


def run(model: str, env_id: str, num_groups: int, group_size: int, max_turns: int,
        max_tokens_per_turn: int, warmup: int, iterations: int, seed: int, peer: str,
        peer_venv: str, concurrency: int) -> dict[str, Any]:
  """Runs jagent's side, then Tunix's (when installed); returns the results.

  Raises:
    ValueError: a bad flag (before anything compiles).
    RuntimeError: the Tunix side failed, or saw other levels than ours.
  """
  for name, v, low in (("warmup", warmup, 1), ("iterations", iterations, 1),
                       ("tunix_concurrency", concurrency, 0)):
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
      raise ValueError(f"--{name}={v!r}: must be an int >= {low}")
  if model not in models.config_names():
    raise ValueError(f"--model={model!r}: known configs are {models.config_names()}")
  config = grpo_config(model, env_id, num_groups, group_size, max_turns,
                       max_tokens_per_turn, seed)
  python, skipped = None, None
  if peer == "none":
    skipped = "--peer=none"
  else:
    python = peer_python(peer_venv)
    if python is None:
      skipped = (f"no Tunix virtualenv at {peer_venv}; create it with python -m "
                 "experiments.benchmarks.peer_rl --setup")
  j, (exp, params0) = run_jagent(config, warmup, iterations)
  r = exp.rollout_config
  res = dict(model=model, params=exp.model_config.num_params(), env=env_id,
             num_groups=r.num_groups, group_size=r.group_size, max_turns=r.max_turns,
             max_tokens_per_turn=r.max_tokens_per_turn, context_size=exp.context_size,
             warmup=warmup, iterations=iterations, backend=jax.default_backend(),
             cpu_count=os.cpu_count(), load_average=os.getloadavg(), jagent=j, tunix=None,
             tunix_skipped=skipped, jagent_iteration_s=j["iteration_s"],
             tunix_iteration_s=None, ratio_iteration=None)
  if python is None:
    return res
  keys = level_keys(exp, warmup + iterations)
  with tempfile.TemporaryDirectory() as tmp:
    weights = os.path.join(tmp, "policy")
    models.save_hf_checkpoint(params0, exp.model_config, weights)
    spec = peer_spec(exp, weights, keys, warmup, iterations, concurrency)
    t = run_tunix(python, spec, tmp)
  ours = level_texts(exp, keys)
  if t["levels"] != ours:
    raise RuntimeError("the Tunix side played other levels than jagent's")
  t.update(_summary(t["iterations"], warmup))
  t["update_s"] = statistics.median(it["update_s"] for it in t["iterations"][warmup:])
  res.update(tunix=t, load_average=os.getloadavg(), tunix_iteration_s=t["iteration_s"],
             ratio_iteration=t["iteration_s"] / j["iteration_s"])
  res["ratios"] = dict(
      iteration=res["ratio_iteration"],
      rollout=t["rollout_advantage_s"] / j["rollout_s"],
      update=t["update_s"] / j["update_s"] if j["update_s"] > 0 else None,
      turns_per_s=j["turns_per_s"] / t["turns_per_s"],
      tokens_per_s=j["tokens_per_s"] / t["tokens_per_s"],
      peak_rss=t["peak_rss_mb"] / j["peak_rss_mb"])
  res["account"] = account(res)
  return res


def main(argv):
  del argv
  if _SETUP.value:
    for cmd in setup_commands(_PEER_VENV.value):
      print("+ " + " ".join(cmd), flush=True)
      subprocess.run(cmd, check=True)
    return
  report(run(_MODEL.value, _ENV.value, _GROUPS.value, _GROUP_SIZE.value, _TURNS.value,
             _TOKENS.value, _WARMUP.value, _ITERATIONS.value, _SEED.value, _PEER.value,
             _PEER_VENV.value, _CONCURRENCY.value))


if __name__ == "__main__":
  app.run(main)
