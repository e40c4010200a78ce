"""Tests of Game2048-4x4-v0: merge and reward rules vs Jumanji, RAGEN's text, spawns, expert."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import game_2048
from experiments.benchmarks import peers

ENV, PARAMS = envs_jax.make("Game2048-4x4-v0")
GAME = ENV.unwrapped
STEP = jax.jit(GAME.step)
RAW = PARAMS.replace(log_reward=jnp.bool_(False))
SLIDE = jax.jit(game_2048.slide_left)
MOVE_ALL = jax.jit(game_2048.move_all)
RENDER = jax.jit(GAME.render_symbols)


def text(state):
  return "".join(GAME.symbols[i] for i in np.asarray(RENDER(state)))


def state_of(board, score=0):
  return game_2048.Game2048State(board=jnp.asarray(board, jnp.int32), score=jnp.int32(score))


def step(board, action, params=RAW, key=0):
  return STEP(jax.random.key(key), state_of(board), jnp.int32(action), params)


@absltest.skipIf(not peers.HAVE_JUMANJI, "jumanji is not installed")
class JumanjiTest(absltest.TestCase):

  def test_moves_rewards_and_ends_equal_jumanji(self):
    # 1024 games x 12 random steps (12,288 steps) from our resets: on every
    # (board, action) our step and Jumanji's move (no spawn) must agree on the
    # slid board, the merged value (Jumanji's reward) and whether the move is
    # legal; ours adds one 2 or 4 on an empty cell after a legal move only,
    # pays the merged value (raw reward) or -0.1, and ends exactly when
    # Jumanji's action mask of the new board is empty.
    from jumanji.environments.logic.game_2048 import utils as jutils  # pylint: disable=g-import-not-at-top
    batch, steps = 1024, 12
    keys = jax.random.split(jax.random.key(0), batch)
    actions = jax.random.randint(jax.random.key(1), (steps, batch), 0, 4)
    step_keys = jax.random.split(jax.random.key(2), (steps, batch))

    def exps(board):  # tile values -> Jumanji's exponents (0 empty)
      return jnp.where(board > 0, jnp.log2(jnp.maximum(board, 1)).round(), 0).astype(jnp.int32)

    def one(state, a, key):
      slid, reward = jutils.move(exps(state.board), a)
      legal = jutils.can_move(exps(state.board), a)
      _, new, r, terminated, _, info = GAME.step(key, state, a, RAW)
      mask = jax.vmap(lambda b: jutils.can_move(exps(new.board), b))(jnp.arange(4))
      return new, (state.board, exps(new.board), slid, reward, legal, r, terminated, mask,
                   info["merged"])

    @jax.jit
    def run():
      _, state = jax.vmap(GAME.reset, in_axes=(0, None))(keys, RAW)
      body = lambda s, x: jax.vmap(one)(s, *x)
      return jax.lax.scan(body, state, (actions, step_keys))[1]

    before, new, slid, reward, legal, r, terminated, mask, merged = map(np.asarray, run())
    self.assertEqual(before.shape[:2], (steps, batch))
    np.testing.assert_array_equal(merged, np.where(legal, reward, 0))
    np.testing.assert_allclose(r, np.where(legal, reward, -0.1), rtol=1e-6)
    np.testing.assert_array_equal(terminated, legal & ~mask.any(-1))
    diff = new != np.where(legal[..., None, None], slid, exps(before))
    np.testing.assert_array_equal(diff.sum((-2, -1)), legal.astype(int))  # one spawned tile
    spawned = np.where(diff, new, 0).sum((-2, -1))[legal]
    self.assertTrue(np.all(np.isin(spawned, (1, 2))))  # 2 or 4
    self.assertTrue(np.all(np.where(diff, slid, 0) == 0))  # on an empty cell
    self.assertGreater(legal.mean(), 0.5)
    self.assertGreater((reward > 0).mean(), 0.1)


class RulesTest(absltest.TestCase):

  def test_merges_by_hand(self):
    cases = [  # (row, moved left, merged value)
        ([2, 2, 2, 2], [4, 4, 0, 0], 8),
        ([4, 4, 4, 0], [8, 4, 0, 0], 8),
        ([2, 0, 2, 4], [4, 4, 0, 0], 4),
        ([2, 4, 8, 16], [2, 4, 8, 16], 0),
        ([0, 0, 0, 2], [2, 0, 0, 0], 0),
        ([8, 8, 16, 16], [16, 32, 0, 0], 48),
    ]
    for row, want, m in cases:
      got, merged = SLIDE(jnp.asarray(row, jnp.int32))
      self.assertEqual((np.asarray(got).tolist(), int(merged)), (want, m), row)
    board = np.array([[2, 2, 2, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    boards, merged, moved = MOVE_ALL(jnp.asarray(board, jnp.int32))
    self.assertEqual(np.asarray(boards[game_2048.RIGHT])[0].tolist(), [0, 0, 2, 4])
    self.assertEqual(np.asarray(boards[game_2048.DOWN])[:, 0].tolist(), [0, 0, 0, 2])
    self.assertEqual(np.asarray(moved).tolist(), [False, True, True, True])
    self.assertEqual(np.asarray(merged).tolist(), [0, 4, 0, 4])

  def test_rewards(self):
    board = np.zeros((4, 4), int)
    board[0, :2] = 8
    _, s, r, *_ = step(board, game_2048.LEFT, PARAMS)  # log reward: 0.1 log2(16 + 1)
    self.assertAlmostEqual(float(r), 0.1 * np.log2(17.0), places=6)
    self.assertEqual(int(s.score), 16)
    _, s, r, *_ = step(board, game_2048.LEFT, RAW)
    self.assertEqual(float(r), 16.0)
    _, s2, r, terminated, _, info = step(board, game_2048.UP, PARAMS)  # changes nothing
    self.assertAlmostEqual(float(r), -0.1, places=6)
    np.testing.assert_array_equal(s2.board, board)
    self.assertFalse(bool(info["action_effective"]) or bool(terminated))
    _, _, r, *_ = step(board, game_2048.UP, PARAMS.replace(invalid_reward=jnp.float32(0.0)))
    self.assertEqual(float(r), 0.0)  # RAGEN's code under the log reward
    board[1, 0] = 2
    _, _, r, *_ = step(board, game_2048.DOWN, PARAMS)  # valid, no merge
    self.assertEqual(float(r), 0.0)

  def test_stuck_board_ends_and_renders_ragen_text(self):
    # One free cell: Left slides row 4 to [2048, 2, 4, 0] and the spawn fills
    # the corner: a 2 leaves no move (the game ends, with a 2048 tile: success),
    # a 4 next to the 4 leaves one.
    board = np.array([[4, 8, 4, 8], [8, 4, 8, 4], [4, 8, 16, 8], [2048, 2, 0, 4]])
    seen = set()
    for key in range(12):
      _, s, _, terminated, truncated, info = step(board, game_2048.LEFT, key=key)
      spawned = int(s.board[3, 3])
      seen.add(spawned)
      self.assertEqual(np.asarray(s.board)[3, :3].tolist(), [2048, 2, 4])
      self.assertEqual((bool(terminated), bool(info["success"]), bool(truncated)),
                       (spawned == 2, spawned == 2, False))
    self.assertEqual(seen, {2, 4})
    stuck = np.array([[4, 8, 4, 8], [8, 4, 8, 4], [4, 8, 16, 8], [2048, 2, 4, 2]])
    self.assertEqual(
        text(state_of(stuck, 20)),
        "Current 2048 Grid:\nRow 1: [4, 8, 4, 8]\nRow 2: [8, 4, 8, 4]\nRow 3: [4, 8, 16, 8]\n"
        "Row 4: [2048, 2, 4, 2]\n\nValid Actions: None.\nGoal: Merge same numbers to reach "
        "2048.\nCurrent Score: 20\nWhat is your next move?")
    some = np.array([[0, 0, 0, 2], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 4]])
    self.assertIn("\n\nValid Actions: 0(Up), 2(Down), 3(Left).\n",
                  text(state_of(some)))

  def test_spawns(self):
    # Resets: two tiles, 2 with probability 0.9, on uniform cells.
    keys = jax.random.split(jax.random.key(0), 4000)
    boards = np.asarray(jax.jit(jax.vmap(GAME.reset, in_axes=(0, None)))(keys, PARAMS)[1].board)
    tiles = boards[boards > 0]
    self.assertEqual(tiles.size, 8000)
    self.assertAlmostEqual(float(np.mean(tiles == 2)), 0.9, delta=0.01)  # sd 0.0034
    cells = (boards > 0).reshape(4000, 16).mean(0)
    self.assertLess(np.abs(cells - 2 / 16).max(), 0.025)  # sd 0.0052
    only4 = jax.vmap(GAME.reset, in_axes=(0, None))(keys[:50], PARAMS.replace(
        two_prob=jnp.float32(0.0)))[1].board
    self.assertTrue(np.all(np.isin(np.asarray(only4), (0, 4))))

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "size"):
      game_2048.Game2048(size=1)
    with self.assertRaisesRegex(ValueError, "two_prob"):
      game_2048.Game2048(two_prob=1.5)
    with self.assertRaisesRegex(ValueError, "out of range"):
      GAME.step(jax.random.key(0), state_of(np.zeros((4, 4))), 4, PARAMS)


class ExpertTest(absltest.TestCase):

  def test_greedy_expert_moves_validly_and_outscores_random_play(self):
    n, steps = 32, 40
    keys = jax.random.split(jax.random.key(0), n)
    batch_step = jax.jit(jax.vmap(GAME.step, in_axes=(0, 0, 0, None)))
    _, start = jax.vmap(GAME.reset, in_axes=(0, None))(keys, PARAMS)
    moves = jax.jit(jax.vmap(game_2048.move_all))
    scores = {}
    for policy in ("expert", "random"):
      state, rng = start, np.random.default_rng(0)
      for t in range(steps):
        if policy == "expert":
          host = jax.device_get(state)
          names = GAME.expert_answers([jax.tree.map(lambda x, i=i: x[i], host)
                                       for i in range(n)], [PARAMS] * n)
          actions = np.asarray([GAME.action_names.index(a) for a in names], np.int32)
        else:
          actions = rng.integers(0, 4, n).astype(np.int32)
        _, state, _, _, _, info = batch_step(jax.random.split(jax.random.key(t), n), state,
                                             actions, PARAMS)
        if policy == "expert":  # a valid move whenever one exists
          can = np.asarray(moves(host.board)[2]).any(-1)
          np.testing.assert_array_equal(np.asarray(info["action_effective"]), can)
      scores[policy] = float(np.mean(np.asarray(state.score)))
    self.assertGreater(scores["expert"], 1.2 * scores["random"])  # measured 261 vs 202
    two = GAME.expert_answers([jax.tree.map(lambda x: x[0], jax.device_get(start))], [PARAMS],
                              actions_per_turn=3)[0]
    self.assertTrue(1 <= len(two.split(" || ")) <= 3)


if __name__ == "__main__":
  absltest.main()
