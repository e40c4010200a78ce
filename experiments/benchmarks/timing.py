"""Shared timing helpers for the benchmarks under experiments/benchmarks/ (memory: ``rss``)."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import jax


def best_seconds(fn: Callable[[], Any], repeats: int, *, warmup: bool = True,
                 sync: Callable[[Any], Any] = jax.block_until_ready) -> float:
  """Best wall-clock seconds of ``fn()`` over ``repeats`` timed calls.

  Args:
    fn: the work to time; its result is passed to ``sync`` so asynchronous
      dispatch (JAX) is included in the time.
    repeats: timed calls (>= 1); the minimum is the least-disturbed one.
    warmup: call ``fn`` once untimed first (compiles jitted code).
    sync: waits for ``fn``'s result; the identity for synchronous code.

  Returns:
    The best time in seconds.

  Raises:
    ValueError: if ``repeats < 1``.
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  if warmup:
    sync(fn())
  return min(interleaved_seconds({"fn": (fn, sync)}, repeats)["fn"])


def interleaved_seconds(
    fns: Mapping[str, tuple[Callable[[], Any], Callable[[Any], Any]]], repeats: int
) -> dict[str, list[float]]:
  """Wall-clock seconds of every call of each function, timed in interleaved rounds.

  Each round calls every function once (the order reversed every other
  round), so a slow phase of a shared machine slows every contender alike
  and the ratios of the bests compare like with like; timing one contender
  after the other let such phases swing a ratio by 10-20%. Compile or warm
  up each function before.

  Args:
    fns: name -> (fn, sync): the work and how to wait for its result
      (``jax.block_until_ready`` for JAX, the identity for synchronous code).
    repeats: rounds (>= 1).

  Returns:
    name -> the ``repeats`` call times in seconds, in call order (the best is
    the least-disturbed one).

  Raises:
    ValueError: if ``repeats < 1``.
  """
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  names = list(fns)
  secs = {name: [] for name in names}
  for r in range(repeats):
    for name in names if r % 2 == 0 else names[::-1]:
      fn, sync = fns[name]
      t0 = time.perf_counter()
      sync(fn())
      secs[name].append(time.perf_counter() - t0)
  return secs
