"""Tests of the text layer: prompts, host texts, device rendering checks."""

import pathlib

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

import envs_jax
from jagent import rollout
from jagent import tokenizers

TOK = tokenizers.load_tiny_tokenizer()
HF_DIR = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "hf_tokenizer"


def sokoban_state():
  env, params = envs_jax.make("Sokoban-6x6-1box-v0")
  _, state = env.reset(jax.random.key(0), params)
  return env, state


class HostTextTest(absltest.TestCase):

  def test_compact_turn_texts_by_hand(self):
    env, state = sokoban_state()
    te = rollout.TextEnv(env, TOK, rollout.PromptConfig.compact(), verify_states=4)
    grid = env.render_text(state)
    instr = rollout.default_instructions(env)
    hint = ("Reply as <think> [your reasoning] </think> <answer> [your answer] </answer> "
            "and nothing else.")
    self.assertEqual(
        te.first_text(grid, 10),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"{instr}\n{hint}\nTurn 1:\n{grid}\n<|im_end|>\n<|im_start|>assistant\n<think>")
    self.assertEqual(
        te.next_text(grid, 2, 7, -0.1, eos_sampled=False),
        f"<|im_end|>\n<|im_start|>user\nReward:\n-0.1\nTurn 2:\n{grid}\n<|im_end|>\n"
        "<|im_start|>assistant\n<think>")
    self.assertEqual(
        te.next_text(grid, 3, 7, 10.9, eos_sampled=True),
        f"\n<|im_start|>user\nReward:\n10.9\nTurn 3:\n{grid}\n<|im_end|>\n"
        "<|im_start|>assistant\n<think>")
    self.assertIn("#: wall, _: empty, O: target", instr)
    self.assertIn("Up, Down, Left, Right", instr)

  def test_ragen_prompt_mentions_budget_and_format(self):
    env, state = sokoban_state()
    te = rollout.TextEnv(env, TOK, verify_states=4)
    text = te.first_text(env.render_text(state), 10)
    self.assertIn("Turn 1:\nState:\n", text)
    self.assertIn("You have 10 actions left.", text)
    self.assertTrue(text.endswith("<|im_start|>assistant\n<think>"))

  def test_answer_only_has_no_primer(self):
    conv = rollout.Conversation(TOK, rollout.PromptConfig(think=False), "Play.", ("A", "B"))
    self.assertEqual(conv.generation_prompt, "<|im_end|>\n<|im_start|>assistant\n")
    self.assertFalse(conv.parse_spec().think)
    self.assertEqual(conv.parse_spec().action_names, ("A", "B"))

  def test_llama3_template_pieces(self):
    conv = rollout.Conversation(TOK, rollout.PromptConfig(chat_template="llama3"), "Play.")
    self.assertEqual(conv.first_prefix,
                     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                     "You are a helpful assistant who plays text games well.<|eot_id|>"
                     "<|start_header_id|>user<|end_header_id|>\n\n")
    self.assertEqual(conv.generation_prompt,
                     "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>")
    self.assertEqual(conv.after_reply, "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n")

  def test_plain_template_pieces_and_rendering(self):
    env, state = sokoban_state()
    prompt = rollout.PromptConfig.compact(chat_template="plain", think=False)
    te = rollout.TextEnv(env, TOK, prompt, verify_states=32)
    grid = env.render_text(state)
    self.assertTrue(te.first_text(grid, 10).startswith("System: You are a helpful assistant.\n"
                                                       "User: "))
    self.assertEqual(te.next_text(grid, 2, 9, 1.0, eos_sampled=True),
                     f"\nUser: Reward:\n1.0\nTurn 2:\n{grid}\n\nAssistant: ")

  def test_format_reward(self):
    for x, want in ((-0.1, "-0.1"), (10.9, "10.9"), (0.0, "0.0"), (-0.30000001, "-0.3"),
                    (1.25, "1.25"), (np.float32(-0.2) + np.float32(-0.1), "-0.3")):
      self.assertEqual(rollout.format_reward(x), want)


