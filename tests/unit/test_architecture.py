"""The package's shape: no import cycle between steerkit's modules, no module over 400 lines without a reason, no
function over 100 lines, no import from a higher layer (``LAYERS``), and docs that name every module
(docs/architecture.md's module map, the README's layout).

Imports are read with ``ast``, not by importing: every ``import`` / ``from`` statement counts, including those
inside functions and under ``if TYPE_CHECKING`` (a lazy import hides a cycle, it does not remove it), with
relative imports resolved. ``from package import name`` counts as importing ``package.name`` when that is a
module. A package's ``__init__`` counts as a module (importing
``package.module`` runs it), except for an edge from a module to a package that contains it, which Python
imports first anyway.
"""

from __future__ import annotations

import ast
import re
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


# -- the layers ------------------------------------------------------------------------------------------------------
#
# Lowest first. A module may import from its own layer and from the layers below it, never from a layer above
# (module level, inside functions or under TYPE_CHECKING alike: ``imported`` sees them all). ``pkg.*`` is the
# package and everything in it; any other entry is one module. A new module must be placed here (see
# ``test_every_module_has_a_layer``); docs/architecture.md ("Layers") says the same in words.
#
# The RAD step (engine/step.py) and the text rule (engine/text.py) import nothing from steerkit but its errors and
# sit at the bottom of the engine; the core (reward sessions, the LM cache) sits above the rewards. Neither imports
# the terms (rows carry SteeringTerm objects); ``steering.reweight`` is the step on a batch that shares its terms
# (steering -> engine.step).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", (
        "steerkit.errors", "steerkit.seeds", "steerkit.files", "steerkit.threads", "steerkit.validators",
        "steerkit.hf_compat", "steerkit.hookspecs", "steerkit.plugin_conflicts", "steerkit.provenance",
        "steerkit.registry", "steerkit.model_checks", "steerkit.llama_cpp_lib", "steerkit.model_copies",
        "steerkit.compiling", "steerkit.graph_cache", "steerkit.linear_precision", "steerkit.lazy", "steerkit.limits")),
    ("the step", ("steerkit.engine", "steerkit.engine.step", "steerkit.engine.pruning", "steerkit.engine.text")),
    ("models and rewards", ("steerkit.models", "steerkit.devices", "steerkit.rewards.*")),
    ("the engine core", (
        "steerkit.engine.core", "steerkit.engine.rows", "steerkit.engine.lm_cache", "steerkit.engine.reward_groups",
        "steerkit.engine.llama_cpp_lm", "steerkit.engine.llama_cpp_batch", "steerkit.engine.static_lm", "steerkit.engine.lm_int8")),
    ("terms and parameters", ("steerkit.steering", "steerkit.params", "steerkit.terms", "steerkit.config")),
    ("decoding and set-up", ("steerkit", "steerkit.decoding", "steerkit.hf", "steerkit.assembly")),
    ("surfaces", ("steerkit.serving.*", "steerkit.evaluation.*", "steerkit.training.*", "steerkit.testing",
                  "steerkit.integrations.*")),
    ("distribution", ("steerkit.distributed.*",)),
    ("command line", ("steerkit.cli.*", "steerkit.__main__")),
)

#: Surfaces that stand side by side: none imports another (what two of them share belongs in a lower layer).
PEER_SURFACES = ("steerkit.serving", "steerkit.evaluation", "steerkit.training", "steerkit.testing",
                 "steerkit.integrations")

#: The serving engine's side of steerkit/serving/; every other module there is the HTTP side.
SERVING_ENGINE_SIDE = frozenset({"steerkit.serving.engine", "steerkit.serving.requests", "steerkit.serving.validation",
                                 "steerkit.serving.row_terms", "steerkit.serving.loading", "steerkit.serving.prefill"})


def _matches(name: str, entry: str) -> bool:
    if entry.endswith(".*"):
        package = entry[:-2]
        return name == package or name.startswith(package + ".")
    return name == entry


def layers_of(name: str) -> list[int]:
    return [i for i, (_, entries) in enumerate(LAYERS) if any(_matches(name, e) for e in entries)]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_layer_matching():
    assert layers_of("steerkit") == [5] and layers_of("steerkit.engine") == [1]
    assert layers_of("steerkit.engine.core") == [3] and layers_of("steerkit.serving.routes.chat") == [6]
    assert layers_of("steerkit.rewards") == [2] and layers_of("steerkit.rewardsx") == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_has_a_layer(name):
    found = layers_of(name)
    assert len(found) == 1, (
        f"{name} is in {len(found)} layers ({[LAYERS[i][0] for i in found]}); put it in exactly one of LAYERS in "
        f"tests/unit/test_architecture.py (and in docs/architecture.md's module map)")


def test_no_module_imports_from_a_higher_layer():
    graph = import_graph()
    found = []
    for name, targets in sorted(graph.items()):
        (mine,) = layers_of(name) or (len(LAYERS),)  # an unplaced module fails test_every_module_has_a_layer
        for target in sorted(targets):
            (theirs,) = layers_of(target) or (-1,)
            if theirs > mine:
                found.append(f"{name} ({LAYERS[mine][0]}) -> {target} ({LAYERS[theirs][0]})")
    assert not found, (
        "imports from a higher layer (move what the lower module needs down, or hand it in from above; the layers "
        "are LAYERS in tests/unit/test_architecture.py):\n" + "\n".join(found))


