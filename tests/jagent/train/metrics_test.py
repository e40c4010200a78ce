"""MetricsWriter: JSON lines, resume without duplicates, TensorBoard, PNG plots."""

import glob
import importlib.util
import math
import os
import shutil
import tempfile

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from jagent import train

HAS_TBX = importlib.util.find_spec("tensorboardX") is not None


class MetricsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.workdir, ignore_errors=True)

  def test_jsonl_and_resume_drops_later_steps(self):
    w = train.MetricsWriter(self.workdir, tensorboard=False)
    self.assertFalse(w.tensorboard)
    for step in range(1, 6):
      w.write(step, {"loss": jnp.float32(step / 10), "n": np.int32(step),
                     "bad": float("nan") if step == 2 else 0.0})
    w.close()
    path = os.path.join(self.workdir, "metrics.jsonl")
    records = train.read_metrics(path)
    self.assertEqual([r["step"] for r in records], [1, 2, 3, 4, 5])
    self.assertAlmostEqual(records[2]["loss"], 0.3, places=6)
    self.assertEqual(records[3]["n"], 4.0)
    self.assertTrue(math.isnan(records[1]["bad"]))
    # Crash after the checkpoint of step 3: steps 4 and 5 are written again.
    w = train.MetricsWriter(self.workdir, resume_step=3, tensorboard=False)
    for step in (4, 5, 6):
      w.write(step, {"loss": -1.0})
    w.close()
    records = train.read_metrics(path)
    self.assertEqual([r["step"] for r in records], [1, 2, 3, 4, 5, 6])
    self.assertEqual([r["loss"] for r in records[3:]], [-1.0] * 3)
    self.assertAlmostEqual(records[2]["loss"], 0.3, places=6)

  def test_a_record_cut_short_by_a_crash_is_skipped(self):
    path = os.path.join(self.workdir, "metrics.jsonl")
    with open(path, "w") as f:
      f.write('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.2}\n{"step": 3, "lo')
    self.assertEqual([r["step"] for r in train.read_metrics(path)], [1, 2])
    # Resumed from the checkpoint of step 2: the cut record is gone.
    w = train.MetricsWriter(self.workdir, resume_step=2, tensorboard=False)
    w.write(3, {"loss": 0.1})
    w.close()
    self.assertEqual([(r["step"], r["loss"]) for r in train.read_metrics(path)],
                     [(1, 0.5), (2, 0.2), (3, 0.1)])
    # Appended to (no checkpoint yet): the cut line is dropped first.
    with open(path, "a") as f:
      f.write('{"step": 4, "lo')
    w = train.MetricsWriter(self.workdir, tensorboard=False)
    w.write(4, {"loss": 0.0})
    w.close()
    self.assertEqual([r["step"] for r in train.read_metrics(path)], [1, 2, 3, 4])
    # A whole record that lost only its newline is kept, and ended first.
    with open(path, "a") as f:
      f.write('{"step": 5}')
    self.assertEqual([r["step"] for r in train.read_metrics(path)], [1, 2, 3, 4, 5])
    w = train.MetricsWriter(self.workdir, tensorboard=False)
    w.write(6, {"loss": 0.0})
    w.close()
    self.assertEqual([r["step"] for r in train.read_metrics(path)], [1, 2, 3, 4, 5, 6])
    # A bad line that is not the last one is corruption, named with its line.
    with open(path, "a") as f:
      f.write("not json\n{\"step\": 5}\n")
    with self.assertRaisesRegex(ValueError, r"metrics.jsonl: line 7 is not a JSON record"):
      train.read_metrics(path)

  def test_bad_values_raise(self):
    w = train.MetricsWriter(self.workdir, tensorboard=False)
    with self.assertRaisesRegex(ValueError, "scalar"):
      w.write(1, {"v": np.zeros(3)})
    with self.assertRaisesRegex(ValueError, "step"):
      w.write(1, {"step": 1.0})
    w.close()

  def test_plot_writes_a_png(self):
    w = train.MetricsWriter(self.workdir, tensorboard=False)
    for step in range(10):
      w.write(step, {"a": step ** 2, "b": -step, "c": float("inf")})
    png = os.path.join(self.workdir, "curves.png")
    drawn = w.plot(png, ["a", "c", "missing"])
    w.close()
    self.assertEqual(drawn, ["a", "c"])
    with open(png, "rb") as fh:
      self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
    with self.assertRaisesRegex(ValueError, "none of"):
      w.plot(png, ["missing"])

  def test_tensorboard(self):
    if not HAS_TBX:
      with self.assertRaisesRegex(ImportError, "tensorboardX"):
        train.MetricsWriter(self.workdir, tensorboard=True)
      self.assertFalse(train.MetricsWriter(self.workdir).tensorboard)
      return
    w = train.MetricsWriter(self.workdir, tensorboard=True)
    self.assertTrue(w.tensorboard)
    for step in range(3):
      w.write(step, {"loss": 1.0 / (step + 1)})
    w.close()
    events = glob.glob(os.path.join(self.workdir, "tensorboard", "events.*"))
    self.assertLen(events, 1)
    self.assertGreater(os.path.getsize(events[0]), 0)
    w = train.MetricsWriter(self.workdir, resume_step=1)
    self.assertTrue(w.tensorboard)  # default: used when installed
    w.close()


if __name__ == "__main__":
  absltest.main()
