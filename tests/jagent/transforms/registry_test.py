"""Objectives describe themselves: registration where defined, declared needs."""

import ast
import inspect

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jagent import losses
from jagent import transforms
from jagent.transforms import _aliases
from jagent.transforms import _registry

# B = 4 rows in 2 groups of G = 2, S = 6 tokens (turns 0 and 1), T = 2 turns.
_IDS = np.array([[-1, 0, 0, -1, 1, 1]] * 4, np.int32)
_MASK = (_IDS >= 0).astype(np.float32)
_RNG = np.random.default_rng(0)
_F = lambda *shape: np.float32(_RNG.normal(size=shape))  # pylint: disable=unnecessary-lambda-assignment


def _full_batch():
  """A batch carrying every field any built-in objective reads."""
  return transforms.Batch(
      loss_mask=_MASK, rewards=_F(4, 6) * _MASK, values=_F(4, 6),
      old_logprobs=-np.abs(_F(4, 6)), ref_logprobs=-np.abs(_F(4, 6)),
      turn_ids=_IDS, anchor_hashes=np.array([[1, 2], [1, 3], [5, 6], [5, 0]], np.int32),
      terminated=np.array([True, True, True, False]), bootstrap_values=_F(4),
      tree_nodes=np.array([[0, 1], [2, 3], [4, 5], [6, 7]], np.int32), tree_size=1,
      group_size=2)


_OUTPUTS = transforms.ModelOutputs(-np.abs(_F(4, 6)), _F(4, 6), np.abs(_F(4, 6)))

# Every built-in at its defaults, plus the variants that flip a need.
_VARIANTS = [(name, {}) for name in transforms.registered()] + [
    ("ppo", {"kl_coef": 0.01, "entropy_coef": 0.0}),
    ("grpo", {"kl_coef": 0.0}),
    ("reinforce_pp", {"kl_reward_coef": 0.0, "entropy_coef": 0.01}),
    ("starpo", {"advantage": "grpo", "kl_coef": 0.0}),
    ("starpo", {"advantage": "bilevel_gae"}),
    ("starpo_s", {"advantage": "rloo", "entropy_coef": 0.0}),
]


def _reads(obj, batch, outputs):
  """Whether the objective runs (traced only: no compile) on these inputs."""
  def run(batch, outputs):
    prepared, _ = obj.update(batch, obj.init(batch))
    return obj.loss(outputs, prepared).loss_sum

  try:
    jax.eval_shape(run, batch, outputs)
  except ValueError:
    return False
  return True


class DeclaredNeedsTest(parameterized.TestCase):

  @parameterized.parameters(*_VARIANTS)
  def test_needs_match_what_the_objective_reads(self, name, kwargs):
    # A need is declared iff dropping its inputs breaks the objective.
    obj = transforms.make(name, **kwargs)
    needs = obj.needs
    self.assertIsInstance(needs, transforms.ObjectiveNeeds)
    self.assertEqual(transforms.make(name, **kwargs).needs, needs)  # deterministic
    batch = _full_batch()
    self.assertTrue(_reads(obj, batch, _OUTPUTS))
    no_critic = _reads(obj, batch.replace(values=None), _OUTPUTS._replace(values=None))
    self.assertEqual(needs.critic, not no_critic, "critic")
    self.assertEqual(needs.reference, not _reads(obj, batch.replace(ref_logprobs=None),
                                                 _OUTPUTS), "reference")
    self.assertEqual(needs.entropy, not _reads(obj, batch, _OUTPUTS._replace(entropy=None)),
                     "entropy")
    # The value loss is there iff a critic is declared.
    prepared, _ = obj.update(batch, obj.init(batch))
    self.assertEqual("loss/value" in obj.loss(_OUTPUTS, prepared).metrics, needs.critic)
    # A group baseline is declared iff with one rollout a group no row has a
    # nonzero advantage (``update`` filters nothing: the filter is data).
    single = batch.replace(group_size=1)
    got, _ = jax.jit(obj.update)(single, obj.init(single))  # one compile: faster than eager
    self.assertIsNone(got.keep)
    trained = np.asarray(got.advantages) * _MASK
    self.assertEqual(needs.groups, not np.any(trained != 0), "groups")

  def test_known_needs(self):
    want = {  # (critic, reference, entropy, groups) at the aliases' defaults
        "ppo": (True, False, True, False), "grpo": (False, True, True, True),
        "dr_grpo": (False, False, False, True), "dapo": (False, False, False, True),
        "rloo": (False, False, False, True), "reinforce_pp": (False, True, False, False),
        "gigpo": (False, True, False, True), "starpo": (True, True, True, False),
        "starpo_s": (True, False, True, False)}
    self.assertEqual({n: tuple(transforms.make(n).needs) for n in want}, want)
    # REINFORCE++-baseline's baseline is the group mean; a custom advantage
    # Transform declares nothing.
    self.assertTrue(transforms.make("reinforce_pp", baseline=True).needs.groups)
    self.assertFalse(transforms.make(
        "starpo", advantage=transforms.compute_grpo()).needs.groups)

  @parameterized.parameters(*transforms.registered())
  def test_no_builtin_applies_the_format_penalty(self, name):
    # The rollout is its one home: format_valid in a batch changes nothing.
    obj = transforms.make(name)
    batch = _full_batch()
    with_format = batch.replace(format_valid=np.array([[1, 0], [1, 1], [0, 1], [1, 1]], bool))
    got, _ = obj.update(with_format, obj.init(with_format))
    want, _ = obj.update(batch, obj.init(batch))
    np.testing.assert_array_equal(got.rewards, want.rewards)
    np.testing.assert_array_equal(got.advantages, want.advantages)
    self.assertNotIn("format/invalid_turn_frac", got.metrics)


