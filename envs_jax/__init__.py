"""envs_jax: jit-compiled, batched, pure-JAX text-agent environments.

    env, params = envs_jax.make("Sokoban-6x6-1box-v0")
    obs, state = env.reset(key, params)
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)

Please don't use symbols in ``envs_jax._src``: they may change without notice.
"""

from envs_jax._src.bandit import Bandit
from envs_jax._src.bandit import BanditParams
from envs_jax._src.bandit import BanditState
from envs_jax._src.coord_grids import CoordFrozenLake
from envs_jax._src.coord_grids import CoordFrozenLakeState
from envs_jax._src.coord_grids import CoordSokoban
from envs_jax._src.boxoban_data import load_levels as load_boxoban_levels
from envs_jax._src.boxoban_data import SUBSETS as BOXOBAN_SUBSETS
from envs_jax._src.countdown import Countdown
from envs_jax._src.countdown import countdown_reward
from envs_jax._src.countdown import CountdownParams
from envs_jax._src.countdown import CountdownState
from envs_jax._src.countdown import encode_answer as encode_countdown_answer
from envs_jax._src.countdown import generate_instance as generate_countdown_instance
from envs_jax._src.countdown import make_params as make_countdown_params
from envs_jax._src.countdown_reference import reference_reward as countdown_reference_reward
from envs_jax._src.countdown_reference import solve as solve_countdown
from envs_jax._src.environment import actions_sentence
from envs_jax._src.environment import AgentDefaults
from envs_jax._src.environment import Environment
from envs_jax._src.environment import grid_render_symbols
from envs_jax._src.environment import number_symbols
from envs_jax._src.environment import PAD_SYMBOL
from envs_jax._src.environment import tree_select
from envs_jax._src.frozen_lake import FrozenLake
from envs_jax._src.frozen_lake import FrozenLakeParams
from envs_jax._src.frozen_lake import FrozenLakeState
from envs_jax._src.frozen_lake_solver import solve_frozen_lake
from envs_jax._src.game_2048 import Game2048
from envs_jax._src.game_2048 import Game2048Params
from envs_jax._src.game_2048 import Game2048State
from envs_jax._src.registration import agent_defaults
from envs_jax._src.registration import make
from envs_jax._src.registration import register
from envs_jax._src.registration import registered
from envs_jax._src.registration import unregister
from envs_jax._src.rubiks_cube import RubiksCube
from envs_jax._src.rubiks_cube import RubiksCubeParams
from envs_jax._src.rubiks_cube import RubiksCubeState
from envs_jax._src.rubiks_cube_solver import solve_rubiks_cube
from envs_jax._src.sokoban import GenerationInfo as SokobanGenerationInfo
from envs_jax._src.sokoban import GeneratorConfig as SokobanGeneratorConfig
from envs_jax._src.sokoban import levels_from_ascii as sokoban_levels_from_ascii
from envs_jax._src.sokoban import Sokoban
from envs_jax._src.sokoban import SokobanParams
from envs_jax._src.sokoban import SokobanState
from envs_jax._src.sokoban_solver import MAX_NODES as SOKOBAN_MAX_NODES
from envs_jax._src.sokoban_solver import PlanCache
from envs_jax._src.sokoban_solver import solve_sokoban
from envs_jax._src.sokoban_solver import solve_sokoban_batch
from envs_jax._src.sokoban_solver import SokobanSolution
from envs_jax._src.sudoku import Sudoku
from envs_jax._src.sudoku import SudokuParams
from envs_jax._src.sudoku import SudokuState
from envs_jax._src.sudoku_solver import solve_sudoku
from envs_jax._src.wrappers import AutoReset
from envs_jax._src.wrappers import TimeLimit
from envs_jax._src.wrappers import TimeLimitState
from envs_jax._src.wrappers import Wrapper

# Environment modules register their ids on import (added as they land).
from envs_jax._src import register_all as _register_all  # noqa: F401

__all__ = (
    "AgentDefaults",
    "AutoReset",
    "Bandit",
    "BanditParams",
    "BanditState",
    "BOXOBAN_SUBSETS",
    "Countdown",
    "CountdownParams",
    "CountdownState",
    "CoordFrozenLake",
    "CoordFrozenLakeState",
    "CoordSokoban",
    "Environment",
    "FrozenLake",
    "FrozenLakeParams",
    "FrozenLakeState",
    "Game2048",
    "Game2048Params",
    "Game2048State",
    "PAD_SYMBOL",
    "TimeLimit",
    "TimeLimitState",
    "Wrapper",
    "actions_sentence",
    "countdown_reference_reward",
    "countdown_reward",
    "encode_countdown_answer",
    "generate_countdown_instance",
    "grid_render_symbols",
    "load_boxoban_levels",
    "agent_defaults",
    "make",
    "make_countdown_params",
    "number_symbols",
    "register",
    "registered",
    "unregister",
    "RubiksCube",
    "RubiksCubeParams",
    "RubiksCubeState",
    "solve_rubiks_cube",
    "solve_countdown",
    "solve_frozen_lake",
    "tree_select",
    "Sokoban",
    "SokobanGenerationInfo",
    "SokobanGeneratorConfig",
    "SokobanParams",
    "SokobanSolution",
    "SokobanState",
    "SOKOBAN_MAX_NODES",
    "sokoban_levels_from_ascii",
    "PlanCache",
    "solve_sokoban",
    "solve_sokoban_batch",
    "solve_sudoku",
    "Sudoku",
    "SudokuParams",
    "SudokuState",
)
