"""The one check of an int-valued env or solver setting (private to envs_jax).

envs_jax does not depend on jagent, so it has its own; it accepts what
``jagent.check_int`` accepts (a Python or numpy int, never a bool), in the
wording of envs_jax's other errors (``"Owner: name must be ..., got value"``).
"""

from __future__ import annotations

import numbers
from typing import Any


def check_int(owner: str, name: str, value: Any, minimum: int,
              maximum: int | None = None) -> int:
  """Returns ``value`` as a Python int after checking it is an int in range.

  Args:
    owner: the class or function the setting belongs to, e.g. ``"Sokoban"``.
    name: the setting, e.g. ``"height"``.
    value: the value to check: an int (``numbers.Integral``), not a bool.
    minimum: the smallest value allowed.
    maximum: the largest value allowed, or None for no bound.

  Returns:
    ``int(value)``.

  Raises:
    ValueError: ``"{owner}: {name} must be an int >= {minimum}, got {value!r}"``
      (or ``"... an int in [{minimum}, {maximum}] ..."``) when ``value`` is not
      an int, is a bool, or lies outside the range.
  """
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum or (maximum is not None and value > maximum)):
    bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    raise ValueError(f"{owner}: {name} must be an int {bound}, got {value!r}")
  return int(value)
