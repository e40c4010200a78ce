"""jagent: JAX-native, functional multi-turn RL for LLM agents.

Subpackages, each imported on first use (``import jagent`` alone stays cheap,
and ``import jagent.losses`` loads neither the models nor the tokenizers):

- ``jagent.losses``: pure RL objectives (advantages, policy and value losses).
- ``jagent.transforms``: optax-style composable objectives, named algorithms.
- ``jagent.models``: pure Qwen2 / Llama 3 policies, Hugging Face checkpoints,
  the sampler.
- ``jagent.tokenizers``: sentencepiece and tokenizer.json, on-device bytes.
- ``jagent.rollout``: the text layer over ``envs_jax`` and multi-turn rollouts.
- ``jagent.train``: train state, jitted train steps, checkpoints, metrics.
- ``jagent.sharding``: device meshes and sharded train / rollout steps.

``jagent.FieldError`` (a ValueError) is what the config dataclasses' checks
raise: the dataclass, field, value and reason as attributes.

Please don't use symbols in ``jagent._src``: they may change without notice.
"""

import importlib
import typing

from jagent._src.checks import check_int
from jagent._src.errors import FieldError
from jagent._src.types import Array
from jagent._src.types import ArrayLike
from jagent._src.types import PRNGKey
from jagent._src.types import PyTree
from jagent._src.types import SHAPE_LETTERS

if typing.TYPE_CHECKING:  # For static analysis; at run time see __getattr__.
  from jagent import losses
  from jagent import models
  from jagent import rollout
  from jagent import sharding
  from jagent import tokenizers
  from jagent import train
  from jagent import transforms

__version__ = "0.1.0.dev0"

_SUBPACKAGES = (
    "losses",
    "models",
    "rollout",
    "sharding",
    "tokenizers",
    "train",
    "transforms",
)

__all__ = (
    "Array",
    "ArrayLike",
    "FieldError",
    "PRNGKey",
    "PyTree",
    "SHAPE_LETTERS",
    "check_int",
) + _SUBPACKAGES


def __getattr__(name: str):
  """Imports the subpackage ``jagent.<name>`` on first access (PEP 562)."""
  if name in _SUBPACKAGES:
    # import_module binds the subpackage as an attribute of this module, so
    # later accesses do not come back here.
    return importlib.import_module(f"jagent.{name}")
  raise AttributeError(f"module 'jagent' has no attribute {name!r}")


def __dir__() -> list[str]:
  """The module's names, with the subpackages that are not imported yet."""
  return sorted(set(globals()) | set(__all__))
