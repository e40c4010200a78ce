"""Two processes on one machine run the main job on one 4-device mesh.

``python -m experiments.train --distributed`` in two subprocesses on
localhost (``jax.distributed.initialize`` with a free port; 2 fake CPU devices
each; gloo collectives, jax 0.10.2's CPU default) runs 3 RL steps of a shrunk
tiny config (Bandit, the ``nano`` model, 2 SFT steps, 2 x 2 rollouts, PPO
with a value head so every step moves the policy, 4 evaluation levels) with
``--config.mesh=data:4``. A third subprocess runs the same command as one
process with 4 devices. Their metrics (every record, evaluations included)
and final states must agree to rel. 1e-5 (the collectives add in another
order). The checkpoint of the two processes restores here onto another mesh
((2, 2, 2) of this process's 8 devices) and onto one device, equal to the
one-process run's. Only process 0 writes metrics, samples, the policy and
eval_summary.json. All three compile with the suite's fast-compile flags
(``tests/testenv.py``; the same flags, so the same numerics).

Also: a bad ``config.mesh`` (spec, device count, rows not divisible by
``data x fsdp``) is a ValueError naming ``config.mesh`` before any compile.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

from absl.testing import absltest
import jax
import numpy as np
import pytest

from experiments import eval as eval_job
from experiments import experiment
from experiments import spec
from experiments.configs import tiny
from jagent import train as jtrain
from tests import testenv

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STEPS = 3
_OVERRIDES = {
    "model": "nano", "rollout.num_groups": 2, "rollout.group_size": 2, "rl.num_microbatches": 1,
    "rollout.max_tokens_per_turn": 12,
    # 2 SFT steps of 4 random-answer demonstrations: rows from each process
    # (jagent.sharding.global_rows).
    "sft.expert": "random", "sft.num_demos": 8, "sft.steps": 2, "sft.batch_size": 4,
    "sft.learning_rate": 1e-5, "sft.warmup_steps": 0, "rl.steps": _STEPS,
    # lr 1e-5: Adam moves a weight whose gradient is float noise by up to lr
    # per step, in whichever direction the noise points (measured at 1e-3:
    # 15 of 32768 embedding weights 3e-6 apart after 3 steps).
    "rl.learning_rate": 1e-5, "rl.warmup_steps": 0, "rl.decay": "constant",
    "eval.num_levels": 4, "eval.num_groups": 4, "eval.every": 0, "eval.greedy": False,
    "eval.samples": 1, "checkpoint.every": _STEPS, "checkpoint.keep": 2,
    **testenv.WITHOUT_EXTRAS,
}
_ARG = "Bandit-v0,ppo"


def _config(mesh: str):
  c = tiny.get_config(_ARG)
  for dotted, v in _OVERRIDES.items():
    node = c
    *parents, leaf = dotted.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  c.mesh = mesh
  return c


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _deterministic(record):
  return {k: v for k, v in record.items()
          if not (k.startswith(("time/", "throughput/")) or k.endswith("_per_s"))}


def _leaves(state):
  return [(jax.tree_util.keystr(path), np.asarray(jax.device_get(x)))
          for path, x in jax.tree_util.tree_flatten_with_path(state)[0]]


def _restore(workdir, mesh, step=_STEPS):
  exp = experiment.Experiment(_config(mesh))
  ckpt = exp.checkpointer(workdir)
  steps = ckpt.all_steps()
  state, _ = ckpt.restore(exp.rl_state_target(), step)
  ckpt.close()
  return exp, steps, state


def _summary(stdout):
  """The summary JSON a process printed (gloo's C++ messages interleave), or None."""
  found = re.search(r"^\{\n  \"env\".*?^\}$", stdout, re.DOTALL | re.MULTILINE)
  return None if found is None else json.loads(found.group(0))


@pytest.mark.heavy
class MultiProcessTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(prefix="multihost_test_")
    cls.workdir = os.path.join(cls.root, "two_processes")
    cls.ref_workdir = os.path.join(cls.root, "one_process")
    port = _free_port()
    flags = [f"--config=experiments/configs/tiny.py:{_ARG}", "--config.mesh=data:4",
             *(f"--config.{k}={v}" for k, v in _OVERRIDES.items())]

    def launch(devices, *args):
      env = testenv.subprocess_env(devices)
      return subprocess.Popen([sys.executable, "-m", "experiments.train", *flags, *args],
                              cwd=_ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)

    cls.procs = [launch(2, f"--workdir={cls.workdir}", "--distributed",
                        f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                        f"--process_id={i}") for i in range(2)]
    cls.procs.append(launch(4, f"--workdir={cls.ref_workdir}"))
    cls.outputs = []
    for p in cls.procs:
      try:
        cls.outputs.append(p.communicate(timeout=900))
      except subprocess.TimeoutExpired:
        for q in cls.procs:
          q.kill()
        raise
    for p, (_, err) in zip(cls.procs, cls.outputs):
      if p.returncode:
        raise AssertionError(f"{p.args[-1]}: exit {p.returncode}\n{err[-5000:]}")

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_only_process_0_writes(self):
    summary = _summary(self.outputs[0][0])
    self.assertIsNotNone(summary, self.outputs[0][0][-3000:])
    self.assertEqual(summary["steps"], _STEPS)
    self.assertIsNone(_summary(self.outputs[1][0]))  # process 1 prints no summary
    with open(os.path.join(self.workdir, "eval_summary.json")) as f:
      self.assertEqual(json.load(f)["rl"], summary["rl"])
    self.assertEqual(summary["rl"]["num_levels"], 4)
    for name in ("config.json", "samples/sft.json", "samples/rl.json",
                 "policy/model.safetensors", "curves.png"):
      self.assertTrue(os.path.exists(os.path.join(self.workdir, name)), name)
    # One record per write (none from process 1): the last SFT step and the
    # SFT evaluation at 0, RL steps 1..3, the final evaluation at 3.
    records = jtrain.read_metrics(os.path.join(self.workdir, "metrics.jsonl"))
    self.assertEqual([r["step"] for r in records], [0, 0, 1, 2, 3, 3])
    self.assertIn("sft/nll", records[0])

  def test_no_info_lines_on_stderr(self):
    # absl's INFO messages (orbax's checkpoint chatter, jax's backend probes)
    # are off unless --verbosity is passed (experiments.common.quiet_logs):
    # the one-process run's stderr has progress bars and no "I<mmdd> ..." line.
    err = self.outputs[2][1]
    self.assertIn("ppo on Bandit-v0", err)  # the RL progress bar
    self.assertEqual(re.findall(r"^I\d{4} .*$", err, re.MULTILINE), [])

  def test_metrics_equal_one_process(self):
    want = jtrain.read_metrics(os.path.join(self.ref_workdir, "metrics.jsonl"))
    got = jtrain.read_metrics(os.path.join(self.workdir, "metrics.jsonl"))
    self.assertEqual([r["step"] for r in got], [r["step"] for r in want])
    for w, g in zip(want, got):
      w, g = _deterministic(w), _deterministic(g)
      self.assertEqual(set(g), set(w))
      for k, v in w.items():
        # atol 1e-5: loss/policy is a mean of zero-mean advantages x ratios
        # (~1e-7), whose sign flips with the collectives' summation order.
        np.testing.assert_allclose(g[k], v, rtol=1e-5, atol=1e-5, err_msg=f"{w['step']} {k}")
    # Replies were sampled and both nets learned: the comparison is not vacuous.
    rl = [r for r in want if "rollout/success" in r]
    self.assertLen(rl, _STEPS)
    self.assertTrue(all(r["rollout/sampled_tokens"] > 0 for r in rl))
    self.assertTrue(all(r["train/grad_norm"] > 0 and r["train/critic_grad_norm"] > 0
                        for r in rl))

  def test_checkpoint_restores_on_other_meshes(self):
    _, steps, want = _restore(self.ref_workdir, "")
    self.assertEqual(steps, [0, _STEPS])
    _, _, initial = _restore(self.ref_workdir, "", step=0)
    moved = np.max(np.abs(np.asarray(want.params.layers.wq[0])
                          - np.asarray(initial.params.layers.wq[0])))
    self.assertGreater(moved, 1e-5)  # 30x the tolerance
    for mesh in ("data:2,fsdp:2,tensor:2", ""):
      exp, steps, got = _restore(self.workdir, mesh)
      self.assertEqual(steps, [0, _STEPS])
      g, w = _leaves(got), _leaves(want)
      self.assertEqual([p for p, _ in g], [p for p, _ in w])
      # rel. 1e-5 of the scale of the field's arrays (params, opt_state, ...):
      # weights whose gradient is float noise (e.g. key biases, which shift
      # all of a query's scores alike) move by noise-driven amounts ~lr.
      scales = {}
      for path, b in w:
        if b.dtype.kind == "f" and b.size:
          field = path.split(".")[1].split("[")[0]
          scales[field] = max(scales.get(field, 0.0), float(np.max(np.abs(b))))
      for (path, a), (_, b) in zip(g, w):
        scale = scales.get(path.split(".")[1].split("[")[0], 0.0)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale, err_msg=path)
      wq = got.params.layers.wq
      if mesh:
        self.assertEqual(dict(wq.sharding.mesh.shape), dict(exp.mesh.shape))
        self.assertEqual(wq.sharding.spec, jax.P(None, "fsdp", "tensor"))
      else:
        self.assertLen(wq.sharding.device_set, 1)

  def test_eval_entry_point_on_one_device(self):
    # experiments.eval restores the data:4 checkpoint on one device and plays
    # the run's final evaluation again (same levels and keys).
    out = eval_job.evaluate_run(self.workdir, output=os.path.join(self.root, "eval.json"))
    self.assertEqual(out["checkpoint_step"], _STEPS)
    with open(os.path.join(self.workdir, "eval_summary.json")) as f:
      final = json.load(f)["rl"]
    for k in ("success", "score", "turns", "format_valid_frac"):
      np.testing.assert_allclose(out[k], final[k], rtol=1e-5, err_msg=k)


