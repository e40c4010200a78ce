"""Imports every environment module so that each registers its ids.

Each environment module calls ``registration.register`` at import time for the
ids it owns. Add one import line here per environment module.
"""

from envs_jax._src import bandit  # noqa: F401
from envs_jax._src import coord_grids  # noqa: F401
from envs_jax._src import countdown  # noqa: F401
from envs_jax._src import frozen_lake  # noqa: F401
from envs_jax._src import game_2048  # noqa: F401
from envs_jax._src import rubiks_cube  # noqa: F401
from envs_jax._src import sokoban  # noqa: F401
from envs_jax._src import sudoku  # noqa: F401
