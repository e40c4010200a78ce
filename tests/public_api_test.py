"""Pins the public surface of every package and checks that it is documented.

For each package, ``__all__`` (sorted) must equal the literal list written
here, so adding, renaming or removing a public name is a visible edit of this
file; every listed name must resolve, and every public function or class
(any callable: jitted functions and NamedTuples too) and every subpackage must
carry a docstring. This is the one home of these checks for every package.

It also pins what importing a package loads: ``jagent`` imports its
subpackages on first use, so the pure objectives of ``jagent.losses`` come
without the models and tokenizers.
"""

import importlib
import os
import subprocess
import sys
import textwrap
import types

from absl.testing import absltest
from absl.testing import parameterized

# Package -> its public names, sorted (``sorted()`` order: upper case first).
_SURFACES: dict[str, list[str]] = {}

_SURFACES["jagent"] = [
    "Array",
    "ArrayLike",
    "FieldError",
    "PRNGKey",
    "PyTree",
    "SHAPE_LETTERS",
    "check_int",
    "losses",
    "models",
    "rollout",
    "sharding",
    "tokenizers",
    "train",
    "transforms",
]

_SURFACES["jagent.losses"] = [
    "AGGREGATION_MODES",
    "AdvantagesAndReturns",
    "Aggregate",
    "FILTER_MODES",
    "FORMAT_PENALTY",
    "FilterConfig",
    "FilterResult",
    "GigpoAdvantages",
    "KL_ESTIMATORS",
    "NODE_REDUCES",
    "PolicyLoss",
    "RunningNormState",
    "TREE_COMBINES",
    "ValueLoss",
    "aggregate",
    "as_groups",
    "bilevel_gae",
    "clipped_value_loss",
    "discounted_returns",
    "dr_grpo_advantages",
    "entropy_from_logits",
    "filter_groups",
    "format_penalty",
    "gae",
    "gigpo_advantages",
    "group_std",
    "grpo_advantages",
    "gspo_loss",
    "importance_ratio",
    "kl_penalty",
    "masked_whiten",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "running_norm_apply",
    "running_norm_init",
    "running_norm_update",
    "safe_ratio",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_mean",
    "token_to_turn_rewards",
    "tree_grpo_advantages",
    "tree_node_values",
    "tree_step_advantages",
    "truncated_importance_weights",
    "turn_ends",
    "turn_mask",
    "turn_to_token_rewards",
]

_SURFACES["jagent.transforms"] = [
    "ADVANTAGE_ESTIMATORS",
    "Batch",
    "EmptyState",
    "KlControllerState",
    "LossOutput",
    "LossTerm",
    "ModelOutputs",
    "Objective",
    "ObjectiveNeeds",
    "TURN_WEIGHTINGS",
    "Transform",
    "chain",
    "compute_bilevel_gae",
    "compute_dr_grpo",
    "compute_gae",
    "compute_gigpo",
    "compute_grpo",
    "compute_reinforce_pp",
    "compute_reinforce_pp_baseline",
    "compute_rloo",
    "compute_tree_grpo",
    "compute_tree_step",
    "dapo",
    "dr_grpo",
    "entropy_term",
    "filter_rollouts",
    "gigpo",
    "grpo",
    "gspo_term",
    "identity",
    "kl_reward_penalty",
    "kl_term",
    "make",
    "make_advantage",
    "make_loss",
    "normalize_rewards",
    "objective",
    "penalize_format",
    "pg_term",
    "ppo",
    "ppo_clip_term",
    "register",
    "registered",
    "reinforce_pp",
    "rloo",
    "row_weights",
    "signature",
    "starpo",
    "starpo_s",
    "stateless",
    "trajectory_scores",
    "tree_grpo",
    "truncate_importance_weights",
    "value_term",
    "whiten_advantages",
    "with_filter_stage",
]

_SURFACES["jagent.models"] = [
    "ATTENTION_IMPLS",
    "DTYPES",
    "GenerateOutput",
    "KVCache",
    "LORA_MODULES",
    "LayerParams",
    "LoraConfig",
    "LoraPair",
    "LoraParams",
    "ModelConfig",
    "Params",
    "SamplingConfig",
    "apply",
    "cache_axes",
    "config_from_hf",
    "config_names",
    "config_to_hf",
    "generate",
    "get_config",
    "hidden_states",
    "init",
    "init_cache",
    "init_lora",
    "join_frozen",
    "load_hf_checkpoint",
    "load_peft_adapter",
    "lora_axes",
    "merge_lora",
    "param_axes",
    "per_layer_form",
    "read_hf_config",
    "rope_inv_freq",
    "sample_logits",
    "save_hf_checkpoint",
    "save_peft_adapter",
    "split_frozen",
    "stacked_cache",
]

