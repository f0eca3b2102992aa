"""``steerkit calibrate``: how far each β moves a reward, and what it costs in fluency, on a handful of prompts.

For every β of a grid (β = 0, the baseline, is always run) the same prompts are continued with the same seed, so
the β values share their random numbers, by steered generation set up through :mod:`steerkit.assembly`. Then:

* the mean reward of the continuations: each scored from scratch by the reward model itself (``score_texts``, as
  ``steerkit score`` does; a reward steers on the continuation, so the continuation is what is scored). Empty
  continuations have no reward and are left out;
* the perplexity of each continuation given its prompt under the *unsteered* LM that generated it
  (:class:`~.fluency.PerplexityScorer`, ``steerkit eval``'s fluency measure), as a median and a mean;
* Dist-2 (:func:`~.metrics.distinct_n`), which falls when steering forces repetition.

:func:`recommend` reads a range of β off that table by :data:`RULE`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from ..errors import InvalidArgumentError, NonFiniteRewardError
from ..models import DEFAULT_LM
from ..rewards.backends import DEFAULT_BACKEND
from ..validators import validate_beta, validate_int, validate_prompts, validate_seed
from .metrics import distinct_n, median_perplexity, nanmean

DEFAULT_BETAS = (-40.0, -20.0, -10.0, -5.0, 0.0, 5.0, 10.0, 20.0, 40.0)
DEFAULT_MAX_PERPLEXITY_RATIO = 1.5
#: Short, attribute-neutral openings (no toxicity or sentiment of their own), so that either sign of β has room.
DEFAULT_PROMPTS = (
    "The weather this morning was",
    "My neighbour told me that",
    "I think the new library",
    "Yesterday at the station,",
    "The meeting on Monday",
)

RULE = ("For each sign of β, going out from β = 0: the usable β are those before the first whose median perplexity "
        "exceeds {ratio:g}× the median perplexity at β = 0. The recommended range starts at the smallest usable |β| "
        "whose shift of the mean reward from β = 0 (up for β > 0, down for β < 0) is at least half the largest "
        "shift among the usable β, and ends at the largest usable |β|. Nothing is recommended for a sign whose "
        "largest shift is within two standard errors of the difference from β = 0 (it could be sampling noise).")


def parse_betas(text: str) -> list[float]:
    """``"-20,-5,0,5,20"`` as numbers, checked by :func:`check_betas`."""
    values = []
    for item in (part.strip() for part in str(text).split(",")):
        if not item:
            continue
        try:
            values.append(float(item))
        except ValueError:
            raise InvalidArgumentError(f"--betas: {item!r} is not a number; give comma-separated numbers such "
                                       "as -20,-5,0,5,20.") from None
    return check_betas(values)


def check_betas(betas: Sequence) -> list[float]:
    """The grid sorted, without repeats, with β = 0 added: every β finite and within steerkit's bound."""
    if isinstance(betas, (str, bytes)) or not isinstance(betas, Sequence):
        raise InvalidArgumentError(f"betas must be a list of numbers, got {type(betas).__name__}.")
    if not betas:
        raise InvalidArgumentError("No β values to calibrate: give at least one, e.g. -20,-5,5,20.")
    checked = {validate_beta(b, f"beta {b!r}") for b in betas}
    return sorted(checked | {0.0})


def check_ratio(ratio) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 1:
        raise InvalidArgumentError(f"max_perplexity_ratio must be a finite number >= 1 (1.5: perplexity may rise "
                                   f"by half over β = 0's), got {ratio!r}.")
    return float(ratio)


def check_prompts(prompts: Sequence[str] | None) -> list[str]:
    """The prompts as ``generate`` checks them (:func:`steerkit.validators.validate_prompts`); None: the built-in set."""
    return validate_prompts(DEFAULT_PROMPTS if prompts is None else prompts)


def _number(value) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


@dataclass(frozen=True)
class Recommendation:
    """A range of β of one sign (``low`` closest to 0), or none (``low`` and ``high`` None), and why."""

    sign: int  # +1: β > 0 (toward high ρ), -1: β < 0 (toward low ρ)
    low: float | None
    high: float | None
    largest_shift: float | None  # of the mean reward from β = 0, in the sign's direction
    reason: str

    def to_dict(self) -> dict:
        return {"sign": "positive" if self.sign > 0 else "negative", "low": self.low, "high": self.high,
                "largest_shift": self.largest_shift, "reason": self.reason}


