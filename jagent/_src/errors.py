"""The error of a bad field of a jagent config dataclass, as data."""

from __future__ import annotations

from typing import Any


class FieldError(ValueError):
  """A config dataclass's field holds a bad value.

  Raised by the checks of jagent's config dataclasses (``RolloutConfig``,
  ``PromptConfig``, ``TrainConfig``, ``OptimizerConfig``, ``ModelConfig``,
  ``LoraConfig``, ``FilterConfig``, ``SamplingConfig``) when they are built,
  before anything is traced. A program that fills a dataclass from its own
  settings can name its own setting from :attr:`owner` and :attr:`field`
  instead of parsing the message.

  Attributes:
    owner: the dataclass's name, e.g. ``"RolloutConfig"``.
    field: the field's name, e.g. ``"group_size"``.
    value: the bad value.
    why: what is wrong, e.g. ``"must be an int >= 1"``.
    advice: what to use instead (shown in parentheses), or None.
    show_value: False for a message that quotes the bad part of the value
      itself (``PromptConfig.first_turn uses {score}; ...``).

  The message is ``"<owner>.<field>=<value!r>: <why> (<advice>)"``, e.g.
  ``RolloutConfig.group_size=0: must be an int >= 1``, or
  ``"<owner>.<field> <why>"`` without ``show_value``.
  """

  def __init__(self, owner: str, field: str, value: Any, why: str,
               advice: str | None = None, *, show_value: bool = True):
    self.owner, self.field, self.value = owner, field, value
    self.why, self.advice, self.show_value = why, advice, show_value
    text = (f"{owner}.{field}={value!r}: {why}" if show_value else f"{owner}.{field} {why}")
    super().__init__(text + (f" ({advice})" if advice else ""))

  def __reduce__(self):  # keyword-only show_value: pickle by the constructor's arguments
    return (_rebuild, (self.owner, self.field, self.value, self.why, self.advice,
                       self.show_value))

  def reason(self) -> str:
    """``why`` with its advice, as the message ends: ``"must be > 0 (use greedy=True)"``."""
    return self.why + (f" ({self.advice})" if self.advice else "")


def _rebuild(owner, field, value, why, advice, show_value) -> FieldError:
  return FieldError(owner, field, value, why, advice, show_value=show_value)
