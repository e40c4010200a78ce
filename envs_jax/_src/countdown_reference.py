"""Plain-Python reference for Countdown: reward, expression evaluator, solver.

Host-only and independent of the on-device code in ``countdown.py`` (a
recursive-descent parser over exact ``fractions.Fraction`` values, where the
device runs a bounded shift-reduce loop over int32 numerator/denominator
pairs). The tests compare the two on many generated and fuzzed answers; this
module is also usable directly as a host-side reward.

Answer semantics (the same in both implementations; see
:class:`envs_jax.Countdown` for the discussion of RAGEN's behaviour):

* The answer is a byte string (the text inside ``<answer>...</answer>``,
  already extracted). Bytes from the first NUL (0) on are ignored.
* Numbers used: every maximal run of ASCII digits ``0-9`` anywhere in the
  answer, read as a decimal integer (``"07"`` reads 7), whatever surrounds
  it. They must equal the instance's numbers as a multiset (RAGEN:
  ``sorted(int(n) for n in re.findall(r"\\d+", answer)) == sorted(nums)``).
* Expression grammar (Python 3's arithmetic grammar restricted to these
  tokens, whitespace = space, tab, LF, VT, FF, CR between tokens)::

      sum     := product (("+" | "-") product)*
      product := signed (("*" | "/") signed)*
      signed  := ("+" | "-") signed | atom
      atom    := literal | "(" sum ")"
      literal := "0"+ | [1-9][0-9]*

  Anything else (other bytes, ``**``, ``//``, ``.``, ``=``, empty parentheses,
  implicit multiplication ``2(3)``, adjacent literals ``1 2``, a literal with
  a leading zero such as ``07``) makes the answer malformed. ``/`` is exact
  rational division; dividing by zero makes the answer not evaluate.
* Reward: ``reward_wrong_numbers`` (0) unless the numbers are right; then
  ``reward_correct`` (1) if the expression evaluates to ``v`` with
  ``|v - target| < 1 / inv_tolerance`` (exactly, on rationals), else
  ``reward_format`` (0.1).
"""

from __future__ import annotations

import fractions
import itertools
import re
import sys
from typing import NamedTuple, Sequence

import numpy as np

Fraction = fractions.Fraction

_WHITESPACE = b" \t\n\v\f\r"
_DIGITS = b"0123456789"
_DIGIT_RUN = re.compile(rb"[0-9]+")


class ReferenceResult(NamedTuple):
  """What :func:`reference_reward` found.

  Attributes:
    reward: float, the reward.
    numbers_ok: bool, the digit runs equal the numbers as a multiset.
    well_formed: bool, the answer matches the expression grammar.
    evaluates: bool, well formed and no division by zero.
    value: the exact value as a ``Fraction`` when ``evaluates``, else None.
    success: bool, ``numbers_ok`` and the value is within tolerance.
  """

  reward: float
  numbers_ok: bool
  well_formed: bool
  evaluates: bool
  value: Fraction | None
  success: bool


class _Malformed(Exception):
  """The answer does not match the grammar."""


def answer_bytes(answer: bytes | str | np.ndarray | Sequence[int]) -> bytes:
  """Normalises an answer to the bytes before its first NUL.

  Args:
    answer: ``bytes``; ``str`` (UTF-8 encoded); or a uint8 array / sequence of
      byte values such as the env's action buffer.

  Returns:
    The bytes up to (excluding) the first 0 byte.

  Raises:
    ValueError: if an array/sequence holds values outside [0, 255].
  """
  if isinstance(answer, str):
    data = answer.encode("utf-8")
  elif isinstance(answer, (bytes, bytearray)):
    data = bytes(answer)
  else:
    arr = np.asarray(answer).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() > 255):
      raise ValueError(f"answer byte values must be in [0, 255], got {answer!r}")
    data = bytes(arr.astype(np.uint8).tolist())
  nul = data.find(b"\x00")
  return data if nul < 0 else data[:nul]


def numbers_used(answer: bytes | str | np.ndarray) -> list[int]:
  """The integers of every maximal ASCII digit run, in order of appearance."""
  return [int(m) for m in _DIGIT_RUN.findall(answer_bytes(answer))]


