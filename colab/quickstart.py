# %% [markdown]
# # jagent quickstart: environments, rollouts, training, losses
#
# A walkthrough for RL researchers new to jagent, a JAX-native framework for training
# LLM agents with multi-turn RL (a re-implementation of RAGEN, arXiv 2504.20073):
#
# 1. the environments (`envs_jax`): pure-JAX games that jit and vmap;
# 2. a multi-turn rollout of a language-model policy as ONE jit-compiled program,
#    decoded back to text, next to an expert (BFS) demonstration;
# 3. a short run of the main training job (SFT warm start, RL, evaluation) and its curves;
# 4. the pure losses and the optax-style objectives, for your own JAX code.
#
# Everything runs on a CPU in a few minutes (most of it is XLA compilation). Open
# `colab/quickstart.ipynb` in Colab or Jupyter from your clone; `colab/quickstart.py` is
# its `# %%` twin: the test suite runs the twin and checks that the notebook's cells are
# the same, so neither can rot.

# %%
# On Colab (jagent is not on PyPI), install it from your copy first. Either a wheel
# built in your clone (`pip wheel --no-deps -w dist .` there; upload the .whl):
#   !pip install -q /content/jagent-0.1.0.dev0-py3-none-any.whl
# or the clone itself, uploaded or on a mounted Drive, e.g. at /content/jagent:
#   !pip install -q -e /content/jagent
# Either way installs every dependency; this notebook needs nothing else from the clone.
import json
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

if "ipykernel" not in sys.modules:
  matplotlib.use("Agg")  # run as a script: draw into files, open no window
import matplotlib.pyplot as plt

import envs_jax
from experiments import common
from jagent import losses
from jagent import models
from jagent import rollout
from jagent import tokenizers
from jagent import train
from jagent import transforms

# Keep XLA compilations on disk (~/.cache/jagent/jax, or $JAX_COMPILATION_CACHE_DIR), as
# `python -m experiments.train` does: running this notebook again skips most compiles.
common.setup_compilation_cache()
print("jax", jax.__version__, "on", jax.devices()[0].platform)

# %% [markdown]
# ## 1. Environments
# `envs_jax.make` returns a static environment object and its params (a pytree).
# `reset(key, params)` and `step(key, state, action, params)` are pure functions, so
# they jit, and vmap over keys, states and even params. `colab/envs_tour.ipynb` is the
# full tour (every game, the BFS solvers, device-side rendering).

# %%
env, env_params = envs_jax.make("Sokoban-6x6-1box-v0")
print(env.legend)
print("actions:", env.action_names)

# reset: one PRNG key per level; vmap over a batch of keys (the params are shared).
keys = jax.random.split(jax.random.key(0), 256)
obs, states = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(keys, env_params)
print("a batch of 256 levels:", jax.tree.map(lambda x: x.shape, states))
state = jax.tree.map(lambda x: x[0], states)  # level 0
print(env.render_text(state))

# step -> (obs, state, reward, terminated, truncated, info)
step = jax.jit(env.step)
obs, state, reward, terminated, truncated, info = step(
    jax.random.key(1), state, env.action_names.index("Up"), env_params)
print(env.render_text(state))
print(f"reward {float(reward):+.2f}, terminated {bool(terminated)}, "
      f"truncated {bool(truncated)}, info {jax.tree.map(bool, info)}")

# %% [markdown]
# ## 2. A multi-turn rollout, decoded
# The text layer `rollout.TextEnv` binds a game, a tokenizer and a prompt
# (`rollout.PromptConfig`: system message, turn templates, the
# `<think>..</think><answer>..</answer>` reply format, the chat template). It renders
# each turn's prompt as token ids on device, so `rollout.make_rollout` plays all turns
# of a batch of episodes in one jitted program: prefill the new prompt into the KV
# cache, sample until `</answer>` or EOS, parse the reply's actions from its bytes,
# step the game, record the turn's reward (RAGEN's protocol: environment rewards plus
# a -0.1 format penalty for a reply that does not parse).
#
# The policy is a decoder-only transformer written as pure functions of its params
# (`jagent.models`; Qwen2 and Llama checkpoints load with `models.load_hf_checkpoint`).
# Here: the ~0.16M-parameter `nano` config with random weights and the 512-piece
# tokenizer that ships with jagent.

