"""A new environment trains through SFT + RL with no edit outside its own files.

The game here is defined and registered in this file only: its module (the
class below), its registration and its tests. Its instructions, episode
budgets (``agent_defaults``, read by ``experiments/configs/tiny.py``) and
expert (``expert_answers``, called by ``jagent.rollout.make_expert``) live on
the class, so ``experiments.train.run`` with the tiny config trains it
without any change to ``jagent/`` or the config.

The game, Copy: the state shows one word, ``Left`` or ``Right``; answering
that word wins (reward 1), anything else scores 0. One turn, one action. A
randomly initialised model never writes ``<answer>Left</answer>``, so its
success is 0; a few SFT steps on the expert's answers teach the format and,
mostly, the copy.
"""

import json
import math
import os
import shutil
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import envs_jax
from experiments import experiment
from experiments import train as train_job
from experiments.configs import tiny
from jagent import rollout
from tests import testenv

_ENV_ID = "ToyCopy-v0"
_RL_STEPS = 2


@struct.dataclass
class CopyParams:
  """Params of :class:`Copy`: the reward of a right answer (float32 [])."""

  win_reward: jax.Array


@struct.dataclass
class CopyState:
  """State of :class:`Copy`: the shown word's action id (int32 [])."""

  word: jax.Array


class Copy(envs_jax.Environment):
  """Answer the word the state shows (one turn)."""

  symbols = ("", "Left", "Right")
  action_names = ("Left", "Right")
  agent_defaults = envs_jax.AgentDefaults(
      max_turns=1, max_actions_per_traj=1, max_tokens_per_turn=6, system="You play Copy.")
  expert_think_text = "I copy the word."

  @property
  def instructions(self) -> str:
    return "Answer the word you see. " + envs_jax.actions_sentence(self.action_names)

  @property
  def default_params(self) -> CopyParams:
    return CopyParams(win_reward=jnp.float32(1.0))

  def reset_env(self, key, params):
    state = CopyState(word=jax.random.randint(key, (), 0, 2, jnp.int32))
    return self.observation(state), state

  def step_env(self, key, state, action, params):
    del key
    win = jnp.asarray(action, jnp.int32) == state.word
    reward = jnp.where(win, params.win_reward, 0.0).astype(jnp.float32)
    info = {"success": win, "action_effective": jnp.ones((), jnp.bool_)}
    return self.observation(state), state, reward, jnp.bool_(True), jnp.bool_(False), info

  def observation(self, state):
    return state.word[None]

  def render_symbols(self, state):
    return (1 + state.word)[None].astype(jnp.int32)

  def expert_answers(self, states, params, *, actions_per_turn=1, **options):
    del params, actions_per_turn, options
    return [self.action_names[int(s.word)] for s in states]


def _config():
  c = tiny.get_config(f"{_ENV_ID},grpo")  # the budgets come from Copy.agent_defaults
  c.model = "nano"
  c.rollout.update(dict(num_groups=4, group_size=4))
  c.sft.update(dict(num_demos=16, steps=40, batch_size=8, learning_rate=2e-2,
                    warmup_steps=4))
  c.rl.update(dict(steps=_RL_STEPS, learning_rate=1e-4, warmup_steps=0, decay="constant"))
  c.eval.update(dict(num_levels=16, num_groups=16, every=0, greedy=False, samples=1))
  c.checkpoint.update(dict(every=0, keep=3))  # 0: after SFT and the last step only
  return testenv.without_extras(c)


class ToyEnvTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # A TimeLimit around the game also checks that wrappers forward its hooks.
    envs_jax.register(_ENV_ID, lambda **kw: envs_jax.TimeLimit(Copy(**kw), 1))
    cls.root = tempfile.mkdtemp(prefix="toy_env_test_")
    cls.config = _config()
    cls.exp = experiment.Experiment(cls.config)
    cls.init_eval = cls.exp.evaluate(cls.exp.init_params())
    cls.demos = cls.exp.demonstrations()
    cls.summary = train_job.run(cls.config, cls.root, progress=False)

  @classmethod
  def tearDownClass(cls):
    envs_jax.unregister(_ENV_ID)
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()

  def test_config_and_prompt_come_from_the_env(self):
    c = self.config
    self.assertEqual((c.rollout.max_turns, c.rollout.max_actions_per_traj,
                      c.rollout.max_tokens_per_turn, c.prompt.system),
                     (1, 1, 6, "You play Copy."))
    env = self.exp.env
    self.assertIsInstance(env, envs_jax.TimeLimit)
    self.assertEqual(rollout.default_instructions(env),
                     "Answer the word you see. Your actions are Left, Right; give one or "
                     "more, separated by ||, for example <answer>Left || Right</answer>.")

  def test_demonstrations_are_the_experts_answers(self):
    d = self.demos
    self.assertTrue(np.all(np.asarray(d.success)), "the expert always copies the word")
    tok = self.exp.tokenizer
    for row in range(4):
      text = tok.decode([int(t) for t, m in zip(np.asarray(d.tokens[row]),
                                                 np.asarray(d.loss_mask[row])) if m])
      self.assertRegex(text, r"^<answer>(Left|Right)</answer>")

  def test_sft_then_rl_learn_the_game(self):
    s = self.summary
    self.assertEqual((s["env"], s["algorithm"], s["steps"]), (_ENV_ID, "grpo", _RL_STEPS))
    self.assertEqual(self.init_eval["success"], 0.0)  # random init: no valid answer
    self.assertGreaterEqual(s["sft"]["format_valid_frac"], 0.9, s)
    self.assertGreaterEqual(s["sft"]["success"], 0.6, s)
    self.assertGreaterEqual(s["rl"]["success"], 0.6, s)

  def test_checkpoints_after_sft_and_the_last_step(self):
    ckpt = self.exp.checkpointer(self.root)
    self.assertEqual(ckpt.all_steps(), [0, _RL_STEPS])  # keep=3 would keep a third
    ckpt.close()

  def test_metrics_are_finite(self):
    with open(os.path.join(self.root, "metrics.jsonl")) as f:
      records = [json.loads(line) for line in f]
    self.assertNotEmpty(records)
    values = [v for r in records for v in r.values() if isinstance(v, float)]
    self.assertNotEmpty(values)
    self.assertTrue(all(math.isfinite(v) for v in values))


if __name__ == "__main__":
  absltest.main()
