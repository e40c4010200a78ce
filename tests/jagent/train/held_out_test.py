"""train.held_out_reset_keys and the experiments' held-out evaluation levels."""

from absl.testing import absltest
import jax
import numpy as np

import envs_jax
from experiments import experiment
from experiments import sweep
from experiments.configs import tiny
from jagent import rollout
from jagent import train


def _levels(env, params, keys):
  """Each key's initial rendering as bytes."""
  render = jax.jit(jax.vmap(lambda k: env.render_symbols(env.reset(k, params)[1])))
  return [row.tobytes() for row in np.asarray(render(keys))]


class HeldOutResetKeysTest(absltest.TestCase):

  def test_trained_levels_are_replaced_in_order(self):
    env, params = envs_jax.make("Sokoban-6x6-1box-v0")
    candidates = jax.random.split(jax.random.key(0), 12)
    # Train on candidates 1 and 4 (and on unrelated levels): the first six kept are
    # candidates 0, 2, 3, 5, 6, 7; two of the first six were replaced.
    trained = jax.numpy.concatenate([candidates[np.array([4, 1])],
                                     jax.random.split(jax.random.key(1), 5)])
    seen = set(_levels(env, params, trained))
    fresh = [i for i, lv in enumerate(_levels(env, params, candidates)) if lv not in seen]
    keys, removed = train.held_out_reset_keys(env, params, candidates, trained, 6)
    np.testing.assert_array_equal(jax.random.key_data(keys),
                                  jax.random.key_data(candidates[np.array(fresh[:6])]))
    self.assertEqual(removed, sum(i not in fresh for i in range(6)))
    self.assertGreaterEqual(removed, 2)
    self.assertNotIn(1, fresh)
    self.assertNotIn(4, fresh)

  def test_too_few_fresh_levels_is_an_error(self):
    env, params = envs_jax.make("Sokoban-6x6-1box-v0")
    keys = jax.random.split(jax.random.key(0), 4)
    with self.assertRaisesRegex(ValueError, r"only 0 of 4 candidate levels .* 2 needed"):
      train.held_out_reset_keys(env, params, keys, keys, 2)


class ExperimentHeldOutTest(absltest.TestCase):

  def test_eval_levels_are_not_training_levels(self):
    c = tiny.get_config("Sokoban-6x6-1box-v0,starpo_s")
    c.rl.steps = 40
    c.eval.update(dict(num_levels=128, num_groups=64))
    exp = experiment.Experiment(c)
    # The training levels, derived independently: each RL step's key and the
    # SFT demonstrations' key, split as a rollout splits them.
    trained = [rollout.group_reset_keys(exp.rl_key(s), c.rollout.num_groups)
               for s in range(c.rl.steps)]
    trained.append(jax.random.split(jax.random.split(
        jax.random.fold_in(jax.random.key(c.seed), 1), 3)[0], c.sft.num_demos))
    seen = set(_levels(exp.env, exp.text_env.env_params,
                       jax.numpy.concatenate(trained)))
    held = _levels(exp.env, exp.text_env.env_params, exp.eval_keys)
    self.assertLen(held, 128)
    self.assertFalse(any(lv in seen for lv in held))
    plain = _levels(exp.env, exp.text_env.env_params,
                    jax.random.split(jax.random.key(c.eval.seed), 128))
    self.assertEqual(exp.eval_levels_removed, sum(lv in seen for lv in plain))
    self.assertGreater(exp.eval_levels_removed, 0)
    # The plain levels that are not trained ones stay, in order.
    self.assertEqual([lv for lv in held if lv in plain][:10],
                     [lv for lv in plain if lv not in seen][:10])

  def test_a_sweep_holds_out_the_levels_of_the_sweeps_beside_it(self):
    c = tiny.get_config("Sokoban-6x6-1box-v0,starpo_s")
    c.rl.steps, c.sft.steps = 10, 0
    c.eval.update(dict(num_levels=128, num_groups=64))
    longer = tiny.get_config("Sokoban-6x6-1box-v0,grpo")
    longer.rl.steps, longer.sft.steps = 60, 0
    longer.eval.update(dict(num_levels=128, num_groups=64))
    exps = [experiment.Experiment(c)]
    sweep.hold_out(exps, 1)
    own, own_removed = exps[0].eval_keys, exps[0].eval_levels_removed
    sweep.hold_out(exps, 1, [longer])
    exp = exps[0]
    # The longer sweep's levels, derived independently: its RL steps' keys (same seed).
    seen = set(_levels(exp.env, exp.text_env.env_params, jax.numpy.concatenate(
        [rollout.group_reset_keys(exp.rl_key(s), longer.rollout.num_groups)
         for s in range(longer.rl.steps)])))
    held = _levels(exp.env, exp.text_env.env_params, exp.eval_keys)
    self.assertLen(held, 128)
    self.assertFalse(any(lv in seen for lv in held))
    self.assertTrue(any(lv in seen for lv in _levels(exp.env, exp.text_env.env_params, own)))
    self.assertGreater(exp.eval_levels_removed, own_removed)


if __name__ == "__main__":
  absltest.main()
