"""On-device parser of Sudoku moves: RAGEN-2's ``SudokuEnv.parse_action`` on bytes.

RAGEN lowercases the answer and tries six patterns in order, each with
``re.search`` (the leftmost match), keeping the first pattern that matches::

    place N at row R col C      place N at (R,C)      place N at R,C
    N at R,C                    (R,C,N)               R,C,N

(``\\s+`` between words, ``\\s*`` after commas, numbers ``\\d+``.) The three
numbers are read as (N, R, C) when the text contains ``"place"`` or ``"at"``
anywhere (so ``"that is 2,3,5"`` places 2 at row 3 col 5), else as (R, C, N).
Then R, C and N are checked against ``1..n`` in that order.

Here the same on a zero-padded uint8 buffer with fixed shapes, on tokens: a
run of digits, a run of whitespace, a comma with the whitespace after it, or
any other single character. Every pattern is a fixed sequence of tokens (no
pattern needs backtracking: each piece's characters differ from the first
character of the next piece, so ``\\d+`` and ``\\s+`` take whole runs; ``,\\s*``
is the comma token, and no other piece starts with whitespace), so all six
are matched at every token at once by compares at static offsets, and the
leftmost start of the first matching pattern wins (every match starts on a
token's first character). The text is cut into tokens by one running sum and
one scatter; no data-dependent lookups over all positions (they made the
former character-level matcher about 10x slower on CPU). Bytes from the
first NUL on are ignored. Differences from Python's ``str`` regexes: ``\\d``
and ``\\s`` are ASCII only (``re.ASCII`` on bytes), and a number with more
than 9 significant digits reads as 999,999,999 (it is out of range either
way; only the number shown in the feedback differs).
"""

from __future__ import annotations

import functools

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
_DIGITS, _SPACE = b"0", b" "  # token codes of a digit run / a whitespace run


def _tokens(patterns) -> tuple[tuple[bytes, tuple[int, int, int]], ...]:
  """Each pattern as token codes and the offsets of its three number tokens."""
  out = []
  for pattern in patterns:
    codes, numbers = b"", []
    assert pattern[0] not in (_WS, _WS0, ","), pattern  # matches start on a token
    for i, piece in enumerate(pattern):
      if piece == _D:
        numbers.append(len(codes))
        codes += _DIGITS
      elif piece == _WS:
        assert pattern[i - 1] != ",", pattern  # the comma token takes that whitespace
        codes += _SPACE
      elif piece == _WS0:
        assert pattern[i - 1] == ",", pattern  # part of the comma token
      else:
        assert piece != "," or pattern[i + 1] == _WS0, pattern
        codes += piece.encode()
    assert len(numbers) == 3, pattern
    out.append((codes, tuple(numbers)))
  return tuple(out)


_TOKEN_PATTERNS = _tokens(_PATTERNS)
assert len(_PATTERNS) <= 8  # one bit each in a uint8


def _shift(x: jax.Array, k: int) -> jax.Array:
  """``y[p] = x[p + k]`` for static ``k``, zeros shifted in (either end)."""
  if k == 0:
    return x
  if abs(k) >= x.shape[0]:
    return jnp.zeros_like(x)
  pad = jnp.zeros((abs(k),), x.dtype)
  return jnp.concatenate([x[k:], pad] if k > 0 else [pad, x[:k]])


