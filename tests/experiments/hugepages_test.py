"""experiments.hugepages: when the entry points restart with glibc's huge-page tunable."""

import os
import platform
import subprocess
import sys
import tempfile
import unittest

from absl.testing import absltest

from experiments import hugepages

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_GLIBC = platform.libc_ver()[0] == "glibc"


def _mode_file(text):
  f = tempfile.NamedTemporaryFile("w", suffix=".thp", delete=False)
  f.write(text)
  f.close()
  return f.name


@unittest.skipUnless(_GLIBC, "glibc only")
class EnvironTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.madvise = _mode_file("always [madvise] never\n")
    self.never = _mode_file("always madvise [never]\n")
    for path in (self.madvise, self.never):
      self.addCleanup(os.remove, path)

  def test_adds_the_tunable_after_the_ones_already_set(self):
    self.assertEqual(
        hugepages.environ_with_huge_pages({"A": "1"}, self.madvise),
        {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    self.assertEqual(
        hugepages.environ_with_huge_pages(
            {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}, self.madvise)["GLIBC_TUNABLES"],
        "glibc.malloc.arena_max=1:glibc.malloc.hugetlb=1")

  def test_nothing_to_do(self):
    for environ, mode in [
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, self.madvise),  # the user's choice
        ({"JAGENT_HUGE_PAGES": "0"}, self.madvise),  # opted out
        ({}, self.never),  # the kernel has none
        ({}, "/nonexistent/enabled"),  # unknown kernel
    ]:
      self.assertIsNone(hugepages.environ_with_huge_pages(environ, mode), (environ, mode))


class RestartTest(absltest.TestCase):

  def test_the_program_restarts_once_with_its_own_arguments(self):
    code = ("import os, sys; print('start', flush=True); "
            "from experiments import hugepages; hugepages.restart_with_huge_pages(); "
            "print(os.environ.get('GLIBC_TUNABLES'), sys.argv[1:])")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "JAGENT_HUGE_PAGES")}
    out = subprocess.run([sys.executable, "-c", code, "a", "--b=1"], cwd=_ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    if hugepages.environ_with_huge_pages(env) is None:  # no glibc or no THP here
      self.assertEqual(out, ["start", "None ['a', '--b=1']"])
    else:
      self.assertEqual(out, ["start", "start", "glibc.malloc.hugetlb=1 ['a', '--b=1']"])
    env["JAGENT_HUGE_PAGES"] = "0"
    out = subprocess.run([sys.executable, "-c", code, "a"], cwd=_ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    self.assertEqual(out, ["start", "None ['a']"])


if __name__ == "__main__":
  absltest.main()
