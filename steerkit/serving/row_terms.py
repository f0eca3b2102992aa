"""A row's steering terms from what a request wrote (``RowSpec.rewards``), over the rewards an engine serves.

Every form goes through :func:`steerkit.params.parse_rewards` and :func:`~steerkit.params.resolve_terms`, so a
request's β schedule, transform, clamp and label mean exactly what they mean in a steering config. A name is
looked up among the engine's rewards (never loaded from disk on request), as the server serves it; only a spec
that states a ``context`` other than the served reward's gets a sibling scorer for that context.
"""

from __future__ import annotations

import difflib
from typing import Callable, Mapping

from ..errors import InvalidArgumentError, UnknownRewardError
from ..steering import SteeringTerm


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
            qualified = [n for n in self.names() if isinstance(name, str) and ":" not in name
                         and n.rpartition(":")[2] == name and ":" in n]
            if qualified:  # a name several plugins register: served only as PLUGIN:NAME (serving/loading.py)
                raise UnknownRewardError(
                    f"reward {name!r} is registered by {len(qualified)} plugins, so this server does not serve the "
                    f"bare name; name one of: {', '.join(repr(n) for n in qualified)} (or start the server with "
                    f"--prefer {name}=PLUGIN).")
            available = ", ".join(repr(n) for n in self.names()) or "none"
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownRewardError(f"unknown reward {name!r}; this server serves: {available} (GET /v1/models)."
                                     f"{hint}")
        have = getattr(reward, "context", None)
        if context is None or have is None or have == context:
            return reward
        key = (name, context)
        if key not in self._siblings:
            from ..rewards.sequence.scorer import RewardModelScorer

            if not isinstance(reward, RewardModelScorer):
                raise InvalidArgumentError(f"Reward {name!r} scores context {have!r} here; it cannot be asked for "
                                           f"context {context!r}. Leave 'context' out.")
            self._siblings[key] = RewardModelScorer(reward.model, reward.name, backend=reward.backend, context=context)
        return self._siblings[key]


def row_terms(rewards, lookup: Callable) -> list[SteeringTerm]:
    """The steering terms of ``rewards`` (a RowSpec's or the engine's default, in any form
    :func:`steerkit.params.parse_rewards` reads), over the rewards ``lookup`` serves."""
    from ..params import parse_rewards, resolve_terms

    return resolve_terms(parse_rewards(rewards), lookup)
