"""Shared type aliases and the one shape-letter table used across jagent.

Shape letters (used in docstrings, ``chex.assert_shape`` calls, einsum strings
and name suffixes such as ``logits_btv``):

======  =====================================================================
Letter  Meaning
======  =====================================================================
B       batch: independent rows (trajectories, environments) processed together
G       group: rollouts that share one initial state (GRPO / StarPO groups)
T       time: tokens of a trajectory, or steps/turns where stated
S       sequence: the full padded context length of a trajectory (S >= T)
H       heads: attention heads (``K`` for key/value heads under GQA)
D       dims: model width; ``Dh`` per-head width
V       vocab: tokenizer vocabulary size
L       layers: transformer layers (in parameter and KV-cache shapes)
A       actions: discrete actions of an environment
======  =====================================================================

So a batch of ``B = num_groups * G`` trajectories has token arrays of shape
``[B, S]``; per-group statistics have shape ``[B // G]``; logits ``[B, T, V]``.
"""

from __future__ import annotations

from typing import Any

import jax

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
PRNGKey = jax.Array
PyTree = Any

SHAPE_LETTERS: dict[str, str] = {
    "B": "batch",
    "G": "group",
    "T": "time (tokens, steps or turns)",
    "S": "sequence (padded context length)",
    "H": "heads",
    "D": "dims",
    "V": "vocab",
    "L": "layers",
    "A": "actions",
    "R": "token rows of a trajectory (B, or B * T with a bounded history)",
}
