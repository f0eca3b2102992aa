"""Evaluation scorers: the contract, the built-in implementations, and lookup by name.

A scorer spec is ``NAME`` or ``NAME:OPTIONS`` where OPTIONS is a comma-separated list of ``key=value``;
a first option without ``=`` is passed as the factory's first parameter, so
``hf-classifier:./sst2-distilbert,label=POSITIVE`` and ``reward:toxicity,measures=toxicity`` work.
Values are parsed as JSON when they can be (``qps=0.5``, ``rescale=false``), else kept as strings.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from ...errors import PluginError
from .base import MEASURES, BaseScorer, Scorer, check_scores, validate_scorer

__all__ = ["Scorer", "BaseScorer", "MEASURES", "load_scorer", "parse_scorer_spec", "check_scores",
           "validate_scorer", "scorer_names"]


def parse_scorer_spec(spec: str | dict) -> tuple[str, dict[str, Any], str | None]:
    """``"name:a=1,b=x"`` or ``{"name": ..., "options": {...}}`` -> (name, options, positional value or None)."""
    if isinstance(spec, dict):
        unknown = set(spec) - {"name", "options"}
        if "name" not in spec or unknown:
            raise PluginError(f"A scorer entry needs 'name' and optional 'options', got keys {sorted(spec)}.")
        return str(spec["name"]), dict(spec.get("options") or {}), None
    name, _, rest = str(spec).partition(":")
    name = name.strip()
    if not name:
        raise PluginError(f"Empty scorer name in {spec!r}; use e.g. vader or hf-classifier:MODEL,label=POSITIVE.")
    options: dict[str, Any] = {}
    positional = None
    for i, part in enumerate(p for p in rest.split(",") if p.strip()) if rest else []:
        key, eq, value = part.partition("=")
        if not eq:
            if i != 0:
                raise PluginError(f"Scorer spec {spec!r}: option {part!r} needs key=value (only the first may be bare).")
            positional = part.strip()
            continue
        options[key.strip()] = _value(value.strip())
    return name, options, positional


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def load_scorer(spec: str | dict | Scorer, **extra) -> Scorer:
    """Build a scorer from a spec through the plugin registry; check it honours the contract."""
    if not isinstance(spec, (str, dict)):
        return validate_scorer(spec)
    from ...registry import get_scorer

    get_registry = ensure_builtin_scorers
    name, options, positional = parse_scorer_spec(spec)
    options.update(extra)
    if positional is not None:
        factory = get_registry().get("scorer", name).factory
        params = [p for p in inspect.signature(factory).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not params:
            raise PluginError(f"Scorer {name!r} takes no positional option; write key=value (got {positional!r}).")
        options[params[0].name] = positional
    try:
        scorer = get_scorer(name, **options)
    except TypeError as exc:  # unexpected option names
        raise PluginError(f"Scorer {name!r} rejected options {sorted(options)}: {exc}") from None
    return validate_scorer(scorer, name)


def ensure_builtin_scorers():
    """The registry, with the built-in scorers registered (through the same hook as any plugin)."""
    from ... import registry

    reg = registry.get_registry()
    module = "steerkit.evaluation.builtin_scorers"
    if module not in reg.plugins:  # a registry whose BUILTIN_PLUGINS does not list the module
        import importlib

        reg.register_plugin(importlib.import_module(module), name=module)
    return reg


def scorer_names() -> list[str]:
    return sorted(ensure_builtin_scorers().entries["scorer"])
