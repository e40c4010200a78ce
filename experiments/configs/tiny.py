r"""Tiny-model CPU configs: any registered env x any algorithm.

    python -m experiments.train --config=experiments/configs/tiny.py:FrozenLake-4x4-v0,grpo

The argument after ``:`` is ``<env id>,<algorithm>`` (default
``Sokoban-6x6-1box-v0,starpo_s``, the main job). Algorithms: any
``jagent.transforms`` registry name (ppo, grpo, starpo, starpo_s, dr_grpo,
gigpo, ...). The defaults are the main job's: each turn is its own row whose
context is the system message and that turn's state (``history_turns=0``,
RAGEN's ``single_turn``); SFT warm start on a small budget of BFS
demonstrations, then RL with 16 groups x 8 rollouts (StarPO-S
trains on the top half of the groups by in-group reward std, with GiGPO's
step advantage in multi-turn games; the other algorithms on every group), evaluated on 512 fixed held-out levels at
temperature 0.5 and greedily.
"""

from __future__ import annotations

import ml_collections

import envs_jax
from experiments import fields
from experiments import hyperparameters


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The config of ``"<env id>,<algorithm>"`` (see the module docstring)."""
  env, algorithm = fields.config_arg(arg, "Sokoban-6x6-1box-v0,starpo_s")
  # Each game's own episode budgets and system message (Environment.agent_defaults),
  # read without building its params: nothing here may start a JAX backend
  # before a multi-host run's jax.distributed.initialize.
  game = envs_jax.agent_defaults(env)
  if game is None:
    raise ValueError(f"environment {env!r} has no agent_defaults; set them on its "
                     "class (envs_jax.AgentDefaults)")
  c = ml_collections.ConfigDict()
  c.env = env
  c.algorithm = algorithm
  # StarPO(-S) advantages without a critic (a value head learns too slowly on
  # a tiny model; pass advantage="gae" for one). Multi-turn games: GiGPO's
  # episode + anchor-state step advantage, so a wall bump is not credited like
  # the good moves of its episode (4 seeds: +10.2 points against +7.7 for the
  # group-normalised episode advantage); one-turn games: GRPO's (a step group
  # there is the episode group). Each trajectory weighs the same in the loss
  # (seq-mean-token-mean): with token-mean, failed episodes (all turns played)
  # outweigh solved ones. Measurements: docs/results.md.
  # Every other hyperparameter at the objective's default, each a flag
  # (--config.algorithm_kwargs.entropy_coef=0.01) and in config.json.
  advantage = "gigpo" if game.max_turns > 1 else "grpo"
  c.algorithm_kwargs = hyperparameters.algorithm_kwargs(algorithm, **(
      {"kl_coef": 0.0, "advantage": advantage, "aggregation": "seq-mean-token-mean"}
      if algorithm in ("starpo", "starpo_s")
      else {"kl_coef": 0.0} if algorithm not in ("reinforce_pp",) else {}))
  c.seed = 0
  # ~0.28M parameters (d64, 4 layers): "nano" (2 layers) never left uniform
  # actions in SFT on Sokoban; "tiny" (0.65M) is ~2x slower per step.
  c.model = "micro"
  c.tokenizer = "tiny"  # or a Hugging Face model directory
  c.model_dir = ""  # a Hugging Face checkpoint directory (empty: random init)
  # Rematerialize each decoder block in the backward pass (ModelConfig.remat):
  # less activation memory for ~1 more forward of compute; off for tiny models.
  c.remat = False
  # The dtype of activations and the KV cache (ModelConfig.dtype): "bfloat16"
  # halves both; weights, gradients and Adam moments stay in the model's
  # parameter dtype (float32), and logits and losses are computed in float32.
  c.compute_dtype = "float32"
  # The KV cache's dtype (ModelConfig.cache_dtype; "": compute_dtype): a
  # "bfloat16" cache halves a long rollout's largest buffer and leaves the
  # training forward (no cache) in compute_dtype.
  c.cache_dtype = ""
  # The attention kernel (ModelConfig.attention_impl): "auto" picks by
  # platform (jagent's XLA attention on CPU, cuDNN on GPU, Pallas on TPU).
  c.attention_impl = "auto"
  # LoRA adapters (jagent.models.LoraConfig) on a frozen base; rank 0: off
  # (every weight trains). target_modules: "all-linear" or names from q, k, v,
  # o, gate, up, down ("q,v"). Only the adapters and their Adam moments are
  # trained and checkpointed; the base is reloaded (model_dir, or the seed).
  # Adapters need a TRAINED base: on the random one (empty model_dir) they
  # cannot learn even the reply format (the frozen tied embeddings and final
  # norm cap the logits at ~1.3; Bandit: format NLL ~5.06 nats vs 0.09 fully
  # fine-tuned; blocks.lora_base_warning says so). Train the base first (a
  # full run's <workdir>/policy export as model_dir) and use ~10x the full
  # fine-tuning learning rate (lora_test's Bandit run: rl.learning_rate 1e-2).
  # base_dtype "bfloat16" stores the frozen base in half the memory (computed
  # in the model's dtype; the adapters stay float32).
  c.lora = ml_collections.ConfigDict(dict(
      rank=0, alpha=32.0, dropout=0.0, target_modules="all-linear", base_dtype="float32"))
  # Devices: "" runs on one device; a jagent.sharding.make_mesh spec ("data:8",
  # "data:2,fsdp:2,tensor:2", "fsdp:-1") spreads the run over every device jax
  # sees (all processes' with --distributed); rows over data x fsdp.
  c.mesh = ""

  # The tiny model learns the game from the demonstrations, so each turn's
  # prompt is only the state in the chat framing: no instructions, turn
  # numbers or rewards to read (~60 tokens a Sokoban turn instead of ~74,
  # and attention cost grows with the square of the context).
  c.prompt = ml_collections.ConfigDict(dict(
      system=game.system, instructions="", first_turn="{state}\n",
      next_turn="{state}\n", think=False,
      max_actions_per_turn=1, chat_template="chatml"))

  c.rollout = ml_collections.ConfigDict(dict(
      # 16 groups: StarPO-S trains on the top half, so each step learns from
      # ~8 levels with reward variance instead of ~4 (docs/results.md).
      num_groups=16, group_size=8, max_turns=game.max_turns,
      max_tokens_per_turn=game.max_tokens_per_turn,
      max_actions_per_traj=game.max_actions_per_traj, temperature=1.0,
      # -1: each episode is one sequence; k >= 0: one row per turn with the
      # last k turns as context (RAGEN's max_context_window; 0 = single_turn).
      # 0: the tiny policy reads one short, fixed-layout context per decision,
      # and SFT and RL both learn far more from it than from the whole history
      # (ablation: docs/results.md, "History mode").
      history_turns=0,
      # LoRA: sample with the adapters merged into a copy of the weights
      # (faster) or applied at every step (False: no merged copy in memory).
      merge_lora=True,
      # Prefill prompts in chunks of this many tokens (0: at once).
      prefill_chunk=0,
      # Tree rollouts (jagent.rollout.TreeConfig; Tree-GRPO): at the start of
      # each turn in fork_turns, `expand` running nodes of each tree (empty:
      # all) fork into `branches` children that copy the env state, context
      # and keys; one value, or one per fork turn. group_size must equal
      # trees x the rows of a tree. Empty fork_turns: independent episodes.
      tree=ml_collections.ConfigDict(dict(
          fork_turns=(), branches=(2,), expand=(), trees=1, select="random"))))

  # 800 steps: SFT sits at uniform actions for a few hundred steps before the
  # policy starts reading the grid (docs/results.md). batch_size counts rows:
  # turns in a bounded window (64 turns ~ the 16 episodes of the full history).
  # expert: "solver" (BFS demonstrations) or "random" (random actions: teaches
  # the reply format only, e.g. for Bandit, whose solver would give the answer).
  # expert_<name>: the game's expert option <name> (envs_jax's
  # Environment.expert_defaults), given to games whose expert takes it.
  # expert_max_nodes: the solver's per-level search cap (Sokoban's BFS states);
  # a capped search replies an arbitrary move, so levels harder than the cap
  # (a few Boxoban ones need 2-5M states) teach noise. expert_reuse_plans:
  # follow the first search's plan instead of searching every turn (Boxoban:
  # one search an episode, not ~30; equally short plans, ties may differ).
  c.sft = ml_collections.ConfigDict(dict(
      expert="solver", num_demos=128, steps=800, batch_size=64, learning_rate=1e-3,
      warmup_steps=20, actions_per_turn=1, expert_max_nodes=envs_jax.SOKOBAN_MAX_NODES,
      expert_reuse_plans=False))

  # The uncertainty filter (top groups by in-group score std) is StarPO-S's;
  # the other objectives train on every group, as in RAGEN's comparison.
  starpo_s = algorithm == "starpo_s"
  # lr 1e-4: one Adam step moves a 0.28M policy a lot, and larger rates
  # lowered success. 800 steps: held-out success still rose at step 500 of
  # 500, and 800 fit the main job's 15 minutes on 2 cores (measurements:
  # docs/results.md, "800 RL steps").
  c.rl = ml_collections.ConfigDict(dict(
      steps=800, learning_rate=1e-4, warmup_steps=10, decay="linear",
      critic_learning_rate=1e-3, critic="head",
      # Two Adam steps a batch, each on half the kept rows (the second is
      # off-policy, so the clip acts): on 4 seeds the mean RL gain went from
      # +8.7 to +11.2 points at the same compute (docs/results.md, "Two Adam
      # steps a batch").
      num_minibatches=2, ppo_epochs=1,
      # Gradient accumulation: each minibatch's forward/backward in this many
      # chunks of rows (exact; bounds the activation memory, not the result).
      # 8 chunks a batch: the whole batch's activations are over a GiB, and
      # writing them costs more than the extra loop (docs/results.md, main
      # job timing).
      num_microbatches=4,
      filter_mode="top_fraction", filter_value=0.5 if starpo_s else 1.0,
      include_zero=not starpo_s,
      max_grad_norm=1.0, weight_decay=0.0,
      # The sampler's log-probs equal the trainer's to ~1e-5: use them as the
      # PPO old log-probs and skip a forward pass ("recompute": RAGEN's way).
      old_logprobs="sampler",
      # Stop after this many steps in a row that trained nothing (the filter
      # kept no group; RAGEN-2's rollout_filter_empty_stop_steps, 5 there);
      # 0: never. Off here: the main job's measured figures ran every step
      # (16 of its 500 steps kept no group).
      empty_stop_steps=0))

  # held_out: evaluation levels that are also training levels (same initial
  # state) are replaced by fresh ones; the summary's held_out_removed counts
  # them (35% of 512 Sokoban-6x6 levels were training levels of the main job).
  c.eval = ml_collections.ConfigDict(dict(
      num_levels=512, seed=123, every=50, temperature=0.5, greedy=True, num_groups=64,
      samples=4, held_out=True))
  # Checkpoints after SFT (step 0), every `every` RL steps (0: the last only).
  c.checkpoint = ml_collections.ConfigDict(dict(every=50, keep=2))
  # RAGEN-2's collapse diagnostics (jagent.train.collapse_metrics): on the
  # first RL step and every `every` steps (0: off), the reply entropy H(Z|X)
  # and the mutual information I(X;Z) of num_rows (prompt, reply) pairs of
  # that step's rollout (num_rows^2 replies scored; per token, nats), logged
  # as collapse/*. On those steps a warning names each of in-group reward std
  # (filter/reward_std_before), policy entropy (actor/entropy), both averaged
  # over the steps since the previous diagnosed one, and I(X;Z) that is below
  # its floor (0: no check): the Echo Trap's early signs.
  c.diagnostics = ml_collections.ConfigDict(dict(
      every=25, num_rows=32, min_reward_std=0.1, min_entropy=0.02, min_mutual_info=0.01))
  return c


def benchmark_config(env: str, algorithm: str, model: str, num_groups: int, group_size: int,
                     max_turns: int, max_tokens_per_turn: int, history_turns: int,
                     seed: int = 0) -> ml_collections.ConfigDict:
  """``get_config("<env>,<algorithm>")`` at a benchmark's sizes, from random weights.

  No SFT and no collapse diagnostics (``diagnostics.every = 0``: they run on
  a few logged steps only, and the benchmarks time early steps).

  Args:
    env: a registered env id.
    algorithm: a ``jagent.transforms`` name (the main job's: ``"starpo_s"``).
    model: a ``jagent.models`` config name (random weights).
    num_groups, group_size, max_turns, max_tokens_per_turn: the rollout's
      (``config.rollout.*``).
    history_turns: ``config.rollout.history_turns`` (-1: full history).
    seed: ``config.seed``.

  Returns:
    An ``ml_collections.ConfigDict`` for :class:`experiments.experiment.Experiment`
    (not validated yet: ``experiments.spec.validate`` names a bad field).
  """
  c = get_config(f"{env},{algorithm}")
  c.model = model
  c.seed = seed
  c.rollout.update(dict(num_groups=num_groups, group_size=group_size, max_turns=max_turns,
                        max_tokens_per_turn=max_tokens_per_turn, history_turns=history_turns))
  c.sft.steps = 0
  c.rl.num_microbatches = 1  # any group size; the benchmarks' batches are small
  c.diagnostics.every = 0
  return c
