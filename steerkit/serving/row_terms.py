"""A row's steering terms from what a request wrote (``RowSpec.rewards``), over the rewards an engine serves.

Every form goes through :class:`~steerkit.config.RewardSpec` and :func:`steerkit.terms.build_term`, so a
request's β schedule, transform, clamp and label mean exactly what they mean in a steering config. A name is
looked up among the engine's rewards (never loaded from disk on request), as the server serves it; only a spec
that states a ``context`` other than the served reward's gets a sibling scorer for that context.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from ..errors import InvalidArgumentError
from ..steering import BetaSchedule, SteeringTerm, check_terms, check_unicode, validate_beta

FORMS = ("rewards must be a mapping of reward names to beta ({'toxicity': -10}), or a list of reward specs "
         "({'name': 'toxicity', 'beta': -10, 'label': ..., 'transform': ..., 'schedule': ...}) or (name, beta) pairs")


class RewardLookup:
    """The engine's rewards by name (for :func:`row_terms`): the reward
    of that name, or a sibling scorer over the same model for the other context (built once, then reused so
    that rows asking for it share one reward session)."""

    def __init__(self, rewards: Mapping[str, object]):
        self.rewards = dict(rewards)
        self._siblings: dict[tuple[str, str], object] = {}

    def names(self) -> list[str]:
        return sorted(self.rewards)

    def __call__(self, name: str, context: str | None = None):
        """The reward served as ``name``; ``context`` (None: as served) asks for that scoring context."""
        reward = self.rewards.get(name)
        if reward is None:
            available = ", ".join(repr(n) for n in self.names()) or "none"
            raise InvalidArgumentError(f"Unknown reward {name!r}; this server serves: {available}.")
        have = getattr(reward, "context", None)
        if context is None or have is None or have == context:
            return reward
        key = (name, context)
        if key not in self._siblings:
            from ..rewards.scorer import RewardModelScorer

            if not isinstance(reward, RewardModelScorer):
                raise InvalidArgumentError(f"Reward {name!r} scores context {have!r} here; it cannot be asked for "
                                           f"context {context!r}. Leave 'context' out.")
            self._siblings[key] = RewardModelScorer(reward.model, reward.name, backend=reward.backend, context=context)
        return self._siblings[key]


def _specs(rewards) -> list:
    """``RowSpec.rewards`` as a list of RewardSpec objects (β checked with steerkit's messages)."""
    from pydantic import ValidationError

    from ..config import RewardSpec, format_validation_error

    if isinstance(rewards, Mapping):
        items = list(rewards.items())
    elif isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence):
        raise InvalidArgumentError(f"{FORMS}; got {type(rewards).__name__} {rewards!r:.80}.")
    else:
        items = list(rewards)
    specs = []
    for i, item in enumerate(items):
        if isinstance(item, RewardSpec):
            specs.append(item)
            continue
        if isinstance(item, Mapping):
            data = dict(item)
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            data = {"name": item[0], "beta": item[1]}
        else:
            raise InvalidArgumentError(f"{FORMS}; item {i} is {item!r:.80}.")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"Reward {i} needs a non-empty name (a reward this server serves), "
                                       f"got {name!r}.")
        check_unicode(name, f"Reward name {i}")
        if "beta" not in data:
            raise InvalidArgumentError(f"Reward {name!r} needs a beta (a number; < 0 steers away).")
        validate_beta(data["beta"], f"beta for reward {name!r}")
        try:
            specs.append(RewardSpec.model_validate(data))
        except ValidationError as exc:
            raise InvalidArgumentError(format_validation_error(exc, f"reward spec {i} ({name!r})")) from None
    return specs


def row_terms(rewards, lookup: Callable) -> list[SteeringTerm]:
    """The steering terms of ``rewards`` (a RowSpec's or the engine's default), checked like any steerkit terms:
    known names, finite β within bounds, distinct labels, Σ|β| within float32."""
    from ..terms import build_term

    if rewards is None:
        return []
    terms = []
    for spec in _specs(rewards):
        context = spec.context if "context" in spec.model_fields_set else None
        schedule = BetaSchedule(spec.beta, spec.schedule, spec.beta_start, spec.ramp_steps)
        terms.append(build_term(lookup(spec.name, context), schedule, label=spec.label or spec.name,
                                transform=spec.transform, clamp=spec.clamp))
    return check_terms(terms)


def describe(terms: list[SteeringTerm]) -> dict[str, float | BetaSchedule]:
    """``{name: beta}`` of a row's terms (for stats and logs)."""
    return {t.name: t.schedule.beta for t in terms}
