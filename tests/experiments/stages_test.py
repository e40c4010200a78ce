"""Tests of ``experiments.stages``: one stage program, K steps a call.

The evidence that chunking changes nothing: ``experiments.train`` runs of the
same config one step a program call and four steps a call (SFT and RL, the
collapse diagnostics inside the scanned iteration) end with the same
parameters and write the same records, bit for bit. The chunk boundaries and
the per-step records are checked by hand on small configs.
"""

import math
import os
import shutil
import tempfile

from absl.testing import absltest
import jax
import numpy as np
import pytest

from experiments import experiment
from experiments import spec
from experiments import stages
from experiments import train as train_job
from experiments.configs import tiny
from jagent import train as jtrain
from tests.experiments import train_test


def _config():
  """train_test's smallest run with 4 SFT and 4 RL steps, diagnosed at steps 1 and 4."""
  c = train_test._smallest_config()
  c.sft.steps = 4
  c.rl.steps = 4
  c.checkpoint.update(dict(every=0, keep=1))
  c.diagnostics.update(dict(every=4, num_rows=4))
  return c


def _chunking(**fields):
  c = tiny.get_config("Bandit-v0,grpo")
  c.rl.steps = 100
  c.eval.every = c.checkpoint.every = c.diagnostics.every = 0
  c.rl.empty_stop_steps = 0
  c.sft.steps = 120
  for k, v in fields.items():
    group, name = k.split("__")
    c[group][name] = v
  return c


class ChunkingTest(absltest.TestCase):

  def test_train_chunk_is_the_common_interval(self):
    self.assertEqual(stages.train_chunk(_chunking()), 10)  # a tenth of rl.steps
    self.assertEqual(stages.train_chunk(_chunking(eval__every=50, checkpoint__every=50,
                                                  diagnostics__every=25)), 25)
    self.assertEqual(stages.train_chunk(_chunking(eval__every=4, diagnostics__every=6)), 2)
    self.assertEqual(stages.train_chunk(_chunking(eval__every=4), 3), 3)
    with self.assertRaisesRegex(ValueError, "--chunk_steps"):
      stages.train_chunk(_chunking(), -1)

  def test_chunks_end_on_evaluations_checkpoints_and_possible_stops(self):
    c = _chunking(eval__every=50, checkpoint__every=20, diagnostics__every=25)

    def ends(chunk, streak=0):
      out, start = [], 0
      while start < c.rl.steps:
        start = stages.chunk_end(c, start, chunk, streak)
        out.append(start)
      return out

    self.assertEqual(ends(7), [7, 14, 20, 25, 32, 39, 40, 47, 50, 57, 60, 67, 74, 75, 80, 87,
                               94, 100])
    self.assertEqual(ends(100), [20, 25, 40, 50, 60, 75, 80, 100])
    c.rl.empty_stop_steps = 3  # a stop can only come at a chunk's last step
    self.assertEqual(stages.chunk_end(c, 0, 100), 3)
    self.assertEqual(stages.chunk_end(c, 10, 100, empty_streak=2), 11)
    self.assertEqual(stages.chunk_end(c, 10, 100, empty_streak=5), 11)
    c = _chunking()
    self.assertEqual([stages.sft_chunk_end(c, s) for s in (0, 10, 40, 50, 110)],
                     [10, 20, 50, 60, 120])  # gcd(50, 120) = 10
    self.assertEqual([stages.sft_chunk_end(c, s, 30) for s in (0, 30, 50, 80, 100)],
                     [30, 50, 80, 100, 120])  # cut at the logged steps (50, 100, 120)

  def test_step_records_unstack_and_leave_out_what_was_not_measured(self):
    m = {"train/updates_applied": np.float32([1, 0]), "actor/entropy": np.float32([0.5, np.nan]),
         "collapse/replies": np.float32([np.nan, 4]), "loss/total": np.float32([np.inf, 1]),
         "rollout/sampled_tokens": np.float32([10, 30]), "rollout/env_turns": np.float32([2, 4]),
         "train/context_tokens": np.float32([8, 0])}
    a, b = stages.step_records(m, 4.0)
    self.assertEqual(a, {"train/updates_applied": 1.0, "actor/entropy": 0.5,
                         "loss/total": math.inf,  # trained: a diverging loss shows
                         "rollout/sampled_tokens": 10.0, "rollout/env_turns": 2.0,
                         "train/context_tokens": 8.0, "time/step_seconds": 2.0,
                         "throughput/rollout_tokens_per_s": 5.0,
                         "throughput/env_turns_per_s": 1.0,
                         "throughput/train_tokens_per_s": 4.0})
    self.assertNotIn("actor/entropy", b)  # nothing trained: not measured
    self.assertEqual((b["collapse/replies"], b["loss/total"], b["time/step_seconds"],
                      b["throughput/rollout_tokens_per_s"]), (4.0, 1.0, 2.0, 15.0))


