"""FrozenLake's tile codes and moves, shared by the env and its host-side solver.

Gymnasium's ``FrozenLake-v1`` action order (Left, Down, Right, Up; RAGEN
numbers them 1..4 in the same order).
"""

# Tile codes of ``FrozenLakeState.tiles``.
FROZEN = 0
HOLE = 1
GOAL = 2

# Actions, gymnasium's order.
LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
DELTAS = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (d_row, d_col) per action
