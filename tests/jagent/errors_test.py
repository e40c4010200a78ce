"""jagent.FieldError: the config dataclasses' checks as data (owner, field, value, why)."""

import pickle

from absl.testing import absltest

import jagent
from jagent import losses
from jagent import models
from jagent import rollout
from jagent import train


class FieldErrorTest(absltest.TestCase):

  def _raised(self, build) -> jagent.FieldError:
    with self.assertRaises(jagent.FieldError) as cm:
      build()
    return cm.exception

  def test_attributes_and_message(self):
    e = self._raised(lambda: rollout.RolloutConfig(group_size=0))
    self.assertIsInstance(e, ValueError)
    self.assertEqual((e.owner, e.field, e.value, e.why, e.advice),
                     ("RolloutConfig", "group_size", 0, "must be an int >= 1", None))
    self.assertEqual(str(e), "RolloutConfig.group_size=0: must be an int >= 1")
    self.assertEqual(e.reason(), "must be an int >= 1")

  def test_advice_is_its_own_attribute(self):
    # The rollout's sampling temperature is checked by SamplingConfig.
    e = self._raised(lambda: rollout.RolloutConfig(temperature=0.0))
    self.assertEqual((e.owner, e.field, e.value), ("SamplingConfig", "temperature", 0.0))
    self.assertEqual(e.why, "must be a positive finite float")
    self.assertEqual(e.advice, "use greedy=True for argmax")
    self.assertEqual(str(e), "SamplingConfig.temperature=0.0: must be a positive finite float "
                             "(use greedy=True for argmax)")
    self.assertEqual(e.reason(), str(e).partition(": ")[2])

  def test_a_message_that_quotes_the_value(self):
    e = self._raised(lambda: rollout.PromptConfig(first_turn="Hi {score}"))
    self.assertEqual((e.owner, e.field, e.value), ("PromptConfig", "first_turn", "Hi {score}"))
    self.assertTrue(str(e).startswith("PromptConfig.first_turn uses {score}; allowed fields"),
                    str(e))

  def test_every_config_dataclass_raises_it(self):
    nano = models.get_config("nano")
    cases = [
        (lambda: losses.FilterConfig(mode="top"), "FilterConfig", "mode", "top"),
        (lambda: train.OptimizerConfig(learning_rate=-1.0), "OptimizerConfig",
         "learning_rate", -1.0),
        (lambda: train.TrainConfig(model=nano, ppo_epochs=0), "TrainConfig", "ppo_epochs", 0),
        (lambda: nano.replace(dtype="bf16"), "ModelConfig", "dtype", "bf16"),
        (lambda: models.LoraConfig(rank=0), "LoraConfig", "rank", 0),
        (lambda: rollout.PromptConfig(max_actions_per_turn=0), "PromptConfig",
         "max_actions_per_turn", 0),
        # Int fields, checked by jagent.check_int with the dataclass as owner.
        (lambda: train.OptimizerConfig(warmup_steps=-1), "OptimizerConfig", "warmup_steps", -1),
        (lambda: nano.replace(num_layers=1.5), "ModelConfig", "num_layers", 1.5),
        (lambda: models.SamplingConfig(max_new_tokens=4, top_k=-1), "SamplingConfig",
         "top_k", -1),
        (lambda: rollout.RolloutConfig(history_turns=-2), "RolloutConfig", "history_turns", -2),
    ]
    for build, owner, field, value in cases:
      with self.subTest(owner):
        e = self._raised(build)
        self.assertEqual((e.owner, e.field, e.value), (owner, field, value))
        self.assertEqual(str(e), f"{owner}.{field}={value!r}: {e.why}")

  def test_pickles(self):
    e = self._raised(lambda: rollout.PromptConfig(first_turn="{score}"))
    back = pickle.loads(pickle.dumps(e))
    self.assertEqual((back.owner, back.field, back.value, back.why, back.advice, str(back)),
                     (e.owner, e.field, e.value, e.why, e.advice, str(e)))


if __name__ == "__main__":
  absltest.main()