# %%
tokenizer = tokenizers.load_tiny_tokenizer()
prompt = rollout.PromptConfig.compact()  # a short prompt; PromptConfig() is RAGEN's full one
# verify_states: random states whose on-device prompts are checked against
# tokenizer.encode when the TextEnv is built (default 256).
text_env = rollout.TextEnv(env, tokenizer, prompt, verify_states=64)
print(f"prompt buffers: turn 1 {text_env.first_width} tokens, later turns "
      f"{text_env.next_width} tokens")

model_config = models.get_config("nano")
params = models.init(model_config, jax.random.key(0))
rollout_config = rollout.RolloutConfig(
    num_groups=2, group_size=2,  # B = 4 episodes: 2 initial states x 2 samples each
    max_turns=5, max_actions_per_traj=10,  # RAGEN's budgets
    max_tokens_per_turn=32, temperature=1.0)
play = rollout.make_rollout(text_env, model_config, rollout_config)
traj = play(params, jax.random.key(3))  # a rollout.Trajectory
print("tokens", traj.tokens.shape, "turn_rewards", traj.turn_rewards.shape)
print({k: round(float(v), 3) for k, v in traj.metrics().items()})

# %% [markdown]
# A `Trajectory` holds one token sequence per episode (the whole conversation, padded to
# the context size `S`) with a `loss_mask` on the sampled reply tokens, their sampler
# log-probs, the turn of each token, per-token and per-turn rewards and the episode's
# outcome. Decode it with the tokenizer: the random policy writes gibberish, so every
# turn scores the format penalty.

# %%
def show(traj, row, conversation=True):
  """Prints one episode of a Trajectory: the decoded conversation, then each reply."""
  ids = np.asarray(traj.tokens[row, :int(traj.length[row])])
  if conversation:
    print(tokenizer.decode(ids))
  turn_of_token = np.asarray(traj.turn_ids[row, :len(ids)])
  for t in range(int(traj.num_turns[row])):
    reply = tokenizer.decode(ids[turn_of_token == t])
    print(f"turn {t + 1}: reward {float(traj.turn_rewards[row, t]):+.2f}, "
          f"format ok {bool(traj.format_valid[row, t])}, reply {reply!r}")
  print(f"score {float(traj.scores[row]):+.2f}, success {bool(traj.success[row])}, "
        f"ended by {rollout.END_REASONS[int(traj.end_reason[row])]}")


# Turn 1's prompt (the tokens before the first sampled one), then the sampled replies.
first_reply = int(np.argmax(np.asarray(traj.loss_mask[0])))
print(tokenizer.decode(np.asarray(traj.tokens[0, :first_reply])))
show(traj, 0, conversation=False)

# %% [markdown]
# `rollout.demonstrations` plays the same prompts, parser, rewards and budgets with a
# scripted expert (here the BFS Sokoban solver, two moves per reply) and returns the
# same `Trajectory`: this is what the SFT warm start trains on. A solved episode:

# %%
demos = rollout.demonstrations(text_env, key=jax.random.key(3), config=rollout_config,
                               num_groups=4, actions_per_turn=2)
print({k: round(float(v), 3) for k, v in demos.metrics().items()
       if k in ("success", "score", "turns", "actions")})
show(demos, int(np.argmax(demos.success)))

# %% [markdown]
# ## 3. Train: SFT warm start, then RL, with evaluation
# `experiments.train.run(config, workdir)` is the main job:
# 1. SFT (behaviour cloning) on `sft.num_demos` expert demonstrations: a tiny random
#    model never writes a valid reply, so RL alone would get no signal;
# 2. `rl.steps` RL iterations: a rollout of `rollout.num_groups` initial states x
#    `rollout.group_size` samples, StarPO-S's uncertainty filter (keep the groups whose
#    rewards vary most), the objective `algorithm` (any `transforms.registered()` name),
#    an update;
# 3. evaluation on `eval.num_levels` fixed held-out levels after SFT, every
#    `eval.every` RL steps and at the end.
#
# It writes `metrics.jsonl`, TensorBoard events, `curves.png`, decoded samples,
# checkpoints (running again on the same workdir resumes), the final policy as a
# Hugging Face directory and `eval_summary.json`.
#
# The settings below are tiny so that the run takes a minute or two on a CPU: RAGEN's
# two-armed bandit (one turn: the `Dragon` arm pays 1 with probability 0.25,
# `Phoenix` always pays 0.1; success = pulling `Dragon`) with GRPO.

