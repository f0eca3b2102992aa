"""Evaluation harness: reproduce the paper's toxicity and sentiment experiments on local models.

    from steerkit.evaluation import EvalConfig, EvalRunner
    cfg = EvalConfig(task="toxicity", prompts=[{"path": "prompts.jsonl", "limit": 100}])
    result = EvalRunner(cfg).run()          # generations.jsonl, scores.jsonl, metrics.json, report.md, plots/

The CLI is ``steerkit eval toxicity|sentiment`` (:mod:`steerkit.cli.evaluate`).
"""

from .config import EvalConfig, PromptSet, Setting
from .metrics import average_max_toxicity, distinct_n, positive_rate, toxic_rate
from .runner import EvalRunner
from .scorers import BaseScorer, Scorer, load_scorer

__all__ = ["EvalConfig", "PromptSet", "Setting", "EvalRunner", "Scorer", "BaseScorer", "load_scorer",
           "average_max_toxicity", "toxic_rate", "positive_rate", "distinct_n"]
