"""No import circles between the modules of jagent, envs_jax and experiments.

Every ``import`` statement counts, including those inside functions (a local
import is how a circle hides). Edges into a package's ``__init__`` are left
out: a package re-exports its modules, so a module importing a sibling by the
package name is not a circle between modules.
"""

import ast
import pathlib

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_ROOTS = ("jagent", "envs_jax", "experiments")


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
  """Module -> the repo modules it imports (package ``__init__`` modules left out)."""
  files = {_module_name(p): p for r in PACKAGE_ROOTS for p in (ROOT / r).rglob("*.py")}
  packages = {m for m, p in files.items() if p.name == "__init__.py"}
  graph = {}
  for module, path in files.items():
    if module in packages:
      continue
    here = module.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        targets.update(a.name for a in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          anchor = here.split(".")[:len(here.split(".")) - node.level + 1]
          base = ".".join(anchor + ([node.module] if node.module else []))
        targets.add(base)
        targets.update(f"{base}.{a.name}" for a in node.names)
    graph[module] = {t for t in targets if t in files and t not in packages and t != module}
  return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan), sorted."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return sorted(out)


class ImportGraphTest(absltest.TestCase):

  def test_finds_a_circle_through_a_local_import(self):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    self.assertEqual(circles(graph), [["a", "b", "c"]])
    self.assertEqual(circles({"a": {"b"}, "b": set()}), [])

  def test_graph_sees_the_known_edges(self):
    graph = import_graph()
    self.assertIn("envs_jax._src.frozen_lake_rules", graph["envs_jax._src.frozen_lake_solver"])
    self.assertIn("jagent.models._lora", graph["jagent.models._transformer"])

  def test_no_circles(self):
    self.assertEqual(circles(import_graph()), [])


if __name__ == "__main__":
  absltest.main()
