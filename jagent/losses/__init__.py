"""jagent.losses: RL objectives for LLM agents as pure, jittable functions.

Per-trajectory functions take ``[T]`` arrays and batch with ``jax.vmap``;
per-group functions take one group ``[G]`` (rows of a batch are group-major,
``G`` static: vmap over ``x.reshape(B // G, G)``, see :func:`as_groups`);
batch-level functions (aggregation, whitening, filters) take ``[B, T]`` or
``[B // G, G]``. Token losses are unreduced; the aggregation functions return
``(total, denominator)`` so micro-batch accumulation is exact. Formulas follow
verl's conventions (``ratio = exp(clip(logp - logp_old, -20, 20))``).

Please don't use symbols in ``jagent.losses._*``: they may change without
notice.
"""

from jagent.losses._advantages import AdvantagesAndReturns
from jagent.losses._advantages import as_groups
from jagent.losses._advantages import bilevel_gae
from jagent.losses._advantages import discounted_returns
from jagent.losses._advantages import dr_grpo_advantages
from jagent.losses._advantages import gae
from jagent.losses._advantages import gigpo_advantages
from jagent.losses._advantages import GigpoAdvantages
from jagent.losses._advantages import grpo_advantages
from jagent.losses._advantages import masked_whiten
from jagent.losses._advantages import reinforce_pp_advantages
from jagent.losses._advantages import reinforce_pp_baseline_advantages
from jagent.losses._advantages import rloo_advantages
from jagent.losses._advantages import turn_ends
from jagent.losses._aggregation import Aggregate
from jagent.losses._aggregation import aggregate
from jagent.losses._aggregation import AGGREGATION_MODES
from jagent.losses._aggregation import safe_ratio
from jagent.losses._aggregation import seq_mean_token_mean
from jagent.losses._aggregation import seq_mean_token_sum
from jagent.losses._aggregation import seq_mean_token_sum_norm
from jagent.losses._aggregation import token_mean
from jagent.losses._filters import FILTER_MODES
from jagent.losses._filters import filter_groups
from jagent.losses._filters import FilterConfig
from jagent.losses._filters import FilterResult
from jagent.losses._filters import group_std
from jagent.losses._policy import gspo_loss
from jagent.losses._policy import importance_ratio
from jagent.losses._policy import policy_gradient_loss
from jagent.losses._policy import PolicyLoss
from jagent.losses._policy import ppo_clip_loss
from jagent.losses._policy import truncated_importance_weights
from jagent.losses._regularizers import clipped_value_loss
from jagent.losses._regularizers import entropy_from_logits
from jagent.losses._regularizers import KL_ESTIMATORS
from jagent.losses._regularizers import kl_penalty
from jagent.losses._regularizers import ValueLoss
from jagent.losses._shaping import FORMAT_PENALTY
from jagent.losses._shaping import format_penalty
from jagent.losses._shaping import running_norm_apply
from jagent.losses._shaping import running_norm_init
from jagent.losses._shaping import running_norm_update
from jagent.losses._shaping import RunningNormState
from jagent.losses._shaping import token_to_turn_rewards
from jagent.losses._shaping import turn_mask
from jagent.losses._shaping import turn_to_token_rewards
from jagent.losses._tree import NODE_REDUCES
from jagent.losses._tree import TREE_COMBINES
from jagent.losses._tree import tree_grpo_advantages
from jagent.losses._tree import tree_node_values
from jagent.losses._tree import tree_step_advantages

__all__ = (
    "NODE_REDUCES",
    "TREE_COMBINES",
    "tree_grpo_advantages",
    "tree_node_values",
    "tree_step_advantages",
    "AGGREGATION_MODES",
    "Aggregate",
    "AdvantagesAndReturns",
    "FILTER_MODES",
    "FORMAT_PENALTY",
    "FilterConfig",
    "FilterResult",
    "GigpoAdvantages",
    "KL_ESTIMATORS",
    "PolicyLoss",
    "RunningNormState",
    "ValueLoss",
    "aggregate",
    "as_groups",
    "bilevel_gae",
    "clipped_value_loss",
    "discounted_returns",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "filter_groups",
    "format_penalty",
    "gae",
    "gigpo_advantages",
    "group_std",
    "grpo_advantages",
    "gspo_loss",
    "importance_ratio",
    "kl_penalty",
    "masked_whiten",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "running_norm_apply",
    "running_norm_init",
    "running_norm_update",
    "safe_ratio",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_mean",
    "token_to_turn_rewards",
    "truncated_importance_weights",
    "turn_ends",
    "turn_mask",
    "turn_to_token_rewards",
)
