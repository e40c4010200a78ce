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
from jagent.train import _metrics

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
                     "bad": {2: float("nan"), 3: jnp.float32(-jnp.inf)}.get(step, 0.0)})
    w.close()
    path = os.path.join(self.workdir, "metrics.jsonl")
    records = train.read_metrics(path)
    self.assertEqual([r["step"] for r in records], [1, 2, 3, 4, 5])
    self.assertAlmostEqual(records[2]["loss"], 0.3, places=6)
    self.assertEqual(records[3]["n"], 4.0)
    # Non-finite values are written (a diverging loss must show) and read back.
    self.assertTrue(math.isnan(records[1]["bad"]))
    self.assertEqual(records[2]["bad"], -math.inf)
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
    with self.assertRaisesRegex(ValueError, "none of"):
      w.plot(png, panels=[train.PlotPanel("gone", "missing")])
    with self.assertRaisesRegex(ValueError, "not both"):
      w.plot(png, ["a"], panels=[train.PlotPanel("a", "a")])

  def test_plot_with_panels_returns_the_keys_drawn(self):
    w = train.MetricsWriter(self.workdir, tensorboard=False)
    for step in range(1, 6):
      w.write(step, {"loss": 1.0 / step, "acc": step / 5})
    png = os.path.join(self.workdir, "curves.png")
    drawn = w.plot(png, panels=[
        train.PlotPanel("Accuracy", ("acc", "absent")),
        train.PlotPanel("Collapse", "collapse/mutual_info"),
        train.PlotPanel("Loss", ("loss", "acc"))], title="run")
    w.close()
    self.assertEqual(drawn, ["acc", "loss"])
    self.assertGreater(os.path.getsize(png), 1000)

  def test_smooth_curve_is_the_debiased_ema(self):
    # By hand, smoothing 0.5: each point is the mean of the values so far
    # weighted 0.5 ** age: 1; (0.5 + 3) / 1.5; (0.25 + 1.5 + 2) / 1.75;
    # (0.125 + 0.75 + 1 + 6) / 1.875.
    np.testing.assert_allclose(train.smooth_curve([1.0, 3.0, 2.0, 6.0], 0.5),
                               [1.0, 3.5 / 1.5, 3.75 / 1.75, 7.875 / 1.875])
    np.testing.assert_allclose(train.smooth_curve([4.0, -2.0], 0.0), [4.0, -2.0])
    self.assertEqual(train.smooth_curve([], 0.9).shape, (0,))
    # A constant stays constant from the first point (no pull towards 0).
    np.testing.assert_allclose(train.smooth_curve([7.0] * 5, 0.99), [7.0] * 5)
    for bad in (1.0, -0.1):
      with self.assertRaisesRegex(ValueError, "smoothing"):
        train.smooth_curve([1.0], bad)

  def test_spec_validation(self):
    panel = train.PlotPanel("one", "a")
    self.assertEqual(panel.series, (train.PlotSeries(("a",)),))
    self.assertEqual(train.PlotSeries("a").keys, ("a",))
    with self.assertRaisesRegex(ValueError, "non-empty str"):
      train.PlotSeries(())
    with self.assertRaisesRegex(ValueError, "at least one series"):
      train.PlotPanel("none", ())
    with self.assertRaisesRegex(ValueError, "smoothing"):
      train.PlotPanel("p", "a", smoothing=1.0)
    with self.assertRaisesRegex(ValueError, "xlim"):
      train.PlotPanel("p", "a", xlim=(0, 1, 2))


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


def _run_records():
  """Records shaped like experiments.train's: SFT at steps <= 0, then RL."""
  records = [{"step": -100, "sft/nll": 2.0, "train/grad_norm": 9.0},
             {"step": 0, "sft/nll": 1.0, "train/grad_norm": 8.0},
             {"step": 0, "eval/sft/success": 0.25, "eval/sft/greedy_success": 0.5}]
  for step in range(1, 7):
    records.append({"step": step, "rollout/success": step / 10,
                    "filter/reward_std_before": 1.0, "filter/reward_std_after": 2.0,
                    "train/updates_applied": 0.0 if step == 3 else 1.0,
                    "train/grad_norm": float("nan") if step == 2 else float(step)})
    if step != 3:  # step 3 trained nothing: the run leaves its entropy out
      records[-1]["actor/entropy"] = 0.5 + step
  records[-3]["eval/success"] = 0.3  # step 4
  records.append({"step": 6, "eval/rl/success": 0.4, "eval/rl/greedy_success": 0.6})
  return records


