"""jagent.train: train state, jit-compiled train steps, evaluation, checkpoints and metrics.

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
  # evaluation on fixed levels, chunk by chunk (on a mesh:
  # jagent.sharding.shard_eval_program instead of jax.jit):
  program = jax.jit(train.eval_program(eval_rollout))
  metrics, first_chunk = train.evaluate(program, state.params, reset_keys, key,
                                        num_groups)
  ckpt = train.Checkpointer(workdir, keep=3)
  ckpt.save(int(state.step), state, {"config": ...})

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

from jagent._src.files import write_json
from jagent._src.files import write_text
from jagent.train._batch import trajectory_batch
from jagent.train._checkpoint import CheckpointError
from jagent.train._checkpoint import Checkpointer
from jagent.train._checkpoint import export_policy
from jagent.train._collapse import collapse_estimates
from jagent.train._collapse import collapse_metrics
from jagent.train._critic import CRITIC_KINDS
from jagent.train._critic import critic_values
from jagent.train._critic import CriticParams
from jagent.train._critic import init_critic
from jagent.train._critic import ValueHead
from jagent.train._eval import decode_samples
from jagent.train._eval import eval_program
from jagent.train._eval import evaluate
from jagent.train._eval import held_out_reset_keys
from jagent.train._logprobs import LogprobsOutput
from jagent.train._logprobs import token_logprobs
from jagent.train._metrics import MetricsWriter
from jagent.train._metrics import plot_metrics
from jagent.train._metrics import plot_seed_curves
from jagent.train._metrics import PlotPanel
from jagent.train._metrics import PlotSeries
from jagent.train._metrics import read_metrics
from jagent.train._metrics import seed_band
from jagent.train._metrics import smooth_curve
from jagent.train._optim import current_learning_rate
from jagent.train._optim import make_optimizer
from jagent.train._optim import make_schedule
from jagent.train._optim import OptimizerConfig
from jagent.train._rl import compact_groups
from jagent.train._rl import iteration_filter
from jagent.train._rl import num_kept_groups
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
from jagent.train._step import sft_update
from jagent.train._step import train_step

__all__ = (
    "AccumulatedGradients",
    "CRITIC_KINDS",
    "CheckpointError",
    "Checkpointer",
    "CriticParams",
    "LogprobsOutput",
    "MetricsWriter",
    "OLD_LOGPROBS",
    "ObjectiveNeeds",
    "OptimizerConfig",
    "PlotPanel",
    "PlotSeries",
    "TrainConfig",
    "TrainState",
    "ValueHead",
    "accumulate_gradients",
    "collapse_estimates",
    "collapse_metrics",
    "compact_groups",
    "critic_values",
    "current_learning_rate",
    "decode_samples",
    "eval_program",
    "evaluate",
    "export_policy",
    "held_out_reset_keys",
    "init_critic",
    "init_train_state",
    "iteration_filter",
    "make_optimizer",
    "make_schedule",
    "nll_loss",
    "num_kept_groups",
    "objective_needs",
    "plot_metrics",
    "plot_seed_curves",
    "read_metrics",
    "rl_iteration",
    "seed_band",
    "sft_step",
    "sft_update",
    "smooth_curve",
    "token_logprobs",
    "train_step",
    "write_json",
    "write_text",
    "trajectory_batch",
)
