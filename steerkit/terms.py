"""Steering terms from what users write: the one place a reward reference (or a config's reward spec)
becomes a :class:`~steerkit.steering.SteeringTerm`.

:func:`build_term` builds one term: it loads a reference through
:func:`steerkit.rewards.loading.load_reward` (or takes a ready :class:`~steerkit.rewards.base.Reward`), and
applies the β schedule, the transform and the label that names the term in traces and outputs.
:func:`term_from_spec` / :func:`terms_from_specs` read a config's ``RewardSpec`` (``SteeringConfig``,
``steerkit eval`` settings); :func:`build_terms` reads ``generate(rewards=...)``'s mapping / pairs / terms.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from .errors import InvalidArgumentError
from .rewards.backends import DEFAULT_BACKEND
from .steering import BetaSchedule, SteeringTerm, check_unicode, make_transform, validate_beta

#: ``load(reference, backend=..., context=...) -> Reward``; :func:`~steerkit.rewards.loading.load_reward` by default.
Loader = Callable[..., object]


def build_term(reward, beta, *, label: str | None = None, transform: str = "none",
               clamp: tuple[float, float] = (0.0, 1.0), context: str = "continuation",
               backend: str = DEFAULT_BACKEND, load: Loader | None = None) -> SteeringTerm:
    """One steering term.

    ``reward`` is a reference (registered name, ``PLUGIN:NAME``, directory), loaded with ``load`` for
    ``backend`` and ``context``, or a ready reward object. ``beta`` is a number or a
    :class:`~steerkit.steering.BetaSchedule`. The term is named ``label``, else the reference, else the
    reward's own name: two terms of one reward need distinct labels.
    """
    if isinstance(reward, str):
        if load is None:
            from .rewards.loading import load_reward as load
        name = label or reward
        reward = load(reward, backend=backend, context=context)
    else:
        name = label or ""
    return SteeringTerm(reward, beta, make_transform(transform, clamp), name=name)


def term_from_spec(spec, *, backend: str = DEFAULT_BACKEND, load: Loader | None = None) -> SteeringTerm:
    """The term of a :class:`~steerkit.config.RewardSpec` (name, label, β and its schedule, transform, context)."""
    schedule = BetaSchedule(spec.beta, spec.schedule, spec.beta_start, spec.ramp_steps)
    return build_term(spec.name, schedule, label=spec.label, transform=spec.transform, clamp=spec.clamp,
                      context=spec.context, backend=backend, load=load)


def terms_from_specs(specs: Sequence, *, backend: str = DEFAULT_BACKEND,
                     load: Loader | None = None) -> list[SteeringTerm]:
    return [term_from_spec(spec, backend=backend, load=load) for spec in specs]


def build_terms(rewards: Mapping | Sequence | None, *, backend: str = DEFAULT_BACKEND) -> list[SteeringTerm]:
    """Normalise ``{"toxicity": -10, "path/to/rm": 5}`` / ``[SteeringTerm, ...]`` / ``[(reward, beta)]``.

    Every beta is checked before any reward model is loaded; each pair becomes a term through :func:`build_term`.
    """
    forms = ("rewards must be a mapping of reward references to beta ({'toxicity': -10, 'path/to/rm': 5}), or a "
             "list of SteeringTerm objects or (reference, beta) pairs ([('toxicity', -10)])")
    if rewards is None:
        return []
    if isinstance(rewards, Mapping):
        items = list(rewards.items())
    elif isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence):
        raise InvalidArgumentError(f"{forms}; got {type(rewards).__name__} {rewards!r}.")
    else:
        items = list(rewards)
    pairs: list = []  # SteeringTerms and checked (reference, beta) pairs; nothing is loaded until all are checked
    for i, item in enumerate(items):
        if isinstance(item, SteeringTerm):
            pairs.append(item)
            continue
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise InvalidArgumentError(f"{forms}; item {i} is {item!r}.")
        ref, beta = item
        if isinstance(ref, str):
            if not ref:
                raise InvalidArgumentError(f"Reward {i} has an empty reference; name a registered reward or a directory.")
            check_unicode(ref, f"Reward reference {i}")
        elif not callable(getattr(ref, "start", None)):
            raise InvalidArgumentError(f"Reward {i} ({ref!r}) is neither a reward reference (a registered name or a "
                                       "reward-model directory) nor a Reward object with a start() method.")
        if not isinstance(beta, BetaSchedule):
            validate_beta(beta, f"beta for reward {ref if isinstance(ref, str) else getattr(ref, 'name', '?')!r}")
        pairs.append((ref, beta))
    return [item if isinstance(item, SteeringTerm) else build_term(*item, backend=backend) for item in pairs]
