"""Steering terms: a reward with its signed weight β (and its schedule and transform), the checks on a set of
terms, and :func:`reweight`, the RAD step (:mod:`steerkit.engine.step`) on a batch that shares its terms, as
the transformers ``LogitsProcessor`` applies it.

``scores = z_topk + Σ_i β_i(t) · f_i(ρ_i)`` on the k most likely tokens, ``-inf`` on every other token.
The validators every surface shares live in :mod:`steerkit.validators`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from .errors import InvalidArgumentError, SteerkitWarning
from .limits import LARGE_K
from .rewards.base import Reward, RewardSession
from .validators import MAX_ABS_BETA, validate_beta, validate_int


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
        object.__setattr__(self, "beta", validate_beta(self.beta))
        object.__setattr__(self, "start", validate_beta(self.start, "beta_start"))
        try:
            object.__setattr__(self, "steps", validate_int("steps", self.steps))
        except InvalidArgumentError:
            raise InvalidArgumentError(
                f"A linear beta ramp needs steps >= 1 (an integer), got {self.steps!r}.") from None

    @property
    def max_abs(self) -> float:
        """The largest |β(t)| over all steps (a linear ramp lies between its ends)."""
        return max(abs(self.beta), abs(self.start)) if self.kind == "linear" else abs(self.beta)

    def at(self, step: int) -> float:
        if self.kind == "constant" or step >= self.steps:
            return self.beta
        return self.start + (self.beta - self.start) * step / max(self.steps, 1)


Transform = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class SteeringTerm:
    r"""One reward with its signed weight β: the step adds `β · f(ρ)` to each of the k candidates' logits.

    Args:
        reward (`Reward`):
            Anything with a `name` and `start(prefixes, lm_tokenizer) -> RewardSession`, whose session scores
            candidates of shape `(batch_size, k)` with rewards ρ in [0, 1] of the same shape (e.g.
            `steerkit.load_reward("toxicity")`, a `RewardModelScorer`, or a plugin's reward).
        beta (`float` or `BetaSchedule`):
            The signed weight (β < 0 steers away from the attribute); |β| at most 1e30 so float32 scores stay
            finite. A `BetaSchedule` ramps it over the first steps.
        transform (`Callable[[torch.Tensor], torch.Tensor]`, *optional*):
            Shapes ρ (shape `(batch_size, k)`) before weighting, e.g. `make_transform("invert")` for 1 − ρ.
        name (`str`, *optional*):
            Key of this term in traces and outputs (default: the reward's name); needed to use one reward twice.

    Examples:

    ```python
    >>> import torch
    >>> from steerkit import BetaSchedule, SteeringTerm
    >>> from steerkit.rewards.sequence.scorer import RewardModelScorer
    >>> from steerkit.steering import make_transform, reweight
    >>> from steerkit.testing import make_tokenizer, tiny_reward
    >>> tokenizer = make_tokenizer()
    >>> reward = RewardModelScorer(tiny_reward(tokenizer))
    >>> away = SteeringTerm(reward, -2.0, name="away")
    >>> ramp = SteeringTerm(reward, BetaSchedule(4.0, "linear", start=0.0, steps=4), make_transform("invert"), "ramp")
    >>> [ramp.weight(step) for step in range(5)]
    [0.0, 1.0, 2.0, 3.0, 4.0]
    >>> logits = torch.randn(2, len(tokenizer))
    >>> sessions = [t.reward.start(["", ""], tokenizer) for t in (away, ramp)]
    >>> step = reweight(logits, 3, [away, ramp], sessions, step=2)
    >>> rho = step.rewards["away"]  # [batch_size, k] = [2, 3]
    >>> bool(torch.allclose(step.combined, step.topk_logits - 2.0 * rho + 2.0 * (1 - rho)))
    True

    ```
    """

    reward: Reward
    beta: float | BetaSchedule
    transform: Transform | None = None
    name: str = ""

    def __post_init__(self):
        label = self.name or getattr(self.reward, "name", "?")
        if isinstance(self.beta, BetaSchedule):
            schedule = self.beta
        else:
            schedule = BetaSchedule(validate_beta(self.beta, f"beta for reward {label!r}"))
        self.schedule = schedule
        self.name = self.name or getattr(self.reward, "name", "reward")

    @property
    def is_sequence_reward(self) -> bool:
        """Rewards score whole sequences unless they declare ``kind = "token"`` (cheap per-candidate scores)."""
        return getattr(self.reward, "kind", "sequence") != "token"

    def weight(self, step: int) -> float:
        return self.schedule.at(step)

    @property
    def transform_key(self):
        """Terms with equal keys shape rewards alike (a batch shapes their rows together)."""
        return None if self.transform is None else getattr(self.transform, "key", id(self.transform))


@dataclass
class StepResult:
    scores: torch.Tensor  # [B, V]: reweighted top-k logits minus the row's best, -inf elsewhere
    topk_ids: torch.Tensor  # [B, k]
    topk_logits: torch.Tensor  # [B, k]
    rewards: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B, k]
    combined: torch.Tensor | None = None  # [B, k]


def check_terms(terms: list[SteeringTerm]) -> list[SteeringTerm]:
    """Term names key the per-step rewards and traces, so they must be distinct; Σ|β| must fit in float32."""
    seen: set[str] = set()
    for term in terms:
        if term.name in seen:
            raise InvalidArgumentError(
                f"Two steering terms are named {term.name!r}; give them distinct names (SteeringTerm(name=...), "
                "`label` in a config file) or combine their betas into one term."
            )
        seen.add(term.name)
    total = sum(term.schedule.max_abs for term in terms)
    if total > MAX_ABS_BETA:
        raise InvalidArgumentError(
            f"The betas of {', '.join(repr(t.name) for t in terms)} add up to |beta| = {total:g}; the sum of |beta| "
            f"over all rewards must be at most {MAX_ABS_BETA:g} so that the float32 scores stay finite.")
    return terms


def warn_if_slow(k: int, terms: list[SteeringTerm], stacklevel: int = 3) -> bool:
    """Warn (:class:`SteerkitWarning`) when k > :data:`LARGE_K` with a sequence reward; True when slow."""
    sequence = [t.name for t in terms if t.is_sequence_reward]
    if k <= LARGE_K or not sequence:
        return False
    warnings.warn(
        f"k={k} with the sequence reward(s) {', '.join(map(repr, sequence))}: every step scores k candidate "
        f"texts with each reward model, so decoding will be slow (steerkit's default is k=20; larger k rarely "
        f"changes the steered text). Use a smaller k (<= {LARGE_K}) or a token-level reward (kind = 'token').",
        SteerkitWarning, stacklevel=stacklevel)
    return True


def reweight(logits: torch.Tensor, k: int, terms: list[SteeringTerm], sessions: list[RewardSession],
             step: int) -> StepResult:
    """Apply RAD to next-token logits [B, V]: keep the top-k, add Σ β ρ, exclude everything else.

    The step's maths is :func:`steerkit.engine.step.score_step` on a batch whose rows share ``k`` and
    ``terms`` (``sessions[i]`` scores ``terms[i]``'s reward). Raises
    :class:`~steerkit.errors.NonFiniteRewardError` when a reward is NaN/±inf (also for a term with β = 0,
    whose rewards still go into traces) or when β·ρ overflows float32.
    """
    from .engine.step import raise_non_finite, score_step, shared_plan

    plan = shared_plan(k, terms, logits.shape[0])
    keyed = {id(t.reward): s for t, s in zip(terms, sessions)}
    out = score_step(logits, plan, lambda ids: {key: s.score(ids) for key, s in keyed.items()}, [step])
    rewards = {t.name: shaped for t, shaped in zip(terms, out.shaped)}
    if not bool(out.ok.all()):
        raise_non_finite(out.topk_ids, out.topk_logits, rewards, terms, step)
    return StepResult(out.scores, out.topk_ids, out.topk_logits, rewards, out.combined)


class _Shape:
    """A named reward transform; rows whose terms share a ``key`` are shaped together in a batch."""

    #: Never changes direction (none, invert and clamp rise or fall throughout), so ρ in [lo, hi] puts f(ρ) between
    #: f(lo) and f(hi) (:mod:`steerkit.engine.pruning`)
    monotone = True

    def __init__(self, key: tuple, fn: Transform):
        self.key, self._fn = key, fn

    def __call__(self, rho: torch.Tensor) -> torch.Tensor:
        return self._fn(rho)


def make_transform(kind: str, clamp: tuple[float, float] = (0.0, 1.0)) -> Transform | None:
    """Per-reward shaping: ``invert`` (1 − ρ), ``clamp`` (to [low, high]), or ``none``."""
    if kind == "none":
        return None
    if kind == "invert":
        return _Shape(("invert",), lambda rho: 1.0 - rho)
    if kind == "clamp":
        lo, hi = clamp
        return _Shape(("clamp", lo, hi), lambda rho: rho.clamp(lo, hi))
    raise InvalidArgumentError(f"Unknown reward transform {kind!r}; use none, invert or clamp.")
