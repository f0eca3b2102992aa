"""tests/lower-bounds.txt pins exactly the lower bounds pyproject.toml declares for the core and the dev extra, so
the second CI environment (.ci/run) tests the oldest versions the project claims, not some other set."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    names = re.fullmatch(r"steerkit-rad\[(.*)\]", extras["dev"][0]).group(1).split(",")
    requirements = list(project["dependencies"]) + [r for extra in names for r in extras[extra]]
    bounds = {}
    for text in requirements:
        req = Requirement(text)
        lower = [s.version for s in req.specifier if s.operator in (">=", "==")]
        assert len(lower) == 1, f"{text}: declare one lower bound (>= or ==) so that it can be tested"
        bounds[canonicalize_name(req.name)] = Version(lower[0])
    return bounds


def _pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "tests" / "lower-bounds.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_the_constraints_file_pins_every_declared_lower_bound():
    declared, pinned = _declared(), _pinned()
    assert declared == pinned


def test_the_dev_extra_leaves_out_the_heavy_parts():
    """The quick start installs the dev extra: TensorFlow, Ray and selenium stay out of it (they are in all)."""
    declared = _declared()
    for heavy in ("tensorflow-cpu", "tf-keras", "tox-block", "ray", "selenium"):
        assert heavy not in declared


def test_every_core_and_dev_dependency_imports():
    """Each package the core and the dev extra declare imports in this environment. A test elsewhere that
    importorskips it would otherwise skip silently where an installed release cannot load (onnxruntime 1.18 was
    built against numpy 1 and fails to import beside numpy 2: the onnx tests skipped in the lower-bound run)."""
    import importlib
    import importlib.metadata

    modules: dict[str, list[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            if not module.startswith("_"):
                modules.setdefault(canonicalize_name(dist), []).append(module)
    failures = []
    for name in _declared():
        found = sorted(modules.get(name, []))
        if not found:
            failures.append(f"{name}: not installed")
            continue
        module = name.replace("-", "_") if name.replace("-", "_") in found else found[0]
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure to load is what this test reports
            failures.append(f"{name} ({module}): {type(exc).__name__}: {exc}")
    assert not failures, failures