_PANELS = (
    train.PlotPanel("Eval success (T=0.5)",
                    train.PlotSeries(("eval/sft/success", "eval/success",
                                      "eval/greedy_success", "eval/rl/success"),
                                     "evaluations", sparse=True),
                    ylim=(0.0, 1.0), baseline="eval/sft/success", baseline_label="SFT"),
    train.PlotPanel("Collapse (nats)", ("collapse/reply_entropy", "collapse/mutual_info")),
    train.PlotPanel("Reward std", ("filter/reward_std_before", "filter/reward_std_after",
                                   "filter/absent"), smoothing=0.5),
    train.PlotPanel("Entropy", "actor/entropy", smoothing=0.5, min_step=1),
    train.PlotPanel("Grad norm", "train/grad_norm", baseline=1.0, min_step=1),
    train.PlotPanel("Greedy", train.PlotSeries("eval/rl/greedy_success", sparse=True),
                    baseline="eval/sft/absent"),
)


class PlotPanelsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.workdir, ignore_errors=True)

  def test_layout_keys_baselines_and_points(self):
    records = _run_records()
    png = os.path.join(self.workdir, "curves.png")
    drawn = train.plot_metrics(records, png, _PANELS, ncols=4, title="a run")
    with open(png, "rb") as fh:
      self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
    self.assertGreater(os.path.getsize(png), 10_000)
    # The collapse panel (no key written) is left out; the rest keep their order.
    self.assertEqual([p.title for p in drawn],
                     ["Eval success (T=0.5)", "Reward std", "Entropy", "Grad norm", "Greedy"])
    self.assertEqual([[s.keys for s in p.series] for p in drawn], [
        [("eval/sft/success", "eval/success", "eval/rl/success")],
        [("filter/reward_std_before",), ("filter/reward_std_after",)],
        [("actor/entropy",)], [("train/grad_norm",)], [("eval/rl/greedy_success",)]])
    # Baselines: the SFT record's value, a number, and a missing key (none).
    self.assertEqual([p.baseline for p in drawn], [0.25, None, None, 1.0, None])

    layout = _metrics._layout(records, _PANELS)
    (_, [(_, steps, values)]) = layout[0]  # merged in step order
    np.testing.assert_array_equal(steps, [0, 4, 6])
    np.testing.assert_array_equal(values, [0.25, 0.3, 0.4])
    (_, [(_, steps, values)]) = layout[2]  # step 3 had no update: a gap
    np.testing.assert_array_equal(steps, [1, 2, 4, 5, 6])
    np.testing.assert_array_equal(values, [1.5, 2.5, 4.5, 5.5, 6.5])
    (_, [(_, steps, values)]) = layout[3]  # no SFT steps, no NaN
    np.testing.assert_array_equal(steps, [1, 3, 4, 5, 6])

  def test_drawn_panel_raw_under_ema_legend_and_limits(self):
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
    layout = _metrics._layout(_run_records(), _PANELS)
    fig = Figure()
    # Two per-step series: each raw and faint, then its EMA, stated in the legend.
    panel, lines = layout[1]
    ax = fig.add_subplot(1, 3, 1)
    _metrics._draw_panel(ax, panel, lines)
    self.assertEqual(ax.get_title(), "Reward std")
    raw, ema = ax.lines[2], ax.lines[3]  # the second series
    self.assertEqual(raw.get_alpha(), 0.25)
    np.testing.assert_array_equal(raw.get_ydata(), [2.0] * 6)
    self.assertIsNone(ema.get_alpha())
    self.assertEqual([t.get_text() for t in ax.get_legend().get_texts()],
                     ["filter/reward_std_before, EMA 0.5",
                      "filter/reward_std_after, EMA 0.5"])
    # The EMA drawn is smooth_curve of the points kept.
    panel, lines = layout[2]
    ax = fig.add_subplot(1, 3, 2)
    _metrics._draw_panel(ax, panel, lines)
    np.testing.assert_allclose(ax.lines[1].get_ydata(),
                               train.smooth_curve([1.5, 2.5, 4.5, 5.5, 6.5], 0.5))
    self.assertEqual([t.get_text() for t in ax.get_legend().get_texts()], ["EMA 0.5"])
    # Sparse: points and lines, no EMA; the baseline dashed, with its value;
    # the success axis fixed to 0-1 (with a small margin).
    panel, lines = layout[0]
    ax = fig.add_subplot(1, 3, 3)
    _metrics._draw_panel(ax, panel, lines)
    self.assertLen(ax.lines, 2)
    self.assertEqual(ax.lines[0].get_marker(), "o")
    self.assertEqual(ax.lines[1].get_linestyle(), "--")
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), [0.25, 0.25])
    self.assertEqual([t.get_text() for t in ax.get_legend().get_texts()],
                     ["evaluations (last 0.4)", "SFT 0.25"])
    lo, hi = ax.get_ylim()
    self.assertAlmostEqual(lo, -0.03)
    self.assertAlmostEqual(hi, 1.03)

  def test_a_panel_of_only_non_finite_values_says_so(self):
    records = [{"step": s, "loss": float("nan")} for s in range(3)]
    png = os.path.join(self.workdir, "curves.png")
    drawn = train.plot_metrics(records, png, [train.PlotPanel("Loss", "loss")])
    self.assertEqual([s.keys for s in drawn[0].series], [("loss",)])
    with self.assertRaisesRegex(ValueError, "none of the panels"):
      train.plot_metrics(records, png, [train.PlotPanel("X", "x")])


