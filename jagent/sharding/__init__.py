"""jagent.sharding: device meshes, logical-axis rules, sharded train and rollout steps.

Example (8 devices: 2-way data, 2-way FSDP, 2-way tensor parallelism)::

  from jagent import sharding, train
  mesh = sharding.make_mesh("data:2,fsdp:2,tensor:2")
  shardings = sharding.train_state_shardings(state, mesh)
  state = jax.device_put(state, shardings)
  step = sharding.shard_train_step(objective, train_config, mesh, shardings)
  rollout = sharding.shard_rollout(text_env, model_config, rollout_config, mesh)
  traj = rollout(state.params, key)            # rows over data x fsdp
  state, metrics = step(state, train.trajectory_batch(traj))  # state donated
  # or the whole RL iteration (rollout -> filter -> update) as one program:
  iteration = sharding.shard_rl_iteration(train_rollout, objective, train_config, mesh,
                                          shardings, num_keep=2)
  state, metrics = iteration(state, key)
  # evaluation on fixed levels, chunk by chunk (jagent.train.evaluate):
  program = sharding.shard_eval_program(eval_rollout, mesh)
  metrics, first_chunk = train.evaluate(program, state.params, reset_keys, key, num_groups)
  samples = train.decode_samples(sharding.to_host(first_chunk), tokenizer)

Multi-process runs (``jax.distributed.initialize``): the mesh spans every
process's devices; host rows become global arrays with :func:`global_rows`.

Please don't use symbols in the ``_``-prefixed modules: they may change.
"""

from jagent.sharding._mesh import make_mesh
from jagent.sharding._mesh import MESH_AXES
from jagent.sharding._mesh import parse_mesh_spec
from jagent.sharding._mesh import ROW_AXES
from jagent.sharding._mesh import rows_size
from jagent.sharding._placement import place_state
from jagent.sharding._placement import to_host
from jagent.sharding._placement import train_state_target
from jagent.sharding._rules import activation_rules
from jagent.sharding._rules import batch_sharding
from jagent.sharding._rules import DEFAULT_RULES
from jagent.sharding._rules import global_rows
from jagent.sharding._rules import logical_to_sharding
from jagent.sharding._rules import param_shardings
from jagent.sharding._rules import replicated
from jagent.sharding._rules import rows_shardings
from jagent.sharding._rules import shard_rows
from jagent.sharding._rules import train_state_shardings
from jagent.sharding._rules import tree_shardings
from jagent.sharding._steps import rows_constraint
from jagent.sharding._steps import shard_eval_program
from jagent.sharding._steps import shard_rl_iteration
from jagent.sharding._steps import shard_rollout
from jagent.sharding._steps import shard_sft_step
from jagent.sharding._steps import shard_train_step

__all__ = (
    "DEFAULT_RULES",
    "MESH_AXES",
    "ROW_AXES",
    "activation_rules",
    "batch_sharding",
    "global_rows",
    "logical_to_sharding",
    "make_mesh",
    "param_shardings",
    "parse_mesh_spec",
    "place_state",
    "replicated",
    "rows_constraint",
    "rows_shardings",
    "rows_size",
    "shard_eval_program",
    "shard_rl_iteration",
    "shard_rollout",
    "shard_rows",
    "shard_sft_step",
    "shard_train_step",
    "train_state_shardings",
    "to_host",
    "train_state_target",
    "tree_shardings",
)
