"""Tests of the one-program rollout against the RAGEN-style host-loop reference.

Two policies drive the rollouts through the real sampler:
- a hand-built "bigram" transformer (attention and MLP outputs zeroed, so the
  logits depend only on the current token) whose greedy continuation of the
  assistant header spells a fixed valid answer, e.g. ``<answer>Up || Left
  </answer>``: actions are parsed and played every turn (moves, holes, goals,
  action budgets, Bandit arms, Countdown answers, Sudoku placements, cube
  turns, 2048 merges);
- a random transformer in think mode, whose replies are arbitrary bytes
  (format penalties, long replies, context overflow).
The reference (``host_rollout(reencode=True)``) re-tokenizes the whole
conversation from text every turn and prefills it from an empty cache; the
on-device rollout keeps the KV cache across turns and renders prompts on
device. They must agree token for token.
"""

import ast
import dataclasses
import pathlib

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from jagent import models
from jagent import rollout
from jagent import tokenizers
from jagent import train
from jagent.rollout import _trajectory
from tests.jagent.models import sharpen

TOK = tokenizers.load_tiny_tokenizer()
ANSWERS = {  # one valid reply per game, spelled by tokens that never repeat
    "Bandit-v0": "Dragon", "BanditTest-v0": "Trader", "Countdown-v0": "1 + 2",
    "FrozenLake-4x4-v0": "Down || Right", "FrozenLake-4x4-det-v0": "Down || Right",
    "CoordFrozenLake-4x4-v0": "Down || Right", "CoordSokoban-6x6-1box-v0": "Up || Left",
    "Game2048-4x4-v0": "Up || Left", "RubiksCube-2x2-v0": "U || R'",
    "Sudoku-4x4-v0": "3 at 1,2",  # RAGEN's "N at R,C": place 3 at row 1 col 2
}
MICRO = models.ModelConfig(vocab_size=512, embed_dim=64, num_layers=1, num_heads=2,
                           num_kv_heads=1, head_dim=16, mlp_dim=64, tie_embeddings=False,
                           eos_id=TOK.eos_id, pad_id=0)
FIELDS = ("tokens", "loss_mask", "turn_ids", "token_rewards", "length", "turn_rewards",
          "scores", "num_turns", "reply_lengths", "format_valid", "num_pieces", "num_valid",
          "num_executed", "num_effective", "anchor_hashes", "num_actions", "success",
          "terminated", "truncated", "end_reason", "overflow", "group_ids")


def bigram_params(reply: str, key=0, eos: bool = False) -> models.Params:
  """A MICRO transformer whose greedy reply after ``"\\n"`` is ``reply``.

  Attention and MLP write nothing (``wo = w_down = 0``), so the last hidden
  state is the normalized embedding of the current token, and ``lm_head``
  maps each token of the chain to its successor. ``eos``: the reply ends
  with a sampled EOS token.
  """
  ids = [4] + TOK.encode(reply) + ([TOK.eos_id] if eos else [])  # 4 = "\n", the header's end
  succ = {}
  for a, b in zip(ids[:-1], ids[1:]):
    if succ.setdefault(a, b) != b:
      raise ValueError(f"{reply!r}: token {a} has two successors")
  p = models.init(MICRO, jax.random.key(key))
  e = np.asarray(p.embed, np.float64) * 50.0
  unit = e / np.linalg.norm(e, axis=1, keepdims=True)
  head = np.zeros((MICRO.embed_dim, MICRO.vocab_size))
  for a, b in succ.items():
    head[:, b] += 40.0 * unit[a] * np.sqrt(MICRO.embed_dim)
  layers = p.layers.replace(wo=jnp.zeros_like(p.layers.wo),
                            w_down=jnp.zeros_like(p.layers.w_down))
  return p.replace(embed=jnp.asarray(e, jnp.float32), layers=layers,
                   lm_head=jnp.asarray(head, jnp.float32))


def random_params(key=0) -> models.Params:
  p = models.init(MICRO, jax.random.key(key))
  return sharpen.sharpened(p, 10.0)


