"""Public names imported on first use (PEP 562), for a package whose ``import`` must stay cheap.

    __getattr__, __dir__ = lazy_names(__name__, globals(), {"generate": ".assembly"}, __all__)

``steerkit`` and ``steerkit.evaluation`` use it, so that ``import steerkit``, ``steerkit --help`` and a plugin's
``from steerkit import hookimpl`` load neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any


def lazy_names(package: str, namespace: MutableMapping[str, Any], table: Mapping[str, str],
               public: Iterable[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``package``.

    ``table`` maps a public name to the module (relative to ``package``) it comes from; the first lookup imports it
    and caches the value in ``namespace`` (the package's ``globals()``), so later lookups never reach ``__getattr__``.
    """
    public = frozenset(public)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | public)

    return __getattr__, __dir__
