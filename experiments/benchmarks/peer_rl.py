r"""A whole RL iteration side by side: jagent vs Google Tunix and vs TRL's GRPOTrainer.

    python -m experiments.benchmarks.peer_rl --setup    # once: the peers' virtualenvs
    python -m experiments.benchmarks.peer_rl [--iterations=3] [--model=tiny] \
        [--env=Sokoban-6x6-1box-v0] [--trl_env=Bandit-v0] [--num_groups=8] \
        [--group_size=8] [--peer=all|tunix|trl|none]

One command, two comparisons, two tables (``--peer`` picks them; jagent
plays the game of each peer that runs, and both games with ``--peer=none``):

1. the multi-turn game (``--env``) vs Tunix's agentic GRPO (below);
2. the single-turn game (``--trl_env``, Bandit-v0) vs TRL's
   ``GRPOTrainer`` (PyTorch CPU), the PyTorch-world reference (further below).

The multi-turn comparison. Both frameworks train the same policy on the
same game, one RL iteration (rollout of N x G multi-turn episodes,
group-normalised GRPO advantages, one policy update) after another:

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
spec and the weights as files and answering with a JSON file.

The single-turn comparison: jagent and TRL's ``GRPOTrainer`` (``trl``
1.16.0, transformers 5.25.0, torch 2.13.0 CPU, float32; side
:mod:`experiments.benchmarks.peer_rl_trl`) train the same policy on
``--trl_env`` (a single-turn game with named answers: Bandit-v0), one
iteration = N = ``--num_groups`` prompts x G = ``--group_size``
completions, their rewards, GRPO advantages per group, one optimizer step:

- the same weights (``save_hf_checkpoint``, loaded by
  ``AutoModelForCausalLM``) and tokenizer (our tiny model's
  ``tokenizer.json`` / ``tokenizer_config.json`` from
  ``Tokenizer.hf_files``, loaded by ``AutoTokenizer``; the TRL side checks
  it encodes every prompt to jagent's ids);
- the same prompts: iteration k's N levels of our generator (RL step k's
  key), each as jagent's turn-1 text (ChatML, system message, RAGEN's
  bandit prompt), passed to TRL as plain text in that order
  (``shuffle_dataset=False``), G completions each;
- the same rewards: Bandit draws the high arm's payout at reset, so a
  level's reward is a function of the level and the arm. The benchmark
  steps our environment from each level's key with each arm and hands TRL
  that table (the payouts jagent's rollout samples for the same level);
  TRL's reward function parses the reply by RAGEN's ``<answer>`` rule and
  adds the format penalty (-0.1) to an unparsable reply, as jagent does.
  Afterwards every TRL completion is decoded by our tokenizer, parsed by
  ``jagent.rollout.reference_parse`` and its reward checked;
- the same rules: the reply budget (``max_completion_length`` = the game's
  ``max_tokens_per_turn``, 12), temperature 1 (no top-k / top-p), group
  advantages (r - mean) / (std + eps) with the unbiased std (eps: jagent
  1e-6, TRL 1e-4), the clipped surrogate (eps 0.2) with each completion
  weighted alike (TRL ``loss_type="grpo"``: per-sequence token mean, then
  the mean: jagent's seq-mean-token-mean), no KL (``beta=0``) and no
  reference model, the sampler's log-probs as the old ones (TRL: the
  detached current log-probs, the same numbers with ``num_iterations=1``),
  one Adam step on all N x G completions (``per_device_train_batch_size =
  N x G``, ``gradient_accumulation_steps=1``; lr 1e-4, gradients clipped at
  norm 1). Differences: TRL's learning rate is constant, jagent's config
  warms up over 10 steps (as on the Tunix side; no effect on time); TRL
  generates with transformers' ``generate`` (the ``GRPOTrainer`` default
  without vLLM).

TRL's columns: ``iteration s`` is one ``GRPOTrainer`` step from
``on_step_begin`` to ``on_step_end`` (a ``TrainerCallback``: generation,
rewards, advantages, forward, backward, optimizer step); ``rollout s`` is
``_generate_and_score_completions`` (generation, rewards, advantages) and
``update s`` the rest. TRL needs no compile, so its warm-up is a plain
step. jagent's single-turn game runs before its multi-turn one, so its
peak RSS there is its own; on the multi-turn game it is the process's over
both. A peer's peak RSS is its process's own (``VmHWM``). Ratios are TRL
/ jagent seconds; the JSON line adds ``trl_iteration_s``,
``ratio_iteration_trl`` (and ``jagent_trl_game_iteration_s``).

TRL lives in its own virtualenv too (``--trl_venv``, default
``~/.cache/jagent/trl_venv``; ``--setup`` installs :data:`TRL_REQUIREMENTS`,
``torch==2.13.0`` being the CPU build on this machine's disk), never in
jagent's dependencies. Without a peer's virtualenv (or with ``--peer``
leaving it out) only jagent's side of that game runs and that peer's
columns say why they are empty. Speed is measured here, never in tests.
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

from experiments.benchmarks import rss
from experiments.benchmarks import timing
from experiments.configs import tiny
import jagent
from jagent import models
from jagent import rollout

# --peer: which peers run (jagent always runs the games they are compared on).
PEERS = {"all": ("tunix", "trl"), "tunix": ("tunix",), "trl": ("trl",), "none": ()}

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
_TRL_ENV = flags.DEFINE_string("trl_env", "Bandit-v0",
                               "Registered single-turn envs_jax id of the TRL comparison.")
_PEER = flags.DEFINE_enum(
    "peer", "all", list(PEERS),
    "The peers to run (all: Tunix on --env and TRL on --trl_env; tunix / trl: that one "
    "only; none: jagent's side only, both games).")
_PEER_VENV = flags.DEFINE_string(
    "peer_venv", os.path.join(os.path.expanduser("~"), ".cache", "jagent", "peer_venv"),
    "Tunix's virtualenv (created by --setup).")
_TRL_VENV = flags.DEFINE_string(
    "trl_venv", os.path.join(os.path.expanduser("~"), ".cache", "jagent", "trl_venv"),
    "TRL's virtualenv (created by --setup).")
_CONCURRENCY = flags.DEFINE_integer(
    "tunix_concurrency", 0, "Tunix's max_concurrency (episodes played at once; 0: all N x G).")
_SETUP = flags.DEFINE_bool("setup", False,
                           "Create the virtualenvs of the --peer peers and exit.")

TUNIX_REQUIREMENT = "google-tunix==0.1.7"
# torch pinned to the CPU build on this machine's disk (a plain ``torch``
# pulls a multi-GB CUDA build); trl / transformers: the versions measured.
TRL_REQUIREMENTS = ("torch==2.13.0", "trl==1.16.0", "transformers==5.25.0")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def setup_commands(venv: str, peer: str = "tunix") -> list[list[str]]:
  """The commands that create ``peer``'s virtualenv.

  Tunix: ``google-tunix`` with jagent's jax version. TRL:
  :data:`TRL_REQUIREMENTS` (PyTorch CPU; no jax: its side imports no jagent).
  """
  pip = os.path.join(venv, "bin", "pip")
  if peer == "trl":
    return [[sys.executable, "-m", "venv", venv], [pip, "install", *TRL_REQUIREMENTS]]
  return [[sys.executable, "-m", "venv", venv],
          [pip, "install", TUNIX_REQUIREMENT, f"jax=={jax.__version__}",
           f"jaxlib=={jax.__version__}"]]


# What a usable virtualenv of each peer imports.
_PROBES = {"tunix": "import tunix.rl.agentic.agentic_grpo_learner",
           "trl": "import trl, transformers, torch; trl.GRPOTrainer"}


def peer_python(venv: str, peer: str = "tunix") -> str | None:
  """The virtualenv's python when ``peer`` is installed there, else None."""
  python = os.path.join(venv, "bin", "python")
  if not os.path.exists(python):
    return None
  probe = subprocess.run([python, "-c", _PROBES[peer]], capture_output=True, text=True,
                         check=False)
  return python if probe.returncode == 0 else None