class SeedCurvesTest(absltest.TestCase):

  def test_seed_band_by_hand(self):
    # Without smoothing: a NaN step is interpolated from its neighbours (seed
    # 0, step 2) or held at the last value (seed 1, step 3).
    mean, low, high = train.seed_band([[1.0, np.nan, 3.0], [3.0, 5.0, np.nan]], 0.0)
    np.testing.assert_allclose(mean, [2.0, 3.5, 4.0])
    np.testing.assert_allclose(low, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(high, [3.0, 5.0, 5.0])
    # With smoothing: each seed's EMA of its finite points (1, 3: 1, 7/3).
    mean, low, high = train.seed_band([[1.0, np.nan, 3.0]], 0.5)
    np.testing.assert_allclose(mean, [1.0, 5.0 / 3.0, 7.0 / 3.0])
    np.testing.assert_array_equal(mean, low)
    np.testing.assert_array_equal(mean, high)
    mean, _, _ = train.seed_band([[np.nan, np.nan], [1.0, 2.0]], 0.0)
    np.testing.assert_array_equal(np.isnan(mean), [True, True])
    with self.assertRaisesRegex(ValueError, r"shape \(3,\), expected \[seeds, steps\]"):
      train.seed_band([1.0, 2.0, 3.0], 0.0)

  def test_plot_one_line_per_label_seeds_shaded(self):
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
    curves = {"starpo_s": {"rollout/success": [[0.1, 0.2, 0.3], [0.3, 0.4, 0.5]],
                           "actor/entropy": [[1.0, 0.9, 0.8], [1.0, 0.8, 0.6]]},
              "grpo": {"rollout/success": [[0.2, 0.2, 0.2], [0.0, 0.0, 0.0]]}}
    panels = [train.PlotPanel("Success", "rollout/success", ylim=(0, 1), smoothing=0.0,
                              baseline=0.25, baseline_label="SFT"),
              train.PlotPanel("Entropy", "actor/entropy", smoothing=0.0),
              train.PlotPanel("Missing", "x")]
    png = os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "comparison.png")
    drawn = train.plot_seed_curves(curves, png, panels, title="Bandit")
    with open(png, "rb") as fh:
      self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
    self.assertEqual([p.title for p in drawn], ["Success", "Entropy"])
    layout = _metrics._seed_layout(curves, panels)
    self.assertEqual([[label for label, _, _ in lines] for _, lines in layout],
                     [["starpo_s", "grpo"], ["starpo_s"]])
    ax = Figure().add_subplot(1, 1, 1)
    _metrics._draw_seed_panel(ax, *layout[0])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.2, 0.3, 0.4])  # mean of seeds
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [0.1, 0.1, 0.1])
    self.assertLen(ax.collections, 2)  # one band per label
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    self.assertAlmostEqual(band.min(), 0.1)
    self.assertAlmostEqual(band.max(), 0.5)
    self.assertEqual([t.get_text() for t in ax.get_legend().get_texts()],
                     ["starpo_s", "grpo", "SFT 0.25"])
    with self.assertRaisesRegex(ValueError, "none of the panels"):
      train.plot_seed_curves(curves, png, [train.PlotPanel("X", "x")])

  def test_plot_against_a_running_total(self):
    # Equal-budget comparisons: x is the seeds' mean running total of a
    # per-step metric (here sampled tokens), not the step.
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
    curves = {"chain": {"rollout/success": [[0.1, 0.2], [0.3, 0.4]],
                        "rollout/sampled_tokens": [[10.0, 20.0], [30.0, np.nan]]},
              "tree": {"rollout/success": [[0.5, 0.5, 0.5]],
                       "rollout/sampled_tokens": [[5.0, 5.0, 6.0]]}}
    panels = [train.PlotPanel("Success", "rollout/success", smoothing=0.0)]
    layout = _metrics._seed_layout(curves, panels, "rollout/sampled_tokens")
    (_, lines), = layout
    # chain: seeds' totals [10, 30] and [30, 30] (NaN counts 0): mean [20, 30].
    np.testing.assert_allclose(lines[0][1], [20.0, 30.0])
    np.testing.assert_allclose(lines[1][1], [5.0, 10.0, 16.0])
    ax = Figure().add_subplot(1, 1, 1)
    _metrics._draw_seed_panel(ax, *layout[0], x_label="sampled tokens")
    np.testing.assert_allclose(ax.lines[0].get_xdata(), [20.0, 30.0])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.2, 0.3])
    self.assertEqual(ax.get_xlabel(), "sampled tokens")
    png = os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "tokens.png")
    train.plot_seed_curves(curves, png, panels, x_key="rollout/sampled_tokens")
    with self.assertRaisesRegex(ValueError, r"x_key='rollout/x': label 'chain' has no such"):
      train.plot_seed_curves(curves, png, panels, x_key="rollout/x")


if __name__ == "__main__":
  absltest.main()
