"""What a benchmark says when a peer is missing (experiments.benchmarks.peers.missing)."""

import importlib.util
from unittest import mock

from absl.testing import absltest

from experiments.benchmarks import peers


def _installed(*names):
  return lambda name, *args: object() if name in names else None


class MissingPeerTest(absltest.TestCase):

  def test_names_what_is_missing_and_the_extra(self):
    with mock.patch.object(importlib.util, "find_spec", _installed("transformers")):
      self.assertEqual(peers.missing(("torch", "transformers"), "hf"),
                       "torch is not installed: pip install -e .[hf]")
    with mock.patch.object(importlib.util, "find_spec", _installed()):
      self.assertEqual(peers.missing(("torch", "transformers"), "hf"),
                       "torch and transformers are not installed: pip install -e .[hf]")
    with mock.patch.object(importlib.util, "find_spec", _installed("torch", "transformers")):
      self.assertIsNone(peers.missing(("torch", "transformers"), "hf"))

  def test_a_real_lookup(self):
    self.assertIsNone(peers.missing(("numpy",), "test"))
    self.assertEqual(peers.missing(("no_such_module_xyz",), "bench"),
                     "no_such_module_xyz is not installed: pip install -e .[bench]")


if __name__ == "__main__":
  absltest.main()