# %%
# Tiny settings. The full-size main job (`tiny.get_config()`: Sokoban, StarPO-S, its
# step and level counts printed below) is the command line
#   python -m experiments.train --workdir=$HOME/jagent_runs/sokoban
# and any game x algorithm, with any config field overridden, e.g.
#   python -m experiments.train --config=experiments/configs/tiny.py:Bandit-v0,grpo \
#       --config.rl.steps=100 --workdir=$HOME/jagent_runs/bandit_grpo
from experiments import train as train_job
from experiments.configs import tiny

main_job = tiny.get_config()
print(f"main job: {main_job.env}, {main_job.algorithm}, {main_job.sft.steps} SFT steps, "
      f"{main_job.rl.steps} RL steps, {main_job.eval.num_levels} evaluation levels")
config = tiny.get_config("Bandit-v0,grpo")
config.model = "nano"
config.rollout.update(dict(num_groups=8, group_size=4, temperature=1.0))
config.sft.update(dict(num_demos=32, steps=40, batch_size=8, learning_rate=1e-2,
                       warmup_steps=5))
config.rl.update(dict(steps=8, learning_rate=2e-3, warmup_steps=0, decay="constant",
                      filter_mode="top_fraction", filter_value=0.5))
config.eval.update(dict(num_levels=16, num_groups=16, every=4, temperature=0.5,
                        greedy=False, samples=2))
config.checkpoint.update(dict(every=8, keep=1))
# A temporary run directory, removed when this Python process (the kernel) exits; pass
# a directory of your own to keep the run.
run_dir = tempfile.TemporaryDirectory(prefix="jagent_quickstart_")
workdir = run_dir.name
print(config.algorithm, "on", config.env, "->", workdir)

# %%
summary = train_job.run(config, workdir, progress=False)
print(json.dumps(summary, indent=1))

# %% [markdown]
# `metrics.jsonl` has one JSON record per step (SFT at steps <= 0, RL from 1) with ~50
# keys: rollout statistics, RAGEN's Echo Trap diagnostics (reward std within groups,
# entropy, gradient norms), losses, evaluation, timings. Plot a few. At this size the
# curves show the mechanics, not learning: after SFT every valid reply pulls `Dragon`
# (so success = valid replies), and the score only moves with Dragon's luck. Learning
# which arm to pull takes ~100 RL steps; with GRPO's std-normalised advantages the
# unlucky groups push towards the safe `Phoenix` arm, which is why
# `tests/experiments/train_test.py` uses Dr.GRPO with StarPO-S's filter.

# %%
records = train.read_metrics(os.path.join(workdir, "metrics.jsonl"))
print(len(records), "records; keys of an RL step:", sorted(records[-2]))


def curve(*keys):
  """(steps, values) of the records that have any of ``keys`` (the first one found)."""
  points = [(r["step"], next(r[k] for k in keys if k in r))
            for r in records if any(k in r for k in keys)]
  return [p[0] for p in points], [p[1] for p in points]


fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
axes[0].plot(*curve("rollout/score"), "o-", label="rollouts (temperature 1)")
axes[0].plot(*curve("eval/sft/score", "eval/score", "eval/rl/score"), "s--",
             label="held-out levels (temperature 0.5)")
axes[0].set(title="score", xlabel="RL step")
axes[1].plot(*curve("rollout/success"), "o-", label="success (Dragon)")
axes[1].plot(*curve("rollout/format_valid_frac"), "o-", label="valid replies")
axes[1].set(title="rollouts", xlabel="RL step", ylim=(-0.05, 1.05))
axes[2].plot(*curve("filter/reward_std_before"), "o-", label="reward std in groups")
axes[2].plot(*curve("actor/entropy"), "o-", label="policy entropy")
axes[2].set(title="Echo Trap diagnostics", xlabel="RL step")
for ax in axes:
  ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(workdir, "quickstart_curves.png"), dpi=80)
