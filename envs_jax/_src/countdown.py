"""Countdown (single turn) in pure JAX: generator, on-device reward, rendering.

The task (RAGEN's ``CountdownEnv``, data from TinyZero's
``Countdown-Tasks-3to4``): given 3 or 4 numbers and a target, write an
arithmetic expression that uses each number exactly once and equals the
target. One step: the action is the answer text as bytes, the reward is
computed on device, and the episode terminates.

Everything here is pure and jittable with fixed shapes and fixed trip counts:

* :func:`generate_instance` samples an instance whose target is reachable.
* :func:`countdown_reward` parses and evaluates the answer bytes with a
  bounded finite-state tokenizer and a bounded shift-reduce evaluator over
  exact int32 rationals.
* :class:`Countdown` is the environment (``Countdown-v0``).

The plain-Python reference of the same semantics is
``envs_jax._src.countdown_reference`` (host only; tests compare the two).
"""

from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from envs_jax._src import checks
from envs_jax._src import countdown_reference
from envs_jax._src import environment
from envs_jax._src import registration

MAX_NUMBERS = 4
"""Numbers per instance are padded to this length (3 or 4 are used)."""

MAX_INT32 = 2**31 - 1
"""Largest magnitude an evaluated numerator/denominator may take."""

MAX_GENERATED_TARGET = 1000
"""Largest |target| the generator accepts (keeps its int32 checks exact)."""

MAX_EXACT_NUMBER = 127
"""Largest instance number for which evaluation never overflows.

Any expression over ``k`` numbers of magnitude <= ``M`` has unreduced
numerators/denominators <= ``2**(k-1) * M**k`` (induction over the tree:
``a/b ± c/d = (ad ± cb)/bd``), which is < 2**31 for ``k = 4, M = 127``.
"""

# Byte classes of the tokenizer.
_SKIP, _NUM, _PLUS, _MINUS, _MUL, _DIV, _LPAR, _RPAR, _BAD, _END = range(10)
# Operator-stack codes (0 = empty slot).
_OP_ADD, _OP_SUB, _OP_MUL, _OP_DIV, _OP_NEG, _OP_POS, _OP_LPAR = range(1, 8)
_PRECEDENCE = np.array([0, 1, 1, 2, 2, 3, 3, 0], np.int32)  # by op code


def _byte_class_table() -> np.ndarray:
  table = np.full(256, _BAD, np.int32)
  for ch in b" \t\n\v\f\r":
    table[ch] = _SKIP
  for ch in b"0123456789":
    table[ch] = _NUM  # refined to _SKIP for digits that do not end a run
  table[ord("+")] = _PLUS
  table[ord("-")] = _MINUS
  table[ord("*")] = _MUL
  table[ord("/")] = _DIV
  table[ord("(")] = _LPAR
  table[ord(")")] = _RPAR
  table[0] = _END
  return table


_BYTE_CLASS = _byte_class_table()


@struct.dataclass
class CountdownParams:
  """Tunable parameters of :class:`Countdown` (a pytree; vmappable).

  Defaults follow RAGEN's ``ragen/env/countdown/env.py`` (rewards 0 / 0.1 / 1,
  tolerance 1e-5) and the Stream-of-Search generator behind TinyZero's
  ``Countdown-Tasks-3to4`` data (numbers in [1, 99], targets in [10, 100]).

  Attributes:
    reward_correct: reward of a correct answer.
    reward_format: reward when the numbers are right but the expression is
      malformed, does not evaluate, or misses the target (TinyZero's
      ``format_score``).
    reward_wrong_numbers: reward when the numbers used are not exactly the
      instance's numbers, including an empty answer.
    inv_tolerance: an answer is correct when ``|value - target| <
      1 / inv_tolerance`` (exact rational comparison; 100000 = RAGEN's 1e-5).
    min_number: smallest generated number (>= 1).
    max_number: largest generated number (<= ``MAX_EXACT_NUMBER`` = 127).
    min_target: smallest generated target.
    max_target: largest generated target.
    prob_four: probability that an instance has 4 numbers (else 3).
  """

  reward_correct: jax.Array = 1.0  # shape=(), dtype=float32
  reward_format: jax.Array = 0.1  # shape=(), dtype=float32
  reward_wrong_numbers: jax.Array = 0.0  # shape=(), dtype=float32
  inv_tolerance: jax.Array = 100_000  # shape=(), dtype=int32
  min_number: jax.Array = 1  # shape=(), dtype=int32
  max_number: jax.Array = 99  # shape=(), dtype=int32
  min_target: jax.Array = 10  # shape=(), dtype=int32
  max_target: jax.Array = 100  # shape=(), dtype=int32
  prob_four: jax.Array = 0.5  # shape=(), dtype=float32


def make_params(**overrides: Any) -> CountdownParams:
  """Builds :class:`CountdownParams` with typed leaves, validating them.

  Args:
    **overrides: field values replacing the defaults.

  Returns:
    A ``CountdownParams`` whose leaves are float32/int32 scalars.

  Raises:
    ValueError: naming an unknown field or a bad value (see
      :func:`check_params`).
  """
  fields = CountdownParams.__dataclass_fields__
  unknown = sorted(set(overrides) - set(fields))
  if unknown:
    raise ValueError(
        f"unknown CountdownParams field(s) {unknown}; fields: {sorted(fields)}")
  values = {name: overrides.get(name, f.default) for name, f in fields.items()}
  int_fields = ("inv_tolerance", "min_number", "max_number", "min_target",
                "max_target")
  typed = {}
  for name, value in values.items():
    dtype = jnp.int32 if name in int_fields else jnp.float32
    typed[name] = jnp.asarray(value, dtype)
  params = CountdownParams(**typed)
  check_params(params)
  return params


