"""Differential test: envs_jax Sokoban vs Jumanji 1.1.2's Sokoban on Boxoban.

Both envs start from the same Boxoban levels (Jumanji's states are built here
from our level arrays: its default generator downloads levels) and take the
same random actions (ours 0..3 = Up, Down, Left, Right; Jumanji's 0..3 = Up,
Right, Down, Left). After every step the full grids (walls, targets, boxes,
player), rewards and termination must be equal. Half of the envs start from
"one push from solved" variants of the levels so the +1 / -1 / +10 reward
paths are exercised too. Skipped when jumanji is not importable.

The Jumanji adapter lives in ``experiments.benchmarks.peers`` (shared with
the throughput benchmark).
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from envs_jax._src import sokoban

from experiments.benchmarks import peers
from experiments.benchmarks.peers import ACTION_TO_JUMANJI
from experiments.benchmarks.peers import jumanji_state
from experiments.benchmarks.peers import make_jumanji_boxoban
from experiments.benchmarks.peers import OBS_TO_JUMANJI

def one_push_from_solved(table: sokoban.SokobanState, seed: int = 0):
  """Variants of levels: all boxes on targets except one, one push away.

  For each level, a random box is moved one cell off its target to ``t + d``
  with the player at ``t + 2d`` (both free floor), so the move ``-d`` solves
  it. Levels without such a spot are dropped.

  Returns:
    A :class:`SokobanState` table (numpy) of the variants.
  """
  rng = np.random.default_rng(seed)
  out = []
  for fixed in np.asarray(table.fixed):
    targets = np.argwhere(fixed == sokoban.TARGET)
    options = []
    for t in targets:
      for d in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        one, two = t + d, t + 2 * np.asarray(d)
        if (np.all((two >= 0) & (two < fixed.shape)) and fixed[tuple(one)] == sokoban.EMPTY
            and fixed[tuple(two)] == sokoban.EMPTY):
          options.append((t, one, two))
    if not options:
      continue
    t, one, two = options[rng.integers(len(options))]
    boxes = fixed == sokoban.TARGET
    boxes[tuple(t)] = False
    boxes[tuple(one)] = True
    out.append((fixed, boxes, two.astype(np.int32)))
  fixed, boxes, player = map(np.stack, zip(*out))
  return sokoban.SokobanState(fixed=fixed, boxes=boxes, player=player)


@absltest.skipIf(not peers.HAVE_JUMANJI, "jumanji is not installed")
class JumanjiDifferentialTest(absltest.TestCase):

  def test_make_jumanji_boxoban_builds_env_on_our_levels(self):
    jenv = make_jumanji_boxoban("unfiltered-test")
    state, timestep = jax.jit(jenv.reset)(jax.random.key(0))
    table = sokoban.boxoban_levels("unfiltered-test")
    grids = [np.asarray(jenv.grid_combine(state.variable_grid, state.fixed_grid))]
    ours = OBS_TO_JUMANJI[np.asarray(jax.vmap(sokoban.Sokoban(levels=table).observation)(
        jax.tree.map(jnp.asarray, table)))]
    self.assertTrue(any(np.array_equal(grids[0], o) for o in ours))
    self.assertEqual(int(timestep.observation.step_count), 0)

  def test_same_trajectories_as_jumanji(self):
    boxoban = sokoban.boxoban_levels("unfiltered-test")
    variants = one_push_from_solved(boxoban)
    batch = 512
    half = batch // 2
    starts = jax.tree.map(
        lambda a, b: jnp.asarray(np.concatenate([a[:half], b[:half]])), boxoban, variants)
    ours = sokoban.Sokoban(levels=boxoban)
    params = ours.default_params
    jenv = peers.jenv_lib.Sokoban(generator=peers.jgen.SimpleSolveGenerator(), time_limit=2**30)
    steps = 48
    to_j = jnp.asarray(ACTION_TO_JUMANJI)
    to_j_obs = jnp.asarray(OBS_TO_JUMANJI)

    def one_env(start, key):
      j0 = jumanji_state(start, jax.random.key_data(key))

      def body(carry, k):
        s, j = carry
        a = jax.random.randint(k, (), 0, 4)
        _, s2, r, term, trunc, _ = ours.step(k, s, a, params)
        j2, ts = jenv.step(j, to_j[a])
        grid_ok = jnp.all(jenv.grid_combine(j2.variable_grid, j2.fixed_grid)
                          == to_j_obs[ours.observation(s2)])
        loc_ok = jnp.all(j2.agent_location == s2.player)
        # Restart both from the start level after a solve.
        s2 = jax.tree.map(lambda x, y: jnp.where(term, x, y), start, s2)
        j2 = jax.tree.map(lambda x, y: jnp.where(term, x, y), j0, j2)
        return (s2, j2), (grid_ok & loc_ok, r, ts.reward, term, ts.last(),
                          trunc, ts.extras["solved"])

      return jax.lax.scan(body, (start, j0), jax.random.split(key, steps))[1]

    keys = jax.random.split(jax.random.key(11), batch)
    same, r, rj, term, last, trunc, solved = jax.device_get(
        jax.jit(jax.vmap(one_env))(starts, keys))
    compared = same.size
    self.assertGreaterEqual(compared, 10_000)
    self.assertTrue(same.all(), f"{(~same).sum()} of {compared} steps differ")
    np.testing.assert_array_equal(r, rj)  # exact float32 equality
    np.testing.assert_array_equal(term, last)
    np.testing.assert_array_equal(term, solved)
    self.assertFalse(trunc.any())
    # The interesting reward paths all happened.
    values = set(np.round(r.astype(np.float64), 4).ravel().tolist())
    self.assertContainsSubset({-0.1, 0.9, -1.1, 10.9}, values)
    print(f"\nJumanji differential: {compared} steps over {batch} envs, "
          f"{int(term.sum())} solves, reward counts "
          f"{ {float(k): int(v) for k, v in zip(*np.unique(np.round(r.astype(np.float64), 4), return_counts=True))} }")


if __name__ == "__main__":
  absltest.main()
