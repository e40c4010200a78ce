"""The reply parser: RAGEN's ``<think>..</think><answer>..</answer>`` format, on device.

:func:`parse_reply` turns a batch of reply byte buffers (the decoded sampled
tokens, see :func:`jagent.tokenizers.gather_bytes`) into env actions with
vectorized array operations only (shifted-window tag comparisons, reverse
cumulative minima for "next position with property X", the first K pieces by
``top_k``): no per-byte scan, static shapes, jittable and vmappable.
:func:`reference_parse` is the plain ``re``/``bytes`` version of the same
rules, written independently, which the tests compare against byte for byte.

The rules are RAGEN v1's (``ctx_manager._parse_response`` and the env
manager's action handling, https://github.com/RAGEN-AI/RAGEN), applied to bytes:

1. Generation is primed with ``<think>`` in the prompt, so in think mode the
   text searched is ``b"<think>" + reply`` with
   ``<think>(.*?)</think>\\s*<answer>(.*?)</answer>`` (DOTALL); in answer-only
   mode the reply itself with ``<answer>(.*?)</answer>``. No match: no actions.
2. The answer content is ``.strip()``-ed (ASCII whitespace), split on the
   separator (``"||"``), each piece stripped, empty pieces dropped, and the
   first ``max_actions_per_turn`` pieces kept (RAGEN truncates before
   validating).
3. Discrete envs: a kept piece is valid iff it equals an action name ignoring
   ASCII case; valid pieces map to action indices in order, invalid ones are
   dropped. The turn is format-valid iff the reply matched, at least one
   action is valid and none is invalid (otherwise RAGEN adds its -0.1 format
   penalty once for the turn).
4. Free-text envs (no action names, e.g. Countdown): the action is the whole
   stripped answer content (no splitting), truncated to ``max_answer_bytes``
   and zero padded; format-valid iff matched and non-empty.
"""

from __future__ import annotations

import dataclasses
import re

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jagent import tokenizers
from jagent._src import checks

_THINK_PREFIX = b"<think>"
_CLOSE_THINK = b"</think>"
_OPEN_ANSWER = b"<answer>"
_CLOSE_ANSWER = b"</answer>"
_WHITESPACE = b" \t\n\r\x0b\x0c"  # Python's bytes.strip() set == regex \s on bytes.


@dataclasses.dataclass(frozen=True)
class ParseSpec:
  """Static configuration of the reply parser (hashable: a jit static argument).

  Attributes:
    action_names: the env's discrete action names, index = action id (e.g.
      Sokoban's ``("Up", "Down", "Left", "Right")``); empty for free-text envs
      (Countdown), whose action is the answer text. Matching ignores ASCII case.
    think: True: the reply must be ``...</think> <answer>...</answer>``
      (``<think>`` is already in the prompt); False: only
      ``<answer>...</answer>`` is searched.
    max_actions_per_turn: K, non-empty pieces kept per reply (RAGEN v1: 5,
      RAGEN-2: 2); later pieces are ignored, not counted as invalid.
    separator: the string that separates actions inside the answer (UTF-8).
    max_answer_bytes: width of the ``answer`` buffer (Countdown: 128).

  Raises:
    ValueError: (in ``__post_init__``) an action name that is not a non-empty
      ASCII string, has leading/trailing whitespace, contains the separator
      (it could never match), or duplicates another ignoring case; a
      non-bool ``think``; ``max_actions_per_turn < 1``; an empty or non-str
      separator; ``max_answer_bytes < 1``.
  """

  action_names: tuple[str, ...]
  think: bool = True
  max_actions_per_turn: int = 5
  separator: str = "||"
  max_answer_bytes: int = 128

  def __post_init__(self):
    if isinstance(self.action_names, str) or not isinstance(self.action_names, (tuple, list)):
      raise ValueError(f"action_names must be a tuple of str, got {self.action_names!r}")
    object.__setattr__(self, "action_names", tuple(self.action_names))
    if not isinstance(self.separator, str) or not self.separator:
      raise ValueError(f"separator must be a non-empty str, got {self.separator!r}")
    seen = {}
    for name in self.action_names:
      if not isinstance(name, str) or not name or not name.isascii():
        raise ValueError(f"action_names: {name!r} is not a non-empty ASCII str")
      if name != name.strip(_WHITESPACE.decode()):
        raise ValueError(f"action_names: {name!r} has leading/trailing whitespace "
                         "(pieces are stripped, it could never match)")
      if self.separator in name:
        raise ValueError(f"action_names: {name!r} contains the separator "
                         f"{self.separator!r} (it could never match)")
      if name.lower() in seen:
        raise ValueError(f"action_names: {name!r} duplicates {seen[name.lower()]!r} "
                         "ignoring case")
      seen[name.lower()] = name
    if not isinstance(self.think, bool):
      raise ValueError(f"think must be a bool, got {self.think!r}")
    for field in ("max_actions_per_turn", "max_answer_bytes"):
      value = checks.check_int(field, getattr(self, field), 1, owner="ParseSpec")
      object.__setattr__(self, field, value)


