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
import tomllib

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


# nbformat 4.5's cell id: 1-64 letters, digits, "-" or "_", unique in the notebook.
CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")


def notebook_json(cells: list[tuple[str, str]]) -> dict:
  """An nbformat 4.5 notebook with these cells (ids ``cell-<i>``) and no outputs."""
  def cell(i, kind, source):
    out = {"cell_type": kind, "id": f"cell-{i}", "metadata": {},
           "source": source.splitlines(keepends=True)}
    if kind == "code":
      out.update(execution_count=None, outputs=[])
    return out
  return {
      "cells": [cell(i, k, s) for i, (k, s) in enumerate(cells)],
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
    notebook = json.loads(path.read_text())
    got = [(c["cell_type"], "".join(c["source"])) for c in notebook["cells"]]
    self.assertEqual(got, want, f"{path.name} differs from {name}.py; regenerate it")
    # Cell ids (nbformat >= 4.5; without them nbformat warns MissingIDFieldWarning
    # and Jupyter rewrites the file on open).
    self.assertEqual(notebook, notebook_json(want), f"regenerate {path.name}")
    ids = [c.get("id") for c in notebook["cells"]]
    self.assertTrue(all(i is not None and CELL_ID.match(i) for i in ids), ids)
    self.assertLen(set(ids), len(ids))
    self.assertGreaterEqual((notebook["nbformat"], notebook["nbformat_minor"]), (4, 5))

  @parameterized.named_parameters(*[(t, t) for t in TWINS])
  def test_install_cell_says_how(self, name):
    # No placeholder a user cannot run; a wheel or a clone, and how to build the wheel.
    install = percent_cells((COLAB / f"{name}.py").read_text())[1][1]
    self.assertNotIn("<URL", install)
    self.assertIn("pip wheel --no-deps -w dist .", install)
    with open(COLAB.parent / "pyproject.toml", "rb") as f:
      version = tomllib.load(f)["project"]["version"]
    self.assertIn(f"!pip install -q /content/jagent-{version}-py3-none-any.whl", install)
    self.assertIn("!pip install -q -e /content/jagent", install)

  @parameterized.named_parameters(*[(t, t) for t in TWINS])
  def test_twin_runs(self, name):
    result = subprocess.run(
        [sys.executable, str(COLAB / f"{name}.py")], cwd=COLAB, capture_output=True,
        text=True, timeout=600, check=False, env=testenv.subprocess_env(1))
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])


if __name__ == "__main__":
  absltest.main()
