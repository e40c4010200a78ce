"""Notebooks in colab/ cannot rot: each runs, and equals its `# %%` twin.

Each ``colab/<name>.ipynb`` has a ``colab/<name>.py`` twin in the percent
format (``# %%`` code cells, ``# %% [markdown]`` cells whose lines start with
``# ``). The test runs the twin as a script (a fresh process on one CPU device,
as a user would, with the suite's XLA flags and compilation cache)
and checks that the notebook's cells equal the twin's. After editing a twin,
regenerate its notebook with::

    JAGENT_WRITE_NOTEBOOKS=1 python -m pytest tests/colab_test.py
"""

import json
import os
import pathlib
import re
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import pytest

from tests import testenv

COLAB = pathlib.Path(__file__).resolve().parent.parent / "colab"
TWINS = sorted(p.stem for p in COLAB.glob("*.py"))


def percent_cells(text: str) -> list[tuple[str, str]]:
  """Splits percent-format source into (cell_type, source) pairs."""
  cells = []
  for chunk in re.split(r"^# %%", text, flags=re.MULTILINE)[1:]:
    header, _, body = chunk.partition("\n")
    if header.strip() == "[markdown]":
      lines = [line[2:] if line.startswith("# ") else line.lstrip("#")
               for line in body.strip("\n").splitlines()]
      cells.append(("markdown", "\n".join(lines)))
    else:
      cells.append(("code", body.strip("\n")))
  return cells


def notebook_json(cells: list[tuple[str, str]]) -> dict:
  """An nbformat 4 notebook with these cells and no outputs."""
  def cell(kind, source):
    out = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
    if kind == "code":
      out.update(execution_count=None, outputs=[])
    return out
  return {
      "cells": [cell(k, s) for k, s in cells],
      "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                  "name": "python3"},
                   "language_info": {"name": "python"}},
      "nbformat": 4,
      "nbformat_minor": 5,
  }


@pytest.mark.heavy
class ColabTest(parameterized.TestCase):

  def test_there_are_notebooks(self):
    self.assertNotEmpty(TWINS)

  @parameterized.named_parameters(*[(t, t) for t in TWINS])
  def test_notebook_equals_twin(self, name):
    want = percent_cells((COLAB / f"{name}.py").read_text())
    path = COLAB / f"{name}.ipynb"
    if os.environ.get("JAGENT_WRITE_NOTEBOOKS") == "1":
      path.write_text(json.dumps(notebook_json(want), indent=1, ensure_ascii=False) + "\n")
    self.assertTrue(path.exists(), f"{path} is missing; see this module's docstring")
    got = [(c["cell_type"], "".join(c["source"]))
           for c in json.loads(path.read_text())["cells"]]
    self.assertEqual(got, want, f"{path.name} differs from {name}.py; regenerate it")

  @parameterized.named_parameters(*[(t, t) for t in TWINS])
  def test_twin_runs(self, name):
    result = subprocess.run(
        [sys.executable, str(COLAB / f"{name}.py")], cwd=COLAB, capture_output=True,
        text=True, timeout=600, check=False, env=testenv.subprocess_env(1))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])


if __name__ == "__main__":
  absltest.main()