class RegistrationTest(absltest.TestCase):

  def test_builtins_register_where_defined(self):
    for name in transforms.registered():
      factory = _registry._REGISTRY[name]  # pylint: disable=protected-access
      self.assertEqual(factory.__module__, "jagent.transforms._aliases", name)
      self.assertIs(factory, getattr(_aliases, name))
      self.assertIn(f'@register("{name}")', inspect.getsource(_aliases))
    # The registry lists no algorithm itself: it does not import the aliases.
    tree = ast.parse(inspect.getsource(_registry))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names} | {n.module for n in ast.walk(tree)
                                     if isinstance(n, ast.ImportFrom)}
    self.assertNotIn("_aliases", imported)
    self.assertNotIn("jagent.transforms._aliases", imported)

  def test_signature_is_the_factorys_with_types(self):
    sig = transforms.signature("starpo_s")
    self.assertEqual(sig, inspect.signature(_aliases.starpo_s, eval_str=True))
    p = sig.parameters
    self.assertEqual((p["eps_high"].default, p["kl_coef"].default), (0.28, 0.0))
    self.assertEqual(p["critic"].annotation, bool | None)  # evaluated, not a string
    with self.assertRaisesRegex(ValueError, r"unknown objective 'grpo2'; registered: "):
      transforms.signature("grpo2")

  def test_decorator_registers_a_new_objective(self):
    name = "registry_test_pg"
    self.addCleanup(_registry._REGISTRY.pop, name, None)  # pylint: disable=protected-access

    @transforms.register(name)
    def pg(*, kl_coef: float = 0.0) -> transforms.Objective:
      loss = transforms.make_loss(transforms.pg_term(),
                                  *([transforms.kl_term(kl_coef)] if kl_coef else []))
      return transforms.objective(
          transforms.chain(transforms.compute_grpo()), loss,
          needs=transforms.ObjectiveNeeds(reference=bool(kl_coef)))

    self.assertTrue(callable(pg))  # the decorator returns the function
    self.assertIn(name, transforms.registered())
    self.assertEqual(transforms.make(name, kl_coef=0.1).needs,
                     transforms.ObjectiveNeeds(reference=True))
    with self.assertRaisesRegex(ValueError, "already registered"):
      transforms.register(name)(pg)
    with self.assertRaisesRegex(ValueError, "non-empty"):
      transforms.register("")

  def test_objective_validates_needs_and_filter(self):
    loss = transforms.make_loss(transforms.pg_term())
    with self.assertRaisesRegex(ValueError, "needs must be an ObjectiveNeeds"):
      transforms.objective(transforms.identity(), loss, needs=(True, False, False))
    with self.assertRaisesRegex(ValueError, "filter_config must be"):
      transforms.objective(transforms.identity(), loss, filter_config="top_k")
    with self.assertRaisesRegex(ValueError, "transform must be a Transform"):
      transforms.objective(lambda f: transforms.identity(), loss,
                           filter_config=losses.FilterConfig())
    mine = losses.FilterConfig("top_k", 2, False)
    self.assertEqual(transforms.objective(transforms.identity(), loss,
                                          filter_config=mine).filter_config, mine)

  def test_filters_are_data_of_starpo_s_and_dapo_only(self):
    obj = transforms.starpo_s()
    self.assertEqual(obj.filter_config, losses.FilterConfig("top_fraction", 0.25, True))
    mine = losses.FilterConfig("top_p", 0.9, False)
    self.assertEqual(transforms.starpo_s(filter_config=mine).filter_config, mine)
    # DAPO's dynamic sampling: every group with reward spread.
    self.assertEqual(transforms.dapo().filter_config,
                     losses.FilterConfig("top_fraction", 1.0, False))
    self.assertIsNone(transforms.dapo(dynamic_sampling=False).filter_config)
    for name in transforms.registered():
      if name not in ("starpo_s", "dapo"):
        self.assertIsNone(transforms.make(name).filter_config, name)


if __name__ == "__main__":
  absltest.main()
