"""README.md's tour runs as written and does what its comments say."""

import pathlib

from absl.testing import absltest
import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def tour_source() -> str:
  """The Python block under "## A short tour"."""
  section = README.read_text().split("## A short tour", 1)[1]
  return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.smoke
class ReadmeTourTest(absltest.TestCase):

  def test_tour_runs_100_random_steps_of_1024_levels(self):
    namespace = {}
    exec(compile(tour_source(), str(README), "exec"), namespace)  # pylint: disable=exec-used
    rewards, done = np.asarray(namespace["rewards"]), np.asarray(namespace["done"])
    self.assertEqual((rewards.shape, rewards.dtype), ((100, 1024), np.float32))
    self.assertEqual((done.shape, done.dtype), ((1024,), np.bool_))
    # "one XLA program": the whole play is one jitted function.
    self.assertEqual(namespace["random_play"]._cache_size(), 1)
    # Each episode's rewards stop when it ends: when solved (+10 and +1 for the
    # box on target, -0.1 a step), else at the time limit of 100 steps.
    solved = rewards.max(axis=0) > 5
    steps = (rewards != 0).sum(axis=0)
    self.assertTrue(done.all())
    self.assertTrue(solved.any() and not solved.all(), solved.mean())
    np.testing.assert_array_equal(steps[~solved], 100)
    self.assertTrue(np.all(steps[solved] <= 100))
    self.assertLess(steps[solved].mean(), 100)

if __name__ == "__main__":
  absltest.main()
