"""What a run's config means: the one home of the defaults of older configs.

A run's ``config.json`` holds the fields its version of the config files had.
:func:`upgrade` fills each field added since with the value under which the
older versions ran (which is not always today's default in
``experiments/configs/tiny.py``: e.g. runs saved before
``rollout.history_turns`` trained on the full history, -1, where tiny.py now
sets 0). Every program that reads a config (``experiments.train``,
``experiments.eval``, ``experiments.sweep``, a base run's ``config.json``)
upgrades it once; the code then reads ``config.<field>`` directly.
"""

from __future__ import annotations

from typing import Any

import ml_collections

import envs_jax

# Dotted config field -> the value that runs saved before the field behaved as.
LEGACY_DEFAULTS: dict[str, Any] = {
    # Devices: one (the default device).
    "mesh": "",
    # A random init of config.model (no Hugging Face checkpoint).
    "model_dir": "",
    # The model as loaded: no rematerialization, float32 compute, the
    # platform's attention, a KV cache in the compute dtype.
    "remat": False,
    "compute_dtype": "float32",
    "attention_impl": "auto",
    "cache_dtype": "",
    # No LoRA (every weight trains); the other fields are LoraConfig's
    # defaults, and the base stays in the dtype it was loaded in (None).
    "lora.rank": 0,
    "lora.alpha": 32.0,
    "lora.dropout": 0.0,
    "lora.target_modules": "all-linear",
    "lora.base_dtype": None,
    # One sequence per episode (the full history), sampled with merged adapters.
    "rollout.history_turns": -1,
    "rollout.merge_lora": True,
    "rollout.prefill_chunk": 0,
    # No gradient accumulation; never stop early.
    "rl.num_microbatches": 1,
    "rl.empty_stop_steps": 0,
    # BFS demonstrations, each search capped at 1,000,000 states, one search a turn.
    "sft.expert": "solver",
    "sft.expert_max_nodes": envs_jax.SOKOBAN_MAX_NODES,
    "sft.expert_reuse_plans": False,
    # Evaluation on split(key(eval.seed), eval.num_levels), training levels included.
    "eval.held_out": False,
    # No collapse diagnostics and no Echo Trap alert.
    "diagnostics.every": 0,
    "diagnostics.num_rows": 32,
    "diagnostics.min_reward_std": 0.0,
    "diagnostics.min_entropy": 0.0,
    "diagnostics.min_mutual_info": 0.0,
}


def upgrade(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``config`` with every field of :data:`LEGACY_DEFAULTS` it lacks filled.

  A field (or a whole group, e.g. ``lora`` or ``diagnostics``) absent from a
  config saved by an older version gets the value that version ran with; a
  field present keeps its value, so upgrading a current config changes
  nothing and upgrading twice equals upgrading once. References and
  placeholders are resolved (``copy_and_resolve_references``); ``config`` is
  not modified.

  Args:
    config: a run's config (``experiments/configs/*.py``, or a
      ``config.json`` read back as a ConfigDict).

  Returns:
    The upgraded copy.

  Raises:
    ValueError: a field on the path of a default holds a value where the
      default needs a group (e.g. ``lora=0``), naming it.
  """
  out = config.copy_and_resolve_references()
  with out.unlocked():
    for path, value in LEGACY_DEFAULTS.items():
      *groups, name = path.split(".")
      node = out
      for i, g in enumerate(groups):
        if g not in node:
          node[g] = ml_collections.ConfigDict()
        node = node[g]
        if not isinstance(node, ml_collections.ConfigDict):
          raise ValueError(f"config.{'.'.join(groups[:i + 1])}={node!r}: a group of fields "
                           f"is needed here (it holds config.{path})")
      if name not in node:
        node[name] = value
  return out
