"""One RAD reweighting step, shared by :func:`steerkit.generate` and the ``LogitsProcessor``.

``scores = z_topk + Σ_i β_i(t) · f_i(ρ_i)`` on the k most likely tokens, ``-inf`` on every other token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from .errors import InvalidArgumentError
from .rewards.base import Reward, RewardSession


@dataclass(frozen=True)
class BetaSchedule:
    """β over decoding steps: ``constant`` (β), or ``linear`` ramp from ``start`` to β over ``steps`` steps."""

    beta: float
    kind: Literal["constant", "linear"] = "constant"
    start: float = 0.0
    steps: int = 1

    def __post_init__(self):
        if self.kind not in ("constant", "linear"):
            raise InvalidArgumentError(f"Unknown beta schedule kind {self.kind!r}; use 'constant' or 'linear'.")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise InvalidArgumentError(f"A linear beta ramp needs steps >= 1 (an integer), got {self.steps!r}.")

    def at(self, step: int) -> float:
        if self.kind == "constant" or step >= self.steps:
            return self.beta
        return self.start + (self.beta - self.start) * step / max(self.steps, 1)


Transform = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SteeringTerm:
    """One reward with its signed weight β (β < 0 steers away from the attribute)."""

    reward: Reward
    beta: float | BetaSchedule
    transform: Transform | None = None
    name: str = ""

    def __post_init__(self):
        schedule = self.beta if isinstance(self.beta, BetaSchedule) else BetaSchedule(float(self.beta))
        for value in (schedule.beta, schedule.start):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidArgumentError(
                    f"beta for reward {self.name or getattr(self.reward, 'name', '?')!r} must be a finite number, got {value!r}."
                )
        self.schedule = schedule
        self.name = self.name or getattr(self.reward, "name", "reward")

    def weight(self, step: int) -> float:
        return self.schedule.at(step)


@dataclass
class StepResult:
    scores: torch.Tensor  # [B, V]: reweighted top-k logits, -inf elsewhere
    topk_ids: torch.Tensor  # [B, k]
    topk_logits: torch.Tensor  # [B, k]
    rewards: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B, k]
    combined: torch.Tensor | None = None  # [B, k]


def check_terms(terms: list[SteeringTerm]) -> list[SteeringTerm]:
    """Term names key the per-step rewards and traces, so they must be distinct."""
    seen: set[str] = set()
    for term in terms:
        if term.name in seen:
            raise InvalidArgumentError(
                f"Two steering terms are named {term.name!r}; give them distinct names (SteeringTerm(name=...), "
                "`label` in a config file) or combine their betas into one term."
            )
        seen.add(term.name)
    return terms


def validate_k(k: int, vocab_size: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab_size:
        raise InvalidArgumentError(f"k must be an integer in [1, {vocab_size}] (the LM's vocabulary size), got {k!r}.")
    return k


def reweight(logits: torch.Tensor, k: int, terms: list[SteeringTerm], sessions: list[RewardSession],
             step: int) -> StepResult:
    """Apply RAD to next-token logits [B, V]: keep the top-k, add Σ β ρ, exclude everything else."""
    topk_logits, topk_ids = logits.float().topk(k, dim=-1)
    combined = topk_logits.clone()
    rewards = {}
    for term, session in zip(terms, sessions):
        rho = session.score(topk_ids).to(combined.device, combined.dtype)
        if term.transform is not None:
            rho = term.transform(rho)
        rewards[term.name] = rho
        beta = term.weight(step)
        if beta:
            combined = combined + beta * rho
    scores = torch.full_like(logits, float("-inf"), dtype=torch.float32).scatter_(1, topk_ids, combined)
    return StepResult(scores, topk_ids, topk_logits, rewards, combined)


def make_transform(kind: str, clamp: tuple[float, float] = (0.0, 1.0)) -> Transform | None:
    """Per-reward shaping: ``invert`` (1 − ρ), ``clamp`` (to [low, high]), or ``none``."""
    if kind == "none":
        return None
    if kind == "invert":
        return lambda rho: 1.0 - rho
    if kind == "clamp":
        lo, hi = clamp
        return lambda rho: rho.clamp(lo, hi)
    raise InvalidArgumentError(f"Unknown reward transform {kind!r}; use none, invert or clamp.")
