"""The 2x2 cube's faces, colours, actions and move permutations.

Shared by :class:`~envs_jax._src.rubiks_cube.RubiksCube` (device steps) and
its host-side solver. Layout of the 24 stickers: see the env's module
docstring. Moves are derived from the geometry: a quarter turn rotates the
stickers of one layer by 90 degrees about the face's axis, clockwise as seen
looking at that face.
"""

from __future__ import annotations

import numpy as np

# Faces in RAGEN's sticker order, and the colour letter of each (solved) face.
FACES = ("Up", "Left", "Front", "Right", "Back", "Down")
COLORS = ("W", "O", "G", "R", "B", "Y")
# Actions 0..11 (RAGEN numbers them 1..12 in this order); X' = X inverse.
ACTION_NAMES = ("U", "U'", "D", "D'", "L", "L'", "R", "R'", "F", "F'", "B", "B'")

# (outward normal, row direction top->bottom, column direction left->right)
# of each face in FACES order, in x = Right, y = Up, z = Front coordinates.
_AXES = np.eye(3, dtype=np.int64)
_X, _Y, _Z = _AXES
_FACE_FRAMES = ((_Y, _Z, _X), (-_X, -_Y, _Z), (_Z, -_Y, _X),
                (_X, -_Y, -_Z), (-_Z, -_Y, -_X), (-_Y, -_Z, _X))


def _sticker_geometry() -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """(cubie position in {-1, 1}^3, outward normal) of each of the 24 stickers."""
  out = []
  for normal, down, right in _FACE_FRAMES:
    for row in (-1, 1):
      for col in (-1, 1):
        out.append((tuple(normal + row * down + col * right), tuple(normal)))
  return out


def _quarter_turn(face: int) -> np.ndarray:
  """Gather indices of a clockwise quarter turn of ``face``: new = old[src]."""
  geometry = _sticker_geometry()
  index = {g: i for i, g in enumerate(geometry)}
  n = _FACE_FRAMES[face][0]
  # Clockwise seen from outside = -90 degrees about n: v -> n (n.v) - n x v.
  rot = lambda v: tuple(n * (n @ v) - np.cross(n, v))
  src = np.arange(24)
  for i, (pos, normal) in enumerate(geometry):
    pos, normal = np.asarray(pos), np.asarray(normal)
    if pos @ n > 0:  # the stickers of the turning layer
      src[index[(rot(pos), rot(normal))]] = i
  return src


def _moves() -> np.ndarray:
  """int32 [12, 24] gather indices of the 12 actions (ACTION_NAMES order)."""
  out = []
  for name in ACTION_NAMES[::2]:
    cw = _quarter_turn(FACES.index({"U": "Up", "D": "Down", "L": "Left", "R": "Right",
                                    "F": "Front", "B": "Back"}[name]))
    out += [cw, cw[cw[cw]]]  # X, then X' = X applied three times
  return np.stack(out).astype(np.int32)


MOVES = _moves()  # int32 [12, 24]: after action a, stickers = stickers[MOVES[a]]
SOLVED = np.repeat(np.arange(6, dtype=np.int8), 4)  # int8 [24]