def _first(mask: jax.Array) -> jax.Array:
  """int32: the first index where ``mask`` (last axis) is True, its length if none.

  A min-reduction: XLA:CPU runs it several times faster than an argmax.
  """
  idx = jnp.arange(mask.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(mask, idx, mask.shape[-1]), axis=-1)


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
  text = jnp.concatenate([answer, jnp.zeros((1,), jnp.uint8)])  # a NUL sentinel
  size = text.shape[0]
  idx = jnp.arange(size, dtype=jnp.int32)
  text = jnp.where(idx < _first(text == 0), text, 0)  # nothing from the first NUL on
  text = jnp.where((text >= ord("A")) & (text <= ord("Z")), text + 32, text)  # ASCII lowercase
  ws = functools.reduce(jnp.logical_or, [text == c for c in _WHITESPACE])
  digit = (text >= ord("0")) & (text <= ord("9"))

  # Tokens: a character continues the token before it if both are digits, or
  # if it is whitespace after whitespace or after a comma.
  joins = (digit & _shift(digit, -1)) | (ws & _shift(ws | (text == ord(",")), -1))
  opens = ~joins  # a token's first character (position 0 always)
  small = size <= 256  # positions and counts fit in a byte
  count = opens.astype(jnp.uint8 if small else jnp.int32)
  w = 1
  while w < size:  # running sum by doubling: count[p] = tokens opened up to p
    count = count + _shift(count, -w)
    w *= 2
  # Each token's code and first position, packed, scattered to its index.
  code = jnp.where(digit, _DIGITS[0], jnp.where(ws, _SPACE[0], text))
  packed_type, bits = (jnp.uint16, 8) if small else (jnp.int32, 16)
  packed = code.astype(packed_type) << bits | idx.astype(packed_type)
  slot = jnp.where(opens, count.astype(jnp.int32) - 1, size)  # past the end: dropped
  packed = jnp.zeros((size,), packed_type).at[slot].set(packed, mode="drop",
                                                        unique_indices=True)
  token = (packed >> bits).astype(jnp.uint8)  # NUL after the last token
  token_start = (packed & ((1 << bits) - 1)).astype(jnp.int32)

  # Bit i of hit[t]: pattern i matches from token t.
  hit = functools.reduce(jnp.bitwise_or, [
      jnp.where(functools.reduce(jnp.logical_and, [_shift(token, k) == c
                                                   for k, c in enumerate(codes)]),
                jnp.uint8(1 << i), jnp.uint8(0))
      for i, (codes, _) in enumerate(_TOKEN_PATTERNS)])
  found = jax.lax.reduce(hit, jnp.uint8(0), jax.lax.bitwise_or, (0,))  # patterns found anywhere
  which = jnp.argmax((found >> jnp.arange(len(_PATTERNS), dtype=jnp.uint8)) & 1)  # the first
  start = _first(((hit >> which.astype(jnp.uint8)) & 1) == 1)  # its leftmost

  # The winner's numbers: each from its token's start to the next token's, leading
  # zeros skipped, saturating past 9 significant digits.
  offsets = jnp.asarray([numbers for _, numbers in _TOKEN_PATTERNS], jnp.int32)[which]
  bounds = token_start[jnp.minimum(start + jnp.concatenate([offsets, offsets + 1]), size - 1)]
  begin, stop = bounds[:3], bounds[3:]
  first = _first((idx[None, :] >= begin[:, None]) & (text != ord("0"))[None, :])  # <= stop
  length = stop - first
  k = jnp.arange(9, dtype=jnp.int32)[None, :]
  d = jnp.where(k < length[:, None],
                text[jnp.minimum(first[:, None] + k, size - 1)].astype(jnp.int32) - ord("0"), 0)
  power = 10 ** jnp.maximum(length[:, None] - 1 - k, 0)
  value = jnp.sum(jnp.where(k < length[:, None], d * power, 0), axis=1)
  numbers = jnp.where(length <= 9, value, MAX_VALUE)

  def contains(word):
    return jnp.any(functools.reduce(jnp.logical_and, [_shift(text, i) == ch
                                                      for i, ch in enumerate(word.encode())]))

  named = contains("place") | contains("at")
  rcn = jnp.where(named, numbers[jnp.asarray([1, 2, 0])], numbers)
  bad = (rcn < 1) | (rcn > n)
  any_found = found != 0
  kind = jnp.where(~any_found, UNPARSED,
                   jnp.where(bad[0], BAD_ROW, jnp.where(bad[1], BAD_COL,
                                                        jnp.where(bad[2], BAD_NUM, OK))))
  return kind.astype(jnp.int32), jnp.where(any_found, rcn, 0).astype(jnp.int32)
