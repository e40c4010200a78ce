"""Countdown reward: device (int32 shift-reduce) == host reference (Fraction).

Over 12,000 generated and fuzzed answers (solver solutions, random expression
trees over the instance numbers, mutations, near misses, random bytes, huge
literals, deep nests), with the tolerance varied per answer; plus the host
reference against Python's own parser (``ast``) on the shared grammar, and a
hypothesis property test.
"""

import ast
import fractions
import itertools
import re
import warnings

from absl.testing import absltest
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax._src import countdown
from envs_jax._src import countdown_reference as ref

Fraction = fractions.Fraction
L = 128
PER_INSTANCE = 5
N_PM, N_ALL, N_REPEAT = 1200, 400, 400  # instances; answers = 5x + random
NASTY = list(b"0123456789+-*/()  =.x\t\n^,") + [0, 0x80, 0xC3, 0xFF, 0xEF]
TOLERANCES = (1, 2, 3, 7, 100_000)


@jax.jit
def _device_scores(answers, numbers, count, target, params):
  return jax.vmap(countdown._score)(answers, numbers, count, target, params)


def _instances(n, plus_minus_only, seed):
  params = countdown.make_params()
  gen = jax.jit(jax.vmap(lambda k: countdown.generate_instance(
      k, params, plus_minus_only=plus_minus_only)))
  nums, count, target, _ = gen(jax.random.split(jax.random.key(seed), n))
  return np.asarray(nums), np.asarray(count), np.asarray(target)


def _tree(rng, leaves):
  """A random expression over ``leaves`` (each used once), random layout."""
  items = list(leaves)
  while len(items) > 1:
    i, j = rng.choice(len(items), 2, replace=False)
    sp = " " if rng.random() < 0.5 else ""
    e = f"{items[i]}{sp}{rng.choice(list('+-*/'))}{sp}{items[j]}"
    if rng.random() < 0.6 or len(items) > 2:
      e = f"({e})"
    if rng.random() < 0.1:
      e = "-" + e
    items = [x for k, x in enumerate(items) if k not in (i, j)] + [e]
  return items[0]


def _mutate(rng, s):
  b = bytearray(s.encode())
  for _ in range(rng.integers(1, 4)):
    kind = rng.integers(4)
    pos = int(rng.integers(len(b) + 1))
    if kind == 0 and b:
      b[min(pos, len(b) - 1)] = int(rng.choice(NASTY))
    elif kind == 1:
      b.insert(pos, int(rng.choice(NASTY)))
    elif kind == 2 and b:
      del b[min(pos, len(b) - 1)]
    elif b:
      j = int(rng.integers(len(b)))
      b[min(pos, len(b) - 1)], b[j] = b[j], b[min(pos, len(b) - 1)]
  return bytes(b)


def _near_misses(rng, s, nums, target):
  runs = list(re.finditer(r"[0-9]+", s))
  m = runs[int(rng.integers(len(runs)))]
  k = int(rng.integers(len(nums)))
  return [
      s[:m.start()] + str(int(m.group()) + int(rng.choice([-1, 1]))) + s[m.end():],
      s[:m.start()] + "0" + s[m.start():],  # leading zero
      s + rng.choice(["=", " = ", "="]) + str(target),
      s + " =",
      s + f" + {nums[k]}",
      s[:m.start()] + s[m.end():],  # number missing
      "(" * int(rng.integers(1, 4)) + s + ")" * int(rng.integers(0, 4)),
      "-" * int(rng.integers(1, 5)) + "(" + s + ")",
      s.replace("*", "**", 1).replace("+", "//", 1),
      s[:m.start()] + m.group() + "." + s[m.start():],
      s[:m.end()] + "0" * int(rng.integers(8, 14)) + s[m.end():],  # huge
      re.sub(r" ", lambda _: str(rng.choice([" ", "\t", "\n", "  ", ""])), s),
      "(" * 40 + s + ")" * 40,  # truncated at 128 bytes unless short
      f"{target}",
      f"{nums[k]} / ({nums[k]} - {nums[k]})",
      "".join(rng.choice(list("0123456789+-*/() "), int(rng.integers(1, 30)))),
  ]


def _answers_for(rng, nums, target, plus_minus_only):
  sol = ref.solve(nums, target, plus_minus_only=plus_minus_only)
  out = []
  if sol is not None:
    out.append((sol.encode(), target))
    out.append((_mutate(rng, sol), target))
    near = _near_misses(rng, sol, nums, target)
    for idx in rng.choice(len(near), 2, replace=False):
      out.append((near[idx].encode(), target))
  # Random tree over the numbers; half the time aim at its own value.
  expr = _tree(rng, [str(n) for n in rng.permutation(nums)])
  _, value = ref.evaluate_expression(expr)
  t = target
  if value is not None and rng.random() < 0.5:
    t = int(round(value)) if abs(value) < 2**31 - 1 else target
  out.append((expr.encode(), t))
  return out[:PER_INSTANCE] if sol is not None else out