def _tokenize(data: bytes) -> list[bytes]:
  """Splits ``data`` into literal / operator / parenthesis tokens.

  Raises:
    _Malformed: on a byte outside the grammar or a literal with a leading
      zero (as Python 3 rejects ``07``).
  """
  tokens = []
  pos = 0
  while pos < len(data):
    ch = data[pos:pos + 1]
    if ch[0] in _WHITESPACE:
      pos += 1
    elif ch[0] in _DIGITS:
      end = pos
      while end < len(data) and data[end] in _DIGITS:
        end += 1
      lit = data[pos:end]
      if len(lit) > 1 and lit[0:1] == b"0" and lit.strip(b"0"):
        raise _Malformed(f"leading zero in literal {lit!r}")
      tokens.append(lit)
      pos = end
    elif ch in (b"+", b"-", b"*", b"/", b"(", b")"):
      tokens.append(ch)
      pos += 1
    else:
      raise _Malformed(f"byte {ch!r} at {pos}")
  return tokens


class _Parser:
  """Recursive-descent evaluator of the grammar in the module docstring."""

  def __init__(self, tokens: list[bytes]):
    self.tokens = tokens
    self.pos = 0
    self.divided_by_zero = False

  def peek(self) -> bytes | None:
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def take(self) -> bytes:
    tok = self.peek()
    if tok is None:
      raise _Malformed("unexpected end")
    self.pos += 1
    return tok

  def parse(self) -> Fraction:
    value = self.sum()
    if self.peek() is not None:
      raise _Malformed(f"trailing token {self.peek()!r}")
    return value

  def sum(self) -> Fraction:
    value = self.product()
    while self.peek() in (b"+", b"-"):
      op = self.take()
      rhs = self.product()
      value = value + rhs if op == b"+" else value - rhs
    return value

  def product(self) -> Fraction:
    value = self.signed()
    while self.peek() in (b"*", b"/"):
      op = self.take()
      rhs = self.signed()
      if op == b"*":
        value = value * rhs
      elif rhs == 0:
        # Keep parsing (a malformed tail still makes the answer malformed).
        self.divided_by_zero = True
      else:
        value = value / rhs
    return value

  def signed(self) -> Fraction:
    # ("+" | "-")* atom, iteratively so long sign chains cost no recursion.
    negate = False
    while self.peek() in (b"+", b"-"):
      negate ^= self.take() == b"-"
    value = self.atom()
    return -value if negate else value

  def atom(self) -> Fraction:
    tok = self.take()
    if tok == b"(":
      value = self.sum()
      if self.take() != b")":
        raise _Malformed("expected ')'")
      return value
    if tok[0] in _DIGITS:
      return Fraction(int(tok))
    raise _Malformed(f"unexpected token {tok!r}")


def evaluate_expression(
    answer: bytes | str | np.ndarray,
) -> tuple[bool, Fraction | None]:
  """Parses and evaluates an answer exactly.

  Args:
    answer: the answer (see :func:`answer_bytes`).

  Returns:
    ``(well_formed, value)``: ``well_formed`` says whether the answer matches
    the grammar; ``value`` is the exact rational value, or None when the
    answer is malformed or divides by zero. Both may hold for inputs whose
    evaluation RAGEN's Python ``eval`` would also reject.
  """
  data = answer_bytes(answer)
  try:
    tokens = _tokenize(data)
  except _Malformed:
    return False, None
  # Each nesting level costs 4 Python frames; make room for deep nests.
  needed = 4 * len(tokens) + 200
  old_limit = sys.getrecursionlimit()
  if needed > old_limit:
    sys.setrecursionlimit(needed)
  try:
    parser = _Parser(tokens)
    try:
      value = parser.parse()
    except _Malformed:
      return False, None
    return True, None if parser.divided_by_zero else value
  finally:
    if needed > old_limit:
      sys.setrecursionlimit(old_limit)