class ProgramKeysTest(absltest.TestCase):

  def test_programs_are_keyed_by_what_they_read(self):
    def keys(**changes):
      c = _config()
      for k, v in changes.items():
        group, _, name = k.partition("__")
        if name:
          c[group][name] = v
        else:
          c[group] = v
      st = stages.make_stages(spec.RunSpec.from_config(c))
      return {**st.keys, "eval": st.rollout_key("eval_temp")}

    base = keys()
    seeded = keys(seed=7)
    self.assertEqual(seeded, base)  # keys are arguments: every program shared
    lr = keys(rl__learning_rate=3e-3)
    self.assertNotEqual(lr["rl"], base["rl"])
    self.assertEqual((lr["sft"], lr["eval"]), (base["sft"], base["eval"]))
    algo = keys(algorithm_kwargs__entropy_coef=0.01)
    self.assertNotEqual(algo["rl"], base["rl"])
    self.assertEqual((algo["sft"], algo["eval"]), (base["sft"], base["eval"]))
    temp = keys(eval__temperature=0.9)
    self.assertEqual((temp["rl"], temp["sft"]), (base["rl"], base["sft"]))
    self.assertNotEqual(temp["eval"], base["eval"])
    sft = keys(sft__learning_rate=1e-2)
    self.assertEqual((sft["rl"], sft["eval"]), (base["rl"], base["eval"]))
    self.assertNotEqual(sft["sft"], base["sft"])


def _final_state(config, workdir):
  exp = experiment.Experiment(config)
  ckpt = exp.checkpointer(workdir)
  state, _ = ckpt.restore(exp.rl_state_target())
  ckpt.close()
  return state


def _records(workdir):
  return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))}
          for r in jtrain.read_metrics(os.path.join(workdir, "metrics.jsonl"))]


@pytest.mark.heavy
class ChunkedTrainTest(absltest.TestCase):

  def test_one_step_and_four_step_chunks_give_the_same_run(self):
    root = tempfile.mkdtemp(prefix="stages_test_")
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    config = _config()
    runs = {}
    for chunk in (1, 4):
      workdir = os.path.join(root, str(chunk))
      summary = train_job.run(config, workdir, progress=False, chunk=chunk)
      runs[chunk] = (summary, _records(workdir), _final_state(config, workdir))
    (s1, r1, st1), (s4, r4, st4) = runs[1], runs[4]
    self.assertEqual(s4["steps"], 4)
    self.assertEqual({k: v for k, v in s4.items() if k != "seconds"},
                     {k: v for k, v in s1.items() if k != "seconds"})
    self.assertEqual([r["step"] for r in r4], [r["step"] for r in r1])
    self.assertEqual(r4, r1)
    # The diagnostics ran inside the one scanned chunk of four, on steps 1 and 4.
    self.assertEqual(stages.chunk_end(config, 0, 4), 4)
    self.assertEqual([r["step"] for r in r4 if "collapse/replies" in r], [1, 4])
    self.assertLen([r for r in r4 if "rollout/success" in r], 4)
    leaves1, leaves4 = jax.tree.leaves_with_path(st1), jax.tree.leaves(st4)
    self.assertLen(leaves4, len(leaves1))
    for (path, a), b in zip(leaves1, leaves4):
      if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
        a, b = jax.random.key_data(a), jax.random.key_data(b)
      np.testing.assert_array_equal(np.asarray(b), np.asarray(a),
                                    err_msg=jax.tree_util.keystr(path))


if __name__ == "__main__":
  absltest.main()
