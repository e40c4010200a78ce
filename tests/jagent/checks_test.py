"""Tests of jagent.check_int, the one check of int-valued settings."""

from absl.testing import absltest
import numpy as np

import jagent


class CheckIntTest(absltest.TestCase):

  def test_returns_a_python_int(self):
    self.assertEqual(jagent.check_int("n", 3, 1), 3)
    out = jagent.check_int("n", np.int64(7), 0, 7)
    self.assertIs(type(out), int)
    self.assertEqual(out, 7)
    self.assertEqual(jagent.check_int("k", -1, -1), -1)

  def test_refuses_bools_floats_strings_and_out_of_range(self):
    for value in (True, 2.0, "2", None, 0, 9):
      with self.subTest(value=value):
        with self.assertRaises(ValueError):
          jagent.check_int("n", value, 1, 8)

  def test_message_names_the_setting_and_the_bound(self):
    with self.assertRaisesRegex(ValueError, r"^RolloutConfig\.max_turns=0: must be an int >= 1$"):
      jagent.check_int("RolloutConfig.max_turns", 0, 1)
    with self.assertRaisesRegex(ValueError, r"^--size=10: must be an int in \[2, 9\]$"):
      jagent.check_int("--size", 10, 2, 9)
    with self.assertRaisesRegex(ValueError, r"^x=True: must be odd$"):
      jagent.check_int("x", True, 0, why="must be odd")

  def test_raises_the_given_error_class(self):
    class ConfigError(ValueError):
      pass

    with self.assertRaises(ConfigError):
      jagent.check_int("config.rl.steps", -5, 0, error=ConfigError)

  def test_an_owner_makes_it_a_field_error(self):
    with self.assertRaises(jagent.FieldError) as cm:
      jagent.check_int("rank", 0, 1, owner="LoraConfig")
    e = cm.exception
    self.assertEqual((e.owner, e.field, e.value, e.why),
                     ("LoraConfig", "rank", 0, "must be an int >= 1"))
    self.assertEqual(str(e), "LoraConfig.rank=0: must be an int >= 1")


if __name__ == "__main__":
  absltest.main()