def test_peer_surfaces_import_nothing_from_each_other():
    graph = import_graph()
    found = [f"{name} -> {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
             for mine in PEER_SURFACES for theirs in PEER_SURFACES
             if mine != theirs and _within(name, mine) and _within(target, theirs)]
    assert not found, "one surface imports another (share it through a lower layer instead):\n" + "\n".join(found)


def test_the_serving_engine_side_imports_nothing_from_the_http_side():
    graph = import_graph()
    http = {name for name in graph if name.startswith("steerkit.serving.") and name not in SERVING_ENGINE_SIDE}
    assert SERVING_ENGINE_SIDE <= set(graph), sorted(SERVING_ENGINE_SIDE - set(graph))
    found = [f"{name} -> {target}" for name in sorted(SERVING_ENGINE_SIDE) for target in sorted(graph[name] & http)]
    assert not found, ("the serving engine (a library: scripts, tests and Ray Serve replicas drive it without HTTP) "
                       "imports the HTTP side:\n" + "\n".join(found))


def test_the_step_imports_nothing_from_steerkit_but_its_errors():
    graph = import_graph()
    assert graph["steerkit.engine.step"] <= {"steerkit.errors"} and not graph["steerkit.engine.text"], (
        graph["steerkit.engine.step"], graph["steerkit.engine.text"])


def test_the_engine_imports_no_terms_and_no_surface():
    graph = import_graph()
    found = sorted(f"{m} -> {t}" for m in graph if m.startswith("steerkit.engine") for t in graph[m]
                   if not t.startswith(("steerkit.engine", "steerkit.errors", "steerkit.hf_compat", "steerkit.rewards.base",
                                        "steerkit.llama_cpp_lib", "steerkit.model_copies", "steerkit.files",
                                        "steerkit.compiling", "steerkit.linear_precision")))
    assert not found, found


# -- no function over 100 lines --------------------------------------------------------------------------------------

MAX_FUNCTION_LINES = 100


def long_functions(package: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    found = []
    for name, path in sorted(modules(package).items()):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in sorted(ast.walk(tree), key=lambda node: getattr(node, "lineno", 0)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_the_function_length_check_sees_methods_and_nested_functions(tmp_path):
    package = tmp_path / "steerkit"
    package.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(3))
    (package / "a.py").write_text(f"class C:\n    def m(self):\n{body}\n\n\ndef f():\n    async def g():\n"
                                  "        pass\n")
    assert long_functions(package, limit=3) == ["steerkit/a.py:2 m (4 lines)"]
    assert long_functions(package, limit=2) == ["steerkit/a.py:2 m (4 lines)", "steerkit/a.py:8 f (3 lines)"]


def test_no_function_over_100_lines():
    found = long_functions()
    assert not found, (f"functions over {MAX_FUNCTION_LINES} lines (split each where a reader would: one step per "
                       "helper):\n" + "\n".join(found))


# -- docs/architecture.md and the README's layout name every module ---------------------------------------------------

ROOT = PACKAGE.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def spellings(name: str, path: Path) -> list[str]:
    """How docs/architecture.md may name a module: ``engine/step.py``, ``steerkit/engine/step.py`` or
    ``steerkit.engine.step`` (a package: its ``__init__.py`` path, or its dotted name)."""
    relative = path.relative_to(PACKAGE).as_posix()
    forms = [rf"(?<![\w./-])(?:steerkit/)?{re.escape(relative)}(?![\w/])"]
    if name != "steerkit":
        forms.append(rf"(?<![\w./-]){re.escape(name)}(?!\.?\w)")
    return forms


def names_module(text: str, name: str, path: Path) -> bool:
    return any(re.search(form, text) for form in spellings(name, path))


def test_module_spellings():
    text = "`config.py` `evaluation/config.py` `steerkit.engine.step` `steerkit/serving/routes/__init__.py`."
    assert names_module(text, "steerkit.config", PACKAGE / "config.py")
    assert not names_module("`evaluation/config.py` `training/config.py`", "steerkit.config", PACKAGE / "config.py")
    assert names_module(text, "steerkit.engine.step", PACKAGE / "engine" / "step.py")
    assert not names_module("`steerkit.engine.step`", "steerkit.engine", PACKAGE / "engine" / "__init__.py")
    assert names_module(text, "steerkit.serving.routes", PACKAGE / "serving" / "routes" / "__init__.py")
    assert not names_module("`engine/__init__.py`", "steerkit", PACKAGE / "__init__.py")


@pytest.mark.parametrize("name", sorted(modules()))
def test_architecture_doc_names_every_module(name):
    path = modules()[name]
    relative = path.relative_to(PACKAGE).as_posix()
    assert names_module(ARCHITECTURE.read_text(encoding="utf-8"), name, path), (
        f"docs/architecture.md does not name the module {name} (steerkit/{relative}): add `{relative}` to its "
        "module map, under its package, with what it holds")


def test_architecture_doc_names_no_module_that_does_not_exist():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    gone = []
    for match in re.finditer(r"(?<![\w./-])((?:[\w-]+/)*\w+\.py)(?![\w/])", text):
        relative = match.group(1)
        if not any((base / relative).is_file() for base in (ROOT, PACKAGE)):
            gone.append(relative)
    assert not gone, f"docs/architecture.md names files that do not exist: {sorted(set(gone))}"


def readme_layout() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


@pytest.mark.parametrize("entry", sorted(
    [f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    + [p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]))
def test_readme_layout_names_every_package_and_top_level_module(entry):
    assert re.search(rf"(?<![\w./-]){re.escape(entry)}", readme_layout()), (
        f"README.md's Layout block does not list steerkit/{entry}: add a line for it")
