"""The package's shape: no import cycle between steerkit's modules, and no module over 400 lines without a reason.

Imports are read with ``ast``, not by importing: every ``import`` / ``from`` statement counts, including those
inside functions and under ``if TYPE_CHECKING`` (a lazy import hides a cycle, it does not remove it), with
relative imports resolved. ``from package import name`` counts as importing ``package.name`` when that is a
module. A package's ``__init__`` counts as a module (importing
``package.module`` runs it), except for an edge from a module to a package that contains it, which Python
imports first anyway.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "steerkit"
MAX_LINES = 400
REASON = "Over 400 lines because"


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    root = package.parent
    found = {}
    for path in sorted(package.rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The steerkit modules that ``module`` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets.add(source)
            targets.update(f"{source}.{alias.name}" for alias in node.names)
    edges = set()
    for target in targets:
        while target and target not in known:  # an attribute of a module: the module itself
            target = target.rpartition(".")[0]
        if not target or target == module or not target.startswith("steerkit"):
            continue
        if known[target].name == "__init__.py" and module.startswith(target + "."):
            continue  # a module's own enclosing package: imported before the module in any case
        edges.add(target)
    return edges


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_walker_sees_every_kind_of_import(tmp_path):
    package = tmp_path / "steerkit"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import x\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("import steerkit.sub.c\n")
    (package / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n")
    known = modules(package)
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert graph["steerkit.a"] == {"steerkit.sub", "steerkit.sub.b"}  # lazy, relative, `from package import module`
    assert graph["steerkit.sub.b"] == {"steerkit.sub.c"}  # absolute
    assert graph["steerkit.sub.c"] == {"steerkit.a"}  # TYPE_CHECKING, two levels up
    assert cycles(graph) == [["steerkit.a", "steerkit.sub.b", "steerkit.sub.c"]]


def test_no_import_cycle_inside_steerkit():
    found = cycles(import_graph())
    assert not found, "import cycles between steerkit modules (break each by moving what both need into a " \
                      "module of its own):\n" + "\n".join(" -> ".join(c) for c in found)


def test_registry_imports_nothing_from_rewards():
    reach, todo = set(), ["steerkit.registry"]
    graph = import_graph()
    while todo:
        for target in graph[todo.pop()] - reach:
            reach.add(target)
            todo.append(target)
    assert not {m for m in reach if m.startswith("steerkit.rewards")}, sorted(reach)


def stated_reason(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return any(line.strip().startswith(REASON) for line in doc.splitlines()[:12])


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_over_400_lines_without_a_stated_reason(name):
    path = modules()[name]
    count = len(path.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_LINES or stated_reason(path), (
        f"{path.relative_to(PACKAGE.parent)} has {count} lines: split it (one concept per module), or state why "
        f"not in the first lines of its module docstring, on a line starting {REASON!r}.")
