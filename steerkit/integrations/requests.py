"""A request's steering as another engine hands it over: vLLM's ``SamplingParams.extra_args`` (``vllm_xargs``
over HTTP), a plain mapping with steerkit's request fields.

- ``rewards``: any form :func:`steerkit.params.parse_rewards` reads, ``"name=β"`` strings included (vLLM's
  ``vllm_xargs`` carries only strings, numbers and lists of them: ``["toxicity=-20", "sentiment=5"]``); absent,
  ``None``, ``{}`` or ``[]``: the request is not steered;
- ``k``: candidates reweighted per step (default 20, steerkit's); it needs ``rewards``.

Parsing and checking are :meth:`steerkit.params.SteerParams.create` and :func:`~steerkit.params.resolve_terms`;
rewards are found by :func:`~steerkit.rewards.loading.load_reward` (registered names, ``PLUGIN:NAME``, reward-model
directories, ONNX exports; backend ``auto``, or ``$STEERKIT_VLLM_BACKEND``), each loaded once per process (:data:`REWARDS`) so that every
request naming it shares one reward object, and so one reward session over its rows.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Mapping

from ..errors import InvalidArgumentError, SteerkitError
from ..rewards.base import reads_lm_state

#: The request fields read here (other keys belong to other processors and are left alone).
KEYS = ("rewards", "k")
DEFAULT_K = 20


@dataclass(frozen=True)
class Steering:
    """One request's validated steering: its terms (in order) and k."""

    terms: tuple
    k: int


class RewardCache:
    """``load(reference, context)`` for :func:`~steerkit.params.resolve_terms`: each reward loaded once per
    process and then shared (a lock: vLLM validates on the API server's thread and steers on the engine's)."""

    def __init__(self, backend: str = "auto"):
        self.backend = backend
        self._rewards: dict = {}
        self._lock = threading.Lock()

    def __call__(self, reference: str, context: str | None = None):
        from ..terms import reference_loader

        key = (reference, context or "continuation")
        with self._lock:
            if key not in self._rewards:
                self._rewards[key] = reference_loader(self.backend)(reference, context)
            return self._rewards[key]


#: The process's rewards; ``STEERKIT_VLLM_BACKEND`` (default ``auto``) runs registered rewards on another backend
#: (``onnx``: exported once, cached, then run by onnxruntime).
REWARDS = RewardCache(os.environ.get("STEERKIT_VLLM_BACKEND", "auto"))

#: Parsed steering by its arguments (JSON), so that requests asking for the same steering share their terms.
_PARSED: dict[str, Steering | None] = {}
_PARSED_MAX = 512


def asks_for_steering(args: Mapping | None) -> bool:
    """Whether a request names any steering field (then :func:`parse_steering` must accept it)."""
    return bool(args) and any(key in args for key in KEYS)


def parse_steering(args: Mapping | None, *, vocab_size: int | None = None, load=REWARDS) -> Steering | None:
    """The steering of a request's arguments, or None (not steered). Raises a
    :class:`~steerkit.errors.SteerkitError` whose :func:`error_field` names the bad field (``rewards.toxicity``, ``k``)."""
    if not asks_for_steering(args):
        return None
    try:
        key = json.dumps([args.get("rewards"), args.get("k"), vocab_size], sort_keys=True)
    except (TypeError, ValueError):
        key = None  # objects (a SteeringTerm, a Reward) in an offline request: parsed each time
    if key is not None and key in _PARSED and load is REWARDS:
        return _PARSED[key]
    steering = _parse(args, vocab_size, load)
    if key is not None and load is REWARDS:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = steering
    return steering


def _parse(args: Mapping, vocab_size: int | None, load) -> Steering | None:
    from ..params import SteerParams, resolve_terms, tag_param

    params = SteerParams.create(k=args.get("k"), rewards=args.get("rewards"), vocab_size=vocab_size, strings=True)
    try:
        terms = resolve_terms(list(params.rewards or ()), load)
    except SteerkitError as exc:
        if getattr(exc, "path", None) is None and getattr(exc, "param", None) is None:
            tag_param(exc, "rewards")
        raise
    for term in terms:  # a host engine (vLLM) hands rewards no LM state: refused here, naming the field
        if reads_lm_state(term.reward):
            from ..rewards.token.lm_state import no_state_error

            raise tag_param(no_state_error(term.name), f"rewards.{term.name}")
    if not terms:
        if params.k is not None:
            raise tag_param(InvalidArgumentError(
                "k is the number of candidates steering reweights; it needs rewards (for plain top-k sampling use "
                "the engine's own top_k)."), "k")
        return None
    return Steering(tuple(terms), params.k if params.k is not None else DEFAULT_K)


def error_field(exc: BaseException) -> str:
    """The request field an error from :func:`parse_steering` blames (``rewards.toxicity``, ``rewards.0``, ``k``)."""
    return getattr(exc, "path", None) or getattr(exc, "param", None) or "rewards"