def _random_answers(rng, n):
  out = []
  for _ in range(n):
    kind = rng.integers(5)
    if kind == 0:
      b = bytes(rng.integers(0, 256, int(rng.integers(0, L + 8))).astype(np.uint8))
    elif kind == 1:
      b = bytes(rng.integers(1, 256, int(rng.integers(0, L + 8))).astype(np.uint8))
    elif kind == 2:
      b = "".join(rng.choice(list("0123456789+-*/() "), int(rng.integers(0, 60)))).encode()
    elif kind == 3:
      b = "*".join(str(x) for x in rng.integers(10**4, 10**6, int(rng.integers(2, 5)))).encode()
    else:
      b = str(int(rng.integers(1, 10**9)) * 10**int(rng.integers(0, 12))).encode()
    out.append((b, int(rng.integers(-5, 200))))
  return out


def _build_cases():
  rng = np.random.default_rng(1234)
  cases = []  # (answer bytes, numbers[4], count, target)
  for pm, n, seed in ((True, N_PM, 0), (False, N_ALL, 1)):
    nums, count, target = _instances(n, pm, seed)
    for i in range(n):
      real = [int(x) for x in nums[i, :count[i]]]
      for ans, t in _answers_for(rng, real, int(target[i]), pm):
        cases.append((ans, nums[i], count[i], t))
  # Instances with repeated numbers (more divisions by zero, multiset checks).
  for _ in range(N_REPEAT):
    c = int(rng.integers(3, 5))
    base = rng.integers(1, 20, 2)
    real = [int(x) for x in rng.choice(base, c)]
    padded = np.array(real + [0] * (4 - c), np.int32)
    t = int(rng.integers(0, 60))
    for ans, tt in _answers_for(rng, real, t, False)[:PER_INSTANCE]:
      cases.append((ans, padded, c, tt))
  nums0, count0, target0 = _instances(1, True, 7)
  for ans, t in _random_answers(rng, 1500):
    cases.append((ans, nums0[0], count0[0], t))
  return cases


class CountdownDifferentialTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cases = _build_cases()
    rng = np.random.default_rng(5)
    n = len(cases)
    cls.n = n
    cls.answers = np.stack([countdown.encode_answer(a, L) for a, *_ in cases])
    cls.numbers = np.stack([np.asarray(c[1], np.int32) for c in cases])
    cls.count = np.array([c[2] for c in cases], np.int32)
    cls.target = np.array([c[3] for c in cases], np.int32)
    cls.inv_tol = rng.choice(TOLERANCES, n).astype(np.int32)
    params = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,)), countdown.make_params())
    params = params.replace(inv_tolerance=jnp.asarray(cls.inv_tol))
    cls.dev = jax.tree.map(np.asarray, _device_scores(
        cls.answers, cls.numbers, cls.count, cls.target, params))
    cls.ref = [
        ref.reference_reward(cls.answers[i], cls.numbers[i, :cls.count[i]],
                             cls.target[i], inv_tolerance=cls.inv_tol[i])
        for i in range(n)]

  def test_enough_cases_of_every_kind(self):
    self.assertGreaterEqual(self.n, 10_000)
    rewards = np.array([r.reward for r in self.ref], np.float32)
    for value in (0.0, 0.1, 1.0):
      self.assertGreaterEqual(np.sum(rewards == np.float32(value)), 1000, value)
    self.assertGreaterEqual(sum(r.well_formed and not r.evaluates for r in self.ref), 100)
    self.assertGreaterEqual(sum(not r.well_formed for r in self.ref), 1000)
    self.assertGreaterEqual(int(self.dev.overflow.sum()), 100)
    self.assertGreaterEqual(int((self.inv_tol < 100_000).sum()), 1000)

  def test_reward_and_flags_equal_reference(self):
    ref_reward = np.array([r.reward for r in self.ref], np.float32)
    bad = np.flatnonzero(self.dev.reward != ref_reward)
    self.assertEmpty(bad, [(bytes(self.answers[i]).rstrip(b"\0"), self.dev.reward[i],
                            self.ref[i]) for i in bad[:5]])
    for name in ("numbers_ok", "well_formed", "success"):
      want = np.array([getattr(r, name) for r in self.ref])
      bad = np.flatnonzero(getattr(self.dev, name) != want)
      self.assertEmpty(bad, [(name, bytes(self.answers[i]).rstrip(b"\0"), self.ref[i])
                             for i in bad[:5]])

  def test_value_equals_reference_unless_overflow(self):
    for i in range(self.n):
      r = self.ref[i]
      if self.dev.overflow[i]:
        # Only possible when the literals are not the instance's numbers.
        self.assertFalse(r.numbers_ok, r)
        self.assertFalse(self.dev.evaluates[i])
        continue
      self.assertEqual(bool(self.dev.evaluates[i]), r.evaluates, r)
      if r.evaluates:
        got = Fraction(int(self.dev.numerator[i]), int(self.dev.denominator[i]))
        self.assertEqual(got, r.value, bytes(self.answers[i]).rstrip(b"\0"))


