"""Tests of the benchmarks' shared timing helpers."""

import time

from absl.testing import absltest

from experiments.benchmarks import timing


class InterleavedBestSecondsTest(absltest.TestCase):

  def test_rounds_alternate_order_and_keep_each_best(self):
    calls = []
    delays = {"a": [0.03, 0.01, 0.02], "b": [0.02, 0.03, 0.005]}

    def make(name):
      def fn():
        calls.append(name)
        time.sleep(delays[name][sum(c == name for c in calls) - 1])
        return name
      return fn

    synced = []
    best = timing.interleaved_best_seconds(
        {"a": (make("a"), synced.append), "b": (make("b"), synced.append)}, 3)
    self.assertEqual(calls, ["a", "b", "b", "a", "a", "b"])
    self.assertEqual(synced, calls)  # each result goes through its sync
    # Best = the shortest sleep (plus call overhead, well under 5 ms).
    self.assertBetween(best["a"], 0.01, 0.015)
    self.assertBetween(best["b"], 0.005, 0.01)

  def test_bad_repeats_raise(self):
    with self.assertRaisesRegex(ValueError, "repeats must be >= 1, got 0"):
      timing.interleaved_best_seconds({"a": (lambda: None, lambda _: None)}, 0)


if __name__ == "__main__":
  absltest.main()