def grpo_config(model: str, env_id: str, num_groups: int, group_size: int, max_turns: int,
                max_tokens_per_turn: int, seed: int):
  """The jagent config both sides follow (see the module docstring).

  ``experiments/configs/tiny.py:<env_id>,grpo`` at these sizes (0: the
  game's turn limit and reply budget), the whole history per sequence, no
  KL, entropy bonus or dual clip, each episode weighted alike, no SFT and
  no diagnostics.

  Raises:
    ValueError: from :func:`experiments.spec.validate`, naming the field.
  """
  from experiments import spec  # pylint: disable=g-import-not-at-top
  import envs_jax  # pylint: disable=g-import-not-at-top
  game = envs_jax.agent_defaults(env_id)
  if game is None:
    raise ValueError(f"--env={env_id!r}: no agent_defaults (not a registered game)")
  c = tiny.benchmark_config(env_id, "grpo", model, num_groups, group_size,
                             max_turns or game.max_turns,
                             max_tokens_per_turn or game.max_tokens_per_turn, -1, seed)
  c.algorithm_kwargs = {"kl_coef": 0.0, "entropy_coef": 0.0, "dual_clip": None,
                        "aggregation": "seq-mean-token-mean"}
  spec.validate(c)
  return c


def trl_game_config(model: str, env_id: str, num_groups: int, group_size: int,
                    max_tokens_per_turn: int, seed: int):
  """:func:`grpo_config` of the single-turn game of the TRL comparison (its one turn).

  Raises:
    ValueError: ``env_id`` is not a single-turn game with named actions (the
      TRL side rewards a parsed action from a table per level), or a bad field.
  """
  import envs_jax  # pylint: disable=g-import-not-at-top
  game = envs_jax.agent_defaults(env_id)
  if game is None:
    raise ValueError(f"--trl_env={env_id!r}: no agent_defaults (not a registered game)")
  if game.max_turns != 1:
    raise ValueError(f"--trl_env={env_id!r}: TRL's GRPOTrainer plays single-turn games; this "
                     f"one has {game.max_turns} turns")
  env, _ = envs_jax.make(env_id)
  if not tuple(getattr(env, "action_names", ())):
    raise ValueError(f"--trl_env={env_id!r}: free-text answers; the TRL side rewards named "
                     "actions (e.g. Bandit-v0)")
  return grpo_config(model, env_id, num_groups, group_size, 1, max_tokens_per_turn, seed)


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
  from experiments import experiment  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  exp = experiment.Experiment(config)
  state = exp.rl_state(exp.init_params())
  params0 = jax.device_get(state.params)
  setup_s = time.perf_counter() - t0
  iters = []
  for s in range(warmup + iterations):
    t = time.perf_counter()
    state, m = exp.rl_step(state, s)
    iters.append(dict(seconds=time.perf_counter() - t, env_turns=int(m["rollout/env_turns"]),
                      tokens=int(m["rollout/sampled_tokens"]),
                      mean_reward=float(m["rollout/score"])))
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
             peak_rss_mb=rss.peak_rss_mb(), iterations=iters,
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


