"""Tests of Game2048-4x4-v0: merge and reward rules vs Jumanji, RAGEN's text, spawns, expert.

Also ``target_tile`` (Game2048-4x4-tile16-v0).

Every test steps, resets and slides through the same few compiled programs
(batch ``BATCH``; params are traced, so changing them does not recompile):
compiles, not the games, are what these tests cost.
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from envs_jax._src import game_2048
from experiments.benchmarks import peers

ENV, PARAMS = envs_jax.make("Game2048-4x4-v0")
GAME = ENV.unwrapped
RAW = PARAMS.replace(log_reward=jnp.bool_(False))
BATCH = 1024
KEYS = jax.random.split(jax.random.key(0), BATCH)
RESETS = jax.jit(jax.vmap(GAME.reset, in_axes=(0, None)))
STEPS = jax.jit(jax.vmap(GAME.step, in_axes=(0, 0, 0, None)))
EXPERT_BATCH = 32  # the expert's look-ahead compiles at this batch; MOVES shares it
MOVES = jax.jit(jax.vmap(game_2048.move_all))


def text(board, score=0):
  state = game_2048.Game2048State(board=jnp.asarray(board, jnp.int32), score=jnp.int32(score))
  return GAME.render_text(state)


def step(boards, actions, params=RAW, keys=KEYS):
  """STEPS on the given boards and actions, repeated to fill the batch."""
  boards = np.resize(np.asarray(boards, np.int32), (BATCH, 4, 4))
  state = game_2048.Game2048State(board=jnp.asarray(boards),
                                  score=jnp.zeros((BATCH,), jnp.int32))
  actions = jnp.asarray(np.resize(np.asarray(actions, np.int32), BATCH))
  return jax.device_get(STEPS(keys, state, actions, params))


def moves(boards):
  """MOVES on up to EXPERT_BATCH boards (the rest of the batch repeats them)."""
  out = MOVES(jnp.asarray(np.resize(np.asarray(boards, np.int32), (EXPERT_BATCH, 4, 4))))
  return [np.asarray(x)[:len(boards)] for x in out]


@absltest.skipIf(not peers.HAVE_JUMANJI, "jumanji is not installed")
class JumanjiTest(absltest.TestCase):

  def test_moves_rewards_and_ends_equal_jumanji(self):
    # 1024 games x 12 random steps (12,288 steps) from our resets: on every
    # (board, action) our step and Jumanji's move (no spawn) must agree on the
    # slid board, the merged value (Jumanji's reward) and whether the move is
    # legal; ours adds one 2 or 4 on an empty cell after a legal move only,
    # pays the merged value (raw reward) or -0.1, and ends exactly when
    # Jumanji's action mask of the new board is empty. Our valid actions (the
    # text's list) equal that mask on every new board.
    from jumanji.environments.logic.game_2048 import utils as jutils  # pylint: disable=g-import-not-at-top
    steps = 12
    actions = np.asarray(jax.random.randint(jax.random.key(1), (steps, BATCH), 0, 4), np.int32)
    step_keys = jax.random.split(jax.random.key(2), (steps, BATCH))
    state = RESETS(KEYS, RAW)[1]
    record = []
    for t in range(steps):
      _, new, r, terminated, _, info = STEPS(step_keys[t], state, jnp.asarray(actions[t]), RAW)
      record.append((state.board, new.board, r, terminated, info["merged"]))
      state = new
    before, after, r, terminated, merged = (np.concatenate([np.asarray(x[i]) for x in record])
                                            for i in range(5))
    actions = actions.reshape(-1)

    def exps(board):  # tile values -> Jumanji's exponents (0 empty)
      return jnp.where(board > 0, jnp.log2(jnp.maximum(board, 1)).round(), 0).astype(jnp.int32)

    @jax.jit
    @jax.vmap
    def theirs(board, a, new_board):
      slid, reward = jutils.move(exps(board), a)
      mask = jax.vmap(lambda b: jutils.can_move(exps(new_board), b))(jnp.arange(4))
      return (exps(board), exps(new_board), slid, reward, jutils.can_move(exps(board), a), mask,
              game_2048.valid_moves(new_board), game_2048.can_move(new_board))

    old, new, slid, reward, legal, mask, ours_valid, ours_can = map(
        np.asarray, theirs(before, actions, after))
    self.assertEqual(len(actions), 12_288)
    np.testing.assert_array_equal(merged, np.where(legal, reward, 0))
    np.testing.assert_allclose(r, np.where(legal, reward, -0.1), rtol=1e-6)
    np.testing.assert_array_equal(terminated, legal & ~mask.any(-1))
    np.testing.assert_array_equal(ours_valid, mask)
    np.testing.assert_array_equal(ours_can, mask.any(-1))
    diff = new != np.where(legal[:, None, None], slid, old)
    np.testing.assert_array_equal(diff.sum((-2, -1)), legal.astype(int))  # one spawned tile
    spawned = np.where(diff, new, 0).sum((-2, -1))[legal]
    self.assertTrue(np.all(np.isin(spawned, (1, 2))))  # 2 or 4
    self.assertTrue(np.all(np.where(diff, slid, 0) == 0))  # on an empty cell
    self.assertGreater(legal.mean(), 0.5)
    self.assertGreater((reward > 0).mean(), 0.1)
    self.assertGreater((~mask).sum(), 1000)  # blocked moves are common enough to test


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
    boards = np.zeros((len(cases) + 1, 4, 4), np.int32)
    for i, (row, _, _) in enumerate(cases):
      boards[i, 0] = row
    boards[-1, 0, :3] = 2
    after, merged, moved = moves(boards)
    for i, (row, want, m) in enumerate(cases):
      self.assertEqual((after[i, game_2048.LEFT, 0].tolist(), int(merged[i, game_2048.LEFT])),
                       (want, m), row)
    self.assertEqual(after[-1, game_2048.RIGHT, 0].tolist(), [0, 0, 2, 4])
    self.assertEqual(after[-1, game_2048.DOWN, :, 0].tolist(), [0, 0, 0, 2])
    self.assertEqual(moved[-1].tolist(), [False, True, True, True])
    self.assertEqual(merged[-1].tolist(), [0, 4, 0, 4])

  def test_rewards(self):
    board = np.zeros((4, 4), int)
    board[0, :2] = 8
    _, s, r, *_ = step([board], [game_2048.LEFT], PARAMS)  # log reward: 0.1 log2(16 + 1)
    self.assertAlmostEqual(float(r[0]), 0.1 * np.log2(17.0), places=6)
    self.assertEqual(int(s.score[0]), 16)
    _, s, r, *_ = step([board], [game_2048.LEFT], RAW)
    self.assertEqual(float(r[0]), 16.0)
    _, s2, r, terminated, _, info = step([board], [game_2048.UP], PARAMS)  # changes nothing
    self.assertAlmostEqual(float(r[0]), -0.1, places=6)
    np.testing.assert_array_equal(s2.board[0], board)
    self.assertFalse(bool(info["action_effective"][0]) or bool(terminated[0]))
    _, _, r, *_ = step([board], [game_2048.UP], PARAMS.replace(invalid_reward=jnp.float32(0.0)))
    self.assertEqual(float(r[0]), 0.0)  # RAGEN's code under the log reward
    board[1, 0] = 2
    _, _, r, *_ = step([board], [game_2048.DOWN], PARAMS)  # valid, no merge
    self.assertEqual(float(r[0]), 0.0)

  def test_stuck_board_ends_and_renders_ragen_text(self):
    # One free cell: Left slides row 4 to [2048, 2, 4, 0] and the spawn fills
    # the corner: a 2 leaves no move (the game ends, with a 2048 tile: success),
    # a 4 next to the 4 leaves one. The batch holds 1024 spawns of it.
    board = np.array([[4, 8, 4, 8], [8, 4, 8, 4], [4, 8, 16, 8], [2048, 2, 0, 4]])
    _, s, _, terminated, truncated, info = step([board], [game_2048.LEFT])
    spawned = s.board[:, 3, 3]
    self.assertEqual(set(spawned.tolist()), {2, 4})
    self.assertTrue(np.all(s.board[:, 3, :3] == [2048, 2, 4]))
    np.testing.assert_array_equal(terminated, spawned == 2)
    np.testing.assert_array_equal(info["success"], spawned == 2)
    self.assertFalse(truncated.any())
    stuck = np.array([[4, 8, 4, 8], [8, 4, 8, 4], [4, 8, 16, 8], [2048, 2, 4, 2]])
    self.assertEqual(
        text(stuck, 20),
        "Current 2048 Grid:\nRow 1: [4, 8, 4, 8]\nRow 2: [8, 4, 8, 4]\nRow 3: [4, 8, 16, 8]\n"
        "Row 4: [2048, 2, 4, 2]\n\nValid Actions: None.\nGoal: Merge same numbers to reach "
        "2048.\nCurrent Score: 20\nWhat is your next move?")
    some = np.array([[0, 0, 0, 2], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 4]])
    self.assertIn("\n\nValid Actions: 0(Up), 2(Down), 3(Left).\n", text(some))

  def test_spawns(self):
    # Resets: two tiles, 2 with probability 0.9, on uniform cells.
    keys = jax.random.split(jax.random.key(3), (4, BATCH))
    boards = np.concatenate([np.asarray(RESETS(k, PARAMS)[1].board) for k in keys])
    n = len(boards)
    tiles = boards[boards > 0]
    self.assertEqual(tiles.size, 2 * n)
    self.assertAlmostEqual(float(np.mean(tiles == 2)), 0.9, delta=0.01)  # sd 0.0033
    cells = (boards > 0).reshape(n, 16).mean(0)
    self.assertLess(np.abs(cells - 2 / 16).max(), 0.025)  # sd 0.0052
    only4 = RESETS(KEYS, PARAMS.replace(two_prob=jnp.float32(0.0)))[1].board
    self.assertTrue(np.all(np.isin(np.asarray(only4), (0, 4))))
    # A step's spawn: one tile on one of the empty cells, uniformly.
    board = np.zeros((4, 4), int)
    board[0] = [2, 4, 8, 16]
    spawned = step([board], [game_2048.UP], PARAMS, keys[0])[1].board  # invalid: no spawn
    self.assertTrue(np.all(spawned == board))
    spawned = step([board], [game_2048.DOWN], PARAMS, keys[0])[1].board[:, :3]
    counts = (spawned > 0).sum(0)
    self.assertEqual(counts.sum(), BATCH)
    self.assertLess(np.abs(counts / BATCH - 1 / 12).max(), 0.03)  # sd 0.0086


class ExpertTest(absltest.TestCase):

  def test_greedy_expert_moves_validly_and_outscores_random_play(self):
    # Rows 0..31 follow the expert; every other row plays uniformly random
    # moves from one of the same 32 starts (31 random games per start).
    n, steps = EXPERT_BATCH, 40
    start = jax.device_get(RESETS(KEYS, PARAMS)[1])
    state = jax.tree.map(lambda x: np.resize(x[:n], (BATCH,) + x.shape[1:]), start)
    rng = np.random.default_rng(0)
    for t in range(steps):
      host = jax.device_get(state)
      names = GAME.expert_answers([jax.tree.map(lambda x, i=i: x[i], host) for i in range(n)],
                                  [PARAMS] * n)
      actions = rng.integers(0, 4, BATCH).astype(np.int32)
      actions[:n] = [GAME.action_names.index(a) for a in names]
      _, state, _, _, _, info = STEPS(jax.random.split(jax.random.key(t), BATCH), state,
                                      jnp.asarray(actions), PARAMS)
      # A valid move whenever one exists.
      can = moves(host.board[:n])[2].any(-1)
      np.testing.assert_array_equal(np.asarray(info["action_effective"])[:n], can)
    score = np.asarray(state.score)
    expert, random = score[:n].mean(), score[n:].mean()
    self.assertGreater(expert, 1.2 * random)  # measured 270 vs 205
    two = GAME.expert_answers([jax.tree.map(lambda x: x[0], start)], [PARAMS],
                              actions_per_turn=3)[0]
    self.assertTrue(1 <= len(two.split(" || ")) <= 3)


class TargetTileTest(absltest.TestCase):
  """``target_tile``: making the tile is success and ends the episode; unset: RAGEN's rule."""

  def test_reaching_the_target_ends_with_success(self):
    env, params = envs_jax.make("Game2048-4x4-tile16-v0")
    game = env.unwrapped
    self.assertEqual(game.target_tile, 16)
    step16 = jax.jit(jax.vmap(game.step, in_axes=(0, 0, 0, None)))
    keys = KEYS[:8]
    # Row 1: Left merges 8 + 8 into the target 16; row 2: 4 + 4 = 8, short of it;
    # row 3: Left makes no 16, and the spawn in the corner leaves no move iff it is a 2.
    boards = np.zeros((8, 4, 4), np.int32)
    boards[0, 0, :2] = 8
    boards[1, 0, :2] = 4
    boards[2] = [[2, 4, 2, 4], [4, 2, 4, 2], [2, 4, 2, 4], [4, 2, 0, 8]]
    actions = np.full(8, game_2048.LEFT, np.int32)
    state = game_2048.Game2048State(board=jnp.asarray(boards), score=jnp.zeros(8, jnp.int32))
    _, s, r, terminated, _, info = jax.device_get(step16(keys, state, jnp.asarray(actions),
                                                         params))
    self.assertEqual(s.board[0, 0, 0], 16)
    np.testing.assert_array_equal(s.board[2, 3, :3], [4, 2, 8])
    np.testing.assert_array_equal(info["success"][:3], [True, False, False])
    np.testing.assert_array_equal(terminated[:3], [True, False, s.board[2, 3, 3] == 2])
    self.assertAlmostEqual(float(r[0]), 0.1 * np.log2(17), places=6)  # rewards unchanged
    # RAGEN's rule on the same move: a 16 neither ends the game nor succeeds.
    _, _, _, terminated, _, info = step([boards[0]], [game_2048.LEFT], PARAMS)
    self.assertFalse(terminated.any() or info["success"].any())
    # The goal line names the target; RAGEN's says 2048.
    self.assertIn("Goal: Merge same numbers to reach 16.\n", game.render_text(
        jax.tree.map(lambda x: x[0], s)))
    self.assertIn("reach 2048.", text(boards[0]))
    self.assertIn("You win when a tile reaches 16.", game.instructions)

  def test_bad_target_raises(self):
    for bad in (4, 12, 2, 0, -16, True, 16.0, "16"):
      with self.assertRaisesRegex(ValueError, f"target_tile .*got {bad!r}"):
        game_2048.Game2048(target_tile=bad)
    self.assertEqual(game_2048.Game2048(target_tile=np.int64(32)).target_tile, 32)


class BadArgumentsTest(absltest.TestCase):

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "size"):
      game_2048.Game2048(size=1)
    with self.assertRaisesRegex(ValueError, "two_prob"):
      game_2048.Game2048(two_prob=1.5)
    with self.assertRaisesRegex(ValueError, "out of range"):
      state = game_2048.Game2048State(board=jnp.zeros((4, 4), jnp.int32), score=jnp.int32(0))
      GAME.step(jax.random.key(0), state, 4, PARAMS)


if __name__ == "__main__":
  absltest.main()
