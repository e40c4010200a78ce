"""On-device parser of Sudoku moves: RAGEN-2's ``SudokuEnv.parse_action`` on bytes.

RAGEN lowercases the answer and tries six patterns in order, each with
``re.search`` (the leftmost match), keeping the first pattern that matches::

    place N at row R col C      place N at (R,C)      place N at R,C
    N at R,C                    (R,C,N)               R,C,N

(``\\s+`` between words, ``\\s*`` after commas, numbers ``\\d+``.) The three
numbers are read as (N, R, C) when the text contains ``"place"`` or ``"at"``
anywhere (so ``"that is 2,3,5"`` places 2 at row 3 col 5), else as (R, C, N).
Then R, C and N are checked against ``1..n`` in that order.

Here the same on a zero-padded uint8 buffer with fixed shapes: every pattern
is matched at every start position at once (no pattern needs backtracking:
each piece's characters differ from the first character of the next piece),
and the leftmost start of the first matching pattern wins. Bytes from the
first NUL on are ignored. Differences from Python's ``str`` regexes: ``\\d``
and ``\\s`` are ASCII only (``re.ASCII`` on bytes), and a number with more
than 9 significant digits reads as 999,999,999 (it is out of range either
way; only the number shown in the feedback differs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Parse outcomes (``kind``): a move, or RAGEN's four format errors.
OK, UNPARSED, BAD_ROW, BAD_COL, BAD_NUM = range(5)
MAX_VALUE = 999_999_999
_D, _WS, _WS0 = "D", "WS+", "WS*"  # a number, one or more / any whitespace
_PATTERNS = (
    ("place", _WS, _D, _WS, "at", _WS, "row", _WS, _D, _WS, "col", _WS, _D),
    ("place", _WS, _D, _WS, "at", _WS, "(", _D, ",", _WS0, _D, ")"),
    ("place", _WS, _D, _WS, "at", _WS, _D, ",", _WS0, _D),
    (_D, _WS, "at", _WS, _D, ",", _WS0, _D),
    ("(", _D, ",", _WS0, _D, ",", _WS0, _D, ")"),
    (_D, ",", _WS0, _D, ",", _WS0, _D),
)
_WHITESPACE = b" \t\n\r\x0b\x0c"


def _next_false(flags: jax.Array) -> jax.Array:
  """int32 [L + 1]: for each position, the first position at or after it where ``flags`` is False."""
  idx = jnp.arange(flags.shape[0], dtype=jnp.int32)
  return jax.lax.cummin(jnp.where(flags, flags.shape[0] - 1, idx), reverse=True)


def _run_values(text: jax.Array, digit: jax.Array, run_end: jax.Array) -> jax.Array:
  """int32 [L + 1]: the value of the digit run from each position to its end (saturating)."""
  n = text.shape[0]
  first = jnp.minimum(_next_false(text == ord("0")), run_end)  # leading zeros skipped
  length = run_end - first
  k = jnp.arange(9, dtype=jnp.int32)[None, :]
  pos = jnp.minimum(first[:, None] + k, n - 1)
  d = jnp.where(k < length[:, None], text[pos] - ord("0"), 0)
  power = 10 ** jnp.maximum(length[:, None] - 1 - k, 0)
  value = jnp.sum(jnp.where(k < length[:, None], d * power, 0), axis=1)
  return jnp.where(digit & (length <= 9), value, jnp.where(digit, MAX_VALUE, 0))


def parse_move(answer: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
  """Parses one answer (module docstring).

  Args:
    answer: uint8 [L], the answer text, zero padded.
    n: static grid side (4 or 9).

  Returns:
    ``(kind, numbers)``: int32 scalar ``OK``, ``UNPARSED``, ``BAD_ROW``,
    ``BAD_COL`` or ``BAD_NUM``, and int32 [3] ``(R, C, N)`` as written
    (1-based; zeros when unparsed).

  Raises:
    ValueError: ``answer`` is not a uint8 vector.
  """
  answer = jnp.asarray(answer)
  if answer.ndim != 1 or answer.dtype != jnp.uint8:
    raise ValueError(f"parse_move: answer must be uint8 [L], got shape {answer.shape} dtype "
                     f"{answer.dtype}")
  b = answer.astype(jnp.int32)
  b = jnp.where(jnp.cumprod(b != 0) > 0, b, 0)
  b = jnp.where((b >= ord("A")) & (b <= ord("Z")), b + 32, b)  # ASCII lowercase
  text = jnp.concatenate([b, jnp.zeros((1,), jnp.int32)])  # a NUL sentinel
  size = text.shape[0]
  ws = jnp.isin(text, jnp.asarray(list(_WHITESPACE), jnp.int32))
  digit = (text >= ord("0")) & (text <= ord("9"))
  ws_end, run_end = _next_false(ws), _next_false(digit)
  value = _run_values(text, digit, run_end)

  def match(pattern):  # at every start position at once
    q = jnp.arange(size, dtype=jnp.int32)
    ok = jnp.ones((size,), jnp.bool_)
    nums = []
    for piece in pattern:
      if piece == _D:
        ok &= digit[q]
        nums.append(value[q])
        q = run_end[q]
      elif piece in (_WS, _WS0):
        if piece == _WS:
          ok &= ws[q]
        q = ws_end[q]
      else:
        for ch in piece.encode():
          ok &= text[jnp.minimum(q, size - 1)] == ch
          q = jnp.minimum(q + 1, size - 1)
    start = jnp.argmax(ok)
    return ok[start], jnp.stack([x[start] for x in nums])

  found, numbers = zip(*(match(p) for p in _PATTERNS))
  found, numbers = jnp.stack(found), jnp.stack(numbers)
  which = jnp.argmax(found)
  first = numbers[which]

  def contains(word):
    hit = jnp.ones((size - len(word) + 1,), jnp.bool_)
    for i, ch in enumerate(word.encode()):
      hit &= text[i:size - len(word) + 1 + i] == ch
    return jnp.any(hit)

  named = contains("place") | contains("at")
  rcn = jnp.where(named, first[jnp.asarray([1, 2, 0])], first)
  bad = (rcn < 1) | (rcn > n)
  kind = jnp.where(~jnp.any(found), UNPARSED,
                   jnp.where(bad[0], BAD_ROW, jnp.where(bad[1], BAD_COL,
                                                        jnp.where(bad[2], BAD_NUM, OK))))
  return kind.astype(jnp.int32), jnp.where(jnp.any(found), rcn, 0).astype(jnp.int32)