_SURFACES["jagent.tokenizers"] = [
    "CHAT_TEMPLATES",
    "CHAT_TEMPLATES_JINJA",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "TINY_SYMBOLS",
    "TINY_TAGS",
    "Tokenizer",
    "chatml_template",
    "gather_bytes",
    "llama3_template",
    "load_tiny_tokenizer",
    "plain_template",
    "tiny_tokenizer_path",
    "train_sentencepiece",
]

_SURFACES["jagent.rollout"] = [
    "Conversation",
    "END_REASONS",
    "EXPERT_POLICIES",
    "Expert",
    "HostEnv",
    "HostStep",
    "JaxEnvAsHost",
    "ParseSpec",
    "ParsedReply",
    "PromptConfig",
    "RolloutConfig",
    "TextEnv",
    "Trajectory",
    "TreeConfig",
    "context_size",
    "default_instructions",
    "demonstrations",
    "expert_rollout",
    "first_reply_prompt_tokens",
    "format_reward",
    "group_reset_keys",
    "host_rollout",
    "make_expert",
    "make_rollout",
    "parse_reply",
    "parse_tokens",
    "reference_parse",
]

_SURFACES["jagent.train"] = [
    "AccumulatedGradients",
    "CRITIC_KINDS",
    "CheckpointError",
    "Checkpointer",
    "CriticParams",
    "LogprobsOutput",
    "MetricsWriter",
    "OLD_LOGPROBS",
    "ObjectiveNeeds",
    "OptimizerConfig",
    "PlotPanel",
    "PlotSeries",
    "TrainConfig",
    "TrainState",
    "ValueHead",
    "accumulate_gradients",
    "collapse_estimates",
    "collapse_metrics",
    "compact_groups",
    "critic_values",
    "current_learning_rate",
    "decode_samples",
    "eval_program",
    "evaluate",
    "export_policy",
    "held_out_reset_keys",
    "init_critic",
    "init_train_state",
    "iteration_filter",
    "make_optimizer",
    "make_schedule",
    "nll_loss",
    "num_kept_groups",
    "objective_needs",
    "plot_metrics",
    "plot_seed_curves",
    "read_metrics",
    "rl_iteration",
    "seed_band",
    "sft_step",
    "sft_update",
    "smooth_curve",
    "token_logprobs",
    "train_step",
    "trajectory_batch",
    "write_json",
    "write_text",
]

_SURFACES["jagent.sharding"] = [
    "DEFAULT_RULES",
    "MESH_AXES",
    "ROW_AXES",
    "activation_rules",
    "batch_sharding",
    "global_rows",
    "logical_to_sharding",
    "make_mesh",
    "param_shardings",
    "parse_mesh_spec",
    "place_state",
    "replicated",
    "rows_constraint",
    "rows_shardings",
    "rows_size",
    "shard_eval_program",
    "shard_rl_iteration",
    "shard_rollout",
    "shard_rows",
    "shard_sft_step",
    "shard_train_step",
    "to_host",
    "train_state_shardings",
    "train_state_target",
    "tree_shardings",
]

_SURFACES["envs_jax"] = [
    "AgentDefaults",
    "AutoReset",
    "BOXOBAN_SUBSETS",
    "Bandit",
    "BanditParams",
    "BanditState",
    "CoordFrozenLake",
    "CoordFrozenLakeState",
    "CoordSokoban",
    "Countdown",
    "CountdownParams",
    "CountdownState",
    "Environment",
    "FrozenLake",
    "FrozenLakeParams",
    "FrozenLakeState",
    "Game2048",
    "Game2048Params",
    "Game2048State",
    "PAD_SYMBOL",
    "PlanCache",
    "RubiksCube",
    "RubiksCubeParams",
    "RubiksCubeState",
    "SOKOBAN_MAX_NODES",
    "Sokoban",
    "SokobanGenerationInfo",
    "SokobanGeneratorConfig",
    "SokobanParams",
    "SokobanSolution",
    "SokobanState",
    "Sudoku",
    "SudokuParams",
    "SudokuState",
    "TimeLimit",
    "TimeLimitState",
    "Wrapper",
    "actions_sentence",
    "agent_defaults",
    "countdown_reference_reward",
    "countdown_reward",
    "encode_countdown_answer",
    "generate_countdown_instance",
    "grid_render_symbols",
    "load_boxoban_levels",
    "make",
    "make_countdown_params",
    "number_symbols",
    "register",
    "registered",
    "sokoban_levels_from_ascii",
    "solve_countdown",
    "solve_frozen_lake",
    "solve_rubiks_cube",
    "solve_sokoban",
    "solve_sokoban_batch",
    "solve_sudoku",
    "tree_select",
    "unregister",
]

