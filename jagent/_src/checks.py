"""The one check of an int-valued setting, for jagent and experiments (private).

Every config dataclass, function argument and command-line flag that must be
an int goes through :func:`check_int`, so they accept the same values (a
Python or numpy int; never a bool, a float or a string) and word their
errors the same way. It runs on Python values only, before any tracing.
"""

from __future__ import annotations

import numbers
from typing import Any

from jagent._src.errors import FieldError


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None, *,
              why: str | None = None, error: type[Exception] = ValueError,
              owner: str | None = None) -> int:
  """Returns ``value`` as a Python int after checking it is an int in range.

  Args:
    name: how the error names the setting, e.g. ``"RolloutConfig.max_turns"``
      or ``"--repeats"``.
    value: the value to check: an int (``numbers.Integral``), not a bool.
    minimum: the smallest value allowed.
    maximum: the largest value allowed, or None for no bound.
    why: the error's reason; default ``"must be an int >= {minimum}"`` (or
      ``"must be an int in [{minimum}, {maximum}]"``).
    error: the exception class raised (e.g. ``experiments.fields.ConfigError``).
    owner: a config dataclass's name (e.g. ``"RolloutConfig"``) whose field
      ``name`` is: the error is then a :class:`jagent.FieldError` with that
      owner and field (same message), and ``error`` is not used.

  Returns:
    ``int(value)``.

  Raises:
    error: ``"{name}={value!r}: {why}"`` when ``value`` is not an int, is a
      bool, or lies outside ``[minimum, maximum]``.
    jagent.FieldError: the same, ``"{owner}.{name}={value!r}: {why}"``, when
      ``owner`` is given.
  """
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum or (maximum is not None and value > maximum)):
    if why is None:
      why = (f"must be an int >= {minimum}" if maximum is None
             else f"must be an int in [{minimum}, {maximum}]")
    if owner is not None:
      raise FieldError(owner, name, value, why)
    raise error(f"{name}={value!r}: {why}")
  return int(value)
