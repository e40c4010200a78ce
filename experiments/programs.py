"""The jitted programs one process's runs share.

Many runs of one config (``experiments.sweep``, the tests) differ only
where a program does not look (e.g. the seed: keys are arguments), so
:func:`shared_program` traces and compiles each program once, keyed by what
it reads of the run's spec (:attr:`experiments.stages.Stages.keys`,
:attr:`experiments.stages.Stages.rollout_key`: the spec's hashable
dataclasses, e.g. the ModelConfig and RolloutConfig).
"""

from __future__ import annotations

import collections
from typing import Any, Callable

# Least recently used dropped past 16.
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_MAX_PROGRAMS = 16


def shared_program(key: tuple, build: Callable[[], Any]) -> Any:
  """The program cached under ``key`` (hashable), built by ``build()`` on a miss.

  Holds the 16 most recently used programs of this process; ``key`` must
  name everything the program closes over (e.g.
  :attr:`experiments.stages.Stages.keys`).

  Raises:
    TypeError: ``key`` is not hashable.
  """
  if key not in _PROGRAMS:
    _PROGRAMS[key] = build()
    while len(_PROGRAMS) > _MAX_PROGRAMS:
      _PROGRAMS.popitem(last=False)
  _PROGRAMS.move_to_end(key)
  return _PROGRAMS[key]