def check_params(params: CountdownParams) -> None:
  """Host-side validation of concrete params (skipped for traced leaves).

  Raises:
    ValueError: naming the bad value when a number/target range is empty or
      out of bounds (``1 <= min_number <= max_number <= 127``,
      ``-1000 <= min_target <= max_target <= 1000``), ``inv_tolerance < 1``, ``prob_four``
      outside [0, 1], or a leaf is not a scalar.
  """
  leaves = jax.tree.leaves(params)
  if any(isinstance(x, jax.core.Tracer) for x in leaves):
    return
  p = {k: np.asarray(getattr(params, k)) for k in params.__dataclass_fields__}
  for k, v in p.items():
    if v.shape != ():
      raise ValueError(
          f"CountdownParams.{k} must be a scalar (vmap over params for "
          f"batches), got shape {v.shape}")
  if not 1 <= p["min_number"] <= p["max_number"] <= MAX_EXACT_NUMBER:
    raise ValueError(
        f"need 1 <= min_number <= max_number <= {MAX_EXACT_NUMBER}, got "
        f"min_number={p['min_number']}, max_number={p['max_number']}")
  if not -MAX_GENERATED_TARGET <= p["min_target"] <= p["max_target"] <= MAX_GENERATED_TARGET:
    raise ValueError(
        f"need {-MAX_GENERATED_TARGET} <= min_target <= max_target <= "
        f"{MAX_GENERATED_TARGET}, got min_target={p['min_target']}, "
        f"max_target={p['max_target']}")
  if p["inv_tolerance"] < 1:
    raise ValueError(f"inv_tolerance must be >= 1, got {p['inv_tolerance']}")
  if not 0.0 <= p["prob_four"] <= 1.0:
    raise ValueError(f"prob_four must be in [0, 1], got {p['prob_four']}")


@struct.dataclass
class CountdownState:
  """State of :class:`Countdown`.

  Attributes:
    numbers: the numbers; entries at index >= ``count`` are 0 (padding).
    count: how many numbers are used, 3 or 4.
    target: the target.
    done: True after the (single) step.
  """

  numbers: jax.Array  # shape=(4,), dtype=int32
  count: jax.Array  # shape=(), dtype=int32
  target: jax.Array  # shape=(), dtype=int32
  done: jax.Array  # shape=(), dtype=bool


# --------------------------------------------------------------- generator
_TRIPLE_SPLITS = np.array([(0, 1, 2), (0, 2, 1), (1, 2, 0)], np.int32).T
_QUAD_SPLITS = np.array([(0, 1, 2, 3), (0, 2, 1, 3), (0, 3, 1, 2), (1, 2, 0, 3),
                         (1, 3, 0, 2), (2, 3, 0, 1)], np.int32).T


