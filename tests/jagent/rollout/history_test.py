"""Bounded-history rollouts (``RolloutConfig.history_turns >= 0``): one row per turn.

The on-device rollout assembles each turn's window from token segments
rendered at earlier turns; the reference (``host_rollout``) re-encodes the
windowed conversation from text every turn, as RAGEN's ``ctx_manager.py``
does. Under greedy decoding they must agree token for token and on every
field. Policies are rollout_test's bigram model (valid answers, so actions
really play) and its random model in think mode (arbitrary replies, EOS,
format penalties).
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from experiments import blocks
from experiments.configs import tiny
from jagent import models
from jagent import rollout
from jagent import train
from tests.jagent.rollout import rollout_test as rt

ROW_FIELDS = ("row_valid", "row_episode", "row_turn")
T = 4  # max_turns


def check_rows(test, traj, k):
  """Layout invariants of a bounded-history trajectory (B episodes, R = B * T rows)."""
  b = traj.num_turns.shape[0]
  t_max = traj.turn_rewards.shape[1]
  r = np.arange(b * t_max)
  test.assertEqual(traj.history_turns, k)
  test.assertEqual(traj.tokens.shape[0], b * t_max)
  np.testing.assert_array_equal(traj.row_episode, r // t_max)
  np.testing.assert_array_equal(traj.row_turn, r % t_max)
  taken = r % t_max < np.asarray(traj.num_turns)[r // t_max]
  np.testing.assert_array_equal(traj.row_valid, taken)
  mask = np.asarray(traj.loss_mask)
  tids = np.asarray(traj.turn_ids)
  # Each row trains exactly the reply sampled at its turn, once.
  np.testing.assert_array_equal(mask.sum(1), np.asarray(traj.reply_lengths).reshape(-1))
  np.testing.assert_array_equal(tids, np.where(mask, (r % t_max)[:, None], -1))
  np.testing.assert_array_equal(np.asarray(traj.length)[~taken], 0)
  np.testing.assert_array_equal(mask[~taken].any(1), False)
  np.testing.assert_allclose(np.asarray(traj.token_rewards).sum(1),
                             np.asarray(traj.turn_rewards).reshape(-1), rtol=1e-6)
  # The reply is the row's last tokens.
  length = np.asarray(traj.length)
  last = np.where(mask, np.arange(mask.shape[1])[None], -1).max(1)
  np.testing.assert_array_equal(last[taken], length[taken] - 1)
  # While the window still reaches turn 1, a row extends the previous one.
  tokens = np.asarray(traj.tokens)
  for row in r[taken & (r % t_max >= 1) & (r % t_max <= k)]:
    n = length[row - 1]
    np.testing.assert_array_equal(tokens[row, :n], tokens[row - 1, :n])


def run_both(env_id, params, prompt, config, key=0):
  env, env_params = envs_jax.make(env_id)
  text_env = rollout.TextEnv(env, rt.TOK, prompt, verify_states=8)
  s = rollout.context_size(text_env, config)
  device = rollout.make_rollout(text_env, rt.MICRO, config)(params, jax.random.key(key))
  hosts = [rollout.JaxEnvAsHost(env, env_params) for _ in range(config.batch_size)]
  ref = rollout.host_rollout(
      params, jax.random.key(key), hosts, text_env.conversation, model_config=rt.MICRO,
      config=config, context_size=s,
      anchor_symbols=lambda b: env.render_symbols(hosts[b].state))
  return text_env, device, ref


def assert_same(device, ref):
  for f in rt.FIELDS + ROW_FIELDS:
    np.testing.assert_array_equal(np.asarray(getattr(device, f)),
                                  np.asarray(getattr(ref, f)), err_msg=f)
  np.testing.assert_allclose(device.logprobs, ref.logprobs, atol=1e-5)
  assert device.history_turns == ref.history_turns


@pytest.mark.heavy
class HistoryReferenceTest(parameterized.TestCase):

  # Every game, k = 0 and 2 on the multi-turn ones (with T = 4 the window of
  # turn 3 drops turn 0); Bandit and Countdown end after one turn, so one k
  # each covers them. The k = 2 cases play the ids of another size and of
  # other dynamics (Sokoban's 8x8 grid of 2 boxes, deterministic FrozenLake):
  # 7 of the 11 registered ids. The other 4 need no rollout of their own: the
  # window is assembled on device from the token segments the id's TextEnv
  # rendered (their widths are all it reads of the game) and k is only window
  # arithmetic, so a game's ids share this code at every k, and what differs
  # per id is checked per id elsewhere: Sokoban-6x6-1box-altsym's symbols
  # rendered against the tokenizer (text_test's DeviceRenderingTest),
  # Boxoban-medium's and -hard's level data (boxoban_data_test), BanditTest's
  # arm names (bandit_test, experts_test). A case costs ~20-40 s of compiles.
  @parameterized.parameters(("Sokoban-6x6-1box-v0", 0), ("Sokoban-8x8-2box-v0", 2),
                            ("FrozenLake-4x4-v0", 0), ("FrozenLake-4x4-det-v0", 2),
                            ("Boxoban-unfiltered-test-v0", 2), ("Bandit-v0", 0),
                            ("Countdown-v0", 2))
  def test_greedy_answers_equal_reencoding_host_loop(self, env_id, k):
    reply = "<answer>" + rt.ANSWERS.get(env_id, "Up || Left") + "</answer>"
    config = rollout.RolloutConfig(num_groups=1, group_size=2, max_turns=T,
                                   max_tokens_per_turn=16, greedy=True, history_turns=k)
    prompt = rollout.PromptConfig.compact(think=False, max_actions_per_turn=2)
    text_env, device, ref = run_both(env_id, rt.bigram_params(reply), prompt, config)
    assert_same(device, ref)
    check_rows(self, device, k)
    taken = np.asarray(device.row_valid)
    self.assertTrue(np.all(np.asarray(device.format_valid).reshape(-1)[taken]))
    self.assertGreater(int(np.sum(device.num_actions)), 0)
    # Row (episode 0, last turn taken): the window's opening is at turn t - k.
    t = int(device.num_turns[0]) - 1
    text = rt.TOK.decode(np.asarray(device.tokens[t, :device.length[t]]))
    self.assertEqual(text.count("<|im_start|>system"), 1)
    self.assertIn(f"Turn {max(0, t - k) + 1}:", text)
    self.assertEqual(text.count("<|im_start|>assistant\n" + reply), min(t, k) + 1)
    self.assertTrue(text.endswith("<|im_start|>assistant\n" + reply))
    self.assertIn(text_env.conversation.instructions, text)
    self.assertLessEqual(int(np.max(device.length)), rollout.context_size(text_env, config))

  def test_sampled_eos_ends_each_history_reply_once(self):
    # Replies that end with a sampled EOS (no </answer>: format penalties):
    # in the window the next prompt omits the EOS, as in the full layout.
    config = rollout.RolloutConfig(num_groups=1, group_size=2, max_turns=3,
                                   max_tokens_per_turn=16, greedy=True, history_turns=2)
    params = rt.bigram_params("<answer>Up || Left", eos=True)
    prompt = rollout.PromptConfig.compact(think=False)
    _, device, ref = run_both("Sokoban-6x6-1box-v0", params, prompt, config)
    assert_same(device, ref)
    check_rows(self, device, 2)
    tokens, mask = np.asarray(device.tokens), np.asarray(device.loss_mask)
    for row in range(6):
      self.assertEqual(tokens[row][mask[row]][-1], rt.TOK.eos_id)
      text = rt.TOK.decode(tokens[row, :device.length[row]])
      self.assertEqual(text.count("<|im_end|>"), 2 * (row % 3) + 3)  # system, users, replies
      self.assertNotIn("<|im_end|><|im_end|>", text)

  def test_random_think_replies_equal_reencoding_host_loop_and_forward_logprobs(self):
    # Arbitrary replies: sampled EOS (the next prompt omits it), long replies,
    # format penalties, all inside windows of 1 history turn.
    config = rollout.RolloutConfig(num_groups=1, group_size=3, max_turns=3,
                                   max_tokens_per_turn=24, greedy=True, history_turns=1)
    params = rt.random_params()
    _, device, ref = run_both("Sokoban-6x6-1box-v0", params, rollout.PromptConfig.compact(),
                              config)
    assert_same(device, ref)
    check_rows(self, device, 1)
    # Sampler log-probs equal a full forward pass over each row.
    tokens = device.tokens
    s = tokens.shape[1]
    logits, _ = models.apply(params, tokens, jnp.broadcast_to(jnp.arange(s), tokens.shape),
                             config=rt.MICRO)
    logp = jax.nn.log_softmax(logits, axis=-1)
    full = jnp.take_along_axis(logp[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    mask = np.asarray(device.loss_mask)[:, 1:]
    self.assertGreater(mask.sum(), 50)
    np.testing.assert_allclose(np.asarray(full)[mask],
                               np.asarray(device.logprobs)[:, 1:][mask], atol=1e-5)
    metrics = device.metrics()
    self.assertAlmostEqual(float(metrics["reply_tokens"]),
                           float(np.sum(device.reply_lengths) / np.sum(device.num_turns)),
                           places=5)
    self.assertTrue(all(np.isfinite(float(v)) for v in metrics.values()))


class HistoryConfigTest(absltest.TestCase):

  def test_bad_settings_fail_before_compile_naming_the_field(self):
    for bad in (-2, 1.5, True):
      with self.assertRaisesRegex(ValueError, "RolloutConfig.history_turns"):
        rollout.RolloutConfig(history_turns=bad)
    env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
    text_env = rollout.TextEnv(env, rt.TOK, rollout.PromptConfig.compact(), verify_states=8)
    config = rollout.RolloutConfig(max_turns=5, max_tokens_per_turn=16, history_turns=2)
    need = rollout.context_size(text_env, config)
    self.assertEqual(need, text_env.first_width + 16 + 2 * (text_env.next_width + 16))
    # k + 1 >= max_turns: a row is never longer than the full conversation.
    full = rollout.context_size(text_env, dataclasses.replace(config, history_turns=-1))
    self.assertEqual(
        rollout.context_size(text_env, dataclasses.replace(config, history_turns=7)), full)
    # A turn row's first reply follows its window (the row minus its reply
    # budget); a whole episode's follows turn 1's prompt.
    self.assertEqual(rollout.first_reply_prompt_tokens(text_env, config), need - 16)
    self.assertEqual(rollout.first_reply_prompt_tokens(
        text_env, dataclasses.replace(config, history_turns=-1)), text_env.first_width)
    self.assertEqual(config.rows_per_episode, 5)
    self.assertEqual(dataclasses.replace(config, history_turns=-1).rows_per_episode, 1)
    short = dataclasses.replace(config, context_size=need - 1)
    with self.assertRaisesRegex(ValueError, "context_size.*history_turns"):
      rollout.make_rollout(text_env, rt.MICRO, short)
    with self.assertRaisesRegex(ValueError, "context_size.*history_turns"):
      rollout.demonstrations(text_env, key=jax.random.key(0), config=short)

  def test_demonstrations_in_the_same_mode(self):
    env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
    text_env = rollout.TextEnv(env, rt.TOK, rollout.PromptConfig.compact(think=False),
                               verify_states=8)
    config = rollout.RolloutConfig(num_groups=2, group_size=1, max_turns=T,
                                   max_tokens_per_turn=16, history_turns=0)
    demo = rollout.demonstrations(text_env, key=jax.random.key(0), config=config)
    check_rows(self, demo, 0)
    self.assertGreater(float(np.mean(demo.success)), 0.0)
    # k = 0: every taken row is the opening at its own turn and one reply.
    for row in np.flatnonzero(np.asarray(demo.row_valid)):
      text = rt.TOK.decode(np.asarray(demo.tokens[row, :demo.length[row]]))
      self.assertEqual(text.count("<|im_start|>assistant"), 1)
      self.assertIn(f"Turn {row % T + 1}:", text)
    # The workdir's samples: one text per episode, each turn's context in it.
    samples = train.decode_samples(demo, rt.TOK, num=5)
    self.assertLen(samples, 2)
    for b, sample in enumerate(samples):
      turns = int(demo.num_turns[b])
      self.assertEqual(sample["turns"], turns)
      self.assertEqual(sample["text"].count("=== turn "), turns)
      self.assertEqual(sample["text"].count("<|im_start|>system"), turns)

  def test_experiments_config_field(self):
    config = tiny.get_config()
    # The main job trains one row per turn; -1 is the whole conversation.
    self.assertEqual(blocks.rollout_config(config).history_turns, 0)
    self.assertEqual(blocks.eval_rollout_config(config).history_turns, 0)
    config.rollout.history_turns = -1
    self.assertEqual(blocks.rollout_config(config).history_turns, -1)
    self.assertEqual(blocks.eval_rollout_config(config).history_turns, -1)
    config.rollout.history_turns = -3
    with self.assertRaisesRegex(ValueError, "config.rollout.history_turns=-3"):
      blocks.rollout_config(config)


if __name__ == "__main__":
  absltest.main()