# The environment ids registered by ``import envs_jax``: a contract too.
_REGISTERED_IDS = [
    "Bandit-v0",
    "BanditTest-v0",
    "Boxoban-hard-v0",
    "Boxoban-medium-v0",
    "Boxoban-unfiltered-test-v0",
    "CoordFrozenLake-4x4-v0",
    "CoordSokoban-6x6-1box-v0",
    "Countdown-v0",
    "FrozenLake-4x4-det-v0",
    "FrozenLake-4x4-v0",
    "Game2048-4x4-tile16-v0",
    "Game2048-4x4-v0",
    "RubiksCube-2x2-v0",
    "Sokoban-6x6-1box-altsym-v0",
    "Sokoban-6x6-1box-v0",
    "Sokoban-8x8-2box-v0",
    "Sudoku-4x4-v0",
    "Sudoku-9x9-easy-v0",
    "Sudoku-9x9-medium-v0",
]


def _loaded_after(statement: str) -> list[str]:
  """The ``jagent.*`` modules that a fresh interpreter holds after ``statement``."""
  code = textwrap.dedent(f"""
      import sys
      {statement}
      print("\\n".join(sorted(m for m in sys.modules if m.startswith("jagent."))))
  """)
  return _run_fresh(code).split()


def _run_fresh(code: str) -> str:
  """Runs ``code`` in a new interpreter with this one's import path; its stdout."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
  out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                       text=True, timeout=300, env=env)
  return out.stdout


class PublicApiTest(parameterized.TestCase):

  def test_the_lists_are_sorted_and_unique(self):
    for package, names in _SURFACES.items():
      self.assertEqual(names, sorted(set(names)), package)

  @parameterized.parameters(*_SURFACES)
  def test_surface(self, package):
    module = importlib.import_module(package)
    self.assertLen(set(module.__all__), len(module.__all__), f"duplicates in {package}.__all__")
    self.assertEqual(sorted(module.__all__), _SURFACES[package])

  @parameterized.parameters(*_SURFACES)
  def test_names_resolve_and_are_documented(self, package):
    module = importlib.import_module(package)
    undocumented = []
    for name in module.__all__:
      self.assertTrue(hasattr(module, name), f"{package}.{name} is in __all__ but missing")
      obj = getattr(module, name)
      if (callable(obj) or isinstance(obj, types.ModuleType)) and not (obj.__doc__ or "").strip():
        undocumented.append(name)
    self.assertEmpty(undocumented, f"{package}: public names without a docstring")

  def test_dir_lists_the_lazy_subpackages(self):
    jagent = importlib.import_module("jagent")
    self.assertContainsSubset(
        {"losses", "models", "rollout", "sharding", "tokenizers", "train", "transforms"},
        set(dir(jagent)))
    with self.assertRaisesRegex(AttributeError, "no_such_name"):
      getattr(jagent, "no_such_name")

  def test_import_jagent_loads_no_subpackage(self):
    self.assertEqual(_loaded_after("import jagent"),
                     ["jagent._src", "jagent._src.checks", "jagent._src.errors",
                      "jagent._src.types"])

  def test_import_losses_loads_neither_models_nor_tokenizers(self):
    loaded = _loaded_after("import jagent.losses")
    self.assertIn("jagent.losses", loaded)
    heavy = [m for m in loaded if m.startswith(("jagent.models", "jagent.tokenizers"))]
    self.assertEmpty(heavy)

  def test_registered_ids(self):
    # In a fresh process: a test may register its own toy env in this one.
    code = "import envs_jax; print(' '.join(sorted(envs_jax.registered())))"
    self.assertEqual(_run_fresh(code).split(), _REGISTERED_IDS)


if __name__ == "__main__":
  absltest.main()
