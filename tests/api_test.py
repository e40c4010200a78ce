"""Pins the public surface of each package and checks every public name is documented.

Each package lists its public names in ``__all__``; every listed name must
exist, and every public callable (function, class, jitted function) must carry
a docstring (the brief: shapes, dtypes, errors and sources are documented on
every public symbol). This is the one home of that check for every package;
the per-package api tests only pin their surfaces.
"""

import importlib

from absl.testing import absltest
from absl.testing import parameterized

PACKAGES = (
    "jagent",
    "jagent.losses",
    "jagent.models",
    "jagent.tokenizers",
    "jagent.transforms",
    "jagent.rollout",
    "jagent.train",
    "jagent.sharding",
    "envs_jax",
)

ENVS_JAX_SURFACE = {
    "AgentDefaults", "AutoReset", "BOXOBAN_SUBSETS", "Bandit", "BanditParams", "BanditState",
    "Countdown", "CountdownParams", "CountdownState", "Environment", "FrozenLake",
    "FrozenLakeParams", "FrozenLakeState", "PAD_SYMBOL", "Sokoban",
    "SokobanGenerationInfo", "SokobanGeneratorConfig", "SokobanParams",
    "SokobanSolution", "SokobanState", "TimeLimit", "TimeLimitState", "Wrapper",
    "countdown_reference_reward", "countdown_reward", "encode_countdown_answer",
    "generate_countdown_instance", "grid_render_symbols", "load_boxoban_levels",
    "actions_sentence", "make", "make_countdown_params", "number_symbols", "register",
    "registered",
    "sokoban_levels_from_ascii", "solve_countdown", "solve_frozen_lake",
    "solve_sokoban", "solve_sokoban_batch", "tree_select",
}

REGISTERED_IDS = {
    "Bandit-v0", "BanditTest-v0",
    "Sokoban-6x6-1box-v0", "Sokoban-8x8-2box-v0", "Sokoban-6x6-1box-altsym-v0",
    "Boxoban-unfiltered-test-v0", "Boxoban-medium-v0", "Boxoban-hard-v0",
    "FrozenLake-4x4-v0", "FrozenLake-4x4-det-v0",
    "Countdown-v0",
}


class ApiTest(parameterized.TestCase):

  @parameterized.parameters(*PACKAGES)
  def test_all_names_exist_and_are_documented(self, package):
    module = importlib.import_module(package)
    self.assertNotEmpty(module.__all__)
    self.assertLen(set(module.__all__), len(module.__all__), "duplicates in __all__")
    undocumented = []
    for name in module.__all__:
      self.assertTrue(hasattr(module, name), f"{package}.{name} is in __all__ but missing")
      obj = getattr(module, name)
      # Any callable: functions, classes, jitted functions, NamedTuples.
      if callable(obj) and not (obj.__doc__ or "").strip():
        undocumented.append(name)
    self.assertEmpty(undocumented, f"{package}: public names without a docstring")

  def test_envs_jax_surface(self):
    envs_jax = importlib.import_module("envs_jax")
    self.assertEqual(set(envs_jax.__all__), ENVS_JAX_SURFACE)

  def test_registered_ids_are_the_contract(self):
    envs_jax = importlib.import_module("envs_jax")
    self.assertEqual(set(envs_jax.registered()), REGISTERED_IDS)


if __name__ == "__main__":
  absltest.main()
