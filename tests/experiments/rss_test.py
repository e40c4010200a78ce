"""Tests of the benchmarks' one peak-memory reader."""

import os
import subprocess
import sys

from absl.testing import absltest
import numpy as np

from experiments.benchmarks import rss

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PeakRssTest(absltest.TestCase):

  def test_grows_by_a_touched_buffer(self):
    before = rss.peak_rss_mb()
    buf = np.ones(256 * 1024 * 1024 // 8)  # 256 MiB, every page written
    after = rss.peak_rss_mb()
    del buf
    self.assertGreater(before, 0.0)
    # The peak can only rise; by the buffer unless it was already higher.
    self.assertGreaterEqual(after, max(before, 240.0))

  def test_the_trl_side_imports_no_jax(self):
    # The TRL virtualenv has no JAX: its side may import rss, nothing that needs jax.
    code = ("import sys, experiments.benchmarks.peer_rl_trl; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jagent')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=_ROOT, capture_output=True,
                         text=True, check=True).stdout
    self.assertEqual(out.strip(), "[]")


if __name__ == "__main__":
  absltest.main()
