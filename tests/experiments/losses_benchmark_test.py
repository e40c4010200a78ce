"""Smoke test of ``python -m experiments.benchmarks.losses`` (no timing asserts).

Runs the benchmark's ``main`` with tiny flags and checks its output format and
the functions it is built on; speed itself is measured only by the benchmark.
"""

import contextlib
import io
import json
import math

from absl import flags
from absl.testing import absltest
from absl.testing import flagsaver
import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import losses as bench
from jagent import transforms

# One algorithm per kind of objective: no critic (grpo), a critic and a group
# filter (starpo_s, whose critic path is ppo's), turn-level anchors (gigpo).
# Each costs 4 compiles (~12 s).
_ALGOS = ("grpo", "starpo_s", "gigpo")
_PARTS = ("baseline", "full", "objective", "update")


class LossesBenchmarkTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()

  def test_main_prints_one_finite_json_line_per_algorithm(self):
    out = io.StringIO()
    with flagsaver.flagsaver(batch=4, group_size=2, seq_len=16, turns=3,
                             repeats=1, num_layers=1, algorithms=list(_ALGOS)):
      with contextlib.redirect_stdout(out):
        bench.main(["losses"])
    lines = [json.loads(l) for l in out.getvalue().splitlines()
             if l.startswith("{")]
    self.assertEqual([r["algorithm"] for r in lines], list(_ALGOS))
    for r in lines:
      self.assertEqual((r["B"], r["G"], r["S"], r["T"], r["layers"]),
                       (4, 2, 16, 3, 1))
      for key in ("loss", "kept_ratio"):
        self.assertTrue(math.isfinite(r[key]), (r["algorithm"], key, r[key]))
      for clock in ("wall", "cpu"):
        ms = {part: r[f"{part}_{clock}_ms"] for part in _PARTS}
        for part, value in ms.items():
          self.assertTrue(math.isfinite(value) and value > 0.0,
                          (r["algorithm"], part, clock, value))
        self.assertAlmostEqual(r[f"share_alone_{clock}"],
                               ms["objective"] / ms["full"])
        self.assertAlmostEqual(r[f"share_diff_{clock}"],
                               (ms["full"] - ms["baseline"]) / ms["full"])
    by_name = {r["algorithm"]: r for r in lines}
    # StarPO-S keeps the top 25% of the 2 groups by reward std: 1 group.
    self.assertEqual(by_name["starpo_s"]["kept_ratio"], 0.5)
    self.assertEqual(by_name["grpo"]["kept_ratio"], 1.0)
    self.assertIn("(full-base)/full", out.getvalue())

  def test_objective_needs_matches_alias_defaults(self):
    # The model-side outputs the benchmark computes are the aliases' declared
    # needs. ppo/starpo_s: GAE critic, entropy 0.001; grpo: entropy 0.001, no
    # critic; gigpo and dapo: entropy_coef 0, no critic.
    want = {"ppo": (True, True), "starpo_s": (True, True),
            "grpo": (False, True), "gigpo": (False, False),
            "dapo": (False, False)}
    for name, needs in want.items():
      got = transforms.make(name).needs
      self.assertEqual((got.critic, got.entropy), needs, name)

  def test_make_rollouts_layout(self):
    host = bench.make_rollouts(8, 4, 64, 4, vocab_size=32, seed=3)
    mask, ids = host["loss_mask"], host["turn_ids"]
    np.testing.assert_array_equal(mask, (ids >= 0).astype(np.float32))
    np.testing.assert_array_equal(host["rewards"] * (1 - mask), 0.0)
    self.assertTrue(np.all(mask[:, :64 // 8] == 0))  # the prompt is untrained
    self.assertTrue(np.all(mask.sum(1) > 0))
    self.assertLess(ids.max(), 4)
    anchors = host["anchor_hashes"]
    np.testing.assert_array_equal(anchors[:, 0], [0, 0, 0, 0, 1000, 1000,
                                                   1000, 1000])
    self.assertEqual(anchors.dtype, np.int32)
    # Untrained padding after the last turn is token 0.
    last = [np.max(np.nonzero(m)[0]) for m in mask]
    for row, end in enumerate(last):
      self.assertTrue(np.all(host["tokens"][row, end + 1:] == 0))

  def test_token_logprobs_and_entropy_match_numpy(self):
    logits = np.random.default_rng(0).normal(size=(2, 5, 7)).astype(np.float32)
    tokens = np.array([[1, 2, 3, 4, 5], [6, 0, 1, 2, 3]], np.int32)
    logp = np.log(np.exp(logits) / np.exp(logits).sum(-1, keepdims=True))
    want = np.zeros((2, 5), np.float32)
    for b in range(2):
      for s in range(1, 5):
        want[b, s] = logp[b, s - 1, tokens[b, s]]
    got = jax.jit(bench.token_logprobs)(jnp.asarray(logits), jnp.asarray(tokens))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    ent = -(np.exp(logp) * logp).sum(-1)
    want_ent = np.concatenate([np.zeros((2, 1)), ent[:, :-1]], axis=1)
    np.testing.assert_allclose(jax.jit(bench.token_entropy)(jnp.asarray(logits)),
                               want_ent, rtol=1e-5, atol=1e-6)

  def test_bad_arguments_raise_before_compiling(self):
    with self.assertRaisesRegex(ValueError, "group_size=3 must divide"):
      bench.run(batch=4, group_size=3, seq_len=16, turns=2, repeats=1,
                algorithms=["grpo"])
    with self.assertRaisesRegex(ValueError, "unknown 'nope'"):
      bench.run(batch=4, group_size=2, seq_len=16, turns=2, repeats=1,
                algorithms=["nope"])
    with self.assertRaisesRegex(ValueError, "--seq_len=2"):
      bench.run(batch=4, group_size=2, seq_len=2, turns=2, repeats=1,
                algorithms=["grpo"])


if __name__ == "__main__":
  absltest.main()
