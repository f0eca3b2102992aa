"""Evaluation harness: reproduce the paper's toxicity and sentiment experiments on local models.

    from steerkit.evaluation import EvalConfig, EvalRunner
    cfg = EvalConfig(task="toxicity", prompts=[{"path": "prompts.jsonl", "limit": 100}])
    result = EvalRunner(cfg).run()          # generations.jsonl, scores.jsonl, metrics.json, report.md, plots/

The CLI is ``steerkit eval toxicity|sentiment`` (:mod:`steerkit.cli.evaluate`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, globals(), _LAZY, __all__)
