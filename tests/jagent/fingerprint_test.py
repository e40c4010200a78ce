"""Tests of ``jagent._src.fingerprint``: keys equal exactly for objects of equal content."""

import functools
from unittest import mock

from absl.testing import absltest
from flax import struct
import jax
import jax.numpy as jnp
import numpy as np

from jagent._src.fingerprint import fingerprint


class _Game:

  def __init__(self, size, table=None):
    self.size = size
    self.table = table

  @functools.cached_property
  def derived(self):
    return self.size * 2

  def move(self):
    return self.size


@struct.dataclass
class _Params:
  rate: jax.Array
  name: str = struct.field(pytree_node=False, default="a")


class FingerprintTest(absltest.TestCase):

  def test_equal_content_equal_keys(self):
    a, b = _Game(4, np.arange(6).reshape(2, 3)), _Game(4, np.arange(6).reshape(2, 3))
    self.assertIsNot(a, b)
    self.assertEqual(fingerprint(a), fingerprint(b))
    self.assertEqual(hash(fingerprint(a)), hash(fingerprint(b)))
    # A value a cached_property computed derives from the rest: left out.
    self.assertEqual(a.derived, 8)
    self.assertEqual(fingerprint(a), fingerprint(b))
    self.assertEqual(fingerprint(_Params(jnp.float32(0.5))), fingerprint(_Params(np.float32(0.5))))
    self.assertEqual(fingerprint(jax.random.key(3)), fingerprint(jax.random.key(3)))

  def test_any_difference_differs(self):
    base = fingerprint(_Game(4, np.arange(6).reshape(2, 3)))
    for other in (_Game(5, np.arange(6).reshape(2, 3)),  # an attribute
                  _Game(4, np.arange(6).reshape(3, 2)),  # a shape
                  _Game(4, np.arange(6).reshape(2, 3).astype(np.int8)),  # a dtype
                  _Game(4, np.arange(1, 7).reshape(2, 3)),  # a value
                  _Game(4.0, np.arange(6).reshape(2, 3))):  # 4.0 is not 4
      self.assertNotEqual(fingerprint(other), base)
    self.assertNotEqual(fingerprint(_Params(jnp.float32(0.5))),
                        fingerprint(_Params(jnp.float32(0.25))))
    self.assertNotEqual(fingerprint(_Params(jnp.float32(0.5), "b")),
                        fingerprint(_Params(jnp.float32(0.5))))
    self.assertNotEqual(fingerprint(jax.random.key(3)), fingerprint(jax.random.key(4)))
    self.assertNotEqual(fingerprint((1, 2)), fingerprint([1, 2]))
    # A patched method is another class behaviour: another key.
    with mock.patch.object(_Game, "move", lambda self: 0):
      self.assertNotEqual(fingerprint(_Game(4, np.arange(6).reshape(2, 3))), base)
    self.assertEqual(fingerprint(_Game(4, np.arange(6).reshape(2, 3))), base)

  def test_what_it_cannot_look_into_equals_nothing(self):
    a = _Game(4)
    a.table = a  # a cycle
    self.assertNotEqual(fingerprint(a), fingerprint(a))
    unhashable = type("Unhashable", (), {"__slots__": (), "__hash__": None})()
    self.assertNotEqual(fingerprint(unhashable), fingerprint(unhashable))
    deep = 0
    for _ in range(20):
      deep = (deep,)
    self.assertNotEqual(fingerprint(deep), fingerprint(deep))
    self.assertEqual(fingerprint(((((0,),),),)), fingerprint(((((0,),),),)))


if __name__ == "__main__":
  absltest.main()