plt.show()
print(sorted(os.listdir(workdir)))

# %% [markdown]
# ## 4. The losses and objectives in your own JAX code
# `jagent.losses` holds the RL losses as pure, jittable functions of arrays (no model, no
# framework state). Per-group advantages take one group `[G]` (vmap over groups), token
# losses come back unreduced, and the aggregations return `(total, denominator)` so that
# micro-batch accumulation is exact. Below: GRPO advantages of 2 groups of 4
# trajectories, broadcast over each trajectory's trained tokens, then the PPO clipped
# surrogate (with DAPO's clip-higher and dual-clip), under `jax.jit` and `jax.grad`.

# %%
G, S = 4, 6  # group size, tokens per row
scores = jnp.array([1.0, 0.0, 0.0, 0.5,  # group 0
                    0.1, 0.1, 0.1, 0.1])  # group 1: equal scores, so no signal
mask = jnp.array([[0, 0, 1, 1, 1, 0]] * 8, jnp.float32)  # the sampled (trained) tokens
old_logp = jnp.log(jnp.full((8, S), 0.5))
new_logp = old_logp + 0.3 * jax.random.normal(jax.random.key(4), (8, S))


@jax.jit
def grpo_policy_loss(logp, old_logp, scores, mask):
  adv = jax.vmap(losses.grpo_advantages)(losses.as_groups("scores", scores, G))  # [B/G, G]
  adv_tokens = adv.reshape(-1)[:, None] * mask  # one advantage per trajectory
  out = losses.ppo_clip_loss(logp, old_logp, adv_tokens, eps_low=0.2, eps_high=0.28,
                             dual_clip=3.0)
  agg = losses.token_mean(out.loss, mask)
  return agg.total / agg.denominator, (adv, jnp.sum(out.clipped * mask) / jnp.sum(mask))


(loss, (adv, clip_frac)), grad = jax.value_and_grad(grpo_policy_loss, has_aux=True)(
    new_logp, old_logp, scores, mask)
print("advantages per group:\n", np.round(adv, 3))
print(f"loss {float(loss):.4f}, clipped fraction {float(clip_frac):.3f}")
print("d loss / d logp, row 0:", np.round(grad[0], 4))

# %% [markdown]
# `jagent.transforms` packages whole algorithms the optax way. An `Objective` is
# `init(batch) -> state`, `update(batch, state) -> (batch, state)` (advantages, filters,
# metrics: once per step, outside the gradient) and `loss(model_outputs, batch)` (inside
# the gradient), over one `transforms.Batch` pytree. `transforms.make(name, **kwargs)`
# builds a registered algorithm, `transforms.chain` composes your own stages, and
# `jagent.train.train_step` takes any objective. The same GRPO loss as above:

# %%
print("registered objectives:", transforms.registered())
objective = transforms.make("grpo", kl_coef=0.0, entropy_coef=0.0, eps_high=0.28,
                            dual_clip=3.0)
batch = transforms.Batch(loss_mask=mask, scores=scores, old_logprobs=old_logp, group_size=G)
state = objective.init(batch)
batch, state = jax.jit(objective.update)(batch, state)
print("advantages, row 0:", np.round(batch.advantages[0], 3))


def objective_loss(logp):
  out = objective.loss(transforms.ModelOutputs(logprobs=logp), batch)
  return out.loss_sum / out.denominator, out.metrics


(loss2, metrics), grad2 = jax.jit(jax.value_and_grad(objective_loss, has_aux=True))(new_logp)
print(f"objective loss {float(loss2):.4f} (by hand above: {float(loss):.4f})")
print({k: round(float(v), 4) for k, v in metrics.items()})
np.testing.assert_allclose(loss2, loss, rtol=1e-5)
np.testing.assert_allclose(grad2, grad, rtol=1e-4, atol=1e-7)