def _combine(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
  """All integer results of one operation on x and y: values, valid; [..., 6].

  x+y, x-y, y-x, x*y, x/y and y/x, the divisions valid only when exact.
  """
  x, y = jnp.broadcast_arrays(x, y)
  sx = jnp.where(x == 0, 1, x)
  sy = jnp.where(y == 0, 1, y)
  x_y, y_x = x // sy, y // sx
  values = jnp.stack([x + y, x - y, y - x, x * y, x_y, y_x], -1)
  true = jnp.ones_like(x, bool)
  valid = jnp.stack([true, true, true, true, (y != 0) & (x_y * sy == x),
                     (x != 0) & (y_x * sx == y)], -1)
  return values, valid


def _reaches(x: jax.Array, y: jax.Array, target: jax.Array) -> jax.Array:
  """Whether one operation on x and y gives ``target``, without division.

  ``x / y == t`` (exact) <=> ``y != 0 and x == t * y``; exact while
  ``|t * x|, |t * y| < 2**31`` (``|t| <= MAX_GENERATED_TARGET`` and
  ``|x|, |y| <= 127**3`` here).
  """
  return ((x + y == target) | (x - y == target) | (y - x == target)
          | (x * y == target) | ((y != 0) & (x == target * y))
          | ((x != 0) & (y == target * x)))


def _reach3(triple: jax.Array, target: jax.Array) -> jax.Array:
  """Whether ``target`` is reachable from the 3 numbers in ``triple[..., 3]``.

  Every binary tree over 3 leaves: combine a pair (3 splits x 6 results),
  then combine with the remaining number (6 results): 108 values.
  """
  p, q, r = (triple[..., idx] for idx in _TRIPLE_SPLITS)  # [..., 3] each
  v1, k1 = _combine(p, q)  # [..., 3, 6]
  return jnp.any(k1 & _reaches(v1, r[..., None], target), axis=(-2, -1))


def _reach4(quad: jax.Array, target: jax.Array) -> jax.Array:
  """Whether ``target`` is reachable from the 4 numbers in ``quad[..., 4]``.

  Combine a pair (6 splits x 6 results), then solve the 3 remaining values
  with :func:`_reach3`: 3888 values, every binary tree over 4 leaves.
  """
  a, b, c, d = (quad[..., idx] for idx in _QUAD_SPLITS)  # [..., 6] each
  v1, k1 = _combine(a, b)  # [..., 6, 6]
  c, d = (jnp.broadcast_to(x[..., None], v1.shape) for x in (c, d))
  triple = jnp.stack([v1, c, d], -1)  # [..., 6, 6, 3]
  return jnp.any(k1 & _reach3(triple, target), axis=(-2, -1))


def _solvable(cands: jax.Array, target: jax.Array, plus_minus_only: bool
              ) -> jax.Array:
  """[C] bool: candidate rows of ``cands[C, 3 or 4]`` that reach ``target``."""
  n = cands.shape[-1]
  if plus_minus_only:
    signs = jnp.asarray(np.array(list(itertools.product((1, -1), repeat=n)),
                                 np.int32))  # [2**n, n]
    sums = jnp.sum(cands[:, None, :] * signs[None], axis=-1)  # [C, 2**n]
    return jnp.any(sums == target, axis=-1)
  return _reach4(cands, target) if n == 4 else _reach3(cands, target)


def _generator_sizes(plus_minus_only: bool) -> tuple[int, int, int]:
  """(3-number candidates per round, 4-number candidates per round, rounds)."""
  # Measured acceptance per candidate (targets 10..100, numbers 1..99), worst
  # target: +/- 2.0% (3 numbers), 3.7% (4); all ops 2.6% (3), 9.5% (4).
  return (128, 128, 8) if plus_minus_only else (128, 16, 16)


def generate_instance(
    key: jax.Array, params: CountdownParams, *, plus_minus_only: bool = True
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Samples a Countdown instance with a reachable target (pure, bounded).

  Stream-of-Search (Gandhi et al. 2024, https://arxiv.org/abs/2404.03683),
  whose generator produced TinyZero's ``Countdown-Tasks-3to4`` data, draws the
  target first and then redraws the numbers until the target is reachable;
  RAGEN then keeps only instances solvable with ``±n1 ± n2 ± ...``. This
  follows the same order:

  1. ``target ~ U{min_target..max_target}``; ``count = 4`` with probability
     ``prob_four``, else 3.
  2. Rejection sampling: rounds of candidate number tuples, each number
     drawn i.i.d. from ``{min_number..max_number}`` (by multiply-shift of
     16 random bits: each value's probability is within a relative
     ``span / 65536`` of uniform, 0.15% for the default span of 99); keep
     the first candidate from
     which ``target`` is reachable. ``plus_minus_only``: some choice of signs
     ``s_i in {+1, -1}`` (the first may be negative, as RAGEN's
     ``has_solution``) gives ``sum s_i n_i = target``. Otherwise: some binary
     tree of ``+ - * /`` with integer intermediate results and exact
     divisions (a subset of what the reward accepts) gives ``target``.
  3. The loop stops at the first round with a hit (at most 8 rounds of 128
     candidates for +/-; 16 rounds of 128 (3 numbers) / 16 (4 numbers) for
     all operations). If every candidate failed (measured worst-case odds
     below 1e-6 per instance with the default ranges), the fallback is the
     last round's first candidate with ``target = sum(numbers)``, which is
     reachable but may lie outside the target range.

  So the target is uniform on its range and the numbers are uniform given
  that the target is reachable from them.

  Args:
    key: a PRNG key.
    params: :class:`CountdownParams` (ranges and ``prob_four``).
    plus_minus_only: static; True for RAGEN's +/- filter.

  Returns:
    ``(numbers, count, target, found)``: int32 [4] (zero-padded beyond
    ``count``), int32 scalar 3 or 4, int32 scalar, and a bool scalar that is
    False only when the fallback was used.
  """
  c3, c4, rounds = _generator_sizes(plus_minus_only)
  k_target, k_count, k_nums = jax.random.split(key, 3)
  target = jax.random.randint(
      k_target, (), params.min_target, params.max_target + 1, jnp.int32)
  four = jax.random.uniform(k_count, ()) < params.prob_four
  count = jnp.where(four, 4, 3).astype(jnp.int32)
  lo, hi = params.min_number, params.max_number + 1

  def draw(r):
    # Two 16-bit halves of each uint32 give two numbers by multiply-shift.
    bits = jax.random.bits(jax.random.fold_in(k_nums, r), (c3, 2), jnp.uint32)
    halves = jnp.stack([bits >> 16, bits & jnp.uint32(0xFFFF)], -1).reshape(c3, 4)
    span = (hi - lo).astype(jnp.uint32)
    cands = lo + ((halves * span) >> 16).astype(jnp.int32)  # [c3, 4]
    ok3 = _solvable(cands[:, :3], target, plus_minus_only)
    ok4 = _solvable(cands[:c4], target, plus_minus_only)
    pick3 = cands[jnp.argmax(ok3)].at[3].set(0)
    pick4 = cands[jnp.argmax(ok4)]
    hit = jnp.where(four, jnp.any(ok4), jnp.any(ok3))
    picked = jnp.where(four, pick4, pick3)
    fallback = jnp.where(four, cands[0], cands[0].at[3].set(0))
    return hit, picked, fallback

  def cond(carry):
    r, found, _ = carry
    return (r < rounds) & ~found

  def body(carry):
    r, _, _ = carry
    hit, picked, fallback = draw(r)
    return r + 1, hit, jnp.where(hit, picked, fallback)

  init = (jnp.int32(0), jnp.bool_(False), jnp.zeros(MAX_NUMBERS, jnp.int32))
  _, found, numbers = jax.lax.while_loop(cond, body, init)
  target = jnp.where(found, target, jnp.sum(numbers)).astype(jnp.int32)
  return numbers, count, target, found


# ------------------------------------------------------------------ reward
def _mul_overflows(x: jax.Array, y: jax.Array) -> jax.Array:
  """Whether ``|x * y| > MAX_INT32`` (for |x|, |y| <= MAX_INT32)."""
  return jnp.abs(x) > MAX_INT32 // jnp.maximum(jnp.abs(y), 1)


def _add_overflows(x: jax.Array, y: jax.Array) -> jax.Array:
  """Whether ``|x + y| > MAX_INT32`` (for |x|, |y| <= MAX_INT32)."""
  return ((x > 0) & (y > MAX_INT32 - x)) | ((x < 0) & (y < -MAX_INT32 - x))


def _literals(b: jax.Array) -> tuple[jax.Array, ...]:
  """Digit runs of the bytes ``b[L]`` (int32), scanned left to right.

  Returns:
    ``(value, huge, bad_zero)``, each [L]; meaningful at the last digit of a
    run: its decimal value (saturated at MAX_INT32), whether it exceeds
    MAX_INT32, and whether it has a leading zero and is not all zeros.
  """
  is_digit = (b >= 48) & (b <= 57)

  def step(carry, x):
    val, huge, length, zero_first = carry
    digit, d = x
    cont = length > 0
    over = val > (MAX_INT32 - d) // 10
    new_val = jnp.where(cont, jnp.where(over, MAX_INT32, val * 10 + d), d)
    new_huge = jnp.where(cont, huge | over, False)
    new_len = jnp.where(cont, length + 1, 1)
    new_zero = jnp.where(cont, zero_first, d == 0)
    carry = jax.tree.map(
        lambda n, o: jnp.where(digit, n, o),
        (new_val, new_huge, new_len, new_zero),
        (jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.bool_(False)))
    return carry, carry

  init = (jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.bool_(False))
  _, (val, huge, length, zero_first) = jax.lax.scan(step, init, (is_digit, b - 48))
  bad_zero = zero_first & (length > 1) & (val != 0)
  return val, huge, bad_zero


class _Evaluation(struct.PyTreeNode):
  numerator: jax.Array  # shape=(), dtype=int32
  denominator: jax.Array  # shape=(), dtype=int32 (> 0 when evaluates)
  well_formed: jax.Array  # shape=(), dtype=bool
  divided_by_zero: jax.Array  # shape=(), dtype=bool
  overflow: jax.Array  # shape=(), dtype=bool


def _evaluate(cls: jax.Array, lit: jax.Array, huge: jax.Array,
              bad_zero: jax.Array) -> _Evaluation:
  """Bounded shift-reduce evaluation of the token classes ``cls[L]``.

  One loop iteration either consumes a position (skip or shift a token) or
  applies one operator from the stack; each position is consumed once and
  each operator applied once, so ``2 L + 2`` iterations always finish.
  Grammar checks run on shift (expect-operand / expect-operator automaton
  plus a parenthesis depth counter); on the first error the loop idles.
  """
  n = cls.shape[0]
  prec = jnp.asarray(_PRECEDENCE)

  def body(_, c):
    (i, vnum, vden, vsp, ops, osp, expect, depth, err, div0, ovf, done) = c
    tok = jnp.where(i < n, cls[jnp.minimum(i, n - 1)], _END)
    ic = jnp.minimum(i, n - 1)
    is_pm = (tok == _PLUS) | (tok == _MINUS)
    is_md = (tok == _MUL) | (tok == _DIV)
    binary = (is_pm | is_md) & ~expect
    unary = is_pm & expect
    bad = ((tok == _NUM) & (~expect | bad_zero[ic])) | (is_md & expect) \
        | ((tok == _LPAR) & ~expect) \
        | ((tok == _RPAR) & (expect | (depth == 0))) | (tok == _BAD) \
        | ((tok == _END) & (expect | (depth > 0)))
    top = jnp.where(osp > 0, ops[jnp.maximum(osp - 1, 0)], 0)
    top_is_op = (top != 0) & (top != _OP_LPAR)
    tok_prec = jnp.where(is_md, 2, 1)
    reduce = ~bad & top_is_op & (
        (binary & (prec[top] >= tok_prec)) | (tok == _RPAR) | (tok == _END))
    active = ~done
    do_reduce = active & reduce
    do_shift = active & ~bad & ~reduce

    # --- reduce: apply the top operator.
    a_i = jnp.maximum(vsp - 2, 0)
    b_i = jnp.maximum(vsp - 1, 0)
    an, ad, bn, bd = vnum[a_i], vden[a_i], vnum[b_i], vden[b_i]
    x1, x2, dd = an * bd, bn * ad, ad * bd
    o1, o2, odd = _mul_overflows(an, bd), _mul_overflows(bn, ad), _mul_overflows(ad, bd)
    x2s = jnp.where(top == _OP_SUB, -x2, x2)
    add_n = x1 + x2s
    add_o = _add_overflows(x1, x2s) | o1 | o2 | odd
    mul_n = an * bn
    mul_o = _mul_overflows(an, bn) | odd
    div_d = ad * bn
    div_o = o1 | _mul_overflows(ad, bn)
    flip = jnp.where(div_d < 0, -1, 1)
    is_unary_top = (top == _OP_NEG) | (top == _OP_POS)
    res_n = jnp.select(
        [top == _OP_NEG, top == _OP_POS, top == _OP_MUL, top == _OP_DIV],
        [-bn, bn, mul_n, x1 * flip], add_n)
    res_d = jnp.select(
        [is_unary_top, top == _OP_MUL, top == _OP_DIV], [bd, dd, div_d * flip], dd)
    res_o = jnp.select([is_unary_top, top == _OP_MUL, top == _OP_DIV],
                       [False, mul_o, div_o], add_o)
    res_z = (top == _OP_DIV) & (bn == 0)
    res_i = jnp.where(is_unary_top, b_i, a_i)
    red_vsp = jnp.where(is_unary_top, vsp, vsp - 1)

    # --- shift.
    push_num = do_shift & (tok == _NUM)
    push_op = do_shift & (binary | unary | (tok == _LPAR))
    pop_par = do_shift & (tok == _RPAR)  # top is "(" here
    finish = active & (bad | (~reduce & (tok == _END)))
    op_code = jnp.select(
        [unary & (tok == _MINUS), unary, tok == _PLUS, tok == _MINUS,
         tok == _MUL, tok == _DIV], [_OP_NEG, _OP_POS, _OP_ADD, _OP_SUB,
                                     _OP_MUL, _OP_DIV], _OP_LPAR)

    # --- write back (one value write and one op write per iteration).
    w_idx = jnp.where(do_reduce, res_i, jnp.minimum(vsp, n))
    w_num = jnp.where(do_reduce, res_n, lit[ic])
    w_den = jnp.where(do_reduce, res_d, 1)
    write_v = do_reduce | push_num
    vnum = vnum.at[w_idx].set(jnp.where(write_v, w_num, vnum[w_idx]))
    vden = vden.at[w_idx].set(jnp.where(write_v, w_den, vden[w_idx]))
    vsp = jnp.where(do_reduce, red_vsp, jnp.where(push_num, vsp + 1, vsp))
    o_idx = jnp.minimum(osp, n)
    ops = ops.at[o_idx].set(jnp.where(push_op, op_code, ops[o_idx]))
    osp = jnp.where(do_reduce | pop_par, osp - 1, jnp.where(push_op, osp + 1, osp))
    expect = jnp.where(push_num | pop_par, False,
                       jnp.where(push_op & binary, True, expect))
    depth = depth + jnp.where(push_op & (tok == _LPAR), 1, 0) - jnp.where(pop_par, 1, 0)
    err = err | (active & bad)
    div0 = div0 | (do_reduce & res_z)
    ovf = ovf | (do_reduce & res_o) | (push_num & huge[ic])
    i = i + jnp.where(do_shift, 1, 0)
    done = done | finish
    return (i, vnum, vden, vsp, ops, osp, expect, depth, err, div0, ovf, done)

  zeros = jnp.zeros(n + 1, jnp.int32)
  f = jnp.bool_(False)
  init = (jnp.int32(0), zeros, zeros + 1, jnp.int32(0), zeros, jnp.int32(0),
          jnp.bool_(True), jnp.int32(0), f, f, f, f)
  out = jax.lax.fori_loop(0, 2 * n + 2, body, init)
  _, vnum, vden, vsp, _, _, _, _, err, div0, ovf, done = out
  return _Evaluation(
      numerator=vnum[0], denominator=vden[0],
      well_formed=done & ~err & (vsp == 1), divided_by_zero=div0,
      overflow=ovf)


def _within_tolerance(p: jax.Array, q: jax.Array, target: jax.Array,
                      inv_tolerance: jax.Array) -> jax.Array:
  """Exact ``|p/q - target| < 1/inv_tolerance`` for q > 0, without overflow.

  With ``i = floor(p/q)`` and ``r = p - i q`` in [0, q), only ``target = i``
  (distance r/q) or ``target = i + 1`` (distance (q-r)/q) can be closer than
  1; ``dist/q < 1/K`` <=> ``dist * K < q`` <=> ``dist <= (q - 1) // K``.
  """
  q = jnp.maximum(q, 1)
  k = jnp.maximum(inv_tolerance, 1)
  i = jnp.floor_divide(p, q)
  r = p - i * q  # exact modulo 2**32, and the true value lies in [0, q)
  dist = jnp.where(target == i, r, jnp.where(target - 1 == i, q - r, -1))
  return (dist == 0) | ((dist > 0) & (dist <= (q - 1) // k))


def countdown_reward(
    answer: jax.Array,
    numbers: jax.Array,
    count: jax.Array,
    target: jax.Array,
    params: CountdownParams,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Countdown reward of one answer, computed on device.

  Rules (RAGEN's ``compute_reward``, ``ragen/env/countdown/env.py``), with exact
  arithmetic:

  * ``reward_wrong_numbers`` (0) unless the maximal ASCII digit runs of the
    answer, read as integers, equal ``numbers[:count]`` as a multiset (so an
    empty answer scores 0). Signs are not part of a number: ``-3`` uses 3.
  * Else ``reward_correct`` (1) if the answer is a well-formed expression
    (grammar below) whose exact rational value ``v`` satisfies
    ``|v - target| < 1 / inv_tolerance``.
  * Else ``reward_format`` (0.1): malformed, division by zero, or wrong value.
    NOTE: TinyZero's ``compute_score`` also gives 0.1 for wrong numbers; we
    follow RAGEN's env (0).

  Grammar (Python 3 arithmetic restricted to these tokens; whitespace = space,
  TAB, LF, VT, FF, CR, allowed between tokens)::

      sum     := product (("+" | "-") product)*
      product := signed (("*" | "/") signed)*
      signed  := ("+" | "-") signed | atom          # unary minus/plus
      atom    := literal | "(" sum ")"
      literal := "0"+ | [1-9][0-9]*

  Differences from RAGEN (``eval`` after a ``[\\d+\\-*/().\\s]`` whitelist),
  all deliberate: ``**`` and ``//`` are malformed (Python: power, floor
  division); ``.`` is malformed (Python: a float literal, which would let
  ``1.5`` pass as the numbers 1 and 5); only ASCII digits count (Python's
  ``\\d`` also matches other Unicode digits); a newline between tokens outside
  parentheses is accepted (Python: SyntaxError). ``=`` is just a byte outside
  the grammar, as in RAGEN: ``3+5+7=15`` uses the numbers 3, 5, 7, 15 and so
  scores 0 with numbers [3, 5, 7]; ``3+5+7=`` scores 0.1.

  Evaluation runs in int32 numerator/denominator pairs (unreduced; no
  rounding). Any product or sum beyond 2**31 - 1 in magnitude sets
  ``overflow`` and counts as not evaluating; a literal beyond 2**31 - 1 also
  matches no number. With the instance's own numbers (<= 127, see
  ``MAX_EXACT_NUMBER``) overflow is impossible, so the reward equals the
  exact-arithmetic reference (``countdown_reference.reference_reward``)
  for every input.

  Args:
    answer: uint8 [L], the answer bytes; bytes from the first 0 on are
      ignored (zero padding).
    numbers: int32 [4], the numbers (entries >= ``count`` ignored).
    count: int32 scalar in [0, 4].
    target: int32 scalar.
    params: :class:`CountdownParams` (rewards and tolerance).

  Returns:
    ``(reward, info)``: float32 scalar and a dict of bool scalars
    ``success`` (reward is ``reward_correct``), ``numbers_ok``,
    ``well_formed``, ``evaluates`` (well formed, no division by zero, no
    overflow) and ``overflow``.

  Raises:
    ValueError: if ``answer`` is not a 1-D uint8 array (static check).
  """
  score = _score(answer, numbers, count, target, params)
  info = {
      "success": score.success,
      "numbers_ok": score.numbers_ok,
      "well_formed": score.well_formed,
      "evaluates": score.evaluates,
      "overflow": score.overflow,
  }
  return score.reward, info


class _Score(struct.PyTreeNode):
  reward: jax.Array  # shape=(), dtype=float32
  success: jax.Array  # shape=(), dtype=bool
  numbers_ok: jax.Array  # shape=(), dtype=bool
  well_formed: jax.Array  # shape=(), dtype=bool
  evaluates: jax.Array  # shape=(), dtype=bool
  overflow: jax.Array  # shape=(), dtype=bool
  numerator: jax.Array  # shape=(), dtype=int32; value = numerator/denominator
  denominator: jax.Array  # shape=(), dtype=int32; > 0 when evaluates


def _score(answer, numbers, count, target, params) -> _Score:
  """:func:`countdown_reward` with the exact value as well (for tests)."""
  answer = jnp.asarray(answer)
  if answer.ndim != 1 or answer.dtype != jnp.uint8:
    raise ValueError(
        "countdown_reward: answer must be a uint8 vector of bytes (vmap for "
        f"batches), got shape {answer.shape} dtype {answer.dtype}")
  b = answer.astype(jnp.int32)
  alive = jnp.cumprod(b != 0) > 0  # before the first NUL
  b = jnp.where(alive, b, 0)
  is_digit = (b >= 48) & (b <= 57)
  next_digit = jnp.concatenate([is_digit[1:], jnp.zeros(1, bool)])
  run_end = is_digit & ~next_digit
  cls = jnp.asarray(_BYTE_CLASS)[b]
  cls = jnp.where(is_digit & ~run_end, _SKIP, cls)
  lit, huge, bad_zero = _literals(b)

  # Numbers used: multiset of run values equals numbers[:count].
  numbers = jnp.asarray(numbers, jnp.int32)
  count = jnp.clip(jnp.asarray(count, jnp.int32), 0, MAX_NUMBERS)
  used = jnp.arange(MAX_NUMBERS) < count
  n_runs = jnp.sum(run_end)
  in_state = jnp.sum(used[None, :] & (numbers[:, None] == numbers[None, :]), -1)
  in_answer = jnp.sum(
      (run_end & ~huge)[None, :] & (lit[None, :] == numbers[:, None]), -1)
  numbers_ok = (n_runs == count) & jnp.all(~used | (in_state == in_answer))

  ev = _evaluate(cls, lit, huge, bad_zero)
  evaluates = ev.well_formed & ~ev.divided_by_zero & ~ev.overflow
  close = _within_tolerance(ev.numerator, ev.denominator,
                            jnp.asarray(target, jnp.int32), params.inv_tolerance)
  success = numbers_ok & evaluates & close
  reward = jnp.where(
      numbers_ok,
      jnp.where(success, params.reward_correct, params.reward_format),
      params.reward_wrong_numbers).astype(jnp.float32)
  return _Score(reward=reward, success=success, numbers_ok=numbers_ok,
                well_formed=ev.well_formed, evaluates=evaluates,
                overflow=ev.overflow, numerator=ev.numerator,
                denominator=ev.denominator)


def encode_answer(text: str | bytes, max_answer_bytes: int) -> np.ndarray:
  """Host side: an answer as the env's zero-padded uint8 action buffer.

  Args:
    text: the answer (``str`` is UTF-8 encoded).
    max_answer_bytes: buffer length; longer answers are truncated.

  Returns:
    uint8 [max_answer_bytes].

  Raises:
    ValueError: if ``max_answer_bytes < 1``.
  """
  if int(max_answer_bytes) < 1:
    raise ValueError(f"max_answer_bytes must be >= 1, got {max_answer_bytes!r}")
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  out = np.zeros(int(max_answer_bytes), np.uint8)
  data = data[:out.shape[0]]
  out[:len(data)] = np.frombuffer(data, np.uint8)
  return out


# --------------------------------------------------------------- rendering
_DIGIT_SYMBOLS = tuple(str(d) for d in range(10))
# Multi-character pieces end at word boundaries ("Target: ", ", nums: [", ", ") so
# that tokenizing them one by one agrees with tokenizing the whole text.
SYMBOLS = ("",) + _DIGIT_SYMBOLS + ("-", "Target: ", ", nums: [", ", ", "]")
_ID = {s: i for i, s in enumerate(SYMBOLS)}
_INT_SLOTS = 11  # sign + 10 digits covers every int32


def _int_symbols(x: jax.Array) -> jax.Array:
  """int32 scalar -> int32 [11] symbol ids, -1 in unused leading slots."""
  return environment.number_symbols(x, _ID["0"], int_digits=_INT_SLOTS - 1,
                                    minus_id=_ID["-"], pad_id=-1)


def _compact(ids: jax.Array) -> jax.Array:
  """Moves the ids >= 0 to the front (order kept), pads with 0 (the "" id)."""
  keep = ids >= 0
  pos = jnp.where(keep, jnp.cumsum(keep) - 1, ids.shape[0])
  return jnp.zeros_like(ids).at[pos].set(ids, mode="drop")


# ------------------------------------------------------------- environment
class Countdown(environment.Environment[CountdownState, CountdownParams]):
  """Countdown: reach the target with the given numbers (single turn).

  RAGEN's ``CountdownEnv`` (arXiv 2504.20073) as a pure-JAX environment; the
  instances come from :func:`generate_instance` instead of a parquet file.

  * Observation: int32 [6] ``[n0, n1, n2, n3, count, target]`` (numbers
    zero-padded beyond ``count``). The prompt text is :meth:`render_text`,
    RAGEN's state wording ``"Target: 42, nums: [12, 5, 39]"``.
  * Action: uint8 [``max_answer_bytes``], the answer text (the inside of
    ``<answer>...</answer>``, already extracted by the text layer), zero
    padded; bytes from the first 0 on are ignored. :func:`encode_answer`
    builds it on the host.
  * Reward: :func:`countdown_reward` (0 / 0.1 / 1.0 by default).
  * Termination: after the one step (``terminated`` True, ``truncated``
    False). Stepping again scores the answer against the same instance.
  * State: :class:`CountdownState`; params: :class:`CountdownParams`.
  * Info: bool scalars ``success``, ``numbers_ok``, ``well_formed``,
    ``evaluates``, ``overflow``.

  Example::

      env, params = envs_jax.make("Countdown-v0")
      obs, state = env.reset(jax.random.key(0), params)
      env.render_text(state)  # "Target: 60, nums: [46, 39, 84, 59]"
      action = envs_jax.encode_countdown_answer("46 + 39 - 84 + 59",
                                                env.max_answer_bytes)
      obs, state, reward, terminated, truncated, info = env.step(
          jax.random.key(1), state, action, params)  # reward 1.0

  Args:
    plus_minus_only: static. True (the registered default, RAGEN's filter):
      every instance is solvable with + and - alone. False: solvable with
      ``+ - * /`` (exact division). The reward accepts all four operations
      either way, as RAGEN's does.
    max_answer_bytes: static length of the action buffer (default 128).

  Raises:
    ValueError: on a non-bool ``plus_minus_only`` or ``max_answer_bytes``
      outside [1, 4096].
  """

  symbols = SYMBOLS
  action_names = ()
  # One turn; the reply budget holds a 4-number expression answer and the EOS.
  agent_defaults = environment.AgentDefaults(
      max_turns=1, max_actions_per_traj=1, max_tokens_per_turn=24,
      system="You play Countdown.")
  expert_think_text = "I combine the numbers to reach the target."
  instructions = ("You play Countdown. Combine all the given numbers, each exactly once, "
                  "with +, -, * and / and parentheses into an expression equal to the "
                  "target. Answer with the expression only, for example "
                  "<answer>(12 - 4) * 3</answer>.")

  def __init__(self, plus_minus_only: bool = True, max_answer_bytes: int = 128):
    if not isinstance(plus_minus_only, (bool, np.bool_)):
      raise ValueError(f"plus_minus_only must be a bool, got {plus_minus_only!r}")
    self.plus_minus_only = bool(plus_minus_only)
    self.max_answer_bytes = checks.check_int("Countdown", "max_answer_bytes",
                                             max_answer_bytes, 1, 4096)

  @property
  def default_params(self) -> CountdownParams:
    """:func:`make_params` defaults (rewards 0/0.1/1, numbers 1..99, targets 10..100)."""
    return make_params()

  @property
  def render_length(self) -> int:
    """Length of :meth:`render_symbols` (fits any int32 numbers/target)."""
    return 1 + _INT_SLOTS + 1 + MAX_NUMBERS * _INT_SLOTS + (MAX_NUMBERS - 1) + 1

  def reset_env(self, key: jax.Array, params: CountdownParams):
    """Draws an instance with :func:`generate_instance`. Returns ``(obs, state)``.

    Raises:
      ValueError: from :func:`check_params` when ``params`` are concrete and bad.
    """
    check_params(params)
    numbers, count, target, _ = generate_instance(
        key, params, plus_minus_only=self.plus_minus_only)
    state = CountdownState(numbers=numbers, count=count, target=target,
                           done=jnp.bool_(False))
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    """Scores ``action`` with :func:`countdown_reward`; always terminates.

    Raises:
      ValueError: if ``action`` is not uint8 [max_answer_bytes] (static check).
    """
    del key
    action = jnp.asarray(action)
    if action.shape != (self.max_answer_bytes,) or action.dtype != jnp.uint8:
      raise ValueError(
          f"{self.name}: action must be uint8 [{self.max_answer_bytes}] (the "
          f"answer bytes, zero padded; see encode_answer), got shape "
          f"{action.shape} dtype {action.dtype}")
    reward, info = countdown_reward(action, state.numbers, state.count,
                                    state.target, params)
    state = state.replace(done=jnp.bool_(True))
    return (self.observation(state), state, reward, jnp.bool_(True),
            jnp.bool_(False), info)

  def sample_action(self, key: jax.Array) -> jax.Array:
    """A uniformly random action: uint8 [max_answer_bytes], each byte i.i.d.

    Mostly garbage answers (reward 0); useful for throughput and contract
    tests, not as a baseline policy.
    """
    return jax.random.bits(key, (self.max_answer_bytes,), jnp.uint8)

  def expert_answers(self, states, params, *, actions_per_turn=1, **options):
    """An expression reaching each state's target (host side).

    :func:`envs_jax.solve_countdown` with ``+ -`` first, then ``+ - * /``; an
    instance it cannot solve gets the numbers joined by ``+`` (right numbers,
    wrong value).

    Args:
      states: unbatched :class:`CountdownState` s with numpy leaves.
      params: their params (unused).
      actions_per_turn: unused (one answer per episode).
      **options: none (this expert has no settings; any is refused).

    Returns:
      One expression per state.

    Raises:
      ValueError: any option (:meth:`expert_options`).
    """
    del params, actions_per_turn
    self.expert_options(options)
    out = []
    for s in states:
      nums = [int(x) for x in np.asarray(s.numbers)[:int(s.count)]]
      target = int(s.target)
      out.append(countdown_reference.solve(nums, target, plus_minus_only=True)
                 or countdown_reference.solve(nums, target)
                 or " + ".join(str(n) for n in nums))
    return out

  def random_answers(self, states, rng, *, actions_per_turn=1):
    """The numbers of each state shuffled and joined by random ``+`` / ``-``.

    Right numbers, mostly the wrong value: the answer format only.
    ``actions_per_turn`` is unused.
    """
    del actions_per_turn
    out = []
    for s in states:
      nums = [int(x) for x in rng.permutation(np.asarray(s.numbers)[:int(s.count)])]
      ops = rng.choice(["+", "-"], size=len(nums) - 1)
      out.append(" ".join([str(nums[0])] + [f"{o} {n}" for o, n in zip(ops, nums[1:])]))
    return out

  def observation(self, state: CountdownState) -> jax.Array:
    """int32 [6]: ``[n0, n1, n2, n3, count, target]``."""
    return jnp.concatenate([
        state.numbers.astype(jnp.int32),
        jnp.stack([state.count, state.target]).astype(jnp.int32)])

  def render_symbols(self, state: CountdownState) -> jax.Array:
    """int32 [render_length]: ``"Target: T, nums: [a, b, c]"`` as symbol ids.

    RAGEN's ``CountdownEnv.reset`` text ``f"Target: {target}, nums: {nums}"``
    (a Python list, so ``", "``-separated in brackets); padded with id 0.
    """
    ids = [jnp.array([_ID["Target: "]], jnp.int32),
           _int_symbols(state.target),
           jnp.array([_ID[", nums: ["]], jnp.int32)]
    for k in range(MAX_NUMBERS):
      shown = k < state.count
      if k > 0:
        ids.append(jnp.where(shown, jnp.array([_ID[", "]], jnp.int32), -1))
      ids.append(jnp.where(shown, _int_symbols(state.numbers[k]), -1))
    ids.append(jnp.array([_ID["]"]], jnp.int32))
    return _compact(jnp.concatenate(ids))

  def __repr__(self) -> str:
    return (f"Countdown(plus_minus_only={self.plus_minus_only}, "
            f"max_answer_bytes={self.max_answer_bytes})")


registration.register("Countdown-v0", Countdown)
