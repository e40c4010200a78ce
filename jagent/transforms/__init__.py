"""jagent.transforms: RL objectives as composable, optax-style transforms.

A :class:`Transform` is a pair of pure functions ``init(batch) -> state`` and
``update(batch, state) -> (batch, state)`` over one documented :class:`Batch`
pytree; stages add advantages, returns, weights, a keep mask and metrics, and
compose with :func:`chain`. The final loss is a pure function of the model's
:class:`ModelOutputs` and the batch returning :class:`LossOutput` ``(loss_sum,
denominator, metrics)``. Every named algorithm is an :class:`Objective` built
only from these pieces, and :func:`make` selects one by name::

    obj = transforms.make("starpo_s")
    state = obj.init(batch)
    batch, state = jax.jit(obj.update)(batch, state)
    out = obj.loss(transforms.ModelOutputs(logprobs, values, entropy), batch)

Please don't use symbols in ``jagent.transforms._*``: they may change without
notice.
"""

from jagent.transforms._aliases import ADVANTAGE_ESTIMATORS
from jagent.transforms._aliases import dapo
from jagent.transforms._aliases import dr_grpo
from jagent.transforms._aliases import gigpo
from jagent.transforms._aliases import grpo
from jagent.transforms._aliases import make_advantage
from jagent.transforms._aliases import ppo
from jagent.transforms._aliases import reinforce_pp
from jagent.transforms._aliases import rloo
from jagent.transforms._aliases import starpo
from jagent.transforms._aliases import starpo_s
from jagent.transforms._aliases import tree_grpo
from jagent.transforms._base import chain
from jagent.transforms._base import EmptyState
from jagent.transforms._base import identity
from jagent.transforms._base import Objective
from jagent.transforms._base import objective
from jagent.transforms._base import ObjectiveNeeds
from jagent.transforms._base import stateless
from jagent.transforms._base import Transform
from jagent.transforms._batch import Batch
from jagent.transforms._batch import LossOutput
from jagent.transforms._batch import ModelOutputs
from jagent.transforms._batch import trajectory_scores
from jagent.transforms._loss import entropy_term
from jagent.transforms._loss import gspo_term
from jagent.transforms._loss import kl_term
from jagent.transforms._loss import LossTerm
from jagent.transforms._loss import make_loss
from jagent.transforms._loss import pg_term
from jagent.transforms._loss import ppo_clip_term
from jagent.transforms._loss import row_weights
from jagent.transforms._loss import TURN_WEIGHTINGS
from jagent.transforms._loss import value_term
from jagent.transforms._registry import make
from jagent.transforms._registry import register
from jagent.transforms._registry import registered
from jagent.transforms._registry import signature
from jagent.transforms._stages import compute_bilevel_gae
from jagent.transforms._stages import compute_dr_grpo
from jagent.transforms._stages import compute_gae
from jagent.transforms._stages import compute_gigpo
from jagent.transforms._stages import compute_grpo
from jagent.transforms._stages import compute_reinforce_pp
from jagent.transforms._stages import compute_reinforce_pp_baseline
from jagent.transforms._stages import compute_rloo
from jagent.transforms._stages import filter_rollouts
from jagent.transforms._stages import kl_reward_penalty
from jagent.transforms._stages import KlControllerState
from jagent.transforms._stages import normalize_rewards
from jagent.transforms._stages import penalize_format
from jagent.transforms._stages import truncate_importance_weights
from jagent.transforms._stages import whiten_advantages
from jagent.transforms._stages import with_filter_stage
from jagent.transforms._tree import compute_tree_grpo
from jagent.transforms._tree import compute_tree_step

__all__ = (
    "ADVANTAGE_ESTIMATORS",
    "Batch",
    "EmptyState",
    "KlControllerState",
    "LossOutput",
    "LossTerm",
    "ModelOutputs",
    "TURN_WEIGHTINGS",
    "Objective",
    "ObjectiveNeeds",
    "Transform",
    "chain",
    "compute_bilevel_gae",
    "compute_dr_grpo",
    "compute_gae",
    "compute_gigpo",
    "compute_grpo",
    "compute_reinforce_pp",
    "compute_reinforce_pp_baseline",
    "compute_rloo",
    "compute_tree_grpo",
    "compute_tree_step",
    "dapo",
    "dr_grpo",
    "entropy_term",
    "filter_rollouts",
    "gigpo",
    "grpo",
    "gspo_term",
    "identity",
    "kl_reward_penalty",
    "kl_term",
    "make",
    "make_advantage",
    "make_loss",
    "normalize_rewards",
    "objective",
    "penalize_format",
    "pg_term",
    "ppo",
    "ppo_clip_term",
    "register",
    "registered",
    "reinforce_pp",
    "rloo",
    "row_weights",
    "signature",
    "starpo",
    "starpo_s",
    "stateless",
    "trajectory_scores",
    "tree_grpo",
    "truncate_importance_weights",
    "value_term",
    "whiten_advantages",
    "with_filter_stage",
)