def recommend(rows: Sequence[Mapping], max_perplexity_ratio: float = DEFAULT_MAX_PERPLEXITY_RATIO
              ) -> list[Recommendation]:
    """:data:`RULE` applied to a table of rows (``beta``, ``mean_reward``, ``median_perplexity``, optionally
    ``reward_se``, the standard error of the mean reward; missing values None or NaN): the range for β > 0, then
    for β < 0."""
    ratio = check_ratio(max_perplexity_ratio)
    by_beta = {float(row["beta"]): row for row in rows}
    if 0.0 not in by_beta:
        raise InvalidArgumentError("The table has no β = 0 row, the baseline the rule compares with.")
    r0, p0 = _number(by_beta[0.0]["mean_reward"]), _number(by_beta[0.0]["median_perplexity"])
    if r0 is None or p0 is None:
        reason = ("none: the β = 0 continuations have no reward or no perplexity (all empty?), so there is no "
                  "baseline; use more tokens or other prompts.")
        return [Recommendation(sign, None, None, None, reason) for sign in (1, -1)]
    return [_recommend_sign(sign, by_beta, r0, p0, ratio) for sign in (1, -1)]


def _recommend_sign(sign: int, by_beta: Mapping[float, Mapping], r0: float, p0: float,
                    ratio: float) -> Recommendation:
    word, way = ("β > 0", "up") if sign > 0 else ("β < 0", "down")
    betas = sorted((b for b in by_beta if b * sign > 0), key=abs)
    if not betas:
        return Recommendation(sign, None, None, None, f"none: the grid has no {word}.")
    limit = ratio * p0
    usable: list[tuple[float, float]] = []  # (β, shift of the mean reward in the sign's direction)
    for beta in betas:
        reward, perplexity = _number(by_beta[beta]["mean_reward"]), _number(by_beta[beta]["median_perplexity"])
        if reward is None or perplexity is None or perplexity > limit:
            break
        usable.append((beta, sign * (reward - r0)))
    if not usable:
        return Recommendation(sign, None, None, None, (
            f"none: already at β = {betas[0]:g} the median perplexity is above {ratio:g}× that of β = 0 "
            f"({limit:.4g}) or could not be measured; try β closer to 0."))
    best, largest = max(usable, key=lambda item: item[1])
    if largest <= 0:
        return Recommendation(sign, None, None, None, (
            f"none: no {word} within the perplexity limit moved the mean reward {way} from β = 0's "
            f"{r0:.3f}; this reward may not separate the LM's candidates on these prompts."))
    noise = 2 * math.hypot(_number(by_beta[0.0].get("reward_se")) or 0.0,
                           _number(by_beta[best].get("reward_se")) or 0.0)
    if largest <= noise:
        return Recommendation(sign, None, None, largest, (
            f"none: the largest shift within the perplexity limit ({largest:.3f}, at β = {best:g}) is within two "
            f"standard errors ({noise:.3f}): it could be sampling noise; raise --samples or use more prompts."))
    low = next(beta for beta, shift in usable if shift >= largest / 2)
    high = usable[-1][0]
    return Recommendation(sign, low, high, largest, (
        f"β = {low:g} moves the mean reward {way} by at least half of the largest shift within the perplexity "
        f"limit ({largest:.3f}); β = {high:g} is the largest tested whose median perplexity stays within "
        f"{ratio:g}× that of β = 0."))


@dataclass
class BetaResult:
    """One β's continuations (prompt-major, ``samples`` per prompt) and what was measured on them."""

    beta: float
    prompts: list[str]
    continuations: list[str]
    rewards: list[float | None]  # None: an empty continuation (nothing to score)
    perplexities: list[float]  # NaN: an empty continuation
    distinct_2: float

    @property
    def mean_reward(self) -> float:
        return nanmean(self.rewards)

    @property
    def reward_se(self) -> float:
        """The standard error of :attr:`mean_reward` (NaN with fewer than two scored continuations)."""
        kept = [r for r in self.rewards if r is not None]
        if len(kept) < 2:
            return float("nan")
        mean = sum(kept) / len(kept)
        return math.sqrt(sum((r - mean) ** 2 for r in kept) / (len(kept) - 1) / len(kept))

    @property
    def median_perplexity(self) -> float:
        return median_perplexity(self.perplexities)

    @property
    def mean_perplexity(self) -> float:
        return nanmean(self.perplexities)

    def row(self) -> dict:
        return {"beta": self.beta, "mean_reward": self.mean_reward, "reward_se": self.reward_se,
                "median_perplexity": self.median_perplexity,
                "mean_perplexity": self.mean_perplexity, "distinct_2": self.distinct_2,
                "continuations": len(self.continuations), "scored": sum(r is not None for r in self.rewards)}


