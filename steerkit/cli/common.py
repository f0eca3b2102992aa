"""What the command modules share: the stderr console and the parsing of ``REF=BETA`` reward flags."""

from __future__ import annotations

import math

from rich.console import Console

from ..errors import InvalidArgumentError


class MessageConsole(Console):
    """A Rich console for steerkit's one-line messages (notes, progress summaries, "interrupted: …").

    * Never hard-wrapped (``soft_wrap``): Rich would otherwise break a message at the console width (80 columns
      when stderr is piped, or ``$COLUMNS``), so a log or a caller matching a message would depend on the
      terminal width and on the length of the paths in it. A terminal still folds a long line visually.
    * No markup, emoji codes or highlighting unless a call asks for it (``markup=True``, with
      :func:`rich.markup.escape` on what it interpolates): messages interpolate paths and commands, and Rich
      would take ``[abc]`` in ``/data/[abc]/out`` or ``steerkit[ray]`` for a style tag and drop it.
    """

    def __init__(self, **kwargs):
        kwargs.setdefault("soft_wrap", True)
        kwargs.setdefault("markup", False)
        kwargs.setdefault("emoji", False)
        kwargs.setdefault("highlight", False)
        super().__init__(**kwargs)


def message_console(*, stderr: bool = True) -> MessageConsole:
    """The console for user-facing messages (stderr unless asked): see :class:`MessageConsole`."""
    return MessageConsole(stderr=stderr)


err = message_console()


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
