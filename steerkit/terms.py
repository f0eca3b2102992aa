"""Steering terms from what users write: the one place a reward reference (or a config's reward spec)
becomes a :class:`~steerkit.steering.SteeringTerm`.

:func:`build_term` builds one term: it loads a reference through
:func:`steerkit.rewards.loading.load_reward` (or takes a ready :class:`~steerkit.rewards.base.Reward`), and
applies the β schedule, the transform and the label that names the term in traces and outputs.
:func:`terms_from_specs` reads a config's ``RewardSpec`` list (``SteeringConfig``, ``steerkit eval``
settings) and :func:`build_terms` ``generate(rewards=...)``'s mapping / pairs / terms, both through the one
rewards parser (:mod:`steerkit.params`); :func:`reference_loader` finds a reference in the registry or on disk.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .rewards.backends import DEFAULT_BACKEND
from .steering import SteeringTerm
from .validators import check_unicode

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
    from .params import make_term

    if isinstance(reward, str):
        name = label or reward
        reward = reference_loader(backend, load)(reward, context)
    else:
        name = label or ""
    return make_term(reward, beta, name, transform, clamp)


def terms_from_specs(specs: Sequence, *, backend: str = DEFAULT_BACKEND,
                     load: Loader | None = None) -> list[SteeringTerm]:
    """The terms of a config's :class:`~steerkit.params.RewardSpec` list (name, label, β and its schedule,
    transform, context), through the one rewards parser."""
    from .params import resolve_terms

    return resolve_terms(list(specs), reference_loader(backend, load))


def build_terms(rewards, *, backend: str = DEFAULT_BACKEND) -> list[SteeringTerm]:
    """Steering terms from ``generate(rewards=...)``: ``{"toxicity": -10, "path/to/rm": 5}``,
    ``[SteeringTerm, ...]``, ``[(reward, beta)]`` or reward specs (:func:`steerkit.params.parse_rewards`, the
    one parser of rewards input). Every beta is checked before any reward model is loaded."""
    from .params import parse_rewards, resolve_terms

    return resolve_terms(parse_rewards(rewards), reference_loader(backend))


def reference_loader(backend: str = DEFAULT_BACKEND, load: Loader | None = None):
    """``load(reference, context)`` for :func:`steerkit.params.resolve_terms`: the reward registry and
    reward-model directories (``context`` None: continuation)."""
    if load is None:
        from .rewards.loading import load_reward as load

    def loader(reference: str, context: str | None = None):
        check_unicode(reference, "Reward reference")
        return load(reference, backend=backend, context=context or "continuation")

    return loader