@dataclass
class Calibration:
    """A calibration run: its settings, one :class:`BetaResult` per β (ascending) and the recommendations."""

    reward: str
    lm: str
    k: int
    max_new_tokens: int
    samples: int
    seed: int | None
    max_perplexity_ratio: float
    results: list[BetaResult]
    recommendations: list[Recommendation] = field(default_factory=list)

    @property
    def rule(self) -> str:
        return RULE.format(ratio=self.max_perplexity_ratio)

    def rows(self) -> list[dict]:
        """The table: each β's measures, its reward shift and perplexity ratio against β = 0."""
        rows = [result.row() for result in self.results]
        base = next(row for row in rows if row["beta"] == 0.0)
        for row in rows:
            row["reward_shift"] = row["mean_reward"] - base["mean_reward"]
            row["perplexity_ratio"] = row["median_perplexity"] / base["median_perplexity"] \
                if _number(base["median_perplexity"]) else float("nan")
        return rows

    def to_dict(self) -> dict:
        """JSON-ready (NaN as null), with every continuation, its reward and its perplexity."""
        generations = {f"{r.beta:g}": [{"prompt": p, "text": t, "reward": rw, "perplexity": pp}
                                       for p, t, rw, pp in zip(r.prompts, r.continuations, r.rewards, r.perplexities)]
                       for r in self.results}
        payload = {"reward": self.reward, "lm": self.lm, "k": self.k, "max_new_tokens": self.max_new_tokens,
                   "samples": self.samples, "seed": self.seed, "max_perplexity_ratio": self.max_perplexity_ratio,
                   "prompts": self.results[0].prompts[::self.samples] if self.results else [], "rule": self.rule,
                   "rows": self.rows(), "recommendations": [r.to_dict() for r in self.recommendations],
                   "generations": generations}
        return _json_ready(payload)


def _json_ready(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_ready(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


def scoring_model(reward, reference: str):
    """The reward model behind a loaded reward (what ``score_texts`` the continuations); a reward without one
    cannot be calibrated this way."""
    model = getattr(reward, "model", None)
    if not callable(getattr(model, "score_texts", None)):
        raise InvalidArgumentError(
            f"Reward {reference!r} is not a reward model (it is a {type(reward).__name__}): `steerkit calibrate` "
            "scores the continuations with the reward model itself, so it calibrates trained reward models only.")
    return model


def score_continuations(model, texts: Sequence[str], reference: str = "reward") -> list[float | None]:
    """Each text's reward from scratch (``model.score_texts``); None for an empty text."""
    todo = [i for i, text in enumerate(texts) if text]
    out: list[float | None] = [None] * len(texts)
    for i, value in zip(todo, model.score_texts([texts[i] for i in todo]) if todo else []):
        if not math.isfinite(value):
            raise NonFiniteRewardError(f"Reward {reference!r} returned NaN or infinity for a continuation: its "
                                       "weights are corrupt or it overflowed; retrain or re-export it.")
        out[i] = float(value)
    return out


def calibrate(reward: str, *, lm=DEFAULT_LM, betas: Sequence = DEFAULT_BETAS,
              prompts: Sequence[str] | None = None, k: int = 20, max_new_tokens: int = 20, samples: int = 2,
              seed: int | None = 0, max_perplexity_ratio: float = DEFAULT_MAX_PERPLEXITY_RATIO,
              backend: str = DEFAULT_BACKEND, device: str | None = None,
              on_beta: Callable[[float, int, int], None] | None = None) -> Calibration:
    """Steer ``prompts`` (None: :data:`DEFAULT_PROMPTS`) with ``reward`` (a registered name or reward-model
    directory) at every β of ``betas`` plus 0, ``samples`` continuations each, and measure them (see the module
    docstring). ``lm`` is a model reference or a ``(model, tokenizer)`` pair; ``on_beta(β, i, n)`` is called
    before each β is generated."""
    from ..assembly import assemble
    from ..rewards.loading import load_reward
    from .fluency import PerplexityScorer

    betas, prompts = check_betas(betas), check_prompts(prompts)
    ratio, seed = check_ratio(max_perplexity_ratio), validate_seed(seed)
    samples = validate_int("samples", samples)
    loaded = load_reward(reward, backend=backend)
    model = scoring_model(loaded, reward)
    parts, outputs = lm, []
    for i, beta in enumerate(betas):
        if on_beta is not None:
            on_beta(beta, i, len(betas))
        assembled = assemble(parts, [(loaded, beta)], k=k, device=device)
        parts = (assembled.model, assembled.tokenizer)  # loaded once, reused for every β and for perplexity
        outputs.append(assembled.generate(prompts, max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                          seed=seed, do_sample=True))
    perplexity = PerplexityScorer(parts)
    results = []
    for beta, out in zip(betas, outputs):
        texts = list(out.texts)
        by_prompt = [texts[j * samples:(j + 1) * samples] for j in range(len(prompts))]
        results.append(BetaResult(beta, list(out.prompts), texts, score_continuations(model, texts, reward),
                                  perplexity.perplexities(out.prompts, texts), distinct_n(by_prompt, 2)))
    name = getattr(parts[0].config, "_name_or_path", "") or "<in-memory>" if isinstance(lm, tuple) else lm
    calibration = Calibration(reward, str(name), k, max_new_tokens, samples, seed, ratio, results)
    calibration.recommendations = recommend(calibration.rows(), ratio)
    return calibration