def run_side(python: str, module: str, spec: dict[str, Any], workdir: str) -> dict[str, Any]:
  """Runs a peer's side (``module``) in its virtualenv; returns its result JSON.

  Raises:
    RuntimeError: the subprocess failed (its last output lines attached).
  """
  spec_path = os.path.join(workdir, "spec.json")
  out_path = os.path.join(workdir, "result.json")
  with open(spec_path, "w") as f:
    json.dump(spec, f)
  env = dict(os.environ)
  env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  proc = subprocess.run([python, "-m", module, spec_path, out_path], cwd=_ROOT, env=env,
                        capture_output=True, text=True, check=False)
  if proc.returncode != 0 or not os.path.exists(out_path):
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    raise RuntimeError(f"{module} failed (exit {proc.returncode}):\n{tail}")
  with open(out_path) as f:
    return json.load(f)


def run_tunix(python: str, spec: dict[str, Any], workdir: str) -> dict[str, Any]:
  """Runs ``peer_rl_tunix`` in the Tunix virtualenv; returns its result JSON."""
  return run_side(python, "experiments.benchmarks.peer_rl_tunix", spec, workdir)


def arm_rewards(exp, keys) -> list[list[dict[str, float]]]:
  """Per step and level, the reward of each action (lower-cased name) from that level.

  Our environment reset to the level's key and stepped once with each
  action (Bandit: the payout is drawn at reset, so this is the very reward
  jagent's rollout gives that level and arm).
  """
  host = rollout.JaxEnvAsHost(exp.env, exp.env_params)
  impl = jax.random.key_impl(exp.rl_key(0))
  out = []
  for step in keys:
    row = []
    for k in step:
      key = jax.random.wrap_key_data(np.asarray(k, np.uint32), impl=impl)
      table = {}
      for name in exp.env.action_names:
        host.reset(key)
        table[name.lower()] = float(host.step(name, key).reward)
      row.append(table)
    out.append(row)
  return out