class MeshConfigTest(absltest.TestCase):
  """Bad ``config.mesh`` values fail in the constructor, naming the field."""

  def test_errors_name_the_field(self):
    cases = (
        ("model:8", None, r"config\.mesh='model:8': .*unknown axis 'model'"),
        ("data:4", None, r"config\.mesh='data:4': .*multiply to 4, not the 8 devices"),
        ("data:8", jax.devices()[:4], r"config\.mesh='data:8': .*not the 4 devices"),
        # 2 x 2 rollout rows do not split 8 ways.
        ("data:8", None, r"config\.mesh='data:8': .*does not divide the 4 rows of "
                         r"rollout\.num_groups x rollout\.group_size"),
    )
    for mesh, devices, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        experiment.Experiment(_config(mesh), devices=devices)
    c = _config("data:4")
    c.eval.num_groups = c.eval.num_levels = 6
    with self.assertRaisesRegex(ValueError, r"config\.mesh='data:4': .*6 rows of eval"):
      spec.validate(c, 4)
    c = _config("fsdp:2")
    c.sft.update(steps=2, num_demos=8, batch_size=3)
    with self.assertRaisesRegex(ValueError, r"config\.mesh='fsdp:2': .*sft\.batch_size"):
      spec.validate(c, 2)
    spec.validate(_config("data:2,tensor:2"), 4)  # tensor does not split rows


if __name__ == "__main__":
  absltest.main()
