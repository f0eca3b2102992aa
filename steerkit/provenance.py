"""Which distribution provides the ``steerkit`` import package, and the refusal of a foreign one.

This project is distributed as ``steerkit-rad`` (:data:`DISTRIBUTION`); the import package, the
``steerkit`` command and the ``steerkit`` entry-point group keep the short name. The distribution name
``steerkit`` on PyPI belongs to an unrelated project, which installs an import package ``steerkit`` of its own.
With both installed, one's files overwrite the other's and Python imports whichever comes first, or a mix of
the two. :func:`check_distribution` refuses that state with a
:class:`~steerkit.errors.ForeignDistributionError` saying what to uninstall: ``steerkit setup``, the plugin
registry (before it loads any installed plugin) and the shipped plugins (when imported) call it.

What counts as foreign, read from the metadata of the distributions on ``sys.path`` (importlib.metadata; no pip
call, no network):

* any distribution named ``steerkit`` (the unrelated project, or this one installed under its old name), and
* any other distribution that ships the top-level package ``steerkit``: its ``top_level.txt``, or else the first
  parts of the paths in its ``RECORD``, which is what :func:`importlib.metadata.packages_distributions` reads,
  here per distribution so that a test can point it at a directory of its own.

``steerkit-rad`` itself is recognised by its name, so an editable install (``pip install -e .``, whose ``RECORD``
lists a path hook rather than the package) is never refused. Neither is the ``steerkit.egg-info`` that building a
checkout of this project before the rename left beside its sources: it is found only when the checkout's root is
on ``sys.path`` (``python -m steerkit`` from there) and installs nothing.
"""

from __future__ import annotations

import csv
import importlib.metadata
import inspect
import itertools
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable
from urllib.parse import unquote, urlparse

from .errors import ForeignDistributionError
from .plugin_conflicts import norm

#: The name this project is distributed as (``pip show steerkit-rad``).
DISTRIBUTION = "steerkit-rad"
#: The import package (and the name of the unrelated distribution on PyPI).
PACKAGE = "steerkit"
#: The directory holding the imported ``steerkit`` package (a checkout's root, or site-packages).
_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ForeignDistribution:
    """An installed distribution, other than steerkit-rad, that is named ``steerkit`` or ships files in it."""

    name: str
    version: str
    location: str  # the directory its metadata is in (site-packages, a sys.path entry)
    named: bool  # named ``steerkit`` (else: another name, shipping files inside the ``steerkit`` package)

    def describe(self) -> str:
        where = f"{self.name} {self.version} in {self.location}"
        if self.named:
            return (f"a distribution named 'steerkit' is installed ({where}), which is not this project: this one "
                    f"is distributed as '{DISTRIBUTION}' (the name 'steerkit' on PyPI belongs to an unrelated project)")
        return f"the distribution {self.name!r} ({where}) ships files inside the 'steerkit' import package"


def foreign_distributions(path: Iterable[str | Path] | None = None) -> list[ForeignDistribution]:
    """The distributions on ``path`` (default ``sys.path``) that are not steerkit-rad but are named ``steerkit``
    or ship files inside the ``steerkit`` import package; empty when steerkit-rad has the package to itself."""
    kwargs = {} if path is None else {"path": [str(p) for p in path]}
    found: list[ForeignDistribution] = []
    seen: set[tuple[str, str]] = set()
    # the distributions named steerkit (a lookup by name), then every one shipping files in the package (reading
    # only top_level.txt or RECORD of each: parsing every distribution's metadata would take several times longer)
    named = importlib.metadata.distributions(name=PACKAGE, **kwargs)
    shipping = (d for d in importlib.metadata.distributions(**kwargs) if _ships_package(d))
    for dist in itertools.chain(named, shipping):
        try:
            name = dist.metadata.get("Name") or ""
        except Exception:  # noqa: BLE001 - unreadable metadata: nothing to judge it by
            continue
        key = norm(name)  # PEP 503: Steerkit_RAD == steerkit-rad
        if not name or key == DISTRIBUTION:
            continue
        location = _location(dist)
        if key == PACKAGE and _build_leftover(dist, location):
            continue
        if (key, location) not in seen:
            seen.add((key, location))
            found.append(ForeignDistribution(name, dist.version or "?", location, key == PACKAGE))
    return found


def foreign_message(foreign: list[ForeignDistribution], needed_by: str | None = None) -> str:
    """What :func:`check_distribution` raises: what is installed, and the commands that put it right."""
    who = f"{needed_by} needs {DISTRIBUTION}, but " if needed_by else ""
    names = sorted({f.name for f in foreign})
    they, them, its = ("It shares", "it", "its") if len(names) == 1 else ("They share", "them", "their")
    return (f"{who}{'; '.join(f.describe() for f in foreign)}. {they} the 'steerkit' import package with "
            f"{DISTRIBUTION}, so Python may run {its} code, or a mix, as steerkit. Remove {them}, then reinstall "
            f"{DISTRIBUTION} over the files {them} replaced: pip uninstall {' '.join(names)} && "
            f"{reinstall_command()}")


def reinstall_command() -> str:
    """``pip install --force-reinstall --no-deps ...`` for steerkit-rad, from the checkout it was installed
    editable from where it was, else from PyPI."""
    try:
        origin = json.loads(importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json") or "{}")
    except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
        origin = {}
    url = urlparse(origin.get("url", "")) if isinstance(origin, dict) else urlparse("")
    if isinstance(origin, dict) and (origin.get("dir_info") or {}).get("editable") and url.scheme == "file":
        return f"pip install --force-reinstall --no-deps -e {shlex.quote(unquote(url.path))}"
    return f"pip install --force-reinstall --no-deps {DISTRIBUTION}"


def check_distribution(needed_by: str | None = None) -> None:
    """Raise :class:`~steerkit.errors.ForeignDistributionError` if a distribution other than steerkit-rad is named
    ``steerkit`` or ships files inside the ``steerkit`` package (:func:`foreign_distributions`, ~20 ms).

    ``needed_by`` names the caller in the message (a plugin: ``"steerkit-toxicity"``).
    """
    foreign = foreign_distributions()
    if foreign:
        raise ForeignDistributionError(foreign_message(foreign, needed_by))


def _ships_package(dist: importlib.metadata.Distribution) -> bool:
    top_level = dist.read_text("top_level.txt")
    if top_level is not None:
        return PACKAGE in top_level.split()
    record = dist.read_text("RECORD")  # read as CSV here: Distribution.files builds an object per line, ~100x slower
    paths = ([row[0] for row in csv.reader(record.splitlines()) if row] if record is not None
             else [str(file) for file in dist.files or ()])
    for path in paths:
        first, sep, _ = path.replace("\\", "/").partition("/")
        if first == PACKAGE if sep else inspect.getmodulename(first) == PACKAGE:
            return True
    return False


def _location(dist: importlib.metadata.Distribution) -> str:
    try:
        return str(Path(dist.locate_file("")).resolve())
    except Exception:  # noqa: BLE001 - a distribution from a custom finder may not be on the file system
        return "?"


def _build_leftover(dist: importlib.metadata.Distribution, location: str) -> bool:
    """An ``.egg-info`` (it has ``PKG-INFO``, a ``.dist-info`` has ``METADATA``) beside this very package, in a
    directory holding a ``pyproject.toml``: the metadata a build of this checkout wrote, not an installation."""
    return (location == str(_ROOT) and dist.read_text("PKG-INFO") is not None
            and (_ROOT / "pyproject.toml").is_file())
