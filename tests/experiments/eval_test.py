"""experiments.eval: default run directory, output names, cross-env limits and legend.

The configuration tests compile only what an Experiment builds (its prompt
rendering). ``EvalRunTest``
evaluates a run directory made here, without training: its config.json and a
checkpoint of a randomly initialised ``nano`` policy (what is tested is what is
played and written, not how well).
"""

import json
import os
import pathlib
import shutil
import tempfile

from absl import flags
from absl.testing import absltest
import jax

import envs_jax
from experiments import common
from experiments import eval as eval_job
from experiments import experiment
from experiments import train as train_job
from experiments.configs import tiny
from jagent import train as jtrain

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
SOKOBAN, ALTSYM = "Sokoban-6x6-1box-v0", "Sokoban-6x6-1box-altsym-v0"
ALT_LEGEND = ("The meaning of each symbol in the state is:\nW: wall, .: empty, G: target, "
              "C: box on target, B: box, A: player, @: player on target")


def _sokoban_run_config():
  c = tiny.get_config(f"{SOKOBAN},starpo_s")
  c.model = "nano"
  c.rl.steps = 2
  c.eval.update(dict(num_levels=4, num_groups=4, samples=1))
  return c


def _write_run(workdir, config, checkpoint=False):
  os.makedirs(workdir, exist_ok=True)
  jtrain.write_text(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
  if checkpoint:
    exp = experiment.Experiment(config)
    ckpt = exp.checkpointer(workdir)
    ckpt.save(0, exp.rl_state(exp.init_params()), {"step": 0})
    ckpt.close()


class EvalConfigTest(absltest.TestCase):

  def test_default_workdir_is_the_train_jobs(self):
    self.assertEqual(common.DEFAULT_WORKDIR,
                     os.path.join(os.path.expanduser("~"), "jagent_runs", "default"))
    # Both modules define --workdir (imported here: eval's definition overrides
    # train's in one process; each is alone on its own command line).
    self.assertEqual(train_job._WORKDIR.name, eval_job._WORKDIR.name)
    self.assertEqual(flags.FLAGS["workdir"].default, common.DEFAULT_WORKDIR)

  def test_output_names_tell_evaluations_apart(self):
    name = eval_job.output_name
    self.assertEqual(name(SOKOBAN, greedy=False, temperature=0.5, num_levels=512),
                     f"eval_{SOKOBAN}_t0.5_512levels.json")
    self.assertEqual(name(SOKOBAN, greedy=True, temperature=0.5, num_levels=512),
                     f"eval_{SOKOBAN}_greedy_512levels.json")
    self.assertEqual(name(ALTSYM, greedy=False, temperature=1.0, num_levels=8, group_size=4,
                          legend=True), f"eval_{ALTSYM}_t1_8levels_G4_legend.json")

  def test_the_runs_own_env_is_unchanged(self):
    c = _sokoban_run_config()
    got, added = eval_job.cross_env_config(c, SOKOBAN)
    self.assertFalse(added)
    self.assertEqual(got.to_dict(), c.to_dict())
    self.assertIsNot(got, c)

  def test_another_env_is_played_with_its_own_limits_and_system_message(self):
    c = _sokoban_run_config()
    self.assertEqual((c.rollout.max_turns, c.rollout.max_actions_per_traj,
                      c.rollout.max_tokens_per_turn), (5, 10, 6))
    got, added = eval_job.cross_env_config(c, "Bandit-v0")
    bandit = envs_jax.agent_defaults("Bandit-v0")
    self.assertTrue(added)
    self.assertEqual(got.env, "Bandit-v0")
    self.assertEqual((got.rollout.max_turns, got.rollout.max_actions_per_traj,
                      got.rollout.max_tokens_per_turn), (1, 1, 12))
    self.assertEqual(got.prompt.system,
                     f"{bandit.system}\nYou play a two-armed bandit game and pull one arm.")
    # The input config is left as it was; model, levels and reply format stay the run's.
    self.assertEqual(c.env, SOKOBAN)
    for field in ("model", "tokenizer", "eval", "sft", "rl"):
      self.assertEqual(got[field].to_dict() if hasattr(got[field], "to_dict") else got[field],
                       c[field].to_dict() if hasattr(c[field], "to_dict") else c[field])
    self.assertEqual((got.prompt.think, got.prompt.max_actions_per_turn,
                      got.prompt.chat_template), (False, 1, "chatml"))
    # A run that gave its replies 20 more tokens (e.g. to think) keeps them.
    c.rollout.max_tokens_per_turn = 26
    got, _ = eval_job.cross_env_config(c, "Bandit-v0")
    self.assertEqual(got.rollout.max_tokens_per_turn, 32)

  def test_altsym_prompt_carries_the_legend_unless_told_not_to(self):
    c = _sokoban_run_config()
    self.assertEqual(c.prompt.system, "You play Sokoban.")  # the run's prompt: no legend
    self.assertEqual(eval_job.legend_text(ALTSYM), ALT_LEGEND)
    without, added = eval_job.cross_env_config(c, ALTSYM, legend=False)
    self.assertFalse(added)
    self.assertEqual(without.prompt.system, "You play Sokoban.")
    with_legend, added = eval_job.cross_env_config(c, ALTSYM)
    self.assertTrue(added)
    self.assertEqual(with_legend.prompt.system, f"You play Sokoban.\n{ALT_LEGEND}")
    # What the rollout renders: the system message (in every turn's context)
    # carries the legend, and the grid is in the new symbols.
    exp = experiment.Experiment(with_legend)
    _, state = exp.env.reset(jax.random.key(0), exp.env_params)
    grid = exp.env.render_text(state)
    self.assertIn("A", grid)
    self.assertEqual(exp.text_env.first_text(grid, 10), (
        f"<|im_start|>system\nYou play Sokoban.\n{ALT_LEGEND}<|im_end|>\n"
        f"<|im_start|>user\n{grid}\n<|im_end|>\n<|im_start|>assistant\n"))
    # A model whose context holds one token less than that prompt needs.
    with tempfile.TemporaryDirectory() as root:
      model_dir = os.path.join(root, "model")
      os.makedirs(model_dir)
      with open(FIXTURES / "hf_qwen2_tiny" / "config.json") as f:
        hf = json.load(f)
      hf["max_position_embeddings"] = exp.context_size - 1
      with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(hf, f)
      c.model_dir = model_dir
      w = os.path.join(root, "run")
      _write_run(w, c)
      with self.assertRaisesRegex(
          ValueError, rf"--env='{ALTSYM}' cannot be played by the run in '{w}' \(trained on "
          rf"{SOKOBAN}\): .* need {exp.context_size} tokens of context; the model has "
          rf"{exp.context_size - 1} positions \(its prompt included the legend; --nolegend"):
        eval_job.evaluate_run(w, env=ALTSYM)

  def test_an_env_the_tokenizer_cannot_render_is_refused(self):
    # A Bandit run whose tokenizer (the HF fixture's byte-level BPE) merges "__".
    c = tiny.get_config("Bandit-v0,grpo")
    c.model = "nano"
    c.tokenizer = str(FIXTURES / "hf_tokenizer")
    with tempfile.TemporaryDirectory() as w:
      _write_run(w, c)
      with self.assertRaisesRegex(
          ValueError, r"--env='FrozenLake-4x4-det-v0' cannot be played by the run in .*"
          r"trained on Bandit-v0.*does not tokenize FrozenLake's prompt piece by piece"):
        eval_job.evaluate_run(w, env="FrozenLake-4x4-det-v0", legend=False)


class EvalRunTest(absltest.TestCase):
  """experiments.eval on a run directory with a checkpoint (rollouts compile)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.workdir = tempfile.mkdtemp(prefix="eval_test_")
    _write_run(cls.workdir, _sokoban_run_config(), checkpoint=True)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.workdir, ignore_errors=True)
    super().tearDownClass()

  def test_a_sokoban_run_plays_bandit_for_one_pull(self):
    r = eval_job.evaluate_run(self.workdir, env="Bandit-v0", num_levels=4)
    # Named by what it played (a greedy evaluation gets "greedy" for "t0.5":
    # test_output_names_tell_evaluations_apart).
    self.assertEqual(r["output"], os.path.join(self.workdir, eval_job.output_name(
        "Bandit-v0", greedy=False, temperature=0.5, num_levels=4, legend=True)))
    with open(r["output"]) as f:
      self.assertEqual(json.load(f), {k: v for k, v in r.items() if k != "output"})
    self.assertEqual((r["env"], r["train_env"], r["checkpoint_step"], r["greedy"],
                      r["max_turns"], r["max_actions_per_traj"], r["max_tokens_per_turn"],
                      r["legend"]),
                     ("Bandit-v0", SOKOBAN, 0, False, 1, 1, 12, True))
    # One reply per episode, at most one pull (with the Sokoban run's limits: 5 turns).
    self.assertEqual(r["turns"], 1.0)
    self.assertLessEqual(r["actions"], 1.0)
    self.assertIn("pull one arm", r["samples"][0]["text"])

if __name__ == "__main__":
  absltest.main()
