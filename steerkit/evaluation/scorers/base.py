"""The evaluation-scorer contract: independent judges of generated text.

A scorer turns texts into numbers in [0, 1]::

    class MyScorer:
        name = "my-scorer"
        measures = "toxicity"      # or "sentiment" (the probability/degree of positive sentiment)
        description = "What it is, what it was trained on, what it is weak at."
        threshold = 0.5            # score > threshold means "toxic" / "positive"

        def score(self, texts: list[str]) -> list[float]: ...

Scorers are deliberately separate from reward models: a run steered by a reward model should be
judged by something else. Third-party scorers register through the ``register_scorers`` plugin hook
exactly like the built-in ones (see :mod:`steerkit.evaluation.builtin_scorers`).
"""

from __future__ import annotations

import importlib.util
import math
from typing import Literal, Protocol, Sequence, runtime_checkable

from ...errors import InvalidArgumentError, PluginError

Measure = Literal["toxicity", "sentiment"]
MEASURES = ("toxicity", "sentiment")


@runtime_checkable
class Scorer(Protocol):
    name: str
    measures: str
    description: str
    threshold: float

    def score(self, texts: list[str]) -> list[float]:
        """One score in [0, 1] per text (same order)."""


class BaseScorer:
    """Convenience base: validates input and output, batches, and names a missing optional package."""

    name: str = "scorer"
    measures: str = "toxicity"
    description: str = ""
    threshold: float = 0.5
    batch_size: int = 256

    def score(self, texts: Sequence[str]) -> list[float]:
        texts = _check_texts(texts, self.name)
        out: list[float] = []
        for lo in range(0, len(texts), self.batch_size):
            out.extend(self._score(texts[lo:lo + self.batch_size]))
        return check_scores(out, len(texts), self.name)

    def _score(self, texts: list[str]) -> list[float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} measures={self.measures}>"


def _check_texts(texts: Sequence[str], name: str) -> list[str]:
    if isinstance(texts, str):
        raise InvalidArgumentError(f"Scorer {name!r}: pass a list of texts, not a single string.")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InvalidArgumentError(f"Scorer {name!r}: text {i} is {type(t).__name__}, expected str.")
    return texts


def check_scores(scores: Sequence[float], n: int, name: str) -> list[float]:
    scores = [float(s) for s in scores]
    if len(scores) != n:
        raise PluginError(f"Scorer {name!r} returned {len(scores)} scores for {n} texts.")
    for i, s in enumerate(scores):
        if not math.isfinite(s) or not -1e-6 <= s <= 1 + 1e-6:
            raise PluginError(f"Scorer {name!r} returned {s!r} for text {i}; scores must lie in [0, 1].")
    return [min(max(s, 0.0), 1.0) for s in scores]


def require_package(module: str, install: str, scorer: str) -> None:
    """Raise PluginError with the install command when an optional scorer dependency is missing."""
    if importlib.util.find_spec(module) is None:
        raise PluginError(f"Scorer {scorer!r} needs the optional package {module!r}. Install it with:\n    {install}")


def validate_scorer(scorer, name: str | None = None):
    """Check that an object honours the scorer contract (used on everything a plugin registers)."""
    label = name or getattr(scorer, "name", repr(scorer))
    for attr in ("name", "measures", "score"):
        if not hasattr(scorer, attr):
            raise PluginError(f"Scorer {label!r} has no {attr!r}; see steerkit.evaluation.scorers.base.Scorer.")
    if scorer.measures not in MEASURES:
        raise PluginError(f"Scorer {label!r} measures {scorer.measures!r}; expected one of {', '.join(MEASURES)}.")
    threshold = getattr(scorer, "threshold", 0.5)
    if not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise PluginError(f"Scorer {label!r} has threshold {threshold!r}; it must lie in [0, 1].")
    return scorer