def run_both(env_id, params, prompt, config, key=0):
  env, env_params = envs_jax.make(env_id)
  text_env = rollout.TextEnv(env, TOK, prompt, verify_states=8)
  s = rollout.context_size(text_env, config)
  device = rollout.make_rollout(text_env, MICRO, config)(params, jax.random.key(key))
  hosts = [rollout.JaxEnvAsHost(env, env_params) for _ in range(config.batch_size)]
  ref = rollout.host_rollout(
      params, jax.random.key(key), hosts, text_env.conversation, model_config=MICRO,
      config=config, context_size=s, reencode=True,
      anchor_symbols=lambda b: env.render_symbols(hosts[b].state))
  return text_env, device, ref


_ROOT = pathlib.Path(__file__).resolve().parents[3]


def _module_file(name):
  """The file of module ``name`` under the repository root, or None."""
  base = _ROOT.joinpath(*name.split("."))
  for f in (base.with_suffix(".py"), base / "__init__.py"):
    if f.is_file():
      return f
  return None


def _jagent_imports(path):
  """Names of the jagent modules that the file ``path`` imports."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.add(node.module)
      out.update(f"{node.module}.{a.name}" for a in node.names)
  return {m for m in out if m.startswith("jagent.") and _module_file(m)}


class LayeringTest(absltest.TestCase):

  def test_rollout_does_not_import_transforms(self):
    # The sampler is a sibling of the objectives: jagent.train builds their
    # Batch (train.trajectory_batch). Follows imports transitively through
    # jagent's subpackages (not jagent/__init__.py, which loads everything).
    todo = [f"jagent.rollout.{p.stem}" if p.stem != "__init__" else "jagent.rollout"
            for p in (_ROOT / "jagent" / "rollout").glob("*.py")]
    seen = set()
    while todo:
      name = todo.pop()
      if name in seen:
        continue
      seen.add(name)
      parts = name.split(".")
      # Importing a.b.c runs the __init__ of a.b (jagent's own excepted).
      todo.extend(".".join(parts[:i]) for i in range(2, len(parts)))
      todo.extend(_jagent_imports(_module_file(name)))
    self.assertIn("jagent.models", seen)  # the walk does follow imports
    self.assertEqual(sorted(m for m in seen if m.startswith("jagent.transforms")), [])


@pytest.mark.heavy
class RolloutReferenceTest(parameterized.TestCase):

  def assert_same(self, device, ref):
    for f in FIELDS:
      np.testing.assert_array_equal(np.asarray(getattr(device, f)),
                                    np.asarray(getattr(ref, f)), err_msg=f)
    np.testing.assert_allclose(device.logprobs, ref.logprobs, atol=1e-5)

  # One env per game: the other registered ids differ only in level data
  # (Boxoban-hard / -medium), grid size and boxes (Sokoban-8x8-2box), symbols
  # (Sokoban-6x6-1box-altsym), dynamics (FrozenLake-4x4-det), arm names
  # (BanditTest) or grid size and empty cells (Sudoku-9x9-easy / -medium share
  # Sudoku-4x4's code: generator, parser, rendering). The env tests cover
  # those, and the on-device rendering of each id is checked against the
  # tokenizer in text_test.py (TextEnv's verify_states); a whole rollout per id
  # (~20 s of compile each) added nothing the game's one rollout does not check.
  # The Coord ids are their own game modules (coordinate text over the base
  # games), so they get a rollout of their own.
  @parameterized.parameters("Bandit-v0", "Boxoban-unfiltered-test-v0", "Countdown-v0",
                            "FrozenLake-4x4-v0", "Sokoban-6x6-1box-v0", "Game2048-4x4-v0",
                            "RubiksCube-2x2-v0", "Sudoku-4x4-v0", "CoordSokoban-6x6-1box-v0",
                            "CoordFrozenLake-4x4-v0")
  def test_greedy_answers_equal_reencoding_host_loop(self, env_id):
    reply = "<answer>" + ANSWERS.get(env_id, "Up || Left") + "</answer>"
    config = rollout.RolloutConfig(num_groups=2, group_size=2, max_turns=5,
                                   max_tokens_per_turn=16, greedy=True)
    prompt = rollout.PromptConfig.compact(think=False, max_actions_per_turn=2)
    _, device, ref = run_both(env_id, bigram_params(reply), prompt, config)
    self.assert_same(device, ref)
    # The replies are valid and their actions were played.
    taken = np.arange(5)[None] < np.asarray(device.num_turns)[:, None]
    self.assertTrue(np.all(np.asarray(device.format_valid)[taken]))
    self.assertGreater(int(np.sum(device.num_actions)), 0)
    text = TOK.decode(np.asarray(device.tokens[0, :device.length[0]]))
    self.assertIn("<|im_start|>assistant\n" + reply, text)
    self.assertTrue(np.all(np.asarray(device.end_reason) > 0))
    if env_id.startswith(("Bandit", "Countdown")):  # single turn, one answer
      np.testing.assert_array_equal(device.num_turns, 1)
      np.testing.assert_array_equal(device.end_reason, _trajectory.TERMINATED)
    # Named moves: every turn plays both actions, so a row that did not end at
    # a goal, hole or solved cube used up 2 x 5 turns = the budget of 10. The
    # prefixes are spelled out: "CoordSokoban" does not start with "Sokoban".
    if env_id.startswith(("Sokoban", "Boxoban", "CoordSokoban", "FrozenLake",
                          "CoordFrozenLake", "Game2048", "RubiksCube")):
      alive = ~np.asarray(device.terminated)
      np.testing.assert_array_equal(np.asarray(device.num_actions)[alive], 10)
      np.testing.assert_array_equal(np.asarray(device.end_reason)[alive],
                                    _trajectory.ACTION_BUDGET)
    if env_id.startswith("Sudoku"):  # free text: one move a turn, 6 empty cells stay unsolved
      np.testing.assert_array_equal(device.num_actions, 5)
      np.testing.assert_array_equal(device.end_reason, _trajectory.MAX_TURNS)
    if env_id == "Bandit-v0":  # the high arm: success on every row
      np.testing.assert_array_equal(device.success, True)

  @parameterized.parameters("Sokoban-6x6-1box-v0", "Countdown-v0")
  def test_random_think_replies_equal_reencoding_host_loop(self, env_id):
    config = rollout.RolloutConfig(num_groups=2, group_size=2, max_turns=3,
                                   max_tokens_per_turn=24, greedy=True)
    _, device, ref = run_both(env_id, random_params(), rollout.PromptConfig.compact(), config)
    self.assert_same(device, ref)
    np.testing.assert_allclose(np.asarray(device.turn_rewards)[np.asarray(
        ~device.format_valid) & (np.arange(3)[None] < np.asarray(device.num_turns)[:, None])],
                               -0.1, rtol=1e-6)

  def test_context_overflow_ends_episode_as_truncated(self):
    env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
    text_env = rollout.TextEnv(env, TOK, rollout.PromptConfig.compact(), verify_states=8)
    s = text_env.first_width + 24 + text_env.next_width // 2  # room for turn 1 only
    config = rollout.RolloutConfig(num_groups=2, group_size=2, max_turns=3,
                                   max_tokens_per_turn=24, greedy=True, context_size=s)
    params = random_params(1)
    device = rollout.make_rollout(text_env, MICRO, config)(params, jax.random.key(0))
    np.testing.assert_array_equal(device.end_reason, _trajectory.CONTEXT_OVERFLOW)
    np.testing.assert_array_equal(device.overflow, True)
    np.testing.assert_array_equal(device.truncated, True)
    np.testing.assert_array_equal(device.num_turns, 1)
    self.assertTrue(np.all(np.asarray(device.length) <= s))
    hosts = [rollout.JaxEnvAsHost(env) for _ in range(4)]
    ref = rollout.host_rollout(params, jax.random.key(0), hosts, text_env.conversation,
                               model_config=MICRO, config=config, context_size=s,
                               reencode=True)
    for f in ("tokens", "end_reason", "num_turns", "length"):
      np.testing.assert_array_equal(getattr(device, f), getattr(ref, f), err_msg=f)


class RolloutPropertiesTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    env, _ = envs_jax.make("Sokoban-6x6-1box-v0")
    cls.text_env = rollout.TextEnv(env, TOK, rollout.PromptConfig.compact(), verify_states=8)
    cls.config = rollout.RolloutConfig(num_groups=3, group_size=4, max_turns=2,
                                       max_tokens_per_turn=12, temperature=0.7, top_k=50)
    fn = rollout.make_rollout(cls.text_env, MICRO, cls.config)
    cls.fn = staticmethod(fn)
    cls.params = random_params(2)
    cls.traj = fn(cls.params, jax.random.key(7))

  @pytest.mark.smoke
  def test_sampler_logprobs_equal_full_forward(self):
    t = self.traj
    s = t.tokens.shape[1]
    logits, _ = models.apply(self.params, t.tokens,
                             jnp.broadcast_to(jnp.arange(s), t.tokens.shape), config=MICRO)
    logp = jax.nn.log_softmax(logits / 0.7, axis=-1)  # position s-1 predicts token s
    full = jnp.take_along_axis(logp[:, :-1], t.tokens[:, 1:, None], axis=-1)[..., 0]
    mask = np.asarray(t.loss_mask)[:, 1:]
    self.assertGreater(mask.sum(), 50)
    # float32 rounding: the cached decode and the full forward sum in other orders,
    # which XLA versions fuse differently (jax 0.12: 1.07e-5 on a logprob of -2.55).
    np.testing.assert_allclose(np.asarray(full)[mask], np.asarray(t.logprobs)[:, 1:][mask],
                               rtol=1e-5, atol=1e-5)
    self.assertFalse(np.asarray(t.loss_mask)[:, 0].any())

  def test_groups_start_identical_and_differ_across_groups(self):
    t = self.traj
    first = np.asarray(t.anchor_hashes[:, 0]).reshape(3, 4)
    np.testing.assert_array_equal(first, first[:, :1].repeat(4, axis=1))
    self.assertGreater(len(set(first[:, 0])), 1)
    np.testing.assert_array_equal(t.group_ids, np.arange(12) // 4)
    # Members sample different replies from the same state.
    toks = np.asarray(t.tokens).reshape(3, 4, -1)
    self.assertFalse(np.array_equal(toks[0, 0], toks[0, 1]))
    # Up to the first reply, members of a group share the same prompt.
    first_reply = np.argmax(np.asarray(t.loss_mask), axis=1).reshape(3, 4)
    for g in range(3):
      n = first_reply[g, 0]
      np.testing.assert_array_equal(toks[g, :, :n], toks[g, :1, :n].repeat(4, axis=0))

  @pytest.mark.smoke
  def test_same_key_same_trajectories(self):
    again = self.fn(self.params, jax.random.key(7))
    for f in FIELDS + ("logprobs",):
      np.testing.assert_array_equal(getattr(again, f), getattr(self.traj, f), err_msg=f)
    other = self.fn(self.params, jax.random.key(8))
    self.assertFalse(np.array_equal(other.tokens, self.traj.tokens))

  def test_chunked_prefill_same_trajectories(self):
    # Prompts prefilled 16 tokens at a time (the first prompt and every
    # turn's): the same tokens, log-probs within float rounding (1e-5).
    config = dataclasses.replace(self.config, prefill_chunk=16)
    self.assertEqual(config.sampling().prefill_chunk, 16)
    got = rollout.make_rollout(self.text_env, MICRO, config)(self.params, jax.random.key(7))
    for f in FIELDS:
      np.testing.assert_array_equal(getattr(got, f), getattr(self.traj, f), err_msg=f)
    np.testing.assert_allclose(got.logprobs, self.traj.logprobs, atol=1e-5)
    with self.assertRaisesRegex(ValueError, "SamplingConfig.prefill_chunk=-1"):
      rollout.RolloutConfig(prefill_chunk=-1)

  def test_reset_keys_fix_initial_states(self):
    keys = jax.random.split(jax.random.key(3), 3)
    a = self.fn(self.params, jax.random.key(1), keys)
    b = self.fn(self.params, jax.random.key(2), keys)
    np.testing.assert_array_equal(a.anchor_hashes[:, 0], b.anchor_hashes[:, 0])

  @pytest.mark.smoke
  def test_trajectory_batch_and_metrics(self):
    batch = train.trajectory_batch(self.traj)
    self.assertEqual(batch.group_size, 4)
    np.testing.assert_array_equal(batch.sampler_logprobs, self.traj.logprobs)
    np.testing.assert_array_equal(batch.scores, self.traj.scores)
    m = self.traj.metrics()
    np.testing.assert_allclose(m["score"], np.mean(self.traj.scores), rtol=1e-6)
    np.testing.assert_allclose(
        m["reward_std_in_group"], np.mean(np.std(np.asarray(self.traj.scores).reshape(3, 4),
                                                 axis=1)), rtol=1e-5)
    self.assertAlmostEqual(sum(float(m[f"end/{r}"]) for r in rollout.END_REASONS[1:]), 1.0,
                           places=6)
    # One rollout per group (evaluations): no in-group std, which would be 0.
    single = self.traj.replace(group_size=1).metrics()
    self.assertNotIn("reward_std_in_group", single)
    self.assertEqual(float(single["pass_at_group"]), float(single["success"]))
    # Every trained token carries its turn id; rewards sit on each turn's last token.
    t = self.traj
    np.testing.assert_array_equal(np.asarray(t.turn_ids) >= 0, t.loss_mask)
    np.testing.assert_allclose(np.sum(t.token_rewards, axis=1), t.scores, rtol=1e-6)

  def test_bad_configs_raise_before_compile(self):
    with self.assertRaisesRegex(ValueError, "context_size"):
      rollout.make_rollout(self.text_env, MICRO, rollout.RolloutConfig(context_size=64))
    with self.assertRaisesRegex(ValueError, "group_size"):
      rollout.RolloutConfig(group_size=0)
    with self.assertRaisesRegex(ValueError, "temperature"):
      rollout.RolloutConfig(temperature=0.0)
    with self.assertRaisesRegex(ValueError, "RolloutConfig.format_penalty=0.1: .* <= 0"):
      rollout.RolloutConfig(format_penalty=0.1)
    with self.assertRaisesRegex(ValueError, "RolloutConfig.merge_lora='no': must be a bool"):
      rollout.RolloutConfig(merge_lora="no")
    # The sampler gets it: unmerged adapters, no merged copy while sampling.
    self.assertTrue(rollout.RolloutConfig().sampling().merge_lora)
    self.assertFalse(rollout.RolloutConfig(merge_lora=False).sampling().merge_lora)
    with self.assertRaisesRegex(ValueError, "vocab_size"):
      rollout.make_rollout(self.text_env, MICRO.replace(vocab_size=100) if hasattr(
          MICRO, "replace") else models.ModelConfig(vocab_size=100), self.config)


class GuessGame:
  """A pure-Python host game: say "Up" to win (+1, terminal); "Left" costs -0.5."""

  action_names = ("Up", "Left")
  instructions = "Say Up to win."

  def reset(self, key):
    del key
    self.turns = 0
    return "start"

  def step(self, action, key):
    del key
    self.turns += 1
    if action == "Up":
      return rollout.HostStep(state="won", reward=1.0, terminated=True, success=True)
    return rollout.HostStep(state=f"turn{self.turns}", reward=-0.5, terminated=False)


class HostBridgeTest(absltest.TestCase):

  def test_python_environment_through_host_rollout(self):
    prompt = rollout.PromptConfig.compact(think=False, max_actions_per_turn=2)
    conv = rollout.Conversation(TOK, prompt, GuessGame.instructions, GuessGame.action_names)
    config = rollout.RolloutConfig(num_groups=2, group_size=2, max_turns=3,
                                   max_tokens_per_turn=16, greedy=True)
    games = [GuessGame() for _ in range(4)]
    params = bigram_params("<answer>Left || Up</answer>")
    t = rollout.host_rollout(params, jax.random.key(0), games, conv, model_config=MICRO,
                             config=config, context_size=512)
    # Turn 1: Left (-0.5) then Up (+1, terminal): one turn, score 0.5, success.
    np.testing.assert_array_equal(t.num_turns, 1)
    np.testing.assert_allclose(t.scores, 0.5)
    np.testing.assert_array_equal(t.success, True)
    np.testing.assert_array_equal(t.num_actions, 2)
    text = TOK.decode(np.asarray(t.tokens[0, :t.length[0]]))
    self.assertIn("Say Up to win.", text)
    self.assertTrue(text.endswith("<answer>Left || Up</answer>"))


if __name__ == "__main__":
  absltest.main()
