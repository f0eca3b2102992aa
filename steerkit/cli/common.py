"""What the command modules share: the stderr console and the parsing of ``REF=BETA`` reward flags."""

from __future__ import annotations

import math

from rich.console import Console

from ..errors import InvalidArgumentError

err = Console(stderr=True)


def parse_reward_weight(spec: str) -> tuple[str, float]:
    """``NAME=BETA`` or ``PATH=BETA`` (the last '=' splits, so paths may contain '=')."""
    ref, sep, beta = spec.rpartition("=")
    if not sep or not ref:
        raise InvalidArgumentError(f"--reward expects REF=BETA (e.g. toxicity=-10), got {spec!r}.")
    try:
        value = float(beta)
    except ValueError:
        raise InvalidArgumentError(f"--reward {spec!r}: beta {beta!r} is not a number.") from None
    if not math.isfinite(value):
        raise InvalidArgumentError(f"--reward {spec!r}: beta must be finite.")
    return ref, value
