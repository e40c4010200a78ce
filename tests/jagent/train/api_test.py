"""Pins the public surface of jagent.train and runs its docstring examples."""

import doctest

from absl.testing import absltest

from jagent import train
from jagent.train import _logprobs
from jagent.train import _optim
from jagent.train import _state

_EXPECTED = {
    "AccumulatedGradients", "Checkpointer", "CriticParams", "LogprobsOutput",
    "MetricsWriter", "OLD_LOGPROBS", "ObjectiveNeeds", "OptimizerConfig", "TrainConfig",
    "TrainState", "ValueHead", "accumulate_gradients", "critic_values",
    "current_learning_rate", "export_policy", "init_critic",
    "init_train_state", "make_optimizer", "make_schedule", "nll_loss",
    "objective_needs", "read_metrics", "rl_iteration", "sft_step", "token_logprobs",
    "train_step", "trajectory_batch",
}


class ApiTest(absltest.TestCase):

  def test_surface(self):
    self.assertEqual(set(train.__all__), _EXPECTED)
    for name in train.__all__:
      self.assertTrue(hasattr(train, name), name)

  def test_docstring_examples(self):
    for module in (_optim, _state, _logprobs):
      result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
      self.assertGreater(result.attempted, 0, module.__name__)
      self.assertEqual(result.failed, 0, module.__name__)

  def test_config_validation(self):
    with self.assertRaisesRegex(ValueError, "decay_steps"):
      train.OptimizerConfig(decay="cosine")
    with self.assertRaisesRegex(ValueError, "learning_rate"):
      train.OptimizerConfig(learning_rate=0.0)
    with self.assertRaisesRegex(ValueError, "max_grad_norm"):
      train.OptimizerConfig(max_grad_norm=-1.0)
    with self.assertRaisesRegex(ValueError, "model"):
      train.TrainConfig(model="tiny")
    with self.assertRaisesRegex(ValueError, "temperature"):
      from jagent import models  # pylint: disable=g-import-not-at-top
      train.TrainConfig(model=models.get_config("tiny"), temperature=-1.0)

  def test_cosine_schedule_values(self):
    s = train.make_schedule(train.OptimizerConfig(
        learning_rate=2.0, decay="cosine", decay_steps=4,
        final_lr_fraction=0.5))
    # lr * (f + (1 - f) * (1 + cos(pi * n / 4)) / 2)
    want = [2.0, 1.0 + 0.5 * (1 + 0.7071067811865476), 1.5,
            1.0 + 0.5 * (1 - 0.7071067811865476), 1.0, 1.0]
    for n, w in enumerate(want):
      self.assertAlmostEqual(float(s(n)), w, places=5)


if __name__ == "__main__":
  absltest.main()
