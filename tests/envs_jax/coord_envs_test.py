"""Tests of CoordSokoban-6x6-1box-v0 and CoordFrozenLake-4x4-v0: RAGEN-2's grid_coord text.

The dynamics are the base games' (each id against its base id on the same
keys and actions); the text is checked by hand, against a plain-Python
formatter written here from RAGEN's ``format_coordinate_render``, and against
the tiny tokenizer (``TextEnv``'s check of the device rendering).
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from scipy import ndimage

import envs_jax
from envs_jax._src import coord_grids
from envs_jax._src import frozen_lake as fl
from envs_jax._src import sokoban as sk
from jagent import rollout
from jagent import tokenizers

PAIRS = (("CoordSokoban-6x6-1box-v0", "Sokoban-6x6-1box-v0"),
         ("CoordFrozenLake-4x4-v0", "FrozenLake-4x4-v0"))
BATCH, STEPS = 128, 8  # 1,024 steps per pair


def _ragen_text(lines, height, width, grid):
  """RAGEN's grid_coord text: ``lines`` are (label, [(r, c), ...]) in RAGEN's order."""
  out = [f"Board size: {height} rows x {width} cols (zero-indexed)."]
  for label, coords in lines:
    if coords:
      out.append(f"{label}: " + ", ".join(f"({r}, {c})" for r, c in coords))
  return "Coordinates: \n" + "\n".join(out) + "\nGrid Map: \n" + grid


def _cells(mask):
  return [(int(r), int(c)) for r, c in np.argwhere(mask)]


def sokoban_reference(env, s):
  """The expected text of an unbatched CoordSokoban state (numpy leaves)."""
  fixed, boxes, (pr, pc) = np.asarray(s.fixed), np.asarray(s.boxes), np.asarray(s.player)
  target = fixed == sk.TARGET
  on = bool(target[pr, pc])
  grid = np.where(boxes, np.where(target, sk.BOX_ON_TARGET, sk.BOX), fixed)
  grid[pr, pc] = sk.PLAYER_ON_TARGET if on else sk.PLAYER
  text = "\n".join("".join(env.symbols[1 + v] for v in row) for row in grid)
  lines = [("Targets", _cells(target)), ("Boxes", _cells(boxes & ~target)),
           ("Boxes on target", _cells(boxes & target)),
           ("Player", [] if on else [(pr, pc)]), ("Player on target", [(pr, pc)] if on else [])]
  return _ragen_text(lines, *fixed.shape, text)


def frozen_lake_reference(env, s):
  """The expected text of an unbatched CoordFrozenLake state (numpy leaves)."""
  tiles, (pr, pc) = np.asarray(s.tiles), np.asarray(s.player)
  tile = tiles[pr, pc]
  grid = np.choose(tiles, ["_", "O", "G"]).astype(object)
  grid[pr, pc] = {fl.FROZEN: "P", fl.HOLE: "X", fl.GOAL: "√"}[int(tile)]
  player = [(int(pr), int(pc))]
  lines = [("Start", [tuple(int(x) for x in np.asarray(s.start))]),
           ("Goal", _cells(tiles == fl.GOAL)),
           ("Player", player if tile == fl.FROZEN else []),
           ("Player on goal", player if tile == fl.GOAL else []),
           ("Player in hole", player if tile == fl.HOLE else []),
           ("Holes", _cells(tiles == fl.HOLE))]
  return _ragen_text(lines, *tiles.shape, "\n".join("".join(r) for r in grid))


REFERENCE = {"CoordSokoban-6x6-1box-v0": sokoban_reference,
             "CoordFrozenLake-4x4-v0": frozen_lake_reference}


def _inner(state):
  return state.env_state  # the TimeLimit wrapper's inner state


def _run(env, params, keys, actions):
  """Resets from ``keys`` [B] and steps ``actions`` [STEPS, B] with auto-reset.

  Returns:
    ``(states, outs)``: the state before each step and the step's outputs,
    leading axes [STEPS, B], numpy leaves.
  """
  env = envs_jax.AutoReset(env)
  n = keys.shape[0]

  @jax.jit
  def run(keys, actions):
    _, state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)

    def body(state, xs):
      k, a = xs
      out = jax.vmap(env.step, in_axes=(0, 0, 0, None))(jax.random.split(k, n), state, a,
                                                          params)
      return out[1], (state, out)

    return jax.lax.scan(body, state, (jax.random.split(keys[0], STEPS), actions))[1]

  return jax.device_get(run(keys, actions))


class DynamicsTest(parameterized.TestCase):

  @parameterized.parameters(*PAIRS)
  def test_same_as_the_base_game(self, coord_id, base_id):
    # 128 episodes x 8 steps with auto-reset: same states, observations,
    # rewards, ends and info as the base id on the same keys and actions.
    coord, params = envs_jax.make(coord_id)
    base, _ = envs_jax.make(base_id)
    keys = jax.random.split(jax.random.key(0), BATCH)
    actions = jax.random.randint(jax.random.key(1), (STEPS, BATCH), 0, 4)
    (c_before, c_out), (b_before, b_out) = (_run(e, params, keys, actions)
                                            for e in (coord, base))
    self.assertEqual(np.size(c_out[2]), BATCH * STEPS)
    for c, b in zip(c_out[2:], b_out[2:]):  # reward, terminated, truncated, info
      jax.tree.map(np.testing.assert_array_equal, c, b)
    np.testing.assert_array_equal(c_out[0], b_out[0])  # observations
    for before, out in ((c_before, b_before), (c_out[1], b_out[1])):
      c_state, b_state = _inner(before), _inner(out)
      for field in b_state.__dataclass_fields__:
        np.testing.assert_array_equal(getattr(c_state, field), getattr(b_state, field))
    if coord_id.startswith("CoordFrozenLake"):
      # The start is the first position of each episode and never moves.
      start, player = _inner(c_before).start, _inner(c_before).player
      first = np.concatenate([np.ones((1, BATCH), bool),
                              np.asarray(c_out[3] | c_out[4])[:-1]])
      np.testing.assert_array_equal(start[first], player[first])
      same_episode = ~first[1:]
      np.testing.assert_array_equal(start[1:][same_episode], start[:-1][same_episode])
    # The other agent-facing parts are the base game's.
    self.assertEqual(coord.action_names, base.action_names)
    self.assertEqual(coord.agent_defaults, base.agent_defaults)
    self.assertEqual(coord.legend, base.legend)


class TextTest(parameterized.TestCase):

  def test_sokoban_by_hand(self):
    env = coord_grids.CoordSokoban(height=5, width=5, num_boxes=2)
    fixed = np.full((5, 5), sk.WALL, np.int8)
    fixed[1:4, 1:4] = sk.EMPTY
    fixed[1, 1] = fixed[3, 3] = sk.TARGET  # as many targets as boxes
    boxes = np.zeros((5, 5), bool)
    boxes[1, 1] = boxes[2, 2] = True
    state = sk.SokobanState(fixed=jnp.asarray(fixed), boxes=jnp.asarray(boxes),
                            player=jnp.asarray([3, 3], jnp.int32))
    want = ("Coordinates: \nBoard size: 5 rows x 5 cols (zero-indexed).\n"
            "Targets: (1, 1), (3, 3)\nBoxes: (2, 2)\nBoxes on target: (1, 1)\n"
            "Player on target: (3, 3)\nGrid Map: \n#####\n#√__#\n#_X_#\n#__S#\n#####")
    self.assertEqual(env.render_text(state), want)
    self.assertEqual(sokoban_reference(env, jax.device_get(state)), want)
    moved = state.replace(player=jnp.asarray([3, 2], jnp.int32))
    self.assertIn("\nBoxes on target: (1, 1)\nPlayer: (3, 2)\nGrid Map: \n",
                  env.render_text(moved))

  def test_frozen_lake_by_hand(self):
    env = coord_grids.CoordFrozenLake()
    tiles = np.zeros((4, 4), np.int8)
    tiles[1, 1] = tiles[1, 3] = tiles[3, 0] = fl.HOLE
    tiles[3, 3] = fl.GOAL
    state = coord_grids.CoordFrozenLakeState(tiles=jnp.asarray(tiles),
                                             player=jnp.asarray([1, 3], jnp.int32),
                                             start=jnp.asarray([0, 0], jnp.int32))
    want = ("Coordinates: \nBoard size: 4 rows x 4 cols (zero-indexed).\nStart: (0, 0)\n"
            "Goal: (3, 3)\nPlayer in hole: (1, 3)\nHoles: (1, 1), (1, 3), (3, 0)\n"
            "Grid Map: \n____\n_O_X\n____\nO__G")
    self.assertEqual(env.render_text(state), want)
    self.assertEqual(frozen_lake_reference(env, jax.device_get(state)), want)
    on_goal = env.render_text(state.replace(player=jnp.asarray([3, 3], jnp.int32)))
    self.assertIn("\nGoal: (3, 3)\nPlayer on goal: (3, 3)\nHoles: ", on_goal)
    no_holes = state.replace(tiles=jnp.where(state.tiles == fl.HOLE, fl.FROZEN, state.tiles)
                             .astype(jnp.int8), player=jnp.asarray([0, 0], jnp.int32))
    self.assertIn("\nGoal: (3, 3)\nPlayer: (0, 0)\nGrid Map: \nP___\n",
                  env.render_text(no_holes))

  @parameterized.parameters(*REFERENCE)
  def test_reference_text_and_tokenizer_on_random_states(self, env_id):
    # The device text of 64 random states (resets plus random steps) equals
    # the plain-Python formatter's; TextEnv checks that the tiny tokenizer's
    # ids of rendered prompts equal encode() of their text.
    env, params = envs_jax.make(env_id)
    keys = jax.random.split(jax.random.key(2), 64)
    actions = jax.random.randint(jax.random.key(3), (STEPS, 64), 0, 4)
    before, _ = _run(env, params, keys, actions)
    for t in range(0, STEPS, 3):
      for b in range(64):
        s = jax.tree.map(lambda x, t=t, b=b: x[t, b], _inner(before))
        self.assertEqual(env.unwrapped.render_text(s), REFERENCE[env_id](env.unwrapped, s))
    rollout.TextEnv(env, tokenizers.load_tiny_tokenizer(), verify_states=64)

  def test_instructions_name_the_coordinates(self):
    sok, _ = envs_jax.make("CoordSokoban-6x6-1box-v0")
    lake, _ = envs_jax.make("CoordFrozenLake-4x4-v0")
    self.assertIn("from (0, 0) at the top-left corner to (5, 5) at the bottom-right",
                  sok.instructions)
    self.assertIn("to (3, 3) at the bottom-right", lake.instructions)
    self.assertIn("the player, every box and every target", sok.instructions)
    self.assertIn("the start, the goal, the player and the holes", lake.instructions)

  def test_bad_size_raises(self):
    with self.assertRaisesRegex(ValueError, "single digits"):
      coord_grids.CoordSokoban(height=11, width=6)
    with self.assertRaisesRegex(ValueError, "single digits"):
      coord_grids.CoordFrozenLake(size=11)


def exact_lake_statistics(frozen_prob):
  """``(E[holes], P(no hole))`` of RAGEN's 4x4 lakes, exactly.

  RAGEN's generator (tiles frozen with probability ``frozen_prob``, distinct
  uniform start and goal forced frozen, rejected until a path joins them) by
  enumeration: each hole set ``H`` of the 14 other tiles has probability
  ``(1 - p)^|H| p^(14 - |H|)`` per (start, goal) pair, and is accepted for
  the ordered pairs inside one 4-connected component of the other tiles.
  """
  holes = np.array([bin(m).count("1") for m in range(1 << 16)])
  pairs = np.zeros(1 << 16)
  for m in range(1 << 16):
    free = ((m >> np.arange(16)) & 1).reshape(4, 4) == 0
    sizes = np.bincount(ndimage.label(free)[0].ravel())[1:]
    pairs[m] = np.sum(sizes * (sizes - 1))
  w = (1 - frozen_prob) ** holes * frozen_prob ** np.maximum(14 - holes, 0) * pairs
  return (w * holes).sum() / w.sum(), w[holes == 0].sum() / w.sum()


class MapTest(absltest.TestCase):

  def test_coord_lakes_are_ragen2s_p_0_9(self):
    env, params = envs_jax.make("CoordFrozenLake-4x4-v0")
    self.assertAlmostEqual(float(params.frozen_prob), 0.9, places=6)
    self.assertAlmostEqual(float(envs_jax.make("FrozenLake-4x4-v0")[1].frozen_prob), 0.8,
                           places=6)
    n = 4000
    tiles, _, found = jax.jit(jax.vmap(env.unwrapped.generate_map, in_axes=(0, None)))(
        jax.random.split(jax.random.key(11), n), params)
    self.assertTrue(bool(np.all(found)))
    holes = np.asarray(tiles == fl.HOLE).sum((1, 2))
    mean, none = exact_lake_statistics(0.9)
    # p=0.9: 1.380 holes, 23.1% without a hole (p=0.8: 2.691 and 4.6%).
    self.assertAlmostEqual(mean, 1.3801, places=4)
    self.assertAlmostEqual(none, 0.2308, places=4)
    # Within 4 standard errors (hole count sd 1.10; Bernoulli of 0.23).
    self.assertAlmostEqual(holes.mean(), mean, delta=4 * 1.10 / np.sqrt(n))
    self.assertAlmostEqual((holes == 0).mean(), none,
                           delta=4 * np.sqrt(none * (1 - none) / n))

  def test_frozen_prob_stays_configurable(self):
    env, params = envs_jax.make("CoordFrozenLake-4x4-v0", frozen_prob=0.8)
    self.assertAlmostEqual(float(params.frozen_prob), 0.8, places=6)
    self.assertAlmostEqual(float(env.default_params.frozen_prob), 0.8, places=6)


if __name__ == "__main__":
  absltest.main()