@flax.struct.dataclass
class ParsedReply:
  """The parse of a batch of replies (leading axis B; unbatched input: none).

  K = ``spec.max_actions_per_turn``, Ma = ``spec.max_answer_bytes``.

  Attributes:
    matched: the format regex matched (RAGEN: otherwise no actions and a
      format penalty).
    actions: valid action indices in reply order, -1 padded. Always all -1
      for free-text specs (their action is ``answer``).
    num_actions: valid actions (discrete); for free text 1 iff the answer is
      non-empty (the one env step to take), else 0.
    num_pieces: kept non-empty pieces (<= K); for free text (no splitting) 1
      iff the answer is non-empty.
    num_invalid: kept pieces that name no action (discrete); 0 for free text.
    format_valid: discrete: ``matched & num_actions > 0 & num_invalid == 0``;
      free text: ``matched & answer non-empty``. RAGEN adds the -0.1 format
      penalty when this is False.
    answer: the stripped answer content (both kinds), truncated to Ma bytes,
      zero padded (the Countdown env's action buffer). Zeros when unmatched.
    answer_length: bytes of ``answer`` in use, ``min(len(content), Ma)``.
  """

  matched: jax.Array  # shape=[B], dtype=bool
  actions: jax.Array  # shape=[B, K], dtype=int32
  num_actions: jax.Array  # shape=[B], dtype=int32
  num_pieces: jax.Array  # shape=[B], dtype=int32
  num_invalid: jax.Array  # shape=[B], dtype=int32
  format_valid: jax.Array  # shape=[B], dtype=bool
  answer: jax.Array  # shape=[B, Ma], dtype=uint8
  answer_length: jax.Array  # shape=[B], dtype=int32


# ----------------------------------------------------------------------------
# Host reference.


def reference_parse(reply: bytes, spec: ParseSpec) -> dict:
  """The parse of one reply with Python's ``re`` and ``bytes`` (the test oracle).

  Written directly from the rules in this module's docstring (RAGEN v1's
  regex, ``strip``, ``split``, truncation and case-insensitive lookup), with
  no code shared with :func:`parse_reply`.

  Args:
    reply: the reply bytes (without the ``<think>`` that primed generation).
    spec: the parse configuration.

  Returns:
    A dict with the fields of :class:`ParsedReply` as Python values:
    ``matched`` (bool), ``actions`` (list of int, unpadded), ``num_actions``,
    ``num_pieces``, ``num_invalid`` (int), ``format_valid`` (bool),
    ``answer`` (bytes, truncated, unpadded), ``answer_length`` (int).
  """
  if spec.think:
    m = re.search(rb"<think>(.*?)</think>\s*<answer>(.*?)</answer>", b"<think>" + reply,
                  re.DOTALL)
  else:
    m = re.search(rb"<answer>(.*?)</answer>", reply, re.DOTALL)
  content = m.groups()[-1].strip() if m else b""
  answer = content[:spec.max_answer_bytes]
  actions, num_pieces, num_invalid = [], 0, 0
  if m and spec.action_names:
    pieces = [p.strip() for p in content.split(spec.separator.encode())]
    pieces = [p for p in pieces if p][:spec.max_actions_per_turn]
    lookup = {name.lower().encode(): i for i, name in enumerate(spec.action_names)}
    num_pieces = len(pieces)
    for p in pieces:
      if p.lower() in lookup:
        actions.append(lookup[p.lower()])
      else:
        num_invalid += 1
    format_valid = bool(actions) and num_invalid == 0
    num_actions = len(actions)
  else:
    format_valid = bool(m) and len(content) > 0
    num_actions = num_pieces = int(format_valid)
  return dict(matched=m is not None, actions=actions, num_actions=num_actions,
              num_pieces=num_pieces, num_invalid=num_invalid, format_valid=format_valid,
              answer=answer, answer_length=len(answer))