def _ragen_style_reward(text, numbers, target):
  """RAGEN's scoring idea, written for this test: regex numbers + float eval.

  (With RAGEN's env's 0 for wrong numbers.) Only for texts outside the
  documented differences: ASCII ``0-9 + - * / ( )`` and spaces, no ``**``/``//``.
  """
  if sorted(int(x) for x in re.findall(r"[0-9]+", text)) != sorted(numbers):
    return 0.0
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", SyntaxWarning)
      result = eval(text, {"__builtins__": None}, {})  # pylint: disable=eval-used
    return 1.0 if abs(result - target) < 1e-5 else 0.1
  except Exception:  # pylint: disable=broad-except
    return 0.1


def _python_value(text):
  """Python's own parse of ``text`` restricted to integer + - * / arithmetic."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", SyntaxWarning)  # "(1)(2)": not callable
      tree = ast.parse(text.lstrip(" \t"), mode="eval")  # as eval() does
  except SyntaxError:
    return None

  def walk(node):
    if isinstance(node, ast.Expression):
      return walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
      return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
      v = walk(node.operand)
      return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
      a, b = walk(node.left), walk(node.right)
      if isinstance(node.op, ast.Add):
        return a + b
      if isinstance(node.op, ast.Sub):
        return a - b
      if isinstance(node.op, ast.Mult):
        return a * b
      if b == 0:
        raise ZeroDivisionError
      return a / b
    raise TypeError(type(node).__name__)  # **, //, (), calls, ...

  try:
    return walk(tree)
  except (ZeroDivisionError, TypeError):
    return None


class ReferenceVersusPythonTest(absltest.TestCase):

  def test_device_matches_ragen_style_float_eval(self):
    c = CountdownDifferentialTest
    if not hasattr(c, "dev"):
      c.setUpClass()
    allowed = set(b"0123456789+-*/() ")
    n = 0
    for i in range(c.n):
      text = bytes(c.answers[i]).split(b"\0")[0]
      if (c.inv_tol[i] != 100_000 or not set(text) <= allowed or b"**" in text
          or b"//" in text):
        continue
      want = _ragen_style_reward(text.decode(), list(c.numbers[i, :c.count[i]]),
                                 int(c.target[i]))
      self.assertEqual(float(c.dev.reward[i]), float(np.float32(want)), text)
      n += 1
    self.assertGreater(n, 1000)

  def test_reference_matches_python_arithmetic(self):
    # Space as the only whitespace (Python rejects a top-level newline).
    rng = np.random.default_rng(9)
    texts = ["".join(rng.choice(list("0123456789+-*/() "), int(rng.integers(1, 16))))
             for _ in range(6000)]
    texts += [_tree(rng, [str(x) for x in rng.integers(0, 100, int(rng.integers(1, 5)))])
              for _ in range(3000)]
    texts += ["".join(p) for p in itertools.product("1-(*) ", repeat=4)]
    n_valued = 0
    for text in texts:
      want = _python_value(text)
      _, got = ref.evaluate_expression(text)
      self.assertEqual(got, want, text)
      n_valued += want is not None
    self.assertGreater(n_valued, 3000)


class HypothesisTest(absltest.TestCase):

  @hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
  @hypothesis.given(
      st.one_of(st.binary(max_size=40),
                st.text(alphabet="0123456789+-*/() =.\t", max_size=40).map(str.encode)),
      st.lists(st.integers(1, 99), min_size=3, max_size=4),
      st.integers(-10, 400))
  def test_device_equals_reference(self, answer, nums, target):
    a = countdown.encode_answer(answer, 48)
    padded = np.array(nums + [0] * (4 - len(nums)), np.int32)
    params = countdown.make_params()
    reward, info = _single(a, padded, np.int32(len(nums)), np.int32(target), params)
    r = ref.reference_reward(a, nums, target)
    self.assertEqual(float(reward), float(np.float32(r.reward)), (answer, r))
    self.assertEqual(bool(info["numbers_ok"]), r.numbers_ok)
    self.assertEqual(bool(info["well_formed"]), r.well_formed)


_single = jax.jit(countdown.countdown_reward)


if __name__ == "__main__":
  absltest.main()