def trl_spec(exp, checkpoint: str, keys, warmup: int, iterations: int, output_dir: str,
             seed: int) -> dict[str, Any]:
  """The JSON spec of the TRL side (``peer_rl_trl``): prompts, rewards, rules, sizes."""
  c = exp.config
  r = exp.rollout_config
  spec = exp.text_env.parse_spec()
  prompts = [[exp.text_env.first_text(state, r.max_actions_per_traj) for state in step]
             for step in level_texts(exp, keys)]
  return dict(
      env=c.env, checkpoint=checkpoint, output_dir=output_dir, seed=seed,
      prompts=prompts,
      prompt_ids=[[list(map(int, exp.tokenizer.encode(p))) for p in step] for step in prompts],
      arm_rewards=arm_rewards(exp, keys),
      rules=dict(separator=spec.separator, max_actions_per_turn=spec.max_actions_per_turn,
                 max_actions_per_traj=r.max_actions_per_traj, format_penalty=r.format_penalty),
      rollout=dict(num_groups=r.num_groups, group_size=r.group_size,
                   max_tokens_per_turn=r.max_tokens_per_turn, temperature=r.temperature),
      train=dict(learning_rate=c.rl.learning_rate, max_grad_norm=c.rl.max_grad_norm,
                 clip_eps=0.2),
      warmup=warmup, iterations=iterations)


