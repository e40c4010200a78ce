"""jagent.train: train state, jit-compiled train steps, checkpoints and metrics.

Example (one StarPO-S step on a rollout batch)::

  from jagent import models, train, transforms
  cfg = train.TrainConfig(model=models.get_config("tiny"), num_minibatches=4)
  objective = transforms.make("starpo_s")         # build once: it is static
  needs = objective.needs                         # critic=True, reference=False
  state = train.init_train_state(
      params, jax.random.key(0), config=cfg,
      critic="head" if needs.critic else None, reference=needs.reference,
      objective=objective)
  batch = train.trajectory_batch(traj)            # a rollout.Trajectory
  state, metrics = train.train_step(state, batch, objective=objective,
                                    config=cfg)
  ckpt = train.Checkpointer(workdir, keep=3)
  ckpt.save(int(state.step), state, {"config": ...})

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

from jagent.train._batch import trajectory_batch
from jagent.train._checkpoint import Checkpointer
from jagent.train._checkpoint import export_policy
from jagent.train._critic import critic_values
from jagent.train._critic import CriticParams
from jagent.train._critic import init_critic
from jagent.train._critic import ValueHead
from jagent.train._logprobs import LogprobsOutput
from jagent.train._logprobs import token_logprobs
from jagent.train._metrics import MetricsWriter
from jagent.train._metrics import read_metrics
from jagent.train._optim import current_learning_rate
from jagent.train._optim import make_optimizer
from jagent.train._optim import make_schedule
from jagent.train._optim import OptimizerConfig
from jagent.train._rl import rl_iteration
from jagent.train._state import init_train_state
from jagent.train._state import objective_needs
from jagent.train._state import OLD_LOGPROBS
from jagent.train._state import ObjectiveNeeds
from jagent.train._state import TrainConfig
from jagent.train._state import TrainState
from jagent.train._step import accumulate_gradients
from jagent.train._step import AccumulatedGradients
from jagent.train._step import nll_loss
from jagent.train._step import sft_step
from jagent.train._step import train_step

__all__ = (
    "AccumulatedGradients",
    "Checkpointer",
    "CriticParams",
    "LogprobsOutput",
    "MetricsWriter",
    "OLD_LOGPROBS",
    "ObjectiveNeeds",
    "OptimizerConfig",
    "TrainConfig",
    "TrainState",
    "ValueHead",
    "accumulate_gradients",
    "critic_values",
    "current_learning_rate",
    "export_policy",
    "init_critic",
    "init_train_state",
    "make_optimizer",
    "make_schedule",
    "nll_loss",
    "objective_needs",
    "read_metrics",
    "rl_iteration",
    "sft_step",
    "token_logprobs",
    "train_step",
    "trajectory_batch",
)
