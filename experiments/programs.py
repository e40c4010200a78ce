"""The jitted programs one process's runs share, and the config fields that key them.

Many runs of one config (``experiments.sweep``, the tests) differ only
where a program does not look (e.g. the seed: keys are arguments), so
:func:`shared_program` traces and compiles each program once, keyed by the
config fields it reads (:data:`ROLLOUT_FIELDS`, :data:`SFT_FIELDS`, or all
but the seed: ``experiments.experiment.Experiment.signature``, whose JSON
:func:`fields_json` writes).
"""

from __future__ import annotations

import collections
import json
from typing import Any, Callable

# Jitted programs shared by the Experiments of one process whose configs
# differ only where the program does not look (e.g. the seed: keys are
# arguments), so that many runs of one config (experiments.sweep, its tests)
# trace and compile each program once. Least recently used dropped past 16.
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_MAX_PROGRAMS = 16
# The config fields a rollout program depends on.
ROLLOUT_FIELDS = ("env", "tokenizer", "model", "model_dir", "lora", "prompt", "rollout",
                  "eval.num_groups")
# The config fields an SFT step program depends on (LoRA: the params' structure).
SFT_FIELDS = ("model", "model_dir", "lora", "sft")


def shared_program(key: tuple, build: Callable[[], Any]) -> Any:
  """The program cached under ``key`` (hashable), built by ``build()`` on a miss.

  Holds the 16 most recently used programs of this process; ``key`` must
  name everything the program closes over (e.g.
  :meth:`experiments.experiment.Experiment.signature`).
  """
  if key not in _PROGRAMS:
    _PROGRAMS[key] = build()
    while len(_PROGRAMS) > _MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  _PROGRAMS.move_to_end(key)
  return _PROGRAMS[key]


def fields_json(config, fields) -> str:
  """Sorted JSON of ``config``'s dotted ``fields``."""
  out = {}
  for f in fields:
    node = config
    for part in f.split("."):
      node = node[part]
    out[f] = node.to_dict() if hasattr(node, "to_dict") else node
  return json.dumps(out, sort_keys=True, default=repr)
