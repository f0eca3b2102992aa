"""How many pytest-xdist workers ``-n auto`` starts (``tests/conftest.py``): one per CPU core this process may use, but
no more than the machine's memory holds. A worker keeps the models its tests load in process-wide caches (the
SmolLM2 weights, the shipped reward models, compiled steps): in the whole suite under two workers one of them reached
10.5 GB resident (2026-11-28, on a 2-core, 24 GiB machine), so a 16-core machine with 32 GiB would run out of memory
with one worker per core."""

from __future__ import annotations

import os

from steerkit.threads import usable_cores

#: memory set aside per worker: the largest resident size a worker was seen to reach in the whole suite, rounded up
WORKER_MEMORY = 11 * 10**9


def auto_workers(cpus: int, memory_bytes: int | None) -> int:
    """Workers for ``cpus`` usable cores and ``memory_bytes`` of physical memory (None where unknown: one per core)."""
    if memory_bytes is None:
        return max(1, cpus)
    return max(1, min(cpus, memory_bytes // WORKER_MEMORY))


def this_machine() -> tuple[int, int | None]:
    """(usable cores, physical memory in bytes or None)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system that reports it
        memory = None
    return usable_cores(), memory