def check_trl(exp, spec: dict[str, Any], t: dict[str, Any]) -> None:
  """Checks the TRL side's levels and rewards against ours; drops its completions.

  Every completion is decoded by our tokenizer, parsed by
  ``jagent.rollout.reference_parse`` and rewarded from the level's table:
  the reward TRL trained on must be that one. Adds each step's mean reward.

  Raises:
    RuntimeError: another level order, or a reward that differs from ours.
  """
  r = exp.rollout_config
  n, g = r.num_groups, r.group_size
  ps = exp.text_env.parse_spec()
  eos = exp.tokenizer.eos_id
  for k, it in enumerate(t["iterations"]):
    want = [f"{k}:{j}" for j in range(n) for _ in range(g)]
    if it.pop("levels") != want:
      raise RuntimeError(f"TRL step {k} scored other levels than jagent's iteration {k}")
    ids, rewards = it.pop("completion_ids"), it.pop("rewards")
    for i, (seq, got) in enumerate(zip(ids, rewards)):
      if seq and seq[-1] == eos:
        seq = seq[:-1]
      parsed = rollout.reference_parse(exp.tokenizer.decode(seq).encode("utf-8"), ps)
      table = spec["arm_rewards"][k][i // g]
      ours = 0.0 if parsed["format_valid"] else r.format_penalty
      for a in parsed["actions"][:r.max_actions_per_traj]:
        ours += table[ps.action_names[a].lower()]
      if abs(ours - got) > 1e-6:
        raise RuntimeError(f"TRL step {k} completion {i} {seq}: reward {got}, ours {ours}")
    it["mean_reward"] = sum(rewards) / len(rewards)


def _fmt(x, spec: str) -> str:
  return "-" if x is None else format(x, spec)


_HEADER = (f"{'framework':22s}{'iteration s':>12s}{'best s':>9s}{'rollout s':>10s}"
           f"{'update s':>9s}{'turns/s':>9s}{'tokens/s':>9s}{'warm-up s':>10s}"
           f"{'setup s':>8s}{'peak RSS MB':>12s}")


def _table(rows) -> None:
  print(_HEADER)
  print("-" * len(_HEADER))
  for name, r in rows:
    rollout_s = r.get("rollout_s", r.get("rollout_advantage_s"))
    print(f"{name:22s}{r['iteration_s']:12.3f}{r['best_s']:9.3f}{_fmt(rollout_s, '.3f'):>10s}"
          f"{_fmt(r.get('update_s'), '.3f'):>9s}{r['turns_per_s']:9.1f}{r['tokens_per_s']:9.0f}"
          f"{r['warmup_s']:10.1f}{r['setup_s']:8.1f}{r['peak_rss_mb']:12.0f}")


def report(res: dict[str, Any]) -> None:
  """Prints the tables, the ratios, the accounts of the differences and the JSON line."""
  print(f"peer RL benchmark: model {res['model']} ({res['params'] / 1e6:.2f}M params), "
        f"{res['num_groups']} levels x {res['group_size']} rollouts, GRPO (no KL), "
        f"{res['iterations']} timed iterations after {res['warmup']}; backend "
        f"{res['backend']} ({res['cpu_count']} CPUs), load average "
        + " ".join(f"{x:.2f}" for x in res["load_average"]))
  j, t = res["jagent"], res.get("tunix")
  if j is None:
    print(f"multi-turn game: not run (--peer={res['peer']})")
  else:
    print(f"multi-turn game vs Tunix: env {res['env']}, {res['num_groups']} levels x "
          f"{res['group_size']} rollouts, {res['max_turns']} turns, "
          f"{res['max_tokens_per_turn']} tokens/reply, context {res['context_size']}")
    rows = [("jagent " + j["jax_version"], j)]
    if t is not None:
      rows.append((f"tunix {t['tunix_version']}", t))
    _table(rows)
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
  g, tr = res["trl_game"], res.get("trl")
  if g is None:
    print(f"single-turn game: not run (--peer={res['peer']})")
  else:
    print(f"single-turn game vs TRL: env {g['env']}, {res['num_groups']} prompts x "
          f"{res['group_size']} completions, 1 turn, {g['max_tokens_per_turn']} "
          f"tokens/reply (max_completion_length), context {g['context_size']}")
    rows = [("jagent " + g["jagent"]["jax_version"], g["jagent"])]
    if tr is not None:
      rows.append((f"trl {tr['trl_version']}", tr))
    _table(rows)
    if tr is None:
      print(f"trl: skipped ({res['trl_skipped']})")
    else:
      q = res["trl_ratios"]
      print(f"trl / jagent: {q['iteration']:.2f}x seconds per iteration (rollout "
            f"{q['rollout']:.2f}x, update {_fmt(q['update'], '.2f')}x); jagent / trl: "
            f"{q['tokens_per_s']:.2f}x tokens/s, {q['peak_rss']:.2f}x peak RSS (trl / jagent)")
      print("split: trl's rollout is GRPOTrainer._generate_and_score_completions (generate, "
            "rewards, advantages), update = the rest of the step (forward, backward, Adam); "
            f"trl's whole step incl. its bookkeeping: {tr['since_previous_s']:.3f} s "
            f"(torch {tr['torch_version']}, {tr['torch_threads']} threads, transformers "
            f"{tr['transformers_version']}); mean reward per step: jagent "
            + " ".join(f"{x:.3f}" for x in g["jagent"]["mean_reward"]) + ", trl "
            + " ".join(f"{it['mean_reward']:.3f}" for it in tr["iterations"][res["warmup"]:]))
      for line in res["trl_account"]:
        print(line)
  print(json.dumps(res, default=float))


def account(res: dict[str, Any]) -> list[str]:
  """Where the Tunix difference comes from, in numbers of this run (printed lines)."""
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


def trl_account(res: dict[str, Any]) -> list[str]:
  """Where the TRL difference comes from, in numbers of this run (printed lines)."""
  g, t = res["trl_game"], res["trl"]
  j = g["jagent"]
  b = res["num_groups"] * res["group_size"]
  return [
      f"why: both generate all {b} completions as one batch with a KV cache; trl runs "
      f"transformers' generate() eagerly, one PyTorch forward per new token "
      f"(<= {g['max_tokens_per_turn']}) with a Python sampling loop and its stopping "
      f"criteria; jagent's rollout is one compiled XLA program "
      f"(rollout {_fmt(t.get('rollout_s'), '.3f')} s vs {_fmt(j.get('rollout_s'), '.3f')} s)",
      f"why: trl's update is an eager forward + backward of the {b} prompt+completion rows "
      f"and torch Adam ({_fmt(t.get('update_s'), '.3f')} s); jagent's advantages + update "
      f"are one jitted program ({_fmt(j.get('update_s'), '.3f')} s)",
  ]


def _check_ints(**values) -> None:
  for name, (v, low) in values.items():
    jagent.check_int(f"--{name}", v, low)


def run(model: str, env_id: str, num_groups: int, group_size: int, max_turns: int,
        max_tokens_per_turn: int, warmup: int, iterations: int, seed: int, peer: str,
        peer_venv: str, concurrency: int, trl_env: str = "Bandit-v0",
        trl_venv: str = "") -> dict[str, Any]:
  """Runs jagent's side of each game, then the peers' (when installed); returns the results.

  The single-turn game (``trl_env``, TRL's) runs first, so that jagent's
  peak RSS on it is its own; jagent's peak RSS on the multi-turn game is
  the process's over both games.

  Raises:
    ValueError: a bad flag (before anything compiles).
    RuntimeError: a peer's side failed, or saw other levels or rewards than ours.
  """
  _check_ints(warmup=(warmup, 1), iterations=(iterations, 1),
              tunix_concurrency=(concurrency, 0))
  if peer not in PEERS:
    raise ValueError(f"--peer={peer!r}: one of {sorted(PEERS)}")
  if model not in models.config_names():
    raise ValueError(f"--model={model!r}: known configs are {models.config_names()}")
  # jagent plays the games of the chosen peers (--peer=none: both games).
  games = PEERS[peer] or ("tunix", "trl")
  config = (grpo_config(model, env_id, num_groups, group_size, max_turns,
                        max_tokens_per_turn, seed) if "tunix" in games else None)
  trl_config = (trl_game_config(model, trl_env, num_groups, group_size,
                                max_tokens_per_turn, seed) if "trl" in games else None)
  pythons, skipped = {}, {}
  for name, venv, flag in (("tunix", peer_venv, "--peer_venv"),
                           ("trl", trl_venv, "--trl_venv")):
    if name not in PEERS[peer]:
      skipped[name] = f"--peer={peer}"
      continue
    pythons[name] = peer_python(venv, name)
    if pythons[name] is None:
      skipped[name] = (f"no {'Tunix' if name == 'tunix' else 'TRL'} virtualenv at {venv} "
                       f"({flag}); create it with python -m experiments.benchmarks.peer_rl "
                       "--setup")
  res = dict(model=model, params=models.get_config(model).num_params(), peer=peer,
             env=env_id, num_groups=num_groups, group_size=group_size, max_turns=None,
             max_tokens_per_turn=None, context_size=None, warmup=warmup,
             iterations=iterations, backend=jax.default_backend(), cpu_count=os.cpu_count(),
             load_average=os.getloadavg(), jagent=None, tunix=None,
             tunix_skipped=skipped.get("tunix"), jagent_iteration_s=None,
             tunix_iteration_s=None, ratio_iteration=None, trl_game=None, trl=None,
             trl_skipped=skipped.get("trl"), jagent_trl_game_iteration_s=None,
             trl_iteration_s=None, ratio_iteration_trl=None)
  if trl_config is not None:
    _trl_game(res, trl_config, warmup, iterations, seed, pythons.get("trl"))
  if config is not None:
    _tunix_game(res, config, warmup, iterations, concurrency, pythons.get("tunix"))
  res["load_average"] = os.getloadavg()
  return res


def _trl_game(res, config, warmup: int, iterations: int, seed: int, python) -> None:
  """jagent on the single-turn game, then TRL's GRPOTrainer on it (when installed)."""
  j, (exp, params0) = run_jagent(config, warmup, iterations)
  j["mean_reward"] = [it["mean_reward"] for it in j["iterations"][warmup:]]
  r = exp.rollout_config
  res.update(trl_game=dict(env=config.env, max_tokens_per_turn=r.max_tokens_per_turn,
                           context_size=exp.context_size, jagent=j),
             jagent_trl_game_iteration_s=j["iteration_s"])
  if python is None:
    return
  keys = level_keys(exp, warmup + iterations)
  with tempfile.TemporaryDirectory() as tmp:
    weights = os.path.join(tmp, "policy")
    # The weights and our tokenizer's tokenizer.json / tokenizer_config.json.
    models.save_hf_checkpoint(params0, exp.model_config, weights,
                              extra_files=exp.tokenizer.hf_files())
    spec = trl_spec(exp, weights, keys, warmup, iterations, os.path.join(tmp, "out"), seed)
    t = run_side(python, "experiments.benchmarks.peer_rl_trl", spec, tmp)
  check_trl(exp, spec, t)
  t.update(_summary(t["iterations"], warmup))
  t["since_previous_s"] = statistics.median(
      it["since_previous_s"] for it in t["iterations"][warmup:])
  res.update(trl=t, trl_iteration_s=t["iteration_s"],
             ratio_iteration_trl=t["iteration_s"] / j["iteration_s"])
  res["trl_ratios"] = dict(
      iteration=res["ratio_iteration_trl"], rollout=t["rollout_s"] / j["rollout_s"],
      update=t["update_s"] / j["update_s"] if j["update_s"] > 0 else None,
      tokens_per_s=j["tokens_per_s"] / t["tokens_per_s"],
      peak_rss=t["peak_rss_mb"] / j["peak_rss_mb"])
  res["trl_account"] = trl_account(res)


def _tunix_game(res, config, warmup: int, iterations: int, concurrency: int, python) -> None:
  """jagent on the multi-turn game, then Tunix's agentic GRPO on it (when installed)."""
  j, (exp, params0) = run_jagent(config, warmup, iterations)
  r = exp.rollout_config
  res.update(max_turns=r.max_turns, max_tokens_per_turn=r.max_tokens_per_turn,
             context_size=exp.context_size, jagent=j, jagent_iteration_s=j["iteration_s"])
  if python is None:
    return
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
  res.update(tunix=t, tunix_iteration_s=t["iteration_s"],
             ratio_iteration=t["iteration_s"] / j["iteration_s"])
  res["ratios"] = dict(
      iteration=res["ratio_iteration"],
      rollout=t["rollout_advantage_s"] / j["rollout_s"],
      update=t["update_s"] / j["update_s"] if j["update_s"] > 0 else None,
      turns_per_s=j["turns_per_s"] / t["turns_per_s"],
      tokens_per_s=j["tokens_per_s"] / t["tokens_per_s"],
      peak_rss=t["peak_rss_mb"] / j["peak_rss_mb"])
  res["account"] = account(res)


def main(argv):
  del argv
  if _SETUP.value:
    venvs = {"tunix": _PEER_VENV.value, "trl": _TRL_VENV.value}
    for peer in PEERS[_PEER.value]:
      for cmd in setup_commands(venvs[peer], peer):
        print("+ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return
  report(run(_MODEL.value, _ENV.value, _GROUPS.value, _GROUP_SIZE.value, _TURNS.value,
             _TOKENS.value, _WARMUP.value, _ITERATIONS.value, _SEED.value, _PEER.value,
             _PEER_VENV.value, _CONCURRENCY.value, _TRL_ENV.value, _TRL_VENV.value))


if __name__ == "__main__":
  app.run(main)