class DeviceRenderingTest(parameterized.TestCase):

  # Every rendering: the games, plus Sokoban's other grid size and symbols
  # (rollout_test plays one id per game). The Sudoku and Coord ids are checked
  # the same way in tests/envs_jax/sudoku_test.py and coord_envs_test.py.
  @parameterized.parameters("Sokoban-6x6-1box-v0", "Sokoban-6x6-1box-altsym-v0",
                            "Sokoban-8x8-2box-v0", "FrozenLake-4x4-v0", "Bandit-v0",
                            "Countdown-v0", "Game2048-4x4-v0", "RubiksCube-2x2-v0")
  def test_ragen_prompt_agrees_with_tokenizer(self, env_id):
    env, _ = envs_jax.make(env_id)
    te = rollout.TextEnv(env, TOK, verify_states=64)  # raises on any disagreement
    self.assertGreater(te.first_width, te.next_width)

  def test_device_tokens_equal_encode_of_host_text(self):
    env, state = sokoban_state()
    te = rollout.TextEnv(env, TOK, rollout.PromptConfig.compact(), verify_states=4)
    toks, n = jax.jit(te.next_prompt)(state, jnp.int32(4), jnp.int32(3), jnp.float32(0.9),
                                      jnp.bool_(False))
    want = TOK.encode(te.next_text(env.render_text(state), 4, 3, 0.9, False))
    self.assertEqual(list(np.asarray(toks)[:int(n)]), want)
    self.assertTrue(np.all(np.asarray(toks)[int(n):] == 0))

  def test_merging_template_is_refused(self):
    env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
    # " -" is one sentencepiece token: "Reward: -0.1" cannot render piece by piece.
    bad = rollout.PromptConfig.compact(next_turn="Reward: {reward}\nTurn {turn}:\n{state}\n")
    with self.assertRaisesRegex(ValueError, "does not tokenize .* piece by piece"):
      rollout.TextEnv(env, TOK, bad, verify_states=64)

  def test_merging_tokenizer_is_refused(self):
    env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
    bpe = tokenizers.HFTokenizer(str(HF_DIR))  # byte-level BPE merges runs of "#"
    with self.assertRaisesRegex(ValueError, "HFTokenizer does not tokenize"):
      rollout.TextEnv(env, bpe, rollout.PromptConfig.compact(), verify_states=16)

  def test_bad_prompt_fields(self):
    with self.assertRaisesRegex(ValueError, "first_turn uses {score}"):
      rollout.PromptConfig(first_turn="{score}")
    with self.assertRaisesRegex(ValueError, "max_actions_per_turn"):
      rollout.PromptConfig(max_actions_per_turn=0)
    with self.assertRaisesRegex(ValueError, "chat_template"):
      rollout.Conversation(TOK, rollout.PromptConfig(chat_template="nope"), "x")


class _CountedLake(envs_jax.FrozenLake):
  """FrozenLake counting the traces of its text-sizing states (one per compiled draw)."""

  traces = 0

  def text_sizing_state(self, key, params):
    type(self).traces += 1
    return super().text_sizing_state(key, params)


class DrawCacheTest(absltest.TestCase):
  """A TextEnv built again from equal pieces reuses the compiled draw of the first."""

  def test_equal_pieces_trace_once_and_each_piece_is_in_the_key(self):
    prompt = rollout.PromptConfig.compact()

    def build(env=None, params=None, **kw):
      before = _CountedLake.traces
      te = rollout.TextEnv(env or _CountedLake(num_candidates=3), TOK, kw.pop("prompt", prompt),
                           env_params=params, verify_states=8, **kw)
      return te, _CountedLake.traces - before

    first, traced = build()
    self.assertEqual(traced, 1)
    # Another env object of the same settings, another seed: no new trace,
    # and the same widths and the same verification (it raised nothing).
    again, traced = build(verify_seed=5)
    self.assertEqual(traced, 0)
    self.assertEqual((again.first_width, again.next_width),
                     (first.first_width, first.next_width))
    for states, seed, want in ((8, 1, 1), (8, 2, 0), (16, 1, 1)):
      before = _CountedLake.traces
      (again if seed == 1 else first).verify(states, seed=seed)  # the batch is in the key
      self.assertEqual(_CountedLake.traces - before, want, (states, seed))
    # Each piece the program reads makes another program: an env attribute
    # (candidate maps per reset), a param value, the prompt's text.
    lake = _CountedLake(num_candidates=3)
    slippery = lake.default_params.replace(success_rate=jnp.float32(0.9))
    for name, kw in (("attribute", dict(env=_CountedLake(num_candidates=4))),
                     ("params", dict(env=lake, params=slippery)),
                     ("prompt", dict(prompt=rollout.PromptConfig.compact(system="Hi.")))):
      with self.subTest(name):
        self.assertEqual(build(**kw)[1], 1)
        self.assertEqual(build(**kw)[1], 0)


if __name__ == "__main__":
  absltest.main()