# ----------------------------------------------------------------------------
# Device parser. Every function here works on [B, N] arrays; "none" positions are N.


def _take(x, i, fill):
  """x[b, i[b, ...]] along axis 1, ``fill`` where i is outside [0, N)."""
  n = x.shape[1]
  squeeze = i.ndim == 1
  if squeeze:
    i = i[:, None]
  out = jnp.take_along_axis(x, jnp.clip(i, 0, n - 1), axis=1)
  out = jnp.where((i >= 0) & (i < n), out, jnp.asarray(fill, x.dtype))
  return out[:, 0] if squeeze else out


def _shift_left(x, k: int, fill):
  """x[b, i + k] along axis 1, ``fill`` past the end (a static shift, no gather)."""
  return jnp.pad(x[:, k:], ((0, 0), (0, k)), constant_values=fill)


def _next_true(mask):
  """int32 [B, N]: the smallest j >= i with mask[b, j], else N.

  (``lax.associative_scan`` directly: on CPU ``lax.cummin`` / ``cummax`` /
  ``cumsum`` lower to a windowed reduction that is several times slower.)
  """
  n = mask.shape[1]
  idx = jnp.arange(n, dtype=jnp.int32)[None, :]
  return jax.lax.associative_scan(jnp.minimum, jnp.where(mask, idx, n), reverse=True, axis=1)


def _prev_true(mask):
  """int32 [B, N]: the largest j <= i with mask[b, j], else -1."""
  idx = jnp.arange(mask.shape[1], dtype=jnp.int32)[None, :]
  return jax.lax.associative_scan(jnp.maximum, jnp.where(mask, idx, -1), axis=1)


def _window_eq(text, length, pattern: bytes):
  """bool [B, N]: ``text[b, i:i+P] == pattern`` and the window ends by length[b]."""
  b, n = text.shape
  p = len(pattern)
  padded = jnp.pad(text, ((0, 0), (0, p)))
  ok = jnp.arange(n, dtype=jnp.int32)[None, :] + p <= length[:, None]
  for k, c in enumerate(pattern):
    ok = ok & (padded[:, k:k + n] == c)
  return ok


def _has_border(s: bytes) -> bool:
  """Whether occurrences of ``s`` can overlap (a proper prefix is also a suffix)."""
  return any(s[:k] == s[-k:] for k in range(1, len(s)))


