r"""RAGEN-scale configs for accelerators: RAGEN v1's protocol and hyperparameters.

    python -m experiments.train \
        --config=experiments/configs/ragen.py:Sokoban-6x6-1box-v0,starpo_s \
        --config.model_dir=/path/to/Qwen2.5-0.5B-Instruct --workdir=/tmp/ragen_sokoban

The argument after ``:`` is ``<env id>,<algorithm>`` as in
``experiments/configs/tiny.py`` (whose fields this config overrides), with an
optional ``,lora`` for the LoRA variant: rank 64, alpha 64, all-linear
adapters on the frozen model (and on the critic's copy), at an actor lr of
1e-5 (not tuned here: LoRA is commonly run at about 10x the full
fine-tuning rate). The model
and tokenizer come from a Hugging Face directory (``config.model_dir``; nothing
downloads at run time). Values from the RAGEN v1 paper (Wang et al., arXiv
2504.20073) and its training setup: an instruct model trained from the start
(no SFT), think mode (``<think>..</think><answer>..</answer>``, up to 5 actions a turn), 5
turns, 10 actions, 400 tokens a turn; 8 groups x 16 rollouts at temperature
1; PPO minibatches of 32 rows, 1 epoch; actor lr 1e-6, critic lr 1e-5, AdamW
weight decay 0.01, gradient clip 1; StarPO-S keeps the top 25% of groups (no
KL, clip-higher 0.2 / 0.28, a GAE critic: a separate copy of the model, as
RAGEN's); 200 steps; validation every 10 steps on 256 fixed levels (seeds
from 123) at temperature 0.5.
"""

from __future__ import annotations

import ml_collections

from experiments import hyperparameters
from experiments.configs import tiny
from jagent import losses
from jagent import rollout
from jagent import train

_RAGEN_PROMPT = rollout.PromptConfig()  # its defaults are RAGEN's turn texts


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The RAGEN-scale config of ``"<env id>,<algorithm>"``."""
  parts = (arg or "Sokoban-6x6-1box-v0,starpo_s").split(",")
  lora = parts[2:] == ["lora"]
  if parts[2:] and not lora:
    raise ValueError(f"ragen config {arg!r}: the third part may only be 'lora'")
  c = tiny.get_config(",".join(parts[:2]))
  # The objectives' own defaults are RAGEN's (StarPO-S: GAE critic, filter,
  # clip-higher, entropy 0.001; PPO: GAE critic; GRPO: group advantages).
  c.algorithm_kwargs = hyperparameters.algorithm_kwargs(c.algorithm)
  c.model = "qwen2.5-0.5b"  # the architecture; weights from model_dir
  c.model_dir = ""  # REQUIRED: a Hugging Face directory (Qwen2.5-0.5B-Instruct)
  c.tokenizer = ""  # the model_dir's tokenizer.json and chat template
  # Per-block rematerialization: the update keeps each block's input, not its
  # H x S x S attention scores (~2 GiB per row per layer at 2,904 tokens).
  c.remat = True
  # One device by default; e.g. "data:8" on 8 chips (the 128 rollout rows and
  # the eval's 64 split 8 ways), "fsdp:-1" to shard the weights and Adam
  # moments too (see the memory table in the launch notes).
  c.mesh = ""
  c.prompt.update(dict(
      system=_RAGEN_PROMPT.system, instructions="", first_turn=_RAGEN_PROMPT.first_turn,
      next_turn=_RAGEN_PROMPT.next_turn, think=True,
      max_actions_per_turn=_RAGEN_PROMPT.max_actions_per_turn, chat_template=""))
  # RAGEN v1 keeps the whole conversation in context (its "full" mode).
  c.rollout.update(dict(num_groups=8, group_size=16, max_tokens_per_turn=400,
                        temperature=1.0, history_turns=-1))
  c.sft.update(dict(steps=0))
  filter_value = 0.25 if c.algorithm == "starpo_s" else 1.0
  # RAGEN's 32-row PPO minibatches of the trained rows (kept groups x 16).
  rows = train.num_kept_groups(c.rollout.num_groups, losses.FilterConfig(
      c.rl.filter_mode, filter_value)) * c.rollout.group_size
  c.rl.update(dict(
      steps=200, learning_rate=1e-6, warmup_steps=0, decay="constant",
      critic_learning_rate=1e-5, critic="model", weight_decay=0.01, max_grad_norm=1.0,
      filter_value=filter_value, include_zero=True, num_minibatches=max(1, rows // 32),
      # Each minibatch in micro-batches of one row per device (data x fsdp):
      # a 2,904-token row needs ~69 GiB of float32 activations on one chip.
      num_microbatches=-1, ppo_epochs=1, old_logprobs="recompute",
      # RAGEN-2's rollout_filter_empty_stop_steps default: stop after 5 steps
      # in a row whose filter kept no group.
      empty_stop_steps=5))
  if lora:
    c.lora.update(dict(rank=64, alpha=64.0, dropout=0.0, target_modules="all-linear"))
    c.rl.learning_rate = 1e-5
  c.eval.update(dict(num_levels=256, seed=123, every=10, num_groups=64))
  c.checkpoint.update(dict(every=10, keep=3))
  # RAGEN-2's collapse detection every 5 steps (its compute_freq); Z is the
  # reasoning inside <think>..</think> (think mode).
  c.diagnostics.update(dict(every=5, num_rows=32))
  return c