def reference_reward(
    answer: bytes | str | np.ndarray,
    numbers: Sequence[int],
    target: int,
    *,
    reward_correct: float = 1.0,
    reward_format: float = 0.1,
    reward_wrong_numbers: float = 0.0,
    inv_tolerance: int = 100_000,
) -> ReferenceResult:
  """Countdown reward of one answer, computed on the host.

  Implements RAGEN's Countdown reward (``ragen/env/countdown/env.py``): 0 if
  the numbers used are not exactly ``numbers`` (as a multiset), 0.1 if they
  are but the expression is
  malformed, divides by zero or misses the target, 1.0 if it evaluates to
  within ``1 / inv_tolerance`` of ``target`` (strictly; exact rationals).
  Unlike TinyZero's ``compute_score`` (0.1 for wrong numbers too), wrong
  numbers score ``reward_wrong_numbers``.

  Args:
    answer: the answer bytes/text/array (see :func:`answer_bytes`).
    numbers: the instance's numbers (only the ``count`` real ones, no pad).
    target: the target integer.
    reward_correct: reward of a correct answer.
    reward_format: reward of right numbers but a wrong/invalid expression.
    reward_wrong_numbers: reward when the numbers are wrong or absent.
    inv_tolerance: the tolerance is ``1 / inv_tolerance``.

  Returns:
    A :class:`ReferenceResult`.

  Raises:
    ValueError: if ``inv_tolerance < 1``.
  """
  if int(inv_tolerance) < 1:
    raise ValueError(f"inv_tolerance must be >= 1, got {inv_tolerance!r}")
  numbers_ok = sorted(numbers_used(answer)) == sorted(int(n) for n in numbers)
  well_formed, value = evaluate_expression(answer)
  evaluates = value is not None
  close = evaluates and abs(value - int(target)) < Fraction(1, int(inv_tolerance))
  success = bool(numbers_ok and close)
  if not numbers_ok:
    reward = float(reward_wrong_numbers)
  elif success:
    reward = float(reward_correct)
  else:
    reward = float(reward_format)
  return ReferenceResult(reward, numbers_ok, well_formed, evaluates, value, success)


def solve(
    numbers: Sequence[int], target: int, *, plus_minus_only: bool = False
) -> str | None:
  """Brute-force Countdown solver: an answer using every number once, or None.

  Args:
    numbers: the numbers (3 or 4 in this env; any small count works).
    target: the target integer.
    plus_minus_only: if True, only expressions ``±n1 ± n2 ± ...`` (RAGEN's
      ``has_solution``, which also allows a leading minus); otherwise
      ``+ - * /`` over any binary tree with exact rational intermediates
      (division by zero excluded).

  Returns:
    A fully parenthesised answer string such that :func:`reference_reward`
    gives ``reward_correct``, or None if there is none.
  """
  nums = [int(n) for n in numbers]
  target = int(target)
  if plus_minus_only:
    for signs in itertools.product((1, -1), repeat=len(nums)):
      if sum(s * n for s, n in zip(signs, nums)) == target:
        parts = [("-" if signs[0] < 0 else "") + str(nums[0])]
        parts += [("- " if s < 0 else "+ ") + str(n) for s, n in zip(signs[1:], nums[1:])]
        return " ".join(parts)
    return None
  failed: set[tuple[Fraction, ...]] = set()

  def search(items: list[tuple[Fraction, str]]) -> str | None:
    if len(items) == 1:
      return items[0][1] if items[0][0] == target else None
    key = tuple(sorted(v for v, _ in items))
    if key in failed:
      return None
    for i, j in itertools.combinations(range(len(items)), 2):
      (a, ea), (b, eb) = items[i], items[j]
      rest = [items[k] for k in range(len(items)) if k not in (i, j)]
      options = [(a + b, f"({ea} + {eb})"), (a - b, f"({ea} - {eb})"),
                 (b - a, f"({eb} - {ea})"), (a * b, f"({ea} * {eb})")]
      if b != 0:
        options.append((a / b, f"({ea} / {eb})"))
      if a != 0:
        options.append((b / a, f"({eb} / {ea})"))
      for value, expr in options:
        found = search(rest + [(value, expr)])
        if found is not None:
          return found
    failed.add(key)
    return None

  return search([(Fraction(n), str(n)) for n in nums])