def _select_separators(text, cand, start, sep: bytes):
  """bool [B, N]: the candidates ``bytes.split`` uses (left to right, no overlaps).

  ``cand`` marks every separator occurrence inside the content, which starts
  at ``start`` [B]. Three exact formulations, chosen statically:
  no self-overlap -> all candidates; a run of one byte (``"||"``) -> within a
  run of that byte starting at r, the candidates at r, r+L, r+2L, ...;
  otherwise -> follow ``next candidate at or after x + L`` from the first
  candidate with binary lifting (log2(N / L) gathers).
  """
  b, n = cand.shape
  ell = len(sep)
  idx = jnp.arange(n, dtype=jnp.int32)[None, :]
  if not _has_border(sep):
    return cand
  if len(set(sep)) == 1:
    other = (text != sep[0]) | (idx < start[:, None])
    run_start = _prev_true(other) + 1
    return cand & ((idx - run_start) % ell == 0)
  nxt = _next_true(cand)  # [B, N]
  nxt = jnp.concatenate([nxt, jnp.full((b, 1), n, jnp.int32)], axis=1)  # [B, N + 1]
  step = _shift_left(nxt, ell, n)  # g(x) = the next candidate >= x + L; g(N) = N.
  levels = [step]
  for _ in range(max(1, int(np.ceil(np.log2(n // ell + 2))))):
    levels.append(jnp.take_along_axis(levels[-1], levels[-1], axis=1))
  first = _take(nxt, start, n)  # [B]
  cur = jnp.broadcast_to(first[:, None], (b, n))
  for g in reversed(levels):
    jump = jnp.take_along_axis(g, cur, axis=1)
    cur = jnp.where(jump <= idx, jump, cur)
  return cand & (cur == idx)


def _lower(x):
  return jnp.where((x >= ord("A")) & (x <= ord("Z")), x + 32, x)


def _first_k(mask, k):
  """int32 [B, k]: the k smallest positions where mask is True, ascending, N padded.

  ``lax.top_k`` on float keys (exact below 2**24; much faster on CPU than on
  integer keys).
  """
  n = mask.shape[1]
  idx = jnp.arange(n, dtype=jnp.int32)[None, :]
  keys = jnp.where(mask, -idx, -n).astype(jnp.float32)
  if k > n:
    keys = jnp.pad(keys, ((0, 0), (0, k - n)), constant_values=-n)
  return (-jax.lax.top_k(keys, k)[0]).astype(jnp.int32)


def _parse_2d(reply, num_bytes, spec: ParseSpec) -> ParsedReply:
  b, m = reply.shape
  num_bytes = jnp.clip(num_bytes.astype(jnp.int32), 0, m)
  if spec.think:
    prefix = jnp.broadcast_to(jnp.frombuffer(_THINK_PREFIX, np.uint8), (b, len(_THINK_PREFIX)))
    text = jnp.concatenate([prefix, reply], axis=1)
    length = num_bytes + len(_THINK_PREFIX)
  else:
    text, length = reply, num_bytes
  n = text.shape[1]
  idx = jnp.arange(n, dtype=jnp.int32)[None, :]
  in_text = idx < length[:, None]
  text = jnp.where(in_text, text, 0)
  ws = in_text & ((text == ord(" ")) | ((text >= ord("\t")) & (text <= ord("\r"))))
  open_answer = _window_eq(text, length, _OPEN_ANSWER)
  close_answer = _window_eq(text, length, _CLOSE_ANSWER)

  # The start of the answer content, a [B]; the first </answer> at or after it, e.
  if spec.think:
    # The first </think> followed by whitespace then <answer>; the regex's
    # lazy groups take the first such and then the first </answer> after it
    # (later </think>s only have fewer </answer>s after them).
    next_nonws = _next_true(~ws)  # positions >= length count as non-whitespace
    after = _shift_left(next_nonws, len(_CLOSE_THINK), n)
    hits = _window_eq(text, length, _CLOSE_THINK) & _take(open_answer, after, False)
    p = jnp.min(jnp.where(hits, idx, n), axis=1)
    a = _take(next_nonws, p + len(_CLOSE_THINK), n) + len(_OPEN_ANSWER)
  else:
    p = jnp.min(jnp.where(open_answer, idx, n), axis=1)
    a = p + len(_OPEN_ANSWER)
  e = jnp.min(jnp.where(close_answer & (idx >= a[:, None]), idx, n), axis=1)
  matched = (p < n) & (e < n)

  # Strip the content: [cs, ce) in text coordinates, empty when unmatched.
  in_answer = (idx >= a[:, None]) & (idx < e[:, None]) & ~ws
  cs = jnp.min(jnp.where(in_answer, idx, n), axis=1)
  ce = jnp.max(jnp.where(in_answer, idx, -1), axis=1) + 1
  cs = jnp.where(matched & (ce > 0), cs, 0)
  ce = jnp.where(matched & (ce > 0), ce, 0)
  content_len = ce - cs

  ma = spec.max_answer_bytes
  answer_length = jnp.minimum(content_len, ma)
  k_idx = jnp.arange(ma, dtype=jnp.int32)[None, :]
  answer = _take(text, cs[:, None] + k_idx, 0)
  answer = jnp.where(k_idx < answer_length[:, None], answer, 0).astype(jnp.uint8)

  k = spec.max_actions_per_turn
  if not spec.action_names:
    nonempty = matched & (content_len > 0)
    one = nonempty.astype(jnp.int32)
    return ParsedReply(
        matched=matched, actions=jnp.full((b, k), -1, jnp.int32), num_actions=one,
        num_pieces=one, num_invalid=jnp.zeros((b,), jnp.int32), format_valid=nonempty,
        answer=answer, answer_length=answer_length)

  # Pieces. Each chosen separator (and the content start) opens a piece; the
  # piece is non-empty iff the next "event" (non-blank byte or separator
  # start) after its opener is a non-blank byte, which is then its first byte.
  in_content = (idx >= cs[:, None]) & (idx < ce[:, None])
  sep = spec.separator.encode()
  ell = len(sep)
  cand = _window_eq(text, ce, sep) & (idx >= cs[:, None])
  sel = _select_separators(text, cand, cs, sep)
  in_sep = sel
  for shift in range(1, ell):
    in_sep = in_sep | jnp.pad(sel, ((0, 0), (shift, 0)))[:, :n]
  nonblank = in_content & ~in_sep & ~ws
  next_event = _next_true(nonblank | sel)
  starts_after_sep = _shift_left(next_event, ell, n)  # [B, N]
  opens = sel & _take(nonblank, starts_after_sep, False)
  first_start = _take(next_event, cs, n)  # [B]
  first_open = _take(nonblank, first_start, False)
  later = _take(starts_after_sep, _first_k(opens, k), n)  # [B, K]
  starts = jnp.concatenate([jnp.where(first_open, first_start, n)[:, None], later], axis=1)
  starts = jnp.where(first_open[:, None], starts[:, :k], starts[:, 1:])  # first K pieces
  kept = starts < n

  # A kept piece is action i iff the name's bytes (case-folded) start it, no
  # separator starts inside them, and the next event after them is a
  # separator or nothing (the piece ends there once stripped).
  lmax = max(len(name) for name in spec.action_names)
  offs = jnp.arange(lmax, dtype=jnp.int32)[None, None, :]
  window = _take(_lower(text), (starts[:, :, None] + offs).reshape(b, -1), 0).reshape(b, k, lmax)
  sel_inside = _take(sel, (starts[:, :, None] + offs).reshape(b, -1), False).reshape(b, k, lmax)
  act = jnp.full((b, k), -1, jnp.int32)
  for i, name in enumerate(spec.action_names):
    low = jnp.frombuffer(name.lower().encode(), np.uint8)
    la = len(name)
    end = starts + la
    nxt = _take(next_event, end, n)
    hit = (kept & (end <= ce[:, None]) & jnp.all(window[:, :, :la] == low[None, None, :], axis=-1)
           & ~jnp.any(sel_inside[:, :, 1:la], axis=-1)
           & ((nxt >= n) | _take(sel, nxt, False)))
    act = jnp.where(hit, i, act)
  valid = act >= 0
  invalid = kept & ~valid
  # Compact the valid actions to the front, in order.
  slot = jnp.cumsum(valid, axis=1) - 1
  onehot = valid[:, :, None] & (slot[:, :, None] == jnp.arange(k)[None, None, :])  # [B, K, K]
  actions = jnp.where(jnp.any(onehot, axis=1),
                      jnp.sum(jnp.where(onehot, act[:, :, None], 0), axis=1), -1)
  num_actions = jnp.sum(valid, axis=1, dtype=jnp.int32)
  num_invalid = jnp.sum(invalid, axis=1, dtype=jnp.int32)
  return ParsedReply(
      matched=matched, actions=actions.astype(jnp.int32), num_actions=num_actions,
      num_pieces=jnp.sum(kept, axis=1, dtype=jnp.int32), num_invalid=num_invalid,
      format_valid=matched & (num_actions > 0) & (num_invalid == 0),
      answer=answer, answer_length=answer_length)


def parse_reply(reply: jax.Array, num_bytes: jax.Array, spec: ParseSpec) -> ParsedReply:
  """Parses replies into actions on device (RAGEN v1 rules, on bytes).

  See the module docstring for the rules; :func:`reference_parse` is the
  host oracle and agrees on every field. Pure jnp with static shapes, no
  Python control flow on traced values and no per-byte scan: tags are found
  by shifted-window comparisons, "next non-whitespace byte" and "next
  non-blank byte or separator" by reverse cumulative minima (an associative
  scan), the first K non-empty pieces by ``top_k`` over the separators, and
  each kept piece is compared with the action names on a gathered [B, K, L]
  window. A self-overlapping separator other than a run of one byte
  (``"||"`` is one) adds 2 log2(M) gathers. Jit with ``spec`` static
  (``jax.jit(parse_reply, static_argnames="spec")``); vmappable. Cost on 2
  CPU cores: ~15-25 ms for B=512, M=1024 (think mode, Sokoban).

  Args:
    reply: uint8 [B, M] (or [M]) reply bytes, e.g. from
      :func:`jagent.tokenizers.gather_bytes`.
    num_bytes: int [B] (or []) valid bytes per row, clipped to [0, M]; bytes at
      or past it are ignored.
    spec: the static parse configuration.

  Returns:
    A :class:`ParsedReply` with leading axis B (none for [M] input).

  Raises:
    ValueError: ``reply`` not uint8 of rank 1 or 2, or ``num_bytes`` not an
      integer array of shape ``reply.shape[:-1]`` (static checks).

  Examples:
    >>> import numpy as np
    >>> spec = ParseSpec(("Up", "Down", "Left", "Right"))
    >>> parse = jax.jit(parse_reply, static_argnames="spec")
    >>> reply = b"Box is left of me.</think> <answer>Up || left || jump</answer>"
    >>> out = parse(np.frombuffer(reply, np.uint8), np.int32(len(reply)), spec=spec)
    >>> out.actions.tolist(), int(out.num_invalid), bool(out.format_valid)
    ([0, 2, -1, -1, -1], 1, False)
    >>> reference_parse(reply, spec)["actions"]
    [0, 2]
  """
  if not isinstance(spec, ParseSpec):
    raise ValueError(f"spec must be a ParseSpec, got {type(spec).__name__}")
  reply = jnp.asarray(reply)
  num_bytes = jnp.asarray(num_bytes)
  if reply.dtype != jnp.uint8 or reply.ndim not in (1, 2):
    raise ValueError(f"reply must be uint8 [B, M] or [M], got {reply.dtype} {reply.shape}")
  if not jnp.issubdtype(num_bytes.dtype, jnp.integer) or num_bytes.shape != reply.shape[:-1]:
    raise ValueError(f"num_bytes must be an integer array of shape {reply.shape[:-1]}, "
                     f"got {num_bytes.dtype} {num_bytes.shape}")
  if reply.ndim == 1:
    out = _parse_2d(reply[None], num_bytes[None], spec)
    return jax.tree_util.tree_map(lambda x: x[0], out)
  return _parse_2d(reply, num_bytes, spec)


def parse_tokens(tokens: jax.Array, lengths: jax.Array, token_table: jax.Array,
                 table_lengths: jax.Array, spec: ParseSpec, max_bytes: int) -> ParsedReply:
  """``parse_reply(*gather_bytes(tokens, lengths, table, table_lengths, max_bytes), spec)``.

  Args:
    tokens: int32 [B, N] sampled reply token ids.
    lengths: int32 [B] valid tokens per row.
    token_table: uint8 [V, W] from :meth:`jagent.tokenizers.Tokenizer.token_bytes`.
    table_lengths: int32 [V].
    spec: the static parse configuration.
    max_bytes: M, the byte buffer width (static); reply bytes past it are
      dropped before parsing.

  Returns:
    A :class:`ParsedReply` with leading axis B.

  Raises:
    ValueError: as :func:`parse_reply`.
  """
  buf, n = tokenizers.gather_bytes(tokens, lengths, token_table, table_lengths, max_bytes)
  return parse_reply(buf, n, spec)


# ----------------------------------------------------------------------------
# The content of a reply without its format (RAGEN-2's Z, jagent.train.collapse_metrics).


def content_span(reply: jax.Array, num_bytes: jax.Array, *, think: bool
                 ) -> tuple[jax.Array, jax.Array]:
  """Byte span ``[start, end)`` of each reply's content, its format left out.

  RAGEN-2's reasoning Z (``docs/reference_mutual_information_metrics.md``,
  section 2): in think mode the text before the first ``</think>`` (the
  ``<think>`` that opens it is in the prompt), in answer-only mode the text
  inside the first ``<answer>`` and the first ``</answer>`` after it (RAGEN
  has no Z there; the answer is all the reply says beyond its tags). Either
  is ``.strip()``-ed (ASCII whitespace, as the parser strips answers). A
  reply without the closing tag has no content (RAGEN drops a reply whose
  reasoning regex does not match): ``(0, 0)``, as for a blank one.

  Args:
    reply: uint8 [B, M] reply bytes (:func:`jagent.tokenizers.gather_bytes`).
    num_bytes: int [B] valid bytes per row, clipped to [0, M].
    think: the reply format (``ParseSpec.think``), static.

  Returns:
    ``(start, end)``: int32 [B] byte offsets into ``reply``; ``start == end``
    when there is no content.
  """
  b, m = reply.shape
  length = jnp.clip(jnp.asarray(num_bytes, jnp.int32), 0, m)
  idx = jnp.arange(m, dtype=jnp.int32)[None, :]
  in_text = idx < length[:, None]
  text = jnp.where(in_text, reply, 0)
  ws = in_text & ((text == ord(" ")) | ((text >= ord("\t")) & (text <= ord("\r"))))
  if think:
    a = jnp.zeros((b,), jnp.int32)
    e = jnp.min(jnp.where(_window_eq(text, length, _CLOSE_THINK), idx, m), axis=1)
    matched = e < m
  else:
    p = jnp.min(jnp.where(_window_eq(text, length, _OPEN_ANSWER), idx, m), axis=1)
    a = p + len(_OPEN_ANSWER)
    close = _window_eq(text, length, _CLOSE_ANSWER) & (idx >= a[:, None])
    e = jnp.min(jnp.where(close, idx, m), axis=1)
    matched = (p < m) & (e < m)
  inside = (idx >= a[:, None]) & (idx < e[:, None]) & ~ws
  start = jnp.min(jnp.where(inside, idx, m), axis=1)
  end = jnp.max(jnp.where(inside, idx, -1), axis=1) + 1
  some = matched & (end > 0)
  return jnp.where(some, start, 0), jnp.where(some, end, 0)


def content_mask(tokens: jax.Array, lengths: jax.Array, token_table: jax.Array,
                 table_lengths: jax.Array, *, think: bool) -> jax.Array:
  """bool [B, N]: the reply tokens that carry the content of :func:`content_span`.

  A token belongs to the content iff its bytes overlap the content span, so
  the tags, the whitespace around them, the end-of-turn token and anything
  after the closing tag are left out. Tags that are tokens of their own (the
  tiny tokenizer's :data:`jagent.tokenizers.TINY_TAGS`) are left out
  exactly; a BPE token that merges a tag's last bytes with content (``">Up"``)
  counts as content, so no content byte is ever lost.

  Args:
    tokens: int32 [B, N] reply token ids (the first one right after the
      prompt).
    lengths: int [B] reply tokens per row.
    token_table: uint8 [V, W] from :meth:`jagent.tokenizers.Tokenizer.token_bytes`.
    table_lengths: int32 [V].
    think: the reply format (``ParseSpec.think``), static.

  Returns:
    bool [B, N], False past ``lengths``.
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  n = tokens.shape[1]
  valid = jnp.arange(n)[None, :] < jnp.asarray(lengths)[:, None]
  lens = jnp.where(valid, jnp.asarray(table_lengths)[tokens], 0)
  start = jnp.cumsum(lens, axis=1) - lens
  buf, nb = tokenizers.gather_bytes(tokens, lengths, jnp.asarray(token_table),
                                    jnp.asarray(table_lengths), n * token_table.shape[1])
  cs, ce = content_span(buf, nb, think=think)
  return valid & (lens > 0) & (start < ce[:, None]) & (start + lens > cs[:, None])
