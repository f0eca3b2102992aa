"""torch's CPU thread count: one default, chosen to be fast *and* predictable, set in one place.

torch starts one intra-op thread per core. On a small machine that is unstable: with 2 threads on 2
cores, any other busy process makes OpenMP's spin-waiting threads stall each other, and the same
``steerkit generate`` measured 1.3-1.6 tok/s on some runs and 13-15 on others; with 1 thread it was
steady. So the default is:

* ``$STEERKIT_THREADS`` when set (a positive integer);
* 1 thread on machines with at most 2 usable cores;
* otherwise the cores that are free now (usable cores minus the 1-minute load average, rounded),
  at least 1, leaving one core for the rest of the system.

Every command that runs models takes ``--threads N`` to override it.
"""

from __future__ import annotations

import os
import sys

from .errors import InvalidArgumentError

ENV = "STEERKIT_THREADS"
HELP = ("torch CPU threads. Default: $STEERKIT_THREADS, else 1 on machines with <= 2 cores (more threads "
        "stall each other under load), else the free cores (cores minus the load average, minus one).")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """The thread count steerkit uses when none is given (see the module docstring)."""
    if os.environ.get(ENV):
        return check_threads(os.environ[ENV], source=f"${ENV}")
    cores = usable_cores()
    if cores <= 2:
        return 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return max(1, min(cores - 1, cores - round(load)))


def check_threads(value, source: str = "threads") -> int:
    try:
        n = int(value) if not isinstance(value, bool) else -1
    except (TypeError, ValueError):
        n = -1
    if n < 1 or n > 4096:
        raise InvalidArgumentError(f"{source} must be a positive integer (a number of CPU threads), got {value!r}.")
    return n


def set_threads(n: int | None = None) -> int:
    """Use ``n`` torch threads (``None``: :func:`default_threads`); returns the number set.

    Before torch is imported this only sets ``OMP_NUM_THREADS`` (torch reads it at import), so commands that
    never load torch stay fast to start.
    """
    n = default_threads() if n is None else check_threads(n, source="--threads")
    if "torch" in sys.modules:
        import torch

        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
    else:
        os.environ["OMP_NUM_THREADS"] = str(n)
    return n


def describe(n: int | None = None) -> str:
    """``"1 torch thread of 2 cores"``: the context a tokens/s figure needs."""
    if n is None:
        import torch

        n = torch.get_num_threads()
    return f"{n} torch thread{'s' if n != 1 else ''} of {usable_cores()} cores"
