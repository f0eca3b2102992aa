"""Evaluation harness: reproduce the paper's toxicity and sentiment experiments on local models.

    from steerkit.evaluation import EvalConfig, EvalRunner
    cfg = EvalConfig(task="toxicity", prompts=[{"path": "prompts.jsonl", "limit": 100}])
    result = EvalRunner(cfg).run()          # generations.jsonl, scores.jsonl, metrics.json, report.md, plots/

The CLI is ``steerkit eval toxicity|sentiment`` (:mod:`steerkit.cli.evaluate`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import EvalConfig, PromptSet, Setting
    from .metrics import average_max_toxicity, distinct_n, positive_rate, toxic_rate
    from .runner import EvalRunner
    from .scorers import BaseScorer, Scorer, load_scorer

__all__ = ["EvalConfig", "PromptSet", "Setting", "EvalRunner", "Scorer", "BaseScorer", "load_scorer",
           "average_max_toxicity", "toxic_rate", "positive_rate", "distinct_n"]

#: lazy (PEP 562): the registry imports :mod:`.builtin_scorers` on every lookup, ``steerkit --help`` included, and
#: :mod:`.config` imports torch
_LAZY = {"EvalConfig": ".config", "PromptSet": ".config", "Setting": ".config", "EvalRunner": ".runner",
         "Scorer": ".scorers", "BaseScorer": ".scorers", "load_scorer": ".scorers",
         "average_max_toxicity": ".metrics", "toxic_rate": ".metrics", "positive_rate": ".metrics",
         "distinct_n": ".metrics"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
