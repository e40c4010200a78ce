"""Tests of the benchmarks' shared timing functions."""

from unittest import mock

from absl.testing import absltest

from experiments.benchmarks import timing


class InterleavedSecondsTest(absltest.TestCase):

  def test_rounds_alternate_order_and_time_every_call(self):
    calls = []
    delays = {"a": [0.03, 0.01, 0.02], "b": [0.02, 0.03, 0.005]}
    # A fake clock that only the calls advance: the measured times are exact,
    # whatever else the machine is running (a real sleep overshoots under load).
    clock = [100.0]

    def make(name):
      def fn():
        calls.append(name)
        clock[0] += delays[name][sum(c == name for c in calls) - 1]
        return name
      return fn

    synced = []
    with mock.patch.object(timing.time, "perf_counter", lambda: clock[0]):
      secs = timing.interleaved_seconds(
          {"a": (make("a"), synced.append), "b": (make("b"), synced.append)}, 3)
    self.assertEqual(calls, ["a", "b", "b", "a", "a", "b"])
    self.assertEqual(synced, calls)  # each result goes through its sync
    for name in "ab":
      self.assertLen(secs[name], 3)
      for got, want in zip(secs[name], delays[name]):
        self.assertAlmostEqual(got, want, places=9)

  def test_bad_repeats_raise(self):
    with self.assertRaisesRegex(ValueError, "repeats must be >= 1, got 0"):
      timing.interleaved_seconds({"a": (lambda: None, lambda _: None)}, 0)


if __name__ == "__main__":
  absltest.main()
